/* The frame codec of lazyframes (see codec.h). */
#include "codec.h"

#include <blosc2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* compile-time checks (C99): the codec codes and a blob's overhead are Blosc2's */
typedef char lf_codes_are_blosc2s[(int)LF_CODEC_LZ4 == (int)BLOSC_LZ4 &&
                                          (int)LF_CODEC_LZ4HC == (int)BLOSC_LZ4HC &&
                                          (int)LF_CODEC_ZSTD == (int)BLOSC_ZSTD
                                      ? 1
                                      : -1];
typedef char lf_overhead_is_blosc2s[LF_BLOB_OVERHEAD == (int)BLOSC2_MAX_OVERHEAD ? 1 : -1];

/* LZ4's block API (lz4.h, stable since r129), from the LZ4 that libblosc2.a links in:
 * Blosc2 installs no lz4.h. A packed patch is one LZ4 block: a Blosc2 chunk around it
 * (header, block offsets, stream size) and Blosc2's per-call context set-up cost 14% of a
 * compressed Seaquest sample(32), whose deltas were then three in four packed patches of a
 * few hundred bytes. */
int LZ4_sizeofState(void);
int LZ4_compress_fast_extState(void *state, const char *src, char *dst, int src_size,
                               int dst_capacity, int acceleration);
int LZ4_decompress_safe(const char *src, char *dst, int compressed_size, int dst_capacity);

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

/* 1 if a chunk's header is one lf_compress makes: typesize 1, no filter, the codec LZ4,
 * LZ4HC or ZSTD (byte 22) with its format (the flags' top 3 bits; 0 for a small chunk
 * stored as a memcpy), the extended header's flags 0x05 (and maybe memcpyed 0x02, not
 * split 0x10), no special value but all-zero bytes. Blosc2 itself would also take chunks
 * that leave the output unwritten (special UNINIT) or that name a plugin codec or filter,
 * which it then looks for by starting a Python process. */
static int header_ours(const unsigned char *h) {
    int format = h[2] >> 5, flags = h[2] & 0x1F;
    if (h[3] != 1 || (flags | 0x12) != 0x17 || (h[31] != 0 && h[31] != 0x10)) return 0;
    if (h[22] != LF_CODEC_LZ4 && h[22] != LF_CODEC_LZ4HC && h[22] != LF_CODEC_ZSTD) return 0;
    if (format != BLOSC_LZ4_FORMAT && format != BLOSC_ZSTD_FORMAT &&
        !(format == 0 && (flags & BLOSC_MEMCPYED)))
        return 0;
    for (int i = 16; i < 31; i++)
        if (i != 22 && h[i]) return 0; /* filters, their meta, the second flags */
    return 1;
}

long lf_decompress_upto(void *dctx, const void *blob, size_t blob_bytes, void *dst,
                        size_t cap) {
    int32_t nbytes, cbytes, blocksize;
    if (blob_bytes < BLOSC_EXTENDED_HEADER_LENGTH || blob_bytes > (size_t)INT32_MAX ||
        !header_ours(blob))
        return -1;
    if (blosc2_cbuffer_sizes(blob, &nbytes, &cbytes, &blocksize) < 0 || nbytes < 0 ||
        (size_t)nbytes > cap || cbytes < 0 || (size_t)cbytes != blob_bytes)
        return -1;
    int r = blosc2_decompress_ctx((blosc2_context *)dctx, blob, (int32_t)blob_bytes, dst,
                                  nbytes);
    return r == nbytes ? (long)r : -1;
}

int lf_decompress(void *dctx, const void *blob, size_t blob_bytes, void *dst, size_t n) {
    if (n > (size_t)INT32_MAX) return -1;
    return lf_decompress_upto(dctx, blob, blob_bytes, dst, n) == (long)n ? 0 : -1;
}

/* -- varints, of lean blobs and patches ---------------------------------------------- */

static size_t varint_len(size_t v) {
    size_t n = 1;
    while (v >= 128) {
        v >>= 7;
        n++;
    }
    return n;
}

static size_t put_varint(unsigned char *out, size_t v) {
    size_t n = 0;
    while (v >= 128) {
        out[n++] = (unsigned char)(v | 128);
        v >>= 7;
    }
    out[n++] = (unsigned char)v;
    return n;
}

/* Read a varint at p[*r] (pn bytes in all) into *v, advancing *r: 0, or -1 if it runs
 * past the end or past 64 bits. */
static int get_varint(const unsigned char *p, size_t pn, size_t *r, size_t *v) {
    uint64_t x = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        if (*r >= pn) return -1;
        unsigned char c = p[(*r)++];
        if (shift == 63 && (c & 126)) return -1; /* bits past 64 */
        x |= (uint64_t)(c & 127) << shift;
        if (!(c & 128)) {
            if (x > SIZE_MAX) return -1;
            *v = (size_t)x;
            return 0;
        }
    }
    return -1;
}

/* -- lean blobs (codec.h) --------------------------------------------------------------- */

/* header bytes that differ between the blobs of one context: the flags and the sizes */
static int lf_varies(size_t i) {
    return i == 2 || (i >= 4 && i < 16) || i == 31;
}

static uint32_t le32(const unsigned char *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static void put_le32(unsigned char *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}

size_t lf_lean(lf_header *t, unsigned char *buf, size_t n) {
    if (n < LF_BLOB_OVERHEAD || le32(buf + 4) != le32(buf + 8) || le32(buf + 12) != n)
        return n; /* (a blob of blocks: its own block size) */
    if (!t->set) {
        memcpy(t->h, buf, LF_BLOB_OVERHEAD);
        t->set = 1;
    }
    for (size_t i = 0; i < LF_BLOB_OVERHEAD; i++)
        if (!lf_varies(i) && buf[i] != t->h[i]) return n;
    unsigned char head[2 + 5];
    head[0] = buf[2];
    head[1] = buf[31];
    size_t h = 2 + put_varint(head + 2, le32(buf + 4));
    memmove(buf + h, buf + LF_BLOB_OVERHEAD, n - LF_BLOB_OVERHEAD);
    memcpy(buf, head, h);
    return n - LF_BLOB_OVERHEAD + h;
}

size_t lf_unlean(const lf_header *t, const unsigned char *lean, size_t n, unsigned char *out) {
    size_t r = 2, nbytes;
    if (n < 2 || get_varint(lean, n, &r, &nbytes) || nbytes > INT32_MAX) return 0;
    size_t whole = n - r + LF_BLOB_OVERHEAD;
    if (whole > INT32_MAX) return 0;
    memcpy(out, t->h, LF_BLOB_OVERHEAD);
    out[2] = lean[0];
    out[31] = lean[1];
    put_le32(out + 4, (uint32_t)nbytes);
    put_le32(out + 8, (uint32_t)nbytes);
    put_le32(out + 12, (uint32_t)whole);
    memcpy(out + LF_BLOB_OVERHEAD, lean + r, n - r);
    return whole;
}

/* -- patches (codec.h) ---------------------------------------------------------------- */

/* compile-time check (C99): the word test of run_end looks for 4 equal bytes */
typedef char lf_gap_is_4[LF_PATCH_GAP == 4 ? 1 : -1];

#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define LF_WORD_SCAN 1 /* run_end reads 8 bytes at a time (needs ctz/clz and little-endian) */
/* 0x80 in each byte of x that is zero, 0 in the others (no carries between bytes). */
static inline uint64_t zero_bytes(uint64_t x) {
    const uint64_t low7 = 0x7F7F7F7F7F7F7F7FULL;
    return ~(((x & low7) + low7) | x | low7);
}
#endif

/* The end of the run whose last differing byte so far is end - 1: past its last differing
 * byte before the first LF_PATCH_GAP (4) equal bytes in a row. Eight bytes at a time: the
 * windows of 4 equal bytes starting in the first 5 bytes of a word, else on from the
 * word's last differing byte (there is one in its last 4 bytes). */
static size_t run_end(const unsigned char *f, const unsigned char *b, size_t n, size_t end) {
    size_t j = end;
#ifdef LF_WORD_SCAN
    while (j + 8 <= n) {
        uint64_t x, y;
        memcpy(&x, f + j, 8);
        memcpy(&y, b + j, 8);
        uint64_t eq = zero_bytes(x ^ y); /* little-endian: byte i of the word at bits 8i.. */
        uint64_t gap = eq & (eq >> 8) & (eq >> 16) & (eq >> 24) & 0x8080808080ULL;
        uint64_t diff = ~eq & 0x8080808080808080ULL;
        if (gap) {
            unsigned at = (unsigned)__builtin_ctzll(gap) / 8; /* the first window's start */
            diff &= at ? (~0ULL >> (64 - 8 * at)) : 0;          /* differing bytes before it */
            return diff ? j + (63 - (unsigned)__builtin_clzll(diff)) / 8 + 1 : end;
        }
        end = j + (63 - (unsigned)__builtin_clzll(diff)) / 8 + 1;
        j = end;
    }
#endif
    for (; j < n && j - end < LF_PATCH_GAP; j++)
        if (f[j] != b[j]) end = j + 1;
    return end;
}

size_t lf_patch_encode(const unsigned char *restrict f, const unsigned char *restrict b,
                       size_t n, unsigned char *restrict out, size_t cap) {
    size_t i = 0, w = 0, last = 0;
    for (;;) {
        uint64_t x, y; /* skip equal 8-byte words, then bytes */
        while (i + 8 <= n && (memcpy(&x, f + i, 8), memcpy(&y, b + i, 8), x == y)) i += 8;
        while (i < n && f[i] == b[i]) i++;
        if (i >= n) return w;
        size_t start = i, end = run_end(f, b, n, i + 1);
        size_t len = end - start;
        if (varint_len(start - last) + varint_len(len) + len > cap - w) return (size_t)-1;
        w += put_varint(out + w, start - last);
        w += put_varint(out + w, len);
        memcpy(out + w, f + start, len);
        w += len;
        last = i = end;
    }
}

/* memcpy of a patch's run: most runs are a few bytes, which fixed-size copies (two that
 * may overlap) write without a call. */
static inline void copy_run(unsigned char *dst, const unsigned char *src, size_t len) {
    if (len >= 8 && len <= 16) {
        memcpy(dst, src, 8);
        memcpy(dst + len - 8, src + len - 8, 8);
    } else if (len >= 4 && len < 8) {
        memcpy(dst, src, 4);
        memcpy(dst + len - 4, src + len - 4, 4);
    } else if (len > 16) {
        memcpy(dst, src, len);
    } else {
        for (size_t i = 0; i < len; i++) dst[i] = src[i];
    }
}

#ifdef __SSE2__
/* A run of len <= 16 bytes, 16 of the patch readable from its start and 16 of the frame
 * from pos: one 16-byte store of the run's bytes then base's after them (a mask from
 * lf_run_mask + 16 - len), where copy_run branches on the length, which the runs of a busy
 * frame vary at random. base's bytes are the frame's there (out starts as a copy of base,
 * and runs are applied in increasing order, each over what the one before wrote past it). */
static const unsigned char lf_run_mask[32] = {
    255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255};

static inline void blend_run(unsigned char *out, const unsigned char *run,
                             const unsigned char *base, size_t len) {
    __m128i m = _mm_loadu_si128((const __m128i *)(lf_run_mask + 16 - len));
    __m128i v = _mm_loadu_si128((const __m128i *)run);
    __m128i b = _mm_loadu_si128((const __m128i *)base);
    _mm_storeu_si128((__m128i *)out, _mm_or_si128(_mm_and_si128(m, v), _mm_andnot_si128(m, b)));
}
#endif

int lf_patch_apply(const unsigned char *patch, size_t pn, const unsigned char *base,
                   unsigned char *out, size_t n) {
    if (out != base) memcpy(out, base, n);
    size_t r = 0, pos = 0, skip, len;
    while (r < pn) {
        if (r + 2 <= pn && !((patch[r] | patch[r + 1]) & 128)) { /* both one byte: most runs */
            skip = patch[r];
            len = patch[r + 1];
            r += 2;
        } else if (get_varint(patch, pn, &r, &skip) || get_varint(patch, pn, &r, &len)) {
            return -1;
        }
        if (skip > n - pos) return -1;
        if (len == 0) break; /* the end of a padded patch (no run is empty) */
        pos += skip;
        if (len > n - pos || len > pn - r) return -1;
#ifdef __SSE2__
        if (len <= 16 && n - pos >= 16 && pn - r >= 16)
            blend_run(out + pos, patch + r, base + pos, len);
        else
#endif
            copy_run(out + pos, patch + r, len);
        r += len;
        pos += len;
    }
    return 0;
}

size_t lf_pack_state_bytes(void) {
    return (size_t)LZ4_sizeofState();
}

size_t lf_pack(void *state, const unsigned char *patch, size_t pn, unsigned char *dst, size_t cap) {
    if (pn > INT32_MAX || cap == 0) return 0;
    int r = LZ4_compress_fast_extState(state, (const char *)patch, (char *)dst, (int)pn,
                                       cap > INT32_MAX ? INT32_MAX : (int)cap, 1);
    return r > 0 ? (size_t)r : 0;
}

int lf_kind_decode(void *dctx, int kind, const unsigned char *blob, size_t bn,
                   const unsigned char *base, unsigned char *out, size_t n, unsigned char *delta) {
    switch (kind) {
    case LF_KIND_KEY:
        return lf_decompress(dctx, blob, bn, out, n);
    case LF_KIND_RAW:
        if (bn != n) return -1;
        memcpy(out, blob, n);
        return 0;
    case LF_KIND_PATCH:
        return base ? lf_patch_apply(blob, bn, base, out, n) : -1;
    case LF_KIND_PACKED:
    case LF_KIND_PACKED_BLOSC: { /* the patch into delta (at most n bytes), then applied */
        long pn = !base                       ? -1
                  : kind == LF_KIND_PACKED_BLOSC ? lf_decompress_upto(dctx, blob, bn, delta, n)
                  : bn <= INT32_MAX && n <= INT32_MAX /* LZ4 fails on a malformed block */
                      ? LZ4_decompress_safe((const char *)blob, (char *)delta, (int)bn, (int)n)
                      : -1;
        return pn < 0 ? -1 : lf_patch_apply(delta, (size_t)pn, base, out, n);
    }
    case LF_KIND_DELTA:
    case LF_KIND_XOR:
        if (!base || lf_decompress(dctx, blob, bn, delta, n)) return -1;
        if (out == base)
            lf_xor_into(out, delta, n);
        else
            lf_xor_of(out, delta, base, n);
        return 0;
    default:
        return -1;
    }
}

void lf_xor_of(unsigned char *restrict out, const unsigned char *restrict a,
               const unsigned char *restrict b, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = a[i] ^ b[i];
}

void lf_xor_into(unsigned char *restrict out, const unsigned char *restrict b, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] ^= b[i];
}

/* -- the coder of a pool's frames ------------------------------------------------------- */

int lf_coder_init(lf_coder *c, lf_codec codec, size_t n) {
    memset(c, 0, sizeof(*c));
    c->n = n;
    c->codec = codec;
    c->cctx = lf_cctx_new(codec);
    c->pack_state = malloc(lf_pack_state_bytes());
    c->blob = malloc(2 * (n + LF_BLOB_OVERHEAD));
    c->patch = malloc(n + LF_BLOB_OVERHEAD);
    c->delta = malloc(n);
    return c->cctx && c->pack_state && c->blob && c->patch && c->delta ? 0 : -1;
}

void lf_coder_free(lf_coder *c) {
    lf_ctx_free(c->cctx);
    lf_ctx_free(c->fast);
    free(c->pack_state);
    free(c->blob);
    free(c->patch);
    free(c->delta);
    memset(c, 0, sizeof(*c));
}

/* The codec's blob of a keyframe (c->n bytes of src) in dst, made lean if it can be: its
 * size. (A Blosc2 context keeps the block size of its first call and makes its buffers
 * again for a buffer of another size: the context codes keyframes only.) */
static long codec_blob(lf_coder *c, const unsigned char *src, unsigned char *kind,
                       unsigned char *dst) {
    long whole = lf_compress(c->cctx, src, c->n, dst);
    if (whole < 0) return -1;
    size_t l = lf_lean(&c->header, dst, (size_t)whole);
    *kind = l < (size_t)whole ? LF_BLOB_LEAN : 0;
    return (long)l;
}

/* lf_coder_encode, with the keyframe tried for a delta larger than `big` bytes. */
static long encode(lf_coder *c, const unsigned char *frame, const unsigned char *base,
                   size_t big, const unsigned char **out, unsigned char *kind) {
    size_t n = c->n;
    if (base) {
        size_t pn = lf_patch_encode(frame, base, n, c->patch, n + LF_BLOB_OVERHEAD);
        if (pn != (size_t)-1) {
            long best = (long)pn;
            *out = c->patch;
            *kind = LF_BLOB_PATCH;
            size_t x = pn > LF_PACK_SAVES && pn <= n
                           ? lf_pack(c->pack_state, c->patch, pn, c->blob, pn - LF_PACK_SAVES)
                           : 0;
            if (x) {
                best = (long)x;
                *out = c->blob;
                *kind = LF_BLOB_PACKED;
            }
            if ((size_t)best <= big) return best;
            /* the keyframe may be smaller (after the packed patch) */
            unsigned char *key = c->blob + n + LF_BLOB_OVERHEAD, lean;
            long k = codec_blob(c, frame, &lean, key);
            if (k < 0) return -1;
            if (k + LF_CODEC_SAVES > best) return best;
            *out = key;
            *kind = lean;
            return k;
        }
    }
    *out = c->blob;
    return codec_blob(c, frame, kind, c->blob);
}

long lf_coder_encode(lf_coder *c, const unsigned char *frame, const unsigned char *base,
                     const unsigned char **out, unsigned char *kind) {
    return encode(c, frame, base, c->n / LF_DELTA_BIG, out, kind); /* big: a scene change */
}

long lf_coder_encode_key(lf_coder *c, const unsigned char *frame, const unsigned char *root,
                         const unsigned char **out, unsigned char *kind) {
    return encode(c, frame, root, 0, out, kind);
}

int lf_coder_container(lf_coder *c, const unsigned char *frames, size_t m, int group,
                       const unsigned char *keys, unsigned char *out, int64_t *offsets,
                       uint8_t *kinds) {
    size_t n = c->n;
    lf_tree t = {0, 0};
    if (c->codec.codec == LF_CODEC_ZSTD && !c->fast) /* made here: pools never use it */
        if (!(c->fast = lf_cctx_new((lf_codec){LF_CODEC_LZ4, 9, c->codec.group}))) return -1;
    offsets[0] = 0;
    for (size_t i = 0; i < m; i++) {
        const unsigned char *base = NULL, *blob;
        if (i > 0 && !(keys && keys[i]) && t.pos + 1 < (unsigned)group)
            base = frames + (size_t)lf_tree_ref(&t) * n;
        unsigned char kind;
        long r = lf_coder_encode(c, frames + i * n, base, &blob, &kind);
        if (r < 0) return -1;
        kinds[i] = (uint8_t)lf_coded_kind(kind);
        lf_tree_step(&t, (int64_t)i, kinds[i]);
        unsigned char *dst = out + offsets[i];
        size_t w = (size_t)r;
        if (kind & LF_BLOB_LEAN)
            w = lf_unlean(&c->header, blob, w, dst);
        else
            memcpy(dst, blob, w);
        if (c->fast && !(kind & LF_BLOB_DELTA)) { /* a keyframe: LZ4's blob unless zstd's */
            long f = lf_compress(c->fast, frames + i * n, n, c->patch); /* saves enough */
            if (f < 0) return -1;
            if ((size_t)f < w + LF_CODEC_SAVES) {
                memcpy(dst, c->patch, (size_t)f);
                w = (size_t)f;
            }
        }
        offsets[i + 1] = offsets[i] + (int64_t)w;
    }
    return 0;
}
