"""The pure-NumPy twin of the compiled core: readable specification, fallback and test oracle.

It has the public API, values, errors, refcounts and ``live_frames`` of
``lazyframes._core``, but not its arena: frames live in a list of read-only arrays,
references are counted in a list of ints, and observations are built with
``np.concatenate`` (baselines) and ``np.stack`` (Gymnasium). Slot ids, allocation order
and the memory figures are its own (docs/DESIGN.md, "The two cores"). The documentation
is written once, in the compiled core; each docstring here is its first line.

Every owner (``FrameRef``, ``LazyFrames``, ``LazyBatch``, ``SlotTable``) takes its
references when it is made and registers a ``weakref.finalize`` that drops them when it
is collected, so only a reference the pool really issued to an owner is ever dropped.
"""

from __future__ import annotations

import heapq
import math
import operator
import weakref

import numpy as np

from . import _common as C

__all__ = [
    "KIND_DELTA",
    "KIND_KEY",
    "KIND_RAW",
    "FramePool",
    "FrameRef",
    "LazyBatch",
    "LazyFrames",
    "SlotTable",
    "SumTree",
    "decode_frames",
    "default_pool",
    "encode_frames",
    "stack",
]

KIND_KEY, KIND_DELTA, KIND_RAW = C.KIND_KEY, C.KIND_DELTA, C.KIND_RAW


class _Guarded:
    """Base of the core types: reading the state of an uninitialised object raises TypeError."""

    __slots__ = ()

    def __getattr__(self, name):
        # Called only when normal lookup fails, e.g. a slot of ``X.__new__(X)`` never set.
        if name in type(self).__slots__:
            raise TypeError(C.not_initialised(type(self).__name__))
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setstate__(self, state):
        raise TypeError(C.not_restorable(type(self).__name__))

    def _refuse_second_init(self, sentinel: str) -> None:
        """RuntimeError if ``__init__`` already set ``sentinel`` (the attribute it sets last).

        Checked on entry and again right before ``__init__`` commits: a callback of its
        arguments (``__index__``, ``__array__``) may have run ``__init__`` meanwhile.
        """
        try:
            object.__getattribute__(self, sentinel)  # bypasses __getattr__ above
        except AttributeError:
            return
        raise RuntimeError(C.already_initialised(type(self).__name__))


def _own(owner, pool, ids) -> None:
    """Give ``owner`` one reference on each id of ``ids``, dropped when it is collected."""
    pool._incref(ids)
    weakref.finalize(owner, pool._decref, ids).atexit = False


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return a.tobytes() == b.tobytes()


class FramePool(_Guarded):
    """A refcounted store of frames of one shape and dtype, in a chunked arena."""

    __slots__ = (
        "__weakref__",
        "_by_id",
        "_compression",
        "_counts",
        "_dtype",
        "_frame_bytes",
        "_frames",
        "_free",
        "_live",
        "_peak",
        "_refs",
        "_shape",
        "_spc",
    )

    def __init__(self, frame_shape, dtype, *, chunk_bytes=C.DEFAULT_CHUNK_BYTES, compress=False):
        # owners hold references into the state a second __init__ would replace
        self._refuse_second_init("_frames")
        shape = C.frame_shape(frame_shape)
        dt = C.frame_dtype(dtype)
        chunk_bytes = C.chunk_bytes(chunk_bytes)
        compression = C.compression(compress)
        self._refuse_second_init("_frames")
        self._shape = shape
        self._dtype = dt
        self._frame_bytes = math.prod(shape) * dt.itemsize
        # the twin keeps every frame uncompressed: the options are checked and reported only
        self._compression = compression
        # as the arena: the largest power of two of frames that fits a chunk (at least one)
        self._spc = 1 << (min(max(1, chunk_bytes // self._frame_bytes), 1 << 31).bit_length() - 1)
        self._frames: list = []  # slot -> read-only frame, or None while the slot is free
        self._counts: list = []  # slot -> references held on it
        self._free: list = []  # heap of free slots: the lowest is reused first
        self._live = 0
        self._peak = 0
        # slot -> FrameRef, so the observations pickled together share each frame
        self._refs: weakref.WeakValueDictionary[int, FrameRef] = weakref.WeakValueDictionary()
        self._by_id: dict = {}  # id(ndarray) -> (weakref, slot): LazyFrames(list) dedupe

    # -- properties ---------------------------------------------------------------
    @property
    def frame_shape(self) -> tuple:
        """Shape ``S`` of one frame."""
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the stored frames (native byte order)."""
        return self._dtype

    @property
    def frame_bytes(self) -> int:
        """Bytes of one frame."""
        return self._frame_bytes

    @property
    def slots_per_chunk(self) -> int:
        """Slots in one arena chunk."""
        return self._spc

    @property
    def live_frames(self) -> int:
        """Frames with a refcount above zero."""
        return self._live

    @property
    def live_bytes(self) -> int:
        """Bytes of the live frames: ``live_frames * frame_bytes``."""
        return self._live * self._frame_bytes

    @property
    def capacity(self) -> int:
        """Slots in chunks that currently hold memory."""
        # as the arena: a chunk is made only when every slot before it is taken
        return -(-len(self._frames) // self._spc) * self._spc

    @property
    def bytes_held(self) -> int:
        """Bytes of frame memory currently held (see :meth:`stats`)."""
        return self.live_bytes  # the twin frees a frame's memory as soon as it is free

    @property
    def peak_bytes(self) -> int:
        """Largest :attr:`bytes_held` so far."""
        return self._peak

    @property
    def compression(self) -> dict | None:
        """None, or the compression options ``{"codec", "level", "group"}`` of this pool."""
        return None if self._compression is None else dict(self._compression)

    def enable_compression(self, compress=True) -> None:
        """Compress this pool's frames from now on (see the class docstring); idempotent.

        The twin checks and reports the options, and keeps its frames uncompressed.
        """
        opts = C.compression(compress)
        if opts is None:
            raise ValueError(C.ENABLE_COMPRESSION_OFF)
        if self._compression is not None and self._compression != opts:
            raise ValueError(C.compression_differs(self._compression, opts))
        self._compression = opts

    def _chain(self, slot) -> list:
        """The slots a frame decodes from, itself first, its keyframe last; [] when hot (tests)."""
        self._check(self._id(slot))
        return []  # the twin keeps every frame uncompressed

    def stats(self) -> dict:
        """Frame counts and bytes, as a dict.

        The twin keeps every frame uncompressed: none is ever cold.
        """
        return {
            "live_frames": self.live_frames,
            "live_bytes": self.live_bytes,
            "capacity": self.capacity,
            "frame_bytes": self._frame_bytes,
            "bytes_held": self.bytes_held,
            "peak_bytes": self._peak,
            "hot_frames": self._live,
            "cold_frames": 0,
            "cold_bytes": 0,
        }

    def __repr__(self):
        return (
            f"FramePool(frame_shape={self._shape}, dtype={self._dtype}, "
            f"live_frames={self._live}, bytes_held={self.bytes_held})"
        )

    def __reduce__(self):
        raise TypeError(C.POOL_NOT_PICKLABLE)

    # -- references (private: only owners call these) -----------------------------
    def _incref(self, ids) -> None:
        """One more reference on each id (-1, an empty table entry, is skipped)."""
        for s in np.asarray(ids, np.int64).ravel().tolist():
            if s >= 0:
                if self._counts[s] == 0:
                    self._live += 1
                self._counts[s] += 1
        self._peak = max(self._peak, self.bytes_held)

    def _decref(self, ids) -> None:
        """One reference less on each id (-1 skipped); a slot at zero is free again."""
        for s in np.asarray(ids, np.int64).ravel().tolist():
            if s >= 0:
                self._counts[s] -= 1
                if self._counts[s] == 0:
                    self._frames[s] = None
                    heapq.heappush(self._free, s)
                    self._live -= 1

    def _id(self, x) -> int:
        """One slot id, an int (not a bool) or a FrameRef of this pool (not yet checked live)."""
        if C.is_frameref(x):
            C.check_pool(x, self, "FrameRef")
            return x.slot
        try:
            if isinstance(x, bool):
                raise TypeError
            s = operator.index(x)
        except TypeError:
            raise TypeError(C.wrong_type("a slot id", "an int or a FrameRef", x)) from None
        if not -C.INT64_MAX - 1 <= s <= C.INT64_MAX:
            raise IndexError(C.slot_out_of_range(s))
        return s

    def _ids(self, slots) -> np.ndarray:
        """Slot ids (ints or FrameRefs of this pool) as a private int64 array (not checked live)."""
        arr = np.asarray(slots)
        if arr.dtype == object:
            return np.array([self._id(x) for x in arr.ravel()], np.int64).reshape(arr.shape)
        return C.as_slots(arr).copy()

    def _in_range(self, s: int) -> bool:
        """Whether ``s`` is a slot of :attr:`capacity` (live, free or never handed out)."""
        return 0 <= s < self.capacity

    def _count(self, s: int) -> int:
        """References held on ``s``, a slot in range (0 if it was never handed out)."""
        return self._counts[s] if s < len(self._counts) else 0

    def _check(self, s: int) -> None:
        """Raise unless ``s`` is a live slot."""
        if not self._in_range(s):
            raise IndexError(C.slot_out_of_range(s))
        if self._count(s) == 0:
            raise ValueError(C.slot_free(s))

    def _check_live(self, ids: np.ndarray) -> None:
        for s in ids.ravel().tolist():
            self._check(s)

    def _pad(self, pad):
        """The live slot of a ``pad`` FrameRef of this pool, or None."""
        if pad is None:
            return None
        if not C.is_frameref(pad):
            raise TypeError(C.wrong_type("pad", "a FrameRef or None", pad))
        C.check_pool(pad, self, "FrameRef")
        return pad.slot

    def _frameref(self, s: int) -> FrameRef:
        """The FrameRef pickling uses for live slot ``s``: one per slot while it is alive."""
        ref = self._refs.get(s)
        if ref is None:
            ref = self._refs[s] = FrameRef._make(self, s)
        return ref

    # -- frames in ----------------------------------------------------------------
    def push(self, frame) -> FrameRef:
        """Copy one frame into a free slot; the returned :class:`FrameRef` owns its reference."""
        arr = C.as_frame(frame, self._shape, self._dtype)
        stored = arr.copy()
        stored.flags.writeable = False
        if self._free:
            s = heapq.heappop(self._free)
        else:
            s = len(self._frames)
            self._frames.append(None)
            self._counts.append(0)
        self._frames[s] = stored
        return FrameRef._make(self, s)  # its one reference makes the slot live

    def push_batch(self, frames, *, k=1, pad=None, layout="stack") -> LazyBatch:
        """Push ``n`` frames; row i of the result is ``k - 1`` pads then frame i."""
        k = C.stack_size(k)
        p = self._pad(pad)
        layout = C.check_layout(layout, self._shape)
        arr = C.as_frames(frames, self._shape, self._dtype)  # last, as the compiled core
        if len(arr) == 0:
            raise ValueError(C.PUSH_BATCH_EMPTY)
        C.check_batch_size(len(arr), k)
        if p is not None:
            self._check(p)
        new = [self.push(f) for f in arr]  # each holds its frame until the batch owns it
        ids = [[r.slot if p is None else p] * (k - 1) + [r.slot] for r in new]
        return LazyBatch._make(self, np.array(ids, np.int64), layout)

    def _push_known(self, obj, arr) -> FrameRef:
        """:meth:`push`, reusing the slot of the same ndarray ``obj`` if its bytes are unchanged."""
        arr = C.as_frame(arr, self._shape, self._dtype)
        key = id(obj)
        hit = self._by_id.get(key)
        if hit is not None and hit[0]() is obj:
            s = hit[1]
            if self._counts[s] > 0 and _same_bytes(self._frames[s], arr):
                return FrameRef._make(self, s)
        ref = self.push(arr)
        if isinstance(obj, np.ndarray):
            pool = weakref.ref(self)

            def forget(wr, key=key):
                p = pool()
                if p is not None and p._by_id.get(key, (None,))[0] is wr:
                    del p._by_id[key]

            self._by_id[key] = (weakref.ref(obj, forget), ref.slot)
        return ref

    def _push_dedup(self, frames, candidates=None) -> LazyBatch:
        """Push ``(E, k, *S)`` frames, reusing a slot where a frame's bytes are already stored."""
        arr = C.as_frames(frames, self._shape, self._dtype, "E, k")
        E, k = arr.shape[:2]
        cand = np.empty((E, 0), np.int64)
        if candidates is not None:
            if not C.is_lazybatch(candidates):
                raise TypeError(C.wrong_type("candidates", "a LazyBatch or None", candidates))
            C.check_pool(candidates, self, "LazyBatch")
            if len(candidates) != E:
                raise ValueError(C.rows_count("candidates", len(candidates), E))
            cand = candidates._slots
        new = []  # FrameRefs of the new slots, held until the batch owns them
        ids = np.empty((E, k), np.int64)
        for e in range(E):
            for j in range(k):
                f = arr[e, j]
                s = next((c for c in cand[e].tolist() if _same_bytes(self._frames[c], f)), None)
                if s is None:
                    s = next((int(ids[e, i]) for i in range(j) if _same_bytes(arr[e, i], f)), None)
                if s is None:
                    new.append(self.push(f))
                    s = new[-1].slot
                ids[e, j] = s
        return LazyBatch._make(self, ids, "stack")

    # -- frames out ---------------------------------------------------------------
    def refcount(self, slot) -> int:
        """References held on ``slot`` (0 for a free slot in range)."""
        s = self._id(slot)
        if not self._in_range(s):
            raise IndexError(C.slot_out_of_range(s))
        return self._count(s)

    def get(self, slot) -> np.ndarray:
        """A copy of the frame in ``slot``, shape :attr:`frame_shape`."""
        s = self._id(slot)
        self._check(s)
        return self._frames[s].copy()

    def lazy(self, slots, *, layout="last") -> LazyFrames:
        """A :class:`LazyFrames` over ``k`` slots (ints or FrameRefs), oldest first."""
        ids = self._ids(slots)
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError(C.bad_slots_shape(ids.shape, "k"))
        layout = C.check_layout(layout, self._shape)
        self._check_live(ids)
        return LazyFrames._make(self, tuple(ids.tolist()), layout)

    def lazy_batch(self, slots, *, layout="stack") -> LazyBatch:
        """A :class:`LazyBatch` over ``(n, k)`` slots (ints or FrameRefs), a row per observation."""
        ids = self._ids(slots)
        if ids.ndim != 2 or ids.shape[1] == 0:
            raise ValueError(C.bad_slots_shape(ids.shape))
        layout = C.check_layout(layout, self._shape)
        self._check_live(ids)
        return LazyBatch._make(self, ids, layout)

    def gather(self, slots, out=None, *, layout="last", dtype=None, scale=None) -> np.ndarray:
        """Copy ``B`` observations of ``k`` slots each (ints ``(B, k)``) into one array."""
        ids = self._ids(slots)
        if ids.ndim != 2 or ids.shape[1] == 0:
            raise ValueError(C.bad_slots_shape(ids.shape, "(B, k)"))
        layout = C.check_layout(layout, self._shape)
        C.check_no_overlap(out, {"slots": slots})
        dst, scale = _check_copy_out(self, len(ids), ids.shape[1], layout, out, dtype, scale)
        self._check_live(ids)
        frames = [[self._frames[s] for s in row] for row in ids.tolist()]
        return _copy_out(frames, self._shape, ids.shape[1], layout, out, dst, scale)


class FrameRef(_Guarded):
    """One reference on one frame of a :class:`FramePool`; pickles as the frame itself."""

    __slots__ = ("__weakref__", "_pool", "_slot")
    _pool: FramePool
    _slot: int

    def __init__(self, *args, **kwargs):
        raise TypeError(C.FRAMEREF_NO_CONSTRUCTOR)

    @classmethod
    def _make(cls, pool: FramePool, s: int) -> FrameRef:
        ref = object.__new__(cls)
        ref._pool = pool
        ref._slot = s
        _own(ref, pool, (s,))
        return ref

    @property
    def pool(self) -> FramePool:
        """The pool holding the frame."""
        return self._pool

    @property
    def slot(self) -> int:
        """The frame's slot id in :attr:`pool` (the int owns nothing; this FrameRef does)."""
        return self._slot

    def __reduce__(self):
        return _restore_frame, (self._pool.get(self._slot),)

    def __repr__(self):
        pool = self._pool
        return f"FrameRef(slot={self._slot}, frame_shape={pool.frame_shape}, dtype={pool.dtype})"


class LazyFrames(_Guarded):
    """k frames shown as one observation, stored once in a :class:`FramePool`."""

    __slots__ = ("__weakref__", "_layout", "_pool", "_slots")
    __array_priority__ = 10.0  # so ndarray == LazyFrames defers to __eq__ below

    def __init__(self, frames, *, layout="last"):
        self._refuse_second_init("_pool")
        if isinstance(frames, np.ndarray) and frames.ndim >= 1:
            frames = list(frames)
        frames = list(frames)
        if not frames:
            raise ValueError(C.NO_FRAMES)
        arrays = [np.asarray(f) for f in frames]
        for a in arrays:
            if a.dtype.kind == "O":
                raise TypeError(C.OBJECT_FRAME)
        shape, dt = arrays[0].shape, C.frame_dtype(arrays[0].dtype)
        for a in arrays:
            if a.shape != shape:
                raise ValueError(C.frames_differ("shapes", shape, a.shape))
            if a.dtype.newbyteorder("=") != dt:
                raise TypeError(C.frames_differ("dtypes", dt, a.dtype))
        layout = C.check_layout(layout, shape)
        pool = default_pool(shape, dt)
        refs = [pool._push_known(f, a) for f, a in zip(frames, arrays, strict=True)]
        self._refuse_second_init("_pool")  # a frame's __array__ may have run __init__
        self._init(pool, tuple(r.slot for r in refs), layout)

    @classmethod
    def _make(cls, pool: FramePool, ids: tuple, layout: str) -> LazyFrames:
        """An observation over live slot ids (checked by the caller)."""
        lz = object.__new__(cls)
        lz._init(pool, ids, layout)
        return lz

    def _init(self, pool, ids, layout):
        if not ids:
            raise ValueError(C.stack_size_not_positive(0))
        _own(self, pool, ids)
        self._pool = pool
        self._slots = ids
        self._layout = layout

    # -- array-likeness without materialising --------------------------------------
    @property
    def pool(self) -> FramePool:
        """The pool holding the frames."""
        return self._pool

    @property
    def slots(self) -> tuple:
        """Slot ids of the k frames, oldest first."""
        return self._slots

    @property
    def layout(self) -> str:
        """``"last"``, ``"first"`` or ``"stack"``."""
        return self._layout

    @property
    def stack_size(self) -> int:
        """k, the number of frames."""
        return len(self._slots)

    @property
    def frame_shape(self) -> tuple:
        """Shape ``S`` of one frame."""
        return self._pool.frame_shape

    @property
    def shape(self) -> tuple:
        """Shape of ``np.asarray(self)``."""
        return C.observation_shape(self._pool.frame_shape, len(self._slots), self._layout)

    @property
    def dtype(self) -> np.dtype:
        """The dtype of ``np.asarray(self)``."""
        return self._pool.dtype

    @property
    def ndim(self) -> int:
        """Number of axes of ``np.asarray(self)``."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements of ``np.asarray(self)``."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the materialised array (not of the memory held; see the pool)."""
        return self.size * self.dtype.itemsize

    # -- copying out ---------------------------------------------------------------
    def _out(self, dtype=None, scale=None) -> np.ndarray:
        return self._pool.gather([self._slots], layout=self._layout, dtype=dtype, scale=scale)[0]

    def __array__(self, dtype=None, copy=None):
        """Materialise into a fresh array (NumPy 2 protocol)."""
        return C.array_protocol(self, dtype, copy, self._out)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """DLPack export of a fresh materialised array, so ``torch.as_tensor(obs)`` is fast."""
        return C.dlpack(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self):
        self._pool  # noqa: B018 - an uninitialised object raises TypeError here
        return C.DLPACK_DEVICE

    def astype(self, dtype, *, scale=None) -> np.ndarray:
        """A new array of ``dtype``, optionally times ``scale`` (fused into the copy)."""
        return self._out(dtype, scale)

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, key):
        return self._out()[key]

    def count(self) -> int:
        """Size of the last axis of the materialised array, as baselines' ``count()``."""
        return self.shape[-1]

    def frame(self, i) -> np.ndarray:
        """``np.asarray(self)[..., i]`` as baselines' ``frame(i)``: a channel when C > 1."""
        i = C.index_frame(i, self.count())
        if self._layout == "last":
            j, ch = divmod(i, self._pool.frame_shape[-1])
            return self._pool.get(self._slots[j])[..., ch]
        return self._out()[..., i]

    def get_frame(self, j) -> np.ndarray:
        """A copy of whole frame ``j`` (0 is the oldest), shape :attr:`frame_shape`."""
        return self._pool.get(self._slots[C.index_frame(j, len(self._slots))])

    def shift(self, frame) -> LazyFrames:
        """The next observation: this one's last k-1 frames, then ``frame``."""
        ref = self._pool.push(frame)
        return LazyFrames._make(self._pool, self._slots[1:] + (ref.slot,), self._layout)

    def copy(self) -> LazyFrames:
        """A new observation sharing the same frames (no frame bytes copied)."""
        return LazyFrames._make(self._pool, self._slots, self._layout)

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    def __reduce__(self):
        refs = tuple(self._pool._frameref(s) for s in self._slots)
        return _restore_lazyframes, (refs, self._layout)

    def __eq__(self, other):
        return C.lazyframes_eq(self, other)

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self):
        return (
            f"LazyFrames(shape={self.shape}, dtype={self.dtype}, layout={self._layout!r}, "
            f"stack_size={len(self._slots)})"
        )


class LazyBatch(_Guarded):
    """A batch of ``n`` observations (one per sub-environment) as slot ids of one pool."""

    __slots__ = ("__weakref__", "_layout", "_pool", "_slots")
    _pool: FramePool
    _slots: np.ndarray
    _layout: str

    def __init__(self, *args, **kwargs):
        raise TypeError(C.LAZYBATCH_NO_CONSTRUCTOR)

    @classmethod
    def _make(cls, pool: FramePool, ids: np.ndarray, layout: str) -> LazyBatch:
        """A batch over a private ``(n, k)`` array of live slot ids (checked by the caller)."""
        if ids.shape[1] < 1:
            raise ValueError(C.stack_size_not_positive(ids.shape[1]))
        batch = object.__new__(cls)
        ids.flags.writeable = False
        _own(batch, pool, ids)
        batch._pool = pool
        batch._slots = ids
        batch._layout = layout
        return batch

    @property
    def pool(self) -> FramePool:
        """The pool holding the frames."""
        return self._pool

    @property
    def slots(self) -> np.ndarray:
        """A copy of the slot ids, int64 ``(num_envs, k)``, oldest frame first."""
        return self._slots.copy()

    @property
    def layout(self) -> str:
        """``"last"``, ``"first"`` or ``"stack"``."""
        return self._layout

    @property
    def stack_size(self) -> int:
        """k, the frames per observation."""
        return self._slots.shape[1]

    @property
    def shape(self) -> tuple:
        """Shape of ``np.asarray(self)``: ``(num_envs, *observation_shape)``."""
        n, k = self._slots.shape
        return (n,) + C.observation_shape(self._pool.frame_shape, k, self._layout)

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the frames."""
        return self._pool.dtype

    @property
    def ndim(self) -> int:
        """Number of axes of ``np.asarray(self)``."""
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the materialised array (not of the memory held; see the pool)."""
        return math.prod(self.shape) * self.dtype.itemsize

    def numpy(self, out=None, *, dtype=None, scale=None) -> np.ndarray:
        """Materialise the batch into ``out`` (or a new array) in one copy."""
        return self._pool.gather(self._slots, out, layout=self._layout, dtype=dtype, scale=scale)

    def __array__(self, dtype=None, copy=None):
        """Materialise into a fresh ``(num_envs, *observation_shape)`` array (NumPy 2 protocol)."""
        return C.array_protocol(self, dtype, copy, lambda dt: self.numpy(dtype=dt))

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """DLPack export of a fresh materialised batch, so ``torch.as_tensor(batch)`` is fast."""
        return C.dlpack(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self):
        self._pool  # noqa: B018 - an uninitialised object raises TypeError here
        return C.DLPACK_DEVICE

    def __len__(self):
        return len(self._slots)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return LazyBatch._make(self._pool, self._slots[i].copy(), self._layout)
        n = len(self._slots)
        try:
            j = C.index_frame(i, n, "environments")
        except TypeError:
            raise TypeError(C.lazybatch_index(i)) from None
        return LazyFrames._make(self._pool, tuple(self._slots[j].tolist()), self._layout)

    def __iter__(self):
        for row in self._slots.tolist():
            yield LazyFrames._make(self._pool, tuple(row), self._layout)

    def shift(self, frames, restart=None, *, pad=None) -> LazyBatch:
        """The next batch: each row shifted left with its new frame last, or restarted."""
        pool = self._pool
        n, k = self._slots.shape
        mask = np.zeros(n, np.bool_) if restart is None else np.array(restart, np.bool_)
        if mask.shape != (n,):
            raise ValueError(C.restart_shape(mask.shape, n))
        p = pool._pad(pad)
        arr = C.as_frames(frames, pool.frame_shape, pool.dtype)  # last, as the compiled core
        if len(arr) != n:
            raise ValueError(C.frames_shape(arr.shape, str(n), pool.frame_shape))
        if p is not None:
            pool._check(p)
        new = [pool.push(f) for f in arr]  # each holds its frame until the batch owns it
        ids = self._slots.tolist()
        for i, ref in enumerate(new):
            if mask[i]:
                ids[i] = [ref.slot if p is None else p] * (k - 1) + [ref.slot]
            else:
                ids[i] = ids[i][1:] + [ref.slot]
        return LazyBatch._make(pool, np.array(ids, np.int64).reshape(n, k), self._layout)

    def replace(self, rows, other) -> LazyBatch:
        """A new batch with rows ``rows`` taken from ``other`` (a batch with one row per index)."""
        n, k = self._slots.shape
        r = C.as_rows(rows, n, distinct=True)
        if not C.is_lazybatch(other):
            raise TypeError(C.wrong_type("other", "a LazyBatch", other))
        C.check_pool(other, self._pool, "LazyBatch")
        if (other.stack_size, other.layout) != (k, self._layout):
            raise ValueError(C.batch_geometry(k, self._layout, other.stack_size, other.layout))
        if len(other) != len(r):
            raise ValueError(C.rows_count("other", len(other), len(r)))
        ids = self._slots.copy()
        ids[r] = other._slots
        return LazyBatch._make(self._pool, ids, self._layout)

    def copy(self) -> LazyBatch:
        """A new batch sharing the same frames (no frame bytes copied)."""
        return LazyBatch._make(self._pool, self._slots.copy(), self._layout)

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    def __reduce__(self):
        return _restore_lazybatch, (tuple(self), self._layout)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self):
        return f"LazyBatch(shape={self.shape}, dtype={self.dtype}, layout={self._layout!r})"


class SlotTable(_Guarded):
    """A ``(rows, width)`` table of slot ids that owns one reference per non-empty entry."""

    __slots__ = ("__weakref__", "_fin", "_ids", "_pool")

    def __init__(self, pool, rows, width):
        self._refuse_second_init("_pool")
        if not isinstance(pool, FramePool):
            raise TypeError(C.wrong_type("pool", "a FramePool", pool))
        rows, width = operator.index(rows), operator.index(width)
        if rows < 0 or width < 1:
            raise ValueError(C.table_shape(rows, width))
        if rows > (2**63 - 1) // 8 // width:
            raise ValueError(C.table_too_large(rows, width))
        try:
            ids = np.full((rows, width), -1, np.int32)  # -1: empty; written in place only
        except MemoryError:
            raise MemoryError(C.table_too_large(rows, width)) from None
        self._refuse_second_init("_pool")  # an __index__ callback may have run __init__
        self._pool = pool
        self._ids = ids  # all empty: no reference to take
        self._fin = weakref.finalize(self, pool._decref, ids)
        self._fin.atexit = False

    @property
    def pool(self) -> FramePool:
        """The pool holding the frames."""
        return self._pool

    @property
    def shape(self) -> tuple:
        """``(rows, width)``."""
        return self._ids.shape

    def __len__(self):
        return len(self._ids)

    def memory(self) -> int:
        """Bytes of the table itself (``rows * width * 4``), not of the frames."""
        return self._ids.nbytes

    def grow(self, rows) -> None:
        """Enlarge the table to ``rows`` rows; the new rows are empty, the others kept."""
        rows, (n, width) = operator.index(rows), self._ids.shape
        if rows < n:
            raise ValueError(C.table_shrink(rows, n))
        if rows > (2**63 - 1) // 8 // width:
            raise ValueError(C.table_too_large(rows, width))
        try:
            ids = np.full((rows, width), -1, np.int32)
        except MemoryError:
            raise MemoryError(C.table_too_large(rows, width)) from None
        ids[:n] = self._ids
        fin = weakref.finalize(self, self._pool._decref, ids)  # the references move over
        fin.atexit = False
        self._fin.detach()
        self._fin, self._ids = fin, ids

    def ids(self, rows=None) -> np.ndarray:
        """A copy of the slot ids of ``rows`` (default: all), int64; -1 marks an empty entry."""
        ids = self._ids if rows is None else self._ids[C.as_rows(rows, len(self._ids))]
        return ids.astype(np.int64)

    def _write(self, r: np.ndarray, new: np.ndarray) -> None:
        """Rows ``r`` (distinct) := ``new``: take the new references, then drop the old ones."""
        if new.size and new.max() > np.iinfo(np.int32).max:
            raise OverflowError(C.ID_OVER_INT32)
        self._pool._incref(new)
        self._pool._decref(self._ids[r])
        self._ids[r] = new

    def set(self, rows, parts) -> None:
        """Store ``E`` observations side by side in ``rows``; part widths sum to the width."""
        r = C.as_rows(rows, len(self._ids), distinct=True)
        if not isinstance(parts, (tuple, list)):
            raise TypeError(C.wrong_type("parts", "a tuple of LazyBatch or LazyFrames", parts))
        blocks = []
        for part in parts:
            if C.is_lazybatch(part):
                C.check_pool(part, self._pool, "LazyBatch")
                blk = part._slots
            elif C.is_lazyframes(part):
                C.check_pool(part, self._pool, "LazyFrames")
                blk = np.array([part._slots], np.int64)
            else:
                raise TypeError(C.wrong_type("parts", "a tuple of LazyBatch or LazyFrames", part))
            if len(blk) != len(r):
                raise ValueError(C.rows_count("a part", len(blk), len(r)))
            blocks.append(blk)
        width = sum(b.shape[1] for b in blocks)
        if width != self._ids.shape[1]:
            raise ValueError(C.parts_width(width, self._ids.shape[1]))
        self._write(r, np.concatenate(blocks, axis=1))

    def clear(self, rows=None) -> None:
        """Empty ``rows`` (default: all), dropping their references."""
        n = len(self._ids)
        r = np.arange(n) if rows is None else C.as_rows(rows, n, distinct=True)
        self._write(r, np.full((len(r), self._ids.shape[1]), -1, np.int64))

    def take(self, rows, source, index) -> None:
        """Fill ``rows`` with slots of ``source`` by flat position (-1: empty); checkpoint load."""
        r = C.as_rows(rows, len(self._ids), distinct=True)
        if not C.is_lazybatch(source):
            raise TypeError(C.wrong_type("source", "a LazyBatch", source))
        C.check_pool(source, self._pool, "LazyBatch")
        flat = source._slots.ravel()
        idx = C.as_ints(index, "index")
        if idx.shape != (len(r), self._ids.shape[1]):
            raise ValueError(C.index_shape(idx.shape, len(r), self._ids.shape[1]))
        bad = np.flatnonzero((idx < -1) | (idx >= flat.size))
        if bad.size:
            raise IndexError(C.index_out_of_range(int(idx.ravel()[bad[0]]), flat.size))
        idx = idx.astype(np.int64)
        new = np.full(idx.shape, -1, np.int64)
        new[idx >= 0] = flat[idx[idx >= 0]]
        self._write(r, new)

    def _where(self, rows, cols) -> tuple:
        """``(r, start, stop)``: ``rows`` as a fresh int64 array and ``cols`` checked."""
        return (C.as_rows(rows, len(self._ids)), *_columns(cols, self._ids.shape[1]))

    def _entries(self, r: np.ndarray, start: int, stop: int) -> np.ndarray:
        """The slot ids of columns ``[start, stop)`` of rows ``r`` as int64, all non-empty.

        Read after every other argument is checked, as the compiled core does.
        """
        ids = self._ids[r, start:stop].astype(np.int64)
        empty = np.flatnonzero((ids < 0).any(axis=1))
        if empty.size:
            raise ValueError(C.row_empty(int(r[empty[0]])))
        return ids

    def batch(self, rows, start, stop, *, layout="stack") -> LazyBatch:
        """A :class:`LazyBatch` of columns ``[start, stop)`` of ``rows``."""
        r, start, stop = self._where(rows, (start, stop))
        layout = C.check_layout(layout, self._pool.frame_shape)
        return LazyBatch._make(self._pool, self._entries(r, start, stop), layout)

    def gather(self, rows, start, stop, out=None, *, layout="last", dtype=None, scale=None):
        """Copy the observations in columns ``[start, stop)`` of ``rows`` into one array."""
        r, start, stop = self._where(rows, (start, stop))
        pool = self._pool
        layout = C.check_layout(layout, pool.frame_shape)
        C.check_no_overlap(out, {"rows": rows})
        _check_copy_out(pool, len(r), stop - start, layout, out, dtype, scale)
        ids = self._entries(r, start, stop)
        return pool.gather(ids, out, layout=layout, dtype=dtype, scale=scale)

    def gather_pairs(
        self, rows1, cols1, rows2, cols2, out=None, *, layout="last", dtype=None, scale=None
    ):
        """Copy two sets of observations (e.g. obs and next obs) row by row into two arrays."""
        (r1, a1, b1), (r2, a2, b2) = self._where(rows1, cols1), self._where(rows2, cols2)
        if len(r1) != len(r2):
            raise ValueError(C.pair_lengths(len(r1), len(r2)))
        if b1 - a1 != b2 - a2:
            raise ValueError(C.pair_widths(b1 - a1, b2 - a2))
        if out is not None and (not isinstance(out, (tuple, list)) or len(out) != 2):
            raise TypeError(C.OUT_PAIR)
        o1, o2 = (None, None) if out is None else out
        pool = self._pool
        layout = C.check_layout(layout, pool.frame_shape)
        C.check_no_overlap(out, {"rows1": rows1, "rows2": rows2})
        (d1, _), (d2, _) = (
            _check_copy_out(pool, len(r1), b1 - a1, layout, o, dtype, scale) for o in (o1, o2)
        )
        if d1 != d2:
            raise TypeError(C.pair_dtypes(d1, d2))
        ids1, ids2 = self._entries(r1, a1, b1), self._entries(r2, a2, b2)
        kw = {"layout": layout, "dtype": dtype, "scale": scale}
        return pool.gather(ids1, o1, **kw), pool.gather(ids2, o2, **kw)

    def step_fields(self, rows, flags, rewards, gamma):
        """The one-step fields of a replay buffer's transitions ``rows``, in one pass."""
        g = np.float32(float(gamma))
        r = C.as_rows(rows, len(self._ids))
        n = len(self._ids)
        for a, dt in ((flags, np.uint8), (rewards, np.float32)):
            if not (
                type(a) is np.ndarray
                and a.dtype == dt
                and a.dtype.isnative
                and a.ndim == 1
                and a.flags.c_contiguous
                and a.flags.aligned
                and a.shape[0] >= n
            ):
                raise TypeError(C.step_arrays(n))
        fl = flags[r]
        res = np.empty((4, len(r)), np.float32)
        res[0] = rewards[r]
        res[1] = fl & 1
        res[2] = (fl >> 1) & 1
        res[3] = g
        return res[0], res[1], res[2], res[3]

    def __reduce__(self):
        raise TypeError(C.TABLE_NOT_PICKLABLE)

    def __repr__(self):
        return f"SlotTable(shape={self.shape}, pool={self._pool!r})"


def _prio_f64(x, name: str) -> np.ndarray:
    """A private flat float64 copy (checked, then used: no other thread may change it)."""
    a = np.asarray(x)
    if a.dtype.kind not in "iuf":
        raise TypeError(C.prio_dtype(name, a.dtype))
    return np.array(a.reshape(-1), np.float64)


def _prio_i64(x, name: str) -> np.ndarray:
    """A private flat int64 copy, as :func:`_prio_f64`."""
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(C.prio_int_dtype(name, a.dtype))
    return np.array(a.reshape(-1), np.int64)


class SumTree(_Guarded):
    """A sum-tree and a min-tree of ``capacity`` float64 leaves, for proportional sampling.

    The same nodes as the compiled tree (node 1 the root, leaf ``j`` at ``size + j``),
    each recomputed from its children level by level, so both hold the same values.
    """

    __slots__ = ("_min", "_n", "_size", "_sum")

    def __init__(self, capacity):
        self._refuse_second_init("_sum")
        n = operator.index(capacity)
        if n < 0:
            raise ValueError(f"capacity must be >= 0, got {n}")
        if n > np.iinfo(np.int64).max // 32:  # as the compiled tree (NumPy: a ValueError)
            raise MemoryError(f"no memory for a SumTree of {n} leaves")
        size = 1
        while size < n:
            size *= 2
        self._refuse_second_init("_sum")
        self._n, self._size = n, size
        self._min = np.full(2 * size, np.inf)
        self._sum = np.zeros(2 * size)

    @property
    def capacity(self) -> int:
        """Number of leaves."""
        return self._n

    def total(self) -> float:
        """Sum of the leaves."""
        return float(self._sum[1])

    def min(self) -> float:
        """Smallest non-empty leaf (``inf`` when every leaf is empty)."""
        return float(self._min[1])

    def get(self, indices) -> np.ndarray:
        """The leaves ``indices`` (a float64 array). Raises IndexError out of range."""
        idx = _prio_i64(indices, "indices")
        bad = np.flatnonzero((idx < 0) | (idx >= self._n))
        if bad.size:
            raise IndexError(C.prio_index(int(bad[0]), int(idx[bad[0]]), self._n))
        return self._sum[self._size + idx]

    def set(self, indices, values) -> None:
        """Set leaves ``indices`` to ``values`` (same size; a repeated index keeps its last)."""
        idx = _prio_i64(indices, "indices")
        val = _prio_f64(values, "values")
        if idx.size != val.size:
            raise ValueError(C.prio_lengths(idx.size, val.size))
        bad = np.flatnonzero((idx < 0) | (idx >= self._n) | ~(val >= 0) | np.isinf(val))
        if bad.size:
            j = int(bad[0])
            if not 0 <= idx[j] < self._n:
                raise ValueError(C.prio_index(j, int(idx[j]), self._n))
            raise ValueError(C.prio_value(j, float(val[j])))
        self._write(idx, val)

    def _write(self, idx: np.ndarray, val: np.ndarray) -> None:
        """Write checked leaves (the last of a repeated index wins), then their ancestors."""
        if idx.size > 1:
            idx, last = np.unique(idx[::-1], return_index=True)
            val = val[::-1][last]
        nodes = self._size + idx
        self._sum[nodes] = val
        self._min[nodes] = np.where(val > 0, val, np.inf)
        nodes = np.unique(nodes >> 1)
        nodes = nodes[nodes >= 1]
        while nodes.size:  # one level at a time: every leaf is at the same depth
            s, m = self._sum, self._min
            with np.errstate(over="ignore"):  # finite leaves may sum to inf, as in C
                s[nodes] = s[2 * nodes] + s[2 * nodes + 1]
            m[nodes] = np.minimum(m[2 * nodes], m[2 * nodes + 1])
            nodes = np.unique(nodes >> 1)
            nodes = nodes[nodes >= 1]

    def clear(self) -> None:
        """Empty every leaf."""
        self._sum[:] = 0.0
        self._min[:] = np.inf

    def sample(self, u) -> np.ndarray:
        """Stratified draws: leaf indices (int64), one per entry of ``u`` (in ``[0, 1)``)."""
        return self.sample_weighted(u, None)[0]

    def sample_weighted(self, u, beta) -> tuple:
        """:meth:`sample` and the importance weights of the draws, in one call."""
        pos, _, w = self.draw(u, beta, -1)
        return pos, w

    def draw(self, u, beta, newest) -> tuple:
        """The draws of a prioritized replay buffer: :meth:`sample_weighted` and numbers."""
        uu = _prio_f64(u, "u")
        newest = operator.index(newest)
        m = uu.size
        if m == 0:
            return (
                np.empty(0, np.int64),
                None if newest < 0 else np.empty(0, np.int64),
                None if beta is None else np.empty(0, np.float32),
            )
        total = self._sum[1]
        if not total > 0:
            raise ValueError(C.prio_empty())
        if not np.isfinite(total):
            raise ValueError(C.prio_infinite())
        if not np.all((uu >= 0) & (uu < 1)):
            raise ValueError("u must hold numbers in [0, 1)")
        x = (np.arange(m, dtype=np.float64) + uu) * total / m
        i = np.ones(m, np.int64)
        s = self._sum
        for _ in range(self._size.bit_length() - 1):
            left_sum = s[2 * i]
            left = (x < left_sum) | ~(s[2 * i + 1] > 0)
            x = np.where(left, x, x - left_sum)
            i = 2 * i + ~left
        idx = i - self._size
        num = None if newest < 0 else newest - (newest % self._n - idx) % self._n
        w = None
        if beta is not None:
            w = np.power(s[i] / self._min[1], -float(beta)).astype(np.float32)
        return idx, num, w

    def update_priorities(self, numbers, priorities, alpha, lo, hi, raw):
        """PrioritizedReplayBuffer's priority update, checked whole before any write."""
        t = _prio_i64(numbers, "indices")
        p = _prio_f64(priorities, "priorities")
        if not (
            type(raw) is np.ndarray
            and raw.dtype == np.float64
            and raw.flags.c_contiguous
            and raw.flags.writeable
        ):
            raise TypeError("raw must be a writeable C-contiguous float64 ndarray")
        n = self._n
        if p.size != t.size:
            raise ValueError(C.prio_lengths(t.size, p.size, "priorities"))
        if raw.size != n:
            raise ValueError(f"raw must hold {n} priorities, got {raw.size}")
        with np.errstate(all="ignore"):
            v = np.power(p, float(alpha))
        bad0 = (t < 0) | (t < lo) | (t >= hi) | (n == 0)
        bad1 = ~((p > 0) & np.isfinite(p))
        bad2 = ~((v > 0) & (v <= np.finfo(np.float64).max / max(n, 1)))
        bad = np.flatnonzero(bad0 | bad1 | bad2)
        if bad.size:
            j = int(bad[0])
            return j, 0 if bad0[j] else 1 if bad1[j] else 2
        if t.size == 0:
            return 0.0
        most = float(p.max())
        pos = t % n
        if pos.size > 1:
            pos, last = np.unique(pos[::-1], return_index=True)
            p, v = p[::-1][last], v[::-1][last]
        raw.reshape(-1)[pos] = p
        live = self._sum[self._size + pos] > 0
        self._write(pos[live], v[live])
        return most

    def __reduce__(self):
        raise TypeError("a SumTree cannot be pickled")


def _columns(cols, width: int) -> tuple:
    """``(start, stop)`` as ints with ``0 <= start < stop <= width``."""
    try:
        start, stop = (operator.index(c) for c in cols)
    except (TypeError, ValueError):
        raise ValueError(C.bad_columns(cols, width)) from None
    if not 0 <= start < stop <= width:
        raise ValueError(C.bad_columns(cols, width))
    return start, stop


def _check_copy_out(pool, b: int, k: int, layout: str, out, dtype, scale) -> tuple:
    """Check the output of a copy of ``b`` observations of ``k`` frames.

    Converts ``dtype`` and ``scale`` first, then checks ``out``, as the compiled core.

    Returns:
        The output dtype, and ``scale`` as a float (or None).
    """
    dst = C.output_dtype(pool.dtype, C.requested_dtype(dtype, out), scale)
    scale = None if scale is None else float(scale)
    if out is not None:
        C.check_out(out, (b,) + C.observation_shape(pool.frame_shape, k, layout), dst)
    return dst, scale


def _materialise(frames: list, layout: str) -> np.ndarray:
    """One observation from its frames: baselines' np.concatenate / Gymnasium's np.stack."""
    if layout == "last":
        return np.concatenate(frames, axis=-1)
    if layout == "first":
        return np.concatenate(frames, axis=0)
    return np.stack(frames, axis=0)


def _copy_out(frames: list, shape: tuple, k: int, layout: str, out, dst, scale) -> np.ndarray:
    """Copy lists of k frames (one list per observation) into ``out`` (checked) or a new array."""
    if out is None:
        out = np.empty((len(frames),) + C.observation_shape(shape, k, layout), dst)
    for b, fr in enumerate(frames):
        out[b] = _materialise(fr, layout).astype(dst)
    if scale is not None:
        np.multiply(out, dst.type(scale), out=out)
    return out


def stack(observations, out=None, *, dtype=None, scale=None) -> np.ndarray:
    """Materialise a batch of observations into one array: ``(B, *observation_shape)``."""
    obs = list(observations)
    if not obs:
        raise ValueError(C.NO_OBSERVATIONS)
    first = obs[0]
    for o in obs:
        if not isinstance(o, LazyFrames):
            raise TypeError(C.stack_not_lazyframes(o))
        C.check_same_geometry(first, o)
    dst, scale = _check_copy_out(
        first.pool, len(obs), first.stack_size, first.layout, out, dtype, scale
    )
    frames = [[o._pool._frames[s] for s in o._slots] for o in obs]  # each o keeps its frames live
    return _copy_out(frames, first.frame_shape, first.stack_size, first.layout, out, dst, scale)


_default_pools: dict = {}  # kept for the process: an idle pool holds no frame memory


def encode_frames(
    frames,
    *,
    codec=C.DEFAULT_COMPRESSION["codec"],
    level=C.DEFAULT_COMPRESSION["level"],
    group=C.DEFAULT_COMPRESSION["group"],
) -> tuple:
    """Compress ``n`` frames into one container: XOR deltas, a keyframe every ``group`` frames.

    The twin writes ``KIND_RAW`` blobs (uncompressed), after checking the options as the
    compiled core does; each core's :func:`decode_frames` reads the other's containers.
    """
    C.compression({"codec": codec, "level": level, "group": group})
    arr = np.ascontiguousarray(C.frames_to_encode(frames))
    n = arr.shape[0]
    fb = arr.nbytes // n if n else 0
    offsets = np.arange(n + 1, dtype=np.int64) * fb
    return arr.tobytes(), offsets, np.full(n, C.KIND_RAW, np.uint8)


def decode_frames(payload, offsets, kinds, frame_shape, dtype) -> np.ndarray:
    """The frames ``(n, *frame_shape)`` of a container made by :func:`encode_frames`.

    Either core's container: ``KIND_KEY`` and ``KIND_DELTA`` blobs (the compiled core's)
    need the ``blosc2`` package, raw blobs nothing.

    Raises:
        TypeError, ValueError: a bad shape or dtype, or a container that is not valid.
        ImportError: compressed blobs without the ``blosc2`` package.
    """
    shape, dt = C.frame_shape(frame_shape), C.frame_dtype(dtype)
    fb = math.prod(shape) * dt.itemsize
    data, offs, kds = C.check_container(payload, offsets, kinds, fb)
    out = np.empty((len(kds), fb), np.uint8)
    for i, kind in enumerate(kds.tolist()):
        blob = data[offs[i] : offs[i + 1]]
        if kind == C.KIND_RAW:
            out[i] = blob
            continue
        out[i] = _blosc2_frame(blob, fb, i)
        if kind == C.KIND_DELTA:
            out[i] ^= out[i - 1]
    return out.view(dt).reshape((len(kds), *shape))


def _blosc2_frame(blob: np.ndarray, fb: int, i: int) -> np.ndarray:
    """Blob ``i``, a Blosc2 chunk, decompressed: exactly ``fb`` bytes, else ValueError."""
    try:
        import blosc2
    except ImportError:
        raise ImportError(
            "the pure-NumPy core reads compressed frames with the 'blosc2' package: "
            "pip install blosc2"
        ) from None
    # the sizes its header declares, checked before blosc2 allocates what they say
    head = blob[:16].tobytes()
    if (
        len(head) < 16
        or int.from_bytes(head[4:8], "little") != fb
        or int.from_bytes(head[12:16], "little") != blob.size
    ):
        raise ValueError(C.bad_blob(i))
    try:
        raw = blosc2.decompress(blob.tobytes())
    except Exception:  # blosc2 raises several types for a malformed chunk
        raise ValueError(C.bad_blob(i)) from None
    if len(raw) != fb:
        raise ValueError(C.bad_blob(i))
    return np.frombuffer(raw, np.uint8)


def default_pool(frame_shape, dtype) -> FramePool:
    """The shared pool for frames of ``frame_shape`` and ``dtype``."""
    key = (C.frame_shape(frame_shape), C.frame_dtype(dtype))
    pool = _default_pools.get(key)
    if pool is None:
        pool = _default_pools[key] = FramePool(*key)
    return pool


# -- unpickling: checks every type, trusts no id, pool or size from the stream --------
def _restore_frame(frame) -> FrameRef:
    if not isinstance(frame, np.ndarray):
        raise TypeError(C.restore_needs("frame", frame))
    return default_pool(frame.shape, frame.dtype).push(frame)


def _restore_lazyframes(refs, layout) -> LazyFrames:
    if not (isinstance(refs, tuple) and refs and all(isinstance(r, FrameRef) for r in refs)):
        raise TypeError(C.restore_needs("LazyFrames", refs))
    pool = refs[0].pool
    for r in refs:
        C.check_pool(r, pool, "FrameRef")
    return pool.lazy(refs, layout=layout)


def _restore_lazybatch(rows, layout) -> LazyBatch:
    if not (isinstance(rows, tuple) and rows and all(isinstance(r, LazyFrames) for r in rows)):
        raise TypeError(C.restore_needs("LazyBatch", rows))
    pool, k = rows[0].pool, rows[0].stack_size
    for r in rows:
        C.check_pool(r, pool, "LazyFrames")
        if r.stack_size != k:
            raise ValueError(C.rows_stack_sizes(k, r.stack_size))
    return pool.lazy_batch([r.slots for r in rows], layout=layout)
