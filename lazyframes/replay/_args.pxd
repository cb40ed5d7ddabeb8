# Compiled declarations of _args.py (Cython's pure-Python mode): Parser is an extension
# type, so an add reads its fields from C.

cdef class Parser:
    cdef Py_ssize_t _num_envs
    cdef tuple _action_shape
    cdef object _action_dtype
    cdef bint _scalar_action, _float_action
    cdef public object keys
    cdef public bint decided
