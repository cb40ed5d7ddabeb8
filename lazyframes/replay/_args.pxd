# _args.py's compiled declarations (Cython pure-Python mode): fields read from C.
cdef class Parser:
    cdef Py_ssize_t _num_envs
    cdef tuple _action_shape
    cdef object _action_dtype
    cdef bint _scalar_action, _float_action
    cdef public object keys
    cdef public bint decided
    cpdef tuple parse(self, obs, action, reward, next_obs, terminated, truncated, autoreset,
                      env_ids, final_obs, final_mask)
