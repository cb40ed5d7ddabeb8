# _store.py's compiled declarations (Cython pure-Python mode): fields read from C.
cimport cython
cimport numpy as cnp

cdef class Geometry:
    cdef public object dtype, frame_shape, layout, obs_shape, divisor
    cdef public Py_ssize_t k

cdef class _Obs:
    cdef public object arr, k, layout, owner, pool, divisor

cdef class Store:
    cpdef tuple prepare(self, obs, nxt, final, Py_ssize_t E, bint batched, ring, envs, values)

cdef class FrameStore(Store):
    cdef Py_ssize_t _capacity
    cdef object _layout_opt, _k_opt, _compress, _pool, _staged, _table, _every
    cdef tuple _names, _owners
    cdef Geometry _geom
    cdef dict _outs, _newest
    cdef tuple _described(self, obs, nxt, final, Py_ssize_t E, bint batched)
    cpdef hold(self, envs, nxt)

cdef bint _owned(object o, object pool)
cpdef object _as_part(object o, object pool, Geometry geom, object candidates, object then=*)
@cython.locals(a=cnp.ndarray)
cdef object _frames(object o, object pool, Geometry geom)

cdef class VectorStore(Store):
    cdef tuple _names
    cdef public object shape, dtype, _obs, _next

@cython.locals(s=Store, i=Py_ssize_t)
cpdef tuple prepare_all(tuple stores, tuple obs, tuple nxt, final, Py_ssize_t E, bint batched,
                        ring, envs, values)

@cython.locals(i=Py_ssize_t, fs=FrameStore)
cpdef hold_all(tuple stores, tuple parts, tuple nxt, envs)
cpdef object frames_view(arr, str layout, Py_ssize_t k, Py_ssize_t lead=*)

@cython.locals(a=cnp.ndarray, shape=tuple, i=Py_ssize_t, n=Py_ssize_t)
cdef bint _stacked(object x, Py_ssize_t E, bint lead, Geometry g)
