/* Plain-C refcounted frame pool of lazyframes: a chunked arena of fixed-size slots.
 *
 * Slots live in chunks of `spc` slots that never move. Slot id = chunk * spc + offset;
 * spc is the largest power of two with spc * frame_bytes <= chunk_bytes (at least 1), so
 * that finding a slot is a shift and a mask, not a division.
 * Allocation takes the lowest chunk with a free slot (a min-heap) and, in it, the
 * most recently freed offset (a LIFO; a fresh chunk hands out offsets in increasing
 * order); a chunk whose slots all become free is returned to the OS, except one empty
 * chunk kept to avoid churn.
 * Each slot has one 16-bit word: a live slot's refcount, 1 to LF_REF_MAX, or a free slot's
 * LF_FREE | the offset of the next free slot of its chunk (LF_END: none; a chunk has at
 * most 16,384 slots), so the free offsets are a list threaded through the words, most
 * recently freed first. A count beyond LF_REF_MAX keeps the word at LF_REF_MAX and the
 * rest in the pool's list of large counts (`big`: a frame that tens of thousands of rows
 * share, e.g. a paused game's screen in a plain pool); if that list cannot grow, the word
 * becomes LF_REF_STUCK and the frame is never freed: a leak of one frame on out of
 * memory, never a wrap to a use after free.
 * Not thread-safe: the Cython layer calls it with the GIL held, except the decoding and
 * reading of pinned frames (lf_reader_decode, the copy kernels).
 *
 * Compression (lf_pool_enable_compression; docs/COMPRESSION.md). A compressing pool keeps
 * in its chunks one lf_meta per slot instead of the frame bytes, and each frame in its own
 * buffer, so that a cold frame pins no arena memory. A slot is HOT (its frame_bytes in its
 * buffer) or COLD (its buffer is a compressed blob: a keyframe, or the patch of the frame
 * against the frame `ref`, which that slot then holds a cold reference on). Along the
 * recorded previous frames, a keyframe starts a group of at most `group` frames; the
 * frame at position `pos` > 0 of a group refers to the one before it (a chain: 1 -> 0,
 * 2 -> 1, ...; frames adopted from a container keep the container's references), so
 * pos + 1 blobs decode it and a window of consecutive frames decodes its chain once, the
 * frames no row asked for patched in place (lf_reader). A reference is COLD when a
 * SlotTable entry or a delta child holds it. When a hot slot's references are all cold
 * (refcnt == cold > 0) it joins the pending queue, and lf_pool_compress_pending
 * compresses it exactly once (SlotTable.set/take call it with the GIL held). A cold frame never becomes hot again; readers (lf_reader)
 * decode it into their own scratch, without the GIL, while the caller holds a reference
 * on it (a pin: incref), which keeps its whole chain (each member holds a cold reference
 * on the next), so that nothing they read is compressed or freed meanwhile.
 *
 * Threads. One thread at a time changes a pool (the GIL); a copy out reads pinned frames
 * without it while another thread adds. What a reader reads without the GIL never
 * changes while the frames it was asked for are pinned: a pinned hot frame's bytes (a
 * pin is not a cold reference, so the frame is not eligible for compression, and its
 * slot is not freed or reused) and the blobs of a pinned cold frame's chain (freed only
 * with their slots, which live while the frame does). The pool's own tables do move:
 * lf_pool_alloc grows the chunk table and the table of buffers (lf_meta.at) with realloc,
 * and frees and compression write the lf_meta of other slots. So a reader takes every
 * address it needs while the pool does not change (the GIL held: several threads may do
 * that at once, since lf_reader_add reads the pool and writes its reader only) - a hot
 * frame's lf_pool_addr, a cold frame's blob (lf_reader_add copies it into an lf_blob) -
 * and never reads p->chunks, an lf_meta, a link or a refcount once the GIL is released.
 * test_pool_threads in csrc/test_kernels.c runs adds against gathers in two threads under
 * ThreadSanitizer (tests/sanitize.sh), and test_parallel_decode collects readers in
 * parallel.
 */
#ifndef LAZYFRAMES_POOL_H
#define LAZYFRAMES_POOL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "codec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Per-slot state of a compressing pool (12 bytes). `at` says where the slot's buffer is
 * (lf_meta_buf): a blob in a slab, as the slab's number and the offset in it (LF_BLOB_SLAB
 * set), else the number of its entry in the pool's table of buffers (`own`), which a
 * hot frame's bytes, a root's and a blob too large for a slab have: 4 bytes where a
 * pointer takes 8, and no slab number stored before each blob. The second word holds what
 * a HOT frame needs, then what a COLD one does; the third, bit fields of a COLD frame. */
typedef struct {
    uint32_t at;           /* where the buffer is: HOT, the frame's bytes; COLD, its blob */
    union {
        struct {
            uint32_t cold : 31;   /* HOT: references held by SlotTable entries and delta
                                   * children, sticking at LF_COLD_MAX (a
                                   * cold frame is never compressed again: its count no
                                   * longer matters) */
            uint32_t queued : 1;  /* HOT: 1 while in the pending queue */
        };
        int32_t ref;       /* COLD delta: the reference slot; -1 for a keyframe */
    };
    uint32_t blob_bytes : 20; /* COLD: bytes of the blob, or LF_BLOB_MAX (lf_meta_blob_bytes) */
    uint32_t pos : 6;         /* COLD: position in its group (0 for a keyframe) */
    uint32_t cold_state : 1;  /* 1 when COLD */
    uint32_t blob_flags : 5;  /* COLD: the coder's LF_BLOB_* bits (codec.h) |
                               * LF_BLOB_SLAB; or LF_BLOB_RAW */
} lf_meta;

/* lf_meta.blob_bytes of a blob of LF_BLOB_MAX bytes or more: the blob has its own malloc
 * and its size in the size_t before it. */
#define LF_BLOB_MAX ((1u << 20) - 1)

/* LF_BLOB_LEAN, LF_BLOB_PATCH, LF_BLOB_CODED (codec.h: what the coder made), and: */
#define LF_BLOB_SLAB 2     /* the blob lives in a slab of the pool (pool.c), not its own malloc */
#define LF_SLAB_SHIFT 16   /* a slab's bytes: 1 << LF_SLAB_SHIFT; lf_meta.at = slab << it | offset */
#define LF_AT_NONE UINT32_MAX /* lf_meta.at of a slot with no buffer yet (lf_pool_adopt) */
#define LF_BLOB_RAW 16     /* the blob is the frame's own bytes, its hot buffer kept: a root */

/* Roots. In a pool of group > 1, a keyframe is coded against the pool's root when that is
 * no larger than the codec's blob of it: the root is a keyframe stored raw (LF_BLOB_RAW),
 * the first keyframe compressed and then one every LF_ROOT_FRAMES frames (in keyframes:
 * LF_ROOT_FRAMES / group). A keyframe is then a patch against a frame its game shares most
 * pixels with: a few hundred bytes where the codec's keyframe takes up to 2 KB, decoded
 * by a copy of the root, which is read in place, and a patch, not by the codec
 * (docs/COMPRESSION.md, "Roots"). A frame decodes from at most group + 1 blobs, one more
 * if it is an alias of a repeated frame (compress_one): LF_MAX_CHAIN. */
#define LF_ROOT_FRAMES 8192
#define LF_MAX_CHAIN (LF_MAX_GROUP + 2)

#define LF_WARM 32         /* raw copies of recently compressed frames kept for the next delta */
#define LF_ALIAS_BACK 4    /* how many frames back an equal frame is found (an alias): a
                            * stack of 4 repeats a frame up to 4 frames back */

typedef struct lf_compressor lf_compressor; /* pool.c: contexts, scratch, queue, warm cache */

typedef uint16_t lf_word;      /* a slot's refcount, or its link in its chunk's free list */
typedef uint16_t lf_link;      /* a slot's previous frame (lf_pool_prev) */
#define LF_FREE 0x8000u        /* a free slot's word: this bit | the next free offset */
#define LF_REF_MAX 0x7FFEu     /* a word counting this many references or more (lf_pool.big) */
#define LF_REF_STUCK 0x7FFFu   /* a count no longer known: the frame is never freed */
#define LF_END 0x7FFFu         /* the end of a chunk's free list */
#define LF_COLD_MAX 0x7FFFFFFFu /* lf_meta.cold sticks here (the frame is never compressed) */

typedef struct {
    int64_t slot;
    uint64_t more;         /* references beyond LF_REF_MAX, > 0 */
} lf_big;

typedef struct {
    unsigned char *data;   /* spc * frame_bytes (spc lf_meta when compressing), or NULL */
    lf_word *ref;          /* spc words: a live slot's refcount, or a free slot's link */
    lf_link *link;         /* spc words: a live slot's previous frame (lf_pool_set_prev) */
    int32_t *far;          /* the previous frames of far links, by entry (free: the next
                            * free entry, or -1) */
    int32_t far_free;      /* the first free entry of far, or -1 */
    uint32_t n_far, cap_far; /* entries of far used (live or free) and allocated */
    uint32_t free_head;    /* the first free offset (valid while live < spc) */
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
    lf_compressor *z;      /* NULL unless compressing */
    unsigned char **own;   /* compressing: the buffers not in a slab, by lf_meta.at (NULL:
                            * a free entry) */
    unsigned char **slab;  /* compressing: the slabs' memory, by number (NULL: none) */
    lf_big *big;           /* the slots whose word is LF_REF_MAX with more references */
    size_t n_big, cap_big;
    size_t busy;           /* copies out running without the GIL (they hold frame addresses) */
    size_t cold_frames, cold_bytes;
    size_t far_bytes;      /* the chunks' tables of far links */
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

/* 1 if a slot's word is a live slot's refcount. */
static inline int lf_word_live(lf_word w) {
    return (unsigned)w - 1u < LF_REF_STUCK;
}

/* References of a live slot whose word is LF_REF_MAX, beyond it (pool.c). */
uint64_t lf_pool_big_more(const lf_pool *p, int64_t slot);

/* 1 if slot is in range and live, 0 otherwise. */
static inline int lf_pool_is_live(const lf_pool *p, int64_t slot) {
    if (!lf_pool_in_range(p, slot)) return 0;
    const lf_chunk *ch = lf_pool_chunk(p, slot);
    return ch->data != NULL && lf_word_live(ch->ref[lf_pool_offset(p, slot)]);
}

/* Refcount of an in-range slot (0 if free). */
static inline uint64_t lf_pool_refcount(const lf_pool *p, int64_t slot) {
    const lf_chunk *ch = lf_pool_chunk(p, slot);
    lf_word w = ch->data ? ch->ref[lf_pool_offset(p, slot)] : 0;
    if (w == LF_REF_MAX) return LF_REF_MAX + lf_pool_big_more(p, slot);
    if (w == LF_REF_STUCK) return UINT64_MAX;
    return lf_word_live(w) ? w : 0;
}

/* The lf_meta of a live slot of a compressing pool. */
static inline lf_meta *lf_pool_meta(const lf_pool *p, int64_t slot) {
    return (lf_meta *)lf_pool_chunk(p, slot)->data + lf_pool_offset(p, slot);
}

/* 1 if a live slot holds its bytes uncompressed (always, in a pool that does not compress). */
static inline int lf_pool_is_hot(const lf_pool *p, int64_t slot) {
    return p->z == NULL || !lf_pool_meta(p, slot)->cold_state;
}

/* Address of a live HOT slot's bytes. The caller must have checked lf_pool_is_live and
 * lf_pool_is_hot (a cold slot's frame is read with lf_pool_decode). */
static inline unsigned char *lf_pool_addr(const lf_pool *p, int64_t slot) {
    if (p->z) return p->own[lf_pool_meta(p, slot)->at];
    return lf_pool_chunk(p, slot)->data + lf_pool_offset(p, slot) * p->frame_bytes;
}

/* Put a slot whose refcount reached 0 back on its chunk's free stack (pool.c). */
void lf_pool_free_slot(lf_pool *p, int64_t slot);
/* Queue a hot slot whose references are all cold for compression (pool.c). */
void lf_pool_queue(lf_pool *p, int64_t slot);

/* A reference more (+1) or less (-1) on a slot whose word is LF_REF_MAX: in the list of
 * large counts (+1 on out of memory: the word becomes LF_REF_STUCK); -1 returns 0 when
 * the slot has none there (its word then goes down). */
void lf_pool_big_incref(lf_pool *p, int64_t slot);
int lf_pool_big_decref(lf_pool *p, int64_t slot);

/* Refcount +1 / -1 on a live slot (caller checked). decref frees the slot at 0; in a
 * compressing pool it queues a slot whose remaining references are all cold. */
static inline void lf_pool_incref(lf_pool *p, int64_t slot) {
    lf_word *w = &lf_pool_chunk(p, slot)->ref[lf_pool_offset(p, slot)];
    if (*w < LF_REF_MAX)
        ++*w;
    else if (*w == LF_REF_MAX)
        lf_pool_big_incref(p, slot);
}
/* Ask for the cache line at p ahead of an access. A batch's table rows, columns and
 * refcounts are scattered: a loop of hints before the loop of accesses overlaps their
 * cache misses instead of taking them one after another. */
static inline void lf_prefetch(const void *p) {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(p);
#else
    (void)p;
#endif
}

/* lf_prefetch of a slot's refcount word, ahead of lf_pool_incref/decref. */
static inline void lf_pool_prefetch_ref(const lf_pool *p, int64_t slot) {
    lf_prefetch(&lf_pool_chunk(p, slot)->ref[lf_pool_offset(p, slot)]);
}
static inline void lf_pool_decref(lf_pool *p, int64_t slot) {
    lf_word *w = &lf_pool_chunk(p, slot)->ref[lf_pool_offset(p, slot)];
    if (*w >= LF_REF_MAX && (*w == LF_REF_STUCK || lf_pool_big_decref(p, slot))) return;
    lf_word n = --*w;
    if (n == 0) {
        lf_pool_free_slot(p, slot);
    } else if (p->z) {
        lf_meta *m = lf_pool_meta(p, slot);
        if (!m->cold_state && m->cold == n && !m->queued) lf_pool_queue(p, slot);
    }
}

/* A cold reference (a SlotTable entry) +1 / -1 on a live slot. In a pool that does not
 * compress they are lf_pool_incref / lf_pool_decref. */
static inline void lf_pool_incref_cold(lf_pool *p, int64_t slot) {
    lf_pool_incref(p, slot);
    if (p->z && !lf_pool_meta(p, slot)->cold_state) { /* a cold frame keeps no count */
        lf_meta *m = lf_pool_meta(p, slot);
        if (m->cold < LF_COLD_MAX) m->cold++;
        uint64_t n = lf_pool_refcount(p, slot);
        if (m->cold == n && n < LF_COLD_MAX && !m->queued) lf_pool_queue(p, slot);
    }
}
static inline void lf_pool_decref_cold(lf_pool *p, int64_t slot) {
    if (p->z) {
        lf_meta *m = lf_pool_meta(p, slot);
        if (!m->cold_state && m->cold < LF_COLD_MAX) m->cold--;
    }
    lf_pool_decref(p, slot);
}

/* Previous frames. A slot's previous frame is recorded once (SlotTable.set: the frame
 * before it in an observation, oldest first) and kept while the slot lives, hot or cold:
 * the delta reference a compressing pool codes it against, and the link a SlotTable row
 * of a frame stack is read along (_table.pxi). LF_PREV_UNSET until recorded; a slot
 * sealed with LF_PREV_NONE has none and keeps none (a row padded at it relies on that).
 *
 * A link is a 16-bit word: the previous frame's distance d = prev - slot when |d| <=
 * LF_LINK_NEAR (a frame's predecessor was nearly always allocated just before it, by the
 * same env, or a few envs earlier), else LF_LINK_FAR | the number of an entry of its
 * chunk's table `far` that holds prev (a chunk has at most 16,384 slots, so at most that
 * many entries; a buffer that evicts keeps well under 1% of its links there). The word
 * of distance 0 (a frame is never its own predecessor) is LF_LINK_UNSET, that of -16,384
 * LF_LINK_NONE. */
#define LF_PREV_UNSET (-1)
#define LF_PREV_NONE (-2)
#define LF_LINK_UNSET 0x0000u
#define LF_LINK_NONE 0x4000u
#define LF_LINK_FAR 0x8000u
#define LF_LINK_NEAR 16383

static inline int32_t lf_pool_prev(const lf_pool *p, int64_t slot) {
    const lf_chunk *ch = lf_pool_chunk(p, slot);
    lf_link w = ch->link[lf_pool_offset(p, slot)];
    if (w & LF_LINK_FAR) return ch->far[w & ~LF_LINK_FAR];
    if (w == LF_LINK_UNSET) return LF_PREV_UNSET;
    if (w == LF_LINK_NONE) return LF_PREV_NONE;
    return (int32_t)(slot + (w < LF_LINK_NONE ? (int32_t)w : (int32_t)w - 0x8000));
}

static inline void lf_pool_prefetch_prev(const lf_pool *p, int64_t slot) {
    lf_prefetch(&lf_pool_chunk(p, slot)->link[lf_pool_offset(p, slot)]);
}

/* lf_pool_set_prev of a far link (pool.c). */
int lf_pool_set_far(lf_pool *p, int64_t slot, int32_t prev);

/* Record `prev` (live, or LF_PREV_NONE) as the frame before the live `slot`, unless
 * one is recorded already: 0, or -1 on out of memory for a far link (nothing recorded). */
static inline int lf_pool_set_prev(lf_pool *p, int64_t slot, int64_t prev) {
    lf_link *w = &lf_pool_chunk(p, slot)->link[lf_pool_offset(p, slot)];
    if (*w != LF_LINK_UNSET || slot == prev || prev > INT32_MAX || prev == LF_PREV_UNSET)
        return 0;
    if (prev == LF_PREV_NONE) {
        *w = LF_LINK_NONE;
        return 0;
    }
    int64_t d = prev - slot;
    if (d < -LF_LINK_NEAR || d > LF_LINK_NEAR) return lf_pool_set_far(p, slot, (int32_t)prev);
    *w = (lf_link)(d & 0x7FFF);
    return 0;
}

size_t lf_pool_bytes_held(const lf_pool *p);
/* The part of lf_pool_bytes_held that is per-slot state (a compressing pool's lf_meta,
 * refcount word and link of every slot with memory, and its chunks' far links; 0 for a
 * plain pool). */
size_t lf_pool_slot_state_bytes(const lf_pool *p);

/* -- compression (pool.c) ----------------------------------------------------------- */

/* Make p compress with codec c: 0, -1 on out of memory, -2 for a bad codec or a frame
 * too large for the codec (lf_codec_valid), -4 while p->busy (frames would move);
 * nothing changed then. Frames already live become
 * per-slot buffers. A second call with the same codec is a no-op; with another: -3. */
int lf_pool_enable_compression(lf_pool *p, lf_codec c);

/* The pool's codec (meaningful when p->z != NULL). */
lf_codec lf_pool_codec(const lf_pool *p);

/* Compress every queued slot still eligible; 0, or -1 on out of memory (the frames
 * not compressed then stay hot and queued). The caller holds the GIL. */
int lf_pool_compress_pending(lf_pool *p);

/* Adopt the m blobs of a container (codec.h; kinds KEY, PATCH and XOR) as cold frames,
 * each in a new slot of refcount 1 (slots[i]) coded against the others as the container's
 * groups say, which is how p codes its own frames: a message's frames stored as they
 * came, neither decoded nor compressed again. Every blob is checked first (a codec blob
 * decompressed into the pool's scratch, a patch applied there). 0; -1 on out of memory;
 * -2 if blob *bad has another kind, is larger than a frame's blob or does not decode.
 * Nothing changed unless 0. p compresses; the caller holds the GIL. */
int lf_pool_adopt(lf_pool *p, const unsigned char *payload, const int64_t *offsets,
                  const uint8_t *kinds, size_t m, int64_t *slots, size_t *bad);

/* Frames in the pending queue (tests and stats). */
size_t lf_pool_pending(const lf_pool *p);

/* Append to chain[] the slots a cold `slot` is decoded from, itself first, its keyframe
 * last; returns their number (<= LF_MAX_CHAIN: a longer chain, which compress_one never
 * makes, is cut there, and lf_pool_decode then fails, as a reader does). */
int lf_pool_chain(const lf_pool *p, int64_t slot, int64_t *chain);

/* The blob of a cold slot, as read with the GIL held: it does not move or change while
 * the slot is live, so a reader that pinned the slot decodes it without the GIL. */
typedef struct {
    const unsigned char *buf;
    uint32_t bytes;
    uint8_t flags;         /* lf_meta.blob_flags */
} lf_blob;

/* The buffer of a live slot's lf_meta m (lf_meta.at). */
static inline unsigned char *lf_meta_buf(const lf_pool *p, const lf_meta *m) {
    if (m->cold_state && (m->blob_flags & LF_BLOB_SLAB))
        return p->slab[m->at >> LF_SLAB_SHIFT] + (m->at & ((1u << LF_SLAB_SHIFT) - 1));
    return p->own[m->at];
}

/* 1 if a cold slot's blob is LF_BLOB_MAX bytes or more (its own malloc, its size before it). */
static inline int lf_meta_big(const lf_meta *m) {
    return !(m->blob_flags & LF_BLOB_RAW) && m->blob_bytes == LF_BLOB_MAX;
}

/* Record the size n of a cold slot's new blob (a big one's size is also before it). */
static inline void lf_meta_set_blob_bytes(lf_meta *m, size_t n) {
    m->blob_bytes = n < LF_BLOB_MAX ? (uint32_t)n : LF_BLOB_MAX;
}

/* Bytes of the blob of a cold slot's lf_meta m. */
static inline size_t lf_meta_blob_bytes(const lf_pool *p, const lf_meta *m) {
    if (m->blob_flags & LF_BLOB_RAW) return p->frame_bytes;
    if (!lf_meta_big(m)) return m->blob_bytes;
    size_t n;
    memcpy(&n, lf_meta_buf(p, m) - sizeof(n), sizeof(n));
    return n;
}

/* 1 if a cold slot's blob is decoded by a codec (a codec keyframe, a packed patch's LZ4
 * block, an XOR delta), 0 if by copies (a patch, a root): what decoding it costs, for a
 * copy's split into threads. */
static inline int lf_pool_codec_blob(const lf_pool *p, int64_t slot) {
    uint8_t f = lf_pool_meta(p, slot)->blob_flags;
    return !(f & LF_BLOB_RAW) && (f & LF_BLOB_DELTA) != LF_BLOB_PATCH;
}

static inline lf_blob lf_pool_blob(const lf_pool *p, int64_t slot) {
    const lf_meta *m = lf_pool_meta(p, slot);
    lf_blob b = {lf_meta_buf(p, m), (uint32_t)lf_meta_blob_bytes(p, m), m->blob_flags};
    return b;
}

/* Decode blob b of p into out (frame_bytes): a keyframe, or a delta (a patch, a packed
 * patch, or the codec's XOR delta) over `base`, the decoded frame of its reference (NULL for a
 * keyframe), which may be out. chunk: room for 2 frame_bytes + LF_BLOB_OVERHEAD (a lean
 * blob is made whole there, then an XOR delta decoded after it). Reads only b's bytes,
 * p->frame_bytes and the coder's lean header (written once, before the first lean blob
 * exists). 0, or -1 if the blob does not decode (cannot happen unless memory is
 * corrupted). Needs no GIL when the caller pinned the blob's slot, or a frame whose
 * chain it is in. */
int lf_blob_decode(const lf_pool *p, void *dctx, lf_blob b, const unsigned char *base,
                   unsigned char *out, unsigned char *chunk);

/* Decode a cold slot with its whole chain into out. */
int lf_pool_decode(const lf_pool *p, void *dctx, int64_t slot, unsigned char *out);

/* Decode a live slot's frame into out with the pool's own context: a plain copy when
 * hot. 0, -1 if a blob does not decode. GIL held (it uses the pool's scratch). */
int lf_pool_read(lf_pool *p, int64_t slot, unsigned char *out);

/* -- a reader: the cold frames of one copy out, each decoded once ----------------------- */

/* Collect while the pool does not change (lf_reader_add, in several threads at once if
 * need be, each with its own reader; then lf_reader_reserve, which takes the scratch, in
 * one thread with the GIL), decode without the GIL (lf_reader_decode), read the frames
 * (lf_reader_frame), then release with the GIL held (lf_reader_release keeps the
 * scratch as the pool's spare, up to LF_SPARE_MAX bytes: a fresh one
 * per call costs a page fault per 4 KiB). An entry is decoded from the decoded entry
 * of its reference: an observation's consecutive frames, and the frames an obs and its
 * next obs share, decode once per call. Only the entries lf_reader_add returned (the
 * frames asked for) and each group's keyframe get scratch, a root none (it is read in
 * place); the rest of a chain (the frames between a keyframe and the first frame asked
 * for) decodes through one frame buffer that stays in the CPU's cache, each patch applied
 * in place; a chain that passes the frame that buffer holds (the next frame's, in a
 * window of consecutive frames) goes on from it. */
typedef struct {
    lf_pool *p;
    int64_t *slots;        /* the cold slots (alive while those asked for are pinned) */
    lf_blob *blobs;        /* their blobs, taken by lf_reader_add (GIL held) */
    int32_t *ref;          /* index of the entry's reference, or -1 for a keyframe */
    int32_t *pos;          /* >= 0 for an entry with a frame of its own (a frame asked
                            * for, or a group's keyframe): from lf_reader_reserve on, its
                            * index in scratch unless placed; else -1 */
    unsigned char **at;    /* where it is decoded instead (lf_reader_place), a root's own
                            * bytes (read in place, never written), or NULL */
    unsigned char *done;   /* 1 once decoded (a root: from the start) */
    size_t n, cap;
    size_t n_kept;         /* entries with a frame of their own: in scratch, or placed */
    size_t cursor;         /* every entry asked for below it is decoded */
    int64_t held;          /* the entry (one no row asked for) whose frame the chunk's
                            * through buffer holds, or -1 */
    size_t decoded;        /* blobs decoded so far (the work done, for tests) */
    int64_t *hkeys;        /* open addressing: slot -> index, -1 empty */
    int32_t *hvals;
    size_t hcap;           /* a power of two, > 2 n */
    unsigned char *scratch; /* a frame for each entry kept and not placed (by
                             * lf_reader_reserve) */
    size_t scratch_bytes;
    int64_t bad;            /* the slot whose blob did not decode, or -1 */
    unsigned char *chunk;   /* frame_bytes + LF_BLOB_OVERHEAD: a lean blob made whole,
                             * then frame_bytes: a decoded XOR delta, then frame_bytes:
                             * the frames of a chain no row asked for */
} lf_reader;

#define LF_SPARE_MAX ((size_t)8 << 20) /* sample(32) of Atari frames needs ~1 MiB */

void lf_reader_init(lf_reader *r, lf_pool *p);
/* Room for n entries at once (a copy's cold frames and their chains), so that adding
 * them does not grow the reader's arrays and table step by step: at most the pool's cold
 * frames (the entries are distinct ones). 0, or -1 on out of memory. More entries than
 * n may still be added. */
int lf_reader_expect(lf_reader *r, size_t n);
/* Start loading what lf_reader_add will read of the n slots (any ids: those not live
 * are skipped) and of their chains, level by level, `levels` levels (1: the slots' own
 * records; -1: every level): each level's misses overlap instead of following one
 * another down each chain (while the pool does not change, as lf_reader_add). Changes
 * no value, only the time. */
void lf_reader_prefetch(const lf_pool *p, const int64_t *slots, size_t n, int levels);
/* The entry of a live cold slot (added, with its chain, if new), to read with
 * lf_reader_frame: >= 0, or -1 on out of memory. The caller pins the slot (or holds a
 * reference on it) until lf_reader_release: that keeps its chain. Reads the pool, writes
 * r only. */
int64_t lf_reader_add(lf_reader *r, int64_t slot);
/* The scratch of every entry asked for and not placed (lf_reader_place before this
 * saves a frame's scratch): 0, or -1 on out of memory. GIL held. */
int lf_reader_reserve(lf_reader *r);
/* Decode every entry asked for (reserved): 0, or -2 if a blob does not decode (its slot
 * then in r->bad). No GIL needed: it reads the reader's memory and the pinned blobs,
 * never the pool's tables. */
int lf_reader_decode(lf_reader *r, void *dctx);
/* The same for the entries below `end` only (the rest stay for a later call), so that a
 * copy can decode a row's frames just before it copies them, while they are in cache. */
int lf_reader_decode_upto(lf_reader *r, void *dctx, size_t end);
/* Decode the entry i lf_reader_add returned into addr (frame_bytes the caller owns
 * until lf_reader_release, e.g. its place in a copy's output) instead of scratch, unless
 * it is decoded or placed already; placed before lf_reader_reserve, it takes no scratch. */
static inline void lf_reader_place(lf_reader *r, int64_t i, unsigned char *addr) {
    if (!r->done[i] && !r->at[i]) r->at[i] = addr;
}
/* The decoded frame of an entry lf_reader_add returned. */
static inline unsigned char *lf_reader_frame(const lf_reader *r, int64_t i) {
    return r->at[i] ? r->at[i] : r->scratch + (size_t)r->pos[i] * r->p->frame_bytes;
}
void lf_reader_release(lf_reader *r);

#ifdef __cplusplus
}
#endif
#endif
