# _buffer.py's compiled declarations (Cython pure-Python mode): fields read from C.
from ._args cimport Parser
from ._store cimport hold_all, prepare_all

cdef class ReplayBuffer:
    cdef dict __dict__  # (subclasses' fields)
    cdef object __weakref__
    cdef bint _hooked
    cdef public Parser _parser
    cdef public object _ring, _rng, _action_dtype, _layout_opt, _k_opt, _compress, _pool_opt
    cdef public object _frame_keys, _keys, _samplers, _draws
    cdef public tuple _action_shape, _stores, _frames, _vectors, _tables, _extras
    cdef public object _starts
