"""Sampled batches: the one type of a batch of transitions, and how one is gathered.

One path for ``sample``, ``gather`` and a sampler: :func:`draw` reads the fields and pins
the frames (at a point of the caller's calls), :func:`fill` copies them into arrays
:func:`outputs` checked, at once or later in a sampler's thread.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from .. import _core
from ._store import FrameStore

_LazyBatch = _core.LazyBatch
_new = tuple.__new__  # a NamedTuple of a tuple's items, without interpreted code


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


class Sequences(NamedTuple):
    """A batch of ``B`` windows of ``T`` consecutive steps of one env stream each.

    :meth:`ReplayBuffer.sample_sequences`'s result; ``T = burn_in + length``, the first
    ``burn_in`` steps of each window being its burn-in.

    Attributes:
        observations: ``(B, T, *observation_shape)``: step ``t``'s observation (with
            ``frames=True`` a read-only view of ``frames``); Dict observations: a dict by
            key (the vector leaves' values, fresh arrays).
        actions: ``(B, T, *action_shape)`` of ``action_dtype``.
        rewards, dones, truncations, discounts: float32 ``(B, T)``: each step's n-step
            fields, as :class:`Samples` (a step's window may look past step ``T - 1``
            within its episode; with ``n_step=1``, its reward and flags).
        mask: float32 ``(B, T)``: 1.0 for the steps of the episode of the window's first
            step; 0.0 from the step after one that terminated or was truncated, and
            from an autoreset placeholder on (their fields are the stream's, unmasked).
        indices: int64 ``(B,)``: the windows' ids, their first steps' (``steps[:, 0]``).
        weights: float32 ``(B,)``: all 1.0 for uniform draws, importance weights for
            prioritized ones.
        steps: int64 ``(B, T)``: each step's id: its ring position, or for a
            :class:`PrioritizedReplayBuffer` its transition number (``update_extras``
            takes them).
        extras: ``{name: array}``: the per-step extras ``(B, T, *shape)`` and the
            per-start extras ``(B, *shape)`` the buffer declares (empty without).
        frames: None, or with ``frames=True`` the ``(B, T + k - 1, *frame_shape)`` frames
            of each window, each read and written once (Dict: a dict by frame key).
        burn_in: the number of burn-in steps at the start of each window.
    """

    observations: Any
    actions: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    truncations: np.ndarray
    discounts: np.ndarray
    mask: np.ndarray
    indices: np.ndarray
    weights: np.ndarray
    steps: np.ndarray
    extras: dict
    frames: np.ndarray | None
    burn_in: int


def outputs(stores: tuple, frames: tuple, keys, B: int, out, dtype, scale, fresh=False) -> list:
    """Per frame store, the checked ``(obs_out, next_out, dtype, scale)`` a batch of ``B`` fills.

    ``frames``: the indices of the frame stores among ``stores``; ``out``: None (each
    store's reused arrays, or new ones with ``fresh``), or the pair ``(obs_out,
    next_obs_out)`` of arrays (of dicts of arrays by frame key, for Dict observations:
    ``keys``).

    Raises:
        TypeError, ValueError: a bad ``out`` (type, shape, dtype, contiguity, overlap).
    """
    if out is None:
        return [stores[i].outputs(B, None, dtype, scale, fresh) for i in frames]
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError("out must be a pair (obs_out, next_obs_out) of ndarrays")
    pairs: Any
    if keys is None:
        pairs = (out,)
    else:
        fkeys = [keys[i] for i in frames]
        if not all(isinstance(d, dict) and d.keys() == set(fkeys) for d in out):
            raise TypeError(
                f"out must be a pair (obs_out, next_obs_out) of dicts of ndarrays by "
                f"frame key {fkeys}"
            )
        pairs = [(out[0][key], out[1][key]) for key in fkeys]
    outs, arrays = [], []
    for n, i in enumerate(frames):  # one pair per frame store
        o = stores[i].outputs(B, pairs[n], dtype, scale)
        outs.append(o)
        arrays += o[:2]
    _core.check_apart(arrays)
    return outs


class Drawn(NamedTuple):
    """A drawn batch: every field read, every frame pinned; what :func:`fill` copies out.

    Attributes:
        leaves: a list, per store, of a frame store's owner of the obs and next obs frames
            (a LazyBatch of pairs, :meth:`~._store.FrameStore.pin`), or a vector store's
            arrays ``(obs, next_obs)`` (fresh copies).
        actions, dones, rewards, truncations, indices, discounts, weights: the fields of
            :class:`Samples`.
    """

    leaves: list
    actions: np.ndarray
    dones: np.ndarray
    rewards: np.ndarray
    truncations: np.ndarray
    indices: np.ndarray
    discounts: np.ndarray
    weights: np.ndarray


def draw(ring, stores: tuple, idx: np.ndarray, indices, weights) -> Drawn:
    """The batch of the transitions at ring positions ``idx`` as the buffer holds them now.

    ``indices`` (int64) and ``weights`` are the batch's (ring positions, or a prioritized
    buffer's transition numbers; its importance weights). Runs while no call changes the
    buffer (in the caller's thread, or in a sampler's while the buffer's calls wait for
    it): the fields and vector leaves are copied, the frames pinned.
    """
    last, actions, dones, rewards, truncs, discounts = ring.fields(idx)
    leaves = [s.pin(idx, last) if type(s) is FrameStore else s.gather(idx, last) for s in stores]
    # tuple.__new__: no interpreted code (Drawn._make and Drawn() are Python functions)
    return _new(Drawn, (leaves, actions, dones, rewards, truncs, indices, discounts, weights))


def fill(drawn: Drawn, keys, outs: list) -> Samples:
    """The :class:`Samples` of a drawn batch, its frames copied into ``outs`` (:func:`outputs`).

    Reads only ``drawn`` (its owners' frames never change), so it may run in another
    thread than the one that adds; the copy releases the GIL.
    """
    obs: list[Any] = []
    nxt: list[Any] = []
    frame_outs = iter(outs)
    for leaf in drawn.leaves:
        if type(leaf) is _LazyBatch:
            o0, o1, dst, scale = next(frame_outs)
            a, b = leaf.numpy_pairs((o0, o1), dtype=dst, scale=scale)
        else:  # a vector store's arrays
            a, b = leaf
        obs.append(a)
        nxt.append(b)
    o: Any
    n: Any
    if keys is None:  # one frame store
        o, n = obs[0], nxt[0]
    else:
        o, n = dict(zip(keys, obs, strict=True)), dict(zip(keys, nxt, strict=True))
    return _new(Samples, (o, drawn.actions, n, *drawn[2:]))


def filler(keys):
    """A sampler's copy of :class:`Samples`: ``fill_set(drawn, outs)``, :func:`fill`'s."""

    def fill_set(drawn: Drawn, outs: list) -> Samples:
        return fill(drawn, keys, outs)

    return fill_set
