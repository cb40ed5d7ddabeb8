/* Plain-C refcounted frame pool of lazyframes (see pool.h). */
#include "pool.h"

#include <stdlib.h>
#include <string.h>

/* Small blobs are packed in slabs of LF_SLAB_BYTES, one after another: no allocator
 * header or rounding per blob (~16-24 B per frame with malloc), and lf_meta.at names the
 * slab and the offset. A slab is freed when its last blob is; a replay buffer frees its
 * frames about in the order it stored them, so few slabs stay partly dead. */
#define LF_SLAB_BYTES ((size_t)1 << LF_SLAB_SHIFT)
#define LF_SLAB_MAX_BLOB (LF_SLAB_BYTES / 8) /* larger blobs get their own malloc */
#define LF_SLABS_MAX (LF_AT_NONE >> LF_SLAB_SHIFT) /* slab numbers that fit lf_meta.at */

typedef struct {
    size_t used;              /* bytes handed out (from the start) of p->slab[i] */
    size_t live;              /* blobs not freed yet */
} lf_slab;

/* The compression state of a pool (pool.h). Contexts and buffers are the pool's own:
 * compression runs with the GIL held, one pool at a time. */
struct lf_compressor {
    lf_codec codec;
    lf_coder coder;           /* its blob buffer is also the chunk of lf_pool_decode
                               * (a blob made whole + a delta) */
    void *dctx;
    unsigned char *base;      /* frame_bytes: a decoded reference */
    int64_t *queue;           /* pending slots, in the order they became eligible */
    size_t n_queue, cap_queue;
    unsigned char *spare;     /* a reader's scratch kept for the next reader (page faults) */
    size_t spare_bytes;
    lf_slab *slabs;           /* blobs packed in slabs (below); p->slab[i] NULL: a free entry */
    size_t n_slabs, cap_slabs, cur; /* cur: the slab new blobs go to (n_slabs: none) */
    uint32_t *own_free;       /* the free entries of p->own, a stack */
    size_t n_own, n_own_free, cap_own; /* entries used so far, free among them, room */
    size_t slab_slack;        /* bytes of live slabs not in a live blob's payload */
    int64_t root;             /* the slot keyframes are coded against (pool.h), or -1; a
                               * weak reference: checked (root_ok) before each use */
    size_t root_keys;         /* keyframes since the root was made, itself included */
    int64_t warm_slot[LF_WARM];        /* -1: empty */
    unsigned char *warm_buf[LF_WARM];  /* raw bytes of a recently compressed frame */
    size_t warm_next, n_warm;
};

/* Bytes of one chunk entry: a frame, or an lf_meta when compressing. */
static size_t slot_bytes(const lf_pool *p) {
    return p->z ? sizeof(lf_meta) : p->frame_bytes;
}

static void note_peak(lf_pool *p) {
    size_t held = lf_pool_bytes_held(p);
    if (held > p->peak_bytes) p->peak_bytes = held;
}

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
    if (n > (size_t)LF_END) n = LF_END; /* offsets fit a free word's link */
    p->spc = 1;
    p->spc_shift = 0;
    while (p->spc * 2 <= n) {
        p->spc *= 2;
        p->spc_shift++;
    }
    return 0;
}

_Static_assert(sizeof(lf_meta) == 12, "lf_meta is 12 bytes");

static void compressor_free(lf_compressor *z);

/* -- the table of buffers not in a slab (lf_pool.own) ----------------------------------- */

/* 1 if a live slot's lf_meta m names an entry of p->own. */
static int has_own(const lf_meta *m) {
    return !(m->cold_state && (m->blob_flags & LF_BLOB_SLAB)) && m->at != LF_AT_NONE;
}

/* What a slot's buffer not in a slab was allocated as: a hot frame's or a root's buffer,
 * or a blob, whose size precedes it if it is LF_BLOB_MAX bytes or more (blob_alloc). */
static void *own_alloc(const lf_pool *p, const lf_meta *m) {
    unsigned char *buf = p->own[m->at];
    return m->cold_state && lf_meta_big(m) ? buf - sizeof(size_t) : buf;
}

/* Renumber the entries of p->own in a table of about twice their number, when at most an
 * eighth of a large one is used (after a burst of hot frames, e.g. a pool made to
 * compress while it held many): the table would otherwise keep its largest size. Every
 * lf_meta is rewritten; nothing else holds an entry's number. Left as it is on out of
 * memory. */
static void own_compact(lf_pool *p) {
    lf_compressor *z = p->z;
    size_t used = z->n_own - z->n_own_free, cap = 64;
    while (cap < 2 * used) cap *= 2;
    unsigned char **own = malloc(cap * sizeof(*own));
    uint32_t *fr = malloc(cap * sizeof(*fr));
    if (!own || !fr) {
        free(own);
        free(fr);
        return;
    }
    uint32_t n = 0;
    for (size_t c = 0; c < p->n_chunks; c++) {
        lf_chunk *ch = &p->chunks[c];
        for (size_t j = 0; ch->data && j < p->spc; j++) {
            lf_meta *m = (lf_meta *)ch->data + j;
            if (!lf_word_live(ch->ref[j]) || !has_own(m)) continue;
            own[n] = p->own[m->at];
            m->at = n++;
        }
    }
    free(p->own);
    free(z->own_free);
    p->own = own;
    z->own_free = fr;
    z->cap_own = cap;
    z->n_own = n;
    z->n_own_free = 0;
}

/* own_compact when the table is large and at most an eighth of it is used. Called where
 * every live slot's lf_meta names its buffer. */
#define LF_OWN_TRIM 1024
static void own_trim(lf_pool *p) {
    lf_compressor *z = p->z;
    if (z->cap_own >= LF_OWN_TRIM && 8 * (z->n_own - z->n_own_free) <= z->cap_own) own_compact(p);
}

/* Enter buf in p->own: its number in *at. 0, or -1 on out of memory. Entries of other
 * slots may be renumbered (own_trim): a caller reads them after. */
static int own_put(lf_pool *p, unsigned char *buf, uint32_t *at) {
    lf_compressor *z = p->z;
    own_trim(p);
    if (!z->n_own_free && z->n_own == z->cap_own) {
        if (z->cap_own > LF_AT_NONE / 2) return -1; /* numbers up to LF_AT_NONE - 1 */
        size_t cap = z->cap_own ? 2 * z->cap_own : 64;
        unsigned char **own = realloc(p->own, cap * sizeof(*own));
        if (!own) return -1;
        p->own = own;
        uint32_t *fr = realloc(z->own_free, cap * sizeof(*fr));
        if (!fr) return -1; /* p->own is larger than it says: harmless */
        z->own_free = fr;
        z->cap_own = cap;
    }
    *at = z->n_own_free ? z->own_free[--z->n_own_free] : (uint32_t)z->n_own++;
    p->own[*at] = buf;
    return 0;
}

/* Free entry `at` of p->own (not its buffer). */
static void own_drop(lf_pool *p, uint32_t at) {
    p->own[at] = NULL;
    p->z->own_free[p->z->n_own_free++] = at;
}

static void chunk_release(lf_pool *p, lf_chunk *c) {
    free(c->data);
    free(c->ref);
    free(c->link);
    free(c->far);
    p->far_bytes -= c->cap_far * sizeof(int32_t);
    c->data = NULL;
    c->ref = NULL;
    c->link = NULL;
    c->far = NULL;
    c->n_far = c->cap_far = 0;
    c->far_free = -1;
}

void lf_pool_free(lf_pool *p) {
    for (size_t i = 0; i < p->n_chunks; i++) {
        lf_chunk *ch = &p->chunks[i];
        if (p->z && ch->data)
            for (size_t j = 0; j < p->spc; j++)
                if (lf_word_live(ch->ref[j]) && has_own((lf_meta *)ch->data + j))
                    free(own_alloc(p, (lf_meta *)ch->data + j));
        chunk_release(p, ch);
    }
    for (size_t i = 0; p->z && i < p->z->n_slabs; i++) free(p->slab[i]);
    free(p->slab);
    free(p->own);
    compressor_free(p->z);
    free(p->chunks);
    free(p->heap);
    free(p->released);
    free(p->big);
    memset(p, 0, sizeof(*p));
}

/* Give chunk c its memory; 0 or -1 (nothing changed then). */
static int chunk_alloc(lf_pool *p, size_t c) {
    lf_chunk *ch = &p->chunks[c];
    /* frame_bytes * spc cannot overflow: spc <= chunk_bytes / frame_bytes, or 1 */
    ch->data = malloc(slot_bytes(p) * p->spc);
    ch->ref = malloc(p->spc * sizeof(lf_word));
    ch->link = malloc(p->spc * sizeof(lf_link));
    ch->far = NULL;
    ch->n_far = ch->cap_far = 0;
    ch->far_free = -1;
    if (!ch->data || !ch->ref || !ch->link) {
        chunk_release(p, ch);
        return -1;
    }
    /* every slot free, listed in increasing order */
    for (size_t i = 0; i < p->spc; i++)
        ch->ref[i] = (lf_word)(LF_FREE | (i + 1 < p->spc ? i + 1 : LF_END));
    ch->free_head = 0;
    ch->live = 0;
    p->n_alloc++;
    p->n_empty++;
    note_peak(p);
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

/* A new slot with refcount 1 whose lf_meta (in a compressing pool) says its buffer is
 * at `at`, or -1. */
static int64_t take_slot(lf_pool *p, uint32_t at) {
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
    uint32_t off = ch->free_head; /* live < spc: a free slot is listed */
    ch->free_head = ch->ref[off] & ~LF_FREE;
    if (ch->live == 0) p->n_empty--;
    ch->live++;
    if (ch->live == p->spc) {
        heap_pop(p->heap, &p->n_heap); /* c is the top */
        ch->in_heap = 0;
    }
    ch->ref[off] = 1;
    ch->link[off] = LF_LINK_UNSET;
    p->live_frames++;
    if (p->z) {
        lf_meta *m = (lf_meta *)ch->data + off;
        memset(m, 0, sizeof(*m)); /* hot, no cold reference yet */
        m->at = at;
        note_peak(p);
    }
    return (int64_t)(c * p->spc + off);
}

/* -- far links (pool.h, "Previous frames") ------------------------------------------ */

int lf_pool_set_far(lf_pool *p, int64_t slot, int32_t prev) {
    lf_chunk *ch = lf_pool_chunk(p, slot);
    uint32_t e;
    if (ch->far_free >= 0) {
        e = (uint32_t)ch->far_free;
        ch->far_free = ch->far[e];
    } else {
        if (ch->n_far == ch->cap_far) { /* n_far < spc: each live far link has its entry */
            uint32_t cap = ch->cap_far ? 2 * ch->cap_far : 16;
            if (cap > p->spc) cap = (uint32_t)p->spc;
            int32_t *grown = realloc(ch->far, cap * sizeof(int32_t));
            if (!grown) return -1;
            p->far_bytes += (cap - ch->cap_far) * sizeof(int32_t);
            ch->far = grown;
            ch->cap_far = cap;
            if (p->z) note_peak(p); /* counted in bytes_held */
        }
        e = ch->n_far++;
    }
    ch->far[e] = prev;
    ch->link[lf_pool_offset(p, slot)] = (lf_link)(LF_LINK_FAR | e);
    return 0;
}

/* -- the list of large counts (pool.h): few entries, each a frame shared 32,766 times -- */

static lf_big *big_find(const lf_pool *p, int64_t slot) {
    for (size_t i = 0; i < p->n_big; i++)
        if (p->big[i].slot == slot) return &p->big[i];
    return NULL;
}

uint64_t lf_pool_big_more(const lf_pool *p, int64_t slot) {
    const lf_big *b = big_find(p, slot);
    return b ? b->more : 0;
}

void lf_pool_big_incref(lf_pool *p, int64_t slot) {
    lf_big *b = big_find(p, slot);
    if (b) {
        if (b->more < UINT64_MAX - LF_REF_MAX) b->more++;
        return;
    }
    if (p->n_big == p->cap_big) {
        size_t cap = p->cap_big ? 2 * p->cap_big : 8;
        lf_big *grown = realloc(p->big, cap * sizeof(lf_big));
        if (!grown) { /* the count is lost: the frame is never freed */
            lf_pool_chunk(p, slot)->ref[lf_pool_offset(p, slot)] = LF_REF_STUCK;
            return;
        }
        p->big = grown;
        p->cap_big = cap;
    }
    p->big[p->n_big++] = (lf_big){slot, 1};
}

int lf_pool_big_decref(lf_pool *p, int64_t slot) {
    lf_big *b = big_find(p, slot);
    if (!b) return 0;
    if (--b->more == 0) *b = p->big[--p->n_big];
    return 1;
}

int64_t lf_pool_alloc(lf_pool *p) {
    unsigned char *buf = NULL;
    uint32_t at = LF_AT_NONE;
    if (p->z && (!(buf = malloc(p->frame_bytes)) || own_put(p, buf, &at))) {
        free(buf);
        return -1;
    }
    int64_t slot = take_slot(p, at);
    if (slot < 0 && buf) {
        own_drop(p, at);
        free(buf);
    }
    return slot;
}

static void warm_forget(lf_compressor *z, int64_t slot);
static void blob_free(lf_pool *p, const lf_meta *m);

void lf_pool_free_slot(lf_pool *p, int64_t slot) {
    size_t c = (size_t)slot >> p->spc_shift, off = lf_pool_offset(p, slot);
    lf_chunk *ch = &p->chunks[c];
    int64_t ref = -1;
    if (p->z) { /* before the chunk can be released: its data holds the lf_meta */
        lf_meta *m = (lf_meta *)ch->data + off;
        if (m->cold_state) {
            p->cold_frames--;
            p->cold_bytes -= lf_meta_blob_bytes(p, m);
            ref = m->ref;
            warm_forget(p->z, slot);
            blob_free(p, m);
        } else if (m->at != LF_AT_NONE) {
            free(p->own[m->at]);
            own_drop(p, m->at);
        }
        memset(m, 0, sizeof(*m));
    }
    if (ch->link[off] & LF_LINK_FAR) { /* its far link's entry goes on the free list */
        uint32_t e = ch->link[off] & ~LF_LINK_FAR;
        ch->far[e] = ch->far_free;
        ch->far_free = (int32_t)e;
    }
    ch->ref[off] = (lf_word)(LF_FREE | ch->free_head);
    ch->free_head = (uint32_t)off;
    ch->live--;
    p->live_frames--;
    if (!ch->in_heap) {
        heap_push(p->heap, &p->n_heap, c);
        ch->in_heap = 1;
    }
    if (ch->live == 0) {
        ch->n_far = 0; /* every entry free */
        ch->far_free = -1;
        if (p->n_empty >= 1) {
            chunk_release(p, ch);
            p->n_alloc--;
            heap_push(p->released, &p->n_released, c);
        } else {
            p->n_empty++;
        }
    }
    if (p->z) own_trim(p);
    if (ref >= 0) lf_pool_decref_cold(p, ref); /* a chain is at most LF_MAX_CHAIN deep */
}

size_t lf_pool_slot_state_bytes(const lf_pool *p) {
    /* a compressing pool counts all its per-slot state: lf_meta, refcount and link words,
     * and the chunks' tables of far links */
    return p->z ? p->n_alloc * p->spc * (sizeof(lf_meta) + sizeof(lf_word) + sizeof(lf_link)) +
                      p->far_bytes
                : 0;
}

size_t lf_pool_bytes_held(const lf_pool *p) {
    if (!p->z) return p->n_alloc * p->spc * slot_bytes(p);
    const lf_compressor *z = p->z;
    return lf_pool_slot_state_bytes(p) +
           (p->live_frames - p->cold_frames + z->n_warm) * p->frame_bytes + p->cold_bytes +
           z->slab_slack + z->spare_bytes + z->cap_own * (sizeof(void *) + sizeof(uint32_t)) +
           z->cap_slabs * (sizeof(void *) + sizeof(lf_slab)) + p->cap_big * sizeof(lf_big);
}

/* -- compression ------------------------------------------------------------------------ */

static void compressor_free(lf_compressor *z) {
    if (!z) return;
    lf_coder_free(&z->coder);
    lf_ctx_free(z->dctx);
    for (size_t i = 0; i < LF_WARM; i++) free(z->warm_buf[i]);
    free(z->slabs);
    free(z->own_free);
    free(z->base);
    free(z->spare);
    free(z->queue);
    free(z);
}

static lf_compressor *compressor_new(size_t fb, lf_codec c) {
    lf_compressor *z = calloc(1, sizeof(*z));
    if (!z) return NULL;
    z->codec = c;
    z->root = -1;
    for (size_t i = 0; i < LF_WARM; i++) z->warm_slot[i] = -1;
    int ok = lf_coder_init(&z->coder, c, fb) == 0;
    z->dctx = lf_dctx_new();
    z->base = malloc(fb);
    if (!ok || !z->dctx || !z->base) {
        compressor_free(z);
        return NULL;
    }
    return z;
}

int lf_pool_enable_compression(lf_pool *p, lf_codec c) {
    if (!lf_codec_valid(c, p->frame_bytes)) return -2;
    if (p->busy && !p->z) return -4;
    if (p->z) {
        lf_codec o = p->z->codec;
        return o.codec == c.codec && o.level == c.level && o.group == c.group ? 0 : -3;
    }
    lf_compressor *z = compressor_new(p->frame_bytes, c);
    if (!z) return -1;
    /* every chunk with memory gets an lf_meta array, every live frame its own buffer,
     * entered in the table of buffers: all allocated first, so that nothing changes on
     * failure */
    size_t cap = 64;
    while (cap < p->live_frames) cap *= 2;
    lf_meta **metas = calloc(p->n_chunks ? p->n_chunks : 1, sizeof(lf_meta *));
    unsigned char **own = calloc(cap, sizeof(*own));
    z->own_free = malloc(cap * sizeof(uint32_t));
    z->cap_own = cap;
    int ok = metas && own && z->own_free && p->live_frames < LF_AT_NONE;
    for (size_t i = 0; ok && i < p->n_chunks; i++) {
        lf_chunk *ch = &p->chunks[i];
        if (!ch->data) continue;
        metas[i] = calloc(p->spc, sizeof(lf_meta));
        ok = metas[i] != NULL;
        for (size_t j = 0; ok && j < p->spc; j++) {
            if (!lf_word_live(ch->ref[j])) continue;
            lf_meta *m = &metas[i][j];
            m->at = (uint32_t)z->n_own++;
            ok = (own[m->at] = malloc(p->frame_bytes)) != NULL;
            if (ok) memcpy(own[m->at], ch->data + j * p->frame_bytes, p->frame_bytes);
        }
    }
    for (size_t i = 0; i < p->n_chunks && metas; i++) {
        lf_chunk *ch = &p->chunks[i];
        if (!metas[i]) continue;
        if (ok) {
            free(ch->data);
            ch->data = (unsigned char *)metas[i];
        } else {
            free(metas[i]);
        }
    }
    free(metas);
    if (!ok) {
        for (size_t i = 0; own && i < z->n_own; i++) free(own[i]);
        free(own);
        compressor_free(z);
        return -1;
    }
    p->own = own;
    p->z = z;
    note_peak(p);
    return 0;
}

lf_codec lf_pool_codec(const lf_pool *p) {
    return p->z->codec;
}

size_t lf_pool_pending(const lf_pool *p) {
    return p->z ? p->z->n_queue : 0;
}

void lf_pool_queue(lf_pool *p, int64_t slot) {
    lf_compressor *z = p->z;
    if (z->n_queue == z->cap_queue) {
        size_t cap = z->cap_queue ? 2 * z->cap_queue : 64;
        int64_t *q = realloc(z->queue, cap * sizeof(int64_t));
        if (!q) return; /* out of memory: the frame stays hot */
        z->queue = q;
        z->cap_queue = cap;
    }
    z->queue[z->n_queue++] = slot;
    lf_pool_meta(p, slot)->queued = 1;
}

/* -- blobs ----------------------------------------------------------------------------- */

/* A blob of n bytes with its own malloc (its size before it if it is LF_BLOB_MAX bytes or
 * more: lf_meta_blob_bytes), entered in p->own; NULL on out of memory. */
static unsigned char *own_blob(lf_pool *p, size_t n, uint32_t *at) {
    size_t head = n >= LF_BLOB_MAX ? sizeof(size_t) : 0;
    unsigned char *mem = malloc(head + (n ? n : 1));
    if (!mem) return NULL;
    if (head) memcpy(mem, &n, sizeof(n));
    if (own_put(p, mem + head, at)) {
        free(mem);
        return NULL;
    }
    return mem + head;
}

/* Make slab z->cur one with room for n more bytes at an offset that fits lf_meta.at;
 * 0, or -1 on out of memory or when every slab number is taken. */
static int slab_room(lf_pool *p, size_t n) {
    lf_compressor *z = p->z;
    if (z->cur < z->n_slabs && z->slabs[z->cur].live == 0)
        z->slabs[z->cur].used = 0; /* every blob of the current slab was freed: reuse it */
    if (z->cur < z->n_slabs && z->slabs[z->cur].used + n <= LF_SLAB_BYTES &&
        z->slabs[z->cur].used < LF_SLAB_BYTES)
        return 0;
    size_t c = z->n_slabs; /* a free entry, else a new one */
    for (size_t i = 0; i < z->n_slabs; i++)
        if (!p->slab[i]) {
            c = i;
            break;
        }
    if (c == LF_SLABS_MAX) return -1;
    if (c == z->n_slabs && z->n_slabs == z->cap_slabs) {
        size_t cap = z->cap_slabs ? 2 * z->cap_slabs : 16;
        lf_slab *grown = realloc(z->slabs, cap * sizeof(lf_slab));
        if (!grown) return -1;
        z->slabs = grown;
        unsigned char **mems = realloc(p->slab, cap * sizeof(*mems));
        if (!mems) return -1; /* z->slabs is larger than it says: harmless */
        p->slab = mems;
        z->cap_slabs = cap;
    }
    unsigned char *mem = malloc(LF_SLAB_BYTES);
    if (!mem) return -1;
    if (c == z->n_slabs) z->n_slabs++;
    /* the old current slab's unused tail stays slack until it is freed */
    p->slab[c] = mem;
    z->slabs[c] = (lf_slab){0, 0};
    z->slab_slack += LF_SLAB_BYTES;
    z->cur = c;
    return 0;
}

/* Room for a blob of n bytes, where lf_meta.at says (*at) with the flags *flags: in a slab,
 * or its own malloc when it is large or no slab can be had. NULL on out of memory. Entries
 * of p->own may be renumbered: a caller reads another slot's buffer after. */
static unsigned char *blob_alloc(lf_pool *p, size_t n, uint8_t *flags, uint32_t *at) {
    lf_compressor *z = p->z;
    *flags = 0;
    if (n > LF_SLAB_MAX_BLOB || slab_room(p, n)) return own_blob(p, n, at);
    lf_slab *sl = &z->slabs[z->cur];
    *at = (uint32_t)(z->cur << LF_SLAB_SHIFT | sl->used);
    unsigned char *mem = p->slab[z->cur] + sl->used;
    sl->used += n;
    sl->live++;
    z->slab_slack -= n;
    *flags = LF_BLOB_SLAB;
    return mem;
}

/* Free the blob of a cold slot. */
static void blob_free(lf_pool *p, const lf_meta *m) {
    lf_compressor *z = p->z;
    if (!(m->blob_flags & LF_BLOB_SLAB)) {
        free(own_alloc(p, m));
        own_drop(p, m->at);
        return;
    }
    uint32_t idx = m->at >> LF_SLAB_SHIFT;
    lf_slab *sl = &z->slabs[idx];
    z->slab_slack += m->blob_bytes;
    if (--sl->live == 0 && idx != z->cur) {
        free(p->slab[idx]);
        p->slab[idx] = NULL;
        z->slab_slack -= LF_SLAB_BYTES;
    }
}

/* -- the warm cache: raw bytes of the last LF_WARM frames compressed, by slot ----------- */

static unsigned char *warm_get(const lf_compressor *z, int64_t slot) {
    for (size_t i = 0; i < LF_WARM; i++)
        if (z->warm_slot[i] == slot) return z->warm_buf[i];
    return NULL;
}

static void warm_forget(lf_compressor *z, int64_t slot) {
    for (size_t i = 0; i < LF_WARM; i++) {
        if (z->warm_slot[i] == slot) {
            free(z->warm_buf[i]);
            z->warm_buf[i] = NULL;
            z->warm_slot[i] = -1;
            z->n_warm--;
        }
    }
}

/* Keep buf (a frame_bytes malloc) as the raw bytes of slot, dropping the oldest entry. */
static void warm_put(lf_compressor *z, int64_t slot, unsigned char *buf) {
    size_t i = z->warm_next;
    z->warm_next = (i + 1) % LF_WARM;
    if (z->warm_buf[i]) {
        free(z->warm_buf[i]);
        z->n_warm--;
    }
    z->warm_slot[i] = slot;
    z->warm_buf[i] = buf;
    z->n_warm++;
}

/* -- coding ----------------------------------------------------------------------------- */

int lf_pool_chain(const lf_pool *p, int64_t slot, int64_t *chain) {
    int n = 0;
    for (;;) {
        chain[n++] = slot;
        slot = lf_pool_meta(p, slot)->ref;
        if (slot < 0 || n == LF_MAX_CHAIN) return n;
    }
}

/* The container kind (codec.h) of a cold slot's blob flags. */
static int blob_kind(uint8_t flags) {
    return flags & LF_BLOB_RAW ? LF_KIND_RAW : lf_coded_kind(flags);
}

int lf_blob_decode(const lf_pool *p, void *dctx, lf_blob b, const unsigned char *base,
                   unsigned char *out, unsigned char *chunk) {
    const unsigned char *blob = b.buf;
    size_t n = b.bytes, fb = p->frame_bytes;
    if (b.flags & LF_BLOB_LEAN) {
        n = lf_unlean(&p->z->coder.header, blob, n, chunk);
        blob = chunk;
    }
    /* an XOR delta lands after the whole blob (in cache), then one pass applies it */
    return lf_kind_decode(dctx, blob_kind(b.flags), blob, n, base, out, fb,
                          chunk + fb + LF_BLOB_OVERHEAD);
}

int lf_pool_decode(const lf_pool *p, void *dctx, int64_t slot, unsigned char *out) {
    int64_t chain[LF_MAX_CHAIN];
    int n = lf_pool_chain(p, slot, chain);
    if (lf_pool_meta(p, chain[n - 1])->ref >= 0) return -1; /* cut short: cannot happen */
    for (int i = n - 1; i >= 0; i--) /* the keyframe, then each patch in place */
        if (lf_blob_decode(p, dctx, lf_pool_blob(p, chain[i]), i == n - 1 ? NULL : out, out,
                           p->z->coder.blob))
            return -1;
    return 0;
}

/* 1 if a live slot is hot and every reference left on it is cold (a count stuck at
 * LF_COLD_MAX no longer says how many references are left: never). */
static int eligible(const lf_pool *p, int64_t slot) {
    const lf_meta *m = lf_pool_meta(p, slot);
    return !m->cold_state && m->cold > 0 && m->cold < LF_COLD_MAX &&
           m->cold == lf_pool_refcount(p, slot);
}

/* An alias (compress_one) is an empty patch at its reference's position: it decodes as
 * its reference does, which is what a frame referring to it refers to instead, so that a
 * run of equal frames adds one blob to a chain, not one each. */
static int64_t unaliased(const lf_pool *p, int64_t slot) {
    const lf_meta *m = lf_pool_meta(p, slot);
    return (m->blob_flags & LF_BLOB_DELTA) == LF_BLOB_PATCH && m->blob_bytes == 0 && m->ref >= 0 &&
                   lf_pool_meta(p, m->ref)->pos == m->pos
               ? m->ref
               : slot;
}

/* 1 if the pool's root is still one (a weak reference: its slot may have been freed, and
 * reused by a frame that is no root). */
static int root_ok(const lf_pool *p) {
    int64_t r = p->z->root;
    return r >= 0 && lf_pool_is_live(p, r) && lf_pool_meta(p, r)->cold_state &&
           (lf_pool_meta(p, r)->blob_flags & LF_BLOB_RAW);
}

/* Make the hot slot m (of `slot`) the pool's root: its buffer becomes its blob. */
static void make_root(lf_pool *p, int64_t slot, lf_meta *m) {
    m->blob_flags = LF_BLOB_RAW;
    m->pos = 0;
    m->ref = -1;
    m->blob_bytes = 0; /* lf_meta_blob_bytes: the frame's */
    m->cold_state = 1;
    p->cold_frames++;
    p->cold_bytes += p->frame_bytes;
    p->z->root = slot;
    p->z->root_keys = 1; /* itself the first keyframe of its LF_ROOT_FRAMES */
}

/* A keyframe of `frame`: the codec's blob, or, in a pool with a root, the delta against
 * the root unless the codec's blob is LF_CODEC_SAVES bytes smaller (*ref then the root). */
static long code_keyframe(lf_pool *p, const unsigned char *frame, const unsigned char **out,
                          unsigned char *kind, int64_t *ref) {
    lf_compressor *z = p->z;
    if (z->codec.group == 1) return lf_coder_encode(&z->coder, frame, NULL, out, kind);
    z->root_keys++;
    long r = lf_coder_encode_key(&z->coder, frame, lf_meta_buf(p, lf_pool_meta(p, z->root)),
                                 out, kind);
    if (r >= 0 && (*kind & LF_BLOB_DELTA)) *ref = z->root;
    return r;
}

/* The raw bytes of a cold slot if they are at hand (a root, or in the warm cache), or NULL. */
static const unsigned char *raw_at_hand(const lf_pool *p, int64_t slot) {
    const lf_meta *m = lf_pool_meta(p, slot);
    return m->blob_flags & LF_BLOB_RAW ? lf_meta_buf(p, m) : warm_get(p->z, slot);
}

/* The first of the LF_ALIAS_BACK frames before a frame along its previous-frame links,
 * from `prev`, that is cold, has its bytes at hand and equals `frame`; or -1. */
static int64_t equal_earlier(const lf_pool *p, int64_t prev, const unsigned char *frame) {
    for (int d = 0; d < LF_ALIAS_BACK && prev >= 0 && lf_pool_is_live(p, prev) &&
                    lf_pool_meta(p, prev)->cold_state;
         d++, prev = lf_pool_prev(p, prev)) {
        const unsigned char *raw = raw_at_hand(p, prev);
        if (raw && memcmp(raw, frame, p->frame_bytes) == 0) return prev;
    }
    return -1;
}

/* Compress one eligible slot. A frame equal to one of the few frames before it (cold,
 * their bytes at hand: a static screen, or flicker) is an empty patch against it, at its
 * position: an alias, which decodes with one more copy. Otherwise a delta (a patch, or
 * a packed patch) against its recorded previous frame when that is cold and its group has
 * room, else a keyframe: the pool's next root, or code_keyframe's (pool.h, "Roots"). 0,
 * or -1 on out of memory. */
static int compress_one(lf_pool *p, int64_t slot) {
    lf_compressor *z = p->z;
    lf_meta *m = lf_pool_meta(p, slot);
    int64_t ref = -1, prev = lf_pool_prev(p, slot);
    unsigned pos = 0;
    if (prev >= 0 && lf_pool_is_live(p, prev) && lf_pool_meta(p, prev)->cold_state &&
        z->codec.group > 1) { /* (group 1: every frame its own keyframe, no alias) */
        int64_t same = equal_earlier(p, prev, lf_meta_buf(p, m));
        if (same >= 0) {
            pos = lf_pool_meta(p, same)->pos;
            ref = unaliased(p, same);
        } else if (lf_pool_meta(p, prev)->pos + 1 < z->codec.group) {
            pos = lf_pool_meta(p, prev)->pos + 1u;
            ref = unaliased(p, prev);
        }
    }
    const unsigned char *out;
    unsigned char kind;
    long coded;
    if (ref >= 0) {
        const unsigned char *base = raw_at_hand(p, ref);
        if (!base) {
            if (lf_pool_decode(p, z->dctx, ref, z->base)) return -1;
            base = z->base;
        }
        coded = lf_coder_encode(&z->coder, lf_meta_buf(p, m), base, &out, &kind);
    } else if (z->codec.group > 1 &&
               (!root_ok(p) || z->root_keys >= LF_ROOT_FRAMES / (size_t)z->codec.group)) {
        make_root(p, slot, m);
        return 0;
    } else {
        pos = 0; /* a keyframe, also when a delta's reference was not found */
        coded = code_keyframe(p, lf_meta_buf(p, m), &out, &kind, &ref);
    }
    if (coded < 0) return -1;
    size_t n = (size_t)coded;
    if (!(kind & LF_BLOB_DELTA)) { /* a keyframe */
        ref = -1;
        pos = 0;
    }
    uint8_t flags;
    uint32_t at;
    unsigned char *blob = blob_alloc(p, n, &flags, &at);
    if (!blob) return -1;
    memcpy(blob, out, n);
    m->blob_flags = (uint8_t)(flags | kind);
    if (ref >= 0) lf_pool_incref_cold(p, ref); /* cold: never queued again */
    m->pos = (uint8_t)pos;
    m->ref = (int32_t)ref;
    warm_put(z, slot, p->own[m->at]); /* its hot buffer, read after blob_alloc */
    own_drop(p, m->at);
    m->at = at;
    lf_meta_set_blob_bytes(m, n);
    m->cold_state = 1;
    p->cold_frames++;
    p->cold_bytes += n;
    return 0;
}

int lf_pool_compress_pending(lf_pool *p) {
    lf_compressor *z = p->z;
    if (!z) return 0;
    size_t i;
    for (i = 0; i < z->n_queue; i++) {
        int64_t slot = z->queue[i], back[LF_MAX_GROUP];
        if (!lf_pool_is_live(p, slot)) continue;
        if (lf_pool_meta(p, slot)->cold_state) continue; /* compressed as a predecessor */
        lf_pool_meta(p, slot)->queued = 0;
        if (!eligible(p, slot)) continue;
        /* its eligible predecessors first, oldest first: deltas whatever the queue order */
        int n = 0;
        int64_t s = lf_pool_prev(p, slot);
        while (n < z->codec.group - 1 && s >= 0 && lf_pool_is_live(p, s) && eligible(p, s)) {
            back[n++] = s;
            s = lf_pool_prev(p, s);
        }
        while (n > 0) { /* prev links may loop (a part [a, b, a]): check each again */
            s = back[--n];
            if (eligible(p, s) && compress_one(p, s)) goto oom;
        }
        if (eligible(p, slot) && compress_one(p, slot)) goto oom;
    }
    z->n_queue = 0;
    return 0;
oom: /* keep the rest queued, from this slot on */
    lf_pool_meta(p, z->queue[i])->queued = 1;
    memmove(z->queue, z->queue + i, (z->n_queue - i) * sizeof(int64_t));
    z->n_queue -= i;
    return -1;
}

int lf_pool_adopt(lf_pool *p, const unsigned char *payload, const int64_t *offsets,
                  const uint8_t *kinds, size_t m, int64_t *slots, size_t *bad) {
    lf_compressor *z = p->z;
    size_t fb = p->frame_bytes, i;
    lf_tree t = {0, 0};
    for (i = 0; i < m; i++) { /* every blob checked, in the pool's scratch, first */
        size_t bn = (size_t)(offsets[i + 1] - offsets[i]);
        int64_t r = lf_tree_step(&t, (int64_t)i, kinds[i]);
        if (r == LF_TREE_BAD || kinds[i] == LF_KIND_RAW || kinds[i] == LF_KIND_DELTA ||
            bn > fb + LF_BLOB_OVERHEAD ||
            lf_kind_decode(z->dctx, kinds[i], payload + offsets[i], bn,
                           r == LF_TREE_KEY ? NULL : z->base,
                           z->base, fb, z->coder.delta)) {
            *bad = i;
            return -2;
        }
    }
    t = (lf_tree){0, 0};
    for (i = 0; i < m; i++) {
        int64_t r = lf_tree_step(&t, (int64_t)i, kinds[i]);
        size_t bn = (size_t)(offsets[i + 1] - offsets[i]);
        int packed = kinds[i] == LF_KIND_PACKED || kinds[i] == LF_KIND_PACKED_BLOSC;
        uint8_t flags = kinds[i] == LF_KIND_PATCH ? LF_BLOB_PATCH
                        : packed                  ? LF_BLOB_PACKED
                        : kinds[i] == LF_KIND_XOR ? LF_BLOB_CODED
                                                  : 0;
        unsigned char *b = z->coder.blob; /* the blob, made lean there if it can be */
        if (kinds[i] == LF_KIND_PACKED_BLOSC) { /* packed again as an LZ4 block, if smaller */
            long pn = lf_decompress_upto(z->dctx, payload + offsets[i], bn, z->coder.delta, fb);
            if (pn < 0) goto oom; /* cannot happen: it decoded above */
            bn = lf_pack(z->coder.pack_state, z->coder.delta, (size_t)pn, b, (size_t)pn);
            if (!bn) { /* LZ4 saves nothing (a crafted file): the patch itself, <= fb bytes */
                memcpy(b, z->coder.delta, (size_t)pn);
                bn = (size_t)pn;
                flags = LF_BLOB_PATCH;
            }
        } else {
            memcpy(b, payload + offsets[i], bn);
        }
        if (flags == 0 || flags == LF_BLOB_CODED) { /* a codec blob */
            size_t lean = lf_lean(&z->coder.header, b, bn);
            if (lean < bn) flags |= LF_BLOB_LEAN;
            bn = lean;
        }
        int64_t slot = take_slot(p, LF_AT_NONE);
        if (slot > INT32_MAX) lf_pool_decref(p, slot); /* a reference holds int32 ids */
        if (slot < 0 || slot > INT32_MAX) goto oom;
        uint8_t where;
        uint32_t at;
        unsigned char *mem = blob_alloc(p, bn, &where, &at);
        if (!mem) {
            lf_pool_decref(p, slot); /* hot, with no buffer: freed */
            goto oom;
        }
        memcpy(mem, b, bn);
        lf_meta *mt = lf_pool_meta(p, slot);
        mt->at = at;
        lf_meta_set_blob_bytes(mt, bn);
        mt->blob_flags = (uint8_t)(where | flags);
        mt->pos = (uint8_t)t.pos;
        mt->cold_state = 1;
        mt->ref = r != LF_TREE_KEY ? (int32_t)slots[r] : -1;
        if (r != LF_TREE_KEY) lf_pool_incref_cold(p, slots[r]);
        p->cold_frames++;
        p->cold_bytes += bn;
        slots[i] = slot;
    }
    note_peak(p); /* the blobs came after their slots */
    return 0;
oom: /* the frames adopted so far go again, children first */
    while (i-- > 0) lf_pool_decref(p, slots[i]);
    return -1;
}

int lf_pool_read(lf_pool *p, int64_t slot, unsigned char *out) {
    if (lf_pool_is_hot(p, slot)) {
        memcpy(out, lf_pool_addr(p, slot), p->frame_bytes);
        return 0;
    }
    return lf_pool_decode(p, p->z->dctx, slot, out);
}

/* -- the reader ------------------------------------------------------------------------- */

void lf_reader_init(lf_reader *r, lf_pool *p) {
    memset(r, 0, sizeof(*r));
    r->p = p;
    r->bad = -1;
    r->held = -1;
}

static size_t hash_slot(int64_t slot, size_t cap) {
    return (size_t)(((uint64_t)slot * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1);
}

/* Room for `want` entries (arrays, and a hash table at most half full); 0 or -1. */
static int reader_grow(lf_reader *r, size_t want) {
    if (want > INT32_MAX / 4) return -1; /* entries are int32 indices; the table 4x as many */
    if (want > r->cap) {
        size_t cap = r->cap ? r->cap : 64;
        while (cap < want) cap *= 2;
        int64_t *slots = realloc(r->slots, cap * sizeof(int64_t));
        if (!slots) return -1;
        r->slots = slots;
        lf_blob *blobs = realloc(r->blobs, cap * sizeof(lf_blob));
        if (!blobs) return -1;
        r->blobs = blobs;
        int32_t *ref = realloc(r->ref, cap * sizeof(int32_t));
        if (!ref) return -1;
        r->ref = ref;
        int32_t *pos = realloc(r->pos, cap * sizeof(int32_t));
        if (!pos) return -1;
        r->pos = pos;
        unsigned char **at = realloc(r->at, cap * sizeof(unsigned char *));
        if (!at) return -1;
        r->at = at;
        unsigned char *done = realloc(r->done, cap);
        if (!done) return -1;
        r->done = done;
        r->cap = cap;
    }
    if (2 * want < r->hcap) return 0;
    size_t hcap = r->hcap ? r->hcap : 256;
    while (hcap <= 2 * want) hcap *= 2;
    int64_t *keys = malloc(hcap * sizeof(int64_t));
    int32_t *vals = malloc(hcap * sizeof(int32_t));
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return -1;
    }
    memset(keys, 0xFF, hcap * sizeof(int64_t));
    for (size_t i = 0; i < r->n; i++) {
        size_t h = hash_slot(r->slots[i], hcap);
        while (keys[h] >= 0) h = (h + 1) & (hcap - 1);
        keys[h] = r->slots[i];
        vals[h] = (int32_t)i;
    }
    free(r->hkeys);
    free(r->hvals);
    r->hkeys = keys;
    r->hvals = vals;
    r->hcap = hcap;
    return 0;
}

/* The index of slot, or -1; *pos receives its hash position (or the empty one). */
static int64_t reader_find(const lf_reader *r, int64_t slot, size_t *pos) {
    if (!r->hcap) return -1;
    size_t h = hash_slot(slot, r->hcap);
    while (r->hkeys[h] >= 0 && r->hkeys[h] != slot) h = (h + 1) & (r->hcap - 1);
    *pos = h;
    return r->hkeys[h] == slot ? r->hvals[h] : -1;
}

int lf_reader_expect(lf_reader *r, size_t n) {
    /* entries are distinct cold frames of the pool: never more than it has (a batch of
     * repeated ids, or a copy over many pools, each reader of a few) */
    return reader_grow(r, n < r->p->cold_frames ? n : r->p->cold_frames);
}

/* The slots of a chain's level lf_reader_prefetch loads at once (the misses a core
 * keeps in flight are fewer). */
#define LF_PREFETCH_BATCH 32

void lf_reader_prefetch(const lf_pool *p, const int64_t *slots, size_t n, int levels) {
    int64_t level[LF_PREFETCH_BATCH];
    if (p->z == NULL) return; /* no lf_meta: every frame is hot */
    for (size_t s = 0; s < n; s += LF_PREFETCH_BATCH) {
        size_t m = 0;
        for (size_t i = s; i < n && i < s + LF_PREFETCH_BATCH; i++)
            if (lf_pool_is_live(p, slots[i])) level[m++] = slots[i];
        for (int l = 0; m && l != levels; l++) { /* a level's loads issued, then each read */
            for (size_t i = 0; i < m; i++) {
                const lf_chunk *ch = lf_pool_chunk(p, level[i]);
                __builtin_prefetch(&ch->ref[lf_pool_offset(p, level[i])], 1);
                __builtin_prefetch((lf_meta *)ch->data + lf_pool_offset(p, level[i]));
            }
            if (l + 1 == levels) break; /* the last level asked for: loads issued, not read */
            size_t k = 0;
            for (size_t i = 0; i < m; i++) {
                const lf_meta *mt = lf_pool_meta(p, level[i]);
                if (!mt->cold_state) continue;
                __builtin_prefetch(lf_meta_buf(p, mt)); /* the blob's first bytes */
                if (mt->ref >= 0 && (k == 0 || level[k - 1] != mt->ref)) level[k++] = mt->ref;
            }
            m = k;
        }
    }
}

int64_t lf_reader_add(lf_reader *r, int64_t slot) {
    int64_t first = -1, prev = -1;
    /* the slot, then its chain up to the first member already an entry, or the keyframe */
    for (; slot >= 0; slot = lf_pool_meta(r->p, slot)->ref) {
        size_t pos = 0;
        int64_t i = reader_find(r, slot, &pos);
        int known = i >= 0;
        if (!known) {
            if (reader_grow(r, r->n + 1)) return -1;
            reader_find(r, slot, &pos); /* the table may have grown */
            i = (int64_t)r->n++;
            r->hkeys[pos] = slot;
            r->hvals[pos] = (int32_t)i;
            r->slots[i] = slot;
            r->blobs[i] = lf_pool_blob(r->p, slot); /* decoded without the GIL: never the meta */
            r->ref[i] = -1;
            r->pos[i] = -1;
            r->at[i] = NULL;
            r->done[i] = 0;
            /* a root is read where it is; a group's keyframe (the codec's, or a delta
             * against a root) gets scratch too, so that it is decoded once, not once for
             * each frame asked for whose chain passes it (2.1 times for a window of 5) */
            if (r->blobs[i].flags & LF_BLOB_RAW) {
                r->at[i] = (unsigned char *)r->blobs[i].buf; /* never written */
                r->done[i] = 1;
            } else if (lf_pool_meta(r->p, slot)->pos == 0) {
                r->pos[i] = (int32_t)r->n_kept++;
            }
        }
        if (prev >= 0) r->ref[prev] = (int32_t)i;
        if (first < 0) first = i;
        if (known) break; /* its chain is in already */
        prev = i;
    }
    if (first >= 0 && r->pos[first] < 0 && !r->done[first]) /* asked for */
        r->pos[first] = (int32_t)r->n_kept++;
    return first;
}

int lf_reader_reserve(lf_reader *r) {
    lf_compressor *z = r->p->z;
    size_t fb = r->p->frame_bytes, kept = 0;
    if (!r->n) return 0;
    for (size_t i = 0; i < r->n; i++) /* scratch for the frames of their own not placed */
        if (r->pos[i] >= 0 && !r->at[i]) r->pos[i] = (int32_t)kept++;
    size_t need = kept * fb;
    r->chunk = malloc(fb + LF_BLOB_OVERHEAD + 3 * fb);
    if (!r->chunk) return -1;
    if (z->spare && z->spare_bytes >= need) {
        r->scratch = z->spare;
        r->scratch_bytes = z->spare_bytes;
        z->spare = NULL;
        z->spare_bytes = 0;
        return 0;
    }
    r->scratch = malloc(need ? need : 1); /* none when every cold frame is a root */
    r->scratch_bytes = need;
    return r->scratch ? 0 : -1;
}

int lf_reader_decode(lf_reader *r, void *dctx) {
    return lf_reader_decode_upto(r, dctx, r->n);
}

/* Entries ahead of the one decoded whose blob's first bytes are prefetched. */
#define LF_READ_AHEAD 2

int lf_reader_decode_upto(lf_reader *r, void *dctx, size_t end) {
    /* the frames of a chain no row asked for: in one buffer, each patch applied in place */
    unsigned char *through = r->chunk + 2 * r->p->frame_bytes + LF_BLOB_OVERHEAD;
    if (end > r->n) end = r->n;
    for (size_t i = r->cursor; i < end; i++) {
        if (i + LF_READ_AHEAD < r->n) { /* the blob decoded soon: its bytes on the way */
            const lf_blob *b = &r->blobs[i + LF_READ_AHEAD];
            for (size_t at = 0; at < b->bytes && at < 256; at += 64)
                __builtin_prefetch(b->buf + at);
        }
        if (r->pos[i] < 0 || r->done[i]) continue; /* decoded on the way to one asked for */
        int32_t todo[LF_MAX_CHAIN];
        int n = 0;
        for (int32_t j = (int32_t)i; j >= 0 && !r->done[j] && j != r->held && n < LF_MAX_CHAIN;
             j = r->ref[j])
            todo[n++] = j;
        int32_t up = r->ref[todo[n - 1]];
        int from_held = up >= 0 && up == r->held;
        if (up >= 0 && !r->done[up] && !from_held) { /* a chain longer than LF_MAX_CHAIN */
            r->bad = r->slots[todo[n - 1]];
            return -2;
        }
        const unsigned char *base = from_held ? through : up >= 0 ? lf_reader_frame(r, up) : NULL;
        while (n > 0) { /* the oldest first: each from the frame before it */
            int32_t j = todo[--n];
            unsigned char *out = r->pos[j] >= 0 ? lf_reader_frame(r, j) : through;
            if (lf_blob_decode(r->p, dctx, r->blobs[j], base, out, r->chunk)) {
                r->bad = r->slots[j];
                return -2;
            }
            r->decoded++;
            if (r->pos[j] >= 0) r->done[j] = 1;
            else r->held = j;
            base = out;
        }
    }
    if (end > r->cursor) r->cursor = end;
    return 0;
}

void lf_reader_release(lf_reader *r) {
    free(r->slots);
    free(r->blobs);
    free(r->ref);
    free(r->pos);
    free(r->at);
    free(r->done);
    free(r->hkeys);
    free(r->hvals);
    free(r->chunk);
    lf_compressor *z = r->p->z;
    if (r->scratch_bytes > z->spare_bytes && r->scratch_bytes <= LF_SPARE_MAX) {
        free(z->spare); /* keep the larger one */
        z->spare = r->scratch;
        z->spare_bytes = r->scratch_bytes;
    } else {
        free(r->scratch);
    }
    memset(r, 0, sizeof(*r));
}
