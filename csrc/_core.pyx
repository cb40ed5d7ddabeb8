"""The compiled core of lazyframes: a refcounted frame pool and the objects that own its slots.

The bytes live in a plain-C arena (``pool.c``) and are copied out by plain-C kernels
(``kernels.c``) with the GIL released, a large copy split across threads (``parallel.c``).
This module adds the Python objects that own references to slots (:class:`FrameRef`,
:class:`LazyFrames`, :class:`LazyBatch`, :class:`SlotTable`), the checks that run before C
trusts anything, and the NumPy glue.

The documentation is written here, once (the stub ``lazyframes/_core.pyi`` has only the
signatures, for type checkers). The module is split by topic:

- ``_checks.pxi``: checks of the core's own arguments (containers, rows, overlaps);
- ``_pool.pxi``: :class:`FramePool` and :class:`FrameRef` (push, get, refcounts, stats);
- ``_copyout.pxi``: the one copy-out routine every gather goes through, and the two
  phases every call that reads ids or frames follows (convert, then check and act);
- ``_lazy.pxi``: :class:`LazyFrames`, :class:`LazyBatch` and :func:`stack`;
- ``_table.pxi``: :class:`SlotTable`, the replay buffer's store;
- ``_pickle.pxi``: pickling and :func:`default_pool`;
- ``_codec.pxi``: :func:`encode_frames` and :func:`decode_frames`, checkpoints' frames;
- ``_prio.pxi``: :class:`SumTree`, the priorities of ``PrioritizedReplayBuffer``;
- ``_floors.pxi``: ``_ingest_floor``, the benchmarks' floor of adding ndarray stacks
  (the gather floor, ``_memcpy_gather``, is in ``_copyout.pxi``);
- ``_handoff.pxi``: :class:`Handoff` and :class:`SharedWord`, the shared-memory ring
  counters of ``lazyframes.serve``.
"""

cimport cython
cimport numpy as cnp
from cpython.ref cimport Py_INCREF, PyObject
from cpython.unicode cimport PyUnicode_FromObject
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.pycapsule cimport PyCapsule_GetPointer
from numpy.random cimport bitgen_t
from libc.stdint cimport (
    INT32_MAX, INT64_MAX, int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t,
)
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy, memset

import math
import operator
import os
import weakref

import numpy as np

from lazyframes import _checks as C

cnp.import_array()
lf_codec_init()  # once per process: C-Blosc2's global state; every codec call uses a context

__all__ = [
    "FramePool", "FrameRef", "LazyFrames", "LazyBatch", "SlotTable", "stack", "default_pool",
    "encode_frames", "decode_frames", "KIND_KEY", "KIND_DELTA", "KIND_RAW", "KIND_PATCH",
    "KIND_XOR", "KIND_PACKED_BLOSC", "KIND_PACKED", "SumTree", "RowRing",
    "set_num_threads", "get_num_threads", "draw_integers", "check_outs", "check_apart",
    "Handoff", "SharedWord", "unscale_u8",
]

#: Kinds of blob in an :func:`encode_frames` container (``LF_KIND_*`` in C, codec.h): a
#: compressed frame (a keyframe), a compressed XOR delta against the previous frame (read
#: only: containers before 0.3), the frame's raw bytes, a patch, a compressed XOR delta
#: (read only: containers before packed patches), a Blosc2 chunk of a patch (read only:
#: packed patches before LZ4 blocks) or a packed patch (the LZ4 block of a patch) against a
#: frame of its group.
KIND_KEY, KIND_DELTA, KIND_RAW, KIND_PATCH, KIND_XOR, KIND_PACKED_BLOSC, KIND_PACKED = range(7)
#: A slot id a SlotTable cannot store.
_ID_OVER_INT32 = "a SlotTable stores slot ids as int32: this id is above 2**31 - 1"


cdef extern from "numpy/arrayobject.h":
    # (numpy's .pxd leaves it out: it steals a reference to descr)
    object PyArray_Empty(int nd, cnp.npy_intp *dims, cnp.dtype descr, int fortran)


cdef inline object _empty(int nd, cnp.npy_intp *dims, cnp.dtype descr):
    """A new C-contiguous array of ``dims`` and any dtype, without a Python-level call."""
    Py_INCREF(descr)  # the reference PyArray_Empty steals
    return PyArray_Empty(nd, dims, descr, 0)


cdef extern from "layout.h" nogil:
    ctypedef enum lf_layout:
        LF_LAST
        LF_FIRST
        LF_STACK
    enum:
        LF_NLAYOUTS
    void lf_layout_geometry(lf_layout layout, size_t n, size_t c, size_t *outer, size_t *inner)
    int lf_layout_obs_shape(lf_layout layout, const cnp.npy_intp *frame, int nd, cnp.npy_intp k,
                            cnp.npy_intp *obs)


cdef extern from "kernels.h" nogil:
    enum:
        LF_BOOL, LF_INT8, LF_UINT8, LF_INT16, LF_UINT16, LF_INT32, LF_UINT32
        LF_INT64, LF_UINT64, LF_FLOAT32, LF_FLOAT64, LF_NTYPES, LF_RAW, LF_DIVIDE
    int lf_copy_stacks(const unsigned char *const *src, size_t n_obs, size_t k,
                       size_t outer, size_t inner, int src_type, int dst_type,
                       size_t itemsize, double scale, int has_scale, void *dst)
    int lf_unscale_u8(const float *src, size_t n, float divisor, uint8_t *dst)
    void lf_convert_floor(const unsigned char *const *src, size_t m, size_t fb, float scale,
                          float *dst)


cdef extern from "parallel.h" nogil:
    enum:
        LF_PARALLEL_MAX
    ctypedef void (*lf_task_fn)(void *ctx, int task) noexcept nogil
    int lf_parallel_for(int n_tasks, lf_task_fn fn, void *ctx)
    void lf_parallel_set_threads(int n)
    int lf_parallel_threads()
    unsigned long long lf_parallel_tasks_run()
    unsigned long long lf_parallel_tasks_by_workers()


cdef extern from "codec.h" nogil:
    enum:
        LF_CODEC_LZ4, LF_CODEC_LZ4HC, LF_CODEC_ZSTD, LF_BLOB_OVERHEAD, LF_MAX_GROUP,
        LF_BLOB_DELTA
    ctypedef struct lf_codec:
        int codec
        int level
        int group
    void lf_codec_init()
    int lf_codec_valid(lf_codec c, size_t frame_bytes)
    void *lf_cctx_new(lf_codec c)
    void *lf_dctx_new()
    void lf_ctx_free(void *ctx)
    long lf_compress(void *cctx, const void *src, size_t n, void *dst)
    int lf_decompress(void *dctx, const void *blob, size_t blob_bytes, void *dst, size_t n)
    void lf_xor_of(unsigned char *out, const unsigned char *a, const unsigned char *b, size_t n)
    void lf_xor_into(unsigned char *out, const unsigned char *b, size_t n)
    ctypedef struct lf_coder:
        size_t n
    int lf_coder_init(lf_coder *c, lf_codec codec, size_t n)
    void lf_coder_free(lf_coder *c)
    long lf_coder_encode(lf_coder *c, const unsigned char *frame, const unsigned char *base,
                         const unsigned char **out, unsigned char *kind)
    long lf_coder_encode_key(lf_coder *c, const unsigned char *frame, const unsigned char *root,
                             const unsigned char **out, unsigned char *kind)
    const int64_t LF_TREE_KEY, LF_TREE_BAD
    ctypedef struct lf_tree:
        int64_t start
        unsigned pos
    int64_t lf_tree_step(lf_tree *t, int64_t i, int kind)
    int lf_kind_decode(void *dctx, int kind, const unsigned char *blob, size_t bn,
                       const unsigned char *base, unsigned char *out, size_t n,
                       unsigned char *delta)
    int lf_coder_container(lf_coder *c, const unsigned char *frames, size_t m, int group,
                           const unsigned char *keys, unsigned char *out, int64_t *offsets,
                           uint8_t *kinds)


cdef extern from "pool.h" nogil:
    enum:
        LF_ROOT_FRAMES
        LF_MAX_CHAIN
        LF_ALIAS_BACK
    ctypedef struct lf_pool:
        size_t frame_bytes
        size_t spc
        size_t n_alloc
        size_t live_frames
        size_t peak_bytes
        void *z
        size_t busy
        size_t cold_frames
        size_t cold_bytes
    ctypedef struct lf_reader:
        lf_pool *p
        size_t n
        int64_t bad
    int lf_pool_init(lf_pool *p, size_t frame_bytes, size_t chunk_bytes)
    void lf_pool_free(lf_pool *p)
    int64_t lf_pool_alloc(lf_pool *p)
    int lf_pool_is_live(const lf_pool *p, int64_t slot)
    int lf_pool_in_range(const lf_pool *p, int64_t slot)
    unsigned long long lf_pool_refcount(const lf_pool *p, int64_t slot)
    unsigned char *lf_pool_addr(const lf_pool *p, int64_t slot)
    void lf_prefetch(const void *p)
    void lf_pool_prefetch_ref(const lf_pool *p, int64_t slot)
    void lf_pool_incref(lf_pool *p, int64_t slot)
    void lf_pool_decref(lf_pool *p, int64_t slot)
    size_t lf_pool_bytes_held(const lf_pool *p)
    size_t lf_pool_slot_state_bytes(const lf_pool *p)
    int lf_pool_is_hot(const lf_pool *p, int64_t slot)
    int lf_pool_codec_blob(const lf_pool *p, int64_t slot)
    void lf_pool_incref_cold(lf_pool *p, int64_t slot)
    void lf_pool_decref_cold(lf_pool *p, int64_t slot)
    int32_t lf_pool_prev(const lf_pool *p, int64_t slot)
    void lf_pool_prefetch_prev(const lf_pool *p, int64_t slot)
    int lf_pool_set_prev(lf_pool *p, int64_t slot, int64_t prev)
    enum: LF_PREV_NONE, LF_PREV_UNSET
    int lf_pool_enable_compression(lf_pool *p, lf_codec c)
    lf_codec lf_pool_codec(const lf_pool *p)
    int lf_pool_compress_pending(lf_pool *p)
    size_t lf_pool_pending(const lf_pool *p)
    int lf_pool_read(lf_pool *p, int64_t slot, unsigned char *out)
    int lf_pool_chain(const lf_pool *p, int64_t slot, int64_t *chain)
    int lf_pool_adopt(lf_pool *p, const unsigned char *payload, const int64_t *offsets,
                      const uint8_t *kinds, size_t m, int64_t *slots, size_t *bad)
    void lf_reader_init(lf_reader *r, lf_pool *p)
    int lf_reader_expect(lf_reader *r, size_t n)
    void lf_reader_prefetch(const lf_pool *p, const int64_t *slots, size_t n, int levels)
    int64_t lf_reader_add(lf_reader *r, int64_t slot)
    int lf_reader_reserve(lf_reader *r)
    int lf_reader_decode_upto(lf_reader *r, void *dctx, size_t end)
    void lf_reader_place(lf_reader *r, int64_t i, unsigned char *addr)
    unsigned char *lf_reader_frame(const lf_reader *r, int64_t i)
    void lf_reader_release(lf_reader *r)


cdef enum:
    MAX_NDIM = 32  # axes of a frame

include "_checks.pxi"
include "_pool.pxi"
include "_copyout.pxi"
include "_lazy.pxi"
include "_table.pxi"
include "_pickle.pxi"
include "_codec.pxi"
include "_prio.pxi"
include "_ring.pxi"
include "_floors.pxi"
include "_handoff.pxi"
