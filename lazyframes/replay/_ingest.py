"""ReplayBuffer ingest: input normalisation, the buffer's geometry and the add path.

:meth:`ReplayBuffer.add` takes observations as LazyFrames, a LazyBatch, a list of
LazyFrames or ndarrays. Each argument is first described (:func:`describe`), then
checked against the buffer's geometry, then turned into one owner of the buffer's pool
(:func:`as_part`): lazy input of that pool as it is; anything else by pushing its frames
with ``FramePool._push_dedup``, which reuses a slot whose bytes equal a candidate frame.
Stored rows are one ``SlotTable.set`` call; the action, reward and flag arrays are
written after it, from values already checked. After the first add, the usual call
(every env, arguments of the stored geometry and dtypes) takes :func:`fast_add`, which
makes the same checks against cached per-buffer state and leaves anything else to this
general path.
"""

from __future__ import annotations

import importlib
import math
import numbers
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _common as C

if TYPE_CHECKING:
    from . import ReplayBuffer

#: Flag bits of a stored transition (``ReplayBuffer._flags``, uint8).
TERM = np.uint8(1)  # the episode terminated: don't bootstrap
TRUNC = np.uint8(2)  # the episode was cut by a time limit
SKIP = np.uint8(4)  # an autoreset placeholder: never sampled, ends every n-step window


def core_of(pool):
    """The core module (``lazyframes._core`` or ``lazyframes._reference``) of ``pool``."""
    return importlib.import_module(type(pool).__module__)


def own_pool(frame_shape: tuple, dtype: np.dtype, capacity: int, compress=None):
    """A new pool of the import-time core for a buffer of ``capacity`` transitions.

    Its chunks are small enough that a partly filled one wastes less than 1/256 of the
    capacity's frame memory. ``compress``: the checked compression options, or None.
    """
    from .. import FramePool

    fb = math.prod(frame_shape) * np.dtype(dtype).itemsize
    chunk = int(min(C.DEFAULT_CHUNK_BYTES, max(1, capacity * fb // 256)))
    return FramePool(frame_shape, dtype, chunk_bytes=chunk, compress=compress)


def check_pool(pool) -> None:
    """Raises TypeError unless ``pool`` is None or a FramePool of either core."""
    if pool is not None and not C.is_framepool(pool):
        raise TypeError(f"pool must be a lazyframes FramePool, got {type(pool).__name__}")


def check_pool_geometry(pool, frame_shape: tuple, dtype: np.dtype) -> None:
    """Raises ValueError unless ``pool`` stores frames of ``frame_shape`` and ``dtype``."""
    if tuple(pool.frame_shape) != frame_shape or np.dtype(pool.dtype) != dtype:
        raise ValueError(
            f"the buffer's pool stores frames of shape {tuple(pool.frame_shape)} and dtype "
            f"{np.dtype(pool.dtype)}; the observations have frames of shape {frame_shape} "
            f"and dtype {dtype}"
        )


class Obs:
    """One add() argument (obs or next_obs) for all envs, checked but not yet stored.

    kind "lazy": ``owner``, a LazyBatch (or a LazyFrames when not batched) of ``pool``
    with ``k`` frames per observation; kind "array": ``arr`` (E, *observation_shape) in
    ``layout`` (None: the buffer's layout).
    """

    __slots__ = ("arr", "k", "kind", "layout", "owner", "pool")

    def __init__(self, kind, *, owner=None, arr=None, layout=None):
        self.kind, self.owner, self.arr, self.layout = kind, owner, arr, layout
        self.pool: Any = None
        self.k: Any = None
        if owner is not None:
            self.pool, self.k, self.layout = owner.pool, owner.stack_size, owner.layout

    @property
    def frame_shape(self) -> tuple:
        """Shape of one frame (kind "lazy": the pool's)."""
        return tuple(self.pool.frame_shape)

    @property
    def dtype(self) -> np.dtype:
        """The frames' dtype."""
        return np.dtype(self.pool.dtype) if self.arr is None else self.arr.dtype


def is_batched_obs(x) -> bool:
    """An observation argument with a leading env axis (LazyBatch or list of LazyFrames)."""
    return C.is_lazybatch(x) or isinstance(x, (list, tuple))


#: What the leading axis of a batched add counts, for error messages.
_PER_ADD = "(num_envs, or one per id of env_ids)"


def describe(x, name: str, num_envs: int, batched: bool) -> Obs:
    """Check the form of one observation argument and describe it.

    ``num_envs`` is the number of transitions of this add (the length of ``env_ids``).

    Raises:
        ValueError: a batch where one observation is expected, a wrong number of envs,
            observations of different geometries.
        TypeError: non-numeric input, LazyFrames mixed with other objects.
    """
    E = num_envs
    if C.is_lazybatch(x):
        if not batched:
            raise ValueError(f"{name} is a batch but one transition is added")
        if len(x) != E:
            raise ValueError(f"{name} has {len(x)} observations, expected {E} {_PER_ADD}")
        return Obs("lazy", owner=x)
    if batched and isinstance(x, (list, tuple)) and x and all(C.is_lazyframes(o) for o in x):
        if len(x) != E:
            raise ValueError(f"{name} has {len(x)} observations, expected {E} {_PER_ADD}")
        if (
            len({o.stack_size for o in x}) != 1
            or len({o.frame_shape for o in x}) != 1
            or len({o.dtype for o in x}) != 1
        ):
            raise ValueError(
                f"the observations in {name} differ in stack size, frame shape or dtype"
            )
        pool = x[0].pool
        if all(o.pool is pool for o in x):
            return Obs("lazy", owner=pool.lazy_batch([o.slots for o in x], layout=x[0].layout))
        # several pools: copy the frames out (stack layout) and in again
        arr = np.stack([o.pool.gather([o.slots], layout="stack")[0] for o in x])
        return Obs("array", arr=arr, layout="stack")
    if not batched and C.is_lazyframes(x):
        return Obs("lazy", owner=x)
    if isinstance(x, (list, tuple)) and any(C.is_lazyframes(o) for o in x):
        raise TypeError(f"{name} mixes LazyFrames and other objects")
    a = np.asarray(x)
    if a.dtype.kind not in "biufc":
        raise TypeError(f"{name} must be a numeric array or LazyFrames, got dtype {a.dtype}")
    if not batched:
        a = a[None]
    elif a.ndim == 0 or a.shape[0] != E:
        raise ValueError(f"{name} has shape {a.shape}, expected a leading axis of {E} {_PER_ADD}")
    return Obs("array", arr=a)


def _frame_shape_of(obs_shape: tuple, layout: str, k: int) -> tuple:
    if layout == "stack":
        return tuple(obs_shape[1:])
    if layout == "first":
        return (obs_shape[0] // k,) + tuple(obs_shape[1:])
    return tuple(obs_shape[:-1]) + (obs_shape[-1] // k,)


def geometry(o: Obs, layout_opt, k_opt) -> tuple:
    """``(layout, k, frame_shape, dtype, observation_shape)`` decided by the first add.

    Raises:
        ValueError: ndarray observations that cannot be split into frames, a stack size
            other than ``k_opt``, a layout that does not fit the frames.
    """
    if o.kind == "lazy":
        layout = layout_opt or o.layout
        k, fs, dt = o.k, o.frame_shape, o.dtype
    else:
        layout = layout_opt or "stack"
        shape = o.arr.shape[1:]
        if o.layout == "stack" or layout == "stack":
            if len(shape) == 0:
                raise ValueError("ndarray observations need at least one axis (the k frames)")
            k, fs = shape[0], tuple(shape[1:])
        else:
            if k_opt is None:
                raise ValueError(
                    f"ndarray observations in layout {layout!r} need stack_size=k "
                    f"(ReplayBuffer(..., layout={layout!r}, stack_size=4)) to be split "
                    f"into frames"
                )
            k = k_opt
            if len(shape) == 0:
                raise ValueError("ndarray observations need at least one axis")
            ax = shape[-1] if layout == "last" else shape[0]
            if ax % k:
                raise ValueError(
                    f"observation shape {shape} cannot hold {k} frames on the {layout} axis"
                )
            fs = _frame_shape_of(shape, layout, k)
        dt = o.dtype
    if k_opt is not None and k != k_opt:
        raise ValueError(f"observations have {k} frames, stack_size is {k_opt}")
    fs = C.frame_shape(fs)
    dt = C.frame_dtype(dt)
    C.check_layout(layout, fs)
    return layout, k, fs, dt, C.observation_shape(fs, k, layout)


def check_obs(o: Obs, name: str, geom: tuple, num_envs: int, pool) -> None:
    """Check one described argument against the buffer's geometry (and ``pool``, or None).

    Raises:
        ValueError: another stack size, frame shape or observation shape.
        TypeError: another dtype (observations are never cast).
    """
    _, k, fs, dt, obs_shape = geom
    if o.kind == "lazy":
        if o.pool is pool and o.k == k:
            return  # the buffer's own pool: its frames have the buffer's shape and dtype
        if o.k != k:
            raise ValueError(f"{name} has {o.k} frames, the buffer stores {k}")
        if o.frame_shape != fs:
            raise ValueError(f"{name} has frames of shape {o.frame_shape}, the buffer stores {fs}")
        if o.dtype.newbyteorder("=") != dt:
            raise TypeError(f"{name} has dtype {o.dtype}, the buffer stores {dt}")
        return
    want = tuple(obs_shape if o.layout is None else C.observation_shape(fs, k, o.layout))
    if o.arr.shape[1:] != want:
        got = o.arr.shape[1:] if num_envs == 1 else o.arr.shape
        raise ValueError(
            f"{name} has shape {got}, expected {want if num_envs == 1 else (num_envs,) + want}"
        )
    if o.arr.dtype.newbyteorder("=") != dt:
        raise TypeError(f"{name} has dtype {o.arr.dtype}, the buffer stores {dt}")


def _frames_view(arr: np.ndarray, layout: str, k: int) -> np.ndarray:
    """``(E, *observation_shape)`` -> a view ``(E, k, *S)`` of the frames (may be strided)."""
    E = arr.shape[0]
    if layout == "stack":
        return arr
    if layout == "first":
        return arr.reshape((E, k, arr.shape[1] // k) + arr.shape[2:])
    c = arr.shape[-1] // k
    return np.moveaxis(arr.reshape(arr.shape[:-1] + (k, c)), -2, 1)


def as_part(o: Obs, pool, layout: str, k: int, candidates):
    """One described argument as an owner of ``pool``'s slots, ready for ``SlotTable.set``.

    Lazy input of ``pool`` is its own owner (no frame copied). Frames (ndarrays, or
    LazyFrames of another pool) are pushed in one ``_push_dedup`` call, reusing the slot
    of a frame with equal bytes in ``candidates`` (a LazyBatch of ``pool`` with one row
    per env, or None) or earlier in the same observation (reset padding).
    """
    if o.kind == "lazy" and o.pool is pool:
        return o.owner
    if o.kind == "lazy":  # another pool: copy its frames out once
        frames = o.pool.gather(np.reshape(o.owner.slots, (-1, k)), layout="stack")
    else:
        frames = _frames_view(o.arr, o.layout or layout, k)
    if candidates is not None and C.is_lazyframes(candidates):
        candidates = pool.lazy_batch([candidates.slots])
    return pool._push_dedup(frames, candidates)


def flags_arg(x, name: str, shape: tuple) -> np.ndarray:
    """A bool array of ``shape`` from bools or 0/1 numbers.

    Raises:
        ValueError: another shape. TypeError: values other than booleans or 0/1.
    """
    a = np.asarray(x)
    if a.shape != shape:
        raise ValueError(f"{name} has shape {a.shape}, expected {shape}")
    if a.dtype == np.bool_:
        return a
    if a.dtype.kind not in "iuf" or not np.all((a == 0) | (a == 1)):
        raise TypeError(f"{name} must be booleans (or 0/1), got dtype {a.dtype}")
    return a.astype(np.bool_)


#: Kinds of the values :func:`exact_cast` stores into a dtype, by the dtype's kind.
_CASTS_INTO = {"b": "b", "i": "biu", "u": "biu", "f": "biuf"}


def numeric(x, name: str) -> np.ndarray:
    """``x`` as a numeric (bool, integer or float) ndarray.

    Raises:
        ValueError: integers beyond 64 bits (NumPy makes them objects), which no stored
            dtype holds. TypeError: anything else that is not numeric.
    """
    a = np.asarray(x)
    if a.dtype == object and a.size and all(isinstance(v, numbers.Integral) for v in a.flat):
        raise ValueError(f"{name} holds an integer beyond 64 bits, which no stored dtype holds")
    if a.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be numeric, got dtype {a.dtype}")
    return a


def exact_cast(a: np.ndarray, dtype: np.dtype, name: str) -> np.ndarray:
    """``a`` cast to ``dtype`` with every value kept: never wrapped, never infinite.

    Booleans and integers go into any integer dtype that holds their values, anything
    numeric into a float dtype, only booleans into bool.

    Raises:
        TypeError: a float into an integer dtype, a number into bool.
        ValueError: an integer out of ``dtype``'s range (e.g. a uint64 above 2**63 into
            int64, -1 into uint8), a non-finite float, or a float that overflows ``dtype``.
    """
    if a.dtype != dtype and a.dtype.kind not in _CASTS_INTO[dtype.kind]:
        raise TypeError(f"{name} of dtype {a.dtype} cannot be stored as {dtype}")
    if dtype.kind == "f" and (a.dtype.kind == "f" or dtype.itemsize < 4):
        top = float(np.finfo(dtype).max)
        if not _largest_magnitude(a) <= top:  # also False for NaN
            raise ValueError(
                f"{name} must be finite and fit {dtype} (magnitude at most {top:.4g}), got "
                f"{a[~(np.abs(a.astype(np.float64)) <= top)].flat[0]!r}"
            )
    if a.dtype == dtype:
        return a
    if dtype.kind in "iu" and a.size and a.dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo, hi = int(a.min()), int(a.max())
        if lo < info.min or hi > info.max:
            bad = lo if lo < info.min else hi
            raise ValueError(f"{name} {bad} does not fit {dtype} (range [{info.min}, {info.max}])")
    return a.astype(dtype)


def _largest_magnitude(a: np.ndarray) -> float:
    """The largest ``abs`` of ``a``'s values as a float (NaN if one is NaN; 0.0 if empty)."""
    if a.ndim == 0:
        return abs(float(a))
    return float(np.abs(a.astype(np.float64, copy=False)).max()) if a.size else 0.0


def transition_args(
    action,
    reward,
    terminated,
    truncated,
    autoreset,
    lead: tuple,
    action_shape: tuple,
    action_dtype: np.dtype,
) -> tuple:
    """Checked ``(actions, rewards, flags, autoreset count)`` of E transitions.

    The arrays have the leading shape ``lead`` (``(E,)``, or ``()`` for one transition
    not batched) and are already of their stored dtypes (``action_dtype``, float32,
    uint8), every value kept exactly (:func:`exact_cast`); the flags are
    ``TERM | TRUNC | SKIP`` bits.

    Raises:
        ValueError: a wrong shape, a value that does not fit its dtype. TypeError:
            non-numeric values, a float action for an integer dtype, non-boolean flags.
    """
    a = numeric(action, "action")
    if a.shape != lead + action_shape:
        raise ValueError(f"action has shape {a.shape}, expected {lead + action_shape}")
    a = exact_cast(a, action_dtype, "action")
    r = numeric(reward, "reward")
    if r.shape != lead:
        raise ValueError(f"reward has shape {r.shape}, expected {lead}")
    r = exact_cast(r, np.dtype(np.float32), "reward")
    term = flags_arg(terminated, "terminated", lead).view(np.uint8)
    flags = term | flags_arg(truncated, "truncated", lead).view(np.uint8) * TRUNC
    n_skip = 0
    if autoreset is not None:
        skip = flags_arg(autoreset, "autoreset", lead)
        flags = flags | skip.view(np.uint8) * SKIP
        n_skip = int(np.count_nonzero(skip))
    return a, r, flags, n_skip


def final_rows(final_obs, final_mask, E: int, batched: bool, lead: tuple):
    """``(rows, Obs)``: the final observations that replace rows of ``next_obs``, or None.

    Only the rows ``final_mask`` marks are read from ``final_obs`` (Gymnasium's
    ``infos["final_obs"]`` holds None for the other envs); None when it marks none.

    Raises:
        ValueError: ``final_obs`` without ``final_mask``, a wrong shape or number of
            envs, no observation (None) where ``final_mask`` marks an env.
        TypeError: non-boolean ``final_mask``, non-numeric observations.
    """
    if final_mask is None:
        if final_obs is not None:
            raise ValueError(
                "final_obs needs final_mask (e.g. Gymnasium's infos['_final_obs']): the envs "
                "whose next_obs it replaces"
            )
        return None
    rows = np.flatnonzero(flags_arg(final_mask, "final_mask", lead))
    if rows.size == 0:
        return None
    if final_obs is None:
        raise ValueError(f"final_mask marks env(s) {rows.tolist()} but final_obs is None")
    if not batched:
        return rows, describe(final_obs, "final_obs", 1, False)
    if not hasattr(final_obs, "__len__") or len(final_obs) != E:
        raise ValueError(f"final_obs must hold one entry per env ({E} {_PER_ADD})")
    picked = [final_obs[i] for i in rows.tolist()]
    missing = [int(i) for i, o in zip(rows, picked, strict=True) if o is None]
    if missing:
        raise ValueError(f"final_obs has no observation (None) for env(s) {missing}")
    return rows, describe(picked, "final_obs", rows.size, True)


def with_final(pool, n: Obs, fin: tuple, layout: str, k: int, obs_part, E: int):
    """The owner of the next observations: ``n``'s rows, ``fin``'s where it has one.

    Only the rows of ``fin`` are read from the final observations, and ``n`` is stored
    as it is (a view, not a copy): the two owners' slots are combined into one LazyBatch.
    The final frames are de-duplicated against the same env's ``obs_part`` row.
    """
    rows, f = fin
    cand = pool.lazy_batch(np.reshape(obs_part.slots, (-1, k))[rows])
    final = as_part(f, pool, layout, k, cand)
    if rows.size == E:  # every row replaced: next_obs is not stored at all
        return final
    nxt = as_part(n, pool, layout, k, obs_part)
    slots = np.reshape(nxt.slots, (-1, k))  # a fresh array: .slots is a copy
    slots[rows] = np.reshape(final.slots, (-1, k))
    return pool.lazy_batch(slots)


def env_streams(num_envs: int, env_ids, obs, reward) -> tuple:
    """``(envs, batched)``: the env streams of one add, and whether it is batched.

    Batched arguments have a leading axis of ``len(envs)``. ``env_ids`` None means every
    env; the arguments are then batched when ``num_envs > 1``, or when ``num_envs == 1``
    and the call has a leading axis of 1 (the observation is a LazyBatch or a list, or
    ``reward`` is 1-D). A scalar id adds one transition with no leading axis; a 1-D
    array of ids adds one transition per id.

    Raises:
        ValueError: ids out of ``[0, num_envs)``, repeated, empty, or not 0-D/1-D.
        TypeError: ids that are not integers.
    """
    if env_ids is None:
        batched = num_envs > 1 or is_batched_obs(obs) or np.asarray(reward).ndim == 1
        return np.arange(num_envs), batched
    ids = np.asarray(env_ids)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"env_ids must be integers, got dtype {ids.dtype}")
    if ids.ndim > 1:
        raise ValueError(f"env_ids must be an integer or a 1-D array, got shape {ids.shape}")
    envs = ids.reshape(-1).astype(np.int64)
    if envs.size == 0:
        raise ValueError("env_ids is empty")
    if (envs < 0).any() or (envs >= num_envs).any():  # uint64 ids above 2**63 wrap to < 0
        raise ValueError(f"env_ids {ids.tolist()} out of range [0, num_envs={num_envs})")
    if np.unique(envs).size != envs.size:
        raise ValueError(f"env_ids {ids.tolist()} repeats an env: one transition per env per add")
    return envs, ids.ndim == 1


def dedup_candidates(table, k: int, last: np.ndarray):
    """The next observations of each stream's newest transition, a LazyBatch (E, k).

    ``last``: each stream's newest transition (``ReplayBuffer._last[envs]``). They are
    the usual source of the frames of a new ndarray observation. A stream with no stored
    transition borrows another stream's row (a candidate is only compared byte for
    byte, so any row is correct); None when no stream has one.
    """
    rows = last.tolist()  # Python ints: the table reads a list of them in C
    if min(rows) < 0:
        have = [r for r in rows if r >= 0]
        if not have:
            return None
        rows = [r if r >= 0 else have[0] for r in rows]
    return table.batch(rows, k, 2 * k)


def ring_slots(rb: ReplayBuffer, E: int) -> np.ndarray:
    """The ring positions the next ``E`` transitions are written to, oldest first."""
    if rb._pos + E <= rb._capacity:
        return np.arange(rb._pos, rb._pos + E)
    return (rb._pos + np.arange(E)) % rb._capacity


#: The per-transition arrays of a buffer (``_rows`` rows each), grown by :func:`grow`.
ROW_ARRAYS = ("_actions", "_rewards", "_flags", "_env", "_next")
#: The first growth of a buffer's tables makes at least this many rows.
MIN_ROWS = 64


def rows_for(rb: ReplayBuffer, E: int) -> int:
    """The rows the buffer's tables need to hold ``E`` more transitions.

    Tables grow geometrically (doubling, at least ``MIN_ROWS``) up to the capacity, so
    growing costs O(1) per transition amortised and a buffer holds tables of at most
    twice the transitions it has held (or of its capacity).
    """
    rows = rb._rows
    if rows < rb._capacity and rb._pos + E > rows:
        return min(rb._capacity, max(rb._pos + E, 2 * rows, MIN_ROWS))
    return rows


def grow(rb: ReplayBuffer, rows: int) -> None:
    """Enlarge the per-transition arrays to ``rows`` rows, keeping their contents.

    The new arrays are all allocated before any replaces the old one, so a MemoryError
    leaves the buffer as it was. The SlotTable grows separately (``SlotTable.grow``).
    """
    owners = [(rb, ROW_ARRAYS)]  # and the vector leaves of a Dict buffer
    owners += [(leaf, leaf.ROW_ARRAYS) for leaf in (rb._leaves or {}).values()]
    new = []
    for owner, names in owners:
        for name in names:
            a = getattr(owner, name)
            if len(a) >= rows:
                continue
            b = np.full((rows,) + a.shape[1:], -1 if name == "_next" else 0, a.dtype)
            b[: len(a)] = a
            new.append((owner, name, b))
    for owner, name, b in new:
        setattr(owner, name, b)
    rb._rows = rows


#: Adds of up to this many transitions link them one by one with Python ints (NumPy's
#: per-call overhead dominates small adds); larger adds link them with array operations.
SCALAR_LINKS = 16


def link(rb: ReplayBuffer, idx: np.ndarray, envs: np.ndarray) -> None:
    """Ring bookkeeping of transitions written at ``idx`` for streams ``envs``.

    Evicts the transitions those positions held (each is the oldest of its stream, so
    only a stream whose newest it also was loses its link target), then appends each
    new transition to its stream: ``_next`` of the stream's newest transition points at
    it, and it becomes the newest. Cannot fail.
    """
    evicting = rb._full or rb._pos + idx.size > rb._capacity
    if evicting and rb._n_skip:
        evicted = idx if rb._full else idx[idx < rb._pos]
        rb._n_skip -= int(np.count_nonzero(rb._flags[evicted] & SKIP))
    if idx.size <= SCALAR_LINKS:
        _link_each(rb, idx.tolist(), envs.tolist(), evicting)
    else:
        _link_arrays(rb, idx, envs, evicting)
    end = rb._pos + idx.size
    rb._full = rb._full or end >= rb._capacity
    rb._pos = end % rb._capacity


def _link_each(rb: ReplayBuffer, idx: list, envs: list, evicting: bool) -> None:
    """:func:`link` one transition at a time."""
    last, nxt, env, pos, full = rb._last, rb._next, rb._env, rb._pos, rb._full
    for i, e in zip(idx, envs, strict=True):
        if evicting and (full or i < pos):
            old = env[i]
            if last[old] == i:
                last[old] = -1
        p = last[e]
        if p >= 0:
            nxt[p] = i
        nxt[i] = -1
        env[i] = e
        last[e] = i


def _link_arrays(rb: ReplayBuffer, idx: np.ndarray, envs: np.ndarray, evicting: bool) -> None:
    """:func:`link` with array operations."""
    if evicting:
        evicted = idx if rb._full else idx[idx < rb._pos]
        old = rb._env[evicted]
        rb._last[old[rb._last[old] == evicted]] = -1
    prev = rb._last[envs]
    have = prev >= 0
    rb._next[prev[have]] = idx[have]
    rb._next[idx] = -1
    rb._env[idx] = envs
    rb._last[envs] = idx


def prepare_frames(st, rb: ReplayBuffer, o: Obs, n: Obs, fin, envs, E: int, names: tuple):
    """Check one store's observations and make them owners of its pool; nothing is stored.

    ``st`` holds the store's options and geometry (``_layout_opt``, ``_k_opt``, ``_pool``,
    ``_table``, ``_layout``, ...): the buffer itself, or a frame leaf of a Dict buffer.
    ``names``: the names of obs, next_obs and final_obs in error messages.

    Returns:
        ``(geom, pool, obs_part, next_part)``; the first add decides ``geom`` and ``pool``.
    """
    table = st._table
    if table is None:  # the first add decides the geometry and the pool
        geom = geometry(o, st._layout_opt, st._k_opt)
    else:
        geom = (st._layout, st._k, st._frame_shape, st._dtype, st._obs_shape)
    check_obs(o, names[0], geom, E, st._pool)
    check_obs(n, names[1], geom, E, st._pool)
    if fin is not None:
        check_obs(fin[1], names[2], geom, fin[0].size, st._pool)
    layout, k = geom[0], geom[1]
    pool = st._pool
    if pool is None:
        pool = o.pool if o.kind == "lazy" else n.pool if n.kind == "lazy" else None
        if pool is None:
            pool = own_pool(geom[2], geom[3], rb._capacity, rb._compress)
        elif rb._compress is not None:  # the wrapper's pool, adopted: it compresses from now on
            pool.enable_compression(rb._compress)
    elif table is None:
        if isinstance(pool, dict):
            raise TypeError("pool is a dict of pools (for Dict observations); obs is not a dict")
        check_pool_geometry(pool, geom[2], geom[3])
    prev = None
    if (o.kind != "lazy" or o.pool is not pool) and table is not None:
        prev = dedup_candidates(table, k, rb._last[envs])
    obs_part = as_part(o, pool, layout, k, prev)
    if fin is None:
        next_part = as_part(n, pool, layout, k, obs_part)
    else:
        next_part = with_final(pool, n, fin, layout, k, obs_part, E)
    return geom, pool, obs_part, next_part


def table_for(st, pool, rows: int, k: int):
    """The store's SlotTable of at least ``rows`` rows (new at the first add, else grown)."""
    table = st._table
    if table is None:
        return core_of(pool).SlotTable(pool, rows, 2 * k)
    if len(table) < rows:
        table.grow(rows)
    return table


def adopt(st, geom: tuple, pool, table) -> None:
    """After the first add's rows are stored: the store keeps its geometry, pool, table."""
    if st._table is None:
        st._layout, st._k, st._frame_shape, st._dtype, st._obs_shape = geom
        st._pool, st._table = pool, table


def is_dict_obs(obs) -> bool:
    """A Dict observation: a dict of leaves, or (batched) a list of such dicts."""
    return isinstance(obs, dict) or (
        isinstance(obs, (list, tuple)) and len(obs) > 0 and isinstance(obs[0], dict)
    )


_NAMES = ("obs", "next_obs", "final_obs")


def add(
    rb: ReplayBuffer,
    obs,
    action,
    reward,
    next_obs,
    terminated,
    truncated,
    *,
    autoreset=None,
    env_ids=None,
    final_obs=None,
    final_mask=None,
) -> np.ndarray:
    """ReplayBuffer.add: check everything, then store one transition per env stream.

    Returns the ring positions written, oldest first.
    """
    if rb._leaves is not None or (isinstance(obs, (dict, list, tuple)) and is_dict_obs(obs)):
        from . import _dict

        return _dict.add(
            rb,
            obs,
            action,
            reward,
            next_obs,
            terminated,
            truncated,
            autoreset=autoreset,
            env_ids=env_ids,
            final_obs=final_obs,
            final_mask=final_mask,
        )
    if (
        env_ids is None
        and autoreset is None
        and final_mask is None
        and final_obs is None
        and rb._table is not None
    ):
        idx = fast_add(rb, obs, action, reward, next_obs, terminated, truncated)
        if idx is not None:
            return idx
    envs, batched = env_streams(rb._num_envs, env_ids, obs, reward)
    E = envs.size
    lead = (E,) if batched else ()
    o = describe(obs, "obs", E, batched)
    n = describe(next_obs, "next_obs", E, batched)
    actions, rewards, flags, n_skip = transition_args(
        action,
        reward,
        terminated,
        truncated,
        autoreset,
        lead,
        rb._action_shape,
        rb._action_dtype,
    )
    fin = final_rows(final_obs, final_mask, E, batched, lead)
    geom, pool, obs_part, next_part = prepare_frames(rb, rb, o, n, fin, envs, E, _NAMES)
    table = rb._table
    if table is None or rb._pos + E > rb._rows:  # the first add, or the tables may grow
        rows = rows_for(rb, E)
        table = table_for(rb, pool, rows, geom[1])
        if rb._rows < rows:
            grow(rb, rows)
    idx = ring_slots(rb, E)
    table.set(idx, (obs_part, next_part))
    # nothing below can fail
    if rb._table is None:
        adopt(rb, geom, pool, table)
    link(rb, idx, envs)  # commit(), inlined: this is the hot path
    rb._n_skip += n_skip
    rb._actions[idx] = actions
    rb._rewards[idx] = rewards
    rb._flags[idx] = flags
    return idx


def commit(rb: ReplayBuffer, idx, envs, n_skip: int, actions, rewards, flags) -> None:
    """The bookkeeping of transitions stored at ``idx``: links, actions, rewards, flags."""
    link(rb, idx, envs)
    rb._n_skip += n_skip
    rb._actions[idx] = actions
    rb._rewards[idx] = rewards
    rb._flags[idx] = flags


# -- the fast path ------------------------------------------------------------------------
# ``add`` of the usual kinds of transition (every env, no autoreset or final_obs, after the
# first add) costs much less Python than the general path: the checks the general path
# makes are made against per-buffer state cached here, and whatever they do not accept
# (another form, type, shape or dtype, a value out of range) goes the general way, which
# checks it again and raises its errors. So the general path stays the one definition of
# what add accepts; this one only accepts, never raises, the same inputs with the same
# results (the same slots, values and links).

#: float32's largest finite magnitude: a reward is stored as float32.
_F32_MAX = float(np.finfo(np.float32).max)
#: Python and NumPy float scalar types a scalar reward or float action is taken from.
_FLOATS = frozenset((float, np.float64, np.float32))
#: Integer scalar types a scalar action is taken from (not bool; not timedelta64, which
#: NumPy counts as an integer but add refuses).
_INTS = frozenset(
    (int, np.int64, np.int32, np.int16, np.int8, np.uint64, np.uint32, np.uint16, np.uint8)
)
#: The types a scalar flag (terminated, truncated) is taken from.
_BOOLS = frozenset((bool, np.bool_))


class FastState:
    """What :func:`fast_add` checks against, derived from a buffer (cached per SlotTable)."""

    __slots__ = (
        "act_kind",
        "act_range",
        "batch_shape",
        "batch_type",
        "batch_view",
        "dtype",
        "envs",
        "frames_type",
        "k",
        "layout",
        "obs_shape",
        "pool",
        "table",
        "view",
    )

    def __init__(self, rb: ReplayBuffer):
        core = core_of(rb._pool)
        self.table, self.pool, self.k = rb._table, rb._pool, rb._k
        self.layout, self.dtype, self.obs_shape = rb._layout, rb._dtype, rb._obs_shape
        self.batch_shape = (rb._num_envs,) + tuple(rb._obs_shape)
        # the frames (E, k, *S) of an ndarray observation are a reshape of it, unless the
        # layout is "last" (then None: _frames_view moves the axis)
        self.view = self.batch_view = None
        if self.layout != "last":
            S = _frame_shape_of(tuple(rb._obs_shape), self.layout, self.k)
            self.view, self.batch_view = (1, self.k) + S, (rb._num_envs, self.k) + S
        self.frames_type, self.batch_type = core.LazyFrames, core.LazyBatch
        envs = np.arange(rb._num_envs)
        envs.flags.writeable = False
        self.envs = envs
        # a scalar action taken as a Python int ("i") or float ("f") in [lo, hi], or None
        dt = rb._action_dtype
        self.act_kind: Any = None
        self.act_range: Any = None
        if rb._action_shape == () and dt.kind in "iu":
            info = np.iinfo(dt)
            self.act_kind, self.act_range = "i", (int(info.min), int(info.max))
        elif rb._action_shape == () and dt in (np.float32, np.float64):
            top = float(np.finfo(dt).max)
            self.act_kind, self.act_range = "f", (-top, top)


def fast_state(rb: ReplayBuffer) -> FastState:
    """The buffer's :class:`FastState` (made again whenever its SlotTable changes)."""
    st = rb._fast
    if st is None or st.table is not rb._table:
        st = rb._fast = FastState(rb)
    return st


def _fast_obs(st: FastState, x, batched: bool):
    """``x`` as frames ``(E, k, *S)`` or an owner of the buffer's pool; None: not the usual."""
    t = type(x)
    if t is np.ndarray:
        if x.shape != (st.batch_shape if batched else st.obs_shape) or x.dtype != st.dtype:
            return None
        view = st.batch_view if batched else st.view
        if view is not None:
            return x.reshape(view)
        return _frames_view(x if batched else x[None], st.layout, st.k)
    if batched and (t is list or t is tuple):  # a LazyFrames per env, of the buffer's pool
        pool, k, ft = st.pool, st.k, st.frames_type
        if len(x) != st.batch_shape[0] or not all(
            type(o) is ft and o.pool is pool and o.stack_size == k for o in x
        ):
            return None
        return pool.lazy_batch([o.slots for o in x], layout=x[0].layout)
    if (
        (t is st.batch_type if batched else t is st.frames_type)
        and x.pool is st.pool
        and x.stack_size == st.k
        and (not batched or len(x) == st.batch_shape[0])
    ):
        return x
    return None


def _fast_scalars(st: FastState, action, reward, terminated, truncated):
    """``(action, reward, flags)`` of one transition as exact Python numbers, or None."""
    ta, kind = type(action), st.act_kind
    if kind == "i" and ta in _INTS:
        action = int(action)
    elif kind == "f" and ta in _FLOATS:
        action = float(action)  # exact: float64 holds every float32
    else:
        return None
    lo, hi = st.act_range
    if not lo <= action <= hi:  # also False for NaN
        return None
    tr = type(reward)
    if tr in _FLOATS:
        reward = float(reward)
        if not -_F32_MAX <= reward <= _F32_MAX:
            return None
    elif tr is not int or not -(1 << 24) <= reward <= 1 << 24:  # exact in float32
        return None
    if type(terminated) not in _BOOLS or type(truncated) not in _BOOLS:
        return None
    return action, reward, (1 if terminated else 0) | (2 if truncated else 0)


def _fast_arrays(rb: ReplayBuffer, action, reward, terminated, truncated):
    """``(actions, rewards, flags)`` of E transitions as stored arrays, or None."""
    lead = (rb._num_envs,)
    if (
        type(action) is not np.ndarray
        or action.dtype != rb._action_dtype
        or action.shape != lead + rb._action_shape
        or type(reward) is not np.ndarray
        or reward.dtype != np.float32
        or reward.shape != lead
    ):
        return None
    for f in (terminated, truncated):
        if type(f) is not np.ndarray or f.dtype != np.bool_ or f.shape != lead:
            return None
    if not np.isfinite(reward).all():
        return None
    if action.dtype.kind == "f" and not np.isfinite(action).all():
        return None
    return action, reward, terminated.view(np.uint8) | truncated.view(np.uint8) << 1


def fast_add(rb: ReplayBuffer, obs, action, reward, next_obs, terminated, truncated):
    """:func:`add` of one transition per env, when every argument is of the usual kind.

    Returns the ring positions written, or None (nothing done) for the general path.
    """
    st = fast_state(rb)
    E, pos = rb._num_envs, rb._pos
    if pos + E > rb._capacity:
        return None  # the ring wraps within this add (after adds of some env_ids)
    batched = E > 1  # (num_envs 1 with a leading axis of 1 is left to the general path)
    o = _fast_obs(st, obs, batched)
    if o is None:
        return None
    n = _fast_obs(st, next_obs, batched)
    if n is None:
        return None
    vals = (
        _fast_arrays(rb, action, reward, terminated, truncated)
        if batched
        else _fast_scalars(st, action, reward, terminated, truncated)
    )
    if vals is None:
        return None
    table, pool, k = st.table, st.pool, st.k
    if type(o) is np.ndarray:  # (the candidates are dropped before the set, as add does)
        o = pool._push_dedup(o, dedup_candidates(table, k, rb._last))
    if type(n) is np.ndarray:
        n = pool._push_dedup(n, o if type(o) is st.batch_type else pool.lazy_batch([o.slots]))
    if pos + E > rb._rows:  # the tables grow
        rows = rows_for(rb, E)
        table_for(rb, pool, rows, k)
        grow(rb, rows)
    idx = np.arange(pos, pos + E)
    table.set(list(range(pos, pos + E)) if batched else [pos], (o, n))
    # nothing below can fail
    actions, rewards, flags = vals
    if batched:
        commit(rb, idx, st.envs, 0, actions, rewards, flags)
    else:
        _link_one(rb, pos)
        rb._actions[pos] = actions
        rb._rewards[pos] = rewards
        rb._flags[pos] = flags
    return idx


def _link_one(rb: ReplayBuffer, i: int) -> None:
    """:func:`link` of one transition of env 0 at ``i == rb._pos``."""
    last, nxt = rb._last, rb._next
    if rb._full and rb._n_skip and rb._flags[i] & SKIP:  # evicting a placeholder
        rb._n_skip -= 1
    p = last[0]  # (== i at capacity 1: the evicted one was the newest; nxt[i] is reset)
    if p >= 0:
        nxt[p] = i
    nxt[i] = -1
    rb._env[i] = 0
    last[0] = i
    end = i + 1
    rb._full = rb._full or end >= rb._capacity
    rb._pos = end % rb._capacity
