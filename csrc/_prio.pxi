# SumTree: the priority sum-tree and min-tree of PrioritizedReplayBuffer (sumtree.c).
#
# Included by _core.pyx. Every method converts its arguments first (phase 1: the only
# place Python code can run, e.g. an __array__ or __index__ callback), then checks them
# again in C and acts without the GIL (phase 2). A refused call writes nothing.


cdef extern from "sumtree.h" nogil:
    ctypedef struct lf_sumtree:
        size_t n
        size_t size
        double *sum
        double *min
    int lf_sumtree_init(lf_sumtree *t, size_t n)
    void lf_sumtree_free(lf_sumtree *t)
    void lf_sumtree_clear(lf_sumtree *t)
    long long lf_sumtree_check(const lf_sumtree *t, const int64_t *idx, const double *val,
                               size_t m)
    int lf_sumtree_set(lf_sumtree *t, const int64_t *idx, const double *val, size_t m)
    double lf_sumtree_total(const lf_sumtree *t)
    double lf_sumtree_min(const lf_sumtree *t)
    double lf_sumtree_get(const lf_sumtree *t, size_t i)
    int lf_sumtree_sample(const lf_sumtree *t, const double *u, size_t m, int64_t *out)
    void lf_sumtree_weights(const lf_sumtree *t, const int64_t *idx, size_t m, double beta,
                            float *out)


cdef extern from "<math.h>" nogil:
    double pow(double x, double y)
    bint isfinite(double x)


cdef extern from "<float.h>":
    double DBL_MAX


cdef object _f64(object x, str name):
    """``x`` as a 1-D C-contiguous float64 array (ValueError naming ``name`` otherwise)."""
    a = np.asarray(x)
    if a.dtype.kind not in "iuf":
        raise TypeError(C.prio_dtype(name, a.dtype))
    return np.ascontiguousarray(a.reshape(-1), np.float64)


cdef object _i64(object x, str name):
    """``x`` as a 1-D C-contiguous int64 array of integers (TypeError for other dtypes)."""
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(C.prio_int_dtype(name, a.dtype))
    return np.ascontiguousarray(a.reshape(-1)).astype(np.int64, copy=False)


@cython.final
@cython.no_gc
cdef class SumTree:
    """SumTree(capacity)
--

A sum-tree and a min-tree of ``capacity`` float64 leaves, for proportional sampling.

    Leaf ``i`` holds a non-negative weight; 0 is an empty leaf, never drawn and not in
    :meth:`min`. :meth:`set` writes leaves in batches, :meth:`sample` draws a whole
    batch in one call, stratified (draw ``j`` of ``m`` falls in the ``j``-th of ``m``
    equal segments of the total, as OpenAI baselines and Dopamine draw), and
    :meth:`sample_weighted` adds the importance weights. A write recomputes each node
    above it from its two children, so the tree always equals a rebuild from its
    leaves: no drift however many updates (docs/DESIGN.md). A tree cannot be pickled.

    Args:
        capacity: number of leaves, ``>= 0``.

    Raises:
        ValueError: a negative capacity. MemoryError: no memory for the nodes.

    Example:
        >>> t = SumTree(4)
        >>> t.set([0, 1, 3], [1.0, 2.0, 5.0])
        >>> t.total(), t.min()
        (8.0, 1.0)
        >>> t.sample([0.5, 0.5]).tolist()
        [1, 3]
    """

    cdef lf_sumtree _t
    cdef bint _ready

    def __cinit__(self):
        self._t.sum = NULL
        self._t.min = NULL
        self._t.n = 0
        self._t.size = 0
        self._ready = False

    def __dealloc__(self):
        lf_sumtree_free(&self._t)

    def __init__(self, capacity):
        _fresh(self, self._ready)
        n = operator.index(capacity)
        if n < 0:
            raise ValueError(f"capacity must be >= 0, got {n}")
        _fresh(self, self._ready)  # an __index__ callback may have run __init__
        if n > <Py_ssize_t>(INT64_MAX // 32) or lf_sumtree_init(&self._t, <size_t>n) != 0:
            raise MemoryError(f"no memory for a SumTree of {n} leaves")
        self._ready = True

    cdef int _check(self) except -1:
        if not self._ready:
            raise TypeError(C.not_initialised("SumTree"))
        return 0

    @property
    def capacity(self) -> int:
        """Number of leaves."""
        self._check()
        return self._t.n

    def total(self) -> float:
        """Sum of the leaves."""
        self._check()
        return lf_sumtree_total(&self._t)

    def min(self) -> float:
        """Smallest non-empty leaf (``inf`` when every leaf is empty)."""
        self._check()
        return lf_sumtree_min(&self._t)

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def get(self, indices):
        """The leaves ``indices`` (a float64 array). Raises IndexError out of range."""
        self._check()
        idx = _i64(indices, "indices")
        cdef const int64_t[::1] iv = idx
        out = np.empty(idx.size, np.float64)
        cdef double[::1] ov = out
        cdef Py_ssize_t j, m = iv.shape[0]
        for j in range(m):
            if iv[j] < 0 or <uint64_t>iv[j] >= self._t.n:
                raise IndexError(C.prio_index(j, iv[j], self._t.n))
        for j in range(m):
            ov[j] = lf_sumtree_get(&self._t, <size_t>iv[j])
        return out

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def set(self, indices, values) -> None:
        """Set leaves ``indices`` to ``values`` (same length; a repeated index keeps its last).

        Raises:
            ValueError: lengths differ, an index outside ``[0, capacity)``, a value that
                is negative, NaN or infinite. TypeError: non-integer indices, non-numeric
                values. Nothing is written when an error is raised.
        """
        self._check()
        idx = _i64(indices, "indices")
        val = _f64(values, "values")
        if idx.size != val.size:
            raise ValueError(C.prio_lengths(idx.size, val.size))
        cdef const int64_t[::1] iv = idx
        cdef const double[::1] vv = val
        cdef size_t m = iv.shape[0]
        cdef long long bad
        if m == 0:
            return
        with nogil:
            bad = lf_sumtree_check(&self._t, &iv[0], &vv[0], m)
            if bad < 0:
                lf_sumtree_set(&self._t, &iv[0], &vv[0], m)
        if bad >= 0:
            if iv[bad] < 0 or <uint64_t>iv[bad] >= self._t.n:
                raise ValueError(C.prio_index(bad, iv[bad], self._t.n))
            raise ValueError(C.prio_value(bad, vv[bad]))

    def clear(self) -> None:
        """Empty every leaf."""
        self._check()
        lf_sumtree_clear(&self._t)

    def sample(self, u):
        """Stratified draws: leaf indices (int64), one per entry of ``u`` (in ``[0, 1)``).

        Draw ``j`` of ``m`` takes the leaf where the running sum of the leaves crosses
        ``(j + u[j]) * total / m``; an empty leaf is never drawn.

        Raises:
            ValueError: every leaf is empty, or a ``u`` outside ``[0, 1)``.
        """
        return self.sample_weighted(u, None)[0]

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def sample_weighted(self, u, beta):
        """:meth:`sample` and the importance weights of the draws, in one call.

        Returns:
            ``(indices, weights)``: int64 and float32 arrays; ``weights[j] =
            (leaf / min) ** -beta`` (baselines' ``(N P(i))**-beta / (N P_min)**-beta``,
            ``N`` cancelled), or None when ``beta`` is None.

        Raises:
            ValueError: as :meth:`sample`.
        """
        self._check()
        uu = _f64(u, "u")
        cdef double b = 0.0 if beta is None else float(beta)
        cdef const double[::1] uv = uu
        cdef size_t m = uv.shape[0]
        idx = np.empty(m, np.int64)
        w = None if beta is None else np.empty(m, np.float32)
        cdef int64_t[::1] iv = idx
        cdef float[::1] wv
        cdef int rc = 0
        if m == 0:
            return idx, w
        with nogil:
            rc = lf_sumtree_sample(&self._t, &uv[0], m, &iv[0])
        if rc != 0:
            if not lf_sumtree_total(&self._t) > 0.0:
                raise ValueError(C.prio_empty())
            raise ValueError("u must hold numbers in [0, 1)")
        if w is not None:
            wv = w
            with nogil:
                lf_sumtree_weights(&self._t, &iv[0], m, b, &wv[0])
        return idx, w

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def update_priorities(self, numbers, priorities, double alpha, int64_t lo, int64_t hi,
                          double[::1] raw):
        """PrioritizedReplayBuffer's priority update, checked whole before any write.

        ``numbers`` (int64) are transition numbers: number ``t`` is stored at position
        ``t % capacity`` while ``lo <= t < hi``. Sets ``raw[pos] = p`` and, where the leaf
        is not empty (the transition is sampleable), the leaf to ``p ** alpha``. A
        repeated number keeps its last priority.

        Returns:
            None, or ``(j, kind)`` for the first refused entry (nothing written):
            kind 0, a number outside ``[lo, hi)``; 1, a priority that is not a positive
            finite number; 2, ``p ** alpha`` that is 0 or above ``float64 max / capacity``.
        """
        self._check()
        cdef const int64_t[::1] tv = numbers
        cdef const double[::1] pv = priorities
        cdef size_t m = tv.shape[0], j, n = self._t.n
        cdef int64_t pos
        cdef double v, p, top = DBL_MAX / <double>(n if n else 1)
        cdef int kind = -1
        if <size_t>pv.shape[0] != m:
            raise ValueError(C.prio_lengths(m, pv.shape[0]))
        if <size_t>raw.shape[0] != n:
            raise ValueError(f"raw must hold {n} priorities, got {raw.shape[0]}")
        with nogil:
            for j in range(m):
                p = pv[j]
                if n == 0 or tv[j] < 0 or tv[j] < lo or tv[j] >= hi:
                    kind = 0
                elif not (p > 0.0 and isfinite(p)):
                    kind = 1
                else:
                    v = pow(p, alpha)
                    if not (v > 0.0 and v <= top):
                        kind = 2
                if kind >= 0:
                    break
            if kind < 0:
                for j in range(m):
                    pos = tv[j] % <int64_t>n
                    raw[pos] = pv[j]
                    if lf_sumtree_get(&self._t, <size_t>pos) > 0.0:
                        v = pow(pv[j], alpha)
                        lf_sumtree_set(&self._t, &pos, &v, 1)
        if kind >= 0:
            return j, kind
        return None

    def __reduce__(self):
        raise TypeError("a SumTree cannot be pickled")
