/* Sum-tree and min-tree of float64 leaves, for prioritized replay; no Python objects.
 *
 * A complete binary tree over `size` leaves (a power of two >= n): node 1 is the root,
 * node i has children 2i and 2i+1, leaf j is node size + j. `sum` holds each node's
 * sum of the leaves below; `min` the smallest *positive* leaf below (+inf when none):
 * a leaf of 0 is empty (never drawn, not in the minimum).
 *
 * Drift guard: a write never adds a delta to the nodes above the leaf; it recomputes
 * each of them as the sum of its two children. Every node is therefore always exactly
 * fl(left + right) of the current leaves, bit for bit what a rebuild from the leaves
 * gives, however many updates came before: the root's rounding error is that of a
 * pairwise sum (at most about depth * eps relative), never an accumulation over
 * updates (a tree that adds each leaf's change to its ancestors, as Dopamine's does,
 * accumulates one rounding error per update and drifts). csrc/test_kernels.c checks the
 * invariant, and the root against an exact sum, after millions of writes.
 */
#ifndef LAZYFRAMES_SUMTREE_H
#define LAZYFRAMES_SUMTREE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One node: the sum of the leaves below and the smallest positive one (+inf if none).
 * Sum and min side by side, and a node's two children in one 32-byte pair (the array
 * is 64-byte aligned), so a level of a descent or of an update reads one cache line. */
typedef struct {
    double sum;
    double min;
} lf_node;

typedef struct {
    size_t n;      /* leaves in use: indices [0, n) */
    size_t size;   /* leaves of the full tree, a power of two >= max(n, 1) */
    lf_node *node; /* 2 * size nodes (node 0 unused), 64-byte aligned */
    void *mem;     /* the allocation node points into */
} lf_sumtree;

/* Allocate a tree of n empty leaves. 0, or -1 (n too large, no memory; t left empty). */
int lf_sumtree_init(lf_sumtree *t, size_t n);
/* Release the nodes (safe on an empty or already freed tree). */
void lf_sumtree_free(lf_sumtree *t);
/* Empty every leaf. */
void lf_sumtree_clear(lf_sumtree *t);

/* Index of the first entry of (idx, val) that lf_sumtree_set would refuse (an index
 * outside [0, n), a value NaN, infinite or negative), or -1 when all are valid. */
long long lf_sumtree_check(const lf_sumtree *t, const int64_t *idx, const double *val, size_t m);
/* Set leaf idx[j] to val[j] for j < m, in order (a repeated index keeps its last value).
 * Checks everything first: returns -1 and writes nothing when lf_sumtree_check fails. */
int lf_sumtree_set(lf_sumtree *t, const int64_t *idx, const double *val, size_t m);
/* Recompute every node from the leaves (what a set leaves the tree equal to anyway). */
void lf_sumtree_rebuild(lf_sumtree *t);

double lf_sumtree_total(const lf_sumtree *t);          /* sum of the leaves */
double lf_sumtree_min(const lf_sumtree *t);            /* smallest positive leaf, or +inf */
double lf_sumtree_get(const lf_sumtree *t, size_t i);  /* leaf i (i < n) */

/* Stratified proportional draws: draw j (j < m) takes the leaf where the prefix sum
 * crosses (j + u[j]) * total / m, so each of m equal segments of the total gets one
 * draw (baselines, Dopamine). Never returns an empty leaf. u[j] must be in [0, 1).
 * Returns 0, or -1 (total is 0, or a u out of range; nothing written). */
int lf_sumtree_sample(const lf_sumtree *t, const double *u, size_t m, int64_t *out);

/* Importance weights of leaves idx[j]: (leaf / min)^-beta, as float32 (1.0 for the
 * smallest leaf): baselines' (N * P(i))^-beta / (N * P_min)^-beta, N cancelled.
 * Leaves must be non-empty (as lf_sumtree_sample returns). */
void lf_sumtree_weights(const lf_sumtree *t, const int64_t *idx, size_t m, double beta,
                        float *out);

#ifdef __cplusplus
}
#endif
#endif
