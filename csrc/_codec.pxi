# encode_frames / decode_frames: frames <-> one compressed container, for checkpoints.
#
# Included by _core.pyx. The container is (payload, offsets, kinds): blob i is
# payload[offsets[i]:offsets[i + 1]], of kind KIND_KEY (a Blosc2 chunk of the frame),
# KIND_DELTA (a Blosc2 chunk of the frame XOR the previous frame) or KIND_RAW (the
# frame's bytes: a frame that does not compress is stored raw).


cdef enum:  # the kinds, as C constants (the values of _checks.KIND_*)
    _KEY = 0
    _DELTA = 1
    _RAW = 2


def encode_frames(frames, *, codec=C.DEFAULT_COMPRESSION["codec"],
                  level=C.DEFAULT_COMPRESSION["level"], group=C.DEFAULT_COMPRESSION["group"]):
    """Compress ``n`` frames into one container: XOR deltas, a keyframe every ``group`` frames.

    Frame i is a keyframe when ``i % group == 0``, else the XOR delta against frame
    ``i - 1``, compressed with ``codec`` at ``level`` (the codec of a compressing
    :class:`FramePool`; docs/COMPRESSION.md). :func:`decode_frames` inverts it.

    Args:
        frames: a numeric array ``(n, *S)``, ``n >= 0``.
        codec, level, group: as :meth:`FramePool.enable_compression`.

    Returns:
        ``(payload, offsets, kinds)``: ``bytes``, int64 ``(n + 1,)`` and uint8 ``(n,)``.

    Raises:
        TypeError, ValueError: frames that are not a numeric array with a leading axis,
            or bad options.

    Example:
        >>> frames = np.zeros((3, 84, 84), np.uint8)
        >>> payload, offsets, kinds = encode_frames(frames, group=2)
        >>> kinds.tolist(), len(payload) < 3 * 84 * 84
        ([0, 1, 0], True)
        >>> np.array_equal(decode_frames(payload, offsets, kinds, (84, 84), np.uint8), frames)
        True
    """
    opts = C.compression({"codec": codec, "level": level, "group": group})
    a = np.asarray(frames)
    if a.ndim < 1:
        raise ValueError(f"frames must have a leading axis, got shape {a.shape}")
    C.frame_dtype(a.dtype)  # a numeric dtype (TypeError otherwise)
    cdef cnp.ndarray arr = np.ascontiguousarray(a)
    cdef Py_ssize_t n = arr.shape[0], i
    cdef size_t fb = arr.itemsize * (arr.size // n if n else 0)
    cdef lf_codec c
    c.codec = _CODEC_CODES[opts["codec"]]
    c.level = opts["level"]
    c.group = opts["group"]
    if not lf_codec_valid(c, fb):
        raise ValueError(f"frames of {fb} bytes are too large to compress")
    offsets = np.zeros(n + 1, np.int64)
    kinds = np.zeros(n, np.uint8)
    cdef int64_t[::1] off = offsets
    cdef uint8_t[::1] kd = kinds
    cdef size_t one = 1
    cdef unsigned char *buf = <unsigned char *>malloc(max(one, <size_t>n * (fb + LF_BLOB_OVERHEAD)))
    cdef unsigned char *delta = <unsigned char *>malloc(max(one, fb))
    cdef void *cctx = lf_cctx_new(c)
    cdef const unsigned char *src = <const unsigned char *>cnp.PyArray_DATA(arr)
    cdef const unsigned char *frame
    cdef long r = 0
    try:
        if buf == NULL or delta == NULL or cctx == NULL:
            raise MemoryError()
        with nogil:
            for i in range(n):
                frame = src + i * fb
                if i % c.group:
                    lf_xor_of(delta, frame, frame - fb, fb)
                    frame = delta
                    kd[i] = _DELTA
                else:
                    kd[i] = _KEY
                r = lf_compress(cctx, frame, fb, buf + off[i])
                if r < 0:
                    break
                off[i + 1] = off[i] + r
        if r < 0:
            raise MemoryError("the codec failed to compress a frame")
        payload = (<char *>buf)[:off[n]]
    finally:
        free(buf)
        free(delta)
        lf_ctx_free(cctx)
    return payload, offsets, kinds


def decode_frames(payload, offsets, kinds, frame_shape, dtype):
    """The frames ``(n, *frame_shape)`` of a container made by :func:`encode_frames`.

    Every size and offset is checked before anything is allocated, and every blob
    while it is decoded: untrusted input raises ValueError, never crashes.

    Args:
        payload: bytes-like, the blobs one after the other.
        offsets: ints ``(n + 1,)``: 0, then the end of each blob.
        kinds: ints ``(n,)``: ``KIND_KEY``, ``KIND_DELTA`` (not first) or ``KIND_RAW``.
        frame_shape, dtype: of one frame.

    Raises:
        TypeError, ValueError: a bad shape or dtype, or a container that is not valid.
    """
    shape = C.frame_shape(frame_shape)
    dt = C.frame_dtype(dtype)
    cdef size_t fb = math.prod(shape) * dt.itemsize
    data, offs, kds = _check_container(payload, offsets, kinds, fb)
    cdef Py_ssize_t n = kds.shape[0], i
    out = np.empty((n, *shape), dt)
    if n == 0:
        return out
    cdef const unsigned char[::1] pl = data
    cdef const int64_t[::1] off = offs
    cdef const uint8_t[::1] kd = kds
    cdef unsigned char *dst = <unsigned char *>cnp.PyArray_DATA(out)
    cdef void *dctx = lf_dctx_new()
    cdef Py_ssize_t bad = -1
    if dctx == NULL:
        raise MemoryError()
    with nogil:
        for i in range(n):
            if kd[i] == _RAW:
                memcpy(dst + i * fb, &pl[0] + off[i], fb)  # its size was checked
            elif lf_decompress(dctx, &pl[0] + off[i], off[i + 1] - off[i], dst + i * fb, fb):
                bad = i
                break
            elif kd[i] == _DELTA:
                lf_xor_into(dst + i * fb, dst + (i - 1) * fb, fb)
    lf_ctx_free(dctx)
    if bad >= 0:
        raise ValueError(f"blob {bad} of the container does not decode to one frame")
    return out
