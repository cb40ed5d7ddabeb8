/* Sum-tree and min-tree of float64 leaves (see sumtree.h). */
#include "sumtree.h"

#include <math.h>
#include <stdlib.h>

int lf_sumtree_init(lf_sumtree *t, size_t n) {
    t->n = 0;
    t->size = 0;
    t->sum = t->min = NULL;
    size_t size = 1;
    while (size < n) {
        if (size > SIZE_MAX / 4 / sizeof(double)) return -1;
        size *= 2;
    }
    double *s = (double *)calloc(2 * size, sizeof(double));
    double *mn = (double *)malloc(2 * size * sizeof(double));
    if (s == NULL || mn == NULL) {
        free(s);
        free(mn);
        return -1;
    }
    for (size_t i = 0; i < 2 * size; i++) mn[i] = INFINITY;
    t->n = n;
    t->size = size;
    t->sum = s;
    t->min = mn;
    return 0;
}

void lf_sumtree_free(lf_sumtree *t) {
    free(t->sum);
    free(t->min);
    t->sum = t->min = NULL;
    t->n = t->size = 0;
}

void lf_sumtree_clear(lf_sumtree *t) {
    for (size_t i = 0; i < 2 * t->size; i++) {
        t->sum[i] = 0.0;
        t->min[i] = INFINITY;
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

static inline void pull(lf_sumtree *t, size_t i) {
    double a = t->min[2 * i], b = t->min[2 * i + 1];
    t->sum[i] = t->sum[2 * i] + t->sum[2 * i + 1];
    t->min[i] = a < b ? a : b;
}

int lf_sumtree_set(lf_sumtree *t, const int64_t *idx, const double *val, size_t m) {
    if (lf_sumtree_check(t, idx, val, m) >= 0) return -1;
    size_t depth = 0;
    for (size_t s = t->size; s > 1; s >>= 1) depth++;
    if (m > 0 && depth > 0 && m >= t->size / depth) { /* many writes: leaves, then one pass */
        for (size_t j = 0; j < m; j++) {
            size_t i = t->size + (size_t)idx[j];
            t->sum[i] = val[j];
            t->min[i] = val[j] > 0.0 ? val[j] : INFINITY;
        }
        lf_sumtree_rebuild(t);
        return 0;
    }
    for (size_t j = 0; j < m; j++) {
        size_t i = t->size + (size_t)idx[j];
        t->sum[i] = val[j];
        t->min[i] = val[j] > 0.0 ? val[j] : INFINITY;
        for (i >>= 1; i >= 1; i >>= 1) pull(t, i);
    }
    return 0;
}

void lf_sumtree_rebuild(lf_sumtree *t) {
    for (size_t i = t->size - 1; i >= 1; i--) pull(t, i);
}

double lf_sumtree_total(const lf_sumtree *t) { return t->sum[1]; }

double lf_sumtree_min(const lf_sumtree *t) { return t->min[1]; }

double lf_sumtree_get(const lf_sumtree *t, size_t i) { return t->sum[t->size + i]; }

int lf_sumtree_sample(const lf_sumtree *t, const double *u, size_t m, int64_t *out) {
    /* a tree of one leaf has its root at node 1 == leaf 0 */
    double total = t->sum[1];
    if (!(total > 0.0)) return -1;
    for (size_t j = 0; j < m; j++)
        if (!(u[j] >= 0.0 && u[j] < 1.0)) return -1;
    const double *s = t->sum;
    for (size_t j = 0; j < m; j++) {
        double x = ((double)j + u[j]) * total / (double)m;
        size_t i = 1;
        while (i < t->size) {
            size_t l = 2 * i;
            /* enter only subtrees that hold a positive leaf: rounding may put x at or
             * past a node's sum, never on an empty leaf */
            if (x < s[l] || !(s[l + 1] > 0.0)) {
                i = l;
            } else {
                x -= s[l];
                i = l + 1;
            }
        }
        out[j] = (int64_t)(i - t->size);
    }
    return 0;
}

void lf_sumtree_weights(const lf_sumtree *t, const int64_t *idx, size_t m, double beta,
                        float *out) {
    double lo = t->min[1];
    for (size_t j = 0; j < m; j++) out[j] = (float)pow(t->sum[t->size + (size_t)idx[j]] / lo, -beta);
}
