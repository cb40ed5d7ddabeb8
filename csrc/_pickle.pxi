# Pickling, and the shared pools unpickled frames go to.
#
# Included by _core.pyx. A pickle carries frame bytes, never slot ids or pools: a
# FrameRef pickles as its frame, a LazyFrames as its FrameRefs (shared within one
# dump, so each frame is written once), a LazyBatch as its rows. Restoring checks
# the types, and that the frames of one observation or batch are in one pool.

_default_pools = {}  # kept for the process: an idle pool holds at most one empty chunk


def default_pool(frame_shape, dtype):
    """The shared pool for frames of ``frame_shape`` and ``dtype``.

    Used by ``LazyFrames(list_of_frames)`` and by unpickling. It lives for the
    process, so its dedupe cache survives between observations; once idle it holds at
    most one empty chunk (``chunk_bytes``, 1 MiB by default).

    Example:
        >>> default_pool((84, 84, 1), np.uint8) is default_pool([84, 84, 1], "uint8")
        True
    """
    key = (C.frame_shape(frame_shape), C.frame_dtype(dtype))
    pool = _default_pools.get(key)
    if pool is None:
        pool = FramePool(*key)
        _default_pools[key] = pool
    return pool


cdef str _malformed(str what, object x):
    """The message of a pickle of ``what`` whose state ``x`` is not what it pickles as."""
    got = type(x).__name__
    if isinstance(x, tuple):
        got = f"a tuple of {', '.join(sorted({type(i).__name__ for i in x}))}" if x else "()"
    return f"a pickled {what} is malformed: got {got}"


def _restore_frame(frame):
    """Unpickle one frame: push it into ``default_pool(frame.shape, frame.dtype)``.

    Raises:
        TypeError: ``frame`` is not a numeric ndarray.
    """
    if not isinstance(frame, np.ndarray):
        raise TypeError(_malformed("frame", frame))
    return default_pool(frame.shape, frame.dtype).push(frame)


def _restore_lazyframes(refs, layout):
    """Unpickle a LazyFrames from its FrameRefs (a non-empty tuple, all of one pool).

    Raises:
        TypeError: ``refs`` is not a non-empty tuple of FrameRefs. ValueError: frames
            of several pools.
    """
    if not (type(refs) is tuple and refs and all([type(r) is FrameRef for r in refs])):
        raise TypeError(_malformed("LazyFrames", refs))
    pool = (<FrameRef>refs[0]).pool  # TypeError if uninitialised
    for r in refs:
        (<FrameRef>r)._slot_of(pool)  # ValueError for a FrameRef of another pool
    return pool.lazy(refs, layout=layout)


def _restore_lazybatch(rows, layout):
    """Unpickle a LazyBatch from its rows (a non-empty tuple of LazyFrames of one pool and k).

    Raises:
        TypeError: ``rows`` is not a non-empty tuple of LazyFrames. ValueError: rows of
            several pools or stack sizes.
    """
    if not (type(rows) is tuple and rows and all([type(r) is LazyFrames for r in rows])):
        raise TypeError(_malformed("LazyBatch", rows))
    cdef LazyFrames first, o
    for x in rows:
        (<LazyFrames>x)._ready()
    first = rows[0]
    cdef FramePool pool = first._pool
    cdef Py_ssize_t n = len(rows), k = first._k, i
    for x in rows:
        o = x
        if o._pool is not pool:
            raise ValueError("this LazyFrames belongs to another pool")
        if o._k != k:
            raise ValueError(f"rows have different stack sizes: {k} and {o._k}")
    cdef lf_layout code = pool._layout(layout)
    cdef LazyBatch b = _new_batch(code, n, k)
    for i in range(n):  # the rows own these ids, so they are live
        memcpy(b._slots + i * k, (<LazyFrames>rows[i])._slots, k * sizeof(int64_t))
    _incref_all(&pool.p, b._slots, n * k)
    b._n = n
    b._pool = pool
    return b
