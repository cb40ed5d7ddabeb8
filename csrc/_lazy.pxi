# LazyFrames (one observation), LazyBatch (n observations) and stack().
#
# Included by _core.pyx. Both owners hold one reference per frame id in a private C
# array that never changes after construction; dropping the owner drops them. Every
# owner is made by _new_lazy or _new_batch, which refuse k < 1: an owner has at least
# one frame per observation, so shift can always keep k - 1 and add one.

_COPY_FALSE = (
    "a LazyFrames observation is not stored as one array, so it cannot be converted "
    "without a copy (copy=False). Use np.asarray(obs) (copies once, as NumPy 2 expects), "
    "or lazyframes.stack(observations, out=...) to fill a preallocated batch; the old "
    "idiom np.array(obs, copy=False) meant 'copy only if needed', which is "
    "np.asarray(obs) in NumPy 2"
)


cdef object _array_protocol(object fused, object dtype, object copy):
    """``__array__(dtype, copy)`` of an observation or a batch (NumPy 2 protocol).

    ``fused(dtype)`` is the one copy out with the conversion fused; a conversion the
    kernels do not fuse (e.g. float16 frames, or a cast NumPy calls unsafe) is done as
    NumPy would, on the copied-out array.
    """
    if copy is False:
        raise ValueError(_COPY_FALSE)
    if dtype is None:
        return fused(None)
    try:
        return fused(dtype)
    except TypeError:
        return fused(None).astype(dtype)


cdef object _dlpack(object x, object stream, object max_version, object dl_device, object copy):
    """``x.__dlpack__(...)``: a DLPack capsule of a fresh materialised array.

    This is what makes ``torch.as_tensor(obs)`` / ``torch.tensor(obs)`` and
    ``np.from_dlpack(obs)`` take one copy out instead of walking the sequence protocol
    (row by row, ~1000x slower; case C05). ``copy=False`` raises BufferError: a copy
    cannot be avoided.
    """
    if copy is False:
        raise BufferError(_COPY_FALSE)
    kwargs = {"stream": stream, "dl_device": dl_device, "copy": copy}
    if max_version is not None:
        kwargs["max_version"] = max_version
    return np.asarray(x).__dlpack__(**kwargs)


cdef object _equal(object x, object other):
    """``x == other``: one bool, as ``np.array_equal`` on the materialised arrays."""
    if hasattr(other, "__array__"):
        o = np.asarray(other)
        return x.shape == o.shape and bool(np.array_equal(np.asarray(x), o))
    return NotImplemented


cdef object _index(object i, Py_ssize_t count, str what):
    """Index ``i`` of ``count`` items, negative from the end (IndexError out of range)."""
    j = operator.index(i)
    if j < 0:
        j += count
    if not 0 <= j < count:
        raise IndexError(f"index {j} is out of range for {count} {what}")
    return j


cdef int _same_geometry(LazyFrames first, LazyFrames o) except -1:
    """Observations stacked into one batch must have one geometry (``stack``).

    Raises:
        ValueError: different stack sizes, frame shapes or layouts.
        TypeError: different dtypes.
    """
    if (o.stack_size, o.frame_shape, o.layout) != (first.stack_size, first.frame_shape,
                                                   first.layout):
        raise ValueError(
            f"observations differ: {first.stack_size} frames of {first.frame_shape} "
            f"({first.layout!r}) and {o.stack_size} frames of {o.frame_shape} ({o.layout!r})"
        )
    if o.dtype != first.dtype:
        raise TypeError(f"observations have different dtypes: {first.dtype} and {o.dtype}")
    return 0


cdef LazyFrames _new_lazy(lf_layout code, Py_ssize_t k):
    """An observation with room for k ids and no references yet (the caller fills it).

    Raises:
        ValueError: ``k < 1``.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    cdef LazyFrames lz = LazyFrames.__new__(LazyFrames)
    lz._alloc(k)
    lz._code = code
    return lz


cdef LazyFrames _lazy_from(FramePool pool, lf_layout code, const int64_t *ids, Py_ssize_t k,
                           bint check):
    """A new observation over k ids of ``pool``, taking a reference on each (checked first).

    Phase 2 of ``pool.lazy`` (see _copyout.pxi): made empty first, then the ids are
    checked and their references taken with no Python code in between.
    """
    cdef LazyFrames lz = _new_lazy(code, k)
    if check:
        _check_ids(&pool.p, ids, k)
    memcpy(lz._slots, ids, k * sizeof(int64_t))
    _incref_all(&pool.p, ids, k)
    lz._k = k
    lz._pool = pool  # last: from here on, dealloc drops the references
    return lz


@cython.final
@cython.no_gc
cdef class LazyFrames:
    """LazyFrames(frames, *, layout='last')
--

k frames shown as one observation, stored once in a :class:`FramePool`.

    A drop-in for baselines' ``atari_wrappers.LazyFrames``: ``LazyFrames(frames)``
    concatenates on the last axis, and ``len``, ``[i]``, ``count()`` and ``frame(i)``
    behave as baselines' on the materialised array. Unlike baselines it never caches the
    materialised stack: ``np.asarray`` copies the frames out each time into a fresh
    array, so holding observations costs only the unique frames. The observation owns
    one reference per frame and never changes; :meth:`shift` returns a new one.

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
        >>> pool = FramePool((84, 84, 1), np.uint8)
        >>> refs = [pool.push(f) for f in frames]
        >>> obs = pool.lazy(refs)
        >>> del refs; pool.live_frames
        4
        >>> obs = obs.shift(np.zeros((84, 84, 1), np.uint8)); pool.live_frames
        4
    """

    cdef FramePool _pool            # None until initialised
    cdef int64_t *_slots            # _inline for k <= 4 (Atari's stack size), else malloc'd
    cdef int64_t _inline[4]
    cdef Py_ssize_t _k
    cdef lf_layout _code

    __array_priority__ = 10.0  # so ndarray == LazyFrames defers to __eq__

    def __cinit__(self):
        self._slots = NULL
        self._k = 0
        self._pool = None

    def __init__(self, frames, *, layout="last"):
        _fresh(self, self._pool is not None)
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
        cdef FramePool pool = default_pool(shape, dt)
        cdef lf_layout code = pool._layout(layout)
        refs = [pool._push_known(f, a) for f, a in zip(frames, arrays)]
        cdef Py_ssize_t k = len(refs), i
        # commit: no Python code from here on (refs holds the frames meanwhile)
        _fresh(self, self._pool is not None)
        self._alloc(k)
        for i in range(k):
            self._slots[i] = (<FrameRef>refs[i])._slot
        _incref_all(&pool.p, self._slots, k)
        self._k = k
        self._code = code
        self._pool = pool

    def __dealloc__(self):
        if self._pool is not None:
            _decref_all(&self._pool.p, self._slots, self._k)
        if self._slots != self._inline:
            free(self._slots)

    cdef int _alloc(self, Py_ssize_t k) except -1:
        """Room for k ids: inline for k <= 4 (Atari's stack size), else malloc'd."""
        if k <= 4:
            self._slots = self._inline
        else:
            self._slots = <int64_t *>malloc(k * sizeof(int64_t))
            if self._slots == NULL:
                raise MemoryError()
        return 0

    cdef inline int _ready(self) except -1:
        if self._pool is None:
            _uninitialised(self)
        return 0

    # -- array-likeness without materialising ----------------------------------------
    @property
    def pool(self):
        """The pool holding the frames."""
        self._ready()
        return self._pool

    @property
    def slots(self):
        """Slot ids of the k frames, oldest first."""
        self._ready()
        return tuple([self._slots[i] for i in range(self._k)])

    @property
    def layout(self):
        """``"last"``, ``"first"`` or ``"stack"``."""
        self._ready()
        return C.LAYOUTS[self._code]

    @property
    def stack_size(self):
        """k, the number of frames."""
        self._ready()
        return self._k

    @property
    def frame_shape(self):
        """Shape ``S`` of one frame."""
        self._ready()
        return self._pool._shape

    @property
    def shape(self):
        """Shape of ``np.asarray(self)``."""
        self._ready()
        return self._pool._obs_shape(self._code, self._k)

    @property
    def dtype(self):
        """The dtype of ``np.asarray(self)``."""
        self._ready()
        return self._pool._dtype

    @property
    def ndim(self):
        """Number of axes of ``np.asarray(self)``."""
        self._ready()
        return self._pool._nd + (self._code == LF_STACK)

    @property
    def size(self):
        """Number of elements of ``np.asarray(self)``."""
        self._ready()
        return self._k * self._pool.p.frame_bytes // self._pool._itemsize

    @property
    def nbytes(self):
        """Bytes of the materialised array (not of the memory held; see the pool)."""
        self._ready()
        return self._k * self._pool.p.frame_bytes

    # -- copying out ---------------------------------------------------------------
    cdef object _out(self, object dtype, object scale):
        """This observation copied out into a fresh array of :attr:`shape`."""
        return _copy_out(self._pool, self._code, self._slots, 1, self._k, None, dtype, scale, False)

    def __array__(self, dtype=None, copy=None):
        """Materialise into a fresh array (NumPy 2 protocol).

        ``copy=False`` raises ValueError: the frames are not one array, so a copy cannot
        be avoided. ``dtype`` is fused into the copy (same-kind casts).
        """
        self._ready()
        if dtype is None and copy is not False:  # the hot path of np.asarray(obs)
            return self._out(None, None)
        return _array_protocol(self._fused, dtype, copy)

    def _fused(self, dtype):
        """The copy out with ``dtype`` fused (TypeError when the kernels cannot fuse it)."""
        self._ready()
        return self._out(dtype, None)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """DLPack export of a fresh materialised array, so ``torch.as_tensor(obs)`` is fast."""
        self._ready()
        return _dlpack(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self):
        """The device of :meth:`__dlpack__`: the CPU."""
        self._ready()
        return (1, 0)  # kDLCPU, device 0

    def astype(self, dtype, *, scale=None):
        """A new array of ``dtype``, optionally times ``scale`` (fused into the copy).

        ``obs.astype(np.float32, scale=1/255)`` is baselines' ScaledFloatFrame.
        """
        self._ready()
        return self._out(dtype, scale)

    def __len__(self):
        self._ready()
        cdef cnp.npy_intp dims[MAX_NDIM + 1]
        self._pool._obs_dims(self._code, self._k, dims)
        return dims[0]

    def __getitem__(self, key):
        return np.asarray(self)[key]

    def count(self):
        """Size of the last axis of the materialised array, as baselines' ``count()``."""
        return self.shape[-1]

    def frame(self, i):
        """``np.asarray(self)[..., i]`` as baselines' ``frame(i)``: a channel when C > 1.

        Copies only what it returns in the ``"last"`` layout.

        Raises:
            IndexError: out of range.
        """
        i = _index(i, self.count(), "frames")
        if self._code == LF_LAST:
            j, ch = divmod(i, self._pool._dims[self._pool._nd - 1])
            return self._pool._get(self._slots[j])[..., ch]
        return np.asarray(self)[..., i]

    def get_frame(self, j):
        """A copy of whole frame ``j`` (0 is the oldest), shape :attr:`frame_shape`.

        Raises:
            IndexError: out of range.
        """
        self._ready()
        j = _index(j, self._k, "frames")
        return self._pool._get(self._slots[j])

    def shift(self, frame):
        """The next observation: this one's last k-1 frames, then ``frame``.

        ``frame`` is copied once into this observation's pool; the shared frames are
        not copied. This is one step of a frame stacker (baselines' ``deque(maxlen=k)``)
        in one call; ``self`` is unchanged.

        Raises:
            TypeError, ValueError: ``frame`` of the wrong dtype or shape.
        """
        self._ready()
        cdef FramePool pool = self._pool
        cdef cnp.ndarray arr = pool._as_frames(frame, 0)
        cdef Py_ssize_t k = self._k
        cdef LazyFrames lz = _new_lazy(self._code, k)
        pool._push_into(arr, 1, &lz._slots[k - 1])
        memcpy(lz._slots, self._slots + 1, (k - 1) * sizeof(int64_t))
        _incref_all(&pool.p, lz._slots, k - 1)
        lz._k = k
        lz._pool = pool
        return lz

    def copy(self):
        """A new observation sharing the same frames (no frame bytes copied)."""
        self._ready()
        return _lazy_from(self._pool, self._code, self._slots, self._k, False)

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    def __reduce__(self):
        self._ready()
        refs = tuple([self._pool._ref_of(self._slots[i]) for i in range(self._k)])
        return _restore_lazyframes, (refs, C.LAYOUTS[self._code])

    def __eq__(self, other):
        self._ready()
        return _equal(self, other)

    def __ne__(self, other):
        self._ready()
        eq = _equal(self, other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None

    def __repr__(self):
        self._ready()
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

    Example:
        >>> obs = LazyFrames([np.zeros((2, 2, 1), np.uint8)] * 4)
        >>> stack([obs, obs], dtype=np.float32, scale=1 / 255).shape
        (2, 2, 2, 4)
    """
    obs = list(observations)  # our own references: the caller's list may change meanwhile
    cdef Py_ssize_t b = len(obs), i, k
    if b == 0:
        raise ValueError("stack needs at least one observation")
    cdef LazyFrames o, first = None
    for x in obs:
        if type(x) is not LazyFrames:
            raise TypeError(
                f"stack takes LazyFrames, got {type(x).__name__}; use np.stack for ndarrays"
            )
        o = x
        o._ready()
        if first is None:
            first = o
        elif o._pool is not first._pool or o._k != first._k or o._code != first._code:
            _same_geometry(first, o)  # raises unless only the pools differ
    k = first._k
    cdef FramePool fp = first._pool
    cdef _Copy c
    memset(&c, 0, sizeof(c))
    c.n_out = 1
    res = _output(fp, first._code, b, k, out, dtype, scale, &c, 0)
    cdef int64_t *ids = <int64_t *>malloc(max(1, b * k) * sizeof(int64_t))
    cdef lf_pool **pools = <lf_pool **>malloc(max(1, b) * sizeof(lf_pool *))
    try:
        if ids == NULL or pools == NULL:
            raise MemoryError()
        for i in range(b):
            o = obs[i]
            memcpy(ids + i * k, o._slots, k * sizeof(int64_t))
            pools[i] = &o._pool.p
        c.ids = ids
        c.pools = pools
        _copy(&c)
    finally:
        free(ids)
        free(pools)
    return res


cdef LazyBatch _new_batch(lf_layout code, Py_ssize_t n, Py_ssize_t k):
    """A batch with room for n * k ids and no references yet (the caller fills it).

    Raises:
        ValueError: ``k < 1``, or more ids than 2**63 - 1 bytes hold.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if k > (<Py_ssize_t>(INT64_MAX // 8)) // max(1, n):  # compared, not multiplied
        raise ValueError(f"a batch of {n} x {k} frames is too large")
    cdef LazyBatch b = LazyBatch.__new__(LazyBatch)
    b._slots = <int64_t *>malloc(max(1, n * k) * sizeof(int64_t))
    if b._slots == NULL:
        raise MemoryError()
    b._k = k
    b._code = code
    return b


cdef LazyBatch _batch_from(FramePool pool, lf_layout code, const int64_t *ids, Py_ssize_t n,
                           Py_ssize_t k, bint check):
    """A new batch over ``(n, k)`` ids of ``pool``, taking a reference on each (checked first).

    Phase 2 of ``pool.lazy_batch`` and the like, as :func:`_lazy_from`.
    """
    cdef LazyBatch b = _new_batch(code, n, k)
    if check:
        _check_ids(&pool.p, ids, n * k)
    memcpy(b._slots, ids, n * k * sizeof(int64_t))
    _incref_all(&pool.p, ids, n * k)
    b._n = n
    b._pool = pool  # last: from here on, dealloc drops the references
    return b


cdef LazyBatch _check_batch(FramePool pool, object x, str what, str expected="a LazyBatch"):
    """``x`` as an initialised LazyBatch of ``pool`` (TypeError/ValueError otherwise)."""
    if type(x) is not LazyBatch:
        raise TypeError(f"{what} must be {expected}, got {type(x).__name__}")
    (<LazyBatch>x)._ready()
    if (<LazyBatch>x)._pool is not pool:
        raise ValueError("this LazyBatch belongs to another pool")
    return <LazyBatch>x


cdef int _check_pad(FramePool pool, object pad) except -1:
    """``pad`` must be None or a FrameRef of ``pool``."""
    if pad is None:
        return 0
    if type(pad) is not FrameRef:
        raise TypeError(f"pad must be a FrameRef or None, got {type(pad).__name__}")
    (<FrameRef>pad)._slot_of(pool)
    return 0


@cython.boundscheck(False)
@cython.wraparound(False)
cdef LazyBatch _step(FramePool pool, lf_layout code, LazyBatch prev, Py_ssize_t k,
                     cnp.ndarray frames, const unsigned char *restart, object pad):
    """Push ``frames`` (n, *S) and build the next batch (all arguments checked).

    Row i is row i of ``prev`` shifted left with new frame i last or, where ``prev`` is
    None or ``restart[i]``, ``[p] * (k - 1) + [new i]`` with ``p`` the slot of ``pad``
    (a FrameRef the caller holds, so live) or new frame i. One C loop.
    """
    cdef Py_ssize_t n = frames.shape[0], i, j
    if prev is not None and n != prev._n:  # shift checked it; guarded here for memory safety
        raise ValueError(
            f"frames have shape {(<object>frames).shape}, expected ({prev._n}, *{pool._shape})"
        )
    cdef LazyBatch b = _new_batch(code, n, k)
    cdef int64_t *new = <int64_t *>malloc(max(1, n) * sizeof(int64_t))
    if new == NULL:
        raise MemoryError()
    try:
        pool._push_into(frames, n, new)
    except BaseException:
        free(new)
        raise
    cdef int64_t p = -1 if pad is None else (<FrameRef>pad)._slot, fill
    cdef int64_t *row
    for i in range(n):
        row = b._slots + i * k
        row[k - 1] = new[i]  # the new reference passes to the batch
        if prev is None or (restart != NULL and restart[i]):
            fill = new[i] if p < 0 else p
            for j in range(k - 1):
                row[j] = fill
                lf_pool_incref(&pool.p, fill)
        else:
            for j in range(k - 1):
                row[j] = prev._slots[i * k + j + 1]
                lf_pool_incref(&pool.p, row[j])
    free(new)
    b._n = n
    b._pool = pool
    return b


@cython.boundscheck(False)
@cython.wraparound(False)
cdef LazyBatch _dedup(FramePool pool, tuple arrs, Py_ssize_t E, Py_ssize_t k, LazyBatch cand):
    """:meth:`FramePool._push_dedup` on checked C-contiguous frames: ``arrs`` one or two
    arrays ``(E, k, *S)``, pushed row by row into a batch ``(E, len(arrs) * k)``."""
    cdef Py_ssize_t h, nh = len(arrs), w = nh * k, e, j, jj, q, start, m = 0, off = 0, cm
    cdef const int64_t *cp = NULL
    cdef const int64_t *row
    if cand is not None:
        m = min(cand._k, k)
        off = cand._k - m  # a row's last m frames: its newest observation
        cp = cand._slots
    cdef size_t fb = pool.p.frame_bytes
    cdef const unsigned char *srcs[2]
    for h in range(nh):
        srcs[h] = <const unsigned char *>cnp.PyArray_DATA(<cnp.ndarray>arrs[h])
    cdef const unsigned char *src
    cdef const unsigned char *f
    cdef LazyBatch b = _new_batch(LF_STACK, E, w)
    cdef int64_t *o = b._slots
    cdef int64_t found, c
    cdef bint inorder
    for e in range(E):
        for h in range(nh):
            # candidates: the row of cand for the first observation, else the row's first
            src = srcs[h] + e * k * fb
            row, cm = o + e * w, k
            if h == 0:
                row, cm = cp, m
                if cp != NULL:
                    row = cp + e * (m + off) + off
            # where the last frame matched, plus one: a stack shifts by whole frames, and
            # the next observation by one from the observation
            start = h
            for j in range(k):
                f = src + j * fb
                found = -1
                inorder = False  # found at or after start: the stack's own next frame
                q = start if start < cm else 0
                for jj in range(cm):  # (no division: this loop runs for every frame)
                    c = row[q]
                    if lf_pool_is_hot(&pool.p, c) and memcmp(lf_pool_addr(&pool.p, c), f, fb) == 0:
                        found = c
                        inorder = q >= start
                        start = q + 1
                        break
                    q = q + 1 if q + 1 < cm else 0
                if found < 0:
                    for jj in range(j):
                        if memcmp(src + jj * fb, f, fb) == 0:
                            found = o[e * w + h * k + jj]
                            break
                if found >= 0 and not inorder and j and pool.p.z != NULL and \
                        not _padding(o + e * w + h * k, j):
                    found = -1  # a frame repeated past the padding: a frame of its own
                if found >= 0:
                    lf_pool_incref(&pool.p, found)
                else:
                    found = lf_pool_alloc(&pool.p)
                    if found < 0:
                        _decref_all(&pool.p, o, e * w + h * k + j)
                        raise MemoryError("the frame pool cannot grow")
                    memcpy(lf_pool_addr(&pool.p, found), f, fb)
                o[e * w + h * k + j] = found
    b._n = E
    b._pool = pool
    return b


cdef inline bint _padding(const int64_t *ids, Py_ssize_t j) noexcept:
    """Whether the first ``j`` ids are one id repeated (an observation's reset padding)."""
    cdef Py_ssize_t i
    for i in range(1, j):
        if ids[i] != ids[0]:
            return False
    return True


@cython.final
@cython.no_gc
cdef class LazyBatch:
    """A batch of ``n`` observations (one per sub-environment) as slot ids of one pool.

    Holds one reference on each of its ``n * k`` frames, dropped when it is dropped, so
    it stays valid however far the environments move on; it never changes (:meth:`shift`
    and :meth:`replace` return new batches). No frame bytes are copied until it is
    materialised. Made by :meth:`FramePool.lazy_batch`, :meth:`FramePool.push_batch`,
    :meth:`shift` and :meth:`SlotTable.batch`; there is no public constructor.

    ``len(batch)`` is ``n``; ``batch[i]`` is observation i as a :class:`LazyFrames` (no
    frame copied); ``batch[a:b]`` is a LazyBatch. ``np.asarray(batch)``, :meth:`numpy`
    (with ``out``, ``dtype``, ``scale``) and DLPack (``torch.as_tensor(batch)``) copy the
    whole batch out once, in one C call with the GIL released.

    Example:
        >>> pool = FramePool((2, 2), np.uint8)
        >>> batch = pool.push_batch(np.zeros((3, 2, 2), np.uint8), k=4)
        >>> batch.shape, pool.live_frames
        ((3, 4, 2, 2), 3)
        >>> batch = batch.shift(np.ones((3, 2, 2), np.uint8), np.array([False, True, False]))
        >>> np.asarray(batch)[:, :, 0, 0].tolist()
        [[0, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 1]]
    """

    cdef FramePool _pool  # None until initialised
    cdef int64_t *_slots
    cdef Py_ssize_t _n, _k
    cdef lf_layout _code

    def __cinit__(self):
        self._slots = NULL
        self._n = 0
        self._k = 0
        self._pool = None

    def __init__(self, *args, **kwargs):
        raise TypeError("use FramePool.lazy_batch(slots, layout=...) to make a LazyBatch")

    def __dealloc__(self):
        if self._pool is not None:
            _decref_all(&self._pool.p, self._slots, self._n * self._k)
        free(self._slots)

    cdef inline int _ready(self) except -1:
        if self._pool is None:
            _uninitialised(self)
        return 0

    @property
    def pool(self):
        """The pool holding the frames."""
        self._ready()
        return self._pool

    @property
    def slots(self):
        """A copy of the slot ids, int64 ``(num_envs, k)``, oldest frame first."""
        self._ready()
        cdef cnp.npy_intp dims[2]
        dims[0] = self._n
        dims[1] = self._k
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(2, dims, cnp.NPY_INT64, 0)
        memcpy(cnp.PyArray_DATA(out), self._slots, self._n * self._k * sizeof(int64_t))
        return out

    @property
    def layout(self):
        """``"last"``, ``"first"`` or ``"stack"``."""
        self._ready()
        return C.LAYOUTS[self._code]

    @property
    def stack_size(self):
        """k, the frames per observation."""
        self._ready()
        return self._k

    @property
    def shape(self):
        """Shape of ``np.asarray(self)``: ``(num_envs, *observation_shape)``."""
        self._ready()
        return (self._n,) + self._pool._obs_shape(self._code, self._k)

    @property
    def dtype(self):
        """The dtype of the frames."""
        self._ready()
        return self._pool._dtype

    @property
    def ndim(self):
        """Number of axes of ``np.asarray(self)``."""
        self._ready()
        return self._pool._nd + 1 + (self._code == LF_STACK)

    @property
    def nbytes(self):
        """Bytes of the materialised array (not of the memory held; see the pool)."""
        self._ready()
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
        self._ready()
        return _copy_out(self._pool, self._code, self._slots, self._n, self._k, out, dtype, scale)

    def numpy_pairs(self, out=None, *, dtype=None, scale=None):
        """Materialise the two halves of each row into two arrays, in one copy.

        A batch of pairs (:meth:`SlotTable.batch_pairs`) holds ``2k`` frames per row: an
        observation's ``k``, then another's (a transition's next observation, which shares
        ``k - 1`` of them). Row i of the first array is row i's first observation, of the
        second its second; they are copied one after the other, so frames they share are
        read from memory once, and a compressed frame is decoded once. It is
        :meth:`SlotTable.gather_pairs` from an owner instead of a table's rows: a replay
        buffer pins the frames of a batch when it draws it and copies them later, perhaps
        in another thread while the table changes. One call, GIL released.

        Args:
            out: None, or a pair of C-contiguous writeable arrays of the shape of one half
                (:attr:`shape` with ``k`` frames per row) that do not overlap.
            dtype, scale: as :meth:`numpy`.

        Returns:
            A pair of arrays of the shape of one half: ``out``, or new ones.

        Raises:
            ValueError: an odd :attr:`stack_size`, a bad ``out``. TypeError: a bad ``out``,
                ``dtype`` or ``scale``. Nothing is written then.

        Example:
            >>> pool = FramePool((2, 2), np.uint8)
            >>> a = pool.push_batch(np.zeros((3, 2, 2), np.uint8), k=2)
            >>> b = a.shift(np.ones((3, 2, 2), np.uint8))
            >>> pairs = pool.lazy_batch(np.concatenate([a.slots, b.slots], axis=1))
            >>> obs, nxt = pairs.numpy_pairs()
            >>> obs.shape, nxt[:, :, 0, 0].tolist()
            ((3, 2, 2, 2), [[0, 1], [0, 1], [0, 1]])
        """
        self._ready()
        if self._k % 2:
            raise ValueError(
                f"a batch of pairs holds an even number of frames per row, this one {self._k}"
            )
        if out is not None and (not isinstance(out, (tuple, list)) or len(out) != 2):
            raise TypeError("out must be a pair of ndarrays")
        o1, o2 = (None, None) if out is None else out
        if not _apart(o1, o2):
            _check_no_overlap(out, {})
        cdef Py_ssize_t n = self._n, k = self._k // 2
        cdef _Copy c
        memset(&c, 0, sizeof(c))
        c.n_out = 2
        c.held = True  # self, live until the call returns
        res1 = _output(self._pool, self._code, n, k, o1, dtype, scale, &c, 0)
        dst_type = c.dst_type
        res2 = _output(self._pool, self._code, n, k, o2, dtype, scale, &c, 1)
        if res1.dtype != res2.dtype or c.dst_type != dst_type:
            raise TypeError(
                f"the two arrays of out have different dtypes: {res1.dtype} and {res2.dtype}"
            )
        c.ids = self._slots  # row i's halves, one after the other: the copy order
        _copy(&c)
        return res1, res2

    def __array__(self, dtype=None, copy=None):
        """Materialise into a fresh ``(n, *observation_shape)`` array (NumPy 2 protocol).

        ``copy=False`` raises ValueError: a copy cannot be avoided.
        """
        self._ready()
        if dtype is None and copy is not False:
            return self.numpy()
        return _array_protocol(self._fused, dtype, copy)

    def _fused(self, dtype):
        """The copy out with ``dtype`` fused (TypeError when the kernels cannot fuse it)."""
        return self.numpy(dtype=dtype)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """DLPack export of a fresh materialised batch, so ``torch.as_tensor(batch)`` is fast."""
        self._ready()
        return _dlpack(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self):
        """The device of :meth:`__dlpack__`: the CPU."""
        self._ready()
        return (1, 0)  # kDLCPU, device 0

    def __len__(self):
        self._ready()
        return self._n

    def __getitem__(self, i):
        self._ready()
        cdef cnp.ndarray rows
        if isinstance(i, slice):
            rows = np.ascontiguousarray(self.slots[i])
            return _batch_from(self._pool, self._code, <const int64_t *>cnp.PyArray_DATA(rows),
                               rows.shape[0], self._k, False)
        try:
            j = _index(i, self._n, "environments")
        except TypeError:
            raise TypeError(
                f"LazyBatch indices must be an int (one env's LazyFrames) or a slice, got "
                f"{type(i).__name__}; use np.asarray(batch)[...] for array indexing"
            ) from None
        return self._row(j)

    cdef LazyFrames _row(self, Py_ssize_t j):
        return _lazy_from(self._pool, self._code, self._slots + j * self._k, self._k, False)

    def __iter__(self):
        self._ready()
        cdef Py_ssize_t j
        for j in range(self._n):
            yield self._row(j)

    def shift(self, frames, restart=None, *, pad=None):
        """The next batch: each row shifted left with its new frame last, or restarted.

        One step of ``n`` sub-environments in one C loop. Where ``restart[i]`` (a new
        episode), row i is instead ``[p] * (k - 1) + [frame i]``, with ``p`` = ``pad``
        or frame i itself (reset padding). ``self`` is unchanged.

        Args:
            frames: an array ``(n, *S)`` of the pool's dtype.
            restart: None, or a bool mask ``(n,)``.
            pad: None, or a :class:`FrameRef` of this pool.

        Returns:
            A new :class:`LazyBatch` of the same shape and layout.

        Raises:
            TypeError, ValueError: frames, mask or pad that do not fit; checked before
                any frame is stored.
        """
        self._ready()
        cdef FramePool pool = self._pool
        cdef cnp.ndarray m = None
        if restart is not None:
            m = np.array(restart, dtype=np.bool_, order="C")  # a private copy
            if cnp.PyArray_NDIM(m) != 1 or m.shape[0] != self._n:
                raise ValueError(f"restart has shape {(<object>m).shape}, expected ({self._n},)")
        _check_pad(pool, pad)
        cdef cnp.ndarray arr = pool._as_frames(frames, 1)  # last: see _copyout.pxi
        if arr.shape[0] != self._n:
            raise ValueError(
                f"frames have shape {(<object>arr).shape}, expected ({self._n}, *{pool._shape})"
            )
        cdef const unsigned char *mask = NULL
        if m is not None:
            mask = <const unsigned char *>cnp.PyArray_DATA(m)
        return _step(pool, self._code, self, self._k, arr, mask, pad)

    def replace(self, rows, other):
        """A new batch with rows ``rows`` taken from ``other`` (a batch with one row per index).

        Args:
            rows: 1-D ints, distinct row indices ``0 <= r < n``.
            other: a :class:`LazyBatch` of this pool with the same ``k`` and layout and
                ``len(rows)`` rows; row i of ``other`` becomes row ``rows[i]``.

        Raises:
            TypeError, ValueError, IndexError: arguments that do not fit (checked first).
        """
        self._ready()
        cdef cnp.ndarray r = _row_ids(rows, self._n, True)
        cdef LazyBatch o = _check_batch(self._pool, other, "other")
        if o._k != self._k or o._code != self._code:
            raise ValueError(
                f"other has {o._k} frames per row in layout {o.layout!r}, expected {self._k} in "
                f"layout {self.layout!r}"
            )
        cdef Py_ssize_t e = r.shape[0], i
        cdef const int64_t *ri = <const int64_t *>cnp.PyArray_DATA(r)
        if e != o._n:
            raise ValueError(f"other has {o._n} rows, expected {e}")
        cdef LazyBatch b = _batch_from(self._pool, self._code, self._slots, self._n, self._k, False)
        cdef Py_ssize_t k = self._k
        for i in range(e):  # take the new references before dropping the old ones
            _incref_all(&b._pool.p, o._slots + i * k, k)
            _decref_all(&b._pool.p, b._slots + ri[i] * k, k)
            memcpy(b._slots + ri[i] * k, o._slots + i * k, k * sizeof(int64_t))
        return b

    def copy(self):
        """A new batch sharing the same frames (no frame bytes copied)."""
        self._ready()
        return _batch_from(self._pool, self._code, self._slots, self._n, self._k, False)

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    def __reduce__(self):
        self._ready()
        return _restore_lazybatch, (tuple(self), C.LAYOUTS[self._code])

    def __hash__(self):
        raise TypeError(f"unhashable type: {type(self).__name__!r}")

    def __repr__(self):
        self._ready()
        return f"LazyBatch(shape={self.shape}, dtype={self.dtype}, layout={self.layout!r})"
