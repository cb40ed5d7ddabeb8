# RowRing: the rows of a replay buffer, their streams and their columns.
#
# Included by _core.pyx. A table, not a policy: it knows positions, the order of each
# stream's rows and fixed-shape numeric columns; what the columns mean (actions, rewards,
# episode flags) and which rows may be sampled is the replay package's business.
# append() checks every value before it writes anything, and runs no Python code
# between its last check and its writes. The arrays are NumPy arrays owned by the ring;
# callers get read-only views of them (remade when the ring grows).


cdef enum:
    _COL_INT = 1     # a signed integer column
    _COL_UINT = 2    # an unsigned integer column
    _COL_FLOAT = 3   # float32 / float64: every value finite (a table invariant)
    _COL_BOOL = 4
    _COL_OTHER = 5   # float16: checked with NumPy


cdef extern from "<float.h>":
    float FLT_MAX


cdef cnp.dtype _BOOL_DTYPE = np.dtype(np.bool_)


cdef enum:
    _MAX_COL_DIMS = 8  # axes of one row's value of a column
    _PALETTE = 256     # values a scalar float32 column holds as one-byte codes (then widened)


cdef struct _Scalar:
    int64_t i
    uint64_t u
    double f


cdef int _col_kind(object dt):
    if dt.kind == "i":
        return _COL_INT
    if dt.kind == "u":
        return _COL_UINT
    if dt.kind == "b":
        return _COL_BOOL
    if dt.kind == "f" and dt.itemsize in (4, 8):
        return _COL_FLOAT
    return _COL_OTHER


cdef bint _exact_rows(object v, int type_num, Py_ssize_t e, int nd,
                      const cnp.npy_intp *dims) noexcept:
    """Whether ``v`` is a plain aligned C-contiguous ndarray ``(e, *dims)`` of ``type_num``."""
    cdef cnp.ndarray a
    cdef int i
    if not cnp.PyArray_CheckExact(v):
        return False
    a = <cnp.ndarray>v
    cdef int t = cnp.PyArray_TYPE(a)
    if not ((t == type_num or cnp.PyArray_EquivTypenums(t, type_num))
            and cnp.PyArray_ISNOTSWAPPED(a)
            and cnp.PyArray_IS_C_CONTIGUOUS(a) and cnp.PyArray_ISALIGNED(a)
            and cnp.PyArray_NDIM(a) == 1 + nd and cnp.PyArray_DIMS(a)[0] == e):
        return False
    for i in range(nd):
        if cnp.PyArray_DIMS(a)[i + 1] != dims[i]:
            return False
    return True


cdef bint _int64_vector(object x) noexcept:
    """Whether ``x`` is a plain 1-D ndarray of native-order int64: what the ring reads raw."""
    return (cnp.PyArray_CheckExact(x) and cnp.PyArray_TYPE(<cnp.ndarray>x) == cnp.NPY_INT64
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>x) and cnp.PyArray_NDIM(<cnp.ndarray>x) == 1)


cdef cnp.ndarray _int64s(object x, str name):
    """``x``, integers of any shape, as ``np.ascontiguousarray(x, dtype=np.int64)``: C calls."""
    cdef cnp.ndarray a = cnp.PyArray_FROM_O(x)
    if not cnp.PyArray_ISINTEGER(a):
        raise TypeError(f"{name} must be integers, got dtype {a.dtype}")
    return cnp.PyArray_FROMANY(a, cnp.NPY_INT64, 0, 0,
                               cnp.NPY_ARRAY_IN_ARRAY | cnp.NPY_ARRAY_FORCECAST)


cdef bint _all_streams(object streams, Py_ssize_t n):
    """Whether ``streams`` (None, or a 1-D int64 ndarray) is every one of ``n`` streams in order."""
    if streams is None:
        return True
    if not _int64_vector(streams) or (<cnp.ndarray>streams).shape[0] != n:
        return False
    cdef cnp.ndarray s = <cnp.ndarray>streams
    cdef Py_ssize_t i
    for i in range(n):
        if (<const int64_t *>cnp.PyArray_GETPTR1(s, i))[0] != i:
            return False
    return True


cdef bint _plain_bits(object bits):
    """Every bit is None or a bool (immutable)."""
    for b in <tuple>bits:
        if not (b is None or type(b) is bool):
            return False
    return True


@cython.no_gc
cdef class RowRing:
    """RowRing(capacity, num_streams, columns, counted=None)
--

A ring of ``capacity`` rows shared by ``num_streams`` streams, each stream's rows linked.

    The replay buffer's bookkeeping: :meth:`append` writes one row per stream it is
    given at the head of the ring, overwriting the oldest rows once every position
    holds one (first in, first out over all streams, however they interleave). Each
    row records its stream (:attr:`env`) and the next row of that stream
    (:attr:`next`, -1 for the newest); :attr:`last` is each stream's newest row (-1
    for none). Rows also hold the values of the columns declared at construction, each
    a fixed shape and a numeric dtype; a float32 or float64 column holds finite values
    only. The arrays grow as rows are used (:meth:`grow`, doubling up to the capacity),
    so a large capacity costs memory only once it is used. Links are int32 when the
    capacity allows, else int64; streams are uint8, uint16 or int32, the narrowest that
    holds ``num_streams`` ids. With ``counted``, the ring counts the rows it holds
    whose value of that uint8 scalar column has a bit of the mask set (:attr:`counted`).
    The class may be subclassed (the replay's ring adds its draws in Python).

    Two things are stored leaner than they read. While every append is one row of each
    stream in order and the capacity is a multiple of the number of streams (a vector
    env's adds: *lockstep*), a position's stream and next row follow from it (position
    ``p`` is stream ``p % num_streams``; its next row is ``p + num_streams`` unless it is
    its stream's newest) and are not stored: :attr:`env` and :attr:`next` are computed
    when read (:meth:`next_of` reads a few) and :meth:`memory` counts no bytes for them;
    the first other append stores them from then on, until :meth:`clear`. A scalar
    float32 column (a reward) is stored as one byte per row, the code of its value in the
    column's palette, while it has held at most 256 distinct values (bit patterns, 0.0
    among them: rows not written read 0.0), and as float32 from the first value that
    would make 257 on; reads give float32 either way, and :attr:`columns` computes such a
    column when read (:meth:`column` and :meth:`values` read one).

    Args:
        capacity: rows of the full ring, ``>= 1``.
        num_streams: streams, ``>= 1``.
        columns: a sequence of ``(name, shape, dtype)``: the name (for messages), the
            shape of one row's value (``()`` for a scalar) and a bool, integer or float
            dtype.
        counted: None, or ``(column, mask)``: the index of a uint8 scalar column and a
            bit mask.
        convert: None, or a callable ``convert(name, value, rows)`` that :meth:`append`
            calls with a value it does not take as it is (of a column or, by its name, of
            one bit of a bits column: a uint8 scalar column declared as ``(name, shape,
            dtype, bit_names)``), and whose result it takes instead, or that raises.

    Raises:
        ValueError: a non-positive capacity or number of streams, a negative dimension.
        TypeError: a dtype that is not bool, integer or float.

    Example:
        >>> ring = RowRing(4, 2, [("reward", (), np.float32)])
        >>> ring.grow(4)
        >>> ring.append(None, (np.array([1.0, 2.0], np.float32),))
        0
        >>> ring.append(np.array([1]), (3.0,))
        2
        >>> ring.next.tolist(), ring.last.tolist(), ring.columns[0].tolist()
        ([-1, 2, -1, -1], [0, 2], [1.0, 2.0, 3.0, 0.0])
    """

    cdef Py_ssize_t _capacity, _streams, _pos, _rows
    cdef bint _full
    cdef int64_t _appended        # the number of the next row (rows are numbered in order)
    cdef bint _wide               # links are int64 (capacity above INT32_MAX)
    cdef bint _lockstep           # _env and _next are not stored: they follow from positions
    cdef object _link_dtype
    cdef cnp.ndarray _env         # the narrowest of uint8, uint16, int32 (rows,)
    cdef cnp.ndarray _next        # link dtype (rows,)
    cdef cnp.ndarray _last        # link dtype (streams,)
    cdef list _cols               # ndarrays (rows, *shape)
    cdef tuple _names, _shapes, _dtypes
    cdef tuple _bits              # the names of a bits column's bits, by column (else ())
    cdef object _convert          # None, or convert(name, value, rows) -> a value as taken
    cdef int *_kinds
    cdef int *_types              # each column's NumPy type number
    cdef int *_nds                # and its shape: _nds[j] dims at _dims + _MAX_COL_DIMS * j
    cdef cnp.npy_intp *_dims
    cdef int64_t *_lo             # an integer column's range (uint64: _hi is -1)
    cdef int64_t *_hi
    cdef Py_ssize_t *_rowbytes
    cdef Py_ssize_t _ncols
    cdef tuple _views             # read-only views: env, next, last, then the columns
    cdef uint32_t *_pal           # column j's palette at _pal + j * _PALETTE (bit patterns)
    cdef int *_npal               # values in column j's palette; -1: stored as it is
    cdef Py_ssize_t _counted_col  # -1: no count
    cdef uint8_t _counted_mask
    cdef Py_ssize_t _counted
    # the values of the last check() of every stream, if all are immutable scalars (and
    # how they were taken): append() of the same tuple next takes them without a re-check
    cdef tuple _checked
    cdef int _checked_how[16]
    cdef _Scalar _checked_sc[16]

    def __cinit__(self):
        self._kinds = NULL
        self._types = NULL
        self._nds = NULL
        self._dims = NULL
        self._lo = NULL
        self._hi = NULL
        self._rowbytes = NULL
        self._pal = NULL
        self._npal = NULL
        self._ncols = 0
        self._capacity = 0

    def __dealloc__(self):
        free(self._kinds)
        free(self._types)
        free(self._nds)
        free(self._dims)
        free(self._lo)
        free(self._hi)
        free(self._rowbytes)
        free(self._pal)
        free(self._npal)

    def __init__(self, capacity, num_streams, columns, counted=None, convert=None):
        _fresh(self, self._capacity != 0)
        cap = operator.index(capacity)
        streams = operator.index(num_streams)
        if cap < 1 or cap > INT64_MAX // 16:
            raise ValueError(f"capacity must be in [1, 2**59], got {cap}")
        if streams < 1 or streams > INT32_MAX:
            raise ValueError(f"num_streams must be in [1, 2**31 - 1], got {streams}")
        names, shapes, dtypes, bits = [], [], [], []
        for column in columns:
            name, shape, dtype = column[:3]
            bits.append(tuple(str(b) for b in column[3]) if len(column) > 3 else ())
            shape = tuple(operator.index(d) for d in shape)
            if any(d < 0 for d in shape) or len(shape) > _MAX_COL_DIMS:
                raise ValueError(f"column {name!r} has shape {shape}: a negative dimension, or "
                                 f"more than {_MAX_COL_DIMS}")
            dt = np.dtype(dtype)
            if dt.kind not in "biuf" or not dt.isnative:
                raise TypeError(
                    f"column {name!r} must have a bool, integer or float dtype, got {dt}")
            names.append(str(name))
            shapes.append(shape)
            dtypes.append(dt)
        cdef Py_ssize_t n = len(names), j, i
        col, mask = (-1, 0) if counted is None else counted
        col, mask = operator.index(col), operator.index(mask)
        if counted is not None and not (0 <= col < n and dtypes[col] == np.uint8
                                        and shapes[col] == () and 0 < mask < 256):
            raise ValueError(f"counted must be (a uint8 scalar column, a mask in [1, 255]), "
                             f"got {counted!r}")
        _fresh(self, self._capacity != 0)
        self._kinds = <int *>malloc(max(1, n) * sizeof(int))
        self._rowbytes = <Py_ssize_t *>malloc(max(1, n) * sizeof(Py_ssize_t))
        self._lo = <int64_t *>malloc(max(1, n) * sizeof(int64_t))
        self._hi = <int64_t *>malloc(max(1, n) * sizeof(int64_t))
        self._types = <int *>malloc(max(1, n) * sizeof(int))
        self._nds = <int *>malloc(max(1, n) * sizeof(int))
        self._dims = <cnp.npy_intp *>malloc(max(1, n) * _MAX_COL_DIMS * sizeof(cnp.npy_intp))
        self._pal = <uint32_t *>malloc(max(1, n) * _PALETTE * sizeof(uint32_t))
        self._npal = <int *>malloc(max(1, n) * sizeof(int))
        if (self._kinds == NULL or self._rowbytes == NULL or self._lo == NULL or self._hi == NULL
                or self._types == NULL or self._nds == NULL or self._dims == NULL
                or self._pal == NULL or self._npal == NULL):
            raise MemoryError()
        for j in range(n):
            self._types[j] = (<cnp.dtype>dtypes[j]).type_num
            self._nds[j] = len(shapes[j])
            for i in range(len(shapes[j])):
                self._dims[_MAX_COL_DIMS * j + i] = shapes[j][i]
            self._kinds[j] = _col_kind(dtypes[j])
            self._rowbytes[j] = math.prod(shapes[j]) * dtypes[j].itemsize
            self._npal[j] = 1 if self._palette_kind(j) else -1
            self._pal[j * _PALETTE] = 0  # code 0: 0.0, what a row not written reads
            self._lo[j] = self._hi[j] = 0
            if dtypes[j].kind in "iu":
                info = np.iinfo(dtypes[j])
                self._lo[j] = info.min
                self._hi[j] = -1 if info.max > INT64_MAX else info.max
        self._ncols = n
        self._names, self._shapes, self._dtypes = tuple(names), tuple(shapes), tuple(dtypes)
        self._bits = tuple(bits)
        self._convert = convert
        self._wide = cap > INT32_MAX
        self._link_dtype = np.dtype(np.int64 if self._wide else np.int32)
        self._streams = streams
        self._pos = 0
        self._rows = 0
        self._full = False
        self._appended = 0
        self._env = np.zeros(0, np.uint8 if streams <= 256 else
                             np.uint16 if streams <= 65536 else np.int32)
        self._next = np.zeros(0, self._link_dtype)
        self._lockstep = cap % streams == 0
        self._last = np.full(streams, -1, self._link_dtype)
        self._cols = [np.zeros((0,) + s, np.uint8 if self._npal[j] >= 0 else d)
                      for j, (s, d) in enumerate(zip(shapes, dtypes))]
        self._views = self._make_views()
        self._counted_col, self._counted_mask, self._counted = col, mask, 0
        self._capacity = cap  # last: initialised

    cdef tuple _make_views(self):
        views = []
        for a in [self._env, self._next, self._last] + self._cols:
            v = a.view()
            v.flags.writeable = False
            views.append(v)
        return tuple(views)

    cdef inline int _ready(self) except -1:
        if self._capacity == 0:
            raise TypeError("RowRing object is not initialised")
        return 0

    # -- state ------------------------------------------------------------------------
    @property
    def capacity(self):
        """Rows of the full ring."""
        self._ready()
        return self._capacity

    @property
    def num_streams(self):
        """Streams."""
        self._ready()
        return self._streams

    @property
    def pos(self):
        """The position the next row is written to."""
        self._ready()
        return self._pos

    @property
    def full(self):
        """True once every position holds a row."""
        self._ready()
        return self._full

    @property
    def size(self):
        """Rows held."""
        self._ready()
        return self._capacity if self._full else self._pos

    @property
    def appended(self):
        """The number of the next row appended.

        Rows are numbered 0, 1, 2, ... in the order they are appended; :meth:`clear`
        moves the count on to a multiple of the capacity, so a row's position is always
        its number modulo the capacity (see :meth:`positions`, :meth:`numbers`).
        """
        self._ready()
        return self._appended

    @property
    def rows(self):
        """Rows allocated (at most the capacity)."""
        self._ready()
        return self._rows

    @property
    def env(self):
        """The stream of each row (read-only, ``rows`` entries: uint8, uint16 or int32).

        A view, or in lockstep (see the class) an array computed on each read: 0 past the
        rows held, as a stored one reads.
        """
        self._ready()
        if not self._lockstep:
            return self._views[0]
        env = (np.arange(self._rows) % self._streams).astype(self._env.dtype)
        env[self.size:] = 0
        env.flags.writeable = False
        return env

    @property
    def next(self):
        """The next row of each row's stream, -1 for a stream's newest (read-only).

        A view, or in lockstep (see the class) an array computed on each read
        (:meth:`next_of` reads a few).
        """
        self._ready()
        if not self._lockstep:
            return self._views[1]
        nxt = self.next_of(np.arange(self._rows)).astype(self._link_dtype)
        nxt.flags.writeable = False
        return nxt

    def next_of(self, positions):
        """The next row of the stream of each of ``positions`` (-1: the stream's newest).

        Args:
            positions: integers of any shape in ``[0, rows)``.

        Returns:
            An int64 array of their shape.

        Raises:
            TypeError: ``positions`` not integers. IndexError: a position out of range.
        """
        self._ready()
        cdef cnp.ndarray src = _int64s(positions, "positions")
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(src.ndim, src.shape, cnp.NPY_INT64, 0)
        cdef Py_ssize_t n = cnp.PyArray_SIZE(src), i
        cdef const int64_t *v = <const int64_t *>cnp.PyArray_DATA(src)
        cdef int64_t *o = <int64_t *>cnp.PyArray_DATA(out)
        for i in range(n):
            if v[i] < 0 or v[i] >= self._rows:
                raise IndexError(f"position {v[i]} out of range [0, {self._rows})")
        for i in range(n):
            o[i] = self._next_of(v[i])
        return out

    @property
    def last(self):
        """Each stream's newest row, -1 for none (read-only view)."""
        self._ready()
        return self._views[2]

    @property
    def columns(self):
        """The columns, a tuple of read-only arrays ``(rows, *shape)``: views, and a palette
        column's values computed when read (see the class)."""
        self._ready()
        return tuple([self.column(j) for j in range(self._ncols)])

    def column(self, Py_ssize_t j):
        """Column ``j``, a read-only array ``(rows, *shape)`` (see :attr:`columns`)."""
        self._ready()
        if not 0 <= j < self._ncols:
            raise IndexError(f"column {j} out of range [0, {self._ncols})")
        if self._npal[j] < 0:
            return self._views[3 + j]
        out = self._palette(j)[self._cols[j]]
        out.flags.writeable = False
        return out

    def values(self, Py_ssize_t j, positions):
        """Column ``j``'s values at ``positions`` (integers of any shape, in ``[0, rows)``).

        Raises:
            IndexError: a column or position out of range. TypeError: not integers.
        """
        self._ready()
        if not 0 <= j < self._ncols:
            raise IndexError(f"column {j} out of range [0, {self._ncols})")
        cdef cnp.ndarray at = _int64s(positions, "positions")
        if at.size and (at.min() < 0 or at.max() >= self._rows):
            raise IndexError(f"a position out of range [0, {self._rows})")
        if self._npal[j] < 0:
            return self._cols[j][at]
        return self._palette(j)[self._cols[j][at]]

    cdef inline bint _palette_kind(self, Py_ssize_t j) noexcept:
        """Whether column ``j`` is stored by palette while it can be: a float32 scalar."""
        return self._types[j] == cnp.NPY_FLOAT32 and self._nds[j] == 0

    cdef cnp.ndarray _palette(self, Py_ssize_t j):
        """Column ``j``'s palette, a float32 array of its values by code."""
        cdef cnp.npy_intp n = self._npal[j]
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(1, &n, cnp.NPY_FLOAT32, 0)
        memcpy(cnp.PyArray_DATA(out), self._pal + j * _PALETTE, n * sizeof(uint32_t))
        return out

    cdef inline int _code(self, Py_ssize_t j, float v) noexcept:
        """The code of ``v`` in column ``j``'s palette (bit for bit), or -1."""
        cdef const uint32_t *pal = self._pal + j * _PALETTE
        cdef uint32_t bits
        cdef int i
        memcpy(&bits, &v, sizeof(bits))
        for i in range(self._npal[j]):
            if pal[i] == bits:
                return i
        return -1

    cdef int _fit(self, Py_ssize_t j, const float *v, Py_ssize_t m) except -1:
        """Give the ``m`` values ``v`` of palette column ``j`` codes, or store the column
        as float32 when they would make more than _PALETTE (a MemoryError: as it was)."""
        if self._npal[j] < 0:
            return 0
        cdef Py_ssize_t i
        for i in range(m):
            if self._code(j, v[i]) >= 0:
                continue
            if self._npal[j] == _PALETTE:
                wide = self._palette(j)[self._cols[j]]
                self._cols[j] = wide
                self._npal[j] = -1
                self._views = self._make_views()
                return 0
            memcpy(self._pal + j * _PALETTE + self._npal[j], v + i, sizeof(uint32_t))
            self._npal[j] += 1
        return 0

    @property
    def counted(self):
        """Rows held whose ``counted`` column has a bit of its mask set (0 without)."""
        self._ready()
        return self._counted

    def memory(self):
        """Bytes of the ring's arrays (none for :attr:`env` and :attr:`next` in lockstep)."""
        self._ready()
        cdef Py_ssize_t j
        return (sum(a.nbytes for a in [self._env, self._next, self._last] + self._cols)
                + sum(_PALETTE * 4 for j in range(self._ncols) if self._npal[j] >= 0))

    cdef int _unlock(self) except -1:
        """Leave lockstep: store every row's stream and next row from now on."""
        if not self._lockstep:
            return 0
        cdef cnp.ndarray env = np.zeros(self._rows, self._env.dtype)
        cdef cnp.ndarray nxt = self.next.copy()
        env[:self.size] = self.env[:self.size]
        self._env, self._next = env, nxt
        self._views = self._make_views()
        self._lockstep = False
        return 0

    def rows_for(self, n):
        """The rows the arrays need for ``n`` more rows.

        Doubling, at least 64, up to the capacity.
        """
        self._ready()
        cdef Py_ssize_t m = operator.index(n)
        if self._rows < self._capacity and self._pos + m > self._rows:
            return min(self._capacity, max(self._pos + m, 2 * self._rows, 64))
        return self._rows

    def grow(self, rows):
        """Enlarge the arrays to ``rows`` rows (new rows zero, links -1); contents kept.

        Every new array is allocated before any replaces the old one, so a MemoryError
        leaves the ring as it was.

        Raises:
            ValueError: ``rows`` beyond the capacity.
        """
        self._ready()
        cdef Py_ssize_t r = operator.index(rows), old = self._rows
        if r > self._capacity:
            raise ValueError(f"rows {r} beyond the capacity {self._capacity}")
        if r <= old:
            return
        env = np.zeros(0 if self._lockstep else r, self._env.dtype)
        nxt = np.full(0 if self._lockstep else r, -1, self._link_dtype)
        cols = [np.zeros((r,) + s, c.dtype) for s, c in zip(self._shapes, self._cols)]
        env[:old] = self._env
        nxt[:old] = self._next
        for a, b in zip(cols, self._cols):
            a[:old] = b
        self._env, self._next, self._cols = env, nxt, cols
        self._views = self._make_views()
        self._rows = r

    def newest(self, streams):
        """The newest row of each of ``streams`` (a list of ints, -1 for none).

        ``streams``: None (every stream, in order) or 1-D ints in range.
        """
        self._ready()
        if streams is None:
            return self._last.tolist()
        return self._last[self._stream_ids(streams)].tolist()

    cdef cnp.ndarray _stream_ids(self, object streams):
        """``streams`` as a private int64 array, each in ``[0, num_streams)``."""
        cdef cnp.ndarray s = np.array(streams, dtype=np.int64, copy=True).reshape(-1)
        cdef const int64_t *sv = <const int64_t *>cnp.PyArray_DATA(s)
        cdef Py_ssize_t i
        for i in range(s.shape[0]):
            if sv[i] < 0 or sv[i] >= self._streams:
                raise ValueError(f"stream {sv[i]} out of range [0, {self._streams})")
        return s

    # -- writing ----------------------------------------------------------------------
    cdef int _check_value(self, Py_ssize_t j, object v, Py_ssize_t e, _Scalar *out) except -1:
        """Phase 1 of one column's value: raise unless it can be written as it is.

        ``v`` is an ndarray ``(e, *shape)`` of the column's dtype, or for ``e == 1`` and
        a scalar column a Python bool, int or float (converted into ``out``), or for a
        uint8 scalar column a tuple of up to 8 bit values (each a bool or a bool ndarray
        ``(e,)``, or None for all False), packed as bits 0, 1, ...
        Returns 1 (an array), 2 (bits) or 3 (a scalar).
        """
        cdef int kind = self._kinds[j], t = self._types[j], nd = self._nds[j]
        cdef int overflow = 0
        cdef double f
        cdef Py_ssize_t i, m
        cdef cnp.ndarray a
        if _exact_rows(v, t, e, nd, self._dims + _MAX_COL_DIMS * j):
            a = <cnp.ndarray>v
            m = cnp.PyArray_SIZE(a)
            if kind == _COL_FLOAT and t == cnp.NPY_FLOAT32:
                for i in range(m):
                    if not isfinite((<const float *>cnp.PyArray_DATA(a))[i]):
                        raise ValueError(f"{self._names[j]} must be finite, got "
                                         f"{(<const float *>cnp.PyArray_DATA(a))[i]!r}")
            elif kind == _COL_FLOAT:
                for i in range(m):
                    if not isfinite((<const double *>cnp.PyArray_DATA(a))[i]):
                        raise ValueError(f"{self._names[j]} must be finite, got "
                                         f"{(<const double *>cnp.PyArray_DATA(a))[i]!r}")
            elif kind == _COL_OTHER and not np.isfinite(a).all():
                raise ValueError(f"{self._names[j]} must be finite")
            return 1
        if type(v) is tuple and t == cnp.NPY_UINT8 and nd == 0:
            if len(<tuple>v) > 8:
                raise ValueError(f"{self._names[j]}: at most 8 bits")
            for bit in <tuple>v:
                if not (bit is None or type(bit) is bool or (
                        _exact_rows(bit, cnp.NPY_BOOL, e, 0, NULL))):
                    raise TypeError(f"{self._names[j]}: a bit must be a bool or a bool ndarray "
                                    f"({e},), got {type(bit).__name__}")
            return 2
        dt = self._dtypes[j]
        name = self._names[j]
        if e != 1 or nd != 0 or not (type(v) is int or type(v) is float or type(v) is bool):
            if self._convert is not None:
                return 0
            raise TypeError(f"{name} must be an ndarray of shape {(e,) + self._shapes[j]} and "
                            f"dtype {dt}, got {type(v).__name__}")
        if type(v) is bool:
            out.i = <bint>v
            out.u = <bint>v
            out.f = <bint>v
            return 3
        if kind == _COL_BOOL:
            raise TypeError(f"{name} must be a bool, got {type(v).__name__}")
        if type(v) is int:
            if kind == _COL_INT or kind == _COL_UINT:
                out.i = PyLong_AsLongLongAndOverflow(v, &overflow)
                if kind == _COL_INT and not overflow and self._lo[j] <= out.i <= self._hi[j]:
                    return 3
                if kind == _COL_UINT and not overflow and out.i >= 0:
                    out.u = <uint64_t>out.i
                    if self._hi[j] == -1 or out.i <= self._hi[j]:
                        return 3
                if kind == _COL_UINT and overflow > 0 and self._hi[j] == -1 and v < 2**64:
                    out.u = <uint64_t>v
                    return 3
                info = np.iinfo(dt)
                raise ValueError(f"{name} {v} does not fit {dt} (range [{info.min}, {info.max}])")
            f = <double>v  # an int beyond float64: OverflowError
        elif type(v) is float:
            if kind != _COL_FLOAT and kind != _COL_OTHER:
                raise TypeError(f"{name} {v!r} is a float; the column holds {dt}")
            f = <double>v
        else:
            raise TypeError(f"{name} must be a number, got {type(v).__name__}")
        if kind == _COL_OTHER:
            top = float(np.finfo(dt).max)
        else:
            top = FLT_MAX if t == cnp.NPY_FLOAT32 else DBL_MAX
        if not (-top <= f <= top):  # also NaN
            raise ValueError(f"{name} must be finite and fit {dt} (magnitude at most "
                             f"{top:.4g}), got {v!r}")
        out.f = f
        return 3

    cdef tuple _convert_bits(self, Py_ssize_t j, tuple v, Py_ssize_t e):
        """The bits ``v`` of column ``j``, each a bool, None or a bool ndarray ``(e,)``
        (others converted by ``convert`` under the bit's name)."""
        cdef list out = None
        cdef tuple names = self._bits[j]
        cdef Py_ssize_t b
        if len(v) > len(names):
            raise ValueError(f"{self._names[j]}: at most {len(names)} bits")
        for b in range(len(v)):
            bit = v[b]
            if bit is None or type(bit) is bool or _exact_rows(bit, cnp.NPY_BOOL, e, 0, NULL):
                continue
            if self._convert is None:
                raise TypeError(f"{names[b]} must be a bool or a bool ndarray ({e},)")
            if out is None:
                out = list(v)
            out[b] = self._convert(names[b], bit, e)
        return v if out is None else tuple(out)

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef void _write_scalar(self, Py_ssize_t j, Py_ssize_t p, const _Scalar *s) noexcept:
        cdef char *at = <char *>cnp.PyArray_DATA(<cnp.ndarray>self._cols[j])
        cdef int kind = self._kinds[j]
        cdef int t = self._types[j]
        if self._npal[j] >= 0:  # (_fit gave it a code)
            (<uint8_t *>at)[p] = <uint8_t>self._code(j, <float>s.f)
            return
        at += p * self._rowbytes[j]
        if t == cnp.NPY_BOOL or t == cnp.NPY_UINT8:
            (<uint8_t *>at)[0] = <uint8_t>(s.i if kind != _COL_UINT else s.u)
        elif t == cnp.NPY_INT8:
            (<int8_t *>at)[0] = <int8_t>s.i
        elif t == cnp.NPY_INT16:
            (<int16_t *>at)[0] = <int16_t>s.i
        elif t == cnp.NPY_UINT16:
            (<uint16_t *>at)[0] = <uint16_t>s.u
        elif t == cnp.NPY_INT32:
            (<int32_t *>at)[0] = <int32_t>s.i
        elif t == cnp.NPY_UINT32:
            (<uint32_t *>at)[0] = <uint32_t>s.u
        elif t == cnp.NPY_INT64:
            (<int64_t *>at)[0] = s.i
        elif t == cnp.NPY_UINT64:
            (<uint64_t *>at)[0] = s.u
        elif t == cnp.NPY_FLOAT32:
            (<float *>at)[0] = <float>s.f
        elif t == cnp.NPY_FLOAT64:
            (<double *>at)[0] = s.f

    def append(self, streams, values, tables=(), parts=()):
        """Write one row per stream at the head of the ring; returns their positions.

        Row i goes to position ``(pos + i) % capacity``, evicting the row there; it
        becomes the newest of its stream, linked from the stream's previous newest. The
        same positions of each of ``tables`` (a SlotTable per observation leaf, kept as
        large as the ring) get the rows of its owners in ``parts``. The arrays (and the
        tables) grow first when they must, doubling up to the capacity.

        Args:
            streams: None (one row for each stream, in order) or a 1-D int64 ndarray of
                distinct streams in range, one row each.
            values: a tuple of one value per column: an ndarray ``(E, *shape)`` of the
                column's dtype, C-contiguous; for one row of a scalar column, a Python
                bool, int or float; for a uint8 scalar column, a tuple of at most 8
                bits, each a bool, a bool ndarray ``(E,)`` or None (False), packed as
                bits 0, 1, ...
            tables: a tuple of :class:`SlotTable`.
            parts: a tuple of one tuple of owners per table, as :meth:`SlotTable.set`
                takes them (``E`` rows each), all of one width.

        Returns:
            The position of the first row written (row i is at ``(pos + i) % capacity``).

        Raises:
            ValueError: streams out of range, a value out of its column's range, a
                non-finite float, parts that do not fit their table. TypeError: a value
                of another type, dtype or shape. OverflowError: a slot id above
                ``2**31 - 1``. MemoryError: no memory to grow. Nothing is written then.
        """
        self._ready()
        if type(tables) is not tuple or type(parts) is not tuple or len(tables) != len(parts):
            raise TypeError("tables and parts must be tuples of one entry per table")
        cdef Py_ssize_t nt = len(tables), t
        for t in range(nt):
            if type(tables[t]) is not SlotTable:
                raise TypeError(f"tables[{t}] is not a SlotTable")
            (<SlotTable>tables[t])._ready()
        cdef Py_ssize_t e = self._streams if streams is None else len(streams)
        cdef bint grow = self._pos + e > self._rows and self._rows < self._capacity
        cdef bint unlock = self._lockstep and not _all_streams(streams, self._streams)
        if grow or unlock:  # checked first: refused, still in lockstep and nothing grown
            self._append(streams, values, tables, parts, False)
            if unlock:
                self._unlock()
            if grow:
                self._grow_all(self.rows_for(e), tables)
        return self._append(streams, values, tables, parts, True)

    def check(self, streams, values):
        """Raise what :meth:`append` would raise for ``streams`` and ``values``; change nothing."""
        self._ready()
        self._append(streams, values, (), (), False)

    cdef int _grow_all(self, Py_ssize_t rows, tuple tables) except -1:
        """The ring's arrays and ``tables`` to ``rows`` rows (a MemoryError: the ring unchanged)."""
        cdef Py_ssize_t t
        for t in range(len(tables)):
            (<SlotTable>tables[t])._resize(rows)
        self.grow(rows)
        return 0

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef object _append(self, object streams, object values, tuple tables, tuple parts,
                        bint write):
        cdef cnp.ndarray s = None
        cdef Py_ssize_t e, i, j, t, nt = len(tables), pos = self._pos, cap = self._capacity
        if streams is None:
            e = self._streams
        else:
            if not _int64_vector(streams):
                raise TypeError("streams must be None or a 1-D int64 ndarray (native byte order)")
            s = self._stream_ids(streams)
            e = s.shape[0]
        if e < 1 or e > cap:
            raise ValueError(f"{e} rows for a ring of {cap}")
        if type(values) is not tuple or len(<tuple>values) != self._ncols:
            raise TypeError(f"values must be a tuple of {self._ncols} column values")
        if nt > 8:
            raise TypeError("at most 8 tables")
        cdef _Scalar sc[16]
        cdef int how[16]
        if self._ncols > 16:
            raise TypeError("at most 16 columns")
        cdef list converted = None  # the values, once one is converted (they stay alive)
        cdef bint known = s is None and values is self._checked
        cdef bint immutable = s is None and not write  # (check() keeps what it saw)
        if known:  # checked already (the same tuple of immutable values: still valid)
            memcpy(how, self._checked_how, sizeof(how))
            memcpy(sc, self._checked_sc, sizeof(sc))
        for j in range(0 if known else self._ncols):
            v = (<tuple>values)[j]
            if self._bits[j] and type(v) is tuple:
                v = self._convert_bits(j, <tuple>v, e)
            how[j] = self._check_value(j, v, e, &sc[j])
            if how[j] == 0:  # not as it is: converted, then taken as it is or refused
                v = self._convert(self._names[j], v, e)
                how[j] = self._check_value(j, v, e, &sc[j])
                if how[j] == 0:
                    raise TypeError(f"{self._names[j]}: convert gave a {type(v).__name__}")
            if v is not (<tuple>values)[j]:
                if converted is None:
                    converted = list(values)
                converted[j] = v
            immutable = immutable and (how[j] == 3 or how[j] == 2 and _plain_bits(v))
        if converted is not None:
            values = tuple(converted)
        elif immutable and not known:
            self._checked = <tuple>values
            memcpy(self._checked_how, how, sizeof(how))
            memcpy(self._checked_sc, sc, sizeof(sc))
        cdef const int64_t *src[8 * _MAX_PARTS]
        cdef Py_ssize_t ks[8 * _MAX_PARTS]
        cdef Py_ssize_t nparts[8]
        for t in range(nt):
            nparts[t] = (<SlotTable>tables[t])._collect(
                parts[t], e, src + t * _MAX_PARTS, ks + t * _MAX_PARTS, True)
        if not write:
            return None
        if min(pos + e, cap) > self._rows:
            raise ValueError(f"{e} rows do not fit the {self._rows} allocated")
        for t in range(nt):
            if (<SlotTable>tables[t])._R < min(pos + e, cap):
                raise ValueError(f"tables[{t}] has fewer rows than the ring")
        cdef float f
        for j in range(self._ncols):  # codes for a palette column's new values
            if self._npal[j] >= 0 and how[j] == 1:
                self._fit(j, <const float *>cnp.PyArray_DATA(<cnp.ndarray>(<tuple>values)[j]), e)
            elif self._npal[j] >= 0 and how[j] == 3:
                f = <float>sc[j].f
                self._fit(j, &f, 1)
        cdef int64_t few[64]
        cdef int64_t *at = few
        if e > 64:
            at = <int64_t *>malloc(e * sizeof(int64_t))
            if at == NULL:
                raise MemoryError()
        for i in range(e):
            at[i] = (pos + i) % cap
        try:
            for t in range(nt):
                (<SlotTable>tables[t])._reserve_parts(
                    at, e, src + t * _MAX_PARTS, ks + t * _MAX_PARTS, nparts[t])
        except MemoryError:
            if at != few:
                free(at)
            raise
        # phase 2: no Python code from here on
        self._count(at, e, -1)
        self._link(s, e)
        for j in range(self._ncols):
            self._write(j, (<tuple>values)[j], how[j], &sc[j], pos, e)
        self._count(at, e, 1)
        for t in range(nt):
            _table_write(<SlotTable>tables[t], at, e, src + t * _MAX_PARTS, ks + t * _MAX_PARTS,
                         nparts[t])
        if at != few:
            free(at)
        for t in range(nt):  # out of memory: the frames stay hot, queued
            lf_pool_compress_pending(&(<SlotTable>tables[t])._pool.p)
        return pos

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef void _link(self, cnp.ndarray s, Py_ssize_t e) noexcept:
        """Evict the rows at the next ``e`` positions and append one row per stream."""
        cdef Py_ssize_t i, p, pos = self._pos, cap = self._capacity
        cdef int64_t st, old, prev
        cdef const int64_t *sv = NULL if s is None else <const int64_t *>cnp.PyArray_DATA(s)
        for i in range(e):
            p = (pos + i) % cap
            st = i if sv == NULL else sv[i]
            if self._lockstep:  # (append() left it unless these are every stream, in order)
                self._put(self._last, st, p)
                continue
            if self._full or p < pos:  # p holds the oldest row of its stream
                old = self._stream_of(p)
                if self._get(self._last, old) == p:
                    self._put(self._last, old, -1)
            prev = self._get(self._last, st)
            if prev >= 0:
                self._put(self._next, prev, p)
            self._put(self._next, p, -1)
            self._set_stream(p, st)
            self._put(self._last, st, p)
        self._full = self._full or pos + e >= cap
        self._pos = (pos + e) % cap
        self._appended += e

    cdef void _count(self, const int64_t *at, Py_ssize_t e, int sign) noexcept:
        """Count (+1) the rows at ``at`` with a counted bit set, or uncount (-1) those held."""
        if self._counted_col < 0:
            return
        cdef const uint8_t *col = <const uint8_t *>cnp.PyArray_DATA(
            <cnp.ndarray>self._cols[self._counted_col])
        cdef Py_ssize_t i
        for i in range(e):
            if sign > 0 or self._full or at[i] < self._pos:  # (-1: before the rows move on)
                if col[at[i]] & self._counted_mask:
                    self._counted += sign

    cdef inline int64_t _next_of(self, Py_ssize_t p) noexcept:
        """The next row of position ``p``'s stream, -1 for none."""
        if not self._lockstep:
            return self._get(self._next, p)
        if (not self._full and p >= self._pos) or self._get(self._last, p % self._streams) == p:
            return -1
        return (p + self._streams) % self._capacity

    cdef inline int64_t _stream_of(self, Py_ssize_t p) noexcept:  # _env's dtype decides
        if self._lockstep:
            return p % self._streams
        cdef void *env = cnp.PyArray_DATA(self._env)
        cdef Py_ssize_t size = cnp.PyArray_ITEMSIZE(self._env)
        if size == 1:
            return (<uint8_t *>env)[p]
        if size == 2:
            return (<uint16_t *>env)[p]
        return (<int32_t *>env)[p]

    cdef inline void _set_stream(self, Py_ssize_t p, int64_t st) noexcept:
        cdef void *env = cnp.PyArray_DATA(self._env)
        cdef Py_ssize_t size = cnp.PyArray_ITEMSIZE(self._env)
        if size == 1:
            (<uint8_t *>env)[p] = <uint8_t>st
        elif size == 2:
            (<uint16_t *>env)[p] = <uint16_t>st
        else:
            (<int32_t *>env)[p] = <int32_t>st

    cdef inline int64_t _get(self, cnp.ndarray a, Py_ssize_t i) noexcept:
        if self._wide:
            return (<int64_t *>cnp.PyArray_DATA(a))[i]
        return (<int32_t *>cnp.PyArray_DATA(a))[i]

    cdef inline void _put(self, cnp.ndarray a, Py_ssize_t i, int64_t v) noexcept:
        if self._wide:
            (<int64_t *>cnp.PyArray_DATA(a))[i] = v
        else:
            (<int32_t *>cnp.PyArray_DATA(a))[i] = <int32_t>v

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef void _write(self, Py_ssize_t j, object v, int how, const _Scalar *sc, Py_ssize_t pos,
                     Py_ssize_t e) noexcept:
        """Phase 2 of one column: write the checked value ``v`` at rows ``pos ...``."""
        cdef Py_ssize_t i, p, b, rb = self._rowbytes[j], cap = self._capacity
        cdef char *col = <char *>cnp.PyArray_DATA(<cnp.ndarray>self._cols[j])
        cdef const char *src
        cdef uint8_t bits
        if how == 1 and self._npal[j] >= 0:  # codes (_fit gave each value one)
            src = <const char *>cnp.PyArray_DATA(<cnp.ndarray>v)
            for i in range(e):
                (<uint8_t *>col)[(pos + i) % cap] = <uint8_t>self._code(j, (<const float *>src)[i])
        elif how == 1:
            src = <const char *>cnp.PyArray_DATA(<cnp.ndarray>v)
            if pos + e <= cap:
                memcpy(col + pos * rb, src, e * rb)
            else:
                for i in range(e):
                    memcpy(col + ((pos + i) % cap) * rb, src + i * rb, rb)
        elif how == 3:
            self._write_scalar(j, pos, sc)
        else:  # bits: a bool for every row, or a bool per row
            for i in range(e):
                (<uint8_t *>col)[(pos + i) % cap] = 0
            for b in range(len(<tuple>v)):
                bit = (<tuple>v)[b]
                if bit is True:
                    for i in range(e):
                        (<uint8_t *>col)[(pos + i) % cap] |= <uint8_t>(1 << b)
                elif bit is not None and bit is not False:
                    src = <const char *>cnp.PyArray_DATA(<cnp.ndarray>bit)
                    for i in range(e):
                        if src[i]:
                            (<uint8_t *>col)[(pos + i) % cap] |= <uint8_t>(1 << b)

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def take(self, rows):
        """Copies of every column's values at ``rows``: one call for a sample's fields.

        Args:
            rows: a 1-D int64 ndarray of positions in ``[0, size)`` (repeats allowed).

        Returns:
            A tuple of one array per column, ``(B, *shape)`` in its dtype; a bits
            column gives a float32 array ``(bits, B)`` of 0.0 and 1.0 instead, row ``b``
            the bit ``b`` of each value.

        Raises:
            TypeError: ``rows`` not a 1-D int64 ndarray. IndexError: a position out of range.
        """
        self._ready()
        if not _int64_vector(rows):
            raise TypeError("rows must be a 1-D int64 ndarray (native byte order)")
        cdef cnp.ndarray r = cnp.PyArray_GETCONTIGUOUS(<cnp.ndarray>rows)
        cdef const int64_t *ri = <const int64_t *>cnp.PyArray_DATA(r)
        cdef Py_ssize_t B = r.shape[0], i, j, b, n = self.size, rb, nb
        for i in range(B):
            if ri[i] < 0 or ri[i] >= n:
                raise IndexError(f"position {ri[i]} out of range [0, {n})")
        cdef cnp.npy_intp dims[cnp.NPY_MAXDIMS]
        cdef char *dst
        cdef const char *src
        cdef float *fv
        cdef uint8_t v
        cdef cnp.ndarray col
        cdef const uint32_t *pal
        out = []
        for j in range(self._ncols):  # hints first: the rows' cache misses overlap
            src = <const char *>cnp.PyArray_DATA(<cnp.ndarray>self._cols[j])
            rb = 1 if self._npal[j] >= 0 else self._rowbytes[j]
            for i in range(B):
                lf_prefetch(src + ri[i] * rb)
        for j in range(self._ncols):
            src = <const char *>cnp.PyArray_DATA(<cnp.ndarray>self._cols[j])
            nb = len(<tuple>self._bits[j])
            if nb:
                dims[0] = nb
                dims[1] = B
                a = cnp.PyArray_EMPTY(2, dims, cnp.NPY_FLOAT32, 0)
                fv = <float *>cnp.PyArray_DATA(<cnp.ndarray>a)
                for i in range(B):
                    v = (<const uint8_t *>src)[ri[i]]
                    for b in range(nb):
                        fv[b * B + i] = <float>((v >> b) & 1)
            elif self._npal[j] >= 0:  # (B,) float32 from the codes
                dims[0] = B
                a = cnp.PyArray_EMPTY(1, dims, cnp.NPY_FLOAT32, 0)
                pal = self._pal + j * _PALETTE
                dst = <char *>cnp.PyArray_DATA(<cnp.ndarray>a)
                for i in range(B):
                    memcpy(dst + 4 * i, pal + (<const uint8_t *>src)[ri[i]], 4)
            else:  # (B, *shape) in the column's dtype
                col = <cnp.ndarray>self._cols[j]
                dims[0] = B
                for b in range(1, col.ndim):
                    dims[b] = col.shape[b]
                a = _empty(col.ndim, dims, col.descr)
                dst = <char *>cnp.PyArray_DATA(<cnp.ndarray>a)
                rb = self._rowbytes[j]
                for i in range(B):
                    memcpy(dst + i * rb, src + ri[i] * rb, rb)
            out.append(a)
        return tuple(out)

    def walk(self, starts, Py_ssize_t steps):
        """Each start's row and the next ``steps - 1`` rows of its stream, along the links.

        Args:
            starts: a 1-D int64 ndarray of positions in ``[0, size)``.
            steps: rows per start, at least 1.

        Returns:
            An int64 array ``(len(starts), steps)``; -1 past a stream's newest row.

        Raises:
            TypeError: ``starts`` not a 1-D int64 ndarray. IndexError: a position out of
                range. ValueError: ``steps`` < 1.
        """
        self._ready()
        if not _int64_vector(starts):
            raise TypeError("starts must be a 1-D int64 ndarray (native byte order)")
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        cdef cnp.ndarray r = cnp.PyArray_GETCONTIGUOUS(<cnp.ndarray>starts)
        cdef const int64_t *ri = <const int64_t *>cnp.PyArray_DATA(r)
        cdef Py_ssize_t B = r.shape[0], i, t, n = self.size
        for i in range(B):
            if ri[i] < 0 or ri[i] >= n:
                raise IndexError(f"position {ri[i]} out of range [0, {n})")
        cdef cnp.npy_intp dims[2]
        dims[0] = B
        dims[1] = steps
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(2, dims, cnp.NPY_INT64, 0)
        cdef int64_t *o = <int64_t *>cnp.PyArray_DATA(out)
        cdef int64_t p
        for i in range(B):
            p = ri[i]
            for t in range(steps):
                o[i * steps + t] = p
                if p >= 0:
                    p = self._next_of(p)
        return out

    def put(self, Py_ssize_t column, rows, values):
        """Rewrite ``column`` at ``rows`` with ``values``, checked whole first (reanalyse).

        Args:
            column: the index of a column (not the counted one).
            rows: a 1-D int64 ndarray of positions in ``[0, size)``.
            values: an ndarray ``(len(rows), *shape)`` of the column's dtype, C-contiguous
                (a float column's values finite); a repeated row gets its last value.

        Raises:
            IndexError: a column or position out of range. ValueError: the counted column,
                a non-finite float. TypeError: ``rows`` or ``values`` of another type,
                dtype or shape. Nothing is written then.
        """
        self._ready()
        if not 0 <= column < self._ncols:
            raise IndexError(f"column {column} out of range [0, {self._ncols})")
        if column == self._counted_col:
            raise ValueError(f"{self._names[column]} is counted: it is written by append only")
        if not _int64_vector(rows):
            raise TypeError("rows must be a 1-D int64 ndarray (native byte order)")
        cdef cnp.ndarray r = cnp.PyArray_GETCONTIGUOUS(<cnp.ndarray>rows)
        cdef const int64_t *ri = <const int64_t *>cnp.PyArray_DATA(r)
        cdef Py_ssize_t B = r.shape[0], i, n = self.size, rb = self._rowbytes[column]
        for i in range(B):
            if ri[i] < 0 or ri[i] >= n:
                raise IndexError(f"position {ri[i]} out of range [0, {n})")
        if not _exact_rows(values, self._types[column], B, self._nds[column],
                           self._dims + _MAX_COL_DIMS * column):
            raise TypeError(f"values must be a C-contiguous ndarray of shape "
                            f"{(B,) + self._shapes[column]} and dtype {self._dtypes[column]}")
        cdef _Scalar sc
        self._check_value(column, values, B, &sc)  # finite floats
        cdef const char *src = <const char *>cnp.PyArray_DATA(<cnp.ndarray>values)
        self._fit(column, <const float *>src, B if self._npal[column] >= 0 else 0)
        cdef char *col = <char *>cnp.PyArray_DATA(<cnp.ndarray>self._cols[column])
        if self._npal[column] >= 0:
            for i in range(B):
                col[ri[i]] = <char>self._code(column, (<const float *>src)[i])
            return
        for i in range(B):
            memcpy(col + ri[i] * rb, src + i * rb, rb)

    def positions(self, numbers):
        """The positions of the rows numbered ``numbers`` (integers, read flat).

        Returns:
            ``(positions, bad)``: the int64 positions, and the index (in ``numbers``
            read flat) of the first number whose row is not held (evicted, dropped by
            :meth:`clear`, or not appended yet), -1 when every row is held (else the
            positions from ``bad`` on are not set).

        Raises:
            TypeError: numbers that are not integers.

        Example:
            >>> ring = RowRing(2, 1, [("x", (), np.int8)])
            >>> ring.grow(2)
            >>> for _ in range(3):
            ...     _ = ring.append(None, (0,))
            >>> ring.appended, ring.positions([2, 1]), ring.positions([0])[1]
            (3, (array([0, 1]), -1), 0)
            >>> ring.numbers([0, 1]).tolist()
            [2, 1]
            >>> ring.clear()
            >>> ring.appended
            4
        """
        self._ready()
        # uint64 numbers above INT64_MAX become negative: not held either way
        cdef cnp.ndarray src = _int64s(numbers, "row numbers")
        cdef cnp.npy_intp n = cnp.PyArray_SIZE(src), i
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(1, &n, cnp.NPY_INT64, 0)
        cdef const int64_t *v = <const int64_t *>cnp.PyArray_DATA(src)
        cdef int64_t *o = <int64_t *>cnp.PyArray_DATA(out)
        cdef int64_t hi = self._appended, cap = self._capacity
        cdef int64_t lo = hi - (cap if self._full else self._pos)
        for i in range(n):
            if v[i] < lo or v[i] >= hi:
                return out, i
            o[i] = v[i] % cap
        return out, -1

    def numbers(self, positions):
        """The numbers of the rows held at ``positions`` (integers in ``[0, size)``), int64.

        Raises:
            TypeError: positions that are not integers. IndexError: a position that
                holds no row.
        """
        self._ready()
        cdef cnp.ndarray src = _int64s(positions, "positions")
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(src.ndim, src.shape, cnp.NPY_INT64, 0)
        cdef Py_ssize_t n = cnp.PyArray_SIZE(src), i
        cdef const int64_t *v = <const int64_t *>cnp.PyArray_DATA(src)
        cdef int64_t *o = <int64_t *>cnp.PyArray_DATA(out)
        cdef int64_t size = self._capacity if self._full else self._pos, cap = self._capacity
        cdef int64_t newest = self._appended - 1
        for i in range(n):
            if not 0 <= v[i] < size:
                raise IndexError(f"position {v[i]} holds no row (the ring holds {size})")
            o[i] = newest - (newest % cap - v[i]) % cap  # Python's %: never negative
        return out

    def renumber(self, appended):
        """Number the rows as if ``appended`` rows had been appended (a checkpoint's count).

        Raises:
            ValueError: a count below the rows held, or whose remainder modulo the
                capacity is not the write position.
        """
        self._ready()
        cdef int64_t a = operator.index(appended)
        if a < self.size or a % self._capacity != self._pos:
            raise ValueError(f"{a} rows appended do not fit a ring of {self.size} rows "
                             f"written up to position {self._pos}")
        self._appended = a

    def clear(self):
        """Drop every row: the ring is empty, its arrays kept.

        Row numbers move on to the next multiple of the capacity.
        """
        self._ready()
        self._appended = -(-self._appended // self._capacity) * self._capacity
        self._pos = 0
        self._full = False
        self._counted = 0
        self._last.fill(-1)
        self._relock()

    cdef int _relock(self) except -1:
        """Enter lockstep (see the class) if the capacity allows: drop the stored links."""
        if self._capacity % self._streams == 0 and not self._lockstep:
            self._env = np.zeros(0, self._env.dtype)
            self._next = np.zeros(0, self._link_dtype)
            self._views = self._make_views()
            self._lockstep = True
        return 0

    def load(self, pos, full, env, values):
        """Restore rows ``[0, n)`` (``n = capacity`` if ``full`` else ``pos``) from arrays.

        The arrays grow to ``n`` rows; each stream's links are rebuilt from ``env`` in
        ring order (oldest first). A checkpoint's restore.

        Args:
            pos: the write position, in ``[0, capacity)``.
            full: whether every position holds a row.
            env: integers ``(n,)``, the streams, each in range.
            values: one ndarray ``(n, *shape)`` of each column's dtype.

        Raises:
            ValueError, TypeError: values of another shape or dtype, streams out of
                range, a non-finite float, a position out of range.
        """
        self._ready()
        cdef Py_ssize_t p = operator.index(pos), n, i, j
        if not 0 <= p < self._capacity:
            raise ValueError(f"pos {p} out of range [0, {self._capacity})")
        if type(full) is not bool:
            raise TypeError("full must be a bool")
        n = self._capacity if full else p
        envs = np.asarray(env)
        if envs.dtype.kind not in "iu" or envs.shape != (n,):
            raise ValueError(f"env must hold one integer stream id per row ({n}), got "
                             f"{envs.dtype} {envs.shape}")
        if n and (envs.min() < 0 or envs.max() >= self._streams):
            raise ValueError(f"env holds a stream id outside [0, {self._streams})")
        envs = np.ascontiguousarray(envs, dtype=self._env.dtype)  # (in range: no wrap)
        if type(values) is not tuple or len(values) != self._ncols:
            raise TypeError(f"values must be a tuple of {self._ncols} arrays")
        cdef _Scalar unused
        vals = []
        for j in range(self._ncols):
            v = np.ascontiguousarray(values[j])
            if v.dtype != self._dtypes[j]:
                raise TypeError(f"{self._names[j]} has dtype {v.dtype}, expected {self._dtypes[j]}")
            if self._check_value(j, v, n, &unused) == 0:
                raise TypeError(f"{self._names[j]} has shape {v.shape}, "
                                f"expected {(n,) + self._shapes[j]}")
            vals.append(v)
        # everything new is made first, then taken at once (a MemoryError changes nothing):
        # lockstep if each row's stream is its position's and the next append's rows
        # start at stream 0, as lockstep appends leave them; a palette column as codes if
        # its values fit a palette
        cdef bint lock = (self._capacity % self._streams == 0 and p % self._streams == 0
                          and np.array_equal(envs, np.arange(n) % self._streams))
        cdef Py_ssize_t rows = max(self._rows, n)
        palettes, cols = [None] * self._ncols, []
        for j in range(self._ncols):
            v, dt = vals[j], self._dtypes[j]
            if self._palette_kind(j):
                bits = v.view(np.uint32)
                known = np.unique(np.concatenate([np.zeros(1, np.uint32), bits]))  # 0.0 first
                if known.size <= _PALETTE:
                    palettes[j] = known
                    v, dt = np.searchsorted(known, bits).astype(np.uint8), np.uint8
            col = np.zeros((rows,) + self._shapes[j], dt)
            col[:n] = v
            cols.append(col)
        env_rows = np.zeros(0 if lock else rows, self._env.dtype)
        if not lock:
            env_rows[:n] = envs
        next_rows = np.full(0 if lock else rows, -1, self._link_dtype)
        self._env, self._next, self._cols, self._rows = env_rows, next_rows, cols, rows
        self._lockstep = lock
        for j in range(self._ncols):
            if palettes[j] is not None:
                for i in range(palettes[j].size):
                    self._pal[j * _PALETTE + i] = palettes[j][i]
                self._npal[j] = palettes[j].size
            elif self._palette_kind(j):
                self._npal[j] = -1  # stored as float32
        self._views = self._make_views()
        self._pos, self._full = 0, False
        self._last.fill(-1)
        # link each stream's rows oldest first: ring order from pos when full
        cdef int64_t prev
        cdef Py_ssize_t q
        for i in range(n):  # (next_rows start at -1: a stream's newest keeps it)
            q = (p + i) % self._capacity if full else i
            prev = self._get(self._last, self._stream_of(q))
            if prev >= 0 and not self._lockstep:
                self._put(self._next, prev, q)
            self._put(self._last, self._stream_of(q), q)
        self._pos, self._full = p, full
        self._appended = self._capacity + p if full else p
        self._counted = 0
        if self._counted_col >= 0 and n:
            self._counted = int(np.count_nonzero(vals[self._counted_col] & self._counted_mask))

    def __reduce__(self):
        raise TypeError("a RowRing cannot be pickled; use ReplayBuffer.save")

    def __repr__(self):
        self._ready()
        return (f"RowRing(capacity={self._capacity}, num_streams={self._streams}, "
                f"size={self.size}, columns={list(self._names)})")


# -- uniform draws: NumPy's own bounded-integer routine, without its per-call overhead --
cdef extern from "numpy/random/distributions.h":
    void random_bounded_uint64_fill(bitgen_t *bitgen_state, uint64_t off, uint64_t rng,
                                    cnp.npy_intp cnt, bint use_masked, uint64_t *out) nogil


_Generator = np.random.Generator


def draw_integers(rng, high, count):
    """``rng.integers(0, high, size=count)``: the same int64 array and generator state.

    One call of the routine ``Generator.integers`` calls (NumPy's ``npyrandom``, Lemire's
    method), under the bit generator's lock, without its Python-level checks (``np.prod``
    of the size alone costs ten times the draws of a batch of 32). Integers only.

    Raises:
        TypeError: ``rng`` is not a ``numpy.random.Generator`` over a bit generator of C
            functions; ``high`` or ``count`` not an integer (a bool count is not one).
        ValueError: ``high`` outside ``[1, 2**63]``, or ``count < 0``.
    """
    if not isinstance(rng, _Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    if isinstance(count, bool):
        raise TypeError("count must be an integer, got bool")
    h, n = operator.index(high), operator.index(count)
    if not 1 <= h <= 2**63 or n < 0:
        raise ValueError(f"need 1 <= high <= 2**63 and count >= 0, got high={h}, count={n}")
    bits = rng.bit_generator
    capsule = bits.capsule
    cdef bitgen_t *state = <bitgen_t *>PyCapsule_GetPointer(capsule, "BitGenerator")
    if state.state == NULL or state.next_uint32 == NULL or state.next_uint64 == NULL:
        raise TypeError("rng's bit generator has no C functions to draw with")
    cdef cnp.npy_intp cnt = n
    cdef cnp.ndarray out = cnp.PyArray_EMPTY(1, &cnt, cnp.NPY_INT64, 0)
    cdef uint64_t *data = <uint64_t *>cnp.PyArray_DATA(out)
    cdef uint64_t top = <uint64_t>(h - 1)
    with bits.lock:  # the GIL held: releasing it costs more than a batch's draws
        random_bounded_uint64_fill(state, 0, top, cnt, False, data)
    return out
