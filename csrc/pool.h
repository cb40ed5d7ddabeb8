/* Plain-C refcounted frame pool of lazyframes: a chunked arena of fixed-size slots.
 *
 * Slots live in chunks of `spc` slots that never move. Slot id = chunk * spc + offset;
 * spc is the largest power of two with spc * frame_bytes <= chunk_bytes (at least 1), so
 * that finding a slot is a shift and a mask, not a division.
 * Allocation takes the lowest chunk with a free slot (a min-heap) and, in it, the
 * most recently freed offset (a LIFO; a fresh chunk hands out offsets in increasing
 * order); a chunk whose slots all become free is returned to the OS, except one empty
 * chunk kept to avoid churn.
 * Refcounts are 64-bit: every reference is an 8-byte id held in some owner's memory, so
 * a count cannot reach 2**64 and needs no overflow check.
 * Not thread-safe: the Cython layer calls it with the GIL held.
 */
#ifndef LAZYFRAMES_POOL_H
#define LAZYFRAMES_POOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    unsigned char *data;   /* spc * frame_bytes, or NULL when released */
    uint64_t *refcnt;      /* spc refcounts: 64-bit, so they cannot wrap */
    uint32_t *free_stack;  /* free offsets; top pops the lowest */
    size_t n_free;
    size_t live;
    int in_heap;
} lf_chunk;

typedef struct {
    size_t frame_bytes;
    size_t spc;            /* slots per chunk: a power of two */
    unsigned spc_shift;    /* log2(spc): slot -> (chunk, offset) by shift and mask */
    lf_chunk *chunks;
    size_t n_chunks, cap_chunks;
    size_t *heap; size_t n_heap;          /* chunks with memory and a free slot */
    size_t *released; size_t n_released; /* min-heap of released chunk ids */
    size_t n_empty, n_alloc;
    size_t live_frames;
    size_t peak_bytes;
} lf_pool;

/* 0 on success, -1 on out of memory. */
int lf_pool_init(lf_pool *p, size_t frame_bytes, size_t chunk_bytes);
void lf_pool_free(lf_pool *p);

/* A new slot with refcount 1, or -1 on out of memory. Its bytes are uninitialised. */
int64_t lf_pool_alloc(lf_pool *p);

/* The hot accessors are inline: a slot is (chunk = slot >> spc_shift, offset = slot & (spc - 1)). */
static inline lf_chunk *lf_pool_chunk(const lf_pool *p, int64_t slot) {
    return &p->chunks[(size_t)slot >> p->spc_shift];
}
static inline size_t lf_pool_offset(const lf_pool *p, int64_t slot) {
    return (size_t)slot & (p->spc - 1);
}

/* 1 if slot is in range (live or not). */
static inline int lf_pool_in_range(const lf_pool *p, int64_t slot) {
    return slot >= 0 && ((uint64_t)slot >> p->spc_shift) < (uint64_t)p->n_chunks;
}

/* 1 if slot is in range and live, 0 otherwise. */
static inline int lf_pool_is_live(const lf_pool *p, int64_t slot) {
    if (!lf_pool_in_range(p, slot)) return 0;
    const lf_chunk *ch = lf_pool_chunk(p, slot);
    return ch->data != NULL && ch->refcnt[lf_pool_offset(p, slot)] > 0;
}

/* Refcount of an in-range slot (0 if free). */
static inline uint64_t lf_pool_refcount(const lf_pool *p, int64_t slot) {
    const lf_chunk *ch = lf_pool_chunk(p, slot);
    return ch->data ? ch->refcnt[lf_pool_offset(p, slot)] : 0;
}

/* Address of a live slot's bytes. The caller must have checked lf_pool_is_live. */
static inline unsigned char *lf_pool_addr(const lf_pool *p, int64_t slot) {
    return lf_pool_chunk(p, slot)->data + lf_pool_offset(p, slot) * p->frame_bytes;
}

/* Put a slot whose refcount reached 0 back on its chunk's free stack (pool.c). */
void lf_pool_free_slot(lf_pool *p, int64_t slot);

/* Refcount +1 / -1 on a live slot (caller checked). decref frees the slot at 0. */
static inline void lf_pool_incref(lf_pool *p, int64_t slot) {
    lf_pool_chunk(p, slot)->refcnt[lf_pool_offset(p, slot)]++;
}
static inline void lf_pool_decref(lf_pool *p, int64_t slot) {
    if (--lf_pool_chunk(p, slot)->refcnt[lf_pool_offset(p, slot)] == 0) lf_pool_free_slot(p, slot);
}

size_t lf_pool_bytes_held(const lf_pool *p);

#ifdef __cplusplus
}
#endif
#endif
