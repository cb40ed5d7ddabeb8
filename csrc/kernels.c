/* Plain-C copy kernels of lazyframes (see kernels.h). */
#include "kernels.h"

#include <stdbool.h>
#include <string.h>

static const size_t type_sizes[LF_NTYPES] = {
    sizeof(bool), 1, 1, 2, 2, 4, 4, 8, 8, 4, 8,
};

size_t lf_type_size(int t) {
    return (t >= 0 && t < LF_NTYPES) ? type_sizes[t] : 0;
}

/* Rows p0..p1 of the k frames fr[0..k-1] interleaved into dst (which receives row p0
 * at its start): row p of frame j lands at ((p - p0) * k + j) * inner_bytes. This is
 * the "last" layout; the Atari case (k = 4, one byte per element and channel) and
 * small power-of-two rows have loops the compiler vectorises. */
#define LF_STRIDED(T)                                                              \
    for (size_t j = 0; j < k; j++) {                                               \
        const T *restrict f = (const T *)fr[j] + p0;                               \
        T *restrict d = (T *)dst + j;                                              \
        for (size_t p = 0; p < n; p++) d[p * k] = f[p];                            \
    }

static void interleave(const unsigned char *const *fr, size_t k, size_t p0, size_t p1,
                       size_t inner_bytes, unsigned char *restrict dst) {
    const size_t n = p1 - p0;
    if (inner_bytes == 1 && k == 4) {
        const uint8_t *restrict f0 = fr[0] + p0, *restrict f1 = fr[1] + p0;
        const uint8_t *restrict f2 = fr[2] + p0, *restrict f3 = fr[3] + p0;
        for (size_t p = 0; p < n; p++) {
            dst[4 * p] = f0[p];
            dst[4 * p + 1] = f1[p];
            dst[4 * p + 2] = f2[p];
            dst[4 * p + 3] = f3[p];
        }
    } else if (inner_bytes == 1) {
        LF_STRIDED(uint8_t)
    } else if (inner_bytes == 2) {
        LF_STRIDED(uint16_t)
    } else if (inner_bytes == 4) {
        LF_STRIDED(uint32_t)
    } else if (inner_bytes == 8) {
        LF_STRIDED(uint64_t)
    } else {
        for (size_t j = 0; j < k; j++)
            for (size_t p = 0; p < n; p++)
                memcpy(dst + (p * k + j) * inner_bytes, fr[j] + (p0 + p) * inner_bytes,
                       inner_bytes);
    }
}

/* Identity copy: one memcpy per frame for "first"/"stack" (outer == 1). */
static void copy_raw(const unsigned char *const *src, size_t n_obs, size_t k,
                     size_t outer, size_t inner_bytes, unsigned char *dst) {
    const size_t obs_bytes = outer * k * inner_bytes;
    for (size_t b = 0; b < n_obs; b++) {
        unsigned char *o = dst + b * obs_bytes;
        const unsigned char *const *fr = src + b * k;
        if (outer == 1)
            for (size_t j = 0; j < k; j++) memcpy(o + j * inner_bytes, fr[j], inner_bytes);
        else
            interleave(fr, k, 0, outer, inner_bytes, o);
    }
}

/* Bytes of the on-stack tile a converting "last"-layout copy interleaves into before
 * converting: cache-resident, so the conversion stays fused into the one copy out. */
#define LF_TILE_BYTES 16384

/* The conversions to float (what a float32 sample of uint8 frames spends most of its
 * time in) are built twice where the toolchain can dispatch at load time (GCC or Clang,
 * x86-64, glibc's ifunc): for the baseline x86-64 (SSE2) and for AVX2, which converts 8
 * bytes a step instead of 4. The values are the same (each element one conversion and
 * one IEEE multiply or divide; nothing is fused), the module still runs on any x86-64.
 * (Which NaN payload a NaN value times a NaN scale gives depends on the instructions, as
 * it did between the SSE2 loop's vector body and its scalar tail.)
 * Measured on an AMD EPYC (Zen 4), 256 frames of 84x84 into float32: 213 -> 107 us
 * from the cache (a compressed pool's decoded frames), 413 -> 342 us from a 113 MB
 * pool. AVX-512 gained 6-8% more and downclocks some Intel cores: not built. */
#if defined(__has_feature) /* Clang's way of saying it builds for ThreadSanitizer */
#if __has_feature(thread_sanitizer)
#define LF_TSAN 1
#endif
#endif
/* LF_NO_CLONES: the baseline build alone (tests/sanitize.sh runs the kernel tests on it,
 * which an AVX2 host's dispatch never picks); TSan: its runtime starts after ifuncs */
#if defined(LF_NO_CLONES) || defined(__SANITIZE_THREAD__) || defined(LF_TSAN)
#define LF_CLONES
#elif defined(__x86_64__) && defined(__GLIBC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define LF_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef LF_CLONES
#define LF_CLONES
#endif

/* Contiguous conversion of n elements for one (source, destination) type pair; the
 * scale (MUL, or DIV for LF_DIVIDE, expressions of `v` and `sc`) is applied element by
 * element. ATTR: the function's attributes (LF_CLONES or none). */
#define LF_CONVERT_EXPR(NAME, ST, DT, MUL, DIV, ATTR)                                 \
    ATTR static void NAME(const void *src_, size_t n, double scale, int has_scale,     \
                          void *dst_) {                                                \
        const ST *restrict s = (const ST *)src_;                                       \
        DT *restrict d = (DT *)dst_;                                                   \
        const DT sc = (DT)scale;                                                       \
        (void)sc;                                                                      \
        if (has_scale == LF_DIVIDE)                                                    \
            for (size_t i = 0; i < n; i++) {                                           \
                DT v = (DT)s[i];                                                       \
                d[i] = DIV;                                                            \
            }                                                                          \
        else if (has_scale)                                                            \
            for (size_t i = 0; i < n; i++) {                                           \
                DT v = (DT)s[i];                                                       \
                d[i] = MUL;                                                            \
            }                                                                          \
        else                                                                           \
            for (size_t i = 0; i < n; i++) d[i] = (DT)s[i];                            \
    }
/* Float destinations scale in their own precision: (DT)v * (DT)scale, as NumPy's
 * arr.astype(DT) * DT(scale), or (DT)v / (DT)scale, as arr.astype(DT) / DT(scale)
 * (correctly rounded: never a multiply by the rounded reciprocal). Others never scale
 * (lf_supported refuses). */
#define LF_CONVERT(NAME, ST, DT) LF_CONVERT_EXPR(NAME, ST, DT, v, v, )
#define LF_CONVERT_F(NAME, ST, DT) LF_CONVERT_EXPR(NAME, ST, DT, v * sc, v / sc, LF_CLONES)

typedef void (*convert_fn)(const void *, size_t, double, int, void *);

/* All pairs among the 11 C types; the Python layer only asks for NumPy's
 * "same_kind" casts (no float -> int), where C's conversions equal NumPy's. */
#define LF_ROW(SN, ST)                                                        \
    LF_CONVERT(cv_##SN##_bool, ST, bool)                                      \
    LF_CONVERT(cv_##SN##_i8, ST, int8_t)                                      \
    LF_CONVERT(cv_##SN##_u8, ST, uint8_t)                                     \
    LF_CONVERT(cv_##SN##_i16, ST, int16_t)                                    \
    LF_CONVERT(cv_##SN##_u16, ST, uint16_t)                                   \
    LF_CONVERT(cv_##SN##_i32, ST, int32_t)                                    \
    LF_CONVERT(cv_##SN##_u32, ST, uint32_t)                                   \
    LF_CONVERT(cv_##SN##_i64, ST, int64_t)                                    \
    LF_CONVERT(cv_##SN##_u64, ST, uint64_t)                                   \
    LF_CONVERT_F(cv_##SN##_f32, ST, float)                                    \
    LF_CONVERT_F(cv_##SN##_f64, ST, double)

#define LF_FNS(SN)                                                                   \
    {cv_##SN##_bool, cv_##SN##_i8, cv_##SN##_u8, cv_##SN##_i16, cv_##SN##_u16,       \
     cv_##SN##_i32, cv_##SN##_u32, cv_##SN##_i64, cv_##SN##_u64, cv_##SN##_f32,      \
     cv_##SN##_f64}

LF_ROW(bool, bool)
LF_ROW(i8, int8_t)
LF_ROW(u8, uint8_t)
LF_ROW(i16, int16_t)
LF_ROW(u16, uint16_t)
LF_ROW(i32, int32_t)
LF_ROW(u32, uint32_t)
LF_ROW(i64, int64_t)
LF_ROW(u64, uint64_t)
LF_ROW(f32, float)
LF_ROW(f64, double)

static const convert_fn converters[LF_NTYPES][LF_NTYPES] = {
    LF_FNS(bool), LF_FNS(i8),  LF_FNS(u8),  LF_FNS(i16), LF_FNS(u16), LF_FNS(i32),
    LF_FNS(u32),  LF_FNS(i64), LF_FNS(u64), LF_FNS(f32), LF_FNS(f64),
};

int lf_supported(int src_type, int dst_type, int has_scale) {
    if (src_type == dst_type && !has_scale)
        return 1; /* including LF_RAW */
    if (src_type < 0 || src_type >= LF_NTYPES || dst_type < 0 || dst_type >= LF_NTYPES)
        return 0;
    if (has_scale && dst_type != LF_FLOAT32 && dst_type != LF_FLOAT64)
        return 0;
    return 1;
}

int lf_unscale_u8(const float *src, size_t n, float divisor, uint8_t *dst) {
    for (size_t i = 0; i < n; i++) {
        const float v = src[i];
        if (!(v >= 0.0f && v <= 255.0f / divisor)) /* also NaN */
            return -1;
        const float x = v * divisor + 0.5f;
        const uint8_t b = (uint8_t)(x < 255.0f ? x : 255.0f);
        if ((float)b / divisor != v)
            return -1;
        dst[i] = b;
    }
    return 0;
}

int lf_copy_stacks(const unsigned char *const *src, size_t n_obs, size_t k,
                   size_t outer, size_t inner, int src_type, int dst_type,
                   size_t itemsize, double scale, int has_scale, void *dst) {
    if (!lf_supported(src_type, dst_type, has_scale))
        return -1;
    if (src_type == dst_type && !has_scale) {
        size_t isz = src_type == LF_RAW ? itemsize : lf_type_size(src_type);
        copy_raw(src, n_obs, k, outer, inner * isz, (unsigned char *)dst);
        return 0;
    }
    const convert_fn cv = converters[src_type][dst_type];
    const size_t ssz = lf_type_size(src_type), dsz = lf_type_size(dst_type);
    const size_t n = outer * inner; /* elements of one frame */
    unsigned char *o = (unsigned char *)dst;
    if (outer == 1) {
        /* "first"/"stack": each frame converts straight into its block */
        for (size_t i = 0; i < n_obs * k; i++, o += n * dsz)
            cv(src[i], n, scale, has_scale, o);
        return 0;
    }
    /* "last": interleave a cache-sized tile of rows, then convert it contiguously */
    unsigned char tile[LF_TILE_BYTES];
    const size_t row = k * inner * ssz; /* bytes of one output row, source type */
    for (size_t b = 0; b < n_obs; b++) {
        const unsigned char *const *fr = src + b * k;
        if (row > LF_TILE_BYTES) { /* huge rows: convert piecewise per frame row */
            for (size_t p = 0; p < outer; p++)
                for (size_t j = 0; j < k; j++, o += inner * dsz)
                    cv(fr[j] + p * inner * ssz, inner, scale, has_scale, o);
            continue;
        }
        const size_t rows = LF_TILE_BYTES / row;
        for (size_t p0 = 0; p0 < outer; p0 += rows) {
            size_t p1 = p0 + rows < outer ? p0 + rows : outer;
            /* rows p0..p1 of frame j start at fr[j] + p0 * inner * ssz: interleave
             * takes element offsets in units of inner_bytes, which is row p0 */
            interleave(fr, k, p0, p1, inner * ssz, tile);
            cv(tile, (p1 - p0) * k * inner, scale, has_scale, o);
            o += (p1 - p0) * k * inner * dsz;
        }
    }
    return 0;
}

/* (a static clone and a call: GCC gives a cloned function's resolver default visibility) */
LF_CLONES static void convert_floor(const unsigned char *const *src, size_t m, size_t fb,
                                    float scale, float *dst) {
    for (size_t i = 0; i < m; i++, dst += fb) {
        const unsigned char *restrict f = src[i];
        float *restrict d = dst;
        for (size_t j = 0; j < fb; j++) d[j] = (float)f[j] * scale;
    }
}

void lf_convert_floor(const unsigned char *const *src, size_t m, size_t fb, float scale,
                      float *dst) {
    convert_floor(src, m, fb, scale, dst);
}
