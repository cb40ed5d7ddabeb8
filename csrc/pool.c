/* Plain-C refcounted frame pool of lazyframes (see pool.h). */
#include "pool.h"

#include <stdlib.h>
#include <string.h>

/* -- a min-heap of chunk ids ---------------------------------------------------- */
static void heap_push(size_t *h, size_t *n, size_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (h[parent] <= v) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = v;
}

static size_t heap_pop(size_t *h, size_t *n) {
    size_t top = h[0], last = h[--(*n)], i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (last <= h[c]) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

int lf_pool_init(lf_pool *p, size_t frame_bytes, size_t chunk_bytes) {
    memset(p, 0, sizeof(*p));
    if (frame_bytes == 0) return -1;
    p->frame_bytes = frame_bytes;
    size_t n = chunk_bytes / frame_bytes;
    if (n > ((size_t)1 << 31)) n = (size_t)1 << 31; /* offsets fit a uint32 */
    p->spc = 1;
    p->spc_shift = 0;
    while (p->spc * 2 <= n) {
        p->spc *= 2;
        p->spc_shift++;
    }
    return 0;
}

static void chunk_release(lf_chunk *c) {
    free(c->data);
    free(c->refcnt);
    free(c->free_stack);
    c->data = NULL;
    c->refcnt = NULL;
    c->free_stack = NULL;
    c->n_free = 0;
}

void lf_pool_free(lf_pool *p) {
    for (size_t i = 0; i < p->n_chunks; i++) chunk_release(&p->chunks[i]);
    free(p->chunks);
    free(p->heap);
    free(p->released);
    memset(p, 0, sizeof(*p));
}

/* Give chunk c its memory; 0 or -1 (nothing changed then). */
static int chunk_alloc(lf_pool *p, size_t c) {
    lf_chunk *ch = &p->chunks[c];
    /* frame_bytes * spc cannot overflow: spc <= chunk_bytes / frame_bytes, or 1 */
    ch->data = malloc(p->frame_bytes * p->spc);
    ch->refcnt = calloc(p->spc, sizeof(uint64_t));
    ch->free_stack = malloc(p->spc * sizeof(uint32_t));
    if (!ch->data || !ch->refcnt || !ch->free_stack) {
        chunk_release(ch);
        return -1;
    }
    for (size_t i = 0; i < p->spc; i++) ch->free_stack[i] = (uint32_t)(p->spc - 1 - i);
    ch->n_free = p->spc;
    ch->live = 0;
    p->n_alloc++;
    p->n_empty++;
    size_t held = lf_pool_bytes_held(p);
    if (held > p->peak_bytes) p->peak_bytes = held;
    return 0;
}

/* Make room for one more chunk id in the tables; 0 or -1. */
static int grow_tables(lf_pool *p) {
    if (p->n_chunks < p->cap_chunks) return 0;
    size_t cap = p->cap_chunks ? 2 * p->cap_chunks : 16;
    lf_chunk *chunks = realloc(p->chunks, cap * sizeof(lf_chunk));
    if (!chunks) return -1;
    p->chunks = chunks;
    size_t *heap = realloc(p->heap, cap * sizeof(size_t));
    if (!heap) return -1;
    p->heap = heap;
    size_t *rel = realloc(p->released, cap * sizeof(size_t));
    if (!rel) return -1;
    p->released = rel;
    p->cap_chunks = cap;
    return 0;
}

int64_t lf_pool_alloc(lf_pool *p) {
    size_t c;
    if (p->spc == 0) return -1; /* not initialised */
    while (p->n_heap) {
        c = p->heap[0];
        if (p->chunks[c].data && p->chunks[c].live < p->spc) break;
        heap_pop(p->heap, &p->n_heap);
        p->chunks[c].in_heap = 0;
    }
    if (p->n_heap) {
        c = p->heap[0];
    } else {
        if (p->n_released) {
            c = p->released[0];
            if (chunk_alloc(p, c)) return -1;
            heap_pop(p->released, &p->n_released);
        } else {
            if ((p->n_chunks + 1) > (size_t)(INT64_MAX / 2) / p->spc) return -1;
            if (grow_tables(p)) return -1;
            c = p->n_chunks;
            memset(&p->chunks[c], 0, sizeof(lf_chunk));
            if (chunk_alloc(p, c)) return -1;
            p->n_chunks++;
        }
        heap_push(p->heap, &p->n_heap, c);
        p->chunks[c].in_heap = 1;
    }
    lf_chunk *ch = &p->chunks[c];
    uint32_t off = ch->free_stack[--ch->n_free];
    if (ch->live == 0) p->n_empty--;
    ch->live++;
    if (ch->live == p->spc) {
        heap_pop(p->heap, &p->n_heap); /* c is the top */
        ch->in_heap = 0;
    }
    ch->refcnt[off] = 1;
    p->live_frames++;
    return (int64_t)(c * p->spc + off);
}

void lf_pool_free_slot(lf_pool *p, int64_t slot) {
    size_t c = (size_t)slot >> p->spc_shift, off = lf_pool_offset(p, slot);
    lf_chunk *ch = &p->chunks[c];
    ch->free_stack[ch->n_free++] = (uint32_t)off;
    ch->live--;
    p->live_frames--;
    if (!ch->in_heap) {
        heap_push(p->heap, &p->n_heap, c);
        ch->in_heap = 1;
    }
    if (ch->live == 0) {
        if (p->n_empty >= 1) {
            chunk_release(ch);
            p->n_alloc--;
            heap_push(p->released, &p->n_released, c);
        } else {
            p->n_empty++;
        }
    }
}

size_t lf_pool_bytes_held(const lf_pool *p) {
    return p->n_alloc * p->spc * p->frame_bytes;
}
