/* Sum-tree and min-tree of float64 leaves (see sumtree.h). */
#include "sumtree.h"

#include <math.h>
#include <stdlib.h>

int lf_sumtree_init(lf_sumtree *t, size_t n) {
    t->n = 0;
    t->size = 0;
    t->node = NULL;
    t->mem = NULL;
    size_t size = 1;
    while (size < n) {
        if (size > SIZE_MAX / 8 / sizeof(lf_node)) return -1;
        size *= 2;
    }
    void *mem = malloc(2 * size * sizeof(lf_node) + 63);
    if (mem == NULL) return -1;
    t->n = n;
    t->size = size;
    t->mem = mem;
    t->node = (lf_node *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
    lf_sumtree_clear(t);
    return 0;
}

void lf_sumtree_free(lf_sumtree *t) {
    free(t->mem);
    t->mem = NULL;
    t->node = NULL;
    t->n = t->size = 0;
}

void lf_sumtree_clear(lf_sumtree *t) {
    for (size_t i = 0; i < 2 * t->size; i++) {
        t->node[i].sum = 0.0;
        t->node[i].min = INFINITY;
    }
}

long long lf_sumtree_check(const lf_sumtree *t, const int64_t *idx, const double *val, size_t m) {
    for (size_t j = 0; j < m; j++) {
        /* !(v >= 0) also catches NaN */
        if (idx[j] < 0 || (uint64_t)idx[j] >= t->n || !(val[j] >= 0.0) || isinf(val[j]))
            return (long long)j;
    }
    return -1;
}

static inline void pull(lf_node *nd, size_t i) {
    const lf_node *c = nd + 2 * i;
    nd[i].sum = c[0].sum + c[1].sum;
    nd[i].min = c[0].min < c[1].min ? c[0].min : c[1].min;
}

static inline void put_leaf(lf_sumtree *t, int64_t j, double v) {
    lf_node *leaf = t->node + t->size + (size_t)j;
    leaf->sum = v;
    leaf->min = v > 0.0 ? v : INFINITY;
}

/* Draws and writes go G at a time, level by level: the G paths' loads are independent,
 * so their cache misses overlap instead of following one another down (or up) a path.
 * Each path does the same arithmetic as alone, so the results are the same. */
#define LF_GROUP 32

#if defined(__GNUC__) || defined(__clang__)
#define LF_PREFETCH(p) __builtin_prefetch(p)
#else
#define LF_PREFETCH(p) ((void)0)
#endif

int lf_sumtree_set(lf_sumtree *t, const int64_t *idx, const double *val, size_t m) {
    if (lf_sumtree_check(t, idx, val, m) >= 0) return -1;
    size_t depth = 0;
    for (size_t s = t->size; s > 1; s >>= 1) depth++;
    if (m > 0 && depth > 0 && m >= t->size / depth) { /* many writes: leaves, then one pass */
        for (size_t j = 0; j < m; j++) put_leaf(t, idx[j], val[j]);
        lf_sumtree_rebuild(t);
        return 0;
    }
    /* a group's leaves in order (a repeated index keeps its last value), then each level
     * of their paths: every node ends as fl(left + right) of its final children */
    size_t node[LF_GROUP];
    for (size_t j0 = 0; j0 < m; j0 += LF_GROUP) {
        size_t g = m - j0 < LF_GROUP ? m - j0 : LF_GROUP;
        for (size_t q = 0; q < g; q++) {
            put_leaf(t, idx[j0 + q], val[j0 + q]);
            node[q] = (t->size + (size_t)idx[j0 + q]) >> 1;
        }
        for (size_t level = 0; level < depth; level++)
            for (size_t q = 0; q < g; q++) {
                pull(t->node, node[q]);
                node[q] >>= 1;
            }
    }
    return 0;
}

void lf_sumtree_rebuild(lf_sumtree *t) {
    for (size_t i = t->size - 1; i >= 1; i--) pull(t->node, i);
}

double lf_sumtree_total(const lf_sumtree *t) { return t->node[1].sum; }

double lf_sumtree_min(const lf_sumtree *t) { return t->node[1].min; }

double lf_sumtree_get(const lf_sumtree *t, size_t i) { return t->node[t->size + i].sum; }

int lf_sumtree_sample(const lf_sumtree *t, const double *u, size_t m, int64_t *out) {
    /* a tree of one leaf has its root at node 1 == leaf 0 */
    double total = t->node[1].sum;
    if (!(total > 0.0) || isinf(total)) return -1; /* empty, or leaves that overflow */
    for (size_t j = 0; j < m; j++)
        if (!(u[j] >= 0.0 && u[j] < 1.0)) return -1;
    const lf_node *s = t->node;
    double x[LF_GROUP];
    size_t node[LF_GROUP];
    for (size_t j0 = 0; j0 < m; j0 += LF_GROUP) {
        size_t g = m - j0 < LF_GROUP ? m - j0 : LF_GROUP;
        for (size_t q = 0; q < g; q++) {
            x[q] = ((double)(j0 + q) + u[j0 + q]) * total / (double)m;
            node[q] = 1;
        }
        for (size_t level = 1; level < t->size; level *= 2) /* every leaf is this deep */
            for (size_t q = 0; q < g; q++) {
                size_t l = 2 * node[q];
                /* enter only subtrees that hold a positive leaf: rounding may put x at
                 * or past a node's sum, never on an empty leaf */
                if (x[q] < s[l].sum || !(s[l + 1].sum > 0.0)) {
                    node[q] = l;
                } else {
                    x[q] -= s[l].sum;
                    node[q] = l + 1;
                }
                if (node[q] < t->size) LF_PREFETCH(s + 2 * node[q]); /* the next level */
            }
        for (size_t q = 0; q < g; q++) out[j0 + q] = (int64_t)(node[q] - t->size);
    }
    return 0;
}

void lf_sumtree_weights(const lf_sumtree *t, const int64_t *idx, size_t m, double beta,
                        float *out) {
    double lo = t->node[1].min;
    for (size_t j = 0; j < m; j++)
        out[j] = (float)pow(t->node[t->size + (size_t)idx[j]].sum / lo, -beta);
}
