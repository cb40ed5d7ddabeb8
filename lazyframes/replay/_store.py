"""The stores of a replay buffer: one per observation leaf (docs/DESIGN.md, "The replay engine").

A plain buffer has one :class:`FrameStore` (a leaf's pool, geometry and ``SlotTable`` of
``2 k`` slot ids per transition); a Dict buffer one per frame leaf and a :class:`VectorStore`
per other leaf. An add prepares each leaf without changing the buffer (ndarray frames pushed,
de-duplicated, into owners); a sample pins the drawn frames (:meth:`FrameStore.pin`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import _checks as C
from .. import _core
from .._scaled import ScaledLazyFrames, _Scaled
from ._args import PER_ADD

_LazyFrames, _LazyBatch = _core.LazyFrames, _core.LazyBatch
_ndarray = np.ndarray


def leaf_names(key: str) -> tuple:
    """The names of a Dict leaf's obs, next_obs and final_obs in messages."""
    return (f"obs[{key!r}]", f"next_obs[{key!r}]", f"final_obs[{key!r}]")


def own_pool(frame_shape: tuple, dtype: np.dtype, capacity: int, compress=None):
    """A new pool for a buffer of ``capacity`` transitions (``compress``: checked options).

    Its chunks are small enough that a partly filled one wastes less than 1/256 of the
    capacity's frame memory.
    """
    fb = math.prod(frame_shape) * np.dtype(dtype).itemsize
    chunk = int(min(C.DEFAULT_CHUNK_BYTES, max(1, capacity * fb // 256)))
    return _core.FramePool(frame_shape, dtype, chunk_bytes=chunk, compress=compress)


def check_pool(pool) -> None:
    """Raises TypeError unless ``pool`` is None or a FramePool."""
    if pool is not None and not isinstance(pool, _core.FramePool):
        raise TypeError(f"pool must be a lazyframes FramePool, got {type(pool).__name__}")


def check_pool_geometry(pool, frame_shape: tuple, dtype: np.dtype) -> None:
    """Raises ValueError unless ``pool`` stores frames of ``frame_shape`` and ``dtype``."""
    if tuple(pool.frame_shape) != frame_shape or np.dtype(pool.dtype) != dtype:
        raise ValueError(
            f"the buffer's pool stores frames of shape {tuple(pool.frame_shape)} and dtype "
            f"{np.dtype(pool.dtype)}; the observations have frames of shape {frame_shape} "
            f"and dtype {dtype}"
        )


def frames_view(arr, layout, k, lead=1) -> np.ndarray:
    """``(E, *obs_shape)`` -> a view ``(E, k, *S)`` (may be strided); ``lead`` 0: ``(k, *S)``."""
    if layout == "stack":
        return arr
    if layout == "first":
        return arr.reshape(arr.shape[:lead] + (k, arr.shape[lead] // k) + arr.shape[lead + 1 :])
    c = arr.shape[-1] // k
    return np.moveaxis(arr.reshape(arr.shape[:-1] + (k, c)), -2, lead)


def window_view(frames: np.ndarray, layout: str, k: int, T: int) -> np.ndarray:
    """A read-only view ``(B, T, *obs_shape)`` of windows' frames ``(B, T + k - 1, *S)``.

    Observation ``t`` of window ``b`` is its frames ``t .. t + k - 1`` in ``layout``
    (``"last"``: frames of one channel only).
    """
    st, sh = frames.strides, frames.shape
    if layout == "stack":
        shape, strides = (sh[0], T, k, *sh[2:]), (st[0], st[1], st[1], *st[2:])
    elif layout == "first":  # (k * C, ...): frame j's channel c at j * C + c
        shape, strides = (sh[0], T, k * sh[2], *sh[3:]), (st[0], st[1], *st[2:])
    else:  # (..., k): one channel
        shape, strides = (sh[0], T, *sh[2:-1], k), (st[0], st[1], *st[2:-1], st[1])
    return np.lib.stride_tricks.as_strided(frames, shape, strides, writeable=False)


class Geometry:
    """How a frame store splits observations into frames: decided by the first add.

    ``divisor``: None, or :class:`~lazyframes.ScaledFloatFrame`'s divisor when the
    observations are its floats (the frames their bytes; samples the floats).
    """

    def __init__(self, layout: str, k: int, frame_shape: tuple, dtype: np.dtype, divisor=None):
        self.layout, self.k, self.frame_shape, self.dtype = layout, k, frame_shape, dtype
        self.obs_shape = C.observation_shape(frame_shape, k, layout)
        self.divisor = divisor

    def meta(self) -> dict:
        """The checkpoint's description of it."""
        out = {
            "layout": self.layout,
            "stack_size": self.k,
            "frame_shape": list(self.frame_shape),
            "frame_dtype": self.dtype.str,
        }
        if self.divisor is not None:
            out["divisor"] = float(self.divisor)
        return out

    def conversion(self, dtype, scale) -> tuple:
        """``(dtype, scale)`` of a copy out asked for with ``dtype`` and ``scale``.

        Scaled observations copy out as their float32 values (a :class:`~.._checks.Divisor`).

        Raises:
            TypeError: another dtype or a scale for scaled observations.
        """
        if self.divisor is None:
            return dtype, scale
        if (dtype is not None and np.dtype(dtype) != np.float32) or scale is not None:
            raise TypeError(
                "the observations are ScaledFloatFrame's floats: they sample as their float32 "
                "values (byte / 255), so pass no dtype (or float32) and no scale"
            )
        return np.dtype(np.float32), C.Divisor(self.divisor)


class _Obs:
    """One observation argument of one frame leaf, described: lazy (``owner``) or ``arr``.

    ``divisor``: ScaledFloatFrame's divisor when the argument was its scaled view.
    """

    def __init__(self, owner=None, arr=None, layout=None):
        self.owner, self.arr, self.layout = owner, arr, layout
        self.pool: Any = None
        self.k: Any = None
        self.divisor: Any = None
        if owner is not None:
            self.pool, self.k, self.layout = owner.pool, owner.stack_size, owner.layout

    @property
    def frame_shape(self) -> tuple:
        return tuple(self.pool.frame_shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.pool.dtype) if self.arr is None else self.arr.dtype


def describe(x, name: str, E: int, batched: bool) -> _Obs:
    """Check the form of one observation argument of ``E`` transitions and describe it.

    A :class:`~lazyframes.ScaledLazyFrames` (batch, or list of them) is described by its
    frames, with its divisor.

    Raises:
        ValueError: a batch where one observation is expected, a wrong number of envs,
            observations of different geometries.
        TypeError: non-numeric input, LazyFrames mixed with other objects.
    """
    divisor = None
    if isinstance(x, _Scaled):
        x, divisor = x.frames, x.divisor
    elif isinstance(x, (list, tuple)) and x and isinstance(x[0], ScaledLazyFrames):
        divisor = x[0].divisor
        if not all(type(o) is ScaledLazyFrames and o.divisor == divisor for o in x):
            raise TypeError(f"{name} mixes ScaledLazyFrames and other objects")
        x = [o.frames for o in x]
    o = _describe(x, name, E, batched)
    o.divisor = divisor
    return o


def _describe(x, name: str, E: int, batched: bool) -> _Obs:
    lazies = isinstance(x, (list, tuple)) and all(isinstance(o, _LazyFrames) for o in x)
    if isinstance(x, _LazyBatch) or (batched and lazies and x):
        if not batched:
            raise ValueError(f"{name} is a batch but one transition is added")
        if len(x) != E:
            raise ValueError(f"{name} has {len(x)} observations, expected {E} {PER_ADD}")
        if isinstance(x, _LazyBatch):
            return _Obs(owner=x)
        if len({(o.stack_size, o.frame_shape, o.dtype) for o in x}) != 1:
            raise ValueError(
                f"the observations in {name} differ in stack size, frame shape or dtype"
            )
        pool = x[0].pool
        if all(o.pool is pool for o in x):
            return _Obs(owner=pool.lazy_batch([o.slots for o in x], layout=x[0].layout))
        # several pools: copy the frames out (stack layout) and in again
        arr = np.stack([o.pool.gather([o.slots], layout="stack")[0] for o in x])
        return _Obs(arr=arr, layout="stack")
    if not batched and isinstance(x, _LazyFrames):
        return _Obs(owner=x)
    if isinstance(x, (list, tuple)) and any(isinstance(o, _LazyFrames) for o in x):
        raise TypeError(f"{name} mixes LazyFrames and other objects")
    a = np.asarray(x)
    if a.dtype.kind not in "biufc":
        raise TypeError(f"{name} must be a numeric array or LazyFrames, got dtype {a.dtype}")
    if not batched:
        a = a[None]
    elif a.ndim == 0 or a.shape[0] != E:
        raise ValueError(f"{name} has shape {a.shape}, expected a leading axis of {E} {PER_ADD}")
    return _Obs(arr=a)


class Store:
    """A leaf's storage: :class:`FrameStore` (frames in a pool) or :class:`VectorStore`."""

    def prepare(self, obs, nxt, final, E, batched, ring, envs, values) -> tuple:
        """``(parts, plain)``: owners of an add's obs then next obs frames; ``nxt``'s owner.

        ``final``: None or ``(rows, final)``; ``E``: the transitions (``batched``: a leading
        axis of ``E``); ``ring`` checks ``values``, the add's; ``envs``: env ids or None.
        """
        raise NotImplementedError


def prepare_all(stores, obs, nxt, final, E, batched, ring, envs, values) -> tuple:
    """The owners each store ``prepare``s of one add (by leaf: ``obs``, ``nxt``, ``final``)."""
    parts = []
    for i in range(len(stores)):
        s = stores[i]
        f = final and (final[0], final[1][i])
        parts.append(s.prepare(obs[i], nxt[i], f, E, batched, ring, envs, values)[0])
    return tuple(parts)


def hold_all(stores, parts, nxt, envs) -> None:
    """After an add of ``prepare_all``'s ``parts``: the next observations a store pushed, held."""
    for i in range(len(stores)):
        if parts[i][-1] is not nxt[i] and type(stores[i]) is FrameStore:
            fs = stores[i]
            fs.hold(envs, parts[i][-1])


def _stacked(x, E, lead, g) -> bool:
    """``x`` is an ndarray of observations of ``g`` (``lead``: ``E`` of them, else one)."""
    if type(x) is not _ndarray:
        return False
    a, shape = x, g.obs_shape
    if a.ndim != lead + len(shape) or (lead and a.shape[0] != E):
        return False
    for i in range(len(shape)):
        n = shape[i]
        if a.shape[lead + i] != n:
            return False
    return a.dtype is g.dtype or a.dtype == g.dtype


class FrameStore(Store):
    """The frames of one observation leaf: geometry, pool and a SlotTable of slot ids.

    Args:
        capacity: the buffer's capacity (sizes the chunks of a pool the store makes).
        layout: the layout of sampled observations and of ndarray observations, or None
            (the first add's: its LazyFrames' layout, or ``"stack"``).
        stack_size: ``k``, or None (the first add's); needed for ndarray observations
            in the ``"first"``/``"last"`` layouts.
        pool: the pool to store frames in, or None (the first lazy observation's pool,
            or one the store makes).
        compress: checked compression options (the pool is made to compress), True (the
            defaults, or the options of a given or adopted pool that compresses), or None.
    """

    def __init__(
        self, capacity: int, *, layout=None, stack_size=None, pool=None, compress=None,
        names=("obs", "next_obs", "final_obs"),
    ):  # fmt: skip
        self._capacity = capacity
        self._layout_opt, self._k_opt = layout, stack_size
        self._compress = compress
        self._names = names  # of obs, next_obs and final_obs, in messages
        self._pool: Any = pool
        self._geom: Any = None  # Geometry, set by the first add (or a checkpoint)
        self._owners: tuple = (None, None)  # the owner types taken as they are (one, batched)
        self._staged: Any = None  # (geometry, pool, table) of a first add not yet adopted
        self._table: Any = None  # SlotTable (rows, 2k): obs frames then next obs frames
        self._outs: dict = {}  # (B, dtype) -> the output pair sample() reuses
        # the owners of the newest next observations pushed here (hold): of an add of
        # every stream, and stream -> owner for adds of some streams (env_ids) since
        self._every: Any = None
        self._newest: dict = {}

    @property
    def pool(self):
        """The pool holding the frames (None before the first add, unless given)."""
        return self._pool

    @property
    def geometry(self) -> Geometry:
        """How the store splits observations into frames (None before the first add)."""
        return self._geom

    @property
    def compression(self) -> dict | None:
        """The compression options of the pool (or those it will be given)."""
        return C.compression(self._compress) if self._pool is None else self._pool.compression

    # -- adding -----------------------------------------------------------------------
    def prepare(self, obs, nxt, final, E, batched, ring, envs, values) -> tuple:
        """The owners of this leaf's observations of one add (as :meth:`Store.prepare`).

        Owners of the store's pool (LazyFrames, a LazyBatch) are taken as they are (the
        ring checks their size); any other observation is checked, then, once
        ``ring.check(envs, values)`` accepts the values, split into frames pushed into the
        pool, de-duplicated against each env's newest stored observation (:meth:`hold`'s,
        else ``ring.newest(envs)``'s rows), held by the owners returned. The first add
        decides the geometry and pool, which the store takes only at :meth:`adopt`.

        Raises:
            ValueError, TypeError: observations of another geometry than the store's
                (or its pool's), that cannot be split into frames, or of another dtype;
                values the ring refuses. MemoryError: the pool cannot grow.
        """
        owner = self._owners[batched]
        if type(obs) is owner and type(nxt) is owner and final is None:
            pool = self._pool
            if obs.pool is pool and nxt.pool is pool:
                return (obs, nxt), nxt
        o, n, f, geom, pool = self._described(obs, nxt, final, E, batched)
        ring.check(envs, values)  # values refused: no frame pushed
        cand = None
        if not _owned(o, pool) and self._table is not None:
            cand = self._every if envs is None else None
            if cand is None:
                cand = self.candidates(ring.newest(envs))
        if _owned(o, pool) or _owned(n, pool):
            op = _as_part(o, pool, geom, cand)
            plain = _as_part(n, pool, geom, op)
            parts: tuple = (op, plain)
        else:  # both pushed in one call: one owner (E, 2k)
            plain = _as_part(o, pool, geom, cand, n)
            parts = (plain,)
        if f is not None:
            parts = _with_final(pool, parts, f[0], f[1], geom)
        if self._geom is None:  # the first add: what the store takes once it succeeds
            self._staged = (geom, pool, _core.SlotTable(pool, 0, 2 * geom.k))
        return parts, plain

    def _described(self, obs, nxt, final, E, batched) -> tuple:
        """``(obs, next_obs, final, geometry, pool)`` described and checked, nothing pushed.

        Stacked ndarrays of the stored shape and dtype are their own description (with
        a leading axis of ``E`` when batched), any other argument an :class:`_Obs`.
        """
        g = self._geom
        stacked = g is not None and final is None and _stacked(obs, E, batched, g)
        if stacked and _stacked(nxt, E, batched, g):
            return obs, nxt, None, g, self._pool
        names = self._names
        o = describe(obs, names[0], E, batched)
        n = describe(nxt, names[1], E, batched)
        f = None
        if final is not None:
            rows = final[0]
            f = (rows, describe(final[1], names[2], len(rows), batched))
        geom = self._geom or self._geometry(o)
        self._check(o, names[0], geom, E)
        self._check(n, names[1], geom, E)
        if f is not None:
            self._check(f[1], names[2], geom, len(f[0]))
        pool = self._pool
        if pool is None:  # (an _Obs's pool is None unless it is lazy)
            pool = o.pool if o.owner is not None else n.pool
        if pool is None:
            pool = own_pool(geom.frame_shape, geom.dtype, self._capacity, self._compress)
        elif self._geom is None:
            check_pool_geometry(pool, geom.frame_shape, geom.dtype)
        if self._geom is None and self._compress is not None:  # a pool given or adopted
            pool.enable_compression(self._compress)
        return o, n, f, geom, pool

    @property
    def writing(self):
        """The table an add writes: the store's, or at its first add the one staged."""
        return self._table if self._table is not None else self._staged[2]

    def adopt(self) -> None:
        """After a successful first add: the store takes the geometry, pool and table staged."""
        if self._geom is None:
            self._geom, self._pool, self._table = self._staged
            self._staged = None
            self._owners = (_LazyFrames, _LazyBatch)

    def hold(self, envs, nxt) -> None:
        """Hold ``nxt``, an add's owner whose rows end with each stream's next observation.

        What the stream's next add de-duplicates against, byte for byte: uncompressed (as a
        wrapper's ring keeps its own), at most ``2k`` frames a stream, until :meth:`release`.
        ``envs``: the add's env ids (None: every env, replacing what is held; else each
        stream maps to ``nxt``).
        """
        if envs is None:
            self._every = nxt
            if self._newest:
                self._newest.clear()
        else:  # what every stream's add held stays held, but its rows go stale
            if self._every is not None:
                self._newest.update(dict.fromkeys(range(len(self._every)), self._every))
                self._every = None
            self._newest.update(dict.fromkeys(envs.tolist(), nxt))

    def release(self) -> None:
        """Let the frames :meth:`hold` keeps go (they are compressed at the next flush)."""
        self._every = None
        self._newest.clear()

    def put(self, rows: list, parts: tuple) -> None:
        """Store ``parts`` at table rows ``rows``, growing the table (``transport.Sender``)."""
        self._table.grow(max(len(self._table), max(rows) + 1))
        self._table.set(rows, parts)

    def _geometry(self, o: _Obs) -> Geometry:
        """The geometry the first add decides.

        Raises:
            ValueError: ndarray observations that cannot be split into frames, a stack
                size other than the one given, a layout that does not fit the frames.
        """
        layout_opt, k_opt = self._layout_opt, self._k_opt
        if o.owner is not None:
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
                if (shape[-1] if layout == "last" else shape[0]) % k:
                    raise ValueError(
                        f"observation shape {shape} cannot hold {k} frames on the {layout} axis"
                    )
                if layout == "first":
                    fs = (shape[0] // k,) + tuple(shape[1:])
                else:
                    fs = tuple(shape[:-1]) + (shape[-1] // k,)
            dt = o.dtype
        if k_opt is not None and k != k_opt:
            raise ValueError(f"observations have {k} frames, stack_size is {k_opt}")
        fs = C.frame_shape(fs)
        dt = C.frame_dtype(dt)
        C.check_layout(layout, fs)
        return Geometry(layout, k, fs, dt, o.divisor)

    def _check(self, o: _Obs, name: str, geom: Geometry, E: int) -> None:
        """Check one described argument against the geometry.

        Raises:
            ValueError: another stack size, frame shape or observation shape.
            TypeError: another dtype (observations are never cast).
        """
        k, fs, dt = geom.k, geom.frame_shape, geom.dtype
        if o.divisor != geom.divisor:
            raise ValueError(
                f"{name} {'is' if o.divisor is not None else 'is not'} ScaledFloatFrame's "
                f"(ScaledLazyFrames), the buffer's observations "
                f"{'are' if geom.divisor is not None else 'are not'}"
            )
        if o.owner is not None:
            if o.pool is self._pool and o.k == k:
                return  # the store's own pool: its frames have the store's shape and dtype
            if o.k != k:
                raise ValueError(f"{name} has {o.k} frames, the buffer stores {k}")
            if o.frame_shape != fs:
                raise ValueError(
                    f"{name} has frames of shape {o.frame_shape}, the buffer stores {fs}"
                )
            if o.dtype.newbyteorder("=") != dt:
                raise TypeError(f"{name} has dtype {o.dtype}, the buffer stores {dt}")
            return
        want = geom.obs_shape if o.layout is None else C.observation_shape(fs, k, o.layout)
        if o.arr.shape[1:] != tuple(want):
            got = o.arr.shape[1:] if E == 1 else o.arr.shape
            raise ValueError(f"{name} has shape {got}, expected {want if E == 1 else (E,) + want}")
        if o.arr.dtype.newbyteorder("=") != dt:
            raise TypeError(f"{name} has dtype {o.arr.dtype}, the buffer stores {dt}")

    def candidates(self, rows: list):
        """The next observations of the rows ``rows`` (-1: none), a LazyBatch, or None.

        A row of -1 (a stream with no stored transition) borrows another stream's row:
        a candidate is only compared byte for byte, so any row is correct.
        """
        if min(rows) < 0:
            have = [r for r in rows if r >= 0]
            if not have:
                return None
            rows = [r if r >= 0 else have[0] for r in rows]
        return self._table.batch(rows, self._geom.k, 2 * self._geom.k)

    def clear(self) -> None:
        if self._table is not None:
            self._table.clear()
        self.release()

    # -- sampling ---------------------------------------------------------------------
    def outputs(self, B: int, out, dtype, scale, fresh: bool = False) -> tuple:
        """``(obs_out, next_out, dtype, scale)``: the arrays a sample fills, checked.

        Without ``out``, a pair of arrays made once per ``(B, dtype)`` and reused, or with
        ``fresh`` a new pair (a sampler's output sets, which no ``sample`` overwrites).
        """
        g = self._geom
        if g.divisor is not None:
            dtype, scale = g.conversion(dtype, scale)
        if out is None:
            dst = (
                g.dtype
                if dtype is None and scale is None
                else C.output_dtype(g.dtype, dtype, scale)
            )
            full = (B,) + g.obs_shape
            if fresh:
                return np.empty(full, dst), np.empty(full, dst), dst, scale
            pair = self._outs.get((B, dst))
            if pair is None:
                pair = self._outs[(B, dst)] = (np.empty(full, dst), np.empty(full, dst))
            return pair[0], pair[1], dst, scale
        o0, o1 = out
        if not isinstance(o0, np.ndarray) or not isinstance(o1, np.ndarray):
            raise TypeError("out must be a pair (obs_out, next_obs_out) of ndarrays")
        if dtype is None and scale is None and o0.dtype == g.dtype:
            dst = g.dtype  # nothing to convert
        else:
            dst = C.output_dtype(g.dtype, dtype if dtype is not None else o0.dtype, scale)
        _core.check_outs((o0, o1), (B,) + g.obs_shape, dst)
        return o0, o1, dst, scale

    def pin(self, idx, last):
        """The owner of the frames of ``idx``'s observations and ``last``'s next observations.

        A LazyBatch of pairs in the store's layout (``SlotTable.batch_pairs``) holding a
        reference on each frame: the rows' frames stay live and unchanged (not compressed)
        whatever adds overwrite the rows; ``LazyBatch.numpy_pairs`` copies them out, in any
        thread. Frames waiting to be compressed are compressed first (``FramePool.flush``).
        """
        k = self._geom.k
        self._pool.flush()
        return self._table.batch_pairs(idx, (0, k), last, (k, 2 * k), layout=self._geom.layout)

    def window_output(self, B: int, T: int, out, frames: bool, dtype, scale,
                      fresh: bool = False) -> tuple:  # fmt: skip
        """``(array, dtype, scale)`` a batch of ``B`` windows of ``T`` steps fills, checked.

        The observations ``(B, T, *obs_shape)``, or with ``frames`` the frames ``(B, T + k -
        1, *frame_shape)`` (:func:`window_view`: not in layout "last" with frames of C > 1).
        Without ``out``, an array made once per shape and dtype and reused, or with
        ``fresh`` a new one (as :meth:`outputs`).
        """
        g = self._geom
        dtype, scale = g.conversion(dtype, scale)
        if frames and g.layout == "last" and g.frame_shape[-1] != 1:
            raise ValueError(
                f"frames=True needs frames of one channel in layout 'last' (observations "
                f"{g.obs_shape} cannot be a view of the frames): use frames=False"
            )
        shape = (B, T + g.k - 1, *g.frame_shape) if frames else (B, T, *g.obs_shape)
        if out is None:
            dst = C.output_dtype(g.dtype, dtype, scale)
            if fresh:
                return np.empty(shape, dst), dst, scale
            arr = self._outs.get((shape, dst))
            if arr is None:
                arr = self._outs[(shape, dst)] = np.empty(shape, dst)
            return arr, dst, scale
        dst = C.output_dtype(g.dtype, dtype if dtype is not None else getattr(out, "dtype", None),
                             scale)  # fmt: skip
        _core.check_outs((out,), shape, dst)
        return out, dst, scale

    def pin_windows(self, pos: np.ndarray, frames: bool):
        """The owner of the frames of the windows ``pos`` ``(B, T)``: a LazyBatch.

        Of the ``B * T`` observations, or with ``frames`` of each window's ``T + k - 1``
        frames, which the observations must share as a frame stacker's do (ValueError
        otherwise). Pinned like :meth:`pin`'s: copied out later, in any thread.
        """
        B, T = pos.shape
        k, layout = self._geom.k, self._geom.layout
        if not frames:
            return self._table.batch(pos.reshape(-1), 0, k, layout=layout)
        ids = self._table.ids(pos.reshape(-1)).reshape(B, T, 2 * k)
        bad = np.flatnonzero((ids[:, 1:, : k - 1] != ids[:, :-1, 1:k]).any(axis=(1, 2)))
        if bad.size:
            raise ValueError(
                f"frames=True: the observations of window {int(bad[0])} do not share frames "
                f"with their predecessors (stacks not from one frame stack): use frames=False"
            )
        slots = np.concatenate([ids[:, 0, :k], ids[:, 1:, k - 1]], axis=1)
        return self._pool.lazy_batch(slots, layout="stack")

    def fill_windows(self, owner, arr: np.ndarray, frames: bool, dtype, scale) -> np.ndarray:
        """Copy ``owner``'s frames (:meth:`pin_windows`) into ``arr`` (:meth:`window_output`).

        One call, the GIL released. Returns the observations: ``arr``, or with ``frames``
        a read-only view of it.
        """
        B, T = arr.shape[0], (arr.shape[1] - self._geom.k + 1 if frames else arr.shape[1])
        flat = arr if frames else arr.reshape((B * T, *self._geom.obs_shape))
        owner.numpy(out=flat, dtype=dtype, scale=scale)
        return window_view(arr, self._geom.layout, self._geom.k, T) if frames else arr

    # -- memory and checkpoints -------------------------------------------------------
    def frame_ids(self, n: int) -> np.ndarray:
        """The slot ids ``(n, 2k)`` of the first ``n`` positions."""
        return self._table.ids(np.arange(n))

    def table_bytes(self) -> int:
        return 0 if self._table is None else self._table.memory()

    def unique_frames(self, n: int) -> int:
        return int(np.unique(self.frame_ids(n)).size) if n and self._table is not None else 0

    def restore(self, geom: Geometry, pool, table) -> None:
        """Take a checkpoint's geometry, pool and filled table."""
        self._geom, self._pool, self._table = geom, pool, table
        self._owners = (_LazyFrames, _LazyBatch)


def _owned(o, pool) -> bool:  # described lazy input of ``pool``: stored as it is
    return type(o) is _Obs and o.owner is not None and o.pool is pool


def _as_part(o, pool, geom: Geometry, candidates, then=None):
    """One described argument as an owner of ``pool``'s slots, ready for ``SlotTable.set``.

    ``o``: an :class:`_Obs`, or stacked ndarrays ``(E, *obs_shape)`` of the geometry (or
    one ``obs_shape``). Lazy input of ``pool`` is its own owner; frames are pushed in one
    ``_push_dedup`` call, de-duplicated against ``candidates`` (a LazyBatch of ``pool``, a
    row per env, or None), with ``then`` (the next observations, likewise) into one owner
    of both, ``(E, 2k)``.
    """
    if _owned(o, pool):
        return o.owner
    if type(candidates) is _LazyFrames:
        candidates = pool.lazy_batch([candidates.slots])
    return pool._push_dedup(_frames(o, pool, geom), candidates, _frames(then, pool, geom))


def _frames(o, pool, geom: Geometry):
    """The frames ``(E, k, *S)`` (or ``(k, *S)``) of a described argument, or None."""
    if o is None:
        return None
    if type(o) is _ndarray:
        a = o
        return frames_view(a, geom.layout, geom.k, a.ndim - len(geom.obs_shape))
    if o.owner is not None:  # another pool: copy its frames out once
        return o.pool.gather(np.reshape(o.owner.slots, (-1, geom.k)), layout="stack")
    return frames_view(o.arr, o.layout or geom.layout, geom.k)


def _with_final(pool, parts: tuple, rows: np.ndarray, f: _Obs, geom: Geometry) -> tuple:
    """``parts`` with the next observations of ``rows`` replaced by the final ones ``f``.

    Only the marked rows of ``f`` are read; one owner ``(E, 2k)`` of the slots. The final
    frames are de-duplicated against the same env's observation.
    """
    k = geom.k
    slots = np.concatenate([np.reshape(p.slots, (-1, p.stack_size)) for p in parts], axis=1)
    final = _as_part(f, pool, geom, pool.lazy_batch(slots[rows, :k]))
    slots[rows, k:] = np.reshape(final.slots, (-1, k))
    return (pool.lazy_batch(slots),)


class VectorStore(Store):
    """A leaf stored as given: obs and next obs arrays ``(rows, *shape)`` of one dtype.

    The shape and dtype are the first add's.
    """

    def __init__(self, names=("obs", "next_obs", "final_obs")):
        self._names = names
        self.shape: Any = None
        self.dtype: Any = None
        self._obs: Any = None
        self._next: Any = None

    def prepare(self, obs, nxt, final, E, batched, ring, envs, values) -> tuple:
        """``((obs rows, next rows), None)`` of this leaf's observations of one add.

        Checked, the final rows merged in; the arguments as :meth:`FrameStore.prepare`'s.
        """
        names = self._names
        a = _vector_rows(describe(obs, names[0], E, batched))
        c = _vector_rows(describe(nxt, names[1], E, batched))
        shape, dtype = (a.shape[1:], a.dtype) if self.shape is None else (self.shape, self.dtype)
        if a.dtype.kind not in "biuf":
            raise TypeError(f"{names[0]} must be numeric, got dtype {a.dtype}")
        for x, name in ((a, names[0]), (c, names[1])):
            _check_rows(x, name, shape, dtype)
        if final is not None:
            rows = final[0]
            f = _vector_rows(describe(final[1], names[2], len(rows), batched))
            _check_rows(f, names[2], shape, dtype)
            c = c.copy()
            c[rows] = f
        return (a, c), None

    def grow(self, rows: int, prep: tuple) -> None:
        """Room for ``rows`` rows (at the first add, of ``prep``'s shape and dtype)."""
        if self._obs is None:
            self.shape, self.dtype = prep[0].shape[1:], prep[0].dtype
            self._obs = self._next = np.zeros((0,) + self.shape, self.dtype)
        n = len(self._obs)
        if rows <= n:
            return
        new = [np.zeros((rows,) + self.shape, self.dtype) for _ in range(2)]
        new[0][:n], new[1][:n] = self._obs, self._next
        self._obs, self._next = new

    def put(self, idx: list, prep: tuple) -> None:
        self._obs[idx], self._next[idx] = prep

    def clear(self) -> None:
        pass

    def gather(self, idx, last) -> tuple:
        """Fresh copies of the obs of ``idx`` and the next obs of ``last``."""
        return self._obs[idx], self._next[last]

    def arrays(self, n: int) -> tuple:
        return self._obs[:n], self._next[:n]

    def table_bytes(self) -> int:
        return 0 if self._obs is None else self._obs.nbytes + self._next.nbytes

    def restore(self, obs: np.ndarray, nxt: np.ndarray) -> None:
        self.shape, self.dtype = obs.shape[1:], obs.dtype
        self._obs, self._next = obs.copy(), nxt.copy()


def _vector_rows(o: _Obs) -> np.ndarray:
    """A described vector leaf as an array ``(E, *shape)`` (LazyFrames copied out)."""
    if o.owner is None:
        return o.arr
    a = np.asarray(o.owner)
    return a if isinstance(o.owner, _LazyBatch) else a[None]


def _check_rows(a: np.ndarray, name: str, shape: tuple, dtype: np.dtype) -> None:
    if a.shape[1:] != shape:
        raise ValueError(f"{name} has shape {a.shape[1:]} per observation, expected {shape}")
    if a.dtype != dtype:
        raise TypeError(f"{name} has dtype {a.dtype}, the buffer stores {dtype}")


def is_frame_leaf(x, batched: bool) -> bool:
    """The default ``frame_keys`` rule on a first add's leaf: uint8, >= 3 dims per observation."""
    if batched and isinstance(x, (list, tuple)) and x and isinstance(x[0], _LazyFrames):
        x = x[0]
    if isinstance(x, (_LazyFrames, _LazyBatch)):
        return np.dtype(x.dtype) == np.uint8 and len(x.pool.frame_shape) >= 2
    a = np.asarray(x)
    return a.dtype == np.uint8 and a.ndim >= (4 if batched else 3)


def stores_for(keys, obs, batched: bool, capacity: int, pool, frame_keys, **options) -> tuple:
    """The stores of a buffer's first add: one frame store, or one store per Dict leaf.

    ``keys``: the leaf keys (None: plain observations); ``obs``: the add's observations by
    leaf; ``pool`` and ``frame_keys`` as the buffer's constructor takes them; ``options``:
    a frame store's ``layout``, ``stack_size`` and ``compress``.

    Raises:
        TypeError, ValueError: a ``pool`` or ``frame_keys`` that does not fit the
            observations, a Dict observation without a frame leaf.
    """
    if keys is None:
        if isinstance(pool, dict):
            raise TypeError("pool is a dict of pools (for Dict observations); obs is not a dict")
        return (FrameStore(capacity, pool=pool, **options),)
    keys = list(keys)
    if frame_keys is None:
        frames = [key for key, x in zip(keys, obs, strict=True) if is_frame_leaf(x, batched)]
    else:
        missing = [key for key in frame_keys if key not in keys]
        if missing:
            raise ValueError(f"frame_keys {missing} are not keys of obs {keys}")
        frames = list(frame_keys)
    if not frames:
        raise ValueError(
            f"obs has no frame leaf (keys {keys}; by default the uint8 leaves of at least 3 "
            f"dimensions per observation): name them with frame_keys="
        )
    if pool is not None and not isinstance(pool, dict):
        raise TypeError("for Dict observations, pool must be a dict of FramePools by frame key")
    pools = pool or {}
    stray = [key for key in pools if key not in frames]
    if stray:
        raise ValueError(f"pool has keys {stray} that are not frame keys {frames}")
    return tuple(
        FrameStore(capacity, pool=pools.get(key), names=leaf_names(key), **options)
        if key in frames
        else VectorStore(leaf_names(key))
        for key in keys
    )


def kinds(stores: tuple) -> tuple:
    """``(frames, vectors, tables)``: the frame and vector stores' indices, the tables."""
    frames = tuple([i for i, s in enumerate(stores) if isinstance(s, FrameStore)])
    vectors = tuple([i for i, s in enumerate(stores) if isinstance(s, VectorStore)])
    return frames, vectors, tuple([stores[i].writing for i in frames])


def pool_memory(stores: list, n: int) -> dict:
    """The pool figures of ``ReplayBuffer.memory``, summed over frame stores.

    ``compression`` is the first store's options (None without a store with a pool).
    """
    stores = [s for s in stores if s.pool is not None]
    stats = [s.pool.stats() for s in stores]
    held = sum(int(st["bytes_held"]) for st in stats)
    live = sum(st["live_bytes"] for st in stats)
    keys = "frame_bytes hot_frames cold_frames cold_bytes slot_state_bytes pending_frames"
    figures = {key: sum(int(st[key]) for st in stats) for key in keys.split()}
    return {
        "bytes_held": held,
        "unique_frames": sum(s.unique_frames(n) for s in stores),
        **figures,
        "compression": stores[0].compression if stores else None,
        "ratio": live / held if held else 0.0,
    }
