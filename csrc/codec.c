/* The frame codec of lazyframes (see codec.h). */
#include "codec.h"

#include <blosc2.h>
#include <stdint.h>
#include <string.h>

/* compile-time checks (C99): the codec codes and a blob's overhead are Blosc2's */
typedef char lf_codes_are_blosc2s[(int)LF_CODEC_LZ4 == (int)BLOSC_LZ4 &&
                                          (int)LF_CODEC_LZ4HC == (int)BLOSC_LZ4HC &&
                                          (int)LF_CODEC_ZSTD == (int)BLOSC_ZSTD
                                      ? 1
                                      : -1];
typedef char lf_overhead_is_blosc2s[LF_BLOB_OVERHEAD == (int)BLOSC2_MAX_OVERHEAD ? 1 : -1];

void lf_codec_init(void) {
    blosc2_init();
}

int lf_codec_valid(lf_codec c, size_t frame_bytes) {
    return (c.codec == LF_CODEC_LZ4 || c.codec == LF_CODEC_LZ4HC || c.codec == LF_CODEC_ZSTD) &&
           c.level >= 1 && c.level <= 9 && c.group >= 1 && c.group <= LF_MAX_GROUP &&
           frame_bytes <= (size_t)BLOSC2_MAX_BUFFERSIZE;
}

void *lf_cctx_new(lf_codec c) {
    blosc2_cparams cp = BLOSC2_CPARAMS_DEFAULTS;
    cp.compcode = (uint8_t)c.codec;
    cp.clevel = (uint8_t)c.level;
    cp.typesize = 1; /* bytes and XOR deltas: no shuffle, no filter */
    cp.nthreads = 1;
    cp.splitmode = BLOSC_NEVER_SPLIT;
    for (int i = 0; i < BLOSC2_MAX_FILTERS; i++) cp.filters[i] = BLOSC_NOFILTER;
    return blosc2_create_cctx(cp);
}

void *lf_dctx_new(void) {
    blosc2_dparams dp = BLOSC2_DPARAMS_DEFAULTS;
    dp.nthreads = 1;
    return blosc2_create_dctx(dp);
}

void lf_ctx_free(void *ctx) {
    if (ctx) blosc2_free_ctx((blosc2_context *)ctx);
}

long lf_compress(void *cctx, const void *src, size_t n, void *dst) {
    int r = blosc2_compress_ctx((blosc2_context *)cctx, src, (int32_t)n, dst,
                                (int32_t)(n + LF_BLOB_OVERHEAD));
    return r > 0 ? (long)r : -1;
}

int lf_decompress(void *dctx, const void *blob, size_t blob_bytes, void *dst, size_t n) {
    int32_t nbytes, cbytes, blocksize;
    if (blob_bytes < BLOSC_MIN_HEADER_LENGTH || blob_bytes > (size_t)INT32_MAX ||
        n > (size_t)INT32_MAX)
        return -1;
    if (blosc2_cbuffer_sizes(blob, &nbytes, &cbytes, &blocksize) < 0 || nbytes < 0 ||
        (size_t)nbytes != n || cbytes < 0 || (size_t)cbytes != blob_bytes)
        return -1;
    int r = blosc2_decompress_ctx((blosc2_context *)dctx, blob, (int32_t)blob_bytes, dst,
                                  (int32_t)n);
    return r >= 0 && (size_t)r == n ? 0 : -1;
}

/* header bytes that differ between the blobs of one context */
static int lf_varies(size_t i) {
    return i == 2 || (i >= 12 && i < 16) || i == 31;
}

size_t lf_lean(lf_header *t, unsigned char *buf, size_t n) {
    if (n < LF_BLOB_OVERHEAD) return n;
    if (!t->set) {
        memcpy(t->h, buf, LF_BLOB_OVERHEAD);
        t->set = 1;
    }
    for (size_t i = 0; i < LF_BLOB_OVERHEAD; i++)
        if (!lf_varies(i) && buf[i] != t->h[i]) return n;
    unsigned char flags = buf[2], flags2 = buf[31];
    memmove(buf + 2, buf + LF_BLOB_OVERHEAD, n - LF_BLOB_OVERHEAD);
    buf[0] = flags;
    buf[1] = flags2;
    return n - LF_LEAN_SAVED;
}

size_t lf_unlean(const lf_header *t, const unsigned char *lean, size_t n, unsigned char *out) {
    size_t whole = n + LF_LEAN_SAVED;
    uint32_t cbytes = (uint32_t)whole;
    memcpy(out, t->h, LF_BLOB_OVERHEAD);
    out[2] = lean[0];
    out[31] = lean[1];
    for (int i = 0; i < 4; i++) out[12 + i] = (unsigned char)(cbytes >> (8 * i)); /* LE */
    memcpy(out + LF_BLOB_OVERHEAD, lean + 2, n - 2);
    return whole;
}

void lf_xor_of(unsigned char *restrict out, const unsigned char *restrict a,
               const unsigned char *restrict b, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = a[i] ^ b[i];
}

void lf_xor_into(unsigned char *restrict out, const unsigned char *restrict b, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] ^= b[i];
}
