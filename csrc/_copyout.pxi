# The one copy out: k frames per observation -> the caller's array.
#
# Included by _core.pyx. Every call that reads frames or takes references on ids it
# was given (FramePool.gather/lazy/lazy_batch/push_batch/_push_dedup, LazyFrames
# __array__/astype/shift, LazyBatch.numpy/numpy_pairs/shift, stack, SlotTable.batch/gather/
# gather_pairs, _memcpy_gather) runs in two phases, in this order:
#
#   1. Convert every argument. This is where Python code runs, the caller's included
#      (__index__, __array__, __float__, __eq__ of a str subclass, np.dtype(...), an
#      __array_function__ of the overlap check): the layout (_layout_code: the
#      characters of a str), dtype and float(scale), restart masks, frames, ids
#      (copied into private memory, with the FrameRefs among them held), outputs
#      (_output: plain ndarrays only; a new array is allocated here) and overlap checks.
#      Anything a callback can change is re-read in phase 2.
#   2. No Python code from here on, so nothing can change under it (no callback, no
#      thread switch: the GIL is held): re-check every output from its C fields
#      (_fits) and every id (in range, live), read a table's entries, resolve each cold
#      (compressed) frame's delta chain into a reader (_resolve; a large copy's parts
#      each resolve their own rows' frames, in several threads, the GIL still held, so
#      that the pool does not change), reserve the decoding scratch, then decode and
#      copy (_copy releases the GIL for large copies and for any decoding, after taking
#      a reference on each frame, unless the call holds the owners of every id: an
#      owner's own method; the references keep every frame and every member of a cold
#      frame's chain alive and in place meanwhile; a large copy runs as parts of its
#      rows in several threads, each part with its own readers) or hand the references
#      to a new owner.
#
# Only phase 2 is trusted for memory safety; phase 1 checks exist to raise clear
# error messages early. An output resized in phase 1 (ndarray.resize(refcheck=False)
# in a callback) fails phase 2 with RuntimeError. Resizing it from another thread
# while the GIL is released is NumPy's own refcheck=False hazard and is not guarded.


cdef struct _Copy:
    # phase 1 (_output) fills these
    lf_pool *pool           # the pool of every id, unless pools is set
    lf_pool **pools         # else the pool of each observation (stack() over several pools)
    const int64_t *ids      # n_obs * n_out * k ids: observation i of output 0, of output 1, ...
    Py_ssize_t n_obs
    Py_ssize_t k
    int n_out               # 1, or 2 (gather_pairs: obs and next obs, row by row)
    PyObject *out[2]        # the plain ndarrays to fill; the caller keeps them alive
    int nd                  # their shape ...
    cnp.npy_intp dims[MAX_NDIM + 2]
    char kind               # ... and dtype (native byte order), re-checked by _fits
    size_t out_itemsize
    size_t outer            # the kernel's geometry of one frame (see layout.h)
    size_t inner
    size_t itemsize
    int src_type
    int dst_type
    int has_scale
    double scale
    bint floor              # the bench floor: one plain memcpy per frame instead of the kernel
    bint held               # every id is an owner's that the call holds until it returns
    # phase 2 (_copy) fills these
    unsigned char *dst[2]
    size_t obs_bytes        # bytes of one observation in the output


# Copies smaller than this keep the GIL: releasing it costs more than it lets run.
cdef size_t _NOGIL_BYTES = 1 << 16
cdef enum:
    _FEW = 256  # ids a copy addresses without malloc


cdef bint _fits(object arr, const _Copy *c) noexcept:
    """Whether ``arr`` is a plain ndarray ``c`` can fill, judged from C fields only.

    Shape ``c.dims``, dtype of kind ``c.kind`` and size ``c.out_itemsize`` in native
    byte order, C-contiguous, writeable and aligned. No Python code runs.
    """
    if not cnp.PyArray_CheckExact(arr):
        return False
    cdef cnp.ndarray a = <cnp.ndarray>arr
    cdef int i
    if not (cnp.PyArray_NDIM(a) == c.nd and a.descr.kind == c.kind
            and <size_t>cnp.PyArray_ITEMSIZE(a) == c.out_itemsize
            and cnp.PyArray_ISNOTSWAPPED(a) and cnp.PyArray_IS_C_CONTIGUOUS(a)
            and cnp.PyArray_ISWRITEABLE(a) and cnp.PyArray_ISALIGNED(a)):
        return False
    for i in range(c.nd):
        if cnp.PyArray_DIMS(a)[i] != c.dims[i]:
            return False
    return True


cdef bint _extent(cnp.ndarray a, size_t *lo, size_t *hi) noexcept:
    """The bytes ``[lo, hi)`` that ``a`` spans, as NumPy bounds them; False when ``a`` is empty."""
    cdef int i
    cdef cnp.npy_intp step
    lo[0] = hi[0] = <size_t>cnp.PyArray_DATA(a)
    for i in range(cnp.PyArray_NDIM(a)):
        if cnp.PyArray_DIMS(a)[i] == 0:
            return False
        step = (cnp.PyArray_DIMS(a)[i] - 1) * cnp.PyArray_STRIDES(a)[i]
        if step < 0:
            lo[0] += <size_t>step  # wraps around: adds step
        else:
            hi[0] += <size_t>step
    hi[0] += <size_t>cnp.PyArray_ITEMSIZE(a)
    return True


cdef bint _apart(object out, object x) noexcept:
    """Whether ``_check_no_overlap`` surely passes for ``out`` and one input ``x``.

    Judged from C fields only (no Python code runs): ``out`` is None, or a plain
    ndarray and ``x`` is not an ndarray, or both are plain non-empty ndarrays whose
    bounds are disjoint (``np.may_share_memory`` reports no overlap then). False
    means: ask ``_check_no_overlap``, which decides, and raises if they overlap.
    """
    cdef size_t lo1, hi1, lo2, hi2
    if out is None:
        return True
    if not cnp.PyArray_CheckExact(out):
        return False
    if not isinstance(x, cnp.ndarray):
        return True
    if not cnp.PyArray_CheckExact(x):
        return False
    if not (_extent(<cnp.ndarray>out, &lo1, &hi1) and _extent(<cnp.ndarray>x, &lo2, &hi2)):
        return False
    return hi1 <= lo2 or hi2 <= lo1


def check_outs(arrays, tuple shape, cnp.dtype dtype):
    """``C.check_out(a, shape, dtype)`` of each of ``arrays``, judged from C fields (``_fits``).

    The Python checks run only for an array that fails, to say why.

    Raises:
        TypeError, ValueError: as ``C.check_out``.
    """
    cdef _Copy c
    cdef Py_ssize_t i
    c.nd = <int>min(len(shape), MAX_NDIM + 2)
    for i in range(c.nd):
        c.dims[i] = shape[i]
    c.kind = dtype.kind
    c.out_itemsize = dtype.itemsize
    for a in arrays:
        if c.nd != len(shape) or not _fits(a, &c):
            C.check_out(a, shape, dtype)
            raise TypeError(C.out_not_ndarray(a))  # check_out agrees with _fits: unreachable


def check_apart(arrays):
    """Raise ValueError("the arrays of out overlap") when two of ``arrays`` may share memory.

    ``arrays``: plain ndarrays (:func:`check_outs`); judged by their bounds, as
    ``np.may_share_memory`` does.
    """
    cdef Py_ssize_t i, j
    cdef size_t lo1, hi1, lo2, hi2
    for i in range(len(arrays)):
        if not _extent(arrays[i], &lo1, &hi1):
            continue
        for j in range(i):
            if _extent(arrays[j], &lo2, &hi2) and not (hi1 <= lo2 or hi2 <= lo1):
                raise ValueError("the arrays of out overlap")


cdef object _target(object out, _Copy *c, cnp.dtype dst, int which):
    """Phase 1: the array output ``which`` is written to, ``out`` or a new one of ``c``'s shape.

    Raises:
        TypeError, ValueError: ``out`` is not a plain ndarray of that shape and dtype,
            C-contiguous, writeable and aligned (``C.check_out``'s messages).
    """
    c.kind = dst.kind
    c.out_itemsize = dst.itemsize
    if out is None:
        res = cnp.PyArray_EMPTY(c.nd, c.dims, dst.type_num, 0)
    else:
        res = out
        if not _fits(res, c):
            C.check_out(out, tuple([c.dims[i] for i in range(c.nd)]), dst)
            raise TypeError(C.out_not_ndarray(out))  # check_out agrees with _fits: unreachable
    c.out[which] = <PyObject *>res
    return res


cdef object _output(FramePool pool, lf_layout code, Py_ssize_t b, Py_ssize_t k, object out,
                    object dtype, object scale, _Copy *c, int which, bint batch=True):
    """Phase 1 of a copy of ``b`` observations of ``k`` frames of ``pool``: output ``which``.

    Fills ``c``'s geometry, conversion and output fields and returns ``out`` (checked)
    or a new array: ``(b, *observation_shape)``, or one observation without the batch
    axis when ``batch`` is False (then ``b`` is 1). Runs Python code (``np.dtype``,
    ``float(scale)``, the messages), so it comes before phase 2.
    """
    c.nd = 0
    if batch:
        c.dims[0] = b
        c.nd = 1
    c.nd += pool._obs_dims(code, k, c.dims + c.nd)
    c.pool = &pool.p
    c.k = k
    c.n_obs = b
    c.outer = pool._outer[<int>code]
    c.inner = pool._inner[<int>code]
    c.itemsize = pool._itemsize
    c.src_type = pool._ltype
    cdef cnp.dtype dst = pool._descr
    if (dtype is not None and dtype is not pool._descr) or scale is not None or not (
            out is None or (cnp.PyArray_CheckExact(out)
                            and (<cnp.ndarray>out).descr is pool._descr)):
        if out is not None and type(out) is not np.ndarray:
            raise TypeError(C.out_not_ndarray(out))
        if dtype is None and out is not None:  # the dtype asked for is out's
            dtype = out.dtype
        dst = C.output_dtype(pool._dtype, dtype, scale)
    c.dst_type = pool._ltype if dst is pool._descr else _lf_type(dst)  # output_dtype checked it
    c.has_scale = 0 if scale is None else LF_DIVIDE if type(scale) is _Divisor else 1
    c.scale = float(scale) if c.has_scale else 0.0
    return _target(out, c, dst, which)


_Divisor = C.Divisor


def unscale_u8(frame, divisor, out):
    """The bytes ``b`` of a float32 frame whose values are each ``float32(b) / divisor``.

    What a ``lazyframes.ScaledFloatFrame`` gives (``divisor`` 255): its stacker stores the
    bytes, and converts them back exactly when asked. One C pass, no copy of ``frame``.

    Args:
        frame: a C-contiguous float32 ndarray.
        divisor: a positive number.
        out: a C-contiguous writeable uint8 ndarray of ``frame``'s size.

    Returns:
        ``out``.

    Raises:
        TypeError: arrays of another dtype, not C-contiguous, or ``out`` read-only.
        ValueError: sizes that differ, or a value that is no such quotient (``out`` is then
            partly written).
    """
    if not (type(frame) is np.ndarray and frame.dtype == np.float32
            and frame.flags.c_contiguous):
        raise TypeError("frame must be a C-contiguous float32 ndarray")
    if not (type(out) is np.ndarray and out.dtype == np.uint8 and out.flags.c_contiguous
            and out.flags.writeable):
        raise TypeError("out must be a C-contiguous writeable uint8 ndarray")
    if out.size != frame.size:
        raise ValueError(f"out has {out.size} elements, frame {frame.size}")
    cdef float d = divisor
    if not d > 0:
        raise ValueError(f"divisor must be positive, got {divisor!r}")
    if lf_unscale_u8(<const float *>cnp.PyArray_DATA(frame), <size_t>frame.size, d,
                     <uint8_t *>cnp.PyArray_DATA(out)) != 0:
        raise ValueError(
            f"a frame value is not a byte divided by {divisor:g} (the observations are not "
            f"ScaledFloatFrame's exact quotients)"
        )
    return out


@cython.boundscheck(False)
@cython.wraparound(False)
cdef int _kernel(const _Copy *c, const unsigned char **src, Py_ssize_t r0,
                 Py_ssize_t r1) noexcept nogil:
    """Run the copy kernel over rows ``[r0, r1)`` of the address table ``src``.

    0, or -1 for an unsupported pair.
    """
    cdef Py_ssize_t i, o, m
    cdef size_t fb, p, e, eb
    cdef unsigned char *d
    cdef const unsigned char *f
    cdef int rc = 0
    if c.floor and c.outer == 1:  # "stack"/"first": one memcpy per frame
        fb = c.inner * c.itemsize
        for i in range(r0 * c.k, r1 * c.k):
            memcpy(c.dst[0] + i * fb, src[i], fb)
        return 0
    if c.floor:  # "last": out[b, p, m * eb + e] = frame_m[p, e] (p a pixel), byte by byte
        eb = c.inner * c.itemsize  # bytes of one pixel of one frame
        for i in range(r0, r1):  # each frame read once in order, its bytes written k apart
            d = c.dst[0] + i * c.obs_bytes
            for m in range(c.k):
                f = src[i * c.k + m]
                for e in range(eb):
                    for p in range(c.outer):
                        d[(p * c.k + m) * eb + e] = f[p * eb + e]
        return 0
    if c.n_out == 1:
        return lf_copy_stacks(src + r0 * c.k, r1 - r0, c.k, c.outer, c.inner, c.src_type,
                              c.dst_type, c.itemsize, c.scale, c.has_scale,
                              c.dst[0] + r0 * c.obs_bytes)
    if c.outer == 1 and c.src_type == c.dst_type and not c.has_scale:
        # "stack"/"first" without conversion: one memcpy per frame (copy_raw's), inline
        fb = c.inner * c.itemsize
        for i in range(r0, r1):
            for o in range(c.n_out):
                for m in range(c.k):
                    memcpy(c.dst[o] + i * c.obs_bytes + m * fb, src[(i * c.n_out + o) * c.k + m],
                           fb)
        return 0
    for i in range(r0, r1):  # row by row: frames shared by the outputs are read once
        for o in range(c.n_out):
            rc |= lf_copy_stacks(src + (i * c.n_out + o) * c.k, 1, c.k, c.outer, c.inner,
                                 c.src_type, c.dst_type, c.itemsize, c.scale, c.has_scale,
                                 c.dst[o] + i * c.obs_bytes)
    return rc


cdef enum:
    _NO_MEMORY = -10  # _decode_copy's failures; the kernel's is -1
    _CORRUPT = -11


cdef int64_t _ENTRY_MASK = 0xFFFFFFFF  # a cold frame's entry: reader << 32 | entry


cdef struct _Readers:
    lf_reader *r           # one per compressing pool of the copy (stack() spans pools)
    Py_ssize_t n


cdef int _resolve(_Readers *rs, lf_pool *p, int64_t slot, int64_t *entry,
                  size_t expect) noexcept nogil:
    """The reader entry of a cold ``slot`` of ``p`` in ``entry`` (its reader made on first use,
    with room for ``expect`` entries): the reader's index in ``rs``, or -1 on out of memory."""
    cdef Py_ssize_t j
    cdef lf_reader *grown
    for j in range(rs.n):
        if rs.r[j].p == p:
            break
    else:
        grown = <lf_reader *>realloc(rs.r, (rs.n + 1) * sizeof(lf_reader))
        if grown == NULL:
            return -1
        rs.r = grown
        lf_reader_init(&rs.r[rs.n], p)
        j = rs.n
        rs.n += 1
        if lf_reader_expect(&rs.r[j], expect) != 0:
            return -1
    entry[0] = lf_reader_add(&rs.r[j], slot)
    return -1 if entry[0] < 0 else <int>j


cdef inline bint _plain(const _Copy *c) noexcept nogil:
    """A plain copy (``"first"``/``"stack"`` layout, no conversion): frames are copied whole."""
    return c.outer == 1 and c.src_type == c.dst_type and not c.has_scale and not c.floor


@cython.boundscheck(False)
@cython.wraparound(False)
cdef int _decode_copy(const _Copy *c, _Readers *rs, const int64_t *entry,
                      const unsigned char **src, Py_ssize_t r0, Py_ssize_t r1) noexcept nogil:
    """Decode the cold frames of rows ``[r0, r1)`` of ``c`` (``rs``: theirs) and copy, row by row.

    Each row's frames are decoded (those an earlier row did not) just before the row is
    copied, so the kernel reads them from the cache. When the copy is plain, a frame is
    decoded straight into its first place in the output (placed by ``_copy``), and its
    other places copy it from there. 0, _NO_MEMORY, _CORRUPT for a blob that does not
    decode, or the kernel's -1.
    """
    cdef Py_ssize_t per = c.n_out * c.k, row, i, q
    cdef int64_t e
    cdef int rc = 0
    cdef bint plain = _plain(c)
    cdef size_t fb = c.inner * c.out_itemsize  # bytes of one frame in the output
    cdef unsigned char *at
    cdef void *dctx = lf_dctx_new()  # one per part: parts and calls run in parallel threads
    if dctx == NULL:
        return _NO_MEMORY
    for row in range(r0, r1):
        for i in range(row * per, (row + 1) * per):
            if entry[i] >= 0:
                e = entry[i] & _ENTRY_MASK
                if lf_reader_decode_upto(&rs.r[entry[i] >> 32], dctx, <size_t>e + 1) != 0:
                    rc = _CORRUPT
                    break
                src[i] = lf_reader_frame(&rs.r[entry[i] >> 32], e)
        if rc != 0:
            break
        if plain:
            for q in range(per):
                at = c.dst[q // c.k] + row * c.obs_bytes + (q % c.k) * fb
                if src[row * per + q] != at:  # else decoded there
                    memcpy(at, src[row * per + q], fb)
        else:
            rc = _kernel(c, src, row, row + 1)
            if rc != 0:
                break
    lf_ctx_free(dctx)
    return rc


# A copy of at least 2 * _part_bytes of work is split into parts of consecutive rows, one
# per thread (lf_parallel_for, csrc/parallel.h), up to get_num_threads() parts of at least
# _part_bytes of work each (bench/bench_parallel.py --split measures where splitting
# pays). The work is the output's bytes plus, for each cold frame the copy reads that the
# codec decodes (a codec keyframe, packed patch or XOR delta), _COLD_WEIGHT times its
# bytes: decoding such a frame costs a few copies of it, while a patch or a root decodes by
# copies about as an uncompressed frame does (a sample(32) of Atari observations with their
# next ones, 1.8 MB, is one part, uncompressed or of patches; with codec blobs among its
# frames, two). Measured on the AMD host (2 vCPUs), back to back on an idle machine, a 1.8
# MB gather split took 0.57x one thread's time (since workers watch for work before they
# sleep, csrc/parallel.c); but with another process busy on the other vCPU, 1.6x (a
# worker that claims a part and is then preempted holds the call up): a sample(32) next to
# an SB3 SubprocVecEnv or Ray actors would pay that, so small copies stay whole.
cdef size_t _part_bytes = 1 << 20
cdef size_t _COLD_WEIGHT = 2
_PART_BYTES = _part_bytes  # for the tests and benchmarks: where a copy starts to split


def _set_part_bytes(n):
    """Set the part size (``_part_bytes``, at least 65,536) and return the previous one.

    For benchmarks that measure where splitting starts to pay (bench/bench_parallel.py).
    """
    global _part_bytes
    cdef size_t old = _part_bytes
    n = operator.index(n)
    if n < 65536:
        raise ValueError(f"the part size must be at least 65536 bytes, got {n}")
    _part_bytes = n
    return old


cdef enum:
    _COPY_PARTS = 64  # LF_PARALLEL_MAX: the most parts a copy splits into


cdef struct _Parts:
    const _Copy *c
    _Readers *rs                 # each part's readers: it decodes the cold frames of its rows
    int64_t *entry
    const unsigned char **src
    size_t expect                # entries a part's reader makes room for at first
    int n
    int rc[_COPY_PARTS]


cdef inline Py_ssize_t _part_start(Py_ssize_t n_obs, int n, int t) noexcept nogil:
    """The first row of part ``t`` of ``n`` over ``n_obs`` rows (``n_obs`` for ``t == n``)."""
    return <Py_ssize_t>((<size_t>n_obs * <size_t>t) // <size_t>n)


cdef void _resolve_part(void *ctx, int t) noexcept nogil:
    """Task ``t`` of ``lf_parallel_for``, the GIL held (the pool does not change): the readers
    of part ``t``, an entry in each for every cold frame of its rows (only they are written)."""
    cdef _Parts *w = <_Parts *>ctx
    cdef const _Copy *c = w.c
    cdef Py_ssize_t per = c.n_out * c.k, i, q
    cdef Py_ssize_t i0 = _part_start(c.n_obs, w.n, t) * per
    cdef Py_ssize_t i1 = _part_start(c.n_obs, w.n, t + 1) * per
    cdef bint plain = _plain(c)
    cdef size_t fb = c.inner * c.out_itemsize  # bytes of one frame in the output
    cdef lf_pool *p
    cdef int64_t e
    cdef int j
    if c.pools == NULL:  # the rows' chains on the way, a level at a time
        lf_reader_prefetch(c.pool, c.ids + i0, i1 - i0, -1)
    for i in range(i0, i1):
        if w.entry[i] == -2:
            p = c.pool if c.pools == NULL else c.pools[i // per]
            j = _resolve(&w.rs[t], p, c.ids[i], &e, w.expect)
            if j < 0:
                w.rc[t] = _NO_MEMORY
                return
            w.entry[i] = (<int64_t>j << 32) | e
            if plain:  # decoded into its first place (output q // k, frame q % k)
                q = i % per
                lf_reader_place(&w.rs[t].r[j], e, c.dst[q // c.k] + (i // per) * c.obs_bytes
                                + (q % c.k) * fb)


cdef void _run_part(void *ctx, int t) noexcept nogil:
    """Task ``t`` of ``lf_parallel_for``: decode and copy, or copy, the rows of part ``t``."""
    cdef _Parts *w = <_Parts *>ctx
    cdef Py_ssize_t r0 = _part_start(w.c.n_obs, w.n, t), r1 = _part_start(w.c.n_obs, w.n, t + 1)
    if w.rs[t].n:
        w.rc[t] = _decode_copy(w.c, &w.rs[t], w.entry, w.src, r0, r1)
    else:
        w.rc[t] = _kernel(w.c, w.src, r0, r1)


cdef int _run_parts(_Parts *w) noexcept nogil:
    """Run every part of ``w`` (in parallel when there are several); the first part's failure."""
    cdef int t
    lf_parallel_for(w.n, _run_part, w)
    for t in range(w.n):
        if w.rc[t] != 0:
            return w.rc[t]
    return 0


def set_num_threads(n):
    """Set how many threads a large copy out uses, the calling thread included.

    Every gather, sample and conversion of a batch of at least about 2 MB of work (its
    output, and twice the bytes of the compressed frames it decodes) splits its rows (and
    the decoding of its compressed frames) across up to ``n`` threads: the caller and
    ``n - 1`` workers of a pool made on first use. ``1`` copies in the calling thread only.
    The default is the CPUs this process may run on (``os.sched_getaffinity(0)``), or
    ``LAZYFRAMES_NUM_THREADS`` when set at import.

    The setting is the process's, for every thread's calls. A copy made while another
    call holds the workers runs in its own thread alone. With a ``ReplayBuffer.sampler``,
    the copies run in its thread while the learner computes: their threads compete with
    the learner's (``torch.set_num_threads``); see docs/DESIGN.md, "Threads and limits".

    Raises:
        TypeError: ``n`` is not an integer (a ``bool`` is not one).
        ValueError: ``n`` is not in ``[1, 64]``.
    """
    if isinstance(n, bool) or not hasattr(type(n), "__index__"):
        raise TypeError(f"set_num_threads: n must be an int, got {type(n).__name__}")
    cdef object v = operator.index(n)
    if not 1 <= v <= LF_PARALLEL_MAX:
        raise ValueError(f"set_num_threads: n must be in [1, {LF_PARALLEL_MAX}], got {v}")
    lf_parallel_set_threads(<int>v)


def get_num_threads():
    """How many threads a large copy out uses, the calling thread included (``set_num_threads``)."""
    return lf_parallel_threads()


def _parallel_tasks():
    """(parts run, parts run by worker threads) since the process started; for tests."""
    return lf_parallel_tasks_run(), lf_parallel_tasks_by_workers()


def _threads_at_import():
    """``LAZYFRAMES_NUM_THREADS`` if set, else the CPUs this process may run on (at most 64).

    Raises:
        ValueError: the variable is not an integer in ``[1, 64]``.
    """
    raw = os.environ.get("LAZYFRAMES_NUM_THREADS", "").strip()
    if raw:
        try:
            n = int(raw)
        except ValueError:
            n = 0
        if not 1 <= n <= LF_PARALLEL_MAX:
            raise ValueError(
                f"LAZYFRAMES_NUM_THREADS must be an integer in [1, {LF_PARALLEL_MAX}], got {raw!r}"
            )
        return n
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        n = os.cpu_count() or 1
    return max(1, min(n, LF_PARALLEL_MAX))


set_num_threads(_threads_at_import())


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
    """Phase 2: the one copy out of ``c.ids`` into ``c.out`` (see the top of this file).

    The rows are split into parts of consecutive rows, one per thread, when the copy is
    large (``_part_bytes``); a small one is one part, copied in the calling thread, by the
    same code. A cold (compressed) frame is decoded into per-call scratch, each frame and
    each member of its delta chain once per part: each part has its own readers and
    decompression context and decodes the frames of its rows (a frame two parts share is
    decoded in each). The parts resolve their rows' cold frames in parallel too, with the
    GIL held (so that the pool does not change; each part writes only its own readers).
    Every id is pinned (a reference taken) before the GIL is released, so no other thread
    compresses or frees its frame, or the members of a cold frame's chain, meanwhile.

    Raises:
        RuntimeError: an output changed since phase 1. IndexError, ValueError: an id
            out of range or free. Nothing is written then.
        MemoryError: no memory for the decoded frames.
        RuntimeError: a compressed frame does not decode.
    """
    cdef Py_ssize_t per = c.n_out * c.k, m = c.n_obs * per, i, n_pinned = 0, n_cold = 0
    cdef lf_pool *p
    cdef int rc = 0, o, n
    cdef int64_t bad = -1  # the slot of a blob that did not decode
    for o in range(c.n_out):
        if not _fits(<object>c.out[o], c):
            raise RuntimeError("out changed while the call was checking its other arguments")
        c.dst[o] = <unsigned char *>cnp.PyArray_DATA(<cnp.ndarray>c.out[o])
    c.obs_bytes = c.k * c.outer * c.inner * c.out_itemsize
    cdef size_t nbytes = c.obs_bytes * <size_t>c.n_obs * <size_t>c.n_out, work = nbytes
    cdef _Parts w
    w.c = c
    w.n = 0  # parts (and their readers) made once the ids are checked
    cdef _Readers rs[_COPY_PARTS]
    w.rs = rs
    cdef int t
    cdef bint cold = False
    cdef const unsigned char *few[_FEW]  # on the stack up to a batch of 32 obs+next of k=4
    cdef const unsigned char **src = few
    cdef int64_t few_entry[_FEW]
    cdef int64_t *entry = few_entry  # -1 for a hot frame, a cold one's reader entry
    cdef int j
    if m > _FEW:
        src = <const unsigned char **>malloc(m * sizeof(void *))
        entry = <int64_t *>malloc(m * sizeof(int64_t))
        if src == NULL or entry == NULL:
            free(src if src != few else NULL)
            free(entry if entry != few_entry else NULL)
            raise MemoryError()
    w.src = src
    w.entry = entry
    try:
        if c.pools == NULL:  # the ids' records on the way (the loop below reads them)
            lf_reader_prefetch(c.pool, c.ids, m, 1)
        for i in range(m):  # every id checked (live) before anything is written
            p = c.pool if c.pools == NULL else c.pools[i // per]
            if not lf_pool_is_live(p, c.ids[i]):
                _check_ids(p, c.ids + i, 1)  # raises, naming the slot
            if lf_pool_is_hot(p, c.ids[i]):
                src[i] = lf_pool_addr(p, c.ids[i])
                entry[i] = -1
            else:  # its reader is its part's, below
                entry[i] = -2
                n_cold += 1
                if lf_pool_codec_blob(p, c.ids[i]):  # decoding by the codec is work too
                    work += _COLD_WEIGHT * p.frame_bytes
        # two parts or more only when the GIL is released: work >= 2 * _part_bytes >= 128
        # KiB means cold frames or nbytes >= _NOGIL_BYTES
        n = <int>max(1, min(<size_t>lf_parallel_threads(), work // _part_bytes,
                            <size_t>c.n_obs, <size_t>_COPY_PARTS))
        for t in range(n):
            rs[t].r = NULL
            rs[t].n = 0
            w.rc[t] = 0
        w.n = n
        # a part's entries: the distinct cold frames of its rows (k + 1 of a window's 2k)
        # and the rest of their chains (~3.4 a window at group 64, fewer at 8): about as many as
        # ids (lf_reader_expect caps it at the pool's cold frames: stack() over many pools)
        w.expect = <size_t>n_cold // <size_t>w.n + <size_t>n_cold // (4 * <size_t>w.n) + 16
        if n_cold and w.n > 1:
            lf_parallel_for(w.n, _resolve_part, &w)  # the GIL held: no Python code runs
        elif n_cold:
            _resolve_part(&w, 0)
        for t in range(w.n if n_cold else 0):
            if w.rc[t] != 0:
                raise MemoryError()
            for j in range(rs[t].n):
                if lf_reader_reserve(&rs[t].r[j]) != 0:
                    raise MemoryError()
            cold = cold or rs[t].n > 0
        if cold or nbytes >= _NOGIL_BYTES:
            # a reference on every frame while the GIL is released (with the GIL held and
            # no Python code running, nothing can free or move one; a cold frame's keeps
            # its chain), unless owners the call holds have one on each already (c.held):
            # a frame an owner holds is neither freed nor compressed (its reference is
            # not a cold one)
            if not c.held:
                for i in range(m):
                    lf_pool_incref(c.pool if c.pools == NULL else c.pools[i // per], c.ids[i])
                n_pinned = m
            _busy(c, 1)  # the pools' frames may not move (enable_compression) meanwhile
            with nogil:
                rc = _run_parts(&w)
            _busy(c, -1)
        else:
            rc = _run_parts(&w)  # one part (nbytes < _NOGIL_BYTES), in this thread
    finally:
        for i in range(n_pinned):
            lf_pool_decref(c.pool if c.pools == NULL else c.pools[i // per], c.ids[i])
        for t in range(w.n):
            for i in range(rs[t].n):
                bad = max(bad, rs[t].r[i].bad)
                lf_reader_release(&rs[t].r[i])
            free(rs[t].r)
        if src != few:
            free(src)
            free(entry)
    if rc == _NO_MEMORY:
        raise MemoryError()
    if rc == _CORRUPT:
        raise RuntimeError(f"the compressed frame in slot {bad} does not decode: the pool's "
                           f"memory is corrupted")
    if rc != 0:  # _output checked the pair: unreachable unless the kernels disagree
        raise TypeError("the copy kernel refused the conversion")
    return 0


cdef object _copy_out(FramePool pool, lf_layout code, const int64_t *ids, Py_ssize_t b,
                      Py_ssize_t k, object out, object dtype, object scale, bint batch=True):
    """Both phases for ``b`` observations of ``k`` ids an owner holds (so they are private).

    The caller is a method of that owner, which it keeps alive until the copy ends: the
    owner's references keep its frames live and hot while the GIL is released.
    """
    cdef _Copy c
    memset(&c, 0, sizeof(c))
    c.n_out = 1
    c.held = True
    res = _output(pool, code, b, k, out, dtype, scale, &c, 0, batch)
    c.ids = ids
    _copy(&c)
    return res


def _memcpy_gather(FramePool pool, slots, out, *, layout="stack"):
    """The floor of a random gather, for benchmarks: a plain C loop over the same frames.

    Copies the frames of ``slots`` (``(B, k)`` slot ids, checked as
    :meth:`FramePool.gather` does) into ``out``, a C-contiguous writeable uint8 ndarray
    of exactly ``B * k * frame_bytes`` bytes (any shape), with the GIL released: the same
    frame addresses as a gather, without conversion. ``"stack"`` and ``"first"``: one
    ``memcpy`` per frame, one after the other. ``"last"``: a plain nested loop of the
    interleave, ``out[b, p, j * C + c] = frame_j[p, c]`` byte by byte (``p`` a pixel,
    ``C`` the frame's last axis), no kernel: frame by frame, the pixels innermost (with
    the bytes of a pixel innermost, gcc makes each pixel a ``memcpy`` call: 2-3x slower).

    Raises:
        IndexError, ValueError: bad slot ids, a bad ``out`` or ``layout``.
    """
    cdef lf_layout code = _layout_code(layout)
    pool._ready()
    hold = []
    cdef cnp.ndarray a = _ids(pool, slots, hold)
    if cnp.PyArray_NDIM(a) != 2 or a.shape[1] == 0:
        raise ValueError(f"slots must have shape (B, k) with k >= 1, got {(<object>a).shape}")
    cdef _Copy c
    memset(&c, 0, sizeof(c))
    c.pool = &pool.p
    c.ids = <const int64_t *>cnp.PyArray_DATA(a)
    c.n_obs = a.shape[0]
    c.k = a.shape[1]
    c.n_out = 1
    c.outer = 1 if code != LF_LAST else pool._outer[<int>code]
    c.inner = pool.p.frame_bytes // c.outer  # bytes: itemsize 1
    c.itemsize = 1
    c.floor = True
    c.nd = 1
    c.dims[0] = c.n_obs * c.k * pool.p.frame_bytes
    if type(out) is np.ndarray and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>out):
        flat = out.reshape(-1)  # a view: C-contiguous
    else:
        flat = out  # refused by _target
    if not _apart(out, slots):
        _check_no_overlap(out, {"slots": slots})
    _target(flat, &c, np.dtype(np.uint8), 0)
    _copy(&c)
    return out
