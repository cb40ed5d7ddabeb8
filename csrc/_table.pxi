# SlotTable: R rows of W frame ids, the replay buffer's store.
#
# Included by _core.pyx. The table owns one reference per non-empty entry (-1 is
# empty), a cold one (a compressing pool compresses a frame that only tables hold).
# It changes only through its own methods, which check every argument first, then take
# the new references, then drop the old ones, then write, then compress what went cold.
# Reads (batch, gather, gather_pairs) read the entries in phase 2 (see _copyout.pxi)
# and take their references with no Python code in between, so a set or clear from a
# callback or another thread can never make them read a slot that was freed and reused.
#
# Storage. Ids are int32. A table of an even width W = 2h >= 4 stores a frame stack's row
# as one id: its last entry, the newest frame of the next observation. The pool records
# each frame's previous frame (lf_pool_set_prev: the frame before it in a part, the first
# record kept), and the row is the walk back from that frame along those links: h + 1
# frames, oldest first, where a frame without a previous one is repeated (the padding of
# an episode's first observations); the observation is the first h of them, the next one
# the last h. A row is stored so only when that walk gives exactly its entries, checked
# before it is written; the frames the walk repeats are sealed (LF_PREV_NONE) so that no
# later link changes it, and every frame the walk reads is an entry the row holds a
# reference on, so no link it follows changes or dangles while the row lives. Another row
# keeps its W entries in an overflow record and stores the record's number o as -2 - o
# (-1 is an empty row). 4 B per row at k = 4, not 32; every entry still owns its
# reference: only the storage changes.


cdef enum:
    _MAX_PARTS = 8  # owners one write of a row may combine (obs, next obs, final obs, ...)


cdef tuple _columns(object cols, Py_ssize_t width):
    """``cols`` as ints ``(start, stop)``, ``0 <= start < stop <= width`` (else ValueError)."""
    if type(cols) is tuple and len(cols) == 2 and type(cols[0]) is int and type(cols[1]) is int:
        start, stop = cols  # the usual call: exact ints, no index() to call
    else:
        try:
            start, stop = [operator.index(c) for c in cols]
        except (TypeError, ValueError):
            raise ValueError(
                f"columns {cols!r} must be (start, stop) with 0 <= start < stop <= {width}"
            ) from None
    if not 0 <= start < stop <= width:
        raise ValueError(
            f"columns {cols!r} must be (start, stop) with 0 <= start < stop <= {width}"
        )
    return start, stop


@cython.final
@cython.no_gc
cdef class SlotTable:
    """SlotTable(pool, rows, width)
--

A ``(rows, width)`` table of slot ids that owns one reference per non-empty entry.

    The replay buffer's store: row r holds the frames of transition r side by side
    (e.g. the k frames of an observation then the new frame of the next one). Entries
    start empty (-1). :meth:`set` writes observations' frames into rows, :meth:`gather`
    and :meth:`gather_pairs` copy observations out of column ranges, :meth:`batch` makes
    owners of them. Row indices are checked without arithmetic that could overflow, and
    every argument is checked before anything changes. Ids are stored as int32 (a slot
    id above ``2**31 - 1`` raises OverflowError); a table of an even width ``2h >= 4``
    stores a row that is a frame stack's observation and the next one in one id, the
    rest read along the previous frames the pool records (:meth:`memory`). In a compressing
    pool the table's references are cold: a frame only tables hold is compressed at the
    end of the next :meth:`set` or :meth:`take`. A table cannot be pickled.

    Args:
        pool: the :class:`FramePool` of every frame the table holds.
        rows: number of rows R, ``>= 0``.
        width: frame ids per row W, ``>= 1``.

    Raises:
        TypeError: ``pool`` is not a FramePool. ValueError: ``rows < 0``, ``width < 1``
            or a table too large to address. MemoryError: no memory for the table.

    Example:
        >>> pool = FramePool((2, 2), np.uint8)
        >>> table = SlotTable(pool, 8, 5)
        >>> obs = pool.push_batch(np.zeros((2, 2, 2), np.uint8), k=4)
        >>> new = pool.push_batch(np.ones((2, 2, 2), np.uint8))
        >>> table.set([0, 1], (obs, new))
        >>> a, b = table.gather_pairs([0, 1], (0, 4), [0, 1], (1, 5), layout="stack")
        >>> a.shape, b[:, -1, 0, 0].tolist()
        ((2, 4, 2, 2), [1, 1])
        >>> del obs, new; pool.live_frames
        4
    """

    cdef FramePool _pool  # None until initialised
    cdef int32_t *_t      # R * S stored ids, row-major (see _entries); -1 is empty
    cdef Py_ssize_t _R, _W
    cdef Py_ssize_t _S    # stored ids per row: 1 in a table of stacked rows, else W
    cdef Py_ssize_t _h    # W / 2 in a table of stacked rows (even W >= 4), else 0
    cdef int32_t *_x      # overflow records of W ids: the rows that are not stacks
    cdef Py_ssize_t _xcap, _xlive
    cdef int32_t _xfree   # the first free record (its first id links the next), or -1
    cdef int32_t *_row    # W ids: a row being written
    cdef uint8_t *_fit    # per row of the write in progress: phase 1's _stacked (see _fits)
    cdef Py_ssize_t _fitcap

    def __cinit__(self):
        self._pool = None
        self._t = self._x = self._row = NULL
        self._fit = NULL
        self._R = self._W = self._S = self._h = self._xcap = self._xlive = self._fitcap = 0
        self._xfree = -1

    def __init__(self, pool, rows, width):
        _fresh(self, self._pool is not None)
        if type(pool) is not FramePool:
            raise TypeError(f"pool must be a FramePool, got {type(pool).__name__}")
        (<FramePool>pool)._ready()
        R = operator.index(rows)
        W = operator.index(width)
        if R < 0 or W < 1:
            raise ValueError(f"a SlotTable needs rows >= 0 and width >= 1, got ({R}, {W})")
        if W > INT64_MAX // 8 or R > (INT64_MAX // 8) // W:  # compared, not multiplied
            raise ValueError(f"a SlotTable of ({R}, {W}) slot ids is too large")
        h = W // 2 if W % 2 == 0 and W >= 4 else 0
        S = 1 if h else W
        # commit: no Python code from here on (R * S * 4 bytes are memset: the table is
        # bounded by 2**63 - 1 bytes and by malloc, as any array)
        _fresh(self, self._pool is not None)
        self._t = <int32_t *>malloc(max(1, R * S) * sizeof(int32_t))
        self._row = <int32_t *>malloc(W * sizeof(int32_t))
        if self._t == NULL or self._row == NULL:
            free(self._t)
            free(self._row)
            self._t = self._row = NULL
            raise MemoryError(f"a SlotTable of ({R}, {W}) slot ids is too large")
        memset(self._t, 0xFF, R * S * sizeof(int32_t))  # every entry -1: empty
        self._R = R
        self._W = W
        self._S = S
        self._h = h
        self._pool = pool

    def __dealloc__(self):
        cdef Py_ssize_t i, j
        if self._pool is not None and self._row != NULL:
            for i in range(self._R):
                self._entries(self._t + i * self._S, self._row)
                for j in range(self._W):
                    if self._row[j] >= 0:
                        lf_pool_decref_cold(&self._pool.p, self._row[j])
        free(self._t)
        free(self._x)
        free(self._row)
        free(self._fit)

    cdef inline void _entries(self, const int32_t *row, int32_t *out) noexcept:
        """The ``W`` entries of the row stored at ``row`` into ``out`` (the storage note)."""
        cdef Py_ssize_t h = self._h, j
        cdef int32_t v = row[0]
        if h == 0 or v < -1:
            memcpy(out, row if h == 0 else self._x + (-2 - <Py_ssize_t>v) * self._W,
                   self._W * sizeof(int32_t))
        elif v == -1:
            memset(out, 0xFF, self._W * sizeof(int32_t))
        else:  # the walk: the next observation, then the observation's oldest frame
            out[2 * h - 1] = v
            for j in range(2 * h - 2, h - 1, -1):
                out[j] = _back(&self._pool.p, out[j + 1])
            memcpy(out + 1, out + h, (h - 1) * sizeof(int32_t))
            out[0] = _back(&self._pool.p, out[h])

    cdef int _reserve(self, const int64_t *r, Py_ssize_t e, Py_ssize_t over) except -1:
        """Phase 1 of a write of ``e`` distinct rows ``r``, ``over`` of them not stacks:
        room for their overflow records, the records these rows hold counted as free (the
        write drops them first).

        Raises:
            MemoryError: no memory (nothing changes then).
        """
        if self._h == 0:
            return 0
        cdef Py_ssize_t i, need = self._xlive + over
        for i in range(e):
            need -= self._t[r[i]] < -1
        if need <= self._xcap:
            return 0
        cdef Py_ssize_t cap = max(need, 2 * self._xcap, 16)
        if cap > INT32_MAX - 2:  # record numbers are stored as -2 - o in an int32
            cap = INT32_MAX - 2
            if need > cap:
                raise MemoryError("a SlotTable holds at most 2**31 - 3 rows that are not stacks")
        cdef int32_t *x = <int32_t *>realloc(self._x, cap * self._W * sizeof(int32_t))
        if x == NULL:
            raise MemoryError(f"no memory for {cap} overflow records of a SlotTable")
        for i in range(cap - 1, self._xcap - 1, -1):  # the new records, free
            x[i * self._W] = self._xfree
            self._xfree = <int32_t>i
        self._x = x
        self._xcap = cap
        return 0

    cdef int _stacked(self, const int32_t *full) noexcept:
        """1 if the ``W`` entries ``full`` are the walk from their last one (stored in one
        id), the previous frames of this write recorded; 2 if so and a frame the walk
        repeats has no previous frame recorded yet (phase 1 then seals it: _seal); else 0."""
        cdef Py_ssize_t h = self._h, j
        cdef int32_t q
        cdef bint unset = False
        if h == 0:
            return 0
        for j in range(2 * h):
            if full[j] < 0:
                return 0
        for j in range(1, h):
            if full[j] != full[h + j - 1]:
                return 0
        for j in range(2 * h - 1, h - 1, -1):  # each frame of the next observation
            q = lf_pool_prev(&self._pool.p, full[j])
            unset = unset or q == LF_PREV_UNSET
            if (q if q >= 0 else full[j]) != (full[j - 1] if j > h else full[0]):
                return 0
        return 2 if unset else 1

    cdef void _seal(self, const int32_t *full) noexcept:
        """Seal the frames the walk of the stacked entries ``full`` repeats: no previous
        frame is recorded for them later."""
        cdef Py_ssize_t j
        for j in range(self._h, 2 * self._h):
            lf_pool_set_prev(&self._pool.p, full[j], LF_PREV_NONE)  # never out of memory

    cdef int _fits(self, Py_ssize_t e) except -1:
        """Phase 1: room for the decisions of a write of ``e`` rows (MemoryError)."""
        cdef uint8_t *f
        if e > self._fitcap:
            f = <uint8_t *>realloc(self._fit, e)
            if f == NULL:
                raise MemoryError("no memory for a write of a SlotTable")
            self._fit = f
            self._fitcap = e
        return 0

    cdef void _fitted(self) noexcept:
        """After a write: drop a large room for decisions (a checkpoint's load)."""
        if self._fitcap > 4096:
            free(self._fit)
            self._fit = NULL
            self._fitcap = 0

    cdef int _decide(self, Py_ssize_t i, const int32_t *full) noexcept:
        """Phase 1, links recorded: whether row ``i`` of the write (entries ``full``) is
        stored in one id, kept for _put_row (sealing what its walk repeats); the number of
        overflow records it needs."""
        cdef int k = self._stacked(full)
        if k == 2:
            self._seal(full)
        self._fit[i] = k != 0
        return k == 0

    cdef void _put_row(self, Py_ssize_t r, const int32_t *full, bint stacked) noexcept:
        """Store the ``W`` entries ``full`` in the empty row ``r``: ``stacked`` (phase 1's
        decision) in one id, else in a record (reserved)."""
        cdef int32_t *row = self._t + r * self._S
        cdef int32_t o
        if self._h == 0:
            memcpy(row, full, self._W * sizeof(int32_t))
        elif stacked:
            row[0] = full[self._W - 1]
        else:
            o = self._xfree
            self._xfree = self._x[o * self._W]
            self._xlive += 1
            memcpy(self._x + o * self._W, full, self._W * sizeof(int32_t))
            row[0] = -2 - o

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
    def shape(self):
        """``(rows, width)``."""
        self._ready()
        return (self._R, self._W)

    def __len__(self):
        self._ready()
        return self._R

    def memory(self):
        """Bytes of the table itself, not of the frames.

        ``rows * width * 4``, or for an even ``width`` of at least 4, ``rows * 4`` plus
        ``width * 4`` per overflow record (one per row that is not a frame stack's
        observation and next one, allocated by doubling).
        """
        self._ready()
        return (self._R * self._S + self._xcap * self._W) * <Py_ssize_t>sizeof(int32_t)

    def grow(self, rows):
        """Enlarge the table to ``rows`` rows; the new rows are empty, the others kept.

        The replay buffer grows its table as transitions arrive, so a buffer of a large
        capacity costs memory in proportion to what it holds. No reference changes.

        Raises:
            ValueError: ``rows`` below the current number of rows, or a table too large
                to address. MemoryError: no memory (the table is unchanged then).
        """
        self._ready()
        R = operator.index(rows)
        if R < self._R:
            raise ValueError(f"a SlotTable grows only: {R} rows requested, it has {self._R}")
        self._resize(R)

    cdef int _resize(self, Py_ssize_t R) except -1:
        """Enlarge the table to ``R`` rows if it has fewer, new rows empty (MemoryError:
        unchanged). No Python code runs on success (reads and writes of the table hold the
        GIL and run no Python code, so none of them sees the old pointer after this)."""
        if R <= self._R:
            return 0
        if R > (INT64_MAX // 8) // self._W:
            raise ValueError(f"a SlotTable of ({R}, {self._W}) slot ids is too large")
        cdef int32_t *t = <int32_t *>realloc(self._t, max(1, R * self._S) * sizeof(int32_t))
        if t == NULL:
            raise MemoryError(f"a SlotTable of ({R}, {self._W}) slot ids is too large")
        memset(t + self._R * self._S, 0xFF, (R - self._R) * self._S * sizeof(int32_t))
        self._t = t
        self._R = R
        return 0

    def ids(self, rows=None):
        """A copy of the slot ids of ``rows`` (default: all), int64; -1 marks an empty entry.

        Args:
            rows: None (every row) or 1-D row indices.

        Raises:
            IndexError: a row out of range.
        """
        self._ready()
        cdef cnp.npy_intp dims[2]
        cdef cnp.ndarray out, r
        cdef Py_ssize_t i, j
        cdef int64_t *o
        if rows is None:
            r = np.arange(self._R, dtype=np.int64)
        else:
            r = _row_ids(rows, self._R, False)
        dims[0] = r.shape[0]
        dims[1] = self._W
        out = cnp.PyArray_EMPTY(2, dims, cnp.NPY_INT64, 0)
        o = <int64_t *>cnp.PyArray_DATA(out)
        for i in range(dims[0]):
            self._entries(self._t + (<const int64_t *>cnp.PyArray_DATA(r))[i] * self._S,
                          self._row)
            for j in range(self._W):
                o[i * self._W + j] = self._row[j]
        return out

    cdef void _drop_rows(self, const int64_t *r, Py_ssize_t e) noexcept:
        """Drop the references of rows ``r`` and mark them empty (uses ``_row``)."""
        cdef Py_ssize_t i, j
        cdef int32_t *row
        cdef int32_t v
        for i in range(e if self._h else 0):  # hints: the walks' links and refcounts
            v = self._t[r[i]]
            if v >= 0:
                lf_pool_prefetch_prev(&self._pool.p, v)
                lf_pool_prefetch_ref(&self._pool.p, v)
        for i in range(e):
            row = self._t + r[i] * self._S
            self._entries(row, self._row)  # all read before a reference is dropped
            for j in range(self._W):
                if self._row[j] >= 0:
                    lf_pool_decref_cold(&self._pool.p, self._row[j])
            if self._h and row[0] < -1:  # its overflow record, free
                v = -2 - row[0]
                self._x[<Py_ssize_t>v * self._W] = self._xfree
                self._xfree = v
                self._xlive -= 1
            memset(row, 0xFF, self._S * sizeof(int32_t))

    def set(self, rows, parts):
        """Store ``E`` observations side by side in ``rows``; part widths sum to the width.

        Row ``rows[i]`` becomes row i of each part, one after the other. The table takes
        a reference on each new id, then drops the references those rows held; no frame
        bytes are copied. The pool records, for consecutive distinct ids of a part (its
        frames oldest first), each frame's previous frame (the first record wins): what a
        row of a frame stack is stored along, and in a compressing pool the delta
        reference a frame is compressed against. Then a compressing pool compresses the
        frames that only tables hold now.

        Args:
            rows: 1-D ints, E distinct row indices in ``[0, rows)``.
            parts: a tuple of :class:`LazyBatch` (E rows each) or :class:`LazyFrames`
                (when E is 1) of this table's pool, whose stack sizes sum to ``width``.

        Raises:
            IndexError: a row out of range. ValueError: duplicate rows, parts of another
                pool or of the wrong size. TypeError: a part of another type.
                OverflowError: a slot id above ``2**31 - 1``. Nothing changes then.
        """
        self._ready()
        cdef cnp.ndarray r = _row_ids(rows, self._R, True)
        cdef Py_ssize_t e = r.shape[0], n
        cdef const int64_t *src[_MAX_PARTS]
        cdef Py_ssize_t ks[_MAX_PARTS]
        n = self._collect(parts, e, src, ks)
        cdef const int64_t *ri = <const int64_t *>cnp.PyArray_DATA(r)
        self._reserve_parts(ri, e, src, ks, n)
        # all checked: no Python code from here on
        _table_write(self, ri, e, src, ks, n)
        lf_pool_compress_pending(&self._pool.p)  # out of memory: frames stay hot, queued

    cdef Py_ssize_t _collect(self, object parts, Py_ssize_t e, const int64_t **src,
                             Py_ssize_t *ks, bint equal=False) except -1:
        """Phase 1 of a write of ``e`` rows: check ``parts``, and point ``src``/``ks`` at them.

        ``parts``: a tuple (or list) of at most ``_MAX_PARTS`` LazyBatch (``e`` rows each)
        or LazyFrames (when ``e`` is 1) of this table's pool, whose stack sizes sum to the
        width (``equal``: each the same, as a replay row's observation and next
        observation). Returns the number of parts. The owners keep the ids alive and
        unchanged while the caller holds ``parts``.

        Raises:
            ValueError: parts of another pool or of the wrong size. TypeError: a part of
                another type, or more than ``_MAX_PARTS``. OverflowError: a slot id above
                ``2**31 - 1``.
        """
        if type(parts) is not tuple and type(parts) is not list:
            raise TypeError(
                f"parts must be a tuple of LazyBatch or LazyFrames, got {type(parts).__name__}"
            )
        cdef Py_ssize_t n = len(parts), q, rows_, width = 0
        if n > _MAX_PARTS:
            raise TypeError(f"at most {_MAX_PARTS} parts, got {n}")
        for q in range(n):
            part = parts[q]
            if type(part) is LazyBatch:
                (<LazyBatch>part)._ready()
                if (<LazyBatch>part)._pool is not self._pool:
                    raise ValueError("this LazyBatch belongs to another pool")
                rows_ = (<LazyBatch>part)._n
                src[q] = (<LazyBatch>part)._slots
                ks[q] = (<LazyBatch>part)._k
            elif type(part) is LazyFrames:
                (<LazyFrames>part)._ready()
                if (<LazyFrames>part)._pool is not self._pool:
                    raise ValueError("this LazyFrames belongs to another pool")
                rows_ = 1
                src[q] = (<LazyFrames>part)._slots
                ks[q] = (<LazyFrames>part)._k
            else:
                raise TypeError(
                    f"parts must be a tuple of LazyBatch or LazyFrames, got {type(part).__name__}"
                )
            if rows_ != e:
                raise ValueError(f"a part has {rows_} rows, expected {e}")
            width += ks[q]
        if width != self._W:
            raise ValueError(f"parts have {width} frames per row, the table {self._W}")
        for q in range(n):
            if equal and ks[q] * n != self._W:
                raise ValueError(f"part {q} has {ks[q]} frames per row, the table "
                                 f"{self._W // n} per part")
            if _first_over_int32(src[q], e * ks[q]) >= 0:
                raise OverflowError(_ID_OVER_INT32)
        return n

    cdef int _reserve_parts(self, const int64_t *r, Py_ssize_t e, const int64_t **src,
                            const Py_ssize_t *ks, Py_ssize_t n) except -1:
        """Phase 1 of a write of checked parts (``_collect``) into rows ``r``: the previous
        frames recorded along the parts, then the overflow records the write needs
        (MemoryError: no entry changes; the records and seals stay, facts about frames)."""
        cdef Py_ssize_t i, j, q, col, over = 0
        cdef const int64_t *ids
        self._fits(e)
        for q in range(n):
            for i in range(e):
                ids = src[q] + i * ks[q]
                for j in range(1, ks[q]):
                    if lf_pool_set_prev(&self._pool.p, ids[j], ids[j - 1]):
                        raise MemoryError("no memory for a frame's link in a SlotTable")
        for i in range(e if self._h else 0):  # the rows that will need an overflow record
            col = 0
            for q in range(n):
                for j in range(ks[q]):
                    self._row[col + j] = <int32_t>src[q][i * ks[q] + j]
                col += ks[q]
            over += self._decide(i, self._row)
        return self._reserve(r, e, over)

    def clear(self, rows=None):
        """Empty ``rows`` (default: all), dropping their references.

        Raises:
            IndexError: a row out of range (nothing changes then).
        """
        self._ready()
        cdef cnp.ndarray r
        if rows is None:
            r = np.arange(self._R, dtype=np.int64)
        else:
            r = _row_ids(rows, self._R, True)
        self._drop_rows(<const int64_t *>cnp.PyArray_DATA(r), r.shape[0])

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef int _select(self, cnp.ndarray r, Py_ssize_t start, Py_ssize_t k, int64_t *dst,
                     Py_ssize_t stride) except -1:
        """Phase 2: the ids of columns ``[start, start + k)`` of checked rows ``r`` into ``dst``.

        Row i goes to ``dst + i * stride``. Reads the table with no Python code, so the
        caller takes its references before anything can change it.

        Raises:
            ValueError: an empty entry.
        """
        cdef const int64_t *ri = <const int64_t *>cnp.PyArray_DATA(r)
        cdef Py_ssize_t i, j
        cdef int32_t v
        for i in range(r.shape[0]):  # hints first: the rows' cache misses overlap
            lf_prefetch(self._t + ri[i] * self._S)
        for i in range(r.shape[0] if self._h else 0):  # then the links the walks start at
            v = self._t[ri[i]]
            if v >= 0:
                lf_pool_prefetch_prev(&self._pool.p, v)
        for i in range(r.shape[0]):
            self._entries(self._t + ri[i] * self._S, self._row)
            for j in range(k):
                v = self._row[start + j]
                if v < 0:
                    raise ValueError(f"row {ri[i]} is empty")
                dst[i * stride + j] = v
        return 0

    def batch(self, rows, start, stop, *, layout="stack"):
        """A :class:`LazyBatch` of columns ``[start, stop)`` of ``rows``.

        Raises:
            IndexError: a row out of range. ValueError: bad columns, an empty entry or a
                layout that does not fit.
        """
        self._ready()
        cdef cnp.ndarray r = _row_ids(rows, self._R, False)
        cdef Py_ssize_t a, z
        a, z = _columns((start, stop), self._W)
        cdef lf_layout code = self._pool._layout(layout)
        cdef LazyBatch b = _new_batch(code, r.shape[0], z - a)
        self._select(r, a, z - a, b._slots, z - a)
        _incref_all(&self._pool.p, b._slots, r.shape[0] * (z - a))
        b._n = r.shape[0]
        b._pool = self._pool  # last: from here on, dealloc drops the references
        return b

    def batch_pairs(self, rows1, cols1, rows2, cols2, *, layout="stack"):
        """A :class:`LazyBatch` of pairs of observations: ``cols1`` then ``cols2`` of each row.

        Row i holds columns ``cols1`` of ``rows1[i]`` then ``cols2`` of ``rows2[i]``: ``2k``
        frames, its :attr:`~LazyBatch.stack_size`. The owner of what :meth:`gather_pairs`
        copies, to copy later (a replay buffer's draw pins a batch's observations and next
        observations in one object): ``batch_pairs(..., layout=L).numpy_pairs()`` gives
        ``gather_pairs(..., layout=L)``'s arrays (their default layouts differ, as
        :meth:`batch`'s and :meth:`gather`'s do).

        Args:
            rows1, rows2: 1-D ints of one length B.
            cols1, cols2: ``(start, stop)`` column ranges of one width k.
            layout: as :meth:`batch`.

        Raises:
            IndexError: a row out of range. ValueError: rows of different lengths, bad
                columns or of different widths, an empty entry, a layout that does not fit.
        """
        self._ready()
        cdef cnp.ndarray r1 = _row_ids(rows1, self._R, False)
        cdef Py_ssize_t a1, z1, a2, z2
        a1, z1 = _columns(cols1, self._W)
        # (one checked copy when both are one object: a one-step draw's obs and next obs)
        cdef cnp.ndarray r2 = r1 if rows2 is rows1 else _row_ids(rows2, self._R, False)
        a2, z2 = _columns(cols2, self._W)
        if r1.shape[0] != r2.shape[0]:
            raise ValueError(
                f"rows1 and rows2 have different lengths: {r1.shape[0]} and {r2.shape[0]}"
            )
        if z1 - a1 != z2 - a2:
            raise ValueError(f"cols1 and cols2 have different widths: {z1 - a1} and {z2 - a2}")
        cdef lf_layout code = self._pool._layout(layout)
        cdef Py_ssize_t e = r1.shape[0], k = z1 - a1
        cdef LazyBatch b = _new_batch(code, e, 2 * k)
        # no Python code from here on
        self._select(r1, a1, k, b._slots, 2 * k)
        self._select(r2, a2, k, b._slots + k, 2 * k)
        _incref_all(&self._pool.p, b._slots, e * 2 * k)
        b._n = e
        b._pool = self._pool  # last: from here on, dealloc drops the references
        return b

    def gather(self, rows, start, stop, out=None, *, layout="last", dtype=None, scale=None):
        """Copy the observations in columns ``[start, stop)`` of ``rows`` into one array.

        :meth:`FramePool.gather` of the table's entries: ``(B, *observation_shape)``,
        one C call with the GIL released, dtype and ``scale`` fused.

        Args:
            rows: 1-D ints, B row indices (repeats allowed).
            start, stop: the columns of one observation, ``0 <= start < stop <= width``.
            out: optional C-contiguous writeable ndarray; it may not overlap ``rows``.
            layout, dtype, scale: as :meth:`FramePool.gather`.

        Raises:
            IndexError: a row out of range. ValueError: bad columns, an empty entry, or
                a bad ``out``. TypeError: a bad ``out``, ``dtype`` or ``scale``.
        """
        self._ready()
        cdef cnp.ndarray r = _row_ids(rows, self._R, False)
        cdef Py_ssize_t a, z
        a, z = _columns((start, stop), self._W)
        cdef lf_layout code = self._pool._layout(layout)
        if not _apart(out, rows):
            _check_no_overlap(out, {"rows": rows})
        cdef _Copy c
        memset(&c, 0, sizeof(c))
        c.n_out = 1
        res = _output(self._pool, code, r.shape[0], z - a, out, dtype, scale, &c, 0)
        cdef cnp.npy_intp dims[2]
        dims[0] = r.shape[0]
        dims[1] = z - a
        cdef cnp.ndarray ids = cnp.PyArray_EMPTY(2, dims, cnp.NPY_INT64, 0)
        # phase 2: no Python code from here on
        self._select(r, a, z - a, <int64_t *>cnp.PyArray_DATA(ids), z - a)
        c.ids = <const int64_t *>cnp.PyArray_DATA(ids)
        _copy(&c)
        return res

    def gather_pairs(self, rows1, cols1, rows2, cols2, out=None, *, layout="last", dtype=None,
                     scale=None):
        """Copy two sets of observations (e.g. obs and next obs) row by row into two arrays.

        Observation i of the first array is columns ``cols1`` of row ``rows1[i]``, of
        the second columns ``cols2`` of row ``rows2[i]``. They are copied one after the
        other, so frames they share (a transition's obs and next obs share k-1) are read
        from memory once and from cache the second time. One call, GIL released.

        Args:
            rows1, rows2: 1-D ints of one length B.
            cols1, cols2: ``(start, stop)`` column ranges of one width k.
            out: None, or a pair of arrays ``(B, *observation_shape)`` that overlap
                neither each other nor ``rows1``/``rows2``.
            layout, dtype, scale: as :meth:`FramePool.gather`.

        Returns:
            A pair of arrays ``(B, *observation_shape)``.

        Raises:
            As :meth:`gather`, for either half; nothing is written then.
        """
        self._ready()
        if out is not None and (not isinstance(out, (tuple, list)) or len(out) != 2):
            raise TypeError("out must be a pair of ndarrays")
        o1, o2 = (None, None) if out is None else out
        if not (_apart(o1, rows1) and _apart(o1, rows2) and _apart(o2, rows1)
                and _apart(o2, rows2)):
            _check_no_overlap(out, {"rows1": rows1, "rows2": rows2})
        pairs = self.batch_pairs(rows1, cols1, rows2, cols2, layout=layout)
        return pairs.numpy_pairs(out, dtype=dtype, scale=scale)

    def take(self, rows, source, index):
        """Fill ``rows`` with slots of ``source`` by flat position (-1: empty); checkpoint load.

        Entry ``(rows[i], j)`` becomes the id at flat position ``index[i, j]`` of
        ``source`` (its ``m * k`` ids, row-major), or empty where ``index[i, j]`` is -1.
        The new references are taken before the old ones of those rows are dropped. Each
        frame's previous frame is recorded along each half of a row of even width (as
        :meth:`set` does along a part), else along the row; then a compressing pool
        compresses the frames only tables hold.

        Args:
            rows: 1-D ints, distinct row indices.
            source: a :class:`LazyBatch` of this table's pool, ``(m, k)``.
            index: ints ``(len(rows), width)``, each -1 or in ``[0, m * k)``.

        Raises:
            IndexError: a row or position out of range. ValueError: duplicate rows, a
                source of another pool, an index of the wrong shape. TypeError: a
                non-integer index. OverflowError: a slot id above ``2**31 - 1``.
                Nothing changes then.
        """
        self._ready()
        cdef cnp.ndarray r = _row_ids(rows, self._R, True)
        cdef LazyBatch s = _check_batch(self._pool, source, "source")
        cdef Py_ssize_t e = r.shape[0], i, j, m = s._n * s._k
        idx = _as_ints(index, "index")
        if idx.shape != (e, self._W):
            raise ValueError(f"index has shape {idx.shape}, expected ({e}, {self._W})")
        bad = np.flatnonzero((idx < -1) | (idx >= m))
        if bad.size:
            raise IndexError(
                f"index {int(idx.ravel()[bad[0]])} is out of range for a source of {m} frames"
            )
        cdef cnp.ndarray ix = np.array(idx, dtype=np.int64, order="C", copy=True)
        cdef const int64_t *x = <const int64_t *>cnp.PyArray_DATA(ix)
        for i in range(e * self._W):
            if x[i] >= 0 and s._slots[x[i]] > INT32_MAX:
                raise OverflowError(_ID_OVER_INT32)
        cdef const int64_t *ri = <const int64_t *>cnp.PyArray_DATA(r)
        cdef lf_pool *p = &self._pool.p
        cdef Py_ssize_t over = 0, part = self._h or self._W
        cdef int32_t cur, prev
        for i in range(e):  # previous frames along each half (or the row), as set does
            _indexed_row(self._row, x + i * self._W, self._W, s._slots)
            for j in range(self._W):
                cur = self._row[j]
                prev = self._row[j - 1] if j % part else -1
                if cur >= 0 and prev >= 0 and lf_pool_set_prev(p, cur, prev):
                    raise MemoryError("no memory for a frame's link in a SlotTable")
        self._fits(e)
        for i in range(e if self._h else 0):  # the rows that will need an overflow record
            _indexed_row(self._row, x + i * self._W, self._W, s._slots)
            over += self._decide(i, self._row)
        self._reserve(ri, e, over)
        # all checked: new references, then the old ones dropped, then written
        for i in range(e * self._W):
            if x[i] >= 0:
                lf_pool_incref_cold(p, s._slots[x[i]])
        self._drop_rows(ri, e)
        for i in range(e):
            _indexed_row(self._row, x + i * self._W, self._W, s._slots)
            self._put_row(ri[i], self._row, self._h and self._fit[i])
        self._fitted()
        lf_pool_compress_pending(p)  # out of memory: frames stay hot, queued

    def __reduce__(self):
        raise TypeError("a SlotTable cannot be pickled; use ReplayBuffer.save")

    def __repr__(self):
        self._ready()
        return f"SlotTable(shape={self.shape}, pool={self._pool!r})"


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _table_write(SlotTable t, const int64_t *r, Py_ssize_t e, const int64_t **src,
                       const Py_ssize_t *ks, Py_ssize_t n) noexcept:
    """Rows ``r`` := parts ``src`` side by side (checked, previous frames recorded and
    records reserved by ``_reserve_parts``): new references, old dropped, written."""
    cdef Py_ssize_t q, i, j, col
    cdef lf_pool *p = &t._pool.p
    cdef const int64_t *ids
    for q in range(n):
        for i in range(e * ks[q]):
            lf_pool_incref_cold(p, src[q][i])
    t._drop_rows(r, e)
    for i in range(e):
        col = 0
        for q in range(n):
            ids = src[q] + i * ks[q]
            for j in range(ks[q]):
                t._row[col + j] = <int32_t>ids[j]
            col += ks[q]
        t._put_row(r[i], t._row, t._h and t._fit[i])
    t._fitted()


cdef inline void _indexed_row(int32_t *row, const int64_t *x, Py_ssize_t W,
                              const int64_t *slots) noexcept:
    """``row`` := the ids at the ``W`` flat positions ``x`` of ``slots`` (-1: empty)."""
    cdef Py_ssize_t j
    for j in range(W):
        row[j] = <int32_t>slots[x[j]] if x[j] >= 0 else -1


cdef Py_ssize_t _first_over_int32(const int64_t *ids, Py_ssize_t n) noexcept:
    """The index of the first id above ``2**31 - 1``, or -1."""
    cdef Py_ssize_t i
    for i in range(n):
        if ids[i] > INT32_MAX:
            return i
    return -1


cdef inline int32_t _back(const lf_pool *p, int32_t slot) noexcept:
    """The frame before ``slot`` in a stack: its recorded previous frame, or itself."""
    cdef int32_t q = lf_pool_prev(p, slot)
    return q if q >= 0 else slot
