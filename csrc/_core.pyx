# cython: language_level=3
"""The compiled core of lazyframes: refcounted frame pool, LazyFrames and batched stacking.

The bytes live in a plain-C pool (pool.c) and are copied out by plain-C kernels
(kernels.c) with the GIL released. This module adds the Python objects, the checks
(every index is checked before C trusts it) and the NumPy glue. Its API, errors and
allocation policy are those of the pure-NumPy twin, ``lazyframes/_reference.py``,
which is the specification; see its docstrings for the full contracts.
"""

cimport cython
cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t, uint32_t, UINT32_MAX
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memcpy

import operator
import weakref

import numpy as np

from lazyframes import _common as C

cnp.import_array()

__all__ = ["FramePool", "LazyFrames", "LazyBatch", "stack", "default_pool"]


cdef extern from "kernels.h" nogil:
    enum:
        LF_BOOL, LF_INT8, LF_UINT8, LF_INT16, LF_UINT16, LF_INT32, LF_UINT32
        LF_INT64, LF_UINT64, LF_FLOAT32, LF_FLOAT64, LF_NTYPES, LF_RAW
    int lf_copy_stacks(const unsigned char *const *src, size_t n_obs, size_t k,
                       size_t outer, size_t inner, int src_type, int dst_type,
                       size_t itemsize, double scale, int has_scale, void *dst)


cdef extern from "pool.h" nogil:
    ctypedef struct lf_pool:
        size_t frame_bytes
        size_t spc
        size_t n_alloc
        size_t live_frames
        size_t peak_bytes
    int lf_pool_init(lf_pool *p, size_t frame_bytes, size_t chunk_bytes)
    void lf_pool_free(lf_pool *p)
    int64_t lf_pool_alloc(lf_pool *p)
    int lf_pool_is_live(const lf_pool *p, int64_t slot)
    int lf_pool_in_range(const lf_pool *p, int64_t slot)
    uint32_t lf_pool_refcount(const lf_pool *p, int64_t slot)
    unsigned char *lf_pool_addr(const lf_pool *p, int64_t slot)
    void lf_pool_incref(lf_pool *p, int64_t slot)
    void lf_pool_decref(lf_pool *p, int64_t slot)
    size_t lf_pool_bytes_held(const lf_pool *p)


cdef extern from *:
    """
    static uint32_t *_pool_refcnt_ptr(lf_pool *p, int64_t slot) {
        return &lf_pool_chunk(p, slot)->refcnt[lf_pool_offset(p, slot)];
    }
    """
    uint32_t *_pool_refcnt_ptr(lf_pool *p, int64_t slot)


DEF MAX_NDIM = 32
cdef tuple _LAYOUT_NAMES = ("last", "first", "stack")


cdef int _lf_type(object dt):
    """The kernels' element type of a native-order dtype (LF_RAW when not convertible)."""
    cdef str kind = dt.kind
    cdef int size = dt.itemsize
    if kind == "b":
        return LF_BOOL
    if kind == "i":
        return {1: LF_INT8, 2: LF_INT16, 4: LF_INT32, 8: LF_INT64}.get(size, LF_RAW)
    if kind == "u":
        return {1: LF_UINT8, 2: LF_UINT16, 4: LF_UINT32, 8: LF_UINT64}.get(size, LF_RAW)
    if kind == "f":
        return {4: LF_FLOAT32, 8: LF_FLOAT64}.get(size, LF_RAW)
    return LF_RAW


cdef inline int _layout_code(object layout) except -1:
    if layout == "last":
        return 0
    if layout == "first":
        return 1
    if layout == "stack":
        return 2
    C.check_layout(layout, ())  # raises the shared message
    return -1


cdef cnp.ndarray _slot_array(object slots):
    """Slot ids as a contiguous int64 ndarray; fast for lists/tuples of ints and int64 arrays."""
    cdef cnp.ndarray arr
    cdef cnp.npy_intp n, i
    cdef int64_t *a
    if cnp.PyArray_CheckExact(slots):
        arr = <cnp.ndarray>slots
        if cnp.PyArray_TYPE(arr) == cnp.NPY_INT64 and cnp.PyArray_IS_C_CONTIGUOUS(arr):
            return arr
    elif type(slots) is list or type(slots) is tuple:
        n = len(slots)
        arr = cnp.PyArray_EMPTY(1, &n, cnp.NPY_INT64, 0)
        a = <int64_t *>cnp.PyArray_DATA(arr)
        try:
            for i in range(n):
                x = slots[i]
                if type(x) is not int:
                    raise TypeError
                a[i] = x
            return arr
        except (TypeError, OverflowError):
            pass
    return C.as_slots(slots)


cdef int _obs_dims(FramePool pool, int code, Py_ssize_t k, cnp.npy_intp *dims):
    """Write the shape of one observation of k frames into dims; returns its ndim."""
    cdef int i, nd = pool._nd
    if code == 2:
        dims[0] = k
        for i in range(nd):
            dims[i + 1] = pool._dims[i]
        return nd + 1
    for i in range(nd):
        dims[i] = pool._dims[i]
    if nd > 0:  # always: concatenating layouts reject scalar frames
        dims[nd - 1 if code == 0 else 0] *= k
    return nd


cdef inline int64_t _index(object slot) except? -1:
    """A slot id given as any integer (``operator.index``: 1.5 is a TypeError)."""
    return slot if type(slot) is int else operator.index(slot)


cdef inline void _check_slot(lf_pool *p, int64_t s) except *:
    if not lf_pool_in_range(p, s):
        raise IndexError(f"slot {s} is out of range for this pool")
    if not lf_pool_is_live(p, s):
        raise ValueError(f"slot {s} is free (its frame was released)")


@cython.final
@cython.no_gc_clear
cdef class FramePool:
    """A refcounted store of frames of one shape and dtype, in a chunked arena.

    Each frame is copied in once (:meth:`push`) and lives in a slot until its refcount
    drops to zero; the slot is then reused. Chunks hold the largest power of two of
    slots that fits ``chunk_bytes`` (at least one) and never move; a chunk whose slots are all free is returned
    to the OS (one empty chunk is kept to avoid churn).

    Args:
        frame_shape: shape ``S`` of one frame, e.g. ``(84, 84, 1)``.
        dtype: numeric dtype of the frames, e.g. ``np.uint8``.
        chunk_bytes: size of one arena chunk in bytes (default 1 MiB).

    Raises:
        TypeError: non-numeric dtype or a shape that is not a tuple of ints.
        ValueError: a non-positive dimension or ``chunk_bytes``.

    Example:
        >>> pool = FramePool((84, 84, 1), np.uint8)
        >>> s = pool.push(np.zeros((84, 84, 1), np.uint8))
        >>> pool.live_frames, pool.refcount(s)
        (1, 1)
        >>> pool.release(s); pool.live_frames
        0
    """

    cdef lf_pool p
    cdef readonly tuple frame_shape
    cdef readonly object dtype
    cdef cnp.dtype _descr
    cdef int _ltype
    cdef size_t _itemsize
    cdef int _nd
    cdef cnp.npy_intp _dims[MAX_NDIM]
    cdef size_t _outer[3]
    cdef size_t _inner[3]
    cdef int _layout_ok[3]          # 0 unknown, 1 fits, -1 does not fit
    cdef readonly object _refs      # slot -> FrameRef (pickling)
    cdef readonly dict _by_id       # id(ndarray) -> (weakref, slot): LazyFrames(list)
    cdef dict _shapes               # (layout code, k) -> observation shape
    cdef object __weakref__

    def __cinit__(self):
        self.p.spc = 0

    def __init__(self, frame_shape, dtype, *, chunk_bytes=C.DEFAULT_CHUNK_BYTES):
        if self.p.spc:
            raise RuntimeError("FramePool.__init__ called twice")
        shape = C.frame_shape(frame_shape)
        dt = C.frame_dtype(dtype)
        chunk_bytes = int(chunk_bytes)
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        if len(shape) > MAX_NDIM:
            raise ValueError(f"frames have more than {MAX_NDIM} dimensions: {shape}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if lf_pool_init(&self.p, nbytes, chunk_bytes) != 0:
            raise MemoryError("cannot create the frame pool")
        self.frame_shape = shape
        self.dtype = dt
        self._descr = dt
        self._ltype = _lf_type(dt)
        self._itemsize = dt.itemsize
        self._nd = len(shape)
        for i in range(self._nd):
            self._dims[i] = shape[i]
        for code in range(3):
            outer, inner = C.geometry(shape, _LAYOUT_NAMES[code])
            self._outer[code] = outer
            self._inner[code] = inner
            self._layout_ok[code] = 0
        self._refs = weakref.WeakValueDictionary()
        self._by_id = {}
        self._shapes = {}

    def __dealloc__(self):
        lf_pool_free(&self.p)

    # -- stats ----------------------------------------------------------------------
    @property
    def frame_bytes(self):
        """Bytes of one frame."""
        return self.p.frame_bytes

    @property
    def slots_per_chunk(self):
        """Slots in one arena chunk."""
        return self.p.spc

    @property
    def live_frames(self):
        """Frames with a refcount above zero."""
        return self.p.live_frames

    @property
    def live_bytes(self):
        """Bytes of the live frames: ``live_frames * frame_bytes``."""
        return self.p.live_frames * self.p.frame_bytes

    @property
    def capacity(self):
        """Slots in chunks that currently hold memory."""
        return self.p.n_alloc * self.p.spc

    @property
    def bytes_held(self):
        """Bytes of frame memory currently held (whole chunks)."""
        return lf_pool_bytes_held(&self.p)

    @property
    def peak_bytes(self):
        """Largest :attr:`bytes_held` so far."""
        return self.p.peak_bytes

    def stats(self):
        """Live frames, capacity, frame bytes, bytes held and peak bytes, as a dict."""
        return {
            "live_frames": self.live_frames,
            "live_bytes": self.live_bytes,
            "capacity": self.capacity,
            "frame_bytes": self.frame_bytes,
            "bytes_held": self.bytes_held,
            "peak_bytes": self.peak_bytes,
        }

    def __repr__(self):
        return (
            f"FramePool(frame_shape={self.frame_shape}, dtype={self.dtype}, "
            f"live_frames={self.live_frames}, bytes_held={self.bytes_held})"
        )

    def __reduce__(self):
        raise TypeError(
            "a FramePool cannot be pickled; pickle the observations (LazyFrames) or use "
            "ReplayBuffer.save"
        )

    # -- internals --------------------------------------------------------------------
    cdef int _ready(self) except -1:
        if self.frame_shape is None:
            raise TypeError("this FramePool was not initialised (FramePool.__new__ without __init__)")
        return 0

    cdef int _layout(self, object layout) except -1:
        """Layout code, checking once per pool that it fits the frame shape."""
        self._ready()
        cdef int code = _layout_code(layout)
        if self._layout_ok[code] != 1:
            C.check_layout(layout, self.frame_shape)
            self._layout_ok[code] = 1
        return code

    cdef cnp.ndarray _as_frame(self, object frame):
        """``frame`` as an ndarray of exactly the pool's shape and dtype (checked)."""
        cdef cnp.ndarray arr
        cdef int i
        self._ready()
        if cnp.PyArray_CheckExact(frame):
            arr = <cnp.ndarray>frame
            if cnp.PyArray_NDIM(arr) == self._nd and (
                    arr.descr is self._descr or cnp.PyArray_EquivTypes(arr.descr, self._descr)):
                for i in range(self._nd):
                    if cnp.PyArray_DIMS(arr)[i] != self._dims[i]:
                        break
                else:
                    return arr
        return C.as_frame(frame, self.frame_shape, self.dtype)

    cdef void _write(self, int64_t slot, cnp.ndarray arr) except *:
        """Copy a checked frame into a fresh slot: the one copy in."""
        cdef unsigned char *dst = lf_pool_addr(&self.p, slot)
        if cnp.PyArray_IS_C_CONTIGUOUS(arr):
            memcpy(dst, cnp.PyArray_DATA(arr), self.p.frame_bytes)
        else:
            np.copyto(self._view(slot), arr)

    cdef object _view(self, int64_t slot):
        """A writeable ndarray over a slot's bytes (internal use only)."""
        cdef unsigned char[::1] mv = <unsigned char[:self.p.frame_bytes]> lf_pool_addr(&self.p, slot)
        return np.asarray(mv).view(self.dtype).reshape(self.frame_shape)

    cdef int64_t _alloc(self) except -1:
        cdef int64_t s = lf_pool_alloc(&self.p)
        if s < 0:
            raise MemoryError("the frame pool cannot grow")
        return s

    cdef void _check_many(self, const int64_t *s, Py_ssize_t n) except *:
        cdef Py_ssize_t i
        for i in range(n):
            if not lf_pool_is_live(&self.p, s[i]):
                _check_slot(&self.p, s[i])

    # -- slots ------------------------------------------------------------------------
    def push(self, frame):
        """Copy one frame into a free slot and return its slot id.

        The caller owns the one reference of the new slot and must :meth:`release` it
        (or hand it to :meth:`lazy` and release its own). Views, read-only and
        non-contiguous arrays are accepted; the frame is copied exactly once.

        Raises:
            TypeError: object arrays or a dtype other than :attr:`dtype`.
            ValueError: a shape other than :attr:`frame_shape`.
        """
        cdef cnp.ndarray arr = self._as_frame(frame)
        cdef int64_t s = self._alloc()
        try:
            self._write(s, arr)
        except BaseException:
            lf_pool_decref(&self.p, s)
            raise
        return s

    def _push_known(self, obj, arr):
        """:meth:`push`, reusing the slot of the same ndarray ``obj`` if its bytes are unchanged.

        See the twin's docstring: how ``LazyFrames(list_of_frames)`` stores a frame
        once when baselines' FrameStack passes it to k consecutive observations.
        """
        cdef cnp.ndarray a = self._as_frame(arr)
        cdef int64_t s
        key = id(obj)
        hit = self._by_id.get(key)
        if hit is not None and hit[0]() is obj:
            s = hit[1]
            if lf_pool_is_live(&self.p, s) and cnp.PyArray_IS_C_CONTIGUOUS(a) and memcmp(
                    lf_pool_addr(&self.p, s), cnp.PyArray_DATA(a), self.p.frame_bytes) == 0:
                lf_pool_incref(&self.p, s)
                return s
        s = self.push(a)
        if isinstance(obj, np.ndarray):
            pool = weakref.ref(self)

            def forget(wr, key=key):
                p = pool()
                if p is not None and p._by_id.get(key, (None,))[0] is wr:
                    del p._by_id[key]

            self._by_id[key] = (weakref.ref(obj, forget), s)
        return s

    cdef cnp.ndarray _as_frames(self, object frames):
        """``frames`` as a checked ndarray ``(n, *S)`` of the pool's dtype."""
        cdef cnp.ndarray arr
        cdef int i
        self._ready()
        if cnp.PyArray_CheckExact(frames):
            arr = <cnp.ndarray>frames
            if cnp.PyArray_NDIM(arr) == self._nd + 1 and arr.descr is self._descr:
                for i in range(self._nd):
                    if cnp.PyArray_DIMS(arr)[i + 1] != self._dims[i]:
                        break
                else:
                    return arr
        arr = np.asarray(frames)
        if arr.ndim != self._nd + 1:
            raise ValueError(f"frames have shape {(<object>arr).shape}, expected (n, *{self.frame_shape})")
        return C.as_frame(arr, (arr.shape[0],) + self.frame_shape, self.dtype)

    cdef cnp.ndarray _push_checked(self, cnp.ndarray arr):
        """Copy checked frames ``(n, *S)`` into n new slots; int64 slot ids ``(n,)``."""
        cdef cnp.npy_intp n = arr.shape[0]
        cdef Py_ssize_t i, j
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(1, &n, cnp.NPY_INT64, 0)
        cdef int64_t *o = <int64_t *>cnp.PyArray_DATA(out)
        cdef const unsigned char *src
        cdef int64_t s
        for i in range(n):
            s = lf_pool_alloc(&self.p)
            if s < 0:
                for j in range(i):
                    lf_pool_decref(&self.p, o[j])
                raise MemoryError("the frame pool cannot grow")
            o[i] = s
        if cnp.PyArray_IS_C_CONTIGUOUS(arr):
            src = <const unsigned char *>cnp.PyArray_DATA(arr)
            for i in range(n):
                memcpy(lf_pool_addr(&self.p, o[i]), src + i * self.p.frame_bytes, self.p.frame_bytes)
        else:
            for i in range(n):
                np.copyto(self._view(o[i]), arr[i])
        return out

    def push_many(self, frames):
        """Copy ``n`` frames (an array of shape ``(n, *S)``) in; returns int64 slot ids ``(n,)``.

        Raises:
            TypeError, ValueError: as :meth:`push`, before any frame is stored.
        """
        return self._push_checked(self._as_frames(frames))

    def retain(self, slots):
        """Add one reference to each slot id in ``slots`` (an int or an int array).

        Raises:
            IndexError: a slot id out of range; ValueError: a free slot. Checked for
            every id before any refcount changes.
        """
        cdef int64_t s
        if type(slots) is int:
            s = slots
            _check_slot(&self.p, s)
            if lf_pool_refcount(&self.p, s) >= UINT32_MAX - 1:
                raise OverflowError(f"slot {s} has too many references")
            lf_pool_incref(&self.p, s)
            return
        cdef cnp.ndarray arr = _slot_array(slots)
        cdef const int64_t *a = <const int64_t *>cnp.PyArray_DATA(arr)
        cdef Py_ssize_t n = arr.size, i
        self._check_many(a, n)
        for i in range(n):
            if lf_pool_refcount(&self.p, a[i]) >= UINT32_MAX - <uint32_t>n:
                raise OverflowError(f"slot {a[i]} has too many references")
        for i in range(n):
            lf_pool_incref(&self.p, a[i])

    def release(self, slots):
        """Drop one reference from each slot id in ``slots``; a slot at zero is free again.

        Raises:
            IndexError, ValueError: as :meth:`retain`, and a ValueError if ``slots``
            names a slot more often than it has references; nothing is released then.
        """
        cdef int64_t s
        if type(slots) is int:
            s = slots
            _check_slot(&self.p, s)
            lf_pool_decref(&self.p, s)
            return
        cdef cnp.ndarray arr = _slot_array(slots)
        cdef const int64_t *a = <const int64_t *>cnp.PyArray_DATA(arr)
        cdef Py_ssize_t n = arr.size, i, j
        self._check_many(a, n)
        # over-release check: take the references off without freeing, undo on failure
        for i in range(n):
            if lf_pool_refcount(&self.p, a[i]) == 0:
                break
            self._refcnt_add(a[i], -1)
        else:
            i = n
        for j in range(i):
            self._refcnt_add(a[j], 1)
        if i < n:
            ids, counts = np.unique(arr.ravel(), return_counts=True)
            for s_, n_ in zip(ids, counts):
                if self.refcount(s_) < n_:
                    raise ValueError(
                        f"slot {int(s_)} released {int(n_)} times but has "
                        f"{int(self.refcount(s_))} references"
                    )
        for i in range(n):
            lf_pool_decref(&self.p, a[i])

    cdef inline void _refcnt_add(self, int64_t s, int d):
        # a raw refcount change that never frees (used to check before releasing)
        _pool_refcnt_ptr(&self.p, s)[0] += d

    def refcount(self, slot):
        """References held on ``slot`` (0 for a free slot in range).

        Raises:
            IndexError: out of range.
        """
        cdef int64_t s = _index(slot)
        if not lf_pool_in_range(&self.p, s):
            raise IndexError(f"slot {s} is out of range for this pool")
        return lf_pool_refcount(&self.p, s)

    def get(self, slot):
        """A copy of the frame in ``slot``, shape :attr:`frame_shape`.

        Raises:
            IndexError, ValueError: as :meth:`retain`.
        """
        cdef int64_t s = _index(slot)
        _check_slot(&self.p, s)
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(self._nd, self._dims, self._descr.type_num, 0)
        memcpy(cnp.PyArray_DATA(out), lf_pool_addr(&self.p, s), self.p.frame_bytes)
        return out

    def shift_rings(self, rings, frames, restart=None, *, pad=None):
        """One step of ``n`` frame rings (a vector-env stacker) in one call.

        ``rings`` is an int64 ``(n, k)`` array of slot ids, oldest first, each entry
        owning one reference. The n ``frames`` (``(n, *S)``) are pushed; row i of the
        result is row i of ``rings`` shifted left with frame i last, or, where
        ``restart[i]`` (a new episode), k-1 copies of ``pad`` (a slot id; default: the
        new frame itself, i.e. reset padding) then frame i. The references of ``rings``
        pass to the result (the dropped ones are released): drop ``rings`` afterwards,
        without releasing it. ``rings`` itself is never written.

        Returns:
            A new int64 ``(n, k)`` array whose entries each own one reference.

        Raises:
            ValueError, IndexError, TypeError: bad rings, frames, restart mask or pad;
            checked before anything changes.
        """
        cdef cnp.ndarray r = _slot_array(rings)
        if cnp.PyArray_NDIM(r) != 2 or r.shape[1] == 0:
            raise ValueError(f"rings must have shape (n, k) with k >= 1, got {(<object>r).shape}")
        cdef Py_ssize_t n = r.shape[0], k = r.shape[1], i, j
        cdef const int64_t *a = <const int64_t *>cnp.PyArray_DATA(r)
        self._check_many(a, n * k)
        cdef cnp.ndarray m = None
        cdef const unsigned char *mask = NULL
        if restart is not None:
            if (cnp.PyArray_CheckExact(restart) and cnp.PyArray_TYPE(<cnp.ndarray>restart) == cnp.NPY_BOOL
                    and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>restart)):
                m = <cnp.ndarray>restart
            else:
                m = np.ascontiguousarray(restart, dtype=np.bool_)
            if cnp.PyArray_NDIM(m) != 1 or cnp.PyArray_SIZE(m) != n:
                raise ValueError(f"restart has shape {(<object>m).shape}, expected ({n},)")
            mask = <const unsigned char *>cnp.PyArray_DATA(m)
        cdef int64_t p = -1
        if pad is not None:
            p = _index(pad)
            _check_slot(&self.p, p)
        cdef cnp.ndarray arr = self._as_frames(frames)
        if arr.shape[0] != n:
            raise ValueError(f"frames have shape {(<object>arr).shape}, expected ({n}, *{self.frame_shape})")
        # all checked: push
        cdef cnp.ndarray new = self._push_checked(arr)
        cdef const int64_t *ns = <const int64_t *>cnp.PyArray_DATA(new)
        cdef cnp.npy_intp dims[2]
        dims[0] = n
        dims[1] = k
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(2, dims, cnp.NPY_INT64, 0)
        cdef int64_t *o = <int64_t *>cnp.PyArray_DATA(out)
        cdef int64_t fill
        for i in range(n):
            o[i * k + k - 1] = ns[i]
            if mask != NULL and mask[i]:
                fill = ns[i] if p < 0 else p
                for j in range(k - 1):
                    o[i * k + j] = fill
                    lf_pool_incref(&self.p, fill)
                for j in range(k):
                    lf_pool_decref(&self.p, a[i * k + j])
            else:
                for j in range(k - 1):
                    o[i * k + j] = a[i * k + j + 1]
                lf_pool_decref(&self.p, a[i * k])
        return out

    def write_slots(self, table, row, parts, *, release=True):
        """Write observations' slot ids into rows of a table that owns references.

        The replay buffer's store: ``table`` is a C-contiguous int32 or int64 array
        ``(R, W)`` of slot ids, each entry owning one reference. ``parts`` (a tuple of
        :class:`LazyBatch` ``(E, k_i)``, :class:`LazyFrames` (E = 1) or int arrays
        ``(E, k_i)``, with ``sum(k_i) == W``) are written side by side into rows
        ``row .. row + E - 1``: a reference is taken on each new id and, with
        ``release``, the ids those rows held are released. One call, no frame copied.

        Raises:
            TypeError: a table of another dtype or an unknown part.
            ValueError: shapes that do not fit, a read-only or non-contiguous table,
                ids beyond int32 in an int32 table; IndexError/ValueError: dead slots.
            Everything is checked before anything changes.
        """
        self._write_slots(table, row, tuple(parts), release)

    cdef _write_slots(self, table, Py_ssize_t r0, tuple parts, bint release):
        if not cnp.PyArray_CheckExact(table):
            raise TypeError(f"table must be a numpy.ndarray, got {type(table).__name__}")
        cdef cnp.ndarray t = <cnp.ndarray>table
        cdef int tnum = cnp.PyArray_TYPE(t)
        if tnum != cnp.NPY_INT32 and tnum != cnp.NPY_INT64:
            raise TypeError(f"table must be int32 or int64, got {table.dtype}")
        if cnp.PyArray_NDIM(t) != 2 or not cnp.PyArray_IS_C_CONTIGUOUS(t) or not table.flags.writeable:
            raise ValueError("table must be a writeable C-contiguous 2-D array")
        cdef Py_ssize_t R = t.shape[0], W = t.shape[1], E = -1, col = 0, i, j, c, e, q
        cdef Py_ssize_t nparts = len(parts)
        if nparts > 16:
            raise ValueError("at most 16 parts")
        # each part as (pointer to int64 ids (rows, k) row-major, rows, k); arrays are kept alive
        cdef const int64_t *ptr[16]
        cdef Py_ssize_t rows_[16]
        cdef Py_ssize_t ks[16]
        keep = []
        cdef cnp.ndarray blk
        for q in range(nparts):
            part = parts[q]
            if isinstance(part, LazyBatch):
                if (<LazyBatch>part)._pool is not self:
                    raise ValueError("a LazyBatch of another pool")
                ptr[q] = (<LazyBatch>part)._slots
                rows_[q] = (<LazyBatch>part)._n
                ks[q] = (<LazyBatch>part)._k
            elif isinstance(part, LazyFrames):
                if (<LazyFrames>part)._pool is not self:
                    raise ValueError("a LazyFrames of another pool")
                ptr[q] = (<LazyFrames>part)._slots
                rows_[q] = 1
                ks[q] = (<LazyFrames>part)._k
            else:
                blk = _slot_array(part)
                if cnp.PyArray_NDIM(blk) != 2:
                    raise ValueError(f"slot ids must be 2-D (E, k), got shape {(<object>blk).shape}")
                keep.append(blk)
                ptr[q] = <const int64_t *>cnp.PyArray_DATA(blk)
                rows_[q] = blk.shape[0]
                ks[q] = blk.shape[1]
            if E < 0:
                E = rows_[q]
            if rows_[q] != E:
                raise ValueError(f"parts have {E} and {rows_[q]} rows")
            col += ks[q]
        if col != W:
            raise ValueError(f"parts have {col} slot ids per row, the table {W}")
        if r0 < 0 or E < 0 or r0 + E > R:
            raise IndexError(f"rows {r0}..{r0 + E - 1} are out of range for a table of {R}")
        for q in range(nparts):
            self._check_many(ptr[q], E * ks[q])
            if tnum == cnp.NPY_INT32:
                for i in range(E * ks[q]):
                    if ptr[q][i] > 2147483647:
                        raise ValueError(f"slot {ptr[q][i]} does not fit an int32 table")
        cdef int32_t *t32 = <int32_t *>cnp.PyArray_DATA(t)
        cdef int64_t *t64 = <int64_t *>cnp.PyArray_DATA(t)
        cdef Py_ssize_t base = r0 * W, n = E * W
        if release:
            for i in range(n):
                if not lf_pool_is_live(&self.p, t32[base + i] if tnum == cnp.NPY_INT32 else t64[base + i]):
                    raise ValueError(f"table row {r0 + i // W} holds a free slot")
        # new references first (an id may be in both), then release and write
        for q in range(nparts):
            for i in range(E * ks[q]):
                lf_pool_incref(&self.p, ptr[q][i])
        if release:
            for i in range(n):
                lf_pool_decref(&self.p, t32[base + i] if tnum == cnp.NPY_INT32 else t64[base + i])
        c = 0
        for q in range(nparts):
            for e in range(E):
                for j in range(ks[q]):
                    if tnum == cnp.NPY_INT32:
                        t32[base + e * W + c + j] = <int32_t>ptr[q][e * ks[q] + j]
                    else:
                        t64[base + e * W + c + j] = ptr[q][e * ks[q] + j]
            c += ks[q]

    def push_dedup(self, frames, candidates=None):
        """Push ``(E, k, *S)`` frames, reusing a slot where a frame's bytes are already stored.

        Frame j of row e reuses, in this order, a slot of ``candidates[e]`` (int ``(E, m)``
        slot ids, e.g. that env's previous observation; -1 for none) with equal bytes, or
        an earlier frame of the same row with equal bytes (reset padding); otherwise it is
        copied into a new slot. This is how observations that arrive as plain stacked
        arrays (EnvPool, SB3's VecFrameStack) cost one new frame per step.

        Returns:
            int64 ``(E, k)`` slot ids, each owning one new reference (release them once
            stored elsewhere).

        Raises:
            TypeError, ValueError: frames of the wrong dtype or shape, candidates of the
            wrong shape; IndexError/ValueError: dead candidate slots. Checked first.
        """
        arr = np.asarray(frames)
        if arr.ndim != self._nd + 2:
            raise ValueError(f"frames have shape {arr.shape}, expected (E, k, *{self.frame_shape})")
        arr = C.as_frame(arr, arr.shape[:2] + self.frame_shape, self.dtype)
        cdef cnp.ndarray a = np.ascontiguousarray(arr)
        cdef Py_ssize_t E = a.shape[0], k = a.shape[1], m = 0, e, j, jj, c, i
        cdef cnp.ndarray cand = None
        cdef const int64_t *cp = NULL
        if candidates is not None:
            cand = _slot_array(candidates)
            if cnp.PyArray_NDIM(cand) != 2 or cand.shape[0] != E:
                raise ValueError(f"candidates have shape {(<object>cand).shape}, expected ({E}, m)")
            m = cand.shape[1]
            cp = <const int64_t *>cnp.PyArray_DATA(cand)
            for i in range(E * m):
                if cp[i] != -1 and not lf_pool_is_live(&self.p, cp[i]):
                    _check_slot(&self.p, cp[i])
        cdef size_t fb = self.p.frame_bytes
        cdef const unsigned char *src = <const unsigned char *>cnp.PyArray_DATA(a)
        cdef cnp.npy_intp dims[2]
        dims[0] = E
        dims[1] = k
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(2, dims, cnp.NPY_INT64, 0)
        cdef int64_t *o = <int64_t *>cnp.PyArray_DATA(out)
        cdef int64_t found
        cdef const unsigned char *f
        for e in range(E):
            for j in range(k):
                f = src + (e * k + j) * fb
                found = -1
                for c in range(m):
                    if cp[e * m + c] != -1 and memcmp(lf_pool_addr(&self.p, cp[e * m + c]), f, fb) == 0:
                        found = cp[e * m + c]
                        break
                if found < 0:
                    for jj in range(j):
                        if memcmp(src + (e * k + jj) * fb, f, fb) == 0:
                            found = o[e * k + jj]
                            break
                if found >= 0:
                    lf_pool_incref(&self.p, found)
                else:
                    found = lf_pool_alloc(&self.p)
                    if found < 0:
                        for i in range(e * k + j):
                            lf_pool_decref(&self.p, o[i])
                        raise MemoryError("the frame pool cannot grow")
                    memcpy(lf_pool_addr(&self.p, found), f, fb)
                o[e * k + j] = found
        return out

    def lazy_batch(self, slots, *, layout="stack"):
        """A :class:`LazyBatch` over int ``(n, k)`` slot ids (one observation per row).

        Takes its own reference on each slot; copies no frame bytes.

        Raises:
            IndexError, ValueError: as :meth:`retain`; ValueError for a bad shape or layout.
        """
        return LazyBatch._make(self, slots, layout)

    def lazy(self, slots, *, layout="last"):
        """A :class:`LazyFrames` over ``k`` slot ids, oldest first; copies no frame bytes.

        The observation takes its own reference on each slot.

        Raises:
            IndexError, ValueError: as :meth:`retain`; ValueError for a bad layout.
        """
        return LazyFrames._from_slots(self, slots, layout)

    def gather(self, slots, out=None, *, layout="last", dtype=None, scale=None):
        """Copy ``B`` observations of ``k`` slots each (``slots``: ints ``(B, k)``) into one array.

        One C call with the GIL released; dtype conversion and ``scale`` are fused into
        the copy. Everything is checked before anything is written.

        Raises:
            IndexError, ValueError: bad slot ids; TypeError/ValueError: a bad ``out``.
        """
        cdef cnp.ndarray arr = _slot_array(slots)
        if arr.ndim != 2 or arr.shape[1] == 0:
            raise ValueError(f"slots must have shape (B, k) with k >= 1, got {(<object>arr).shape}")
        cdef int code = self._layout(layout)
        cdef Py_ssize_t b = arr.shape[0], k = arr.shape[1], i
        cdef const int64_t *a = <const int64_t *>cnp.PyArray_DATA(arr)
        res, dst_type, sc, has_scale = _prepare_out(self, code, b, k, out, dtype, scale)
        # no Python code runs from the liveness check to the references taken below, so
        # another thread cannot free a slot in between
        self._check_many(a, b * k)
        cdef const unsigned char **src = <const unsigned char **>malloc(max(1, b * k) * sizeof(void *))
        if src == NULL:
            raise MemoryError()
        # the copy runs without the GIL: hold a reference on every slot meanwhile, so
        # another thread releasing them (a replay buffer's add) cannot free the frames
        for i in range(b * k):
            src[i] = lf_pool_addr(&self.p, a[i])
            lf_pool_incref(&self.p, a[i])
        try:
            _run(src, b, k, self, code, dst_type, sc, has_scale, res)
        finally:
            for i in range(b * k):
                lf_pool_decref(&self.p, a[i])
        return res

    def gather_pairs(self, first, second, out=None, *, layout="last", dtype=None, scale=None):
        """:meth:`gather` of two slot arrays ``(B, k)`` at once, row by row.

        Row i of ``first`` then row i of ``second`` are copied one after the other, so
        frames they share (a transition's obs and next_obs share k-1) are read from
        memory once and from cache the second time. The replay buffer's sample.

        Args:
            first, second: int ``(B, k)`` slot ids.
            out: optional pair of arrays ``(B, *observation_shape)`` (see :meth:`gather`).

        Returns:
            A pair of arrays ``(B, *observation_shape)``.

        Raises:
            As :meth:`gather`, for either array; nothing is written then.
        """
        cdef cnp.ndarray a1 = _slot_array(first), a2 = _slot_array(second)
        if (cnp.PyArray_NDIM(a1) != 2 or a1.shape[1] == 0 or cnp.PyArray_NDIM(a2) != 2
                or a1.shape[0] != a2.shape[0] or a1.shape[1] != a2.shape[1]):
            raise ValueError(f"slots must be two arrays of one shape (B, k) with k >= 1, got "
                             f"{(<object>a1).shape} and {(<object>a2).shape}")
        if out is not None and (not isinstance(out, (tuple, list)) or len(out) != 2):
            raise TypeError("out must be a pair of ndarrays")
        cdef int code = self._layout(layout)
        cdef Py_ssize_t b = a1.shape[0], k = a1.shape[1], i, j, n = b * k
        cdef const int64_t *p1 = <const int64_t *>cnp.PyArray_DATA(a1)
        cdef const int64_t *p2 = <const int64_t *>cnp.PyArray_DATA(a2)
        o1, o2 = (None, None) if out is None else out
        res1, dst_type, sc, has_scale = _prepare_out(self, code, b, k, o1, dtype, scale)
        res2, _, _, _ = _prepare_out(self, code, b, k, o2, dtype, scale)
        if res1.dtype != res2.dtype:
            raise TypeError(f"the two arrays of out have different dtypes: {res1.dtype} and {res2.dtype}")
        if res1 is res2 or (out is not None and np.may_share_memory(res1, res2)):
            raise ValueError("the two arrays of out overlap")
        # no Python code runs from here to the references taken below (see gather)
        self._check_many(p1, n)
        self._check_many(p2, n)
        cdef const unsigned char **src = <const unsigned char **>malloc(max(1, 2 * n) * sizeof(void *))
        if src == NULL:
            raise MemoryError()
        for i in range(n):  # the copy runs without the GIL: hold references meanwhile
            src[i] = lf_pool_addr(&self.p, p1[i])
            src[n + i] = lf_pool_addr(&self.p, p2[i])
            lf_pool_incref(&self.p, p1[i])
            lf_pool_incref(&self.p, p2[i])
        cdef unsigned char *d1 = <unsigned char *>cnp.PyArray_DATA(<cnp.ndarray>res1)
        cdef unsigned char *d2 = <unsigned char *>cnp.PyArray_DATA(<cnp.ndarray>res2)
        cdef size_t obs_bytes = cnp.PyArray_NBYTES(<cnp.ndarray>res1) // max(1, b)
        cdef size_t outer = self._outer[code], inner = self._inner[code], isz = self._itemsize
        cdef int st = self._ltype, dt = dst_type, rc = 0
        cdef double scv = sc
        cdef int hs = has_scale
        with nogil:
            for i in range(b):
                rc |= lf_copy_stacks(src + i * k, 1, k, outer, inner, st, dt, isz, scv, hs,
                                     d1 + i * obs_bytes)
                rc |= lf_copy_stacks(src + n + i * k, 1, k, outer, inner, st, dt, isz, scv, hs,
                                     d2 + i * obs_bytes)
        free(src)
        for i in range(n):
            lf_pool_decref(&self.p, p1[i])
            lf_pool_decref(&self.p, p2[i])
        if rc != 0:
            raise TypeError(f"no fused conversion from {self.dtype} to {res1.dtype}")
        return res1, res2



cdef FramePool _EMPTY_POOL = FramePool((1,), np.uint8)


def _write_transitions(FramePool pool, table, Py_ssize_t row, obs, next_obs, bint release,
                       cnp.ndarray actions, action, cnp.ndarray rewards, reward,
                       cnp.ndarray flags, terminated, truncated, autoreset):
    """The replay buffer's batched add in one call (internal).

    Writes E transitions at rows ``row .. row + E - 1``: slot ids as
    :meth:`FramePool.write_slots`, ``actions[rows] = action`` (same dtype),
    ``rewards[rows] = reward`` (float32 from float32/float64), and
    ``flags[rows] = terminated + 2 * truncated + 4 * autoreset`` (contiguous bool
    arrays). Returns the number of autoreset rows, or None, having written nothing, when
    an argument is not of these exact kinds (the buffer then takes its checked path).
    """
    cdef Py_ssize_t E = len(obs), i
    for a in (actions, rewards, flags):
        if (not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>a) or cnp.PyArray_NDIM(<cnp.ndarray>a) < 1
                or row < 0 or row + E > (<cnp.ndarray>a).shape[0]):
            return None
    if rewards.dtype.num != cnp.NPY_FLOAT32 or flags.dtype.num != cnp.NPY_UINT8:
        return None
    if not (cnp.PyArray_CheckExact(action) and cnp.PyArray_CheckExact(reward)):
        return None
    cdef cnp.ndarray act = <cnp.ndarray>action, rew = <cnp.ndarray>reward
    cdef size_t arow = cnp.PyArray_NBYTES(actions) // actions.shape[0]
    if (act.dtype != actions.dtype or not cnp.PyArray_IS_C_CONTIGUOUS(act)
            or cnp.PyArray_NDIM(act) != cnp.PyArray_NDIM(actions) or act.shape[0] != E
            or <size_t>cnp.PyArray_NBYTES(act) != E * arow):
        return None
    for i in range(1, cnp.PyArray_NDIM(act)):
        if act.shape[i] != actions.shape[i]:
            return None
    cdef int rnum = rew.dtype.num
    if ((rnum != cnp.NPY_FLOAT32 and rnum != cnp.NPY_FLOAT64) or cnp.PyArray_NDIM(rew) != 1
            or rew.shape[0] != E or not cnp.PyArray_IS_C_CONTIGUOUS(rew)):
        return None
    masks = (terminated, truncated) if autoreset is None else (terminated, truncated, autoreset)
    for m in masks:
        if (not cnp.PyArray_CheckExact(m) or (<cnp.ndarray>m).dtype.num != cnp.NPY_BOOL
                or cnp.PyArray_NDIM(<cnp.ndarray>m) != 1 or (<cnp.ndarray>m).shape[0] != E
                or not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>m)):
            return None
    pool._write_slots(table, row, (obs, next_obs), release)  # checks, then writes
    memcpy(<char *>cnp.PyArray_DATA(actions) + row * arow, cnp.PyArray_DATA(act), E * arow)
    cdef float *rw = <float *>cnp.PyArray_DATA(rewards) + row
    cdef unsigned char *fl = <unsigned char *>cnp.PyArray_DATA(flags) + row
    cdef const unsigned char *te = <const unsigned char *>cnp.PyArray_DATA(<cnp.ndarray>terminated)
    cdef const unsigned char *tr = <const unsigned char *>cnp.PyArray_DATA(<cnp.ndarray>truncated)
    cdef const unsigned char *au = NULL
    if autoreset is not None:
        au = <const unsigned char *>cnp.PyArray_DATA(<cnp.ndarray>autoreset)
    cdef Py_ssize_t skipped = 0
    for i in range(E):
        if rnum == cnp.NPY_FLOAT32:
            rw[i] = (<const float *>cnp.PyArray_DATA(rew))[i]
        else:
            rw[i] = <float>(<const double *>cnp.PyArray_DATA(rew))[i]
        fl[i] = (te[i] != 0) | ((tr[i] != 0) << 1)
        if au != NULL and au[i]:
            fl[i] |= 4
            skipped += 1
    return skipped


cdef tuple _prepare_out(FramePool pool, int code, Py_ssize_t b, Py_ssize_t k, object out,
                        object dtype, object scale):
    """Check or allocate the output of a copy out: (array, dst type, scale, has_scale)."""
    cdef cnp.npy_intp dims[MAX_NDIM + 1]
    cdef int nd, i
    dims[0] = b
    nd = _obs_dims(pool, code, k, dims + 1) + 1  # (B, *observation_shape)
    cdef cnp.ndarray o
    if dtype is None and scale is None:
        if out is None:
            return cnp.PyArray_EMPTY(nd, dims, pool._descr.type_num, 0), pool._ltype, 0.0, False
        if cnp.PyArray_CheckExact(out):
            # the common out= case, checked in C: same dtype, shape, C-contiguous, writeable
            o = <cnp.ndarray>out
            if (o.descr is pool._descr and cnp.PyArray_NDIM(o) == nd
                    and cnp.PyArray_IS_C_CONTIGUOUS(o) and cnp.PyArray_ISWRITEABLE(o)
                    and cnp.PyArray_ISALIGNED(o)):
                for i in range(nd):
                    if cnp.PyArray_DIMS(o)[i] != dims[i]:
                        break
                else:
                    return o, pool._ltype, 0.0, False
    dst = C.output_dtype(pool.dtype, C.requested_dtype(dtype, out), scale)
    if out is None:
        res = cnp.PyArray_EMPTY(nd, dims, (<cnp.dtype>dst).type_num, 0)
    else:
        C.check_out(out, tuple([dims[i] for i in range(nd)]), dst)
        res = out
    dst_type = pool._ltype if dst is pool.dtype else _lf_type(dst)
    if dst_type == LF_RAW and pool._ltype != LF_RAW:
        raise TypeError(f"no fused conversion from {pool.dtype} to {dst}")
    return res, dst_type, (0.0 if scale is None else float(scale)), scale is not None


cdef int _run(const unsigned char **src, Py_ssize_t b, Py_ssize_t k, FramePool pool, int code,
              int dst_type, double sc, bint has_scale, cnp.ndarray res) except -1:
    """Run the copy kernel without the GIL; frees ``src``."""
    cdef void *dst = cnp.PyArray_DATA(res)
    cdef size_t outer = pool._outer[code], inner = pool._inner[code], isz = pool._itemsize
    cdef int st = pool._ltype, rc
    with nogil:
        rc = lf_copy_stacks(src, b, k, outer, inner, st, dst_type, isz, sc, has_scale, dst)
    free(src)
    if rc != 0:
        raise TypeError(f"no fused conversion from {pool.dtype} to {res.dtype}")
    return 0


_default_pools = {}  # kept for the process: an idle pool holds at most one empty chunk


def default_pool(frame_shape, dtype):
    """The shared pool for frames of ``frame_shape`` and ``dtype``.

    Used by ``LazyFrames(list_of_frames)`` and by unpickling. It lives for the
    process, so its dedupe cache survives between observations; once idle it holds at
    most one empty chunk (``chunk_bytes``, 1 MiB by default).
    """
    key = (C.frame_shape(frame_shape), C.frame_dtype(dtype))
    pool = _default_pools.get(key)
    if pool is None:
        pool = FramePool(*key)
        _default_pools[key] = pool
    return pool


def _restore_frame(frame):
    return C.restore_frame(default_pool, frame)


def _restore_lazyframes(refs, layout):
    return refs[0].pool.lazy([r.slot for r in refs], layout=layout)


def _restore_lazybatch(rows, layout):
    return C.restore_lazybatch(rows, layout)


@cython.final
@cython.no_gc
cdef class LazyFrames:
    """k frames shown as one observation, stored once in a :class:`FramePool`.

    A drop-in for baselines' ``atari_wrappers.LazyFrames``: ``LazyFrames(frames)``
    concatenates on the last axis, and ``len``, ``[i]``, ``count()`` and ``frame(i)``
    behave as baselines' on the materialised array. Unlike baselines it never caches the
    materialised stack: ``np.asarray`` copies the frames out each time into a fresh
    array, so holding observations costs only the unique frames.

    Args:
        frames: a non-empty sequence of k array-likes of one shape ``S`` and dtype,
            oldest first, copied into the shared :func:`default_pool`. An ndarray that
            is already stored there with the same bytes (as when baselines' FrameStack
            passes the same frame to k consecutive observations) is not copied again.
        layout: ``"last"`` (baselines, default), ``"first"`` (SB3 channels-first) or
            ``"stack"`` (Gymnasium, ``(k, *S)``); see ``lazyframes.LAYOUTS``.

    Raises:
        ValueError: an empty sequence, frames of different shapes, or a layout that
            does not fit the frame shape (e.g. ``"last"`` for ``(1, 84, 84)`` frames).
        TypeError: frames of different dtypes, or object arrays.

    Equality: ``a == b`` is a single bool, True when both materialise to arrays of the
    same shape with equal values (as ``np.array_equal``); comparing with an ndarray
    works the same way in both directions. Observations are unhashable, like ndarrays.

    Example:
        >>> frames = [np.full((84, 84, 1), v, np.uint8) for v in range(4)]
        >>> lz = LazyFrames(frames)
        >>> lz.shape, np.asarray(lz).shape, lz.count(), len(lz)
        ((84, 84, 4), (84, 84, 4), 4, 84)
    """

    cdef FramePool _pool
    cdef int64_t *_slots            # _inline for k <= 4 (Atari's stack size), else malloc'd
    cdef int64_t _inline[4]
    cdef Py_ssize_t _k
    cdef int _code

    __array_priority__ = 10.0  # so ndarray == LazyFrames defers to __eq__

    def __cinit__(self):
        self._slots = NULL
        self._k = 0
        self._pool = _EMPTY_POOL  # until initialised: an empty observation, never NULL

    def __init__(self, frames, *, layout="last"):
        if self._slots != NULL:
            raise RuntimeError("LazyFrames.__init__ called twice")
        if isinstance(frames, np.ndarray) and frames.ndim >= 1:
            frames = list(frames)
        frames = list(frames)
        if not frames:
            raise ValueError("LazyFrames needs at least one frame")
        arrays = []
        for f in frames:
            a = np.asarray(f)
            if a.dtype.kind == "O":
                raise TypeError("frame is an object array; frames must be numeric ndarrays")
            arrays.append(a)
        shape, dt = arrays[0].shape, C.frame_dtype(arrays[0].dtype)
        for a in arrays:
            if a.shape != shape:
                raise ValueError(f"frames have different shapes: {shape} and {a.shape}")
            if a.dtype.newbyteorder("=") != dt:
                raise TypeError(f"frames have different dtypes: {dt} and {a.dtype}")
        C.check_layout(layout, shape)
        cdef FramePool pool = default_pool(shape, dt)
        slots = []
        try:
            for f, a in zip(frames, arrays):
                slots.append(pool._push_known(f, a))
            self._init(pool, C.as_slots(slots), layout)
        finally:
            if slots:
                pool.release(slots)

    @classmethod
    def from_slots(cls, pool, slots, *, layout="last"):
        """An observation over ``k`` live slot ids of ``pool``; copies no frame bytes."""
        return LazyFrames._from_slots(pool, slots, layout)

    @staticmethod
    def _from_slots(pool, slots, layout):
        if not isinstance(pool, FramePool):
            raise TypeError(f"pool must be a FramePool, got {type(pool).__name__}")
        cdef cnp.ndarray arr = _slot_array(slots)
        if cnp.PyArray_NDIM(arr) != 1 or cnp.PyArray_SIZE(arr) == 0:
            raise ValueError(f"slots must be a non-empty 1-D sequence, got shape {(<object>arr).shape}")
        cdef LazyFrames lz = LazyFrames.__new__(LazyFrames)
        lz._init(pool, arr, layout)
        return lz

    cdef _init(self, FramePool pool, cnp.ndarray slots, object layout):
        cdef int code = pool._layout(layout)
        cdef Py_ssize_t k = slots.size, i
        cdef const int64_t *a = <const int64_t *>cnp.PyArray_DATA(slots)
        pool._check_many(a, k)
        self._alloc_slots(k)
        for i in range(k):
            self._slots[i] = a[i]
            lf_pool_incref(&pool.p, a[i])
        self._k = k
        self._pool = pool
        self._code = code

    cdef int _alloc_slots(self, Py_ssize_t k) except -1:
        if k <= 4:
            self._slots = self._inline
        else:
            self._slots = <int64_t *>malloc(k * sizeof(int64_t))
            if self._slots == NULL:
                raise MemoryError()
        return 0

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self._slots != NULL:
            for i in range(self._k):
                lf_pool_decref(&self._pool.p, self._slots[i])
            if self._slots != self._inline:
                free(self._slots)

    # -- array-likeness without materialising ----------------------------------------
    @property
    def pool(self):
        """The pool holding the frames."""
        return self._pool

    @property
    def slots(self):
        """Slot ids of the k frames, oldest first."""
        return tuple(self._slots[i] for i in range(self._k))

    @property
    def layout(self):
        """``"last"``, ``"first"`` or ``"stack"``."""
        return _LAYOUT_NAMES[self._code]

    @property
    def stack_size(self):
        """k, the number of frames."""
        return self._k

    @property
    def frame_shape(self):
        """Shape ``S`` of one frame."""
        return self._pool.frame_shape

    @property
    def shape(self):
        """Shape of ``np.asarray(self)``."""
        key = (self._code, self._k)
        shape = self._pool._shapes.get(key)
        if shape is None:
            shape = C.observation_shape(self._pool.frame_shape, self._k, _LAYOUT_NAMES[self._code])
            self._pool._shapes[key] = shape
        return shape

    @property
    def dtype(self):
        """dtype of ``np.asarray(self)``."""
        return self._pool.dtype

    @property
    def ndim(self):
        return self._pool._nd + (1 if self._code == 2 else 0)

    @property
    def size(self):
        return self._k * self._pool.p.frame_bytes // self._pool._itemsize

    @property
    def nbytes(self):
        """Bytes of the materialised array (not of the memory held; see the pool)."""
        return self._k * self._pool.p.frame_bytes

    # -- copying out ---------------------------------------------------------------
    cdef cnp.ndarray _out(self, object dtype, object scale):
        cdef FramePool pool = self._pool
        cdef cnp.npy_intp dims[MAX_NDIM + 1]
        cdef const unsigned char *few[16]
        cdef cnp.ndarray arr
        cdef int nd
        cdef Py_ssize_t i
        if dtype is None and scale is None and self._k <= 16:
            # the hot path of np.asarray(obs): no checks left to make, one kernel call
            nd = _obs_dims(pool, self._code, self._k, dims)
            arr = cnp.PyArray_EMPTY(nd, dims, pool._descr.type_num, 0)
            for i in range(self._k):
                few[i] = lf_pool_addr(&pool.p, self._slots[i])
            lf_copy_stacks(few, 1, self._k, pool._outer[self._code], pool._inner[self._code],
                           pool._ltype, pool._ltype, pool._itemsize, 0.0, 0, cnp.PyArray_DATA(arr))
            return arr
        res, dst_type, sc, has_scale = _prepare_out(pool, self._code, 1, self._k, None, dtype, scale)
        cdef const unsigned char **src = <const unsigned char **>malloc(self._k * sizeof(void *))
        if src == NULL:
            raise MemoryError()
        for i in range(self._k):
            src[i] = lf_pool_addr(&pool.p, self._slots[i])
        _run(src, 1, self._k, pool, self._code, dst_type, sc, has_scale, res)
        return res[0]

    def __array__(self, dtype=None, copy=None):
        """Materialise into a fresh array (NumPy 2 protocol).

        ``copy=False`` raises ValueError: the frames are not one array, so a copy cannot
        be avoided. ``dtype`` is fused into the copy (same-kind casts).
        """
        if dtype is None and copy is not False:
            return self._out(None, None)  # the hot path of np.asarray(obs)
        return C.array_protocol(self, dtype, copy, self._fused)

    def _fused(self, dtype):
        return self._out(dtype, None)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """DLPack export of a fresh materialised array, so ``torch.as_tensor(obs)`` is fast."""
        return C.dlpack(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self):
        return C.DLPACK_DEVICE

    def astype(self, dtype, *, scale=None):
        """A new array of ``dtype``, optionally times ``scale`` (fused into the copy).

        ``obs.astype(np.float32, scale=1/255)`` is baselines' ScaledFloatFrame.
        """
        return self._out(dtype, scale)

    def __len__(self):
        if self._code == 2:
            return self._k
        if self._code == 1:
            return self._k * self._pool._dims[0]
        return self._pool._dims[0] if self._pool._nd > 1 else self._k * self._pool._dims[0]

    def __getitem__(self, key):
        return self._out(None, None)[key]

    def count(self):
        """Size of the last axis of the materialised array, as baselines' ``count()``."""
        return self.shape[-1]

    def frame(self, i):
        """``np.asarray(self)[..., i]`` as baselines' ``frame(i)``: a channel when C > 1.

        Copies only what it returns in the ``"last"`` layout.

        Raises:
            IndexError: out of range.
        """
        i = C.index_frame(i, self.count())
        if self._code == 0:
            j, ch = divmod(i, self._pool._dims[self._pool._nd - 1])
            return self._pool.get(self._slots[j])[..., ch]
        return self._out(None, None)[..., i]

    def shift(self, frame):
        """The next observation: this one's last k-1 frames, then ``frame``.

        ``frame`` is copied once into this observation's pool; the shared frames are
        not copied. This is one step of a frame stacker (baselines' ``deque(maxlen=k)``)
        in one call; ``self`` is unchanged.

        Raises:
            TypeError, ValueError: ``frame`` of the wrong dtype or shape.
        """
        cdef FramePool pool = self._pool
        cdef cnp.ndarray arr = pool._as_frame(frame)
        cdef LazyFrames lz = LazyFrames.__new__(LazyFrames)
        lz._alloc_slots(self._k)
        cdef int64_t s = pool._alloc()
        try:
            pool._write(s, arr)
        except BaseException:
            lf_pool_decref(&pool.p, s)
            raise
        cdef Py_ssize_t i
        for i in range(self._k - 1):
            lz._slots[i] = self._slots[i + 1]
            lf_pool_incref(&pool.p, lz._slots[i])
        lz._slots[self._k - 1] = s
        lz._k = self._k
        lz._pool = pool
        lz._code = self._code
        return lz

    def get_frame(self, j):
        """A copy of whole frame ``j`` (0 is the oldest), shape :attr:`frame_shape`.

        Raises:
            IndexError: out of range.
        """
        j = C.index_frame(j, self._k)
        return self._pool.get(self._slots[j])

    def __copy__(self):
        # frames are immutable, so a copy shares them (no frame bytes copied)
        return LazyFrames._from_slots(self._pool, self.slots, self.layout)

    def copy(self):
        """A new observation sharing the same frames (no frame bytes copied)."""
        return self.__copy__()

    def __deepcopy__(self, memo):
        return self.__copy__()

    def __reduce__(self):
        return C.reduce_lazyframes(self)

    def __eq__(self, other):
        return C.lazyframes_eq(self, other)

    def __ne__(self, other):
        eq = C.lazyframes_eq(self, other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None

    def __repr__(self):
        return (
            f"LazyFrames(shape={self.shape}, dtype={self.dtype}, layout={self.layout!r}, "
            f"stack_size={self._k})"
        )


def stack(observations, out=None, *, dtype=None, scale=None):
    """Materialise a batch of observations into one array: ``(B, *observation_shape)``.

    The fast equivalent of ``np.array(list_of_lazyframes)``: one C call with the GIL
    released; ``dtype`` and ``scale`` are fused into the copy, e.g.
    ``stack(batch, dtype=np.float32, scale=1/255)`` for ``uint8 -> [0, 1]``.

    Args:
        observations: a non-empty sequence of :class:`LazyFrames` with one shape, dtype
            and layout (they may come from different pools).
        out: optional C-contiguous, writeable ndarray of shape ``(B, *obs_shape)`` to
            fill; its dtype is the output dtype when ``dtype`` is None.
        dtype: output dtype (same-kind casts, e.g. uint8 -> float32). Default: the frames'.
        scale: multiply by this after converting (float output dtypes only).

    Returns:
        ``out``, or a new array.

    Raises:
        ValueError: no observations, mismatched shapes or layouts, or a bad ``out``
            (shape, contiguity, read-only).
        TypeError: a non-LazyFrames element, mismatched dtypes, an unsupported
            conversion, or ``out`` of the wrong dtype.
    """
    obs = list(observations)  # our own references: the caller's list may change meanwhile
    cdef Py_ssize_t b = len(obs), i, j, k
    if b == 0:
        raise ValueError("stack needs at least one observation")
    cdef LazyFrames o, first
    x = obs[0]
    if not isinstance(x, LazyFrames):
        raise TypeError(f"stack takes LazyFrames, got {type(x).__name__}; use np.stack for ndarrays")
    first = x
    k = first._k
    cdef FramePool fp = first._pool
    cdef const unsigned char **src = <const unsigned char **>malloc(max(1, b * k) * sizeof(void *))
    if src == NULL:
        raise MemoryError()
    try:  # one pass: check each observation and take its frames' addresses
        for i in range(b):
            x = obs[i]
            if not isinstance(x, LazyFrames):
                raise TypeError(
                    f"stack takes LazyFrames, got {type(x).__name__}; use np.stack for ndarrays")
            o = x
            if o._pool is not fp or o._k != k or o._code != first._code:
                C.check_same_geometry(first, o)  # raises unless only the pools differ
            for j in range(k):
                src[i * k + j] = lf_pool_addr(&o._pool.p, o._slots[j])
        res, dst_type, sc, has_scale = _prepare_out(fp, first._code, b, k, out, dtype, scale)
    except BaseException:
        free(src)
        raise
    _run(src, b, k, fp, first._code, dst_type, sc, has_scale, res)
    return res


@cython.final
@cython.no_gc
cdef class LazyBatch:
    """A batch of ``n`` observations (one per sub-environment) as slot ids of one pool.

    Holds one reference on each of its ``n * k`` slots, released when it is dropped, so
    it stays valid however far the environments move on. No frame bytes are copied until
    it is materialised. Made by :meth:`FramePool.lazy_batch` (or
    ``lazyframes.vector.LazyBatch(pool, slots, layout=...)``).

    ``len(batch)`` is ``n``; ``batch[i]`` is observation i as a :class:`LazyFrames` (no
    frame copied); ``batch[a:b]`` is a LazyBatch. ``np.asarray(batch)``, :meth:`numpy`
    (with ``out``, ``dtype``, ``scale``) and DLPack (``torch.as_tensor(batch)``) copy the
    whole batch out once, in one C call with the GIL released.
    """

    cdef FramePool _pool
    cdef int64_t *_slots
    cdef Py_ssize_t _n, _k
    cdef int _code

    def __cinit__(self):
        self._slots = NULL
        self._n = 0
        self._k = 0
        self._pool = _EMPTY_POOL  # until initialised: an empty batch, never NULL

    def __init__(self, *args, **kwargs):
        raise TypeError("use FramePool.lazy_batch(slots, layout=...) to make a LazyBatch")

    @staticmethod
    cdef LazyBatch _make(FramePool pool, object slots, object layout):
        cdef cnp.ndarray arr = _slot_array(slots)
        if cnp.PyArray_NDIM(arr) != 2 or arr.shape[1] == 0:
            raise ValueError(
                f"slots must have shape (num_envs, k) with k >= 1, got {(<object>arr).shape}")
        cdef int code = pool._layout(layout)
        cdef Py_ssize_t n = arr.shape[0], k = arr.shape[1], i
        cdef const int64_t *a = <const int64_t *>cnp.PyArray_DATA(arr)
        pool._check_many(a, n * k)
        cdef LazyBatch b = LazyBatch.__new__(LazyBatch)
        b._slots = <int64_t *>malloc(max(1, n * k) * sizeof(int64_t))
        if b._slots == NULL:
            raise MemoryError()
        for i in range(n * k):
            b._slots[i] = a[i]
            lf_pool_incref(&pool.p, a[i])
        b._n = n
        b._k = k
        b._pool = pool
        b._code = code
        return b

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self._slots != NULL:
            for i in range(self._n * self._k):
                lf_pool_decref(&self._pool.p, self._slots[i])
            free(self._slots)

    @property
    def pool(self):
        """The pool holding the frames."""
        return self._pool

    @property
    def slots(self):
        """A copy of the slot ids, int64 ``(num_envs, k)``, oldest frame first."""
        cdef cnp.npy_intp dims[2]
        dims[0] = self._n
        dims[1] = self._k
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(2, dims, cnp.NPY_INT64, 0)
        memcpy(cnp.PyArray_DATA(out), self._slots, self._n * self._k * sizeof(int64_t))
        return out

    @property
    def layout(self):
        """``"last"``, ``"first"`` or ``"stack"``."""
        return _LAYOUT_NAMES[self._code]

    @property
    def stack_size(self):
        """k, the frames per observation."""
        return self._k

    @property
    def shape(self):
        """Shape of ``np.asarray(self)``: ``(num_envs, *observation_shape)``."""
        return (self._n,) + C.observation_shape(self._pool.frame_shape, self._k, self.layout)

    @property
    def dtype(self):
        """dtype of the frames."""
        return self._pool.dtype

    @property
    def ndim(self):
        return self._pool._nd + (2 if self._code == 2 else 1)

    @property
    def nbytes(self):
        """Bytes of the materialised array (not of the memory held; see the pool)."""
        return self._n * self._k * self._pool.p.frame_bytes

    def numpy(self, out=None, *, dtype=None, scale=None):
        """Materialise the batch into ``out`` (or a new array) in one copy.

        Args:
            out: optional C-contiguous writeable ndarray of shape :attr:`shape`.
            dtype: output dtype (same-kind casts, e.g. uint8 -> float32).
            scale: multiply by this after converting (float output only), e.g. 1/255.

        Returns:
            ``out`` or a new array of shape :attr:`shape`.

        Raises:
            TypeError, ValueError: a bad ``out``, ``dtype`` or ``scale`` (nothing written).
        """
        cdef FramePool pool = self._pool
        res, dst_type, sc, has_scale = _prepare_out(pool, self._code, self._n, self._k, out, dtype, scale)
        cdef Py_ssize_t i, m = self._n * self._k
        cdef const unsigned char **src = <const unsigned char **>malloc(max(1, m) * sizeof(void *))
        if src == NULL:
            raise MemoryError()
        for i in range(m):
            src[i] = lf_pool_addr(&pool.p, self._slots[i])
        _run(src, self._n, self._k, pool, self._code, dst_type, sc, has_scale, res)
        return res

    def __array__(self, dtype=None, copy=None):
        """Materialise into a fresh ``(num_envs, *observation_shape)`` array (NumPy 2 protocol).

        ``copy=False`` raises ValueError: a copy cannot be avoided.
        """
        if dtype is None and copy is not False:
            return self.numpy()
        return C.array_protocol(self, dtype, copy, self._fused)

    def _fused(self, dtype):
        return self.numpy(dtype=dtype)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """DLPack export of a fresh materialised batch, so ``torch.as_tensor(batch)`` is fast."""
        return C.dlpack(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self):
        return C.DLPACK_DEVICE

    def __len__(self):
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return LazyBatch._make(self._pool, self.slots[i], self.layout)
        try:
            j = C.index_frame(i, self._n, "environments")
        except TypeError:
            raise TypeError(
                f"LazyBatch indices must be an int (one env's LazyFrames) or a slice, got "
                f"{type(i).__name__}; use np.asarray(batch)[...] for array indexing"
            ) from None
        return self._row(j)

    cdef LazyFrames _row(self, Py_ssize_t j):
        cdef LazyFrames lz = LazyFrames.__new__(LazyFrames)
        lz._alloc_slots(self._k)
        cdef Py_ssize_t i
        for i in range(self._k):
            lz._slots[i] = self._slots[j * self._k + i]
            lf_pool_incref(&self._pool.p, lz._slots[i])
        lz._k = self._k
        lz._pool = self._pool
        lz._code = self._code
        return lz

    def __iter__(self):
        cdef Py_ssize_t j
        for j in range(self._n):
            yield self._row(j)

    def __copy__(self):
        # frames are immutable, so a copy shares them (no frame bytes copied)
        return LazyBatch._make(self._pool, self.slots, self.layout)

    def __deepcopy__(self, memo):
        return self.__copy__()

    def __reduce__(self):
        return C.reduce_lazybatch(self)

    __hash__ = None

    def __repr__(self):
        return f"LazyBatch(shape={self.shape}, dtype={self.dtype}, layout={self.layout!r})"
