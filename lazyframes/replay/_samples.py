"""Sampled batches: the one type of a batch of transitions, and how one is gathered.

A batch of the transitions at some ring positions is their fields from the ring
(:meth:`~._ring.Ring.fields`: n-step returns, dones, truncations, discounts) and each
store's observations of them and of their windows' last steps, copied into arrays
checked beforehand (:func:`outputs`).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from ._store import FrameStore


@functools.lru_cache(maxsize=16)
def _constant(count: int, value: float) -> np.ndarray:
    a = np.full(count, value, np.float32)
    a.flags.writeable = False
    return a


def constant(count: int, value: float) -> np.ndarray:
    """A new float32 array of ``count`` times ``value`` (a copy of one made once)."""
    return _constant(count, value).copy()


class Samples(NamedTuple):
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
            (``row * num_envs + env`` when every env adds at each step); for a
            :class:`PrioritizedReplayBuffer`, their transition numbers.
        discounts: float32 ``(B,)``: ``gamma ** m``, the factor of the bootstrap value in
            an n-step target ``rewards + discounts * (1 - dones) * V(next_observations)``
            (SB3's ``NStepReplayBuffer`` field of that name).
        weights: float32 ``(B,)``: importance-sampling weights, all 1.0 for uniform
            draws; a :class:`PrioritizedReplayBuffer`'s ``(N P(i))**-beta / (N
            P_min)**-beta``, at most 1.
    """

    observations: Any
    actions: np.ndarray
    next_observations: Any
    dones: np.ndarray
    rewards: np.ndarray
    truncations: np.ndarray
    indices: np.ndarray
    discounts: np.ndarray
    weights: np.ndarray


def outputs(stores: tuple, frames: tuple, keys, B: int, out, dtype, scale) -> list:
    """Per frame store, the checked ``(obs_out, next_out, dtype)`` a batch of ``B`` fills.

    ``frames``: the indices of the frame stores among ``stores``; ``out``: None (each
    store's reused arrays), or the pair ``(obs_out, next_obs_out)`` of arrays (of dicts
    of arrays by frame key, for Dict observations: ``keys``).

    Raises:
        TypeError, ValueError: a bad ``out`` (type, shape, dtype, contiguity, overlap).
    """
    outs = []
    if out is None:
        for i in frames:
            outs.append(stores[i].outputs(B, None, dtype, scale))
        return outs
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError("out must be a pair (obs_out, next_obs_out) of ndarrays")
    if keys is None:
        pairs = [tuple(out)]
    else:
        fkeys = [keys[i] for i in frames]
        if not all(isinstance(d, dict) and d.keys() == set(fkeys) for d in out):
            raise TypeError(
                f"out must be a pair (obs_out, next_obs_out) of dicts of ndarrays by "
                f"frame key {fkeys}"
            )
        pairs = [(out[0][key], out[1][key]) for key in fkeys]
    for i, pair in zip(frames, pairs, strict=True):
        outs.append(stores[i].outputs(B, pair, dtype, scale))
    arrays = [a for o in outs for a in o[:2]]
    for j, a in enumerate(arrays):
        if any(np.may_share_memory(a, b) for b in arrays[:j]):
            raise ValueError("the arrays of out overlap")
    return outs


def gather(ring, stores: tuple, keys, idx: np.ndarray, outs: list, scale, indices, weights):
    """The :class:`Samples` of the transitions at ring positions ``idx``, into ``outs``.

    ``indices`` and ``weights`` are the batch's (ring positions, or a prioritized
    buffer's transition numbers; its importance weights).
    """
    last, actions, dones, rewards, truncs, discounts = ring.fields(idx)
    if keys is None:  # one frame store
        o0, o1, dst = outs[0]
        o, n = stores[0].gather(idx, last, o0, o1, dst, scale)
    else:
        obs, nxt = [], []
        frame_outs = iter(outs)
        for s in stores:
            if isinstance(s, FrameStore):
                o0, o1, dst = next(frame_outs)
                a, b = s.gather(idx, last, o0, o1, dst, scale)
            else:
                a, b = s.gather(idx, last)
            obs.append(a)
            nxt.append(b)
        o, n = dict(zip(keys, obs, strict=True)), dict(zip(keys, nxt, strict=True))
    idx64 = indices.astype(np.int64, copy=False)
    return Samples(o, actions, n, dones, rewards, truncs, idx64, discounts, weights)
