# encode_frames / decode_frames: frames <-> one compressed container, for checkpoints
# and messages.
#
# Included by _core.pyx. The container is (payload, offsets, kinds): blob i is
# payload[offsets[i]:offsets[i + 1]], of a kind of codec.h: the frames coded as a
# compressing pool codes them (keyframes, and patches or XOR blobs against a frame of
# their group), so that FramePool.adopt stores them as they are.


def encode_frames(frames, *, codec=C.DEFAULT_COMPRESSION["codec"],
                  level=C.DEFAULT_COMPRESSION["level"], group=C.DEFAULT_COMPRESSION["group"],
                  keys=None):
    """Compress ``n`` frames into one container, with a compressing :class:`FramePool`'s coder.

    Frame 0 is a keyframe (``KIND_KEY``; with zstd, LZ4's blob unless zstd's is 128 bytes
    smaller), and so is each frame of ``keys`` and each that a group of ``group`` frames has
    no room for or that a delta would not pay for. The others are ``KIND_PATCH`` or
    ``KIND_PACKED`` deltas against the frame of their group at position ``pos - lowbit(pos)``
    (a tree; docs/COMPRESSION.md). :func:`decode_frames` inverts it;
    :meth:`FramePool.adopt` stores its blobs as they are, with those references.

    Args:
        frames: a numeric array ``(n, *S)``, ``n >= 0``.
        codec, level, group: as :meth:`FramePool.enable_compression`.
        keys: indices of frames that start a keyframe, e.g. the first frame of each env
            (a delta between envs does not pay), or None.

    Returns:
        ``(payload, offsets, kinds)``: ``bytes``, int64 ``(n + 1,)`` and uint8 ``(n,)``.

    Raises:
        TypeError, ValueError: frames that are not a numeric array with a leading axis,
            bad options or keys.

    Example:
        >>> frames = np.zeros((3, 84, 84), np.uint8)
        >>> payload, offsets, kinds = encode_frames(frames, keys=[2])
        >>> kinds.tolist() == [KIND_KEY, KIND_PATCH, KIND_KEY], len(payload) < 84 * 84
        (True, True)
        >>> np.array_equal(decode_frames(payload, offsets, kinds, (84, 84), np.uint8), frames)
        True
    """
    opts = C.compression({"codec": codec, "level": level, "group": group})
    a = np.asarray(frames)
    if a.ndim < 1:
        raise ValueError(f"frames must have a leading axis, got shape {a.shape}")
    C.frame_dtype(a.dtype)  # a numeric dtype (TypeError otherwise)
    cdef cnp.ndarray arr = np.ascontiguousarray(a)
    cdef Py_ssize_t n = arr.shape[0]
    cdef size_t fb = arr.itemsize * (arr.size // n if n else 0)
    is_key = np.zeros(n, np.uint8)
    if keys is not None:
        at = _as_ints(keys, "keys")
        if at.ndim != 1 or ((at < 0) | (at >= n)).any():
            raise ValueError(f"keys must be indices of the {n} frames")
        is_key[at] = 1
    cdef const unsigned char[::1] kk = is_key
    cdef lf_codec c
    c.codec = _CODEC_CODES[opts["codec"]]
    c.level = opts["level"]
    c.group = opts["group"]
    if not lf_codec_valid(c, fb):
        raise ValueError(f"frames of {fb} bytes are too large to compress")
    offsets = np.zeros(n + 1, np.int64)
    kinds = np.zeros(n, np.uint8)
    if n == 0:
        return b"", offsets, kinds
    cdef int64_t[::1] off = offsets
    cdef uint8_t[::1] kd = kinds
    cdef unsigned char *buf = <unsigned char *>malloc(<size_t>n * (fb + LF_BLOB_OVERHEAD))
    cdef lf_coder coder
    memset(&coder, 0, sizeof(coder))
    cdef const unsigned char *src = <const unsigned char *>cnp.PyArray_DATA(arr)
    cdef int r = 0
    try:
        if buf == NULL or lf_coder_init(&coder, c, fb):
            raise MemoryError()
        with nogil:
            r = lf_coder_container(&coder, src, n, c.group, &kk[0], buf, &off[0], &kd[0])
        if r < 0:
            raise MemoryError("the codec failed to compress a frame")
        payload = (<char *>buf)[:off[n]]
    finally:
        free(buf)
        lf_coder_free(&coder)
    return payload, offsets, kinds


def decode_frames(payload, offsets, kinds, frame_shape, dtype, *, before=None):
    """The frames ``(n, *frame_shape)`` of a container made by :func:`encode_frames`.

    Every size and offset is checked before anything is allocated, and every blob
    while it is decoded: untrusted input raises ValueError, never crashes.

    Args:
        payload: bytes-like, the blobs one after the other.
        offsets: ints ``(n + 1,)``: 0, then the end of each blob.
        kinds: ints ``(n,)``, ``KIND_*``: the first a keyframe (``KIND_KEY`` or
            ``KIND_RAW``) unless ``before`` is given.
        frame_shape, dtype: of one frame.
        before: None, or the decoded frames ``(g, *frame_shape)`` of the group these
            blobs continue, from its keyframe on (how a container is decoded piece by
            piece: :func:`lazyframes.replay._archive.decode_piece`).

    Raises:
        TypeError, ValueError: a bad shape or dtype, or a container that is not valid.
    """
    shape = C.frame_shape(frame_shape)
    dt = C.frame_dtype(dtype)
    cdef size_t fb = math.prod(shape) * dt.itemsize
    data, offs, kds = _check_container(payload, offsets, kinds, fb)
    cdef Py_ssize_t n = kds.shape[0], i, g = 0
    cdef cnp.ndarray prior = None
    if before is not None:
        prior = np.ascontiguousarray(before, dt)
        g = prior.shape[0] if prior.ndim == len(shape) + 1 else -1
        if g < 1 or g > LF_MAX_GROUP or (<object>prior).shape[1:] != shape:
            raise ValueError(f"before must be 1 to {LF_MAX_GROUP} frames of shape {shape}, "
                             f"got shape {np.shape(before)}")
    out = np.empty((n, *shape), dt)
    if n == 0:
        return out
    cdef const unsigned char *pl = <const unsigned char *>cnp.PyArray_DATA(data)  # may be empty
    cdef const int64_t[::1] off = offs
    cdef const uint8_t[::1] kd = kds
    cdef unsigned char *dst = <unsigned char *>cnp.PyArray_DATA(out)
    cdef unsigned char *delta = <unsigned char *>malloc(max(<size_t>1, fb))
    cdef void *dctx = lf_dctx_new()
    cdef Py_ssize_t bad = -1
    cdef const unsigned char *pre = NULL if prior is None else \
        <const unsigned char *>cnp.PyArray_DATA(prior) + g * fb  # frame -1 at pre - fb
    cdef const unsigned char *base
    cdef lf_tree t
    cdef int64_t r
    t.start = -g
    t.pos = g - 1 if g else 0
    if dctx == NULL or delta == NULL:
        lf_ctx_free(dctx)
        free(delta)
        raise MemoryError()
    with nogil:
        for i in range(n):
            r = lf_tree_step(&t, i, kd[i])
            if r == LF_TREE_BAD:  # (before any pointer is formed from r)
                bad = i
                break
            base = NULL if r == LF_TREE_KEY else (pre + r * fb if r < 0 else dst + r * fb)
            if lf_kind_decode(dctx, kd[i], pl + off[i], off[i + 1] - off[i], base,
                              dst + i * fb, fb, delta):
                bad = i
                break
    lf_ctx_free(dctx)
    free(delta)
    if bad >= 0:
        raise ValueError(f"blob {bad} of the container does not decode to one frame (or is a "
                         f"delta with no frame to apply to)")
    return out
