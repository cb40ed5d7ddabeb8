# The one copy out: k frames per observation -> the caller's array.
#
# Included by _core.pyx. Every path that materialises frames (np.asarray of an
# observation or batch, stack, FramePool.gather, SlotTable.gather/gather_pairs and
# the bench floor) goes through _copy, in two steps:
#   1. _output: every Python-level check (out, dtype, scale), which may run Python code;
#   2. _copy: no Python code from here on. Check every id (in range, live), build the
#      table of frame addresses, take a reference on each frame for the duration,
#      release the GIL for large copies, run the kernel, drop the references.
# The ids _copy reads are private to the caller (a copy, or an owner's immutable
# array), so nothing that runs in step 1 can change them.


cdef struct _Copy:
    lf_pool *pool           # the pool of every id, unless pools is set
    lf_pool **pools         # else the pool of each observation (stack() over several pools)
    const int64_t *ids      # n_obs * n_out * k ids: observation i of output 0, of output 1, ...
    Py_ssize_t n_obs
    Py_ssize_t k
    int n_out               # 1, or 2 (gather_pairs: obs and next obs, row by row)
    unsigned char *dst[2]
    size_t obs_bytes        # bytes of one observation in the output
    size_t outer
    size_t inner
    size_t itemsize
    int src_type
    int dst_type
    int has_scale
    double scale
    bint floor              # the bench floor: one plain memcpy per frame instead of the kernel


# Copies smaller than this keep the GIL: releasing it costs more than it lets run.
cdef size_t _NOGIL_BYTES = 1 << 16


cdef cnp.ndarray _output(FramePool pool, lf_layout code, Py_ssize_t b, Py_ssize_t k, object out,
                         object dtype, object scale, _Copy *c, int which, bint batch=True):
    """Check ``out`` (or allocate it) for ``b`` observations and fill ``c``'s output fields.

    With ``batch`` False (one observation, ``out`` None) the new array has no batch axis.

    This is where a copy out runs Python code (``out``'s attributes, ``np.dtype``,
    ``float(scale)``), so it runs before any id is checked.
    """
    cdef cnp.npy_intp dims[MAX_NDIM + 2]
    cdef int nd, i
    cdef cnp.ndarray res = None
    dims[0] = b
    nd = pool._obs_dims(code, k, dims + 1) + 1  # (B, *observation_shape)
    c.pool = &pool.p
    c.k = k
    c.n_obs = b
    c.outer = pool._outer[<int>code]
    c.inner = pool._inner[<int>code]
    c.itemsize = pool._itemsize
    c.src_type = pool._ltype
    c.obs_bytes = k * pool.p.frame_bytes
    if dtype is None and scale is None:
        if out is None:
            res = cnp.PyArray_EMPTY(nd - (not batch), dims + (not batch), pool._descr.type_num, 0)
        elif cnp.PyArray_CheckExact(out):
            # the common out= case, checked in C: same dtype, shape, C-contiguous, writeable
            res = <cnp.ndarray>out
            if not (res.descr is pool._descr and cnp.PyArray_NDIM(res) == nd
                    and cnp.PyArray_IS_C_CONTIGUOUS(res) and cnp.PyArray_ISWRITEABLE(res)
                    and cnp.PyArray_ISALIGNED(res)):
                res = None
            else:
                for i in range(nd):
                    if cnp.PyArray_DIMS(res)[i] != dims[i]:
                        res = None
                        break
        if res is not None:
            c.dst_type = pool._ltype
            c.scale = 0.0
            c.has_scale = 0
            c.dst[which] = <unsigned char *>cnp.PyArray_DATA(res)
            return res
    dst = C.output_dtype(pool._dtype, C.requested_dtype(dtype, out), scale)
    if out is None:
        res = cnp.PyArray_EMPTY(nd - (not batch), dims + (not batch), (<cnp.dtype>dst).type_num, 0)
    else:
        C.check_out(out, tuple([dims[i] for i in range(nd)]), dst)
        res = out
    c.dst_type = pool._ltype if dst is pool._dtype else _lf_type(dst)  # output_dtype checked it
    c.scale = 0.0 if scale is None else float(scale)
    c.has_scale = scale is not None
    c.obs_bytes = cnp.PyArray_NBYTES(res) // b if b else 0  # in the output dtype
    c.dst[which] = <unsigned char *>cnp.PyArray_DATA(res)
    return res


@cython.boundscheck(False)
@cython.wraparound(False)
cdef int _kernel(const _Copy *c, const unsigned char **src) noexcept nogil:
    """Run the copy kernel over the address table ``src``; 0, or -1 for an unsupported pair."""
    cdef Py_ssize_t i, o, m
    cdef size_t fb
    cdef int rc = 0
    if c.floor:
        fb = c.outer * c.inner * c.itemsize
        m = c.n_obs * c.k
        for i in range(m):
            memcpy(c.dst[0] + i * fb, src[i], fb)
        return 0
    if c.n_out == 1:
        return lf_copy_stacks(src, c.n_obs, c.k, c.outer, c.inner, c.src_type, c.dst_type,
                              c.itemsize, c.scale, c.has_scale, c.dst[0])
    for i in range(c.n_obs):  # row by row: frames shared by the outputs are read once
        for o in range(c.n_out):
            rc |= lf_copy_stacks(src + (i * c.n_out + o) * c.k, 1, c.k, c.outer, c.inner,
                                 c.src_type, c.dst_type, c.itemsize, c.scale, c.has_scale,
                                 c.dst[o] + i * c.obs_bytes)
    return rc


cdef enum:
    _NO_MEMORY = -10  # _decode_all's failures; the kernel's is -1
    _CORRUPT = -11


cdef int64_t _ENTRY_MASK = 0xFFFFFFFF  # a cold frame's entry: reader << 32 | entry


cdef struct _Readers:
    lf_reader *r           # one per compressing pool of the copy (stack() spans pools)
    Py_ssize_t n


cdef int _resolve(_Readers *rs, lf_pool *p, int64_t slot, int64_t *entry) except -1:
    """The reader entry of a cold ``slot`` of ``p`` (its reader made on first use)."""
    cdef Py_ssize_t j
    cdef lf_reader *grown
    for j in range(rs.n):
        if rs.r[j].p == p:
            break
    else:
        grown = <lf_reader *>realloc(rs.r, (rs.n + 1) * sizeof(lf_reader))
        if grown == NULL:
            raise MemoryError()
        rs.r = grown
        lf_reader_init(&rs.r[rs.n], p)
        j = rs.n
        rs.n += 1
    entry[0] = lf_reader_add(&rs.r[j], slot)
    if entry[0] < 0:
        raise MemoryError()
    return <int>j


cdef int _decode_all(_Readers *rs) noexcept nogil:
    """Decode every reader's entries: 0, _NO_MEMORY, or _CORRUPT for a blob that does not decode."""
    cdef Py_ssize_t j
    cdef int rc
    cdef void *dctx
    if rs.n == 0:
        return 0
    dctx = lf_dctx_new()  # one per call: calls may run in parallel threads
    if dctx == NULL:
        return _NO_MEMORY
    rc = 0
    for j in range(rs.n):
        rc = lf_reader_decode(&rs.r[j], dctx)
        if rc != 0:
            rc = _CORRUPT
            break
    lf_ctx_free(dctx)
    return rc


cdef void _busy(const _Copy *c, int delta) noexcept:
    """Count a copy out running without the GIL on each of its pools (+1, then -1)."""
    cdef Py_ssize_t i
    if c.pools == NULL:
        c.pool.busy += delta
    else:
        for i in range(c.n_obs):
            c.pools[i].busy += delta


@cython.boundscheck(False)
@cython.wraparound(False)
cdef int _copy(_Copy *c) except -1:
    """The one copy out of ``c.ids`` into ``c.dst`` (see the top of this file).

    A cold (compressed) frame is decoded into per-call scratch first, each frame and
    each member of its delta chain once per call; every slot involved is pinned
    (a reference taken) before the GIL is released, so no other thread compresses or
    frees it meanwhile.

    Raises:
        IndexError, ValueError: an id out of range or free (nothing written then).
        MemoryError: no memory for the decoded frames.
    """
    cdef Py_ssize_t per = c.n_out * c.k, m = c.n_obs * per, i, n_hot = 0
    cdef lf_pool *p
    cdef int rc = 0
    if c.pools == NULL:
        _check_ids(c.pool, c.ids, m)
    else:
        for i in range(c.n_obs):
            _check_ids(c.pools[i], c.ids + i * per, per)
    cdef const unsigned char *few[64]
    cdef const unsigned char **src = few
    cdef int64_t few_entry[64]
    cdef int64_t *entry = few_entry  # -1 for a hot frame
    cdef _Readers rs
    rs.r = NULL
    rs.n = 0
    cdef int64_t e
    cdef int j
    if m > 64:
        src = <const unsigned char **>malloc(m * sizeof(void *))
        entry = <int64_t *>malloc(m * sizeof(int64_t))
        if src == NULL or entry == NULL:
            free(src if src != few else NULL)
            free(entry if entry != few_entry else NULL)
            raise MemoryError()
    try:
        for i in range(m):  # a reference on every frame while the GIL is released
            p = c.pool if c.pools == NULL else c.pools[i // per]
            if lf_pool_is_hot(p, c.ids[i]):
                src[i] = lf_pool_addr(p, c.ids[i])
                lf_pool_incref(p, c.ids[i])
                entry[i] = -1
                n_hot = i + 1
            else:
                j = _resolve(&rs, p, c.ids[i], &e)
                entry[i] = (<int64_t>j << 32) | e
        for j in range(rs.n):
            if lf_reader_reserve(&rs.r[j]) != 0:
                raise MemoryError()
        if rs.n or c.obs_bytes * <size_t>c.n_obs * <size_t>c.n_out >= _NOGIL_BYTES:
            _busy(c, 1)  # the pools' frames may not move (enable_compression) meanwhile
            with nogil:
                rc = _decode_all(&rs)
                if rc == 0:
                    for i in range(m):
                        if entry[i] >= 0:
                            src[i] = lf_reader_frame(&rs.r[entry[i] >> 32], entry[i] & _ENTRY_MASK)
                    rc = _kernel(c, src)
            _busy(c, -1)
        else:
            rc = _kernel(c, src)
    finally:
        for i in range(n_hot):
            if entry[i] < 0:
                lf_pool_decref(c.pool if c.pools == NULL else c.pools[i // per], c.ids[i])
        for i in range(rs.n):
            lf_reader_release(&rs.r[i])
        free(rs.r)
        if src != few:
            free(src)
            free(entry)
    if rc == _NO_MEMORY:
        raise MemoryError()
    if rc == _CORRUPT:
        raise RuntimeError(C.BLOB_CORRUPT)
    if rc != 0:  # _output checked the pair: unreachable unless the kernels disagree
        raise TypeError("the copy kernel refused the conversion")
    return 0


cdef cnp.ndarray _copy_out(FramePool pool, lf_layout code, const int64_t *ids, Py_ssize_t b,
                           Py_ssize_t k, object out, object dtype, object scale, bint batch=True):
    """Copy ``b`` observations of ``k`` ids of ``pool`` into ``out`` or a new array.

    The ids must be private to the caller (see the top of this file).
    """
    cdef _Copy c
    memset(&c, 0, sizeof(c))
    c.n_out = 1
    res = _output(pool, code, b, k, out, dtype, scale, &c, 0, batch)
    c.ids = ids
    _copy(&c)
    return res


def _memcpy_gather(FramePool pool, slots, out):
    """The floor of a random gather, for benchmarks: one plain ``memcpy`` per frame.

    Copies the frames of ``slots`` (``(B, k)`` slot ids, checked as
    :meth:`FramePool.gather` does) one after the other into ``out``, a C-contiguous
    writeable uint8 array of exactly ``B * k * frame_bytes`` bytes, with the GIL
    released: the same frame addresses as a gather, without layout or conversion.

    Raises:
        IndexError, ValueError: bad slot ids, or a bad ``out``.
    """
    pool._ready()
    cdef cnp.ndarray a = _ids(pool, slots)
    if cnp.PyArray_NDIM(a) != 2 or a.shape[1] == 0:
        raise ValueError(C.bad_slots_shape((<object>a).shape, "(B, k)"))
    cdef Py_ssize_t b = a.shape[0], k = a.shape[1]
    cdef size_t nbytes = b * k * pool.p.frame_bytes
    # any shape of exactly nbytes bytes
    C.check_out(out, out.shape if getattr(out, "nbytes", None) == nbytes else (nbytes,),
                np.dtype(np.uint8))
    C.check_no_overlap(out, {"slots": slots})
    cdef _Copy c
    memset(&c, 0, sizeof(c))
    c.pool = &pool.p
    c.ids = <const int64_t *>cnp.PyArray_DATA(a)
    c.n_obs = b
    c.k = k
    c.n_out = 1
    c.dst[0] = <unsigned char *>cnp.PyArray_DATA(<cnp.ndarray>out)
    c.obs_bytes = k * pool.p.frame_bytes
    c.outer = 1
    c.inner = pool.p.frame_bytes
    c.itemsize = 1
    c.floor = True
    _copy(&c)
    return out
