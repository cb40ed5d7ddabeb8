# FramePool and FrameRef: the arena's Python face, and how slot ids come in.
#
# Included by _core.pyx. Slot ids given as ints are only ever read: _ids copies them
# into private memory (phase 1 in _copyout.pxi), and _check_ids checks each one right
# before it is used (phase 2).
#
# Every class marks itself initialised by setting one field last (FramePool._shape,
# the owners' _pool); until then its methods raise TypeError (_uninitialised) and its
# __dealloc__ drops nothing. __init__ refuses to run twice (_fresh), checking on entry
# and again right before it commits, with no Python code after that check: a callback
# of its own arguments may have run __init__ meanwhile.


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


cdef tuple _LAYOUT_NAMES = C.LAYOUTS  # in code order (a test checks it against layout.h)


cdef lf_layout _layout_code(object layout) except *:
    """The code of a layout name: the one place the compiled core decides it.

    Only the characters of a ``str`` count: a subclass is copied to a plain ``str``
    (``PyUnicode_FromObject``) and compared as one, so none of its methods runs.

    Raises:
        ValueError: not one of ``lazyframes.LAYOUTS``.
    """
    cdef str name
    cdef int code
    if isinstance(layout, str):
        name = PyUnicode_FromObject(layout)
        for code in range(LF_NLAYOUTS):
            if name == <str>_LAYOUT_NAMES[code]:
                return <lf_layout>code
    raise ValueError(f"layout must be one of {C.LAYOUTS}, got {layout!r}")


cdef int64_t _one_id(FramePool pool, object x) except? -1:
    """One slot id: an int (``operator.index``; not a bool) or a FrameRef of ``pool``."""
    if type(x) is FrameRef:
        return (<FrameRef>x)._slot_of(pool)
    try:
        if type(x) is bool:
            raise TypeError
        v = x if type(x) is int else operator.index(x)
    except TypeError:
        raise TypeError(f"a slot id must be an int or a FrameRef, got {type(x).__name__}") from None
    if not -INT64_MAX - 1 <= v <= INT64_MAX:
        raise IndexError(f"slot {v} is out of range for this pool")
    return v


cdef cnp.ndarray _ids(FramePool pool, object slots, list hold):
    """``slots`` (ints or FrameRefs of ``pool``, any shape) as a private C-contiguous int64 copy.

    The copy belongs to the caller: Python code that runs later (another argument's
    ``__index__`` or ``__array__``) cannot change the ids it holds. The FrameRefs among
    ``slots`` are appended to ``hold`` (in a private tuple or list), which the caller
    keeps until it has taken its references: a callback that empties the caller's
    list cannot free their frames and have the slots reused (ABA).
    """
    cdef cnp.ndarray arr
    cdef cnp.npy_intp n, i
    cdef int64_t *a
    if type(slots) is list or type(slots) is tuple:  # the common case, without NumPy
        slots = tuple(slots)
        hold.append(slots)
        n = len(<tuple>slots)
        arr = cnp.PyArray_EMPTY(1, &n, cnp.NPY_INT64, 0)
        a = <int64_t *>cnp.PyArray_DATA(arr)
        for i in range(n):
            x = (<tuple>slots)[i]
            if type(x) is not int and type(x) is not FrameRef:
                break
            a[i] = _one_id(pool, x)
        else:
            return arr
    elif (cnp.PyArray_CheckExact(slots) and cnp.PyArray_TYPE(<cnp.ndarray>slots) == cnp.NPY_INT64
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>slots)):  # the other common case
        return cnp.PyArray_NewCopy(<cnp.ndarray>slots, cnp.NPY_CORDER)
    src = np.asarray(slots)
    if src.dtype == object:
        flat = list(src.ravel())
        hold.append(flat)
        return np.array([_one_id(pool, x) for x in flat], dtype=np.int64).reshape(src.shape)
    if src.dtype.kind not in "iu" and not (src.size == 0 and src.dtype.kind == "f"):
        raise TypeError(f"slot ids must be integers, got dtype {src.dtype}")
    if src.dtype.kind == "u" and src.size and src.max() > INT64_MAX:  # would wrap to < 0
        raise IndexError(f"slot {int(src.max())} is out of range for this pool")
    return np.array(src, dtype=np.int64, order="C", copy=True)


cdef cnp.ndarray _row_ids(object rows, Py_ssize_t n, bint distinct):
    """Row indices as a private 1-D int64 copy, each ``0 <= r < n`` (and distinct if asked).

    Compared, never computed with, so no value (``2**63 - 1``, a huge uint64) can wrap.
    The common inputs (an int64 or int32 array, a list of ints) are checked in C;
    anything else, and any error, goes through ``_as_rows``, which raises.
    """
    cdef cnp.ndarray a = None
    cdef cnp.npy_intp m, i, j
    cdef int64_t *r
    if type(rows) is list:
        m = len(rows)
        a = cnp.PyArray_EMPTY(1, &m, cnp.NPY_INT64, 0)
        r = <int64_t *>cnp.PyArray_DATA(a)
        for i in range(m):
            x = rows[i]
            if type(x) is not int or not 0 <= x < n:
                a = None
                break
            r[i] = x
    elif (cnp.PyArray_CheckExact(rows) and cnp.PyArray_NDIM(<cnp.ndarray>rows) == 1
            and cnp.PyArray_TYPE(<cnp.ndarray>rows) in (cnp.NPY_INT64, cnp.NPY_INT32)):
        # a private int64 copy (int32 widens exactly: a replay buffer's own row arrays)
        a = cnp.PyArray_Cast(<cnp.ndarray>rows, cnp.NPY_INT64)
        r = <int64_t *>cnp.PyArray_DATA(a)
        for i in range(a.shape[0]):
            if r[i] < 0 or r[i] >= n:
                a = None
                break
    if a is not None and distinct:
        if a.shape[0] <= 32:
            for i in range(a.shape[0]):
                for j in range(i):
                    if r[i] == r[j]:
                        a = None
                        break
                if a is None:
                    break
        elif np.unique(a).shape[0] != a.shape[0]:
            a = None
    if a is None:
        a = np.ascontiguousarray(_as_rows(rows, n, distinct=distinct), dtype=np.int64)
    return a


cdef int _check_ids(lf_pool *p, const int64_t *a, Py_ssize_t n) except -1:
    """Raise unless every id is a live slot of ``p`` (no Python code runs otherwise)."""
    cdef Py_ssize_t i
    for i in range(n):
        if not lf_pool_is_live(p, a[i]):
            if not lf_pool_in_range(p, a[i]):
                raise IndexError(f"slot {a[i]} is out of range for this pool")
            raise ValueError(f"slot {a[i]} is free (its frame was released)")
    return 0


cdef inline void _incref_all(lf_pool *p, const int64_t *a, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):  # hints first: the refcounts' cache misses overlap
        lf_pool_prefetch_ref(p, a[i])
    for i in range(n):
        lf_pool_incref(p, a[i])


cdef inline void _decref_all(lf_pool *p, const int64_t *a, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):  # (as _incref_all: a batch's copy out has evicted them since)
        lf_pool_prefetch_ref(p, a[i])
    for i in range(n):
        lf_pool_decref(p, a[i])


cdef bint _layout_fits(str name, tuple shape):
    """Whether ``C.check_layout`` accepts layout ``name`` for frames of ``shape``."""
    try:
        C.check_layout(name, shape)
    except ValueError:
        return False
    return True


_CODEC_CODES = {"lz4": LF_CODEC_LZ4, "lz4hc": LF_CODEC_LZ4HC, "zstd": LF_CODEC_ZSTD}
_CODEC_NAMES = {v: k for k, v in _CODEC_CODES.items()}


cdef bint _codec(object compress, lf_codec *c) except -1:
    """Phase 1: the options ``compress`` (checked by ``C.compression``) into ``c``.

    Returns:
        False when ``compress`` turns compression off (``c`` untouched), else True.
    """
    opts = C.compression(compress)
    if opts is None:
        return False
    c.codec = _CODEC_CODES[opts["codec"]]
    c.level = opts["level"]
    c.group = opts["group"]
    return True


cdef dict _codec_options(lf_codec c):
    """The options ``{"codec", "level", "group"}`` of ``c``."""
    return {"codec": _CODEC_NAMES[c.codec], "level": c.level, "group": c.group}


cdef object _uninitialised(object obj):
    raise TypeError(f"this {type(obj).__name__} was not initialised")


cdef inline int _fresh(object obj, bint initialised) except -1:
    """RuntimeError if ``obj.__init__`` already ran (see the top of this file)."""
    if initialised:
        raise RuntimeError(f"{type(obj).__name__}.__init__ called twice")
    return 0


@cython.final
@cython.no_gc
cdef class FrameRef:
    """One reference on one frame of a :class:`FramePool`; pickles as the frame itself.

    Made by :meth:`FramePool.push` (there is no public constructor). ``slot`` is
    information only: passing the FrameRef itself (to :meth:`FramePool.lazy`,
    :meth:`FramePool.get`, ...) is what keeps the frame alive. A FrameRef is not an
    int. It pickles as its frame; unpickling pushes the frame into :func:`default_pool`.

    Example:
        >>> pool = FramePool((2, 2, 1), np.uint8)
        >>> ref = pool.push(np.ones((2, 2, 1), np.uint8))
        >>> ref.pool is pool, pool.refcount(ref)
        (True, 1)
        >>> del ref; pool.live_frames
        0
    """

    cdef FramePool _pool  # None when uninitialised (FrameRef.__new__(FrameRef))
    cdef int64_t _slot
    cdef object __weakref__

    def __init__(self, *args, **kwargs):
        raise TypeError("FrameRef has no public constructor; FramePool.push returns one")

    @staticmethod
    cdef FrameRef _own(FramePool pool, int64_t slot):
        """A FrameRef taking over one reference the caller holds on a live ``slot``."""
        cdef FrameRef r = FrameRef.__new__(FrameRef)
        r._pool = pool
        r._slot = slot
        return r

    def __dealloc__(self):
        if self._pool is not None:
            lf_pool_decref(&self._pool.p, self._slot)

    cdef int64_t _slot_of(self, FramePool pool) except? -1:
        """The slot id, checking that this FrameRef is initialised and of ``pool``."""
        if self._pool is not pool:
            if self._pool is None:
                _uninitialised(self)
            raise ValueError("this FrameRef belongs to another pool")
        return self._slot

    @property
    def pool(self):
        """The pool holding the frame."""
        if self._pool is None:
            _uninitialised(self)
        return self._pool

    @property
    def slot(self):
        """The frame's slot id in :attr:`pool` (the int owns nothing; this FrameRef does)."""
        if self._pool is None:
            _uninitialised(self)
        return self._slot

    def __reduce__(self):
        if self._pool is None:
            _uninitialised(self)
        return _restore_frame, (self._pool.get(self),)

    def __repr__(self):
        if self._pool is None:
            _uninitialised(self)
        pool = self._pool
        return f"FrameRef(slot={self._slot}, frame_shape={pool._shape}, dtype={pool._dtype})"


@cython.final
@cython.no_gc  # holds no strong reference to anything that could refer back to it
cdef class FramePool:
    """FramePool(frame_shape, dtype, *, chunk_bytes=1048576, compress=False)
--

A refcounted store of frames of one shape and dtype, in a chunked arena.

    Each frame is copied in once (:meth:`push`) and lives in a slot until its refcount
    drops to zero; the slot is then reused. Chunks hold the largest power of two of
    slots that fits ``chunk_bytes`` (at least one, at most 16,384) and never move; a
    chunk whose slots are all free is returned to the OS (one empty chunk is kept to
    avoid churn).

    References are owned by objects, never by bare ints: a :class:`FrameRef` (one
    frame), :class:`LazyFrames` (one observation), :class:`LazyBatch` (a batch of
    observations) or :class:`SlotTable` (a replay buffer's store). A frame is freed when
    its last owner is dropped. Methods that read slot ids given as ints (:meth:`get`,
    :meth:`lazy`, :meth:`gather`, ...) check each id right before use.

    With ``compress``, each frame has its own buffer instead of an arena slot, and a
    frame whose only owners left are :class:`SlotTable` entries is compressed once (an
    XOR delta against the frame before it, or a keyframe; docs/COMPRESSION.md) at the
    end of the next :meth:`SlotTable.set` or :meth:`SlotTable.take`. Frames any other
    owner holds stay uncompressed; every copy out decodes compressed frames on the fly,
    with the same values.

    Args:
        frame_shape: shape ``S`` of one frame, e.g. ``(84, 84, 1)``.
        dtype: numeric dtype of the frames, e.g. ``np.uint8``.
        chunk_bytes: size of one arena chunk in bytes (default 1 MiB).
        compress: False (default), True (the default codec) or a mapping of ``codec``,
            ``level`` and ``group`` (see :meth:`enable_compression`).

    Raises:
        TypeError: non-numeric dtype or a shape that is not a tuple of ints.
        ValueError: a non-positive dimension, ``chunk_bytes`` outside
            ``[1, 2**63 - 1]``, or bad ``compress`` options. RuntimeError: ``__init__``
            called twice.

    Example:
        >>> pool = FramePool((84, 84, 1), np.uint8)
        >>> ref = pool.push(np.zeros((84, 84, 1), np.uint8))
        >>> pool.live_frames, pool.refcount(ref)
        (1, 1)
        >>> del ref; pool.live_frames
        0
    """

    cdef lf_pool p
    cdef tuple _shape               # None until initialised
    cdef object _dtype
    cdef cnp.dtype _descr
    cdef int _ltype
    cdef size_t _itemsize
    cdef int _nd
    cdef cnp.npy_intp _dims[MAX_NDIM]
    cdef size_t _outer[LF_NLAYOUTS]
    cdef size_t _inner[LF_NLAYOUTS]
    cdef bint _fits[LF_NLAYOUTS]  # whether each layout fits the frame shape (set by __init__)
    # Why a pool holds Python objects: _refs maps a live slot to its FrameRef, weakly, so
    # the observations pickled in one dump share each frame (LazyFrames.__reduce__);
    # _by_id maps id(ndarray) to (weakref, slot) so LazyFrames(list) stores an ndarray
    # passed k times once (_push_known). Neither is trusted: _ref_of checks what it reads.
    cdef object _refs
    cdef dict _by_id
    cdef object __weakref__

    def __cinit__(self):
        self.p.spc = 0
        self._refs = weakref.WeakValueDictionary()
        self._by_id = {}

    def __init__(self, frame_shape, dtype, *, chunk_bytes=C.DEFAULT_CHUNK_BYTES, compress=False):
        _fresh(self, self._shape is not None)
        shape = C.frame_shape(frame_shape)
        dt = C.frame_dtype(dtype)
        chunk = operator.index(chunk_bytes)
        if chunk <= 0:
            raise ValueError(f"chunk_bytes must be positive, got {chunk}")
        if chunk > INT64_MAX:
            raise ValueError(f"chunk_bytes must be at most 2**63 - 1, got {chunk}")
        cdef lf_codec codec
        cdef bint compressed = _codec(compress, &codec)
        nbytes = math.prod(shape) * dt.itemsize  # a Python int: it cannot wrap
        if nbytes > INT64_MAX:
            raise MemoryError(f"frames of shape {shape} and dtype {dt} are too large")
        fits = [_layout_fits(name, shape) for name in _LAYOUT_NAMES]
        cdef int ltype = _lf_type(dt)
        cdef Py_ssize_t itemsize = dt.itemsize, nd = len(shape), i, code
        # commit: no Python code from here on
        _fresh(self, self._shape is not None)
        if lf_pool_init(&self.p, nbytes, chunk) != 0:
            raise MemoryError("cannot create the frame pool")
        self._dtype = dt
        self._descr = dt
        self._ltype = ltype
        self._itemsize = itemsize
        self._nd = nd
        for i in range(nd):
            self._dims[i] = shape[i]
        for code in range(LF_NLAYOUTS):
            lf_layout_geometry(<lf_layout>code, nbytes // itemsize, self._dims[nd - 1] if nd else 1,
                               &self._outer[code], &self._inner[code])
            # scalar frames cannot be concatenated, whatever a Python check says
            self._fits[code] = fits[code] and (code == LF_STACK or nd > 0)
        if compressed:
            self._compress(codec)
        self._shape = shape  # last: marks the pool initialised

    def __dealloc__(self):
        lf_pool_free(&self.p)

    cdef inline int _ready(self) except -1:
        if self._shape is None:
            _uninitialised(self)
        return 0

    @property
    def frame_shape(self):
        """Shape ``S`` of one frame."""
        self._ready()
        return self._shape

    @property
    def dtype(self):
        """The dtype of the stored frames (native byte order)."""
        self._ready()
        return self._dtype

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
        """Bytes of frame memory currently held (see :meth:`stats`)."""
        return lf_pool_bytes_held(&self.p)

    @property
    def peak_bytes(self):
        """Largest :attr:`bytes_held` so far."""
        return self.p.peak_bytes

    @property
    def compression(self):
        """None, or the compression options ``{"codec", "level", "group"}`` of this pool."""
        self._ready()
        if self.p.z == NULL:
            return None
        return _codec_options(lf_pool_codec(&self.p))

    def enable_compression(self, compress=True):
        """Compress this pool's frames from now on (see the class docstring); idempotent.

        Frames live already stay uncompressed until their only owners are SlotTable
        entries. How a replay buffer adopts the pool of the wrappers feeding it.

        Args:
            compress: True (the default options; a pool that compresses already keeps
                its own) or a mapping of ``codec`` (``"lz4"``,
                ``"lz4hc"`` or ``"zstd"``), ``level`` (1 to 9) and ``group`` (1 to 64:
                at most one keyframe in ``group`` frames; the frame at position ``p`` of
                its group decodes from ``p + 1`` compressed blobs, one more for a frame
                equal to one shortly before it, and its root, a raw frame, when
                ``group > 1``; a batch decodes each blob once).

        Raises:
            TypeError, ValueError: bad options, or options other than the pool's own
                when it compresses already (nothing changes then).
            MemoryError: no memory for the frames' buffers.
            RuntimeError: a copy out of this pool runs in another thread without the GIL.
        """
        self._ready()
        cdef lf_codec c
        if not _codec(compress, &c):
            raise ValueError("enable_compression needs compress=True or a mapping of options")
        if compress is True and self.p.z != NULL:  # compressing already, with its options
            return
        self._compress(c)

    cdef int _compress(self, lf_codec c) except -1:
        """Phase 2: make the pool compress with ``c`` (the messages run Python on failure only)."""
        cdef int rc = lf_pool_enable_compression(&self.p, c)
        if rc == -1:
            raise MemoryError("no memory to make the pool compress")
        if rc == -2:
            raise ValueError(f"frames of {self.p.frame_bytes} bytes are too large to compress")
        if rc == -3:
            raise ValueError(
                f"the pool already compresses with {self.compression}; cannot switch to "
                f"{_codec_options(c)}"
            )
        if rc == -4:
            raise RuntimeError(
                "a copy out of this pool is running in another thread; enable compression first"
            )
        return 0

    def flush(self):
        """Compress now every frame whose only owners left are SlotTable entries.

        A compressing pool compresses such frames at the end of every
        :meth:`SlotTable.set` and :meth:`SlotTable.take`; a frame whose last other owner
        (an observation, a batch) goes later waits for the next of those, or this call.
        Nothing to do for a pool that does not compress.

        Raises:
            MemoryError: no memory to compress (the frames wait, uncompressed).
        """
        self._ready()
        if lf_pool_compress_pending(&self.p) != 0:
            raise MemoryError("no memory to compress the pool's waiting frames")

    def stats(self):
        """Frame counts and bytes, as a dict.

        ``bytes_held`` counts the arena chunks, or in a compressing pool the frames'
        uncompressed buffers (``hot_frames``, plus a few kept to code the next delta
        against), their compressed blobs (``cold_bytes``), the per-slot state
        (``slot_state_bytes``: 0 in a plain pool) and the decoding scratch a gather lends
        to the next one. ``pending_frames``: hot frames that only SlotTable entries hold,
        waiting to be compressed (:meth:`flush`).
        """
        return {
            "live_frames": self.live_frames,
            "live_bytes": self.live_bytes,
            "capacity": self.capacity,
            "frame_bytes": self.frame_bytes,
            "bytes_held": self.bytes_held,
            "peak_bytes": self.peak_bytes,
            "hot_frames": self.p.live_frames - self.p.cold_frames,
            "cold_frames": self.p.cold_frames,
            "cold_bytes": self.p.cold_bytes,
            "slot_state_bytes": lf_pool_slot_state_bytes(&self.p),
            "pending_frames": lf_pool_pending(&self.p),
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
    cdef lf_layout _layout(self, object layout) except *:
        """The code of ``layout``, refused unless it fits the frame shape (decided at init).

        Raises:
            ValueError: an unknown layout, or one that does not fit (``C.check_layout``).
        """
        self._ready()
        cdef lf_layout code = _layout_code(layout)
        if not self._fits[<int>code]:
            C.check_layout(_LAYOUT_NAMES[code], self._shape)  # raises, naming the frame shape
            raise ValueError(  # scalar frames, whatever check_layout says
                f"scalar frames cannot be concatenated (layout={_LAYOUT_NAMES[code]!r}); use "
                "layout='stack'"
            )
        return code

    cdef int _obs_dims(self, lf_layout code, Py_ssize_t k, cnp.npy_intp *dims) noexcept:
        """Write the shape of one observation of k frames into dims; returns its ndim."""
        return lf_layout_obs_shape(code, self._dims, self._nd, k, dims)

    cdef tuple _obs_shape(self, lf_layout code, Py_ssize_t k):
        cdef cnp.npy_intp dims[MAX_NDIM + 1]
        cdef int nd = self._obs_dims(code, k, dims)
        return tuple([dims[i] for i in range(nd)])

    cdef cnp.ndarray _as_frames(self, object frames, int lead):
        """``frames`` as a checked ndarray ``(*lead, *S)`` of the pool's dtype."""
        cdef cnp.ndarray arr
        cdef int i
        self._ready()
        if cnp.PyArray_CheckExact(frames):
            arr = <cnp.ndarray>frames
            if cnp.PyArray_NDIM(arr) == self._nd + lead and arr.descr is self._descr:
                for i in range(self._nd):
                    if cnp.PyArray_DIMS(arr)[i + lead] != self._dims[i]:
                        break
                else:
                    return arr
        if lead == 0:
            return C.as_frame(frames, self._shape, self._dtype)
        return C.as_frames(frames, self._shape, self._dtype, "n" if lead == 1 else "E, k")

    cdef int _push_into(self, cnp.ndarray arr, Py_ssize_t n, int64_t *out) except -1:
        """Copy the n frames of checked ``arr`` into n new slots: the one copy in (phase 2).

        ``out`` receives the ids, one reference each. No Python code runs: a strided
        ``arr`` is copied by NumPy's C API into an ndarray over the slot.
        """
        cdef Py_ssize_t i
        cdef int64_t s
        cdef size_t fb = self.p.frame_bytes
        cdef cnp.ndarray slot_view
        for i in range(n):
            s = lf_pool_alloc(&self.p)
            if s < 0:
                _decref_all(&self.p, out, i)
                raise MemoryError("the frame pool cannot grow")
            out[i] = s
        if cnp.PyArray_IS_C_CONTIGUOUS(arr):
            for i in range(n):
                memcpy(lf_pool_addr(&self.p, out[i]),
                       <unsigned char *>cnp.PyArray_DATA(arr) + i * fb, fb)
            return 0
        try:
            for i in range(n):
                slot_view = cnp.PyArray_SimpleNewFromData(
                    self._nd, self._dims, self._descr.type_num, lf_pool_addr(&self.p, out[i]))
                cnp.PyArray_CopyInto(slot_view, arr[i] if cnp.PyArray_NDIM(arr) > self._nd else arr)
        except BaseException:
            _decref_all(&self.p, out, n)
            raise
        return 0

    cdef FrameRef _ref_of(self, int64_t slot):
        """The shared FrameRef of a live slot (one per slot while it lives): pickling.

        What ``_refs`` returns is checked, so tampering with it (``gc.get_objects``)
        cannot make an observation pickle another frame.
        """
        ref = self._refs.get(slot)
        if not (type(ref) is FrameRef and (<FrameRef>ref)._pool is self
                and (<FrameRef>ref)._slot == slot):
            lf_pool_incref(&self.p, slot)
            ref = FrameRef._own(self, slot)
            self._refs[slot] = ref
        return ref

    # -- single frames ------------------------------------------------------------------
    def push(self, frame):
        """Copy one frame into a free slot; the returned :class:`FrameRef` owns its reference.

        The FrameRef owns the one reference of the new slot: the frame lives until it
        (and every observation made from it) is dropped. Views, read-only and
        non-contiguous arrays are accepted; the frame is copied exactly once.

        Args:
            frame: an array-like of shape :attr:`frame_shape` and dtype :attr:`dtype`.

        Returns:
            A new :class:`FrameRef`.

        Raises:
            TypeError: object arrays or a dtype other than :attr:`dtype`.
            ValueError: a shape other than :attr:`frame_shape`.
        """
        cdef cnp.ndarray arr = self._as_frames(frame, 0)
        cdef int64_t s
        self._push_into(arr, 1, &s)
        return FrameRef._own(self, s)

    def _push_known(self, obj, arr):
        """:meth:`push`, reusing the slot of the same ndarray ``obj`` if its bytes are unchanged.

        How ``LazyFrames(list_of_frames)`` stores a frame once when baselines'
        FrameStack passes the same ndarray to k consecutive observations: the pool
        remembers (weakly) which slot each ndarray was last copied into.

        Returns:
            A new :class:`FrameRef`.
        """
        cdef cnp.ndarray a = self._as_frames(arr, 0)
        cdef int64_t s
        key = id(obj)
        hit = self._by_id.get(key)
        if hit is not None and hit[0]() is obj:
            s = hit[1]
            if lf_pool_is_live(&self.p, s) and lf_pool_is_hot(&self.p, s) and \
                    cnp.PyArray_IS_C_CONTIGUOUS(a) and memcmp(
                    lf_pool_addr(&self.p, s), cnp.PyArray_DATA(a), self.p.frame_bytes) == 0:
                lf_pool_incref(&self.p, s)
                return FrameRef._own(self, s)
        ref = self.push(a)
        if isinstance(obj, np.ndarray):
            pool = weakref.ref(self)

            def forget(wr, key=key):
                p = pool()
                if p is not None:
                    p._forget(key, wr)

            self._by_id[key] = (weakref.ref(obj, forget), (<FrameRef>ref)._slot)
        return ref

    def _forget(self, key, wr):
        """Drop the dedupe entry of a dead ndarray (weakref callback of :meth:`_push_known`)."""
        hit = self._by_id.get(key)
        if hit is not None and hit[0] is wr:
            del self._by_id[key]

    cdef cnp.ndarray _get(self, int64_t slot):
        """A copy of the frame of a live slot (checked by the caller)."""
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(self._nd, self._dims, self._descr.type_num, 0)
        if lf_pool_read(&self.p, slot, <unsigned char *>cnp.PyArray_DATA(out)) != 0:
            raise RuntimeError(f"the compressed frame in slot {slot} does not decode: the "
                               f"pool's memory is corrupted")
        return out

    def get(self, slot):
        """A copy of the frame in ``slot``, shape :attr:`frame_shape`.

        Args:
            slot: a :class:`FrameRef` of this pool, or a slot id (int).

        Raises:
            IndexError: an id out of range. ValueError: a free slot, or a FrameRef of
                another pool.
        """
        self._ready()
        cdef int64_t s = _one_id(self, slot)
        _check_ids(&self.p, &s, 1)
        return self._get(s)

    def _chain(self, slot):
        """The slots a frame decodes from, itself first, its keyframe last; [] when hot (tests).

        Raises:
            IndexError, ValueError: as :meth:`get`.
        """
        self._ready()
        cdef int64_t s = _one_id(self, slot)
        _check_ids(&self.p, &s, 1)
        cdef int64_t chain[LF_MAX_CHAIN]
        if lf_pool_is_hot(&self.p, s):
            return []
        cdef int n = lf_pool_chain(&self.p, s, chain)
        return [chain[i] for i in range(n)]

    def refcount(self, slot):
        """References held on ``slot`` (0 for a free slot in range).

        Args:
            slot: a :class:`FrameRef` of this pool (its own reference counts), or an int.

        Raises:
            IndexError: an id out of range. ValueError: a FrameRef of another pool.
        """
        self._ready()
        cdef int64_t s = _one_id(self, slot)
        if not lf_pool_in_range(&self.p, s):
            raise IndexError(f"slot {s} is out of range for this pool")
        return lf_pool_refcount(&self.p, s)

    # -- owners -------------------------------------------------------------------------
    def lazy(self, slots, *, layout="last"):
        """A :class:`LazyFrames` over ``k`` slots (ints or FrameRefs), oldest first.

        The observation takes its own reference on each frame.

        Args:
            slots: a non-empty 1-D sequence of :class:`FrameRef` of this pool or slot ids.
            layout: ``"last"``, ``"first"`` or ``"stack"`` (see ``lazyframes.LAYOUTS``).

        Raises:
            IndexError, ValueError: an id out of range or free, a FrameRef of another
                pool, an empty or non-1-D ``slots``, or a layout that does not fit.
        """
        self._ready()
        hold = []
        cdef cnp.ndarray a = _ids(self, slots, hold)
        if cnp.PyArray_NDIM(a) != 1 or cnp.PyArray_SIZE(a) == 0:
            raise ValueError(
                f"slots must be a non-empty 1-D sequence, got shape {(<object>a).shape}"
            )
        cdef lf_layout code = self._layout(layout)
        return _lazy_from(self, code, <const int64_t *>cnp.PyArray_DATA(a), cnp.PyArray_SIZE(a),
                          True)

    def lazy_batch(self, slots, *, layout="stack"):
        """A :class:`LazyBatch` over ``(n, k)`` slots (ints or FrameRefs), a row per observation.

        Takes its own reference on each frame; copies no frame bytes.

        Args:
            slots: ``(n, k)`` slot ids or :class:`FrameRef` of this pool, ``k >= 1``.
            layout: ``"last"``, ``"first"`` or ``"stack"``.

        Raises:
            IndexError, ValueError: as :meth:`lazy`; ValueError for a bad shape.
        """
        self._ready()
        hold = []
        cdef cnp.ndarray a = _ids(self, slots, hold)
        if cnp.PyArray_NDIM(a) != 2 or a.shape[1] == 0:
            raise ValueError(f"slots must have shape (n, k) with k >= 1, got {(<object>a).shape}")
        cdef lf_layout code = self._layout(layout)
        return _batch_from(self, code, <const int64_t *>cnp.PyArray_DATA(a), a.shape[0],
                           a.shape[1], True)

    def push_batch(self, frames, *, k=1, pad=None, layout="stack"):
        """Push ``n`` frames; row i of the result is ``k - 1`` pads then frame i.

        Row i of the result is ``[p] * (k - 1) + [frame i]``, where ``p`` is ``pad`` or,
        when ``pad`` is None, frame i itself (reset padding). This is the first
        observation of ``n`` sub-environments, and how a checkpoint loads its frames
        (``k=1``).

        Args:
            frames: an array ``(n, *S)``, ``n >= 1``.
            k: frames per observation, ``k >= 1``.
            pad: None, or a :class:`FrameRef` of this pool.
            layout: ``"last"``, ``"first"`` or ``"stack"``.

        Raises:
            TypeError, ValueError: frames of the wrong dtype or shape, no frames, a bad
                ``k`` (``k < 1`` or too many ids) or ``pad``. Checked before any frame
                is stored.
        """
        self._ready()
        cdef Py_ssize_t kk = C.stack_size(k)
        _check_pad(self, pad)
        cdef lf_layout code = self._layout(layout)
        cdef cnp.ndarray arr = self._as_frames(frames, 1)  # last: see _copyout.pxi
        if arr.shape[0] == 0:
            raise ValueError("push_batch needs at least one frame")
        return _step(self, code, None, kk, arr, NULL, pad)

    def adopt(self, payload, offsets, kinds):
        """Store the frames of an :func:`encode_frames` container as they are coded.

        Its blobs become this pool's compressed frames, neither decoded nor compressed
        again: how a :class:`~lazyframes.transport.Receiver` stores a message's frames. A
        compressed frame that came this way decodes like one the pool compressed itself.

        Args:
            payload, offsets, kinds: a container of this pool's frames, of kinds
                ``KIND_KEY``, ``KIND_PATCH``, ``KIND_PACKED`` (``encode_frames`` makes no
                others) and ``KIND_XOR``.

        Returns:
            A :class:`LazyBatch` ``(n, 1)`` of the frames, ``"stack"`` layout.

        Raises:
            ValueError: a pool that does not compress, a container that is not valid or
                has another kind of blob, a blob that does not decode (naming it: each
                is checked first, a codec blob decompressed into scratch, a patch applied
                there). Nothing is stored then.
            MemoryError: no memory for the frames.
        """
        self._ready()
        if self.p.z == NULL:
            raise ValueError("adopt needs a compressing pool (enable_compression)")
        data, offs, kds = _check_container(payload, offsets, kinds, self.p.frame_bytes)
        cdef Py_ssize_t n = kds.shape[0]
        cdef LazyBatch b = _new_batch(LF_STACK, n, 1)
        if n == 0:
            b._pool = self
            return b
        cdef const unsigned char *pl = <const unsigned char *>cnp.PyArray_DATA(data)  # may be empty
        cdef const int64_t[::1] off = offs
        cdef const uint8_t[::1] kd = kds
        cdef size_t bad = 0
        cdef int rc = lf_pool_adopt(&self.p, pl, &off[0], &kd[0], n, b._slots, &bad)
        if rc == -1:
            raise MemoryError("no memory for the adopted frames")
        if rc == -2:
            raise ValueError(
                f"blob {bad} of the container does not decode to a frame of "
                f"{self.p.frame_bytes} bytes as a keyframe, patch or XOR blob of its group"
            )
        b._n = n
        b._pool = self  # last: from here on, dealloc drops the references
        return b

    def _push_dedup(self, frames, candidates=None, next_frames=None):
        """Push ``(E, k, *S)`` frames (or ``(k, *S)``: one observation) as a :class:`LazyBatch`,
        reusing slots whose bytes are equal.

        Frame j of row e reuses, in this order, one of the last k frames of row e of
        ``candidates`` (a LazyBatch ``(E, m)`` of this pool, e.g. that env's previous
        observation) with equal bytes, or an earlier frame of the same row with equal
        bytes (reset padding); otherwise it is copied into a new slot. In a compressing
        pool, a frame equal to an earlier frame after the observation's padding (a static
        screen, or flicker) is copied into a new slot too, unless it is the candidate that
        shifted observation has there: a stream's frames stay the chain a
        :class:`SlotTable` stores its rows along, and the pool stores such a frame as an
        empty patch (where a plain pool would store the whole frame again). This is
        how observations that arrive as plain stacked arrays (EnvPool, SB3's
        VecFrameStack) cost one new frame per step. The result has the ``"stack"``
        layout.

        ``next_frames``: optional frames of the same shape (each row's next observation),
        pushed likewise after each row's frames, with that row's frames as candidates: the
        result is then one batch ``(E, 2k)`` of both.

        Raises:
            TypeError, ValueError: frames of the wrong dtype or shape, candidates of
                another pool or with another number of rows. Checked first.
        """
        self._ready()
        cdef bint one = cnp.PyArray_Check(frames) and cnp.PyArray_NDIM(frames) == self._nd + 1
        cdef cnp.ndarray arr = self._as_frames(frames, 1 if one else 2)
        cdef Py_ssize_t E = 1 if one else arr.shape[0], k = arr.shape[0 if one else 1]
        cdef cnp.ndarray nxt = None
        if next_frames is not None:
            nxt = self._as_frames(next_frames, 1 if one else 2)
            if nxt.shape[0] != arr.shape[0] or (not one and nxt.shape[1] != k):
                raise ValueError(f"next_frames has shape {(<object>nxt).shape}, frames "
                                 f"{(<object>arr).shape}")
        cdef LazyBatch cand = None
        if candidates is not None:
            cand = _check_batch(self, candidates, "candidates", "a LazyBatch or None")
            if cand._n != E:
                raise ValueError(f"candidates has {cand._n} rows, expected {E}")
        if not cnp.PyArray_IS_C_CONTIGUOUS(arr):  # checked above: no Python code runs
            arr = np.ascontiguousarray(arr)
        if nxt is None:
            return _dedup(self, (arr,), E, k, cand)
        if not cnp.PyArray_IS_C_CONTIGUOUS(nxt):
            nxt = np.ascontiguousarray(nxt)
        return _dedup(self, (arr, nxt), E, k, cand)

    def gather(self, slots, out=None, *, layout="last", dtype=None, scale=None):
        """Copy ``B`` observations of ``k`` slots each (ints ``(B, k)``) into one array.

        One C call with the GIL released; dtype conversion and ``scale`` are fused into
        the copy. Everything is checked before anything is written.

        Args:
            slots: ``(B, k)`` slot ids or :class:`FrameRef` of this pool.
            out: optional C-contiguous writeable ndarray to fill; it may not overlap
                ``slots``.
            layout: ``"last"``, ``"first"`` or ``"stack"``.
            dtype: output dtype (same-kind casts, e.g. uint8 -> float32).
            scale: multiply by this after converting (float output dtypes only).

        Returns:
            ``out``, or a new array.

        Raises:
            IndexError, ValueError: bad slot ids; TypeError/ValueError: a bad ``out``,
                ``dtype`` or ``scale``, or ``out`` overlapping ``slots``.
        """
        self._ready()
        hold = []
        cdef cnp.ndarray a = _ids(self, slots, hold)
        if cnp.PyArray_NDIM(a) != 2 or a.shape[1] == 0:
            raise ValueError(f"slots must have shape (B, k) with k >= 1, got {(<object>a).shape}")
        cdef lf_layout code = self._layout(layout)
        if not _apart(out, slots):
            _check_no_overlap(out, {"slots": slots})
        cdef _Copy c
        memset(&c, 0, sizeof(c))
        c.n_out = 1
        res = _output(self, code, a.shape[0], a.shape[1], out, dtype, scale, &c, 0)
        c.ids = <const int64_t *>cnp.PyArray_DATA(a)
        _copy(&c)
        return res
