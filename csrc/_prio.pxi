# SumTree: the priority sum-tree and min-tree of PrioritizedReplayBuffer (sumtree.c).
#
# Included by _core.pyx. Every method converts its arguments first (phase 1: the only
# place Python code can run, e.g. an __array__ or __index__ callback), then checks them
# again in C and acts without the GIL (phase 2). A refused call writes nothing.


cdef extern from "sumtree.h" nogil:
    ctypedef struct lf_sumtree:
        size_t n
        size_t size
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


cdef cnp.ndarray _vec(object x, int typenum, str name, str kinds):
    """``x`` as a private C-contiguous copy of ``typenum`` (read flat).

    Private: phase 2 checks the values, then uses them without the GIL, so another
    thread writing the caller's array in between must not reach them. An exact ndarray
    of that type and contiguity is copied as it is (the fast path of the buffer's own
    arrays); anything else goes through ``np.asarray``, whose dtype kind must be one of
    ``kinds`` (TypeError naming ``name`` otherwise).
    """
    cdef cnp.ndarray a
    if cnp.PyArray_CheckExact(x):
        a = <cnp.ndarray>x
        if (cnp.PyArray_TYPE(a) == typenum and cnp.PyArray_IS_C_CONTIGUOUS(a)
                and cnp.PyArray_ISNOTSWAPPED(a) and cnp.PyArray_ISALIGNED(a)):
            return cnp.PyArray_NewCopy(a, cnp.NPY_CORDER)
    b = np.asarray(x)
    if b.dtype.kind not in kinds:
        if kinds == "iu":
            raise TypeError(f"{name} must be integers, got dtype {b.dtype}")
        raise TypeError(f"{name} must be real numbers, got dtype {b.dtype}")
    return np.array(b.reshape(-1), np.int64 if typenum == cnp.NPY_INT64 else np.float64,
                    order="C")  # a copy, always


cdef inline cnp.ndarray _i64(object x, str name):
    return _vec(x, cnp.NPY_INT64, name, "iu")


cdef inline cnp.ndarray _f64(object x, str name):
    return _vec(x, cnp.NPY_FLOAT64, name, "iuf")


cdef str _lengths(Py_ssize_t a, Py_ssize_t b, str what="values"):
    return f"indices and {what} differ in size: {a} and {b}"


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
        memset(&self._t, 0, sizeof(lf_sumtree))
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
            raise TypeError("this SumTree was not initialised")
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

    def get(self, indices):
        """The leaves ``indices`` (a float64 array). Raises IndexError out of range."""
        self._check()
        cdef cnp.ndarray idx = _i64(indices, "indices")
        cdef const int64_t *iv = <const int64_t *>cnp.PyArray_DATA(idx)
        cdef Py_ssize_t j, m = cnp.PyArray_SIZE(idx)
        out = np.empty(m, np.float64)
        cdef double *ov = <double *>cnp.PyArray_DATA(out)
        for j in range(m):
            if iv[j] < 0 or <uint64_t>iv[j] >= self._t.n:
                raise IndexError(
                    f"indices[{j}] = {iv[j]} is out of range for a SumTree of {self._t.n} leaves"
                )
        for j in range(m):
            ov[j] = lf_sumtree_get(&self._t, <size_t>iv[j])
        return out

    def set(self, indices, values) -> None:
        """Set leaves ``indices`` to ``values`` (same size; a repeated index keeps its last).

        Raises:
            ValueError: sizes differ, an index outside ``[0, capacity)``, a value that
                is negative, NaN or infinite. TypeError: non-integer indices, non-numeric
                values. Nothing is written when an error is raised.
        """
        self._check()
        cdef cnp.ndarray idx = _i64(indices, "indices")
        cdef cnp.ndarray val = _f64(values, "values")
        if cnp.PyArray_SIZE(idx) != cnp.PyArray_SIZE(val):
            raise ValueError(_lengths(cnp.PyArray_SIZE(idx), cnp.PyArray_SIZE(val)))
        cdef const int64_t *iv = <const int64_t *>cnp.PyArray_DATA(idx)
        cdef const double *vv = <const double *>cnp.PyArray_DATA(val)
        cdef size_t m = cnp.PyArray_SIZE(idx)
        cdef long long bad
        with nogil:
            bad = lf_sumtree_check(&self._t, iv, vv, m)
            if bad < 0:
                lf_sumtree_set(&self._t, iv, vv, m)
        if bad >= 0:
            if iv[bad] < 0 or <uint64_t>iv[bad] >= self._t.n:
                raise ValueError(
                    f"indices[{bad}] = {iv[bad]} is out of range for a SumTree of {self._t.n} "
                    "leaves"
                )
            raise ValueError(f"values[{bad}] = {vv[bad]!r}: leaves must be finite and >= 0")

    def clear(self) -> None:
        """Empty every leaf."""
        self._check()
        lf_sumtree_clear(&self._t)

    def sample(self, u):
        """Stratified draws: leaf indices (int64), one per entry of ``u`` (in ``[0, 1)``).

        Draw ``j`` of ``m`` takes the leaf where the running sum of the leaves crosses
        ``(j + u[j]) * total / m``; an empty leaf is never drawn.

        Raises:
            ValueError: every leaf is empty, leaves that sum to more than float64 max,
                or a ``u`` outside ``[0, 1)``.
        """
        return self.sample_weighted(u, None)[0]

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
        cdef cnp.ndarray uu = _f64(u, "u")
        cdef double b = 0.0 if beta is None else float(beta)
        cdef size_t m = cnp.PyArray_SIZE(uu)
        cdef cnp.npy_intp dim = <cnp.npy_intp>m
        idx = cnp.PyArray_EMPTY(1, &dim, cnp.NPY_INT64, 0)
        w = None if beta is None else cnp.PyArray_EMPTY(1, &dim, cnp.NPY_FLOAT32, 0)
        cdef const double *uv = <const double *>cnp.PyArray_DATA(uu)
        cdef int64_t *iv = <int64_t *>cnp.PyArray_DATA(idx)
        cdef float *wv = NULL if w is None else <float *>cnp.PyArray_DATA(w)
        cdef int rc = 0
        if m == 0:
            return idx, w
        with nogil:
            rc = lf_sumtree_sample(&self._t, uv, m, iv)
            if rc == 0 and wv != NULL:
                lf_sumtree_weights(&self._t, iv, m, b, wv)
        if rc != 0:
            if not lf_sumtree_total(&self._t) > 0.0:
                raise ValueError("no transition can be sampled: every leaf of the SumTree is empty")
            if not isfinite(lf_sumtree_total(&self._t)):
                raise ValueError(
                    "cannot sample: the leaves of the SumTree sum to more than float64 max"
                )
            raise ValueError("u must hold numbers in [0, 1)")
        return idx, w

    def update(self, indices, values, double exponent=1.0, where=None):
        """Set the non-empty leaves among ``indices`` to ``values ** exponent``; checked first.

        Leaves that are empty (0) stay empty. A repeated index keeps its last value.
        Every value is checked before anything is written: positive and finite, and
        ``value ** exponent`` positive and at most ``float64 max / capacity`` (so the
        total stays finite).

        Args:
            indices: leaf indices in ``[0, capacity)``.
            values: as many non-negative numbers.
            exponent: the power each value is raised to.
            where: None, or as many bools: the entries where it is False are checked but
                not written.

        Returns:
            The largest of ``values`` where written (0.0 for none).

        Raises:
            ValueError: sizes that differ, an index outside ``[0, capacity)``, a value
                refused as above (the message names ``priorities[j]``).
            TypeError: non-integer indices, non-numeric values, ``where`` not bools.
        """
        self._check()
        cdef cnp.ndarray ii = _i64(indices, "indices")
        cdef cnp.ndarray vv = _f64(values, "priorities")
        cdef size_t m = cnp.PyArray_SIZE(ii), j, live = 0, n = self._t.n
        if <size_t>cnp.PyArray_SIZE(vv) != m:
            raise ValueError(_lengths(m, cnp.PyArray_SIZE(vv), "priorities"))
        cdef cnp.ndarray ww = None
        cdef const cnp.npy_bool *wv = NULL
        if where is not None:
            ww = np.array(where, copy=True, order="C").reshape(-1)
            if ww.dtype != np.bool_:
                raise TypeError(f"where must be bools, got dtype {ww.dtype}")
            if <size_t>cnp.PyArray_SIZE(ww) != m:
                raise ValueError(_lengths(m, cnp.PyArray_SIZE(ww), "where"))
            wv = <const cnp.npy_bool *>cnp.PyArray_DATA(ww)
        cdef const int64_t *iv = <const int64_t *>cnp.PyArray_DATA(ii)
        cdef const double *pv = <const double *>cnp.PyArray_DATA(vv)
        cdef double v, most = 0.0, top = DBL_MAX / <double>(n if n else 1)
        cdef int kind = -1
        cdef int64_t *wpos = <int64_t *>malloc((m if m else 1) * sizeof(int64_t))
        cdef double *wval = <double *>malloc((m if m else 1) * sizeof(double))
        if wpos == NULL or wval == NULL:
            free(wpos)
            free(wval)
            raise MemoryError()
        with nogil:
            for j in range(m):
                if iv[j] < 0 or <uint64_t>iv[j] >= n:
                    kind = 0
                elif not (pv[j] > 0.0 and isfinite(pv[j])):
                    kind = 1
                else:
                    v = pow(pv[j], exponent)
                    if not (v > 0.0 and v <= top):
                        kind = 2
                    elif wv != NULL and not wv[j]:
                        continue  # checked, not written
                    elif lf_sumtree_get(&self._t, <size_t>iv[j]) > 0.0:  # not empty
                        wpos[live] = iv[j]
                        wval[live] = v
                        live += 1
                if kind >= 0:
                    break
                if pv[j] > most:
                    most = pv[j]
            if kind < 0:
                lf_sumtree_set(&self._t, wpos, wval, live)
        free(wpos)
        free(wval)
        if kind == 0:
            raise ValueError(f"indices[{j}] = {iv[j]} out of range [0, {n})")
        if kind == 1:
            raise ValueError(f"priorities[{j}] = {pv[j]!r} must be positive and finite")
        if kind == 2:
            raise ValueError(
                f"priorities[{j}] = {pv[j]!r}: priority ** alpha ({exponent}) must be a "
                f"positive float64 at most float64 max / capacity"
            )
        return most

    def __reduce__(self):
        raise TypeError("a SumTree cannot be pickled")
