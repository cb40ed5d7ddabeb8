# The benchmarks' floors that are not a copy out (that one, _memcpy_gather, is in
# _copyout.pxi): plain C loops over the bytes a library call must at least touch, so
# that bench/ can say how far a call is from its memory traffic. Included by _core.pyx.
#
# Like every call that reads memory it was given, a floor converts and checks all of
# its arguments first (plain ndarrays only, so no Python code of the caller's runs
# after the checks), then runs its loop with the GIL released. A wrong call raises;
# it never reads or writes outside the arrays it was given.


cdef int _check_plain(object x, str name, char kind, int itemsize, str what,
                      bint writeable) except -1:
    """Raise unless ``x`` is a plain C-contiguous aligned native ndarray of ``what``.

    Raises:
        TypeError: not a plain ndarray, or another dtype.
        ValueError: not C-contiguous and aligned, or read-only when ``writeable``.
    """
    if not cnp.PyArray_CheckExact(x):
        raise TypeError(f"{name} must be a numpy.ndarray of {what}, got {type(x).__name__}")
    cdef cnp.ndarray a = <cnp.ndarray>x
    if not (a.descr.kind == kind and cnp.PyArray_ITEMSIZE(a) == itemsize
            and cnp.PyArray_ISNOTSWAPPED(a)):
        raise TypeError(f"{name} must be a numpy.ndarray of {what}, got dtype {a.dtype}")
    if not (cnp.PyArray_IS_C_CONTIGUOUS(a) and cnp.PyArray_ISALIGNED(a)):
        raise ValueError(f"{name} must be C-contiguous")
    if writeable and not cnp.PyArray_ISWRITEABLE(a):
        raise ValueError(f"{name} must be writeable")
    return 0


cdef inline bint _disjoint(cnp.ndarray a, cnp.ndarray b) noexcept:
    """Whether the bytes of two C-contiguous ndarrays do not overlap."""
    cdef size_t lo1 = <size_t>cnp.PyArray_DATA(a), lo2 = <size_t>cnp.PyArray_DATA(b)
    cdef size_t hi1 = lo1 + <size_t>cnp.PyArray_NBYTES(a), hi2 = lo2 + <size_t>cnp.PyArray_NBYTES(b)
    return hi1 <= lo2 or hi2 <= lo1 or lo1 == hi1 or lo2 == hi2


@cython.boundscheck(False)
@cython.wraparound(False)
cdef Py_ssize_t _ingest_loop(const unsigned char **src, Py_ssize_t T, Py_ssize_t E,
                             Py_ssize_t k, size_t fb, int64_t *prev, unsigned char *arena,
                             Py_ssize_t n, Py_ssize_t pos) noexcept nogil:
    """The loop of :func:`_ingest_floor` over ``T`` stacks of ``E`` envs; the next position."""
    cdef Py_ssize_t t, e, j
    cdef const unsigned char *st
    cdef int64_t *p
    cdef bint same
    for t in range(T):
        for e in range(E):
            st = src[t] + <size_t>(e * k) * fb
            p = prev + e * k
            same = True
            for j in range(k - 1):  # the k - 1 shared frames against the stored ones
                if p[j + 1] < 0 or memcmp(st + <size_t>j * fb, arena + <size_t>p[j + 1] * fb,
                                          fb) != 0:
                    same = False
                    break
            if same:  # one new frame
                for j in range(k - 1):
                    p[j] = p[j + 1]
                memcpy(arena + <size_t>pos * fb, st + <size_t>(k - 1) * fb, fb)
                p[k - 1] = pos
                pos += 1
                if pos == n:
                    pos = 0
            else:  # a new episode (or the first stack): every frame
                for j in range(k):
                    memcpy(arena + <size_t>pos * fb, st + <size_t>j * fb, fb)
                    p[j] = pos
                    pos += 1
                    if pos == n:
                        pos = 0
    return pos


def _ingest_floor(stacks, previous, arena, position=0):
    """The floor of adding stacked ndarray observations, for benchmarks: memcmp + memcpy.

    What a replay buffer that stores each frame once must at least do per transition
    whose next observation is a stacked ndarray (SB3's ``VecFrameStack``, ale-py):
    compare the ``k - 1`` frames the new stack shares with the previous observation
    against the stored ones (``memcmp``), then copy the one new frame into the store
    (``memcpy``); when they differ (a new episode) copy all ``k``. No tables, no
    references, no Python per stack: a plain C loop with the GIL released.

    Args:
        stacks: a sequence of ``T`` uint8 ndarrays (C-contiguous), each the stacked
            observations of ``E`` envs at one step, ``E * k`` frames in the ``"stack"``
            layout: ``(E, k, *frame)``, or ``(k, *frame)`` when ``E`` is 1.
        previous: int64 ``(E, k)`` ndarray, C-contiguous and writeable: the arena frames
            of each env's previous observation (negative: none yet, copy every frame).
            Updated in place to the frames of the last stack.
        arena: uint8 ndarray ``(n, *frame)``, C-contiguous and writeable, ``n >= k``:
            the store, written as a ring from ``position``.
        position: the arena frame the next new frame goes to, in ``[0, n)``.

    Returns:
        The arena frame the frame after the last one copied goes to (``position`` of
        the next call).

    Raises:
        TypeError: a non-ndarray argument or a wrong dtype.
        ValueError: a wrong shape or size, a read-only or non-contiguous array, a
            ``previous`` entry or ``position`` outside the arena, overlapping arrays.
    """
    _check_plain(previous, "previous", b"i", 8, "int64", True)
    _check_plain(arena, "arena", b"u", 1, "uint8", True)
    cdef cnp.ndarray prev = <cnp.ndarray>previous, ar = <cnp.ndarray>arena
    if cnp.PyArray_NDIM(prev) != 2 or prev.shape[0] < 1 or prev.shape[1] < 1:
        raise ValueError(f"previous must have shape (E, k) with E, k >= 1, got {previous.shape}")
    cdef Py_ssize_t E = prev.shape[0], k = prev.shape[1]
    if cnp.PyArray_NDIM(ar) < 2 or cnp.PyArray_NBYTES(ar) == 0:
        raise ValueError(f"arena must have shape (n, *frame) and hold bytes, got {arena.shape}")
    cdef Py_ssize_t n = ar.shape[0]
    cdef size_t fb = <size_t>cnp.PyArray_NBYTES(ar) // <size_t>n
    if n < k:
        raise ValueError(f"arena holds {n} frames, fewer than the k = {k} of one stack")
    cdef Py_ssize_t pos = operator.index(position)
    if not 0 <= pos < n:
        raise ValueError(f"position {pos} is outside the arena's {n} frames")
    if not _disjoint(prev, ar):
        raise ValueError("previous and arena overlap")
    cdef tuple seq = tuple(stacks)  # held: keeps every stack alive during the loop
    cdef Py_ssize_t T = len(seq), t, i
    cdef const int64_t *pv = <const int64_t *>cnp.PyArray_DATA(prev)
    for i in range(E * k):
        if pv[i] >= n:
            raise ValueError(f"previous holds frame {pv[i]}, outside the arena's {n} frames")
    cdef size_t want = <size_t>(E * k) * fb
    cdef cnp.ndarray s
    cdef const unsigned char **src = <const unsigned char **>malloc(max(T, 1) * sizeof(void *))
    if src == NULL:
        raise MemoryError()
    try:
        for t in range(T):
            _check_plain(seq[t], f"stacks[{t}]", b"u", 1, "uint8", False)
            s = <cnp.ndarray>seq[t]
            if <size_t>cnp.PyArray_NBYTES(s) != want:
                raise ValueError(
                    f"stacks[{t}] has {cnp.PyArray_NBYTES(s)} bytes, expected {want} "
                    f"(E={E} envs x k={k} frames of {fb} bytes)"
                )
            if not (_disjoint(s, ar) and _disjoint(s, prev)):
                raise ValueError(f"stacks[{t}] overlaps arena or previous")
            src[t] = <const unsigned char *>cnp.PyArray_DATA(s)
        # phase 2: no Python code runs from here; seq holds every stack
        with nogil:
            pos = _ingest_loop(src, T, E, k, fb, <int64_t *>cnp.PyArray_DATA(prev),
                               <unsigned char *>cnp.PyArray_DATA(ar), n, pos)
    finally:
        free(src)
    return pos


def _codec_floor(frames, *, codec=C.DEFAULT_COMPRESSION["codec"],
                 level=C.DEFAULT_COMPRESSION["level"], group=C.DEFAULT_COMPRESSION["group"]):
    """The floor of compressing a stream's frames, for benchmarks: the coder alone.

    What a compressing pool must at least do for each frame of one stream, in order, as its
    ``compress_one`` (``csrc/pool.c``) does: a frame equal to one of the ``LF_ALIAS_BACK``
    (4) frames before it is an alias (no bytes; it takes that frame's position, and the
    frame after it is coded against that frame); else, in a group with room, a delta
    against the frame before it by the pool's coder (``lf_coder_encode`` in
    ``csrc/codec.c``: a patch, packed when that pays, or a keyframe when that is much
    smaller; docs/COMPRESSION.md); else a keyframe: with ``group > 1``, a root (kept raw:
    no coding) once every ``LF_ROOT_FRAMES / group`` keyframes from the first, else the
    delta against the last root unless the codec's blob is much smaller
    (``lf_coder_encode_key``). No slots, no queue, no copies of the blobs, no decoding of
    a reference (every frame is at hand, uncompressed): a plain C loop with the GIL
    released.

    Args:
        frames: uint8 ``(n, *frame)`` ndarray, C-contiguous, ``n >= 1``: one stream's
            frames in order.
        codec, level, group: as :meth:`FramePool.enable_compression`.

    Returns:
        The bytes of the coded frames.

    Raises:
        TypeError: not a plain uint8 ndarray. ValueError: no frame, bad options.
    """
    _check_plain(frames, "frames", b"u", 1, "uint8", False)
    cdef cnp.ndarray a = <cnp.ndarray>frames
    if cnp.PyArray_NDIM(a) < 2 or a.shape[0] < 1 or cnp.PyArray_NBYTES(a) == 0:
        raise ValueError(f"frames must have shape (n, *frame) with n >= 1, got {frames.shape}")
    opts = C.compression({"codec": codec, "level": level, "group": group})
    cdef lf_codec c
    c.codec = _CODEC_CODES[opts["codec"]]
    c.level = opts["level"]
    c.group = opts["group"]
    cdef Py_ssize_t n = a.shape[0], i
    cdef size_t fb = <size_t>cnp.PyArray_NBYTES(a) // <size_t>n, total = 0
    if not lf_codec_valid(c, fb):
        raise ValueError(f"frames of {fb} bytes are too large to compress")
    cdef const unsigned char *src = <const unsigned char *>cnp.PyArray_DATA(a)
    cdef const unsigned char *out
    cdef const unsigned char *f
    cdef unsigned char kind
    cdef long r = 0
    cdef Py_ssize_t j, d
    cdef size_t keys = 0, period = <size_t>LF_ROOT_FRAMES // <size_t>c.group
    cdef const unsigned char *root = NULL
    # frame i's position in its group, and the frame it decodes as (itself, or what it
    # is an alias of)
    cdef unsigned *pos = <unsigned *>malloc(<size_t>n * sizeof(unsigned))
    cdef Py_ssize_t *same = <Py_ssize_t *>malloc(<size_t>n * sizeof(Py_ssize_t))
    cdef lf_coder coder
    memset(&coder, 0, sizeof(coder))
    try:
        if pos == NULL or same == NULL or lf_coder_init(&coder, c, fb) != 0:
            raise MemoryError()
        with nogil:
            for i in range(n):
                f, j, same[i], pos[i], r = src + i * fb, -1, i, 0, 0
                if c.group > 1:
                    for d in range(1, min(i, <Py_ssize_t>LF_ALIAS_BACK) + 1):
                        if memcmp(src + (i - d) * fb, f, fb) == 0:
                            j = i - d
                            break
                if j >= 0:  # an alias: no bytes
                    same[i], pos[i] = same[j], pos[j]
                elif i and c.group > 1 and pos[i - 1] + 1 < <unsigned>c.group:
                    r = lf_coder_encode(&coder, f, src + same[i - 1] * fb, &out, &kind)
                    pos[i] = pos[i - 1] + 1 if kind & LF_BLOB_DELTA else 0
                elif c.group == 1:
                    r = lf_coder_encode(&coder, f, NULL, &out, &kind)
                else:
                    if keys % period == 0:  # a root: the frame itself
                        root, r = f, <long>fb
                    else:
                        r = lf_coder_encode_key(&coder, f, root, &out, &kind)
                    keys += 1
                if r < 0:
                    break
                total += <size_t>r
        if r < 0:
            raise MemoryError("the codec failed to compress a frame")
    finally:
        free(pos)
        free(same)
        lf_coder_free(&coder)
    return total


def _convert_gather_floor(FramePool pool, slots, out, scale):
    """The floor of a random gather into float32, for benchmarks: ``float32(byte) * scale``.

    Converts the frames of ``slots`` (``(B, k)`` slot ids of a uint8 pool that does not
    compress, checked as :meth:`FramePool.gather` does) one after the other into
    ``out``, a C-contiguous writeable float32 ndarray of exactly ``B * k *
    frame_bytes`` items (any shape), each value ``float32(byte) * float32(scale)`` as
    ``gather(..., dtype=np.float32, scale=scale)`` computes it: the same frame
    addresses and bytes, without layout or threads, in one plain C loop
    (``lf_convert_floor``, built for the instruction sets the conversions are) with the GIL
    released.

    Raises:
        IndexError, ValueError: bad slot ids, a bad ``out``, a compressing pool.
        TypeError: a pool of another dtype than uint8, ``out`` not float32.
    """
    pool._ready()
    hold = []
    cdef cnp.ndarray a = _ids(pool, slots, hold)
    if cnp.PyArray_NDIM(a) != 2 or a.shape[1] == 0:
        raise ValueError(f"slots must have shape (B, k) with k >= 1, got {(<object>a).shape}")
    if pool._ltype != LF_UINT8 or pool._itemsize != 1:
        raise TypeError(f"the pool's frames must be uint8, got {pool._dtype}")
    if pool.p.z != NULL:
        raise ValueError("the pool compresses: this floor reads uncompressed frames only")
    cdef float s = <float>float(scale)
    _check_plain(out, "out", b"f", 4, "float32", True)
    cdef cnp.ndarray o = <cnp.ndarray>out
    cdef Py_ssize_t m = a.shape[0] * a.shape[1], i
    cdef size_t fb = pool.p.frame_bytes
    if <size_t>cnp.PyArray_SIZE(o) != <size_t>m * fb:
        raise ValueError(f"out must hold {m * fb} float32 values, got {cnp.PyArray_SIZE(o)}")
    # no Python code from here on: every id checked live, then referenced while copying
    cdef const int64_t *ids = <const int64_t *>cnp.PyArray_DATA(a)
    _check_ids(&pool.p, ids, m)
    cdef const unsigned char **src = <const unsigned char **>malloc(max(m, 1) * sizeof(void *))
    if src == NULL:
        raise MemoryError()
    for i in range(m):
        src[i] = lf_pool_addr(&pool.p, ids[i])
    _incref_all(&pool.p, ids, m)
    pool.p.busy += 1
    with nogil:
        lf_convert_floor(src, m, fb, s, <float *>cnp.PyArray_DATA(o))
    pool.p.busy -= 1
    _decref_all(&pool.p, ids, m)
    free(src)
    return out
