# Compiled declarations of _buffer.py (Cython's pure-Python mode): ReplayBuffer is an
# extension type (with an instance dict, for subclasses), so an add reads its fields from C.
from ._args cimport Parser

cdef class ReplayBuffer:
    cdef dict __dict__
    cdef object __weakref__
    cdef public Parser _parser
    cdef public object _ring, _rng, _action_dtype, _layout_opt, _k_opt, _compress, _pool_opt
    cdef public object _frame_keys, _keys, _samplers, _draws
    cdef public tuple _action_shape, _stores, _frames, _vectors, _tables
