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

/* Identity copy: memcpy per row of `inner` elements (one memcpy per frame for
 * "first"/"stack", where outer == 1). */
static void copy_raw(const unsigned char *const *src, size_t n_obs, size_t k,
                     size_t outer, size_t inner_bytes, unsigned char *dst) {
    const size_t row = k * inner_bytes;      /* one row of the observation */
    const size_t obs_bytes = outer * row;
    for (size_t b = 0; b < n_obs; b++) {
        unsigned char *o = dst + b * obs_bytes;
        const unsigned char *const *fr = src + b * k;
        if (outer == 1) {
            for (size_t j = 0; j < k; j++)
                memcpy(o + j * inner_bytes, fr[j], inner_bytes);
        } else if (inner_bytes == 1) {
            /* the Atari case: (84, 84, 1) frames, "last" layout: interleave bytes */
            for (size_t p = 0; p < outer; p++)
                for (size_t j = 0; j < k; j++)
                    o[p * k + j] = fr[j][p];
        } else {
            for (size_t j = 0; j < k; j++) {
                const unsigned char *f = fr[j];
                unsigned char *d = o + j * inner_bytes;
                for (size_t p = 0; p < outer; p++)
                    memcpy(d + p * row, f + p * inner_bytes, inner_bytes);
            }
        }
    }
}

/* The converting copy for one (source, destination) type pair. The geometry loop is
 * the same as copy_raw's; the cast (and the scale, EXPR of `v` and `sc`) happen
 * element by element, so no intermediate array exists. */
#define LF_CONVERT_EXPR(NAME, ST, DT, EXPR)                                            \
    static void NAME(const unsigned char *const *src, size_t n_obs, size_t k,          \
                     size_t outer, size_t inner, double scale, int has_scale,           \
                     void *dst_) {                                                      \
        DT *dst = (DT *)dst_;                                                           \
        const DT sc = (DT)scale;                                                        \
        const size_t obs_elems = outer * k * inner;                                     \
        (void)sc;                                                                       \
        for (size_t b = 0; b < n_obs; b++) {                                            \
            DT *o = dst + b * obs_elems;                                                \
            for (size_t j = 0; j < k; j++) {                                            \
                const ST *f = (const ST *)src[b * k + j];                               \
                for (size_t p = 0; p < outer; p++) {                                    \
                    DT *d = o + (p * k + j) * inner;                                    \
                    const ST *s = f + p * inner;                                        \
                    if (has_scale)                                                      \
                        for (size_t i = 0; i < inner; i++) {                            \
                            DT v = (DT)s[i];                                            \
                            d[i] = EXPR;                                                \
                        }                                                               \
                    else                                                                \
                        for (size_t i = 0; i < inner; i++) d[i] = (DT)s[i];             \
                }                                                                       \
            }                                                                           \
        }                                                                               \
    }
/* Float destinations scale in their own precision: (DT)v * (DT)scale, as NumPy's
 * arr.astype(DT) * DT(scale). Others never scale (lf_supported refuses). */
#define LF_CONVERT(NAME, ST, DT) LF_CONVERT_EXPR(NAME, ST, DT, v)
#define LF_CONVERT_F(NAME, ST, DT) LF_CONVERT_EXPR(NAME, ST, DT, v * sc)

typedef void (*convert_fn)(const unsigned char *const *, size_t, size_t, size_t, size_t,
                           double, int, void *);

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
    converters[src_type][dst_type](src, n_obs, k, outer, inner, scale, has_scale, dst);
    return 0;
}
