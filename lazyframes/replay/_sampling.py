"""ReplayBuffer sampling: uniform draws, n-step windows and the output arrays.

A transition is sampleable when its n-step window is complete (``n_step`` steps of its
env stream written) or ended (terminated or truncated), and it is not an autoreset
placeholder. A window follows the stream's links (``ReplayBuffer._next``), so streams
may interleave in any order. The frames of a batch are copied out with one
``SlotTable.gather_pairs`` call (observations from the first k columns of the drawn
rows, next observations from the last k columns of each window's last row), with the
dtype conversion and scaling fused into that copy.

Draws depend only on the RNG state and the stored transitions (their flags and links at
their ring positions): indices are drawn uniformly over ``[0, len(rb))`` and redrawn
where not sampleable, or, when few are surely sampleable, drawn from the enumerated
sampleable positions.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .. import _common as C
from ._ingest import SKIP, TERM, TRUNC

if TYPE_CHECKING:
    from . import ReplayBuffer


class ReplaySamples(NamedTuple):
    """One sampled batch of ``B`` transitions (field names as SB3's ``ReplayBufferSamples``).

    Attributes:
        observations: ``(B, *observation_shape)``, the frames' dtype or the requested
            ``dtype``. Unless ``out`` was given, an array the buffer reuses: the next
            :meth:`ReplayBuffer.sample` with the same ``batch_size`` and dtype overwrites
            it. For Dict observations, a dict of such arrays by key (the leaves that are
            not frames: fresh arrays, in their stored dtype).
        actions: ``(B, *action_shape)`` of ``action_dtype`` (a fresh array).
        next_observations: like ``observations``: the observation ``m`` steps later,
            where ``m <= n_step`` stops at the episode end (for a truncated transition,
            its real next observation, never the next episode's reset observation).
        dones: float32 ``(B,)``: 1.0 when the episode *terminated* within the window, so
            the target must not bootstrap. Truncation never sets it (SB3 with
            ``handle_timeout_termination=True``; SB3 returns ``(B, 1)``).
        rewards: float32 ``(B,)``: ``sum_{i<m} gamma**i * r_i`` (the reward itself when
            ``n_step == 1``).
        truncations: float32 ``(B,)``: 1.0 when the window ended by truncation.
        indices: int64 ``(B,)``: the transitions' ring positions in the buffer
            (``row * num_envs + env`` when every env adds at each step).
        discounts: float32 ``(B,)``: ``gamma ** m``, the factor of the bootstrap value in
            an n-step target ``rewards + discounts * (1 - dones) * V(next_observations)``
            (SB3's ``NStepReplayBuffer`` field of that name).
    """

    observations: np.ndarray
    actions: np.ndarray
    next_observations: np.ndarray
    dones: np.ndarray
    rewards: np.ndarray
    truncations: np.ndarray
    indices: np.ndarray
    discounts: np.ndarray


def window(rb: ReplayBuffer, idx: np.ndarray):
    """n-step windows of transitions ``idx``: (valid, ret, last, term, trunc, m)."""
    n, g = rb._n_step, rb._gamma
    fl0 = rb._flags[idx]
    valid = (fl0 & SKIP) == 0
    ret = rb._rewards[idx].astype(np.float64)
    last = idx.copy()
    m = np.ones(idx.shape, np.int64)
    alive = valid & ((fl0 & (TERM | TRUNC)) == 0)
    for j in range(1, n):
        p = rb._next[last]
        inr = p >= 0
        valid &= ~(alive & ~inr)
        p = np.where(inr, p, last)
        fl = rb._flags[p]
        step = alive & inr & ((fl & SKIP) == 0)
        ret += np.where(step, g**j * rb._rewards[p].astype(np.float64), 0.0)
        last = np.where(step, p, last)
        m += step
        alive = step & ((fl & (TERM | TRUNC)) == 0)
        if not alive.any():
            break
    flast = rb._flags[last]
    return valid, ret, last, (flast & TERM) != 0, (flast & TRUNC) != 0, m


def one_step(rb: ReplayBuffer, idx: np.ndarray) -> tuple:
    """``(rewards, dones, truncations, discounts)`` of transitions ``idx`` when ``n_step == 1``.

    One core call (``SlotTable.step_fields``): the four float32 arrays in one pass over
    the flags and rewards (a Dict buffer asks the table of one of its frame leaves).
    """
    table = rb._table
    if table is None:  # a Dict buffer: the table of its first frame leaf (it has one)
        table = next(leaf._table for leaf in rb._leaves.values() if hasattr(leaf, "_table"))
    return table.step_fields(idx, rb._flags, rb._rewards, rb._gamma)


def draw(rb: ReplayBuffer, batch_size: int) -> np.ndarray:
    """Uniform indices over the sampleable transitions (exact: rejection or enumeration)."""
    total = len(rb)
    if total == 0:  # an ``out`` whose checks run Python may have cleared the buffer
        raise ValueError("cannot sample from an empty ReplayBuffer")
    rng = rb._rng
    if rb._n_step == 1 and rb._n_skip == 0:
        return rng.integers(0, total, size=batch_size)
    # transitions that can be invalid: placeholders and each stream's open windows
    lower = total - rb._n_skip - (rb._n_step - 1) * rb._num_envs
    if lower * 16 < total:  # few sure ones: enumerate the valid ones
        ok = np.flatnonzero(window(rb, np.arange(total))[0])
        if ok.size == 0:
            raise ValueError(
                "no transition can be sampled yet: every stored n-step window is "
                "still open (add more steps) or an autoreset placeholder"
            )
        return ok[rng.integers(0, ok.size, size=batch_size)]
    idx = rng.integers(0, total, size=batch_size)
    bad = np.flatnonzero(~window(rb, idx)[0])
    while bad.size:
        idx[bad] = rng.integers(0, total, size=bad.size)
        bad = bad[~window(rb, idx[bad])[0]]
    return idx


def outputs(rb: ReplayBuffer, batch_size, out, dtype, scale):
    """The pair of arrays to fill and the output dtype (all checked)."""
    if out is None:
        if dtype is None and scale is None:
            dst = rb._dtype
        else:
            dst = C.output_dtype(rb._dtype, dtype, scale)
        key = (batch_size, dst)
        pair = rb._out_cache.get(key)
        if pair is None:
            full = (batch_size,) + rb._obs_shape
            pair = (np.empty(full, dst), np.empty(full, dst))
            rb._out_cache[key] = pair
        return pair, dst
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError("out must be a pair (obs_out, next_obs_out) of ndarrays")
    o0, o1 = out
    if not isinstance(o0, np.ndarray) or not isinstance(o1, np.ndarray):
        raise TypeError("out must be a pair (obs_out, next_obs_out) of ndarrays")
    dst = C.output_dtype(rb._dtype, dtype if dtype is not None else o0.dtype, scale)
    full = (batch_size,) + rb._obs_shape
    C.check_out(o0, full, dst)
    C.check_out(o1, full, dst)
    if np.may_share_memory(o0, o1):
        raise ValueError("the two arrays of out overlap")
    return (o0, o1), dst


def sample(rb: ReplayBuffer, batch_size, *, out=None, dtype=None, scale=None) -> ReplaySamples:
    """ReplayBuffer.sample: draw, compute the n-step fields, copy the frames out."""
    B = operator.index(batch_size)
    if len(rb) == 0:
        raise ValueError("cannot sample from an empty ReplayBuffer")
    if B < 1:
        raise ValueError(f"batch_size must be at least 1, got {B}")
    if rb._leaves is not None:
        from . import _dict

        return _dict.sample(rb, B, out, dtype, scale)
    (obs_out, next_out), dst = outputs(rb, B, out, dtype, scale)
    return at(rb, draw(rb, B), obs_out, next_out, dst, scale)


def fields(rb: ReplayBuffer, idx: np.ndarray) -> tuple:
    """``(last, (dones, rewards, truncations, indices, discounts))`` of transitions ``idx``.

    ``last``: the ring position of each n-step window's last transition, whose next
    observation is the sample's.
    """
    if rb._n_step == 1:
        last = idx
        rewards, dones, truncs, discounts = one_step(rb, idx)
    else:
        _, ret, last, term, trunc, m = window(rb, idx)
        rewards = ret.astype(np.float32)
        dones = term.astype(np.float32)
        truncs = trunc.astype(np.float32)
        discounts = (rb._gamma**m).astype(np.float32)
    return last, (dones, rewards, truncs, idx.astype(np.int64, copy=False), discounts)


def at(rb: ReplayBuffer, idx: np.ndarray, obs_out, next_out, dst, scale) -> ReplaySamples:
    """The samples of the stored transitions ``idx`` into the checked arrays of :func:`outputs`.

    ``idx`` is not checked for sampleability: an n-step window still open at the newest
    row ends there (SB3's ``NStepReplayBuffer`` does the same).
    """
    last, rest = fields(rb, idx)
    k = rb._k
    rb._table.gather_pairs(
        idx,
        (0, k),
        last,
        (k, 2 * k),
        out=(obs_out, next_out),
        layout=rb._layout,
        dtype=dst,
        scale=scale,
    )
    return ReplaySamples(obs_out, rb._actions[idx], next_out, *rest)
