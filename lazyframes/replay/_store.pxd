# _store.py's compiled declarations (Cython pure-Python mode): fields read from C.
cdef class Geometry:
    cdef public object dtype, frame_shape, layout, obs_shape
    cdef public Py_ssize_t k

cdef class _Obs:
    cdef public object arr, k, layout, owner, pool

cdef class FrameStore:
    cdef Py_ssize_t _capacity
    cdef object _layout_opt, _k_opt, _compress, _pool, _staged, _table, _every
    cdef tuple _names, _owners
    cdef Geometry _geom
    cdef dict _outs, _newest

cpdef object _as_part(object o, object pool, Geometry geom, object candidates)
