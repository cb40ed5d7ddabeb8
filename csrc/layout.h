/* The three layouts of k frames as one observation, shared by C, Cython and the tests.
 *
 * A frame has shape S (nd axes). Its k frames, oldest first, are laid out as:
 *   LF_LAST  "last":  (..., C) -> (..., k*C)   concatenated on the last axis
 *   LF_FIRST "first": (C, ...) -> (k*C, ...)   concatenated on the first axis
 *   LF_STACK "stack": S -> (k, *S)             stacked on a new leading axis
 * Everything that depends on the layout is here: the copy kernel's geometry
 * (kernels.h) and the shape of one observation. Python's LAYOUTS lists the names
 * in code order.
 */
#ifndef LAZYFRAMES_LAYOUT_H
#define LAZYFRAMES_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

typedef enum { LF_LAST = 0, LF_FIRST = 1, LF_STACK = 2 } lf_layout;

#define LF_NLAYOUTS 3

/* The kernel's (outer, inner) element counts of one frame of n elements whose last
 * axis has c elements: row p < outer of frame j lands at (p * k + j) * inner. Only
 * "last" interleaves; a frame is one contiguous block in "first" and "stack". */
static inline void lf_layout_geometry(lf_layout layout, size_t n, size_t c, size_t *outer,
                                      size_t *inner) {
    if (layout == LF_LAST && c > 0) {
        *outer = n / c;
        *inner = c;
    } else {
        *outer = 1;
        *inner = n;
    }
}

/* Write the shape of one observation of k frames of shape frame[0..nd-1] into obs;
 * returns its number of axes (nd + 1 for "stack", else nd). obs has room for nd + 1.
 * The concatenating layouts need nd >= 1 (the Python layer refuses scalar frames). */
static inline int lf_layout_obs_shape(lf_layout layout, const intptr_t *frame, int nd,
                                      intptr_t k, intptr_t *obs) {
    int i, off = layout == LF_STACK;
    if (off) obs[0] = k;
    for (i = 0; i < nd; i++) obs[i + off] = frame[i];
    if (!off && nd > 0) obs[layout == LF_LAST ? nd - 1 : 0] *= k;
    return nd + off;
}

#endif
