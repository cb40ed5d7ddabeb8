/* Plain-C copy kernels of lazyframes: no Python objects, callable without the GIL.
 *
 * One kernel serves all three layouts. A frame of n elements is seen as
 * `outer` rows of `inner` elements; in an observation of k frames, row p of
 * frame j lands at element (p * k + j) * inner. "last" (concatenate on the
 * channel axis) has inner = C, outer = n / C; "first" and "stack" have
 * outer = 1, inner = n (a frame is one contiguous block).
 */
#ifndef LAZYFRAMES_KERNELS_H
#define LAZYFRAMES_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types the fused conversion knows; LF_RAW copies bytes unconverted. */
typedef enum {
    LF_BOOL = 0, LF_INT8, LF_UINT8, LF_INT16, LF_UINT16, LF_INT32, LF_UINT32,
    LF_INT64, LF_UINT64, LF_FLOAT32, LF_FLOAT64, LF_NTYPES,
    LF_RAW = 100
} lf_type;

/* Size in bytes of an element of type t (0 for LF_RAW or an unknown type). */
size_t lf_type_size(int t);

/* Copy n_obs observations of k frames each into dst (C-contiguous).
 *
 * src:        n_obs * k pointers, observation-major, oldest frame first.
 * outer/inner: the geometry above, in elements.
 * src_type/dst_type: lf_type values; equal types (or LF_RAW with itemsize)
 *             are a plain copy. itemsize is the source element size in bytes
 *             (used when src_type == dst_type == LF_RAW).
 * scale/has_scale: when has_scale, dst = (dst_t)src * (dst_t)scale, or with
 *             has_scale == LF_DIVIDE dst = (dst_t)src / (dst_t)scale; only for float
 *             destinations.
 * Returns 0, or -1 for an unsupported type pair (nothing written then).
 */
int lf_copy_stacks(const unsigned char *const *src, size_t n_obs, size_t k,
                   size_t outer, size_t inner, int src_type, int dst_type,
                   size_t itemsize, double scale, int has_scale, void *dst);

/* Nonzero when lf_copy_stacks supports src_type -> dst_type (with scale or not). */
int lf_supported(int src_type, int dst_type, int has_scale);

/* has_scale of lf_copy_stacks that divides by the scale instead of multiplying. */
#define LF_DIVIDE 2

/* The bytes b of n float32 values that are each (float)b / divisor exactly (what a
 * division of uint8 frames gives, e.g. baselines' ScaledFloatFrame with 255) into dst.
 * Returns 0, or -1 at the first value that is no such quotient (dst partly written). */
int lf_unscale_u8(const float *src, size_t n, float divisor, uint8_t *dst);

/* The float32 floor of the benchmarks: dst[i * fb + j] = (float)src[i][j] * scale for m
 * frames of fb bytes, frame after frame in one plain loop, built for the same
 * instruction sets as lf_copy_stacks's conversions. */
void lf_convert_floor(const unsigned char *const *src, size_t m, size_t fb, float scale,
                      float *dst);

#ifdef __cplusplus
}
#endif
#endif
