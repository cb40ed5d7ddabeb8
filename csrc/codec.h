/* The frame codec of lazyframes: C-Blosc2 (lz4, lz4hc or zstd) on one frame's bytes,
 * patches of a frame against another, and LZ4 blocks of patches (the LZ4 that Blosc2
 * links in, called without Blosc2's chunk around it). The only file that includes
 * blosc2.h; the rest of the core sees opaque contexts. See docs/COMPRESSION.md.
 *
 * A codec blob is one Blosc2 chunk: a 32-byte header (LF_BLOB_OVERHEAD) then the payload.
 * Contexts are not shared between threads: one compression context per pool (used with
 * the GIL held), one decompression context per call or thread.
 */
#ifndef LAZYFRAMES_CODEC_H
#define LAZYFRAMES_CODEC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Codec codes: Blosc2's own (codec.c checks they agree). */
enum { LF_CODEC_LZ4 = 1, LF_CODEC_LZ4HC = 2, LF_CODEC_ZSTD = 5 };

/* Most bytes a blob has beyond the frame it holds. */
#define LF_BLOB_OVERHEAD 32
#define LF_MAX_GROUP 64

typedef struct {
    int codec;             /* LF_CODEC_* */
    int level;             /* 1..9 */
    int group;             /* 1..LF_MAX_GROUP frames per keyframe (a pool decodes a frame
                            * from group + 1 blobs at most and its root, pool.h) */
} lf_codec;

/* Once per process, before any other call. */
void lf_codec_init(void);

/* 1 if c is a valid codec for frames of frame_bytes bytes. */
int lf_codec_valid(lf_codec c, size_t frame_bytes);

/* Contexts (NULL on out of memory); lf_ctx_free accepts NULL. */
void *lf_cctx_new(lf_codec c);
void *lf_dctx_new(void);
void lf_ctx_free(void *ctx);

/* Compress n bytes into dst (room for n + LF_BLOB_OVERHEAD): the blob's size, or -1. */
long lf_compress(void *cctx, const void *src, size_t n, void *dst);

/* Decompress a blob of blob_bytes bytes into dst: 0 if it is a well-formed blob of
 * exactly n bytes (checked before anything is written past its header), else -1. */
int lf_decompress(void *dctx, const void *blob, size_t blob_bytes, void *dst, size_t n);

/* The same for a blob of any size up to cap bytes: its size, or -1. */
long lf_decompress_upto(void *dctx, const void *blob, size_t blob_bytes, void *dst, size_t cap);

/* Lean blobs. The blobs of one compression context share all of Blosc2's 32-byte chunk
 * header but its sizes (bytes 4-15: uncompressed, block and compressed) and two flag bytes
 * (2 and 31). A pool stores a blob whose header matches its template (the first header it
 * saw) and whose block is all of it as those two flag bytes, its uncompressed size (a
 * varint: a keyframe's is the frame's, a packed patch's its own) and the payload, and
 * rebuilds the header to decode it: 28 bytes less per frame. Other blobs stay whole. */

typedef struct {
    unsigned char h[LF_BLOB_OVERHEAD];
    int set;
} lf_header;

/* Make the blob of n bytes in buf lean, in place, if its header matches t (which learns
 * the first header it is given): the new size, or n (the blob stays whole). */
size_t lf_lean(lf_header *t, unsigned char *buf, size_t n);

/* The whole blob of a lean one of n bytes, written to out (room for its whole size, at
 * most n + LF_BLOB_OVERHEAD - 3): its size, or 0 if the lean blob is malformed. */
size_t lf_unlean(const lf_header *t, const unsigned char *lean, size_t n, unsigned char *out);

/* Patches: how a pool stores a frame against its reference frame. A patch lists the runs
 * of bytes where the frame differs from the reference, each as (skip, len, the frame's len
 * bytes): skip counts the equal bytes since the previous run, skip and len are LEB128
 * varints. Runs fewer than LF_PATCH_GAP equal bytes apart are merged. A run of length 0
 * ends a patch (padding may follow: LF_KIND_PACKED_BLOSC's). Atari frames change
 * in a few small places, so a patch is smaller than LZ4 of the XOR delta (about 40% on
 * recorded frames, docs/COMPRESSION.md) and decodes as a copy of the reference and a few
 * memcpy, with no codec call. */
#define LF_PATCH_GAP 4

/* Write the patch of frame against base (n bytes each) to out, at most cap bytes: its
 * size, or (size_t)-1 if it would be longer than cap (nothing is promised about out then). */
size_t lf_patch_encode(const unsigned char *frame, const unsigned char *base, size_t n,
                       unsigned char *out, size_t cap);

/* out = base with the runs of a patch of pn bytes written over it (n bytes; out may be
 * base, else they do not overlap): 0, or -1 if the patch is malformed or reaches past n
 * bytes (out is then partly written, never past its n bytes). */
int lf_patch_apply(const unsigned char *patch, size_t pn, const unsigned char *base,
                   unsigned char *out, size_t n);

/* out = a ^ b, and out ^= b: a delta and its inverse (buffers do not overlap). */
void lf_xor_of(unsigned char *out, const unsigned char *a, const unsigned char *b, size_t n);
void lf_xor_into(unsigned char *out, const unsigned char *b, size_t n);

/* Containers: frames coded one after another, each blob of a kind (the values of
 * _core.KIND_*, docs/COMPRESSION.md). A keyframe (KEY or RAW) starts a group at position 0;
 * a PATCH, PACKED or XOR frame takes the next position pos of its group and is coded
 * against the group's frame at position pos - lowbit(pos) (a binary tree: a container is
 * decoded whole, and a pool adopts such blobs as they are, with those references,
 * lf_pool_adopt). A DELTA frame, of containers before 0.3, takes its position too but is
 * coded against the frame before it. */
enum {
    LF_KIND_KEY = 0,
    LF_KIND_DELTA = 1,
    LF_KIND_RAW = 2,
    LF_KIND_PATCH = 3,
    LF_KIND_XOR = 4,          /* made by the coder before packed patches; still read */
    LF_KIND_PACKED_BLOSC = 5, /* a Blosc2 chunk of a patch padded with zeros: made before
                               * LZ4 blocks (containers of version 5); still read */
    LF_KIND_PACKED = 6        /* a packed patch: the LZ4 block of a patch */
};

typedef struct {
    int64_t start;         /* index of the group's keyframe: {0, 0} before a container's
                            * first frame, {-g, g - 1} where it continues a group of g
                            * frames decoded before it (at indices -g to -1) */
    unsigned pos;          /* position of the last frame in its group */
} lf_tree;

/* The index of the frame a PATCH, PACKED or XOR frame would be coded against next. */
static inline int64_t lf_tree_ref(const lf_tree *t) {
    unsigned pos = t->pos + 1;
    return t->start + (int64_t)(pos & (pos - 1));
}

/* Frame i (the frames before it stepped through t) of kind `kind`: the index of its
 * reference frame (negative in the frames before), LF_TREE_KEY for a keyframe, or
 * LF_TREE_BAD if it cannot be: an unknown kind, or a delta with no frame before it or
 * past a full group of LF_MAX_GROUP frames. */
#define LF_TREE_KEY INT64_MIN
#define LF_TREE_BAD (INT64_MIN + 1)
static inline int64_t lf_tree_step(lf_tree *t, int64_t i, int kind) {
    if (kind == LF_KIND_KEY || kind == LF_KIND_RAW) {
        t->start = i;
        t->pos = 0;
        return LF_TREE_KEY;
    }
    int delta = kind == LF_KIND_DELTA;
    if (i <= t->start || t->pos + 1 >= LF_MAX_GROUP ||
        (!delta && kind != LF_KIND_PATCH && kind != LF_KIND_XOR && kind != LF_KIND_PACKED &&
         kind != LF_KIND_PACKED_BLOSC))
        return LF_TREE_BAD; /* no frame before it, a full group, an unknown kind */
    int64_t ref = delta ? i - 1 : lf_tree_ref(t);
    t->pos++; /* every frame of a group takes the next position: pos = i - start */
    return ref;
}

/* Decode one blob of `kind` (bn bytes) into out (n bytes): base is the decoded frame of
 * its reference (NULL for a keyframe) and may be out; delta: n bytes of scratch (a packed
 * patch or an XOR delta decoded there). 0, or -1 if the blob does not decode to n bytes. */
int lf_kind_decode(void *dctx, int kind, const unsigned char *blob, size_t bn,
                   const unsigned char *base, unsigned char *out, size_t n, unsigned char *delta);

/* What a coded frame is (the blob flags of a pool's slot, pool.h, share these bits). */
#define LF_BLOB_LEAN 1     /* a lean codec blob (above) */
#define LF_BLOB_PATCH 4    /* a delta applied as a patch (codec.c) */
#define LF_BLOB_CODED 8    /* a coded delta: with LF_BLOB_PATCH, a packed patch (an LZ4
                            * block); alone, a codec blob of the XOR of the frame and its
                            * reference */
#define LF_BLOB_PACKED (LF_BLOB_PATCH | LF_BLOB_CODED)
#define LF_BLOB_DELTA (LF_BLOB_PATCH | LF_BLOB_CODED) /* the bits that tell the deltas */

/* The container kind of a codec blob or delta's LF_BLOB_* bits. */
static inline int lf_coded_kind(unsigned flags) {
    switch (flags & LF_BLOB_DELTA) {
    case LF_BLOB_PACKED: return LF_KIND_PACKED;
    case LF_BLOB_PATCH: return LF_KIND_PATCH;
    case LF_BLOB_CODED: return LF_KIND_XOR;
    default: return LF_KIND_KEY;
    }
}

/* A patch is packed (LZ4 of it, an LZ4 block with no header: its size is the blob's, the
 * patch's the block's own) when that is at least LF_PACK_SAVES bytes smaller: busy
 * frames' patches hold runs of a few gray levels that LZ4 shrinks by half (Seaquest: more
 * than half its deltas), but a packed patch costs an LZ4 call to decode, which a few dozen bytes
 * do not pay for (docs/COMPRESSION.md, "Packed patches" and "LZ4 blocks": Seaquest's
 * compressed sample(32) 10% less CPU at 192 than at 128 for 24 more bytes per transition,
 * Pong, Breakout and MsPacman about unchanged). Every pool packs with LZ4 (acceleration
 * 1), whatever its codec: zstd saved next to nothing on patches for twice the decoding
 * time. */
#define LF_PACK_SAVES 192

/* LZ4 of a patch of pn bytes into dst, if that takes at most cap bytes: its size, or 0.
 * state: lf_pack_state_bytes() bytes. */
size_t lf_pack(void *state, const unsigned char *patch, size_t pn, unsigned char *dst, size_t cap);
size_t lf_pack_state_bytes(void);

/* A delta larger than an LF_DELTA_BIG-th of its frame (a scene change: Pong's frames
 * between points) is also tried as a keyframe, kept if at least LF_CODEC_SAVES bytes
 * smaller; so is a keyframe's patch against the pool's root. The codec's blob costs a
 * codec call to decode (zstd, the default codec: about 5 us for a busy frame) where a
 * patch costs copies (docs/COMPRESSION.md, "Chains, aliases and entropy where it pays"). */
#define LF_DELTA_BIG 8
#define LF_CODEC_SAVES 128

/* The coder of a compressing pool's frames of n bytes: a keyframe is the codec's blob, made
 * lean; a delta against its reference frame is a patch, packed (lf_pack) when that pays
 * (LF_PACK_SAVES), or the keyframe when that is much smaller (LF_DELTA_BIG). One coder per pool
 * (its buffers are the pool's scratch too); the benchmarks' codec floor runs one alone. */
typedef struct {
    size_t n;
    lf_codec codec;
    void *cctx;            /* keyframes' */
    void *fast;            /* with zstd, an LZ4 context for a container's keyframes (made
                            * by lf_coder_container), or NULL */
    void *pack_state;      /* lf_pack's */
    lf_header header;      /* the template of lean blobs */
    unsigned char *blob;   /* 2 (n + LF_BLOB_OVERHEAD): codec blobs (and a pool's decoding
                            * chunk) */
    unsigned char *patch;  /* n + LF_BLOB_OVERHEAD: a patch */
    unsigned char *delta;  /* n: a delta's scratch (a pool's decoding) */
} lf_coder;

/* 0, or -1 on out of memory (then lf_coder_free it); lf_coder_free accepts a zeroed coder. */
int lf_coder_init(lf_coder *c, lf_codec codec, size_t n);
void lf_coder_free(lf_coder *c);

/* Code frame (n bytes) as a keyframe (base NULL) or as a delta against base: the coded
 * bytes' size, *out pointing at them in the coder's buffers (valid until the next call),
 * and *kind the LF_BLOB_* bits (0 or LF_BLOB_LEAN: a keyframe, also when a delta would not
 * fit or the keyframe is LF_CODEC_SAVES bytes smaller; LF_BLOB_PATCH or LF_BLOB_PACKED: a
 * delta);
 * -1 if the codec failed (cannot happen: the buffers hold any frame). */
long lf_coder_encode(lf_coder *c, const unsigned char *frame, const unsigned char *base,
                     const unsigned char **out, unsigned char *kind);

/* Code frame as a keyframe of a pool with a root (pool.h, "Roots"): the delta against
 * root (as lf_coder_encode codes one), or the codec's keyframe if that is at least
 * LF_CODEC_SAVES bytes smaller, whatever the delta's size. Returns as lf_coder_encode. */
long lf_coder_encode_key(lf_coder *c, const unsigned char *frame, const unsigned char *root,
                         const unsigned char **out, unsigned char *kind);

/* Code m frames (c->n bytes each, one after another) into a container: a keyframe first,
 * at each i with keys[i] nonzero (keys may be NULL) and wherever a group of `group` frames
 * is full or a delta would not pay, the others patches or packed patches (lf_coder_encode)
 * against the group's tree (lf_tree_step), every blob whole (not lean). A container has no
 * root, so with zstd a keyframe is LZ4's blob unless zstd's is LF_CODEC_SAVES bytes
 * smaller: a pool that adopts it decodes it as fast as a pool's own. out: room for m (c->n +
 * LF_BLOB_OVERHEAD) bytes; blob i is out[offsets[i]:offsets[i + 1]], of kinds[i]. 0, or
 * -1 if the codec failed or on out of memory. */
int lf_coder_container(lf_coder *c, const unsigned char *frames, size_t m, int group,
                       const unsigned char *keys, unsigned char *out, int64_t *offsets,
                       uint8_t *kinds);

#ifdef __cplusplus
}
#endif
#endif
