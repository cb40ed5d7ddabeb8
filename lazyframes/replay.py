"""A replay buffer that stores each frame once: transitions hold slot ids, not frames.

``ReplayBuffer`` keeps, per transition, the ``k`` slot ids of the observation and the
``k`` slot ids of the next observation (int32), the action, the reward and the episode
flags. The frames themselves live once in a :class:`~lazyframes.FramePool`, refcounted:
a frame's memory is reused once no stored transition and no live observation refers to
it. Sampling copies the frames out with one ``pool.gather`` call per batch (obs and
next obs), with the dtype conversion and scaling fused into that copy.

It plays the role of SB3's ``ReplayBuffer(optimize_memory_usage=True)``, Dopamine's
circular replay buffer and cpprb's ``stack_compress``, with exact episode boundaries
and the real next observation of truncated transitions (CASES.md, C15).
"""

from __future__ import annotations

import json
import math
import operator
import os
import sys
import tempfile
import zipfile
from typing import NamedTuple

import numpy as np

from . import _backend
from . import _common as C

__all__ = ["ReplayBuffer", "ReplaySamples"]

_TERM = np.uint8(1)
_TRUNC = np.uint8(2)
_SKIP = np.uint8(4)
_BOOL = np.dtype(np.bool_)
# scalar types the single-env fast path of add() takes as they are
_INTS = (int, np.int64, np.int32, np.int16, np.int8, np.uint32, np.uint16, np.uint8)
_REALS = _INTS + (float, np.float64, np.float32)
_BOOLS = (bool, np.bool_)
_FORMAT = "lazyframes.ReplayBuffer"
_VERSION = 1
_INT32_MAX = np.iinfo(np.int32).max
_SAVE_CHUNK_BYTES = 64 << 20  # frames are written/read this many bytes at a time


class ReplaySamples(NamedTuple):
    """One sampled batch of ``B`` transitions (field names as SB3's ``ReplayBufferSamples``).

    Attributes:
        observations: ``(B, *observation_shape)``, the frames' dtype or the requested
            ``dtype``. Unless ``out`` was given, an array the buffer reuses: the next
            :meth:`ReplayBuffer.sample` with the same ``batch_size`` and dtype overwrites it.
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
        indices: int64 ``(B,)``: the transitions' positions in the buffer,
            ``row * num_envs + env``.
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


def _own_pool(frame_shape, dtype, capacity):
    """The buffer's own pool (for ndarray observations): chunks small enough that a partly
    filled one wastes less than 1/256 of the capacity's frame memory."""
    fb = math.prod(frame_shape) * np.dtype(dtype).itemsize
    chunk = int(min(C.DEFAULT_CHUNK_BYTES, max(1, capacity * fb // 256)))
    return _backend.core().FramePool(frame_shape, dtype, chunk_bytes=chunk)


def _is_lazy(x) -> bool:
    """A LazyFrames of either core."""
    return isinstance(x, _backend.LAZYFRAMES_TYPES)


def _is_lazy_batch(x) -> bool:
    """A LazyBatch (the vector stacker's observations) of either core."""
    return isinstance(x, _backend.LAZYBATCH_TYPES)


def _is_batched_obs(x) -> bool:
    return _is_lazy_batch(x) or isinstance(x, (list, tuple))


class _Obs:
    """One add() argument (obs or next_obs) for all envs, checked but not yet stored.

    kind "lazy": ``slots`` (E, k) int64 of ``pool``; kind "array": ``arr`` (E, *obs_shape)
    in the buffer layout (or ``layout`` for frames gathered from a foreign pool).
    """

    __slots__ = ("kind", "pool", "slots", "arr", "layout", "k", "frame_shape", "dtype")

    def __init__(self):
        self.kind = self.pool = self.slots = self.arr = self.layout = None
        self.k = self.frame_shape = self.dtype = None


def _frames_view(arr: np.ndarray, layout: str, k: int) -> np.ndarray:
    """``(E, *observation_shape)`` -> a view ``(E, k, *S)`` of the frames (may be strided)."""
    E = arr.shape[0]
    if layout == "stack":
        return arr
    if layout == "first":
        return arr.reshape((E, k, arr.shape[1] // k) + arr.shape[2:])
    c = arr.shape[-1] // k
    v = arr.reshape(arr.shape[:-1] + (k, c))
    return np.moveaxis(v, -2, 1)


def _frame_shape_of(obs_shape: tuple, layout: str, k: int) -> tuple:
    if layout == "stack":
        return tuple(obs_shape[1:])
    if layout == "first":
        return (obs_shape[0] // k,) + tuple(obs_shape[1:])
    return tuple(obs_shape[:-1]) + (obs_shape[-1] // k,)


def _flags_arg(x, name, shape):
    a = np.asarray(x)
    if a.shape != shape:
        raise ValueError(f"{name} has shape {a.shape}, expected {shape}")
    if a.dtype == np.bool_:
        return a
    if a.dtype.kind not in "iuf" or not np.all((a == 0) | (a == 1)):
        raise TypeError(f"{name} must be booleans (or 0/1), got dtype {a.dtype}")
    return a.astype(np.bool_)


class ReplayBuffer:
    """A FIFO replay buffer of transitions whose observations share frames.

    Each transition ``(obs, action, reward, next_obs, terminated, truncated)`` stores
    ``2 k`` int32 slot ids instead of ``2 k`` frames; a frame is stored once however
    many observations (of however many transitions) contain it. At 84x84 uint8 frames
    and ``k = 4`` a transition costs the frame floor (7,056 bytes) plus 45 bytes of
    index tables (SB3's ``optimize_memory_usage=True`` stores one whole observation,
    28,224 bytes).

    Observations can be given as:

    - :class:`~lazyframes.LazyFrames` (from ``lazyframes.FrameStack`` /
      ``FrameStackObservation``) or a ``lazyframes.vector`` ``LazyBatch``: stored as slot
      ids with one refcount each; no frame byte is copied. The buffer uses the pool of
      the first observation it sees (the wrapper's pool).
    - ndarrays of the stacked observation (EnvPool, ale-py, SB3 ``VecFrameStack``):
      split into ``k`` frames according to ``layout`` and pushed into the buffer's pool,
      de-duplicated against the previous observation of the same env (so consecutive
      stacks cost one new frame per step) and against repeated frames within an
      observation (reset padding). LazyFrames of another pool are copied in the same way.

    With ``num_envs > 1`` every argument of :meth:`add` has a leading ``num_envs`` axis
    and each call stores one transition per env; like SB3, the buffer holds
    ``capacity // num_envs`` rows of ``num_envs`` transitions and evicts whole rows,
    oldest first.

    Args:
        capacity: maximum number of transitions stored (rounded down to a multiple of
            ``num_envs``, as SB3's ``buffer_size // n_envs``).
        num_envs: number of env streams (vector env size).
        n_step: length of the n-step return window (1 = plain one-step transitions).
        gamma: discount factor of the n-step return, in ``[0, 1]``.
        seed: seed of the sampling ``np.random.default_rng(seed)``.
        action_shape: shape of one action, ``()`` for a discrete action.
        action_dtype: dtype the actions are stored and returned in.
        layout: layout of sampled observations and of ndarray observations given to
            :meth:`add`: ``"stack"`` ``(k, *S)`` (default for ndarrays: Gymnasium,
            EnvPool), ``"first"`` ``(k*C, H, W)`` or ``"last"`` ``(H, W, k*C)`` (SB3
            ``VecFrameStack``, baselines). Default: the layout of the first LazyFrames
            added, or ``"stack"`` for ndarrays.
        stack_size: ``k``; needed for ndarray observations in the ``"first"``/``"last"``
            layouts (in ``"stack"`` it is the leading axis). Checked against LazyFrames.

    Raises:
        ValueError: ``capacity < num_envs``, a non-positive ``num_envs``/``n_step``,
            ``gamma`` outside ``[0, 1]``, an unknown ``layout``.
        TypeError: a non-numeric ``action_dtype``.

    Example:
        >>> import numpy as np, lazyframes
        >>> pool = lazyframes.FramePool((84, 84), np.uint8)
        >>> s = [pool.push(np.full((84, 84), v, np.uint8)) for v in range(5)]
        >>> rb = ReplayBuffer(1000, seed=0)
        >>> rb.add(pool.lazy(s[:4], layout="stack"), 1, 0.5, pool.lazy(s[1:], layout="stack"), False, False)
        >>> batch = rb.sample(1, dtype=np.float32, scale=1 / 255)
        >>> batch.observations.shape, batch.next_observations[0, -1, 0, 0] * 255
        ((1, 4, 84, 84), 4.0)
    """

    def __init__(self, capacity, *, num_envs=1, n_step=1, gamma=0.99, seed=None,
                 action_shape=(), action_dtype=np.int64, layout=None, stack_size=None):
        capacity = operator.index(capacity)
        num_envs = operator.index(num_envs)
        n_step = operator.index(n_step)
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        if capacity < num_envs:
            raise ValueError(
                f"capacity ({capacity}) must be at least num_envs ({num_envs}): the buffer "
                f"holds capacity // num_envs rows of one transition per env"
            )
        if n_step < 1:
            raise ValueError(f"n_step must be at least 1, got {n_step}")
        gamma = float(gamma)
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        if isinstance(action_shape, (int, np.integer)):
            action_shape = (action_shape,)
        action_shape = tuple(operator.index(d) for d in action_shape)
        if any(d < 0 for d in action_shape):
            raise ValueError(f"action_shape {action_shape} has a negative dimension")
        action_dtype = np.dtype(action_dtype)
        if action_dtype.kind not in "biuf":
            raise TypeError(f"action_dtype must be a numeric dtype, got {action_dtype}")
        if layout is not None and layout not in C.LAYOUTS:
            raise ValueError(f"layout must be one of {C.LAYOUTS}, got {layout!r}")
        if stack_size is not None:
            stack_size = operator.index(stack_size)
            if stack_size < 1:
                raise ValueError(f"stack_size must be at least 1, got {stack_size}")
        self._num_envs = num_envs
        self._rows = capacity // num_envs
        self._capacity = self._rows * num_envs
        self._n_step = n_step
        self._gamma = gamma
        self._action_shape = action_shape
        self._action_dtype = action_dtype
        self._layout_opt = layout
        self._k_opt = stack_size
        self._rng = np.random.default_rng(seed)
        self._actions = np.zeros((self._capacity,) + action_shape, action_dtype)
        self._rewards = np.zeros(self._capacity, np.float32)
        self._flags = np.zeros(self._capacity, np.uint8)
        self._row = 0  # next row to write
        self._full = False
        self._n_skip = 0  # autoreset placeholders stored
        self._pool = None  # set by the first add (geometry below too)
        self._layout = self._k = self._frame_shape = self._dtype = self._obs_shape = None
        self._obs_slots = self._next_slots = None
        self._out_cache = {}

    # -- properties -------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Maximum number of transitions stored (a multiple of ``num_envs``)."""
        return self._capacity

    @property
    def num_envs(self) -> int:
        return self._num_envs

    @property
    def n_step(self) -> int:
        return self._n_step

    @property
    def gamma(self) -> float:
        return self._gamma

    @property
    def pool(self):
        """The :class:`~lazyframes.FramePool` holding the frames (None before the first add)."""
        return self._pool

    @property
    def layout(self):
        """Layout of sampled observations (None before the first add)."""
        return self._layout

    @property
    def observation_shape(self):
        """Shape of one observation, e.g. ``(4, 84, 84)`` (None before the first add)."""
        return self._obs_shape

    @property
    def full(self) -> bool:
        """True once the buffer has wrapped around (every row holds a transition)."""
        return self._full

    def _stored_rows(self) -> int:
        return self._rows if self._full else self._row

    def __len__(self) -> int:
        """Transitions stored (autoreset placeholders included, see :meth:`add`)."""
        return self._stored_rows() * self._num_envs

    def __repr__(self):
        return (
            f"ReplayBuffer(capacity={self._capacity}, num_envs={self._num_envs}, "
            f"n_step={self._n_step}, len={len(self)}, observation_shape={self._obs_shape}, "
            f"layout={self._layout!r})"
        )

    def memory(self) -> dict:
        """Memory held, for comparing with other buffers.

        Returns:
            dict with ``bytes_held`` (frame memory held by the pool, whole chunks; when
            the buffer shares the wrapper's pool this includes the frames of the live
            observations), ``unique_frames`` (distinct frames the stored transitions
            refer to), ``transitions`` (``len(self)``), ``table_bytes`` (the buffer's
            own arrays: slot ids, actions, rewards, flags), ``bytes_per_transition``
            (``(bytes_held + table_bytes) / transitions``; 0.0 when empty) and
            ``frame_bytes`` (bytes of one frame).
        """
        n = len(self)
        table = self._actions.nbytes + self._rewards.nbytes + self._flags.nbytes
        if self._pool is None:
            return {"bytes_held": 0, "unique_frames": 0, "transitions": 0,
                    "table_bytes": table, "bytes_per_transition": 0.0, "frame_bytes": 0}
        table += self._slots.nbytes
        uniq = 0
        if n:
            uniq = int(np.unique(np.concatenate(
                [self._obs_slots[:n].ravel(), self._next_slots[:n].ravel()])).size)
        held = int(self._pool.bytes_held)
        return {
            "bytes_held": held,
            "unique_frames": uniq,
            "transitions": n,
            "table_bytes": table,
            "bytes_per_transition": (held + table) / n if n else 0.0,
            "frame_bytes": int(self._pool.frame_bytes),
        }

    # -- add ------------------------------------------------------------------------
    def _describe(self, x, name: str, batched: bool) -> _Obs:
        E = self._num_envs
        d = _Obs()
        if _is_lazy_batch(x):
            if not batched:
                raise ValueError(f"{name} is a batch but num_envs is 1")
            if len(x) != E:
                raise ValueError(f"{name} has {len(x)} observations, expected num_envs={E}")
            d.kind, d.pool = "lazy", x.pool
            d.slots = np.asarray(x.slots, np.int64)
            d.layout = getattr(x, "layout", None)
            if d.layout is None:
                d.layout = x[0].layout
        elif batched and isinstance(x, (list, tuple)) and x and all(_is_lazy(o) for o in x):
            if len(x) != E:
                raise ValueError(f"{name} has {len(x)} observations, expected num_envs={E}")
            pools = {id(o.pool) for o in x}
            ks = {o.stack_size for o in x}
            if len(ks) != 1 or len({o.pool.frame_shape for o in x}) != 1 or len(
                    {np.dtype(o.pool.dtype) for o in x}) != 1:
                raise ValueError(f"the observations in {name} differ in stack size, frame shape or dtype")
            if len(pools) == 1:
                d.kind, d.pool = "lazy", x[0].pool
                d.slots = np.array([o.slots for o in x], np.int64)
                d.layout = x[0].layout
            else:  # several pools: copy the frames out (stack layout) and in again
                d.kind, d.layout = "array", "stack"
                d.arr = np.stack([o.pool.gather([o.slots], layout="stack")[0] for o in x])
                d.dtype = C.frame_dtype(d.arr.dtype)
                return d
        elif not batched and _is_lazy(x):
            d.kind, d.pool, d.layout = "lazy", x.pool, x.layout
            d.slots = np.asarray(x.slots, np.int64).reshape(1, -1)
        else:
            if isinstance(x, (list, tuple)) and any(_is_lazy(o) for o in x):
                raise TypeError(f"{name} mixes LazyFrames and other objects")
            a = np.asarray(x)
            if a.dtype.kind not in "biufc":
                raise TypeError(f"{name} must be a numeric array or LazyFrames, got dtype {a.dtype}")
            if not batched:
                a = a[None]
            elif a.ndim == 0 or a.shape[0] != E:
                raise ValueError(
                    f"{name} has shape {a.shape}, expected a leading num_envs={E} axis")
            d.kind, d.arr = "array", a
            d.layout = None  # the buffer layout
            d.dtype = C.frame_dtype(a.dtype)
            return d
        if d.slots.ndim != 2 or d.slots.shape[1] == 0:
            raise ValueError(f"{name} has no frames")
        d.k = d.slots.shape[1]
        d.frame_shape = tuple(d.pool.frame_shape)
        d.dtype = np.dtype(d.pool.dtype)
        return d

    def _geometry(self, o: _Obs):
        """(layout, k, frame_shape, dtype, obs_shape) decided by the first add."""
        if o.kind == "lazy":
            layout = self._layout_opt or o.layout
            k, fs, dt = o.k, o.frame_shape, o.dtype
        else:
            layout = self._layout_opt or "stack"
            shape = o.arr.shape[1:]
            if o.layout == "stack":  # gathered from several pools
                layout = self._layout_opt or "stack"
                k, fs = shape[0], tuple(shape[1:])
            elif layout == "stack":
                if len(shape) == 0:
                    raise ValueError("ndarray observations need at least one axis (the k frames)")
                k, fs = shape[0], tuple(shape[1:])
            else:
                k = self._k_opt
                if k is None:
                    raise ValueError(
                        f"ndarray observations in layout {layout!r} need stack_size=k "
                        f"(ReplayBuffer(..., layout={layout!r}, stack_size=4)) to be split "
                        f"into frames")
                if len(shape) == 0:
                    raise ValueError("ndarray observations need at least one axis")
                ax = shape[-1] if layout == "last" else shape[0]
                if ax % k:
                    raise ValueError(
                        f"observation shape {shape} cannot hold {k} frames on the "
                        f"{layout} axis")
                fs = _frame_shape_of(shape, layout, k)
            dt = o.dtype
        if self._k_opt is not None and k != self._k_opt:
            raise ValueError(f"observations have {k} frames, stack_size is {self._k_opt}")
        fs = C.frame_shape(fs)
        dt = C.frame_dtype(dt)
        C.check_layout(layout, fs)
        return layout, k, fs, dt, C.observation_shape(fs, k, layout)

    def _check_obs(self, o: _Obs, name: str, geom) -> None:
        layout, k, fs, dt, obs_shape = geom
        if o.kind == "lazy":
            if o.k != k:
                raise ValueError(f"{name} has {o.k} frames, the buffer stores {k}")
            if o.frame_shape != fs:
                raise ValueError(f"{name} has frames of shape {o.frame_shape}, the buffer stores {fs}")
            if o.dtype.newbyteorder("=") != dt:
                raise TypeError(f"{name} has dtype {o.dtype}, the buffer stores {dt}")
        else:
            want = obs_shape if o.layout is None else C.observation_shape(fs, k, o.layout)
            if o.arr.shape[1:] != tuple(want):
                raise ValueError(
                    f"{name} has shape {o.arr.shape[1:] if self._num_envs == 1 else o.arr.shape}"
                    f", expected {want if self._num_envs == 1 else (self._num_envs,) + tuple(want)}")
            if o.arr.dtype.newbyteorder("=") != dt:
                raise TypeError(f"{name} has dtype {o.arr.dtype}, the buffer stores {dt}")

    def add(self, obs, action, reward, next_obs, terminated, truncated, *, autoreset=None) -> None:
        """Store one transition per env.

        Args:
            obs: the observation the action was taken in: a LazyFrames or an ndarray of
                the observation shape; with ``num_envs > 1`` a ``LazyBatch``, a list of
                ``num_envs`` LazyFrames or an ndarray ``(num_envs, *observation_shape)``.
            action: ``action_shape`` (``(num_envs, *action_shape)``), cast to
                ``action_dtype`` ('same_kind' casts only).
            reward: a real number (``(num_envs,)``), stored as float32.
            next_obs: the observation after the step, as ``obs``. For an episode that
                ended, the final observation of the episode (Gymnasium's
                ``info["final_obs"]`` under same-step autoreset), never the reset one.
            terminated: bool (``(num_envs,)``): the MDP ended, don't bootstrap.
            truncated: bool (``(num_envs,)``): cut by a time limit; ``next_obs`` is kept
                for bootstrapping.
            autoreset: optional bool (``(num_envs,)``) marking the extra step a
                Gymnasium 1.x vector env takes to reset a finished env under its default
                next-step autoreset: that "transition" joins two episodes, so it is
                stored as a placeholder (it keeps the row layout) that is never sampled
                and ends every n-step window.

        Raises:
            ValueError: a wrong shape or number of envs, frames of another shape or
                stack size than the buffer's, ndarray observations in the ``"first"`` /
                ``"last"`` layout without ``stack_size``.
            TypeError: a wrong dtype (observations are never cast), non-numeric input,
                an action that needs an unsafe cast, non-boolean flags.
            OverflowError: slot ids beyond int32 (more than 2**31 frames in the pool).
            Nothing is stored when an error is raised.
        """
        if self._pool is not None and self._add_fast(
                obs, action, reward, next_obs, terminated, truncated, autoreset):
            return
        E = self._num_envs
        batched = E > 1 or _is_batched_obs(obs)
        lead = (E,) if batched else ()
        o = self._describe(obs, "obs", batched)
        n = self._describe(next_obs, "next_obs", batched)
        # everything below is checked before anything is written
        a = np.asarray(action)
        if a.dtype.kind not in "biuf":
            raise TypeError(f"action must be numeric, got dtype {a.dtype}")
        if a.shape != lead + self._action_shape:
            raise ValueError(f"action has shape {a.shape}, expected {lead + self._action_shape}")
        if not np.can_cast(a.dtype, self._action_dtype, casting="same_kind"):
            raise TypeError(f"action of dtype {a.dtype} cannot be stored as {self._action_dtype}")
        r = np.asarray(reward)
        if r.dtype.kind not in "biuf":
            raise TypeError(f"reward must be a real number, got dtype {r.dtype}")
        if r.shape != lead:
            raise ValueError(f"reward has shape {r.shape}, expected {lead}")
        term = _flags_arg(terminated, "terminated", lead)
        trunc = _flags_arg(truncated, "truncated", lead)
        skip = None if autoreset is None else _flags_arg(autoreset, "autoreset", lead)
        first = self._pool is None
        if first:
            geom = self._geometry(o)
        else:
            geom = (self._layout, self._k, self._frame_shape, self._dtype, self._obs_shape)
        self._check_obs(o, "obs", geom)
        self._check_obs(n, "next_obs", geom)
        if first:
            pool = o.pool if o.kind == "lazy" else n.pool if n.kind == "lazy" else None
            if pool is None:
                pool = _own_pool(geom[2], geom[3], self._capacity)
            self._commit_geometry(geom, pool)

        # -- the write: new references first, then evict the row being overwritten --
        row = self._row
        base = row * E
        prev = self._next_slots[base - E:base] if self._row > 0 else (
            self._next_slots[(self._rows - 1) * E:] if self._full else None)
        os_, new_refs = self._slots_for(o, prev)
        try:
            ns, more = self._slots_for(n, os_)
        except BaseException:
            self._drop(new_refs)
            raise
        new_refs.extend(more)
        if (os_.size and os_.max() > _INT32_MAX) or (ns.size and ns.max() > _INT32_MAX):
            self._drop(new_refs)
            raise OverflowError("slot ids beyond int32: the pool holds more than 2**31 frames")
        pool = self._pool
        try:
            pool.retain(np.concatenate([os_.ravel(), ns.ravel()]))
        except BaseException:
            self._drop(new_refs)
            raise
        if new_refs:
            pool.release(np.asarray(new_refs, np.int64))
        sl = slice(base, base + E)
        if self._full:
            old_flags = self._flags[sl]
            self._n_skip -= int(np.count_nonzero(old_flags & _SKIP))
            old = np.concatenate([self._obs_slots[sl].ravel(), self._next_slots[sl].ravel()],
                                 dtype=np.int64)
            pool.release(old)
        self._obs_slots[sl] = os_
        self._next_slots[sl] = ns
        self._actions[sl] = a.reshape((E,) + self._action_shape)
        self._rewards[sl] = r.reshape(E)
        fl = term.reshape(E) * _TERM | trunc.reshape(E) * _TRUNC
        if skip is not None:
            fl = fl | skip.reshape(E) * _SKIP
            self._n_skip += int(np.count_nonzero(skip))
        self._flags[sl] = fl
        self._row = row + 1
        if self._row == self._rows:
            self._row = 0
            self._full = True

    def _add_fast(self, obs, action, reward, next_obs, terminated, truncated, autoreset) -> bool:
        """The hot path: observations of the buffer's pool, plain well-typed arguments.

        Returns False (having written nothing) for anything else; :meth:`add` then takes
        the general path, which checks everything and raises the errors.
        """
        pool, E, k = self._pool, self._num_envs, self._k
        if getattr(obs, "pool", None) is not pool or getattr(next_obs, "pool", None) is not pool:
            return False
        if E == 1:
            if not (_is_lazy(obs) and _is_lazy(next_obs)) or self._action_shape != ():
                return False
            if not (type(action) in _INTS and self._action_dtype.kind in "iu"
                    and type(reward) in _REALS
                    and type(terminated) in _BOOLS and type(truncated) in _BOOLS
                    and (autoreset is None or type(autoreset) in _BOOLS)):
                return False
        elif not (_is_lazy_batch(obs) and _is_lazy_batch(next_obs)
                  and len(obs) == E and len(next_obs) == E):
            return False
        if obs.stack_size != k or next_obs.stack_size != k:
            return False
        base = self._row * E
        evicted_skips = (int(np.count_nonzero(self._flags[base:base + E] & _SKIP))
                         if self._full and self._n_skip else 0)
        if E == 1:
            # one core call: references on the new slot ids, release of the evicted row's
            pool.write_slots(self._slots, base, (obs, next_obs), release=self._full)
            self._actions[base] = action
            self._rewards[base] = reward
            fl = bool(terminated) | (bool(truncated) << 1)
            if autoreset:
                fl |= 4  # _SKIP
                self._n_skip += 1
            self._flags[base] = fl
        else:
            # one core call for the whole row: slot ids (new references, the evicted
            # row's released), actions, rewards and flags (_TERM | _TRUNC | _SKIP);
            # None when an argument is not a plain array of the right kind
            skipped = self._core._write_transitions(
                pool, self._slots, base, obs, next_obs, self._full, self._actions, action,
                self._rewards, reward, self._flags, terminated, truncated, autoreset)
            if skipped is None:
                return False
            self._n_skip += skipped
        self._n_skip -= evicted_skips
        self._row += 1
        if self._row == self._rows:
            self._row = 0
            self._full = True
        return True

    def _commit_geometry(self, geom, pool) -> None:
        self._layout, self._k, self._frame_shape, self._dtype, self._obs_shape = geom
        self._pool = pool
        self._core = sys.modules[type(pool).__module__]  # the core the pool belongs to
        # one table (capacity, 2k): obs slot ids then next obs slot ids, so the slots a
        # row holds are one block (one release call when it is overwritten)
        self._slots = np.zeros((self._capacity, 2 * self._k), np.int32)
        self._obs_slots = self._slots[:, :self._k]
        self._next_slots = self._slots[:, self._k:]

    def _drop(self, refs) -> None:
        if refs:
            self._pool.release(np.asarray(refs, np.int64))

    def _slots_for(self, d: _Obs, candidates):
        """Slot ids (E, k) in the buffer's pool for one argument, and the new references.

        Lazy input of the buffer's pool is used as is. Frames (ndarrays, or LazyFrames of
        another pool) are pushed in one ``push_dedup`` call, except a frame whose bytes
        equal a slot of ``candidates`` (the env's previous next observation for ``obs``,
        the stored ``obs`` for ``next_obs``: the usual shift by one) or an earlier frame
        of the same observation (reset padding). Returned new references (one per entry)
        are the caller's to release once the table holds its own.
        """
        pool, k = self._pool, self._k
        if d.kind == "lazy" and d.pool is pool:
            return d.slots, []
        if d.kind == "lazy":  # another pool: copy its frames out once
            frames = d.pool.gather(d.slots, layout="stack")
        else:
            frames = _frames_view(d.arr, d.layout or self._layout, k)
        out = pool.push_dedup(frames, candidates)
        return out, list(out.ravel())

    # -- sample ---------------------------------------------------------------------
    def _window(self, idx: np.ndarray):
        """n-step windows of transitions ``idx``: (valid, ret, last, term, trunc, m)."""
        E, rows, n, g = self._num_envs, self._rows, self._n_step, self._gamma
        r, e = np.divmod(idx, E)
        oldest = self._row if self._full else 0
        stored = self._stored_rows()
        age = (r - oldest) % rows
        fl0 = self._flags[idx]
        valid = (fl0 & _SKIP) == 0
        ret = self._rewards[idx].astype(np.float64)
        last = idx.copy()
        m = np.ones(idx.shape, np.int64)
        alive = valid & ((fl0 & (_TERM | _TRUNC)) == 0)
        for j in range(1, n):
            inr = age + j < stored
            valid &= ~(alive & ~inr)
            p = ((r + j) % rows) * E + e
            fl = self._flags[p]
            step = alive & inr & ((fl & _SKIP) == 0)
            ret += np.where(step, g ** j * self._rewards[p].astype(np.float64), 0.0)
            last = np.where(step, p, last)
            m += step
            alive = step & ((fl & (_TERM | _TRUNC)) == 0)
        flast = self._flags[last]
        return valid, ret, last, (flast & _TERM) != 0, (flast & _TRUNC) != 0, m

    def _draw(self, batch_size: int) -> np.ndarray:
        """Uniform indices over the sampleable transitions (exact: rejection or enumeration)."""
        total = len(self)
        rng = self._rng
        if self._n_step == 1 and self._n_skip == 0:
            return rng.integers(0, total, size=batch_size)
        stored = self._stored_rows()
        # transitions that can be invalid: placeholders and windows running past the newest row
        lower = total - self._n_skip - min(self._n_step - 1, stored) * self._num_envs
        if lower * 16 < total:  # few sure ones: enumerate the valid ones
            allidx = np.arange(total)
            ok = np.flatnonzero(self._window(allidx)[0])
            if ok.size == 0:
                raise ValueError(
                    "no transition can be sampled yet: every stored n-step window is "
                    "still open (add more steps) or an autoreset placeholder")
            return ok[rng.integers(0, ok.size, size=batch_size)]
        idx = rng.integers(0, total, size=batch_size)
        bad = np.flatnonzero(~self._window(idx)[0])
        while bad.size:
            idx[bad] = rng.integers(0, total, size=bad.size)
            bad = bad[~self._window(idx[bad])[0]]
        return idx

    def _outputs(self, batch_size, out, dtype, scale):
        if out is None:
            dst = C.output_dtype(self._dtype, dtype, scale)
            key = (batch_size, dst)
            pair = self._out_cache.get(key)
            if pair is None:
                full = (batch_size,) + self._obs_shape
                pair = (np.empty(full, dst), np.empty(full, dst))
                self._out_cache[key] = pair
            return pair, dst
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError("out must be a pair (obs_out, next_obs_out) of ndarrays")
        o0, o1 = out
        if not isinstance(o0, np.ndarray) or not isinstance(o1, np.ndarray):
            raise TypeError("out must be a pair (obs_out, next_obs_out) of ndarrays")
        dst = C.output_dtype(self._dtype, dtype if dtype is not None else o0.dtype, scale)
        full = (batch_size,) + self._obs_shape
        C.check_out(o0, full, dst)
        C.check_out(o1, full, dst)
        if np.may_share_memory(o0, o1):
            raise ValueError("the two arrays of out overlap")
        return (o0, o1), dst

    def sample(self, batch_size, *, out=None, dtype=None, scale=None) -> ReplaySamples:
        """Sample ``batch_size`` transitions uniformly, with replacement.

        Only transitions whose n-step window is complete (``n_step`` steps written) or
        ended (terminated or truncated) are drawn; autoreset placeholders never are.

        Args:
            batch_size: number of transitions ``B`` (at most ``len(self)``).
            out: optional pair ``(obs_out, next_obs_out)`` of C-contiguous writeable
                arrays ``(B, *observation_shape)`` to fill (e.g. pinned memory as
                ``torch.empty(..., pin_memory=True).numpy()``); their dtype is the
                output dtype when ``dtype`` is None.
            dtype: output dtype of the observations (default: the frames', e.g. uint8).
            scale: multiply by this after converting (float dtypes only), fused into the
                copy: ``dtype=np.float32, scale=1/255`` gives ``[0, 1]`` floats.

        Returns:
            :class:`ReplaySamples`. Without ``out``, ``observations`` and
            ``next_observations`` are arrays allocated once per ``(B, dtype)`` and
            **overwritten by the next call** with the same ``B`` and dtype; copy them to
            keep them.

        Raises:
            ValueError: an empty buffer, ``batch_size`` < 1 or > ``len(self)``, no
                sampleable transition yet, a bad ``out`` (shape, contiguity, read-only,
                overlapping).
            TypeError: an unsupported conversion or ``out`` of the wrong dtype.
        """
        B = operator.index(batch_size)
        if self._pool is None or len(self) == 0:
            raise ValueError("cannot sample from an empty ReplayBuffer")
        if not 1 <= B <= len(self):
            raise ValueError(f"batch_size must be in [1, len(buffer)={len(self)}], got {B}")
        (obs_out, next_out), dst = self._outputs(B, out, dtype, scale)
        idx = self._draw(B)
        if self._n_step == 1:
            fl = self._flags[idx]
            last = idx
            rewards = self._rewards[idx]
            dones = (fl & _TERM).astype(np.float32)
            truncs = ((fl & _TRUNC) >> 1).astype(np.float32)
            discounts = np.full(B, self._gamma, np.float32)
        else:
            _, ret, last, term, trunc, m = self._window(idx)
            rewards = ret.astype(np.float32)
            dones = term.astype(np.float32)
            truncs = trunc.astype(np.float32)
            discounts = (self._gamma ** m).astype(np.float32)
        pool, layout = self._pool, self._layout
        # the tables are int32 (memory); the pool takes int64 slot ids
        pool.gather_pairs(self._obs_slots[idx].astype(np.int64),
                          self._next_slots[last].astype(np.int64), (obs_out, next_out),
                          layout=layout, dtype=dst, scale=scale)
        return ReplaySamples(obs_out, self._actions[idx], next_out, dones, rewards, truncs,
                             idx.astype(np.int64, copy=False), discounts)

    # -- lifetime -------------------------------------------------------------------
    def clear(self) -> None:
        """Drop every transition (releasing their frames); keeps geometry, pool and RNG."""
        n = len(self)
        if self._pool is not None and n:
            self._pool.release(np.concatenate(
                [self._obs_slots[:n].ravel(), self._next_slots[:n].ravel()], dtype=np.int64))
        self._row = 0
        self._full = False
        self._n_skip = 0
        self._flags[:] = 0

    def __del__(self):
        try:
            self.clear()
        except Exception:  # half-built object, or interpreter shutdown
            pass

    def __reduce__(self):
        raise TypeError("a ReplayBuffer cannot be pickled; use ReplayBuffer.save(path)")

    # -- checkpoints ----------------------------------------------------------------
    def _meta(self) -> dict:
        bg = self._rng.bit_generator
        return {
            "format": _FORMAT, "version": _VERSION,
            "capacity": self._capacity, "num_envs": self._num_envs, "n_step": self._n_step,
            "gamma": self._gamma, "action_shape": list(self._action_shape),
            "action_dtype": self._action_dtype.str,
            "layout_opt": self._layout_opt, "stack_size_opt": self._k_opt,
            "layout": self._layout, "stack_size": self._k,
            "frame_shape": None if self._frame_shape is None else list(self._frame_shape),
            "frame_dtype": None if self._dtype is None else self._dtype.str,
            "row": self._row, "full": self._full, "n_skip": self._n_skip,
            "rng": {"name": type(bg).__name__, "state": bg.state},
        }

    def save(self, path) -> None:
        """Write the buffer to ``path`` (an ``.npz`` archive), atomically.

        The archive holds every live frame once, the slot tables as indices into those
        frames, the actions, rewards, flags and the sampling RNG state; no pickled
        objects. It is written to a temporary file in the same directory and renamed
        over ``path`` (``os.replace``), so a failed or interrupted save leaves an
        existing checkpoint intact. Frames are streamed in chunks: saving needs no
        second copy of the buffer in memory.

        Raises:
            OSError: the directory is not writable.
        """
        path = os.fspath(path)
        d = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(dir=d, prefix=os.path.basename(path) + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                self._write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def _write(self, fh) -> None:
        n = len(self)
        arrays = {}
        frames_slots = None
        if self._pool is not None:
            tab = np.concatenate([self._obs_slots[:n], self._next_slots[:n]], axis=1)
            frames_slots, inv = np.unique(tab, return_inverse=True)
            inv = inv.reshape(tab.shape).astype(np.int32)
            arrays["obs_index"] = inv[:, :self._k]
            arrays["next_index"] = inv[:, self._k:]
        arrays["actions"] = self._actions[:n]
        arrays["rewards"] = self._rewards[:n]
        arrays["flags"] = self._flags[:n]
        arrays["meta"] = np.array(json.dumps(self._meta()))
        with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            for name, arr in arrays.items():
                with zf.open(name + ".npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, np.require(arr, requirements="C"),
                                              allow_pickle=False)
            if frames_slots is not None:
                shape = (frames_slots.size,) + self._frame_shape
                with zf.open("frames.npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array_header_2_0(f, {
                        "descr": np.lib.format.dtype_to_descr(self._dtype),
                        "fortran_order": False, "shape": shape})
                    step = max(1, _SAVE_CHUNK_BYTES // self._pool.frame_bytes)
                    for i in range(0, frames_slots.size, step):
                        part = frames_slots[i:i + step, None].astype(np.int64)
                        f.write(self._pool.gather(part, layout="stack").data)

    @classmethod
    def load(cls, path) -> "ReplayBuffer":
        """Restore a buffer written by :meth:`save`: same transitions, same RNG state.

        The same ``sample`` calls give the same samples as the saved buffer would have.
        The frames go into a new pool owned by the buffer (LazyFrames of the wrapper's
        pool added later are copied in, de-duplicated, see the class docs).

        Raises:
            ValueError: a missing, truncated, corrupt or foreign file, or one whose
                contents are inconsistent (the message says which).
        """
        try:
            npz = np.load(os.fspath(path), allow_pickle=False)
        except FileNotFoundError:
            raise
        except Exception as e:
            raise ValueError(f"{path}: not a ReplayBuffer checkpoint ({type(e).__name__}: {e})") from e
        try:
            with npz:
                return cls._read(npz)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from e
        except Exception as e:
            raise ValueError(
                f"{path}: corrupt ReplayBuffer checkpoint ({type(e).__name__}: {e})") from e

    @classmethod
    def _read(cls, npz) -> "ReplayBuffer":
        names = set(npz.files)
        if "meta" not in names:
            raise ValueError("not a ReplayBuffer checkpoint (no meta entry)")
        m = npz["meta"]
        if m.shape != () or m.dtype.kind != "U":
            raise ValueError("not a ReplayBuffer checkpoint (bad meta entry)")
        meta = json.loads(str(m[()]))
        if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
            raise ValueError("not a ReplayBuffer checkpoint (wrong format tag)")
        if meta.get("version") != _VERSION:
            raise ValueError(f"checkpoint version {meta.get('version')} is not supported")
        self = cls(meta["capacity"], num_envs=meta["num_envs"], n_step=meta["n_step"],
                   gamma=meta["gamma"], action_shape=tuple(meta["action_shape"]),
                   action_dtype=np.dtype(meta["action_dtype"]), layout=meta["layout_opt"],
                   stack_size=meta["stack_size_opt"])
        if self._capacity != meta["capacity"]:
            raise ValueError("inconsistent capacity")
        row, full = int(meta["row"]), bool(meta["full"])
        if not 0 <= row < self._rows:
            raise ValueError(f"row {row} out of range")
        n = (self._rows if full else row) * self._num_envs
        bg = getattr(np.random, meta["rng"]["name"], None)
        if bg is None or not isinstance(bg, type) or not issubclass(bg, np.random.BitGenerator):
            raise ValueError(f"unknown bit generator {meta['rng']['name']!r}")
        gen = bg()
        gen.state = meta["rng"]["state"]
        rng = np.random.Generator(gen)

        def get(name, shape, dtype):
            if name not in names:
                raise ValueError(f"missing entry {name!r}")
            a = npz[name]
            if a.shape != shape or a.dtype != np.dtype(dtype):
                raise ValueError(
                    f"entry {name!r} has shape {a.shape} and dtype {a.dtype}, expected "
                    f"{shape} and {np.dtype(dtype)}")
            return a

        actions = get("actions", (n,) + self._action_shape, self._action_dtype)
        rewards = get("rewards", (n,), np.float32)
        flags = get("flags", (n,), np.uint8)
        if np.any(flags & ~np.uint8(_TERM | _TRUNC | _SKIP)):
            raise ValueError("bad flags")
        n_skip = int(np.count_nonzero(flags & _SKIP))
        if n_skip != meta["n_skip"]:
            raise ValueError("inconsistent autoreset count")
        if meta["layout"] is not None:
            k = int(meta["stack_size"])
            fs = C.frame_shape(meta["frame_shape"])
            dt = C.frame_dtype(meta["frame_dtype"])
            layout = meta["layout"]
            if layout not in C.LAYOUTS:
                raise ValueError(f"bad layout {layout!r}")
            C.check_layout(layout, fs)
            oi = get("obs_index", (n, k), np.int32)
            ni = get("next_index", (n, k), np.int32)
            pool, slots = cls._read_frames(npz, fs, dt, self._capacity)
            nf = slots.size
            for t in (oi, ni):
                if t.size and (t.min() < 0 or t.max() >= nf):
                    raise ValueError("slot table refers to a frame that is not in the file")
            geom = (layout, k, fs, dt, C.observation_shape(fs, k, layout))
            self._commit_geometry(geom, pool)
            self._obs_slots[:n] = slots[oi]
            self._next_slots[:n] = slots[ni]
            if n:
                pool.retain(np.concatenate([self._obs_slots[:n].ravel(),
                                            self._next_slots[:n].ravel()], dtype=np.int64))
            if nf:
                pool.release(slots)  # the table holds the references now
        elif n:
            raise ValueError("transitions without frames")
        self._actions[:n] = actions
        self._rewards[:n] = rewards
        self._flags[:n] = flags
        self._row, self._full, self._n_skip = row, full, n_skip
        self._rng = rng
        return self

    @staticmethod
    def _read_frames(npz, fs, dt, capacity):
        """Stream the frames entry into a new pool; returns (pool, int64 slots)."""
        if "frames" not in npz.files:
            raise ValueError("missing entry 'frames'")
        fb = math.prod(fs) * dt.itemsize
        pool = _own_pool(fs, dt, capacity)
        with npz.zip.open("frames.npy") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, fdt = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, fdt = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy version {version}")
            if fortran or fdt != dt or tuple(shape[1:]) != fs or len(shape) != len(fs) + 1:
                raise ValueError(
                    f"frames entry has shape {shape} and dtype {fdt}, expected (n, *{fs}) {dt}")
            nf = shape[0]
            step = max(1, _SAVE_CHUNK_BYTES // fb)
            parts = []
            for i in range(0, nf, step):
                m = min(step, nf - i)
                buf = f.read(m * fb)
                if len(buf) != m * fb:
                    raise ValueError("frames entry is truncated")
                parts.append(pool.push_many(np.frombuffer(buf, dt).reshape((m,) + fs)))
            if f.read(1):
                raise ValueError("frames entry has trailing bytes")
        slots = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return pool, slots
