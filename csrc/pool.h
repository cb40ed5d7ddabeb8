/* Plain-C refcounted frame pool of lazyframes: a chunked arena of fixed-size slots.
 *
 * Slots live in chunks of `spc` slots that never move. Slot id = chunk * spc + offset.
 * Allocation takes the lowest chunk with a free slot (a min-heap) and, in it, the
 * most recently freed offset (a LIFO; a fresh chunk hands out offsets in increasing
 * order); a chunk whose slots all become free is returned to the OS,
 * except one empty chunk kept to avoid churn. This is the same policy as the NumPy
 * twin in lazyframes/_reference.py, so both hand out the same slot ids.
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
    uint32_t *refcnt;      /* spc refcounts */
    uint32_t *free_stack;  /* free offsets; top pops the lowest */
    size_t n_free;
    size_t live;
    int in_heap;
} lf_chunk;

typedef struct {
    size_t frame_bytes;
    size_t spc;            /* slots per chunk */
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

/* 1 if slot is in range and live, 0 otherwise. */
int lf_pool_is_live(const lf_pool *p, int64_t slot);
/* 1 if slot is in range (live or not). */
int lf_pool_in_range(const lf_pool *p, int64_t slot);
/* Refcount of an in-range slot (0 if free). */
uint32_t lf_pool_refcount(const lf_pool *p, int64_t slot);

/* Address of a live slot's bytes. The caller must have checked lf_pool_is_live. */
static inline unsigned char *lf_pool_addr(const lf_pool *p, int64_t slot) {
    size_t s = (size_t)slot;
    return p->chunks[s / p->spc].data + (s % p->spc) * p->frame_bytes;
}

/* Refcount +1 / -1 on a live slot (caller checked). decref frees the slot at 0. */
void lf_pool_incref(lf_pool *p, int64_t slot);
void lf_pool_decref(lf_pool *p, int64_t slot);

size_t lf_pool_bytes_held(const lf_pool *p);

#ifdef __cplusplus
}
#endif
#endif
