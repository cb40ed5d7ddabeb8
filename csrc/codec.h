/* The frame codec of lazyframes: C-Blosc2 (lz4, lz4hc or zstd) on one frame's bytes, and
 * the XOR that makes a frame a delta against another. The only file that includes
 * blosc2.h; the rest of the core sees opaque contexts. See docs/COMPRESSION.md.
 *
 * A blob is one Blosc2 chunk: a 32-byte header (LF_BLOB_OVERHEAD) then the payload.
 * Contexts are not shared between threads: one compression context per pool (used with
 * the GIL held), one decompression context per call or thread.
 */
#ifndef LAZYFRAMES_CODEC_H
#define LAZYFRAMES_CODEC_H

#include <stddef.h>

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
                            * from 1 + log2(group) blobs at most, a container from group) */
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

/* Lean blobs. The blobs of one compression context share all of Blosc2's 32-byte chunk
 * header but its compressed size (bytes 12-15) and two flag bytes (2 and 31). A pool
 * stores a blob whose header matches its template (the first header it saw) as those
 * two flag bytes then the payload, and rebuilds the header to decode it: 30 bytes less
 * per frame. A blob whose header differs anywhere else stays whole. */
#define LF_LEAN_SAVED (LF_BLOB_OVERHEAD - 2)

typedef struct {
    unsigned char h[LF_BLOB_OVERHEAD];
    int set;
} lf_header;

/* Make the blob of n bytes in buf lean, in place, if its header matches t (which learns
 * the first header it is given): the new size, or n (the blob stays whole). */
size_t lf_lean(lf_header *t, unsigned char *buf, size_t n);

/* The whole blob of a lean one of n bytes, written to out (room for n + LF_LEAN_SAVED). */
size_t lf_unlean(const lf_header *t, const unsigned char *lean, size_t n, unsigned char *out);

/* Patches: how a pool stores a frame against its reference frame. A patch lists the runs
 * of bytes where the frame differs from the reference, each as (skip, len, the frame's len
 * bytes): skip counts the equal bytes since the previous run, skip and len are LEB128
 * varints. Runs fewer than LF_PATCH_GAP equal bytes apart are merged. Atari frames change
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

#ifdef __cplusplus
}
#endif
#endif
