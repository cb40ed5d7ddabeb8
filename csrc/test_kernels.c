/* Plain-C tests of the copy kernels (kernels.c), the frame pool (pool.c), the
 * priority sum-tree (sumtree.c), the worker pool (parallel.c) and the handoff ring
 * (handoff.c); no Python.
 *
 * Build and run (tests/hardening/test_c_kernels.py does this, with sanitizers when available;
 * BLOSC2 is the directory of the installed blosc2 package, which ships C-Blosc2):
 *   cc -std=c11 -O1 -g -fsanitize=address,undefined -Icsrc -I$BLOSC2/include \
 *      csrc/test_kernels.c csrc/kernels.c csrc/pool.c csrc/codec.c csrc/sumtree.c \
 *      csrc/parallel.c csrc/handoff.c $BLOSC2/lib/libblosc2.a -lpthread -ldl -lm -o test_kernels && ./test_kernels
 * Prints "N passed, 0 failed" and exits non-zero on any failure.
 *
 * The kernels are checked against naive loops written from the layouts' definitions
 * (docs/DESIGN.md): "last" out[h][w][j*C + c] = f_j[h][w][c]; "first"
 * out[j*C + c][h][w] = f_j[c][h][w]; "stack" out[j] = f_j. The pool is checked
 * against its documented policy and, in a random walk, against a plain model; its
 * compressed (cold) path against the frames it was given, under every codec.
 */
#define _POSIX_C_SOURCE 200809L /* pthreads, sched_yield */
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "handoff.h"
#include "kernels.h"
#include "layout.h"
#include "parallel.h"
#include "pool.h"
#include "sumtree.h"

static long n_pass = 0, n_fail = 0;

#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        if (cond) {                                                       \
            n_pass++;                                                     \
        } else {                                                          \
            n_fail++;                                                     \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                 \
            fputc('\n', stderr);                                          \
        }                                                                 \
    } while (0)

/* xorshift64*: deterministic test data */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}
static void fill_random(unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(rnd() >> 56);
}

static const char *layout_name[] = {"last", "first", "stack"};

/* ------------------------------------------------------------------------------ */
/* geometry: identity copies of every layout against a naive loop                   */

/* Frame shape (d0, d1, d2) in elements of `isz` bytes. "last": (H, W, C) = (d0, d1, d2);
 * "first": (C, H, W) = (d0, d1, d2); "stack": any. Returns 0 when equal. */
static int naive_check(lf_layout layout, size_t n_obs, size_t k, size_t d0, size_t d1, size_t d2,
                       size_t isz, unsigned char **frames, const unsigned char *out) {
    size_t n = d0 * d1 * d2;
    size_t obs_bytes = k * n * isz;
    for (size_t b = 0; b < n_obs; b++) {
        const unsigned char *o = out + b * obs_bytes;
        for (size_t j = 0; j < k; j++) {
            const unsigned char *f = frames[b * k + j];
            for (size_t x = 0; x < d0; x++)
                for (size_t y = 0; y < d1; y++)
                    for (size_t z = 0; z < d2; z++) {
                        size_t fi = (x * d1 + y) * d2 + z, oi;
                        if (layout == LF_LAST) /* (H, W, k*C) */
                            oi = (x * d1 + y) * (k * d2) + j * d2 + z;
                        else if (layout == LF_FIRST) /* (k*C, H, W) */
                            oi = ((j * d0 + x) * d1 + y) * d2 + z;
                        else /* (k, *S) */
                            oi = j * n + fi;
                        if (memcmp(o + oi * isz, f + fi * isz, isz) != 0) return 1;
                    }
        }
    }
    return 0;
}

static void geometry_case(lf_layout layout, size_t n_obs, size_t k, size_t d0, size_t d1, size_t d2,
                          int type, size_t isz) {
    size_t n = d0 * d1 * d2, fb = n * isz;
    size_t n_frames = 3 + k; /* observations reuse frames, as in a frame stack */
    unsigned char *store = malloc(n_frames * fb);
    const unsigned char **src = malloc(n_obs * k * sizeof(*src));
    unsigned char *out = malloc(n_obs * k * fb + 1);
    fill_random(store, n_frames * fb);
    for (size_t i = 0; i < n_obs * k; i++) src[i] = store + ((i * 7 + i / k) % n_frames) * fb;
    out[n_obs * k * fb] = 0xA5; /* canary just past the end */
    size_t outer, inner;
    lf_layout_geometry(layout, n, d2, &outer, &inner);
    int rc = lf_copy_stacks(src, n_obs, k, outer, inner, type, type, isz, 0.0, 0, out);
    CHECK(rc == 0, "layout %s type %d returned %d", layout_name[layout], type, rc);
    CHECK(naive_check(layout, n_obs, k, d0, d1, d2, isz, (unsigned char **)src, out) == 0,
          "layout %s, %zu obs, k=%zu, shape (%zu,%zu,%zu), type %d, itemsize %zu",
          layout_name[layout], n_obs, k, d0, d1, d2, type, isz);
    CHECK(out[n_obs * k * fb] == 0xA5, "wrote past the end (layout %s)", layout_name[layout]);
    free(store);
    free(src);
    free(out);
}

/* The observation shape of each layout, as the table of docs/DESIGN.md gives it. */
static void test_layout_shapes(void) {
    const intptr_t hwc[3] = {84, 84, 1}, chw[3] = {3, 5, 7};
    intptr_t obs[4];
    CHECK(lf_layout_obs_shape(LF_LAST, hwc, 3, 4, obs) == 3 && obs[0] == 84 && obs[1] == 84 &&
              obs[2] == 4, "last");
    CHECK(lf_layout_obs_shape(LF_FIRST, chw, 3, 4, obs) == 3 && obs[0] == 12 && obs[1] == 5 &&
              obs[2] == 7, "first");
    CHECK(lf_layout_obs_shape(LF_STACK, chw, 3, 4, obs) == 4 && obs[0] == 4 && obs[1] == 3 &&
              obs[2] == 5 && obs[3] == 7, "stack");
    size_t outer, inner;
    lf_layout_geometry(LF_LAST, 84 * 84 * 2, 2, &outer, &inner);
    CHECK(outer == 84 * 84 && inner == 2, "last geometry");
    lf_layout_geometry(LF_FIRST, 105, 7, &outer, &inner);
    CHECK(outer == 1 && inner == 105, "first geometry");
    lf_layout_geometry(LF_STACK, 105, 7, &outer, &inner);
    CHECK(outer == 1 && inner == 105, "stack geometry");
}

static void test_geometry(void) {
    /* (type, itemsize): typed identity copies and raw copies of other itemsizes */
    const int types[][2] = {
        {LF_UINT8, 1}, {LF_INT16, 2}, {LF_FLOAT32, 4}, {LF_FLOAT64, 8}, {LF_BOOL, 1},
        {LF_RAW, 1},   {LF_RAW, 2},   {LF_RAW, 3},     {LF_RAW, 16},
    };
    const size_t shapes[][3] = {
        {84, 84, 1}, {5, 7, 1}, {5, 7, 3}, {4, 3, 2}, {1, 1, 1}, {2, 1, 5}, {1, 9, 4},
    };
    const size_t ks[] = {1, 2, 4, 5, 16};
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
            for (size_t ki = 0; ki < sizeof(ks) / sizeof(ks[0]); ki++)
                for (int layout = 0; layout < LF_NLAYOUTS; layout++) {
                    size_t n_obs = 1 + (rnd() % 3);
                    if (shapes[s][0] == 84 && ks[ki] == 16) n_obs = 1;
                    geometry_case((lf_layout)layout, n_obs, ks[ki], shapes[s][0], shapes[s][1],
                                  shapes[s][2], types[t][0], (size_t)types[t][1]);
                }
    /* the Atari case exactly: 4 frames f(v) of 84x84x1, "last" -> pixel p = [0,1,2,3] */
    unsigned char *fr[4];
    for (int v = 0; v < 4; v++) {
        fr[v] = malloc(84 * 84);
        memset(fr[v], v, 84 * 84);
    }
    unsigned char *out = malloc(84 * 84 * 4);
    CHECK(lf_copy_stacks((const unsigned char *const *)fr, 1, 4, 84 * 84, 1, LF_UINT8,
                         LF_UINT8, 1, 0.0, 0, out) == 0, "atari copy");
    int ok = 1;
    for (size_t p = 0; p < 84 * 84; p++)
        for (int j = 0; j < 4; j++) ok &= out[p * 4 + j] == j;
    CHECK(ok, "f(0..3) 'last' gives [0,1,2,3] per pixel");
    /* RGB frames 10, 11, 12, k=3: channels [10,10,10,11,11,11,12,12,12] (docs/CASES.md C07) */
    unsigned char *rgb[3];
    for (int v = 0; v < 3; v++) {
        rgb[v] = malloc(6 * 5 * 3);
        memset(rgb[v], 10 + v, 6 * 5 * 3);
    }
    unsigned char *o2 = malloc(6 * 5 * 9);
    CHECK(lf_copy_stacks((const unsigned char *const *)rgb, 1, 3, 30, 3, LF_UINT8, LF_UINT8, 1,
                         0.0, 0, o2) == 0, "rgb copy");
    const unsigned char want[9] = {10, 10, 10, 11, 11, 11, 12, 12, 12};
    ok = 1;
    for (size_t p = 0; p < 30; p++) ok &= memcmp(o2 + p * 9, want, 9) == 0;
    CHECK(ok, "C07 channels");
    for (int v = 0; v < 4; v++) free(fr[v]);
    for (int v = 0; v < 3; v++) free(rgb[v]);
    free(out);
    free(o2);
}

/* ------------------------------------------------------------------------------ */
/* conversions                                                                      */

static void test_type_sizes(void) {
    const size_t want[LF_NTYPES] = {sizeof(bool), 1, 1, 2, 2, 4, 4, 8, 8, 4, 8};
    for (int t = 0; t < LF_NTYPES; t++)
        CHECK(lf_type_size(t) == want[t], "lf_type_size(%d) = %zu", t, lf_type_size(t));
    CHECK(lf_type_size(LF_RAW) == 0, "raw");
    CHECK(lf_type_size(-1) == 0, "-1");
    CHECK(lf_type_size(LF_NTYPES) == 0, "LF_NTYPES");
}

static void test_u8_to_f32_scale(void) {
    /* every uint8 value, 2 frames of 256, "stack"; expected as NumPy computes
     * arr.astype(float32) * float32(scale) */
    unsigned char a[256], b[256];
    for (int i = 0; i < 256; i++) {
        a[i] = (unsigned char)i;
        b[i] = (unsigned char)(255 - i);
    }
    const unsigned char *src[2] = {a, b};
    const double scales[] = {1.0 / 255.0, 0.5, 3.0, -2.25, 1e-3};
    for (size_t si = 0; si < sizeof(scales) / sizeof(scales[0]); si++) {
        float out[512];
        const float sc = (float)scales[si];
        CHECK(lf_copy_stacks(src, 1, 2, 1, 256, LF_UINT8, LF_FLOAT32, 1, scales[si], 1, out) == 0,
              "u8->f32 scale");
        int ok = 1;
        for (int i = 0; i < 256; i++) {
            volatile float ea = (float)i * sc, eb = (float)(255 - i) * sc;
            ok &= out[i] == ea && out[256 + i] == eb;
        }
        CHECK(ok, "u8->f32 * %g", scales[si]);
    }
    /* 1/255: the ScaledFloatFrame endpoints */
    float out[512];
    lf_copy_stacks(src, 1, 2, 1, 256, LF_UINT8, LF_FLOAT32, 1, 1.0 / 255.0, 1, out);
    CHECK(out[0] == 0.0f, "0 -> 0");
    CHECK(out[255] > 0.99999f && out[255] < 1.00001f, "255 -> 1 (got %.9g)", out[255]);
    /* "last" geometry with a conversion: (2, 2, 1) frames, k=2 */
    unsigned char f0[4] = {1, 2, 3, 4}, f1[4] = {5, 6, 7, 8};
    const unsigned char *s2[2] = {f0, f1};
    float o[8];
    CHECK(lf_copy_stacks(s2, 1, 2, 4, 1, LF_UINT8, LF_FLOAT32, 1, 0.5, 1, o) == 0, "last conv");
    const float w[8] = {0.5f, 2.5f, 1.0f, 3.0f, 1.5f, 3.5f, 2.0f, 4.0f};
    CHECK(memcmp(o, w, sizeof w) == 0, "interleaved u8->f32");
    /* without a scale */
    CHECK(lf_copy_stacks(s2, 1, 2, 4, 1, LF_UINT8, LF_FLOAT32, 1, 99.0, 0, o) == 0, "no scale");
    const float w2[8] = {1, 5, 2, 6, 3, 7, 4, 8};
    CHECK(memcmp(o, w2, sizeof w2) == 0, "u8->f32 no scale ignores the scale value");
}

static void test_u8_divide_and_unscale(void) {
    /* LF_DIVIDE: arr.astype(float32) / float32(255), which differs from * float32(1/255)
     * in the last bit for some values; lf_unscale_u8 recovers the bytes, and refuses
     * anything that is not such a quotient */
    unsigned char a[256];
    for (int i = 0; i < 256; i++) a[i] = (unsigned char)i;
    const unsigned char *src[1] = {a};
    float out[256], last[256 * 2];
    CHECK(lf_copy_stacks(src, 1, 1, 1, 256, LF_UINT8, LF_FLOAT32, 1, 255.0, LF_DIVIDE, out) == 0,
          "u8->f32 / 255");
    int ok = 1, differ = 0;
    for (int i = 0; i < 256; i++) {
        volatile float want = (float)i / 255.0f, mul = (float)i * (float)(1.0 / 255.0);
        ok &= out[i] == want;
        differ += mul != want;
    }
    CHECK(ok, "u8->f32 / 255 is the correctly rounded quotient");
    CHECK(differ > 0, "the multiply differs somewhere (%d values): the test tells them apart",
          differ);
    const unsigned char *s2[2] = {a, a + 128}; /* "last" layout, (128, 1) frames, k = 2 */
    CHECK(lf_copy_stacks(s2, 1, 2, 128, 1, LF_UINT8, LF_FLOAT32, 1, 255.0, LF_DIVIDE, last) == 0,
          "last / 255");
    CHECK(last[0] == out[0] && last[1] == out[128] && last[255] == out[255], "interleaved / 255");
    uint8_t back[256];
    CHECK(lf_unscale_u8(out, 256, 255.0f, back) == 0 && memcmp(back, a, 256) == 0,
          "unscale recovers every byte");
    const float bad[] = {0.5f, -0.0f - 1e-9f, 1.0001f, 2.0f / 255.0f + 1e-7f, NAN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        float one[1] = {bad[i]};
        CHECK(lf_unscale_u8(one, 1, 255.0f, back) == -1, "unscale refuses %g", bad[i]);
    }
}

static void test_i16_to_f64(void) {
    int16_t a[6] = {-32768, -1, 0, 1, 12345, 32767}, b[6] = {7, -7, 300, -300, 2, -2};
    const unsigned char *src[2] = {(const unsigned char *)a, (const unsigned char *)b};
    double out[12];
    /* "first": (C=2, 3) frames... as (6,) vectors, outer 1 */
    CHECK(lf_copy_stacks(src, 1, 2, 1, 6, LF_INT16, LF_FLOAT64, 2, 0.0, 0, out) == 0, "i16->f64");
    int ok = 1;
    for (int i = 0; i < 6; i++) ok &= out[i] == (double)a[i] && out[6 + i] == (double)b[i];
    CHECK(ok, "i16->f64 exact");
    CHECK(lf_copy_stacks(src, 1, 2, 1, 6, LF_INT16, LF_FLOAT64, 2, 0.25, 1, out) == 0, "scaled");
    ok = 1;
    for (int i = 0; i < 6; i++) ok &= out[i] == a[i] * 0.25 && out[6 + i] == b[i] * 0.25;
    CHECK(ok, "i16->f64 * 0.25");
    /* "last" with C = 3: frames (2, 3) */
    CHECK(lf_copy_stacks(src, 1, 2, 2, 3, LF_INT16, LF_FLOAT64, 2, 0.0, 0, out) == 0, "last");
    const double w[12] = {-32768, -1, 0, 7, -7, 300, 1, 12345, 32767, -300, 2, -2};
    CHECK(memcmp(out, w, sizeof w) == 0, "i16->f64 interleaved by C=3");
}

static void test_other_conversions(void) {
    /* widening ints keep the sign */
    int16_t a[4] = {-5, 0, 5, -32768};
    const unsigned char *sa[1] = {(const unsigned char *)a};
    int64_t o64[4];
    CHECK(lf_copy_stacks(sa, 1, 1, 1, 4, LF_INT16, LF_INT64, 2, 0, 0, o64) == 0, "i16->i64");
    CHECK(o64[0] == -5 && o64[1] == 0 && o64[2] == 5 && o64[3] == -32768, "i16->i64 values");
    uint8_t u[3] = {0, 200, 255};
    const unsigned char *su[1] = {u};
    int16_t o16[3];
    CHECK(lf_copy_stacks(su, 1, 1, 1, 3, LF_UINT8, LF_INT16, 1, 0, 0, o16) == 0, "u8->i16");
    CHECK(o16[0] == 0 && o16[1] == 200 && o16[2] == 255, "u8->i16 values");
    bool bb[3] = {false, true, true};
    const unsigned char *sb[1] = {(const unsigned char *)bb};
    float of[3];
    CHECK(lf_copy_stacks(sb, 1, 1, 1, 3, LF_BOOL, LF_FLOAT32, sizeof(bool), 2.0, 1, of) == 0,
          "bool->f32");
    CHECK(of[0] == 0.0f && of[1] == 2.0f && of[2] == 2.0f, "bool->f32*2");
    uint8_t ou[3];
    CHECK(lf_copy_stacks(sb, 1, 1, 1, 3, LF_BOOL, LF_UINT8, sizeof(bool), 0, 0, ou) == 0, "b->u8");
    CHECK(ou[0] == 0 && ou[1] == 1 && ou[2] == 1, "bool->u8 values");
    float f[3] = {0.1f, -2.5f, 1e30f};
    const unsigned char *sf[1] = {(const unsigned char *)f};
    double od[3];
    CHECK(lf_copy_stacks(sf, 1, 1, 1, 3, LF_FLOAT32, LF_FLOAT64, 4, 0, 0, od) == 0, "f32->f64");
    CHECK(od[0] == (double)0.1f && od[1] == -2.5 && od[2] == (double)1e30f, "f32->f64 values");
    double d[2] = {0.1, -3.0};
    const unsigned char *sd[1] = {(const unsigned char *)d};
    float of2[2];
    CHECK(lf_copy_stacks(sd, 1, 1, 1, 2, LF_FLOAT64, LF_FLOAT32, 8, 0, 0, of2) == 0, "f64->f32");
    CHECK(of2[0] == (float)0.1 && of2[1] == -3.0f, "f64->f32 values");
    /* same type with a scale: float32 * float32(scale) */
    float o3[3];
    CHECK(lf_copy_stacks(sf, 1, 1, 1, 3, LF_FLOAT32, LF_FLOAT32, 4, 0.5, 1, o3) == 0, "f32*s");
    CHECK(o3[0] == 0.1f * 0.5f && o3[1] == -1.25f && o3[2] == 1e30f * 0.5f, "f32 scaled");
    /* identity copies of every type keep the bytes */
    for (int t = 0; t < LF_NTYPES; t++) {
        size_t isz = lf_type_size(t);
        unsigned char in[3 * 8], out[3 * 8 + 1];
        fill_random(in, sizeof in);
        if (t == LF_BOOL)
            for (size_t i = 0; i < sizeof in; i++) in[i] &= 1;
        const unsigned char *s[1] = {in};
        out[3 * isz] = 0x5A;
        CHECK(lf_copy_stacks(s, 1, 1, 1, 3, t, t, isz, 0, 0, out) == 0, "identity %d", t);
        CHECK(memcmp(in, out, 3 * isz) == 0 && out[3 * isz] == 0x5A, "identity bytes %d", t);
    }
}

static void test_unsupported(void) {
    uint8_t in[4] = {1, 2, 3, 4};
    const unsigned char *s[1] = {in};
    unsigned char out[64];
    const int bad[][3] = {
        /* src, dst, has_scale */
        {LF_UINT8, LF_INT32, 1},   {LF_UINT8, LF_UINT8, 1}, {LF_INT16, LF_INT64, 1},
        {LF_RAW, LF_UINT8, 0},     {LF_UINT8, LF_RAW, 0},   {LF_RAW, LF_RAW, 1},
        {LF_RAW, LF_FLOAT32, 1},   {LF_NTYPES, LF_FLOAT32, 0}, {-1, LF_FLOAT32, 0},
        {LF_UINT8, LF_NTYPES, 0},  {LF_UINT8, -1, 0},       {LF_UINT8, 99, 1},
        {LF_BOOL, LF_BOOL, 1},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(out, 0xEE, sizeof out);
        int rc = lf_copy_stacks(s, 1, 1, 1, 4, bad[i][0], bad[i][1], 1, 0.5, bad[i][2], out);
        CHECK(rc == -1, "pair %d->%d scale %d returned %d", bad[i][0], bad[i][1], bad[i][2], rc);
        CHECK(!lf_supported(bad[i][0], bad[i][1], bad[i][2]), "lf_supported %zu", i);
        int untouched = 1;
        for (size_t j = 0; j < sizeof out; j++) untouched &= out[j] == 0xEE;
        CHECK(untouched, "pair %d->%d wrote to dst", bad[i][0], bad[i][1]);
    }
    const int good[][3] = {
        {LF_UINT8, LF_FLOAT32, 1}, {LF_UINT8, LF_FLOAT64, 1}, {LF_INT16, LF_FLOAT64, 0},
        {LF_RAW, LF_RAW, 0},       {LF_FLOAT32, LF_FLOAT32, 1}, {LF_UINT8, LF_UINT8, 0},
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        CHECK(lf_supported(good[i][0], good[i][1], good[i][2]), "supported %zu", i);
}

/* ------------------------------------------------------------------------------ */
/* pool                                                                             */

static size_t held_chunks(const lf_pool *p) { return lf_pool_bytes_held(p) / (p->spc * p->frame_bytes); }

static void test_pool_policy(void) {
    lf_pool p;
    CHECK(lf_pool_init(&p, 0, 64) == -1, "frame_bytes 0 rejected");
    lf_pool_free(&p);
    CHECK(lf_pool_init(&p, 16, 64) == 0, "init");
    CHECK(p.spc == 4, "spc %zu", p.spc);
    CHECK(lf_pool_bytes_held(&p) == 0 && p.live_frames == 0, "empty");
    CHECK(!lf_pool_in_range(&p, 0) && !lf_pool_is_live(&p, 0), "no slot yet");
    int64_t s[12];
    int ok = 1;
    for (int i = 0; i < 12; i++) {
        s[i] = lf_pool_alloc(&p);
        ok &= s[i] == i;
        memset(lf_pool_addr(&p, s[i]), i, 16);
    }
    CHECK(ok, "fresh slots are 0..11 in order");
    CHECK(lf_pool_bytes_held(&p) == 12 * 16 && p.peak_bytes == 12 * 16, "3 chunks held");
    CHECK(p.live_frames == 12, "live");
    for (int i = 0; i < 12; i++) ok &= lf_pool_refcount(&p, i) == 1 && lf_pool_is_live(&p, i);
    CHECK(ok, "refcount 1");
    /* bounds */
    CHECK(lf_pool_in_range(&p, 11) && !lf_pool_in_range(&p, 12), "range end");
    CHECK(!lf_pool_in_range(&p, -1) && !lf_pool_is_live(&p, -1), "-1");
    CHECK(!lf_pool_in_range(&p, INT64_MIN) && !lf_pool_is_live(&p, INT64_MIN), "INT64_MIN");
    CHECK(!lf_pool_in_range(&p, INT64_MAX) && !lf_pool_is_live(&p, INT64_MAX), "INT64_MAX");
    CHECK(!lf_pool_in_range(&p, (int64_t)1 << 40) && !lf_pool_is_live(&p, (int64_t)1 << 40), "2^40");
    /* incref / decref */
    lf_pool_incref(&p, 5);
    lf_pool_incref(&p, 5);
    CHECK(lf_pool_refcount(&p, 5) == 3, "incref");
    lf_pool_decref(&p, 5);
    lf_pool_decref(&p, 5);
    CHECK(lf_pool_refcount(&p, 5) == 1 && lf_pool_is_live(&p, 5), "decref");
    /* a count beyond the word's LF_REF_MAX goes on in the list of large counts, and back:
     * two slots at once, the slot freed when its count reaches 0 */
    for (uint64_t i = 1; i < (uint64_t)LF_REF_MAX + 5000; i++) {
        lf_pool_incref(&p, 5);
        lf_pool_incref(&p, 4);
        lf_pool_incref(&p, 4);
    }
    CHECK(lf_pool_refcount(&p, 5) == (uint64_t)LF_REF_MAX + 5000 && p.n_big == 2 &&
              lf_pool_refcount(&p, 4) == 2 * ((uint64_t)LF_REF_MAX + 5000) - 1,
          "counts past the word (%llu, %zu)", (unsigned long long)lf_pool_refcount(&p, 5),
          p.n_big);
    for (uint64_t i = 1; i < (uint64_t)LF_REF_MAX + 5000; i++) {
        lf_pool_decref(&p, 5);
        lf_pool_decref(&p, 4);
        lf_pool_decref(&p, 4);
    }
    CHECK(lf_pool_refcount(&p, 5) == 1 && lf_pool_refcount(&p, 4) == 1 && p.n_big == 0,
          "and back (%llu)", (unsigned long long)lf_pool_refcount(&p, 5));
    /* a count that could not go on (the list out of memory) sticks: never freed, no wrap */
    lf_pool_chunk(&p, 5)->ref[lf_pool_offset(&p, 5)] = LF_REF_STUCK;
    for (int i = 0; i < 3; i++) lf_pool_decref(&p, 5);
    lf_pool_incref(&p, 5);
    CHECK(lf_pool_refcount(&p, 5) == UINT64_MAX && lf_pool_is_live(&p, 5), "sticks");
    lf_pool_chunk(&p, 5)->ref[lf_pool_offset(&p, 5)] = 1;
    /* reuse: the most recently freed slot of the lowest chunk with a free slot */
    lf_pool_decref(&p, 1);
    lf_pool_decref(&p, 3);
    lf_pool_decref(&p, 6);
    CHECK(!lf_pool_is_live(&p, 1) && lf_pool_in_range(&p, 1) && lf_pool_refcount(&p, 1) == 0,
          "freed slot in range, not live");
    CHECK(p.live_frames == 9, "live 9");
    CHECK(lf_pool_alloc(&p) == 3, "lowest chunk, last freed first");
    CHECK(lf_pool_alloc(&p) == 1, "then 1");
    CHECK(lf_pool_alloc(&p) == 6, "then chunk 1");
    CHECK(lf_pool_alloc(&p) == 12, "then a new chunk");
    ok = 1;
    for (int i = 0; i < 12; i++)
        if (i != 1 && i != 3 && i != 6) {
            unsigned char *a = lf_pool_addr(&p, i);
            for (int j = 0; j < 16; j++) ok &= a[j] == i;
        }
    CHECK(ok, "live frames' bytes untouched by frees and allocs");
    lf_pool_decref(&p, 12); /* chunk 3 empties: kept as the spare */
    CHECK(lf_pool_bytes_held(&p) == 16 * 16, "spare kept");
    for (int i = 8; i < 12; i++) lf_pool_decref(&p, i); /* chunk 2 empties: released */
    CHECK(lf_pool_bytes_held(&p) == 12 * 16, "chunk released (%zu)", lf_pool_bytes_held(&p));
    CHECK(p.peak_bytes == 16 * 16, "peak kept");
    CHECK(lf_pool_in_range(&p, 9) && !lf_pool_is_live(&p, 9) && lf_pool_refcount(&p, 9) == 0,
          "released chunk's slot: in range, not live, refcount 0");
    /* next allocations: chunk 3 (has memory, a free slot) before released chunk 2 */
    int64_t n1 = lf_pool_alloc(&p);
    CHECK(n1 >= 12 && n1 < 16, "memory-holding chunk first (%lld)", (long long)n1);
    for (int i = 0; i < 3; i++) lf_pool_alloc(&p);
    int64_t n2 = lf_pool_alloc(&p);
    CHECK(n2 == 8, "then the lowest released chunk, offset 0 (%lld)", (long long)n2);
    CHECK(lf_pool_bytes_held(&p) == 16 * 16, "re-acquired");
    lf_pool_free(&p);
    /* chunk smaller than a frame: one slot per chunk */
    CHECK(lf_pool_init(&p, 100, 10) == 0 && p.spc == 1, "spc clamps to 1");
    CHECK(lf_pool_alloc(&p) == 0 && lf_pool_alloc(&p) == 1, "one slot per chunk");
    lf_pool_decref(&p, 0);
    lf_pool_decref(&p, 1);
    CHECK(p.live_frames == 0 && lf_pool_bytes_held(&p) == 100, "one spare chunk");
    lf_pool_free(&p);
}

/* Random walk against a plain model: refcounts, contents, live frames, one spare. */
static void test_pool_random_walk(void) {
    enum { FB = 24, MAXS = 4096, STEPS = 200000 };
    lf_pool p;
    CHECK(lf_pool_init(&p, FB, 3 * FB) == 0, "init");
    static uint64_t model_rc[MAXS];
    static unsigned char model_tag[MAXS];
    static int64_t live[MAXS];
    size_t n_live = 0, live_model = 0;
    long bad_rc = 0, bad_bytes = 0, bad_live = 0, bad_spare = 0, bad_fresh = 0;
    memset(model_rc, 0, sizeof model_rc);
    for (long step = 0; step < STEPS; step++) {
        uint64_t r = rnd() % 100;
        /* drift: grow for a while, then shrink, so chunks fill and empty */
        int grow = ((step / 20000) % 2) == 0;
        if (n_live == 0 || (r < (grow ? 45u : 20u) && n_live < MAXS / 2)) {
            int64_t s = lf_pool_alloc(&p);
            if (s < 0 || s >= MAXS) {
                bad_fresh++;
                break;
            }
            if (model_rc[s] != 0) bad_fresh++;
            model_rc[s] = 1;
            model_tag[s] = (unsigned char)(rnd() >> 56);
            memset(lf_pool_addr(&p, s), model_tag[s], FB);
            live[n_live++] = s;
            live_model++;
        } else if (r < 60) {
            int64_t s = live[rnd() % n_live];
            lf_pool_incref(&p, s);
            model_rc[s]++;
        } else {
            size_t i = rnd() % n_live;
            int64_t s = live[i];
            lf_pool_decref(&p, s);
            if (--model_rc[s] == 0) {
                live[i] = live[--n_live];
                live_model--;
            }
        }
        if (p.live_frames != live_model) bad_live++;
        if (step % 997 == 0) {
            for (size_t i = 0; i < n_live; i++) {
                int64_t s = live[i];
                if (lf_pool_refcount(&p, s) != model_rc[s] || !lf_pool_is_live(&p, s)) bad_rc++;
                unsigned char *a = lf_pool_addr(&p, s);
                for (int j = 0; j < FB; j++)
                    if (a[j] != model_tag[s]) {
                        bad_bytes++;
                        break;
                    }
            }
            /* chunks held = chunks with a live slot + at most one spare */
            size_t used = 0;
            for (size_t c = 0; c < p.n_chunks; c++) {
                int any = 0;
                for (size_t o = 0; o < p.spc; o++) any |= model_rc[c * p.spc + o] > 0;
                used += any;
            }
            if (held_chunks(&p) < used || held_chunks(&p) > used + 1) bad_spare++;
        }
    }
    CHECK(bad_fresh == 0, "alloc returned a live or bad slot (%ld)", bad_fresh);
    CHECK(bad_live == 0, "live_frames diverged (%ld)", bad_live);
    CHECK(bad_rc == 0, "refcounts diverged (%ld)", bad_rc);
    CHECK(bad_bytes == 0, "frame bytes clobbered (%ld)", bad_bytes);
    CHECK(bad_spare == 0, "more than one spare chunk held (%ld)", bad_spare);
    /* drop everything: zero live frames, one chunk kept */
    while (n_live) {
        int64_t s = live[n_live - 1];
        lf_pool_decref(&p, s);
        if (--model_rc[s] == 0) n_live--;
    }
    CHECK(p.live_frames == 0, "all dropped");
    CHECK(held_chunks(&p) == 1, "one spare chunk after dropping all (%zu)", held_chunks(&p));
    CHECK(p.peak_bytes >= lf_pool_bytes_held(&p), "peak");
    lf_pool_free(&p);
}

/* ------------------------------------------------------------------------------ */
/* compression: hot -> cold, delta chains, readers, the codec on bad input            */

/* The most a compressing pool's tables of buffers and slabs hold with few frames live:
 * 1024 entries of the first (pool.c shrinks it past that) and 64 slabs. */
#define POOL_TABLES ((size_t)1024 * (sizeof(void *) + 4) + 64 * (sizeof(void *) + 16))
#define ZFB 300 /* frame bytes: not a multiple of 16, so that XOR loops have a tail */

/* Frame i of a series: runs of small changes, a noise frame every 13th. */
static void series_frame(unsigned char *out, const unsigned char *prev, int i) {
    if (i == 0 || i % 13 == 0) {
        fill_random(out, ZFB);
        return;
    }
    memcpy(out, prev, ZFB);
    if (i % 5 == 0) { /* a band of three gray levels: a long patch that packs */
        for (int j = 40; j < ZFB - 10; j++) out[j] = (unsigned char)(i + j % 3);
        return;
    }
    for (int j = 0; j < 3; j++) out[rnd() % ZFB] = (unsigned char)rnd(); /* a patch */
}

static void compression_case(lf_codec c, int n) {
    lf_pool p;
    lf_pool_init(&p, ZFB, 4 * ZFB);
    unsigned char *want = malloc((size_t)n * ZFB), *got = malloc(ZFB), *tmp = malloc(ZFB);
    int64_t *s = malloc((size_t)n * sizeof(int64_t)), chain[LF_MAX_CHAIN];
    /* two frames live before compression is enabled: they move to their own buffers */
    for (int i = 0; i < 2; i++) {
        series_frame(want + i * ZFB, i ? want + (i - 1) * ZFB : NULL, i);
        s[i] = lf_pool_alloc(&p);
        memcpy(lf_pool_addr(&p, s[i]), want + i * ZFB, ZFB);
    }
    CHECK(lf_pool_enable_compression(&p, c) == 0, "enable");
    CHECK(lf_pool_enable_compression(&p, c) == 0, "enable again: idempotent");
    lf_codec other = c;
    other.group = c.group == 1 ? 2 : 1;
    CHECK(lf_pool_enable_compression(&p, other) == -3, "other options refused");
    for (int i = 2; i < n; i++) {
        series_frame(want + i * ZFB, want + (i - 1) * ZFB, i);
        s[i] = lf_pool_alloc(&p);
        CHECK(s[i] >= 0, "alloc");
        memcpy(lf_pool_addr(&p, s[i]), want + i * ZFB, ZFB);
    }
    /* a table holds each frame twice (cold); consecutive frames record their previous one,
     * except across "episodes" of 7 */
    for (int i = 0; i < n; i++) {
        lf_pool_incref_cold(&p, s[i]);
        lf_pool_incref_cold(&p, s[i]);
        if (i % 7) lf_pool_set_prev(&p, s[i], s[i - 1]);
    }
    CHECK(lf_pool_pending(&p) == 0 && p.cold_frames == 0, "owners hold them: hot");
    for (int i = n - 1; i >= 0; i--) lf_pool_decref(&p, s[i]); /* newest first: any order */
    CHECK(lf_pool_pending(&p) == (size_t)n, "all queued (%zu)", lf_pool_pending(&p));
    lf_pool_incref(&p, s[3]); /* a reader holds frame 3: it stays hot */
    /* frame 4's cold count stuck at LF_COLD_MAX (as many references): it stays hot too */
    lf_word *w4 = &lf_pool_chunk(&p, s[4])->ref[lf_pool_offset(&p, s[4])];
    *w4 = LF_REF_STUCK;
    lf_pool_meta(&p, s[4])->cold = LF_COLD_MAX;
    CHECK(lf_pool_compress_pending(&p) == 0, "compress");
    CHECK(p.cold_frames == (size_t)n - 2 && lf_pool_is_hot(&p, s[3]) && lf_pool_is_hot(&p, s[4]),
          "all cold but 3 and 4");
    *w4 = 2;
    lf_pool_meta(&p, s[4])->cold = 2;
    lf_pool_queue(&p, s[4]);
    lf_pool_decref(&p, s[3]);
    CHECK(lf_pool_pending(&p) == 2, "3 and 4 queued again");
    CHECK(lf_pool_compress_pending(&p) == 0 && p.cold_frames == (size_t)n, "3 and 4 cold");
    long bad_depth = 0, bad_value = 0, deltas = 0;
    /* blobs a frame decodes from: 1 + its position in the group, + its root (a keyframe,
     * here every 7th frame, is the root, the codec's or coded against it) */
    int most = (c.group < 7 ? c.group : 7) + (c.group > 1);
    for (int i = 0; i < n; i++) {
        int d = lf_pool_chain(&p, s[i], chain);
        bad_depth += d < 1 || d > most || (i % 7 == 0 && d > 1 + (c.group > 1));
        deltas += d > 1;
        bad_value += lf_pool_read(&p, s[i], got) != 0 || memcmp(got, want + i * ZFB, ZFB) != 0;
    }
    CHECK(bad_depth == 0, "chains within the group (%ld)", bad_depth);
    CHECK(bad_value == 0, "values (%ld)", bad_value);
    CHECK(c.group == 1 ? deltas == 0 : deltas > 0, "deltas (%ld)", deltas);
    long kinds[2] = {0, 0}; /* deltas as patches, and as packed patches */
    for (int i = 0; i < n; i++) {
        uint8_t f = lf_pool_meta(&p, s[i])->blob_flags;
        kinds[0] += (f & LF_BLOB_DELTA) == LF_BLOB_PATCH;
        kinds[1] += (f & LF_BLOB_DELTA) == LF_BLOB_PACKED;
    }
    CHECK(c.group < 5 || (kinds[0] > 0 && kinds[1] > 0), "both kinds of delta (%ld, %ld)",
          kinds[0], kinds[1]);
    /* a reader over every frame, twice each: one entry per frame, values exact */
    lf_reader r;
    lf_reader_init(&r, &p);
    int64_t *entry = malloc(2 * (size_t)n * sizeof(int64_t));
    uint64_t count0 = lf_pool_refcount(&p, s[0]);
    for (int i = 0; i < 2 * n; i++) entry[i] = lf_reader_add(&r, s[(i * 7) % n]);
    CHECK(r.n == (size_t)n, "one entry per frame (%zu)", r.n);
    CHECK(lf_pool_refcount(&p, s[0]) == count0, "a reader pins nothing (its caller does)");
    void *dctx = lf_dctx_new();
    CHECK(lf_reader_reserve(&r) == 0 && lf_reader_decode(&r, dctx) == 0, "decode");
    bad_value = 0;
    for (int i = 0; i < 2 * n; i++)
        bad_value += memcmp(lf_reader_frame(&r, entry[i]), want + ((i * 7) % n) * ZFB, ZFB) != 0;
    CHECK(bad_value == 0, "reader values (%ld)", bad_value);
    lf_reader_release(&r);
    /* a reader over a few frames, newest first: the frames between them and their
     * keyframes are entries without scratch, decoded through the ring; the keyframes
     * have scratch (decoded once, whatever number of chains pass them) */
    lf_reader_init(&r, &p);
    int asked = 0;
    for (int i = n - 1; i >= 0; i -= 5) entry[asked++] = lf_reader_add(&r, s[i]);
    CHECK(c.group < 5 || r.n > r.n_kept, "kept (%zu of %zu)", r.n_kept, r.n);
    long roots = 0;
    for (size_t i = 0; i < r.n; i++) { /* roots in place; keyframes and asked: scratch */
        int root = (r.blobs[i].flags & LF_BLOB_RAW) != 0, wanted = 0;
        for (int a = 0; a < asked; a++) wanted |= entry[a] == (int64_t)i;
        wanted |= lf_pool_meta(&p, r.slots[i])->pos == 0;
        roots += root;
        bad_value += root ? r.pos[i] >= 0 || r.at[i] != r.blobs[i].buf || !r.done[i]
                          : wanted != (r.pos[i] >= 0);
    }
    CHECK(bad_value == 0 && (c.group == 1) == (roots == 0), "scratch of each entry (%ld, %ld)",
          bad_value, roots);
    unsigned char *placed = malloc((size_t)asked * ZFB); /* every other one decodes there */
    for (int a = 0; a < asked; a += 2) lf_reader_place(&r, entry[a], placed + (size_t)a * ZFB);
    CHECK(lf_reader_reserve(&r) == 0, "reserve a few");
    long unplaced = 0, top = -1; /* scratch only for the frames of their own not placed */
    for (size_t i = 0; i < r.n; i++)
        if (r.pos[i] >= 0 && !r.at[i]) {
            unplaced++;
            top = r.pos[i] > top ? r.pos[i] : top;
        }
    CHECK(unplaced > 0 && top == unplaced - 1 && (size_t)unplaced < r.n_kept,
          "scratch of the unplaced (%ld, top %ld, of %zu kept)", unplaced, top, r.n_kept);
    CHECK(lf_reader_decode(&r, dctx) == 0, "decode a few");
    bad_value = 0;
    for (int a = 0; a < asked; a++) {
        const unsigned char *f = lf_reader_frame(&r, entry[a]);
        bad_value += memcmp(f, want + (n - 1 - 5 * a) * ZFB, ZFB) != 0;
        bad_value += (a % 2 == 0) != (f == placed + (size_t)a * ZFB);
    }
    CHECK(bad_value == 0, "reader values, a few (%ld)", bad_value);
    free(placed);
    lf_reader_release(&r);
    lf_ctx_free(dctx);
    free(entry);
    /* drop the table's references in a scattered order: chains unwind, nothing leaks */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) lf_pool_decref_cold(&p, s[(i * 11 + pass) % n]);
    CHECK(p.live_frames == 0 && p.cold_frames == 0 && p.cold_bytes == 0, "all freed");
    /* what stays: the current blob slab (64 KiB), a reader's spare scratch, one chunk */
    CHECK(lf_pool_bytes_held(&p) <= ((size_t)64 << 10) + (size_t)(n + 4) * ZFB + POOL_TABLES,
          "no blob slab but the current one (%zu)", lf_pool_bytes_held(&p));
    lf_pool_free(&p);
    free(want);
    free(got);
    free(tmp);
    free(s);
}

static void test_compression(void) {
    int codecs[] = {LF_CODEC_LZ4, LF_CODEC_LZ4HC, LF_CODEC_ZSTD};
    int groups[] = {1, 2, 5, LF_MAX_GROUP};
    for (int i = 0; i < 3; i++)
        for (int g = 0; g < 4; g++) compression_case((lf_codec){codecs[i], 1 + 4 * (g % 3), groups[g]}, 90);
    lf_pool p;
    lf_pool_init(&p, ZFB, 1 << 12);
    CHECK(lf_pool_enable_compression(&p, (lf_codec){7, 1, 4}) == -2, "unknown codec");
    CHECK(lf_pool_enable_compression(&p, (lf_codec){LF_CODEC_LZ4, 0, 4}) == -2, "level 0");
    CHECK(lf_pool_enable_compression(&p, (lf_codec){LF_CODEC_LZ4, 1, 65}) == -2, "group 65");
    CHECK(p.z == NULL, "unchanged");
    lf_pool_free(&p);
}

/* Previous frames: recorded once, sealed by LF_PREV_NONE, kept through enable_compression
 * and compression. A frame equal to its previous one, or to one of the LF_ALIAS_BACK
 * before it (flicker), is an alias (an empty patch at its position, one blob more than
 * it); a blob of 1 MiB or more keeps its size before it. */
static void test_prev_links_and_aliases(void) {
    lf_pool p;
    lf_pool_init(&p, ZFB, 4 * ZFB);
    enum { N = 40 };
    unsigned char want[N][ZFB], got[ZFB];
    int64_t s[N], chain[LF_MAX_CHAIN];
    /* frames 5-9 and 20-22 repeat the one before; 30, 35 and 39 repeat 2, 4 and 5 back */
    int dist[N] = {[30] = 2, [35] = 4, [39] = 5};
    for (int i = 0; i < N; i++) {
        int same = (i > 5 && i < 10) || (i > 20 && i < 23);
        if (same || dist[i])
            memcpy(want[i], want[i - (same ? 1 : dist[i])], ZFB);
        else
            series_frame(want[i], i ? want[i - 1] : NULL, i);
        s[i] = lf_pool_alloc(&p);
        memcpy(lf_pool_addr(&p, s[i]), want[i], ZFB);
    }
    lf_pool_set_prev(&p, s[1], s[0]);
    lf_pool_set_prev(&p, s[1], s[2]); /* the first record is kept */
    lf_pool_set_prev(&p, s[0], LF_PREV_NONE);
    lf_pool_set_prev(&p, s[0], s[3]); /* sealed */
    CHECK(lf_pool_prev(&p, s[1]) == s[0] && lf_pool_prev(&p, s[0]) == LF_PREV_NONE &&
              lf_pool_prev(&p, s[2]) == LF_PREV_UNSET,
          "links recorded once, sealed");
    CHECK(lf_pool_enable_compression(&p, (lf_codec){LF_CODEC_LZ4, 9, 8}) == 0, "enable");
    for (int i = 2; i < N; i++) lf_pool_set_prev(&p, s[i], s[i - 1]);
    for (int i = 0; i < N; i++) {
        lf_pool_incref_cold(&p, s[i]);
        lf_pool_decref(&p, s[i]); /* the table's reference only: queued */
    }
    CHECK(lf_pool_compress_pending(&p) == 0 && p.cold_frames == N, "all cold");
    long bad = 0;
    for (int i = 0; i < N; i++) {
        bad += lf_pool_read(&p, s[i], got) != 0 || memcmp(got, want[i], ZFB) != 0;
        bad += i && lf_pool_prev(&p, s[i]) != s[i - 1];
    }
    CHECK(bad == 0, "values and links (%ld)", bad);
    for (int i = 6; i < 10; i++) { /* aliases of frame 5, one blob more than it */
        const lf_meta *m = lf_pool_meta(&p, s[i]);
        CHECK((m->blob_flags & LF_BLOB_PATCH) && lf_meta_blob_bytes(&p, m) == 0 &&
                  m->ref == s[5] && m->pos == lf_pool_meta(&p, s[5])->pos,
              "frame %d is an alias of frame 5", i);
        CHECK(lf_pool_chain(&p, s[i], chain) == lf_pool_chain(&p, s[5], chain) + 1,
              "its chain");
    }
    /* a chain longer than LF_MAX_CHAIN (a loop, here) fails to decode, never reads wrong */
    int32_t ref5 = lf_pool_meta(&p, s[5])->ref;
    lf_pool_meta(&p, s[5])->ref = (int32_t)s[6];
    CHECK(lf_pool_chain(&p, s[6], chain) == LF_MAX_CHAIN && lf_pool_read(&p, s[6], got) == -1,
          "a chain cut short");
    lf_pool_meta(&p, s[5])->ref = ref5;
    /* the group goes on past the run: frame 10 at the position after frame 5's */
    CHECK(lf_pool_meta(&p, s[10])->pos == lf_pool_meta(&p, s[5])->pos + 1, "group goes on");
    for (int i = 30; i < N; i++) { /* flicker within LF_ALIAS_BACK frames: aliases */
        const lf_meta *m = lf_pool_meta(&p, s[i]);
        int alias = (m->blob_flags & LF_BLOB_PATCH) && lf_meta_blob_bytes(&p, m) == 0;
        CHECK(alias == (dist[i] && dist[i] <= LF_ALIAS_BACK) &&
                  (!alias || (m->ref == s[i - dist[i]] &&
                              m->pos == lf_pool_meta(&p, s[i - dist[i]])->pos)),
              "frame %d: an alias only of a frame up to %d back", i, LF_ALIAS_BACK);
    }
    for (int i = 0; i < N; i++) lf_pool_decref_cold(&p, s[i]);
    CHECK(p.live_frames == 0 && p.cold_frames == 0 && p.cold_bytes == 0, "all freed");
    lf_pool_free(&p);

    size_t big = ((size_t)1 << 20) + 4096; /* noise: blobs over LF_BLOB_MAX */
    lf_pool_init(&p, big, big);
    CHECK(lf_pool_enable_compression(&p, (lf_codec){LF_CODEC_LZ4, 9, 1}) == 0, "enable");
    unsigned char *frame = malloc(big), *back = malloc(big);
    int64_t b[2];
    for (int i = 0; i < 2; i++) {
        fill_random(frame, big);
        b[i] = lf_pool_alloc(&p);
        memcpy(lf_pool_addr(&p, b[i]), frame, big);
        lf_pool_incref_cold(&p, b[i]);
        lf_pool_decref(&p, b[i]);
    }
    CHECK(lf_pool_compress_pending(&p) == 0 && p.cold_frames == 2, "big frames cold");
    const lf_meta *m = lf_pool_meta(&p, b[1]);
    CHECK(m->blob_bytes == LF_BLOB_MAX && lf_meta_blob_bytes(&p, m) > big &&
              p.cold_bytes == lf_meta_blob_bytes(&p, m) +
                                  lf_meta_blob_bytes(&p, lf_pool_meta(&p, b[0])),
          "a big blob's size, kept before it");
    CHECK(lf_pool_read(&p, b[1], back) == 0 && memcmp(back, frame, big) == 0, "its value");
    for (int i = 0; i < 2; i++) lf_pool_decref_cold(&p, b[i]);
    CHECK(p.cold_bytes == 0 && p.live_frames == 0, "big blobs freed");
    free(frame);
    free(back);
    lf_pool_free(&p);
}

/* A compressing pool of group `group` holding n hot noise frames want[i] in slots s[i]. */
static void noise_pool(lf_pool *p, int group, int n, unsigned char (*want)[ZFB], int64_t *s) {
    lf_pool_init(p, ZFB, 64 * ZFB);
    CHECK(lf_pool_enable_compression(p, (lf_codec){LF_CODEC_LZ4, 9, group}) == 0, "enable");
    for (int i = 0; i < n; i++) {
        fill_random(want[i], ZFB);
        s[i] = lf_pool_alloc(p);
        memcpy(lf_pool_addr(p, s[i]), want[i], ZFB);
    }
}

/* The table of buffers (lf_meta.at) after a burst of hot frames: shrunk, its entries
 * renumbered, every frame's bytes still where its slot says, hot and then cold. */
static void test_own_table(void) {
    enum { N = 2000, KEEP = 20 };
    lf_pool p;
    static unsigned char want[N][ZFB];
    static int64_t s[N];
    unsigned char got[ZFB];
    noise_pool(&p, 4, N, want, s);
    size_t burst = lf_pool_bytes_held(&p) - lf_pool_slot_state_bytes(&p) - (size_t)N * ZFB;
    CHECK(burst >= (size_t)N * 12, "a table entry per hot frame counted (%zu)", burst);
    for (int i = N - 1; i >= 0; i--) /* newest first: the kept ones' entries are the lowest */
        if (i % KEEP) lf_pool_decref(&p, s[i]);
    size_t left = lf_pool_bytes_held(&p) - lf_pool_slot_state_bytes(&p) - (size_t)(N / KEEP) * ZFB;
    CHECK(left <= burst / 4, "the table shrank (%zu of %zu)", left, burst);
    long bad = 0;
    for (int i = 0; i < N; i += KEEP) bad += memcmp(lf_pool_addr(&p, s[i]), want[i], ZFB) != 0;
    CHECK(bad == 0, "hot frames after the table shrank (%ld)", bad);
    for (int i = 0; i < N; i += KEEP) {
        if (i) lf_pool_set_prev(&p, s[i], s[i - KEEP]);
        lf_pool_incref_cold(&p, s[i]);
        lf_pool_decref(&p, s[i]);
    }
    CHECK(lf_pool_compress_pending(&p) == 0 && p.cold_frames == N / KEEP, "compressed");
    for (int i = 0; i < N; i += KEEP) bad += lf_pool_read(&p, s[i], got) || memcmp(got, want[i], ZFB);
    CHECK(bad == 0, "cold frames (%ld)", bad);
    lf_pool_free(&p);
}


/* Links (pool.h, "Previous frames"): 16-bit distances up to LF_LINK_NEAR, farther ones in
 * their chunk's table, whose entries a freed slot gives back; against a model, over three
 * chunks of 16,384 one-byte frames, while slots are freed and taken again. */
static void test_far_links(void) {
    enum { N = 3 * 16384, STEPS = 400000 };
    lf_pool p;
    CHECK(lf_pool_init(&p, 1, 16384) == 0 && p.spc == 16384, "init");
    static int64_t model[N]; /* a live slot's link; -3 for a free slot */
    long bad = 0, live = N;
    for (int i = 0; i < N; i++) {
        bad += lf_pool_alloc(&p) != i;
        model[i] = LF_PREV_UNSET;
    }
    CHECK(bad == 0, "slots in order");
    const int64_t edge[] = {1, -1, 2, LF_LINK_NEAR, -LF_LINK_NEAR, LF_LINK_NEAR + 1,
                            -LF_LINK_NEAR - 1, 16384, -16384, 40000, -40000};
    for (long t = 0; t < STEPS; t++) {
        int64_t s = (int64_t)(rnd() % N), q;
        uint64_t r = rnd() % 8;
        if (model[s] == -3) { /* free: take a slot (the most recently freed of the lowest
                               * chunk with one) and check it starts unset */
            int64_t got = lf_pool_alloc(&p);
            bad += got < 0 || got >= N || model[got] != -3 || lf_pool_prev(&p, got) != LF_PREV_UNSET;
            if (got >= 0 && got < N) model[got] = LF_PREV_UNSET;
            live++;
            continue;
        }
        if (r == 0 && live > N / 2) { /* free it */
            lf_pool_decref(&p, s);
            model[s] = -3;
            live--;
            continue;
        }
        q = r == 1 ? LF_PREV_NONE : r < 5 ? s + edge[rnd() % 11] : (int64_t)(rnd() % N);
        if (q < 0 && q != LF_PREV_NONE) q = LF_PREV_NONE;
        if (q >= N) q = N - 1;
        bad += lf_pool_set_prev(&p, s, q) != 0;
        if (model[s] == LF_PREV_UNSET && q != s) model[s] = q;
        bad += lf_pool_prev(&p, s) != model[s];
    }
    CHECK(bad == 0, "links against the model (%ld)", bad);
    size_t far = 0;
    for (int i = 0; i < N; i++) {
        if (model[i] == -3) continue;
        bad += lf_pool_prev(&p, i) != model[i];
        far += model[i] >= 0 && (model[i] - i > LF_LINK_NEAR || i - model[i] > LF_LINK_NEAR);
    }
    size_t used = 0;
    for (size_t c = 0; c < p.n_chunks; c++) {
        int free_entries = 0;
        for (int32_t e = p.chunks[c].far_free; e >= 0; e = p.chunks[c].far[e]) free_entries++;
        used += p.chunks[c].n_far - (size_t)free_entries;
        CHECK(p.chunks[c].cap_far <= p.spc, "a chunk's table holds at most its slots");
    }
    CHECK(bad == 0 && far > 1000 && used == far, "every far link has one entry (%zu, %zu)",
          used, far);
    for (int i = 0; i < N; i++)
        if (model[i] != -3) lf_pool_decref(&p, i);
    CHECK(p.live_frames == 0 && p.n_alloc == 1, "all freed, one empty chunk kept");
    CHECK(p.far_bytes == p.chunks[0].cap_far * sizeof(int32_t) + p.chunks[1].cap_far * 4 +
                             p.chunks[2].cap_far * 4,
          "far_bytes counts the tables");
    int64_t s0 = lf_pool_alloc(&p), s1 = lf_pool_alloc(&p);
    CHECK(lf_pool_set_prev(&p, s1, s0 + 20000) == 0 && lf_pool_prev(&p, s1) == s0 + 20000,
          "a far link in a chunk taken again");
    lf_pool_decref(&p, s0);
    lf_pool_decref(&p, s1);
    lf_pool_free(&p);
    /* a compressing pool counts the tables in slot_state_bytes, and peak_bytes sees them */
    static int64_t t[40000];
    CHECK(lf_pool_init(&p, 64, 64 * 16384) == 0 &&
              lf_pool_enable_compression(&p, (lf_codec){LF_CODEC_LZ4, 9, 8}) == 0,
          "a compressing pool");
    for (int i = 0; i < 40000; i++) t[i] = lf_pool_alloc(&p);
    for (int i = 20000; i < 40000; i++) lf_pool_set_prev(&p, t[i], t[i - 20000]);
    CHECK(p.far_bytes > 0 && p.peak_bytes >= lf_pool_bytes_held(&p) &&
              lf_pool_slot_state_bytes(&p) == p.n_alloc * p.spc * 16 + p.far_bytes,
          "far tables in slot state and peak");
    for (int i = 0; i < 40000; i++) lf_pool_decref(&p, t[i]);
    lf_pool_free(&p);
}
/* Blobs packed in slabs: many noise frames (a dozen slabs) freed oldest first, then the
 * rest newest first: every slab but the current one is returned, values stay exact. */
static void test_blob_slabs(void) {
    enum { N = 3000 };
    lf_pool p;
    static unsigned char want[N][ZFB];
    static int64_t s[N];
    unsigned char got[ZFB];
    noise_pool(&p, 16, N, want, s);
    for (int i = 0; i < N; i++) {
        lf_pool_incref_cold(&p, s[i]);
        lf_pool_decref(&p, s[i]); /* the table's reference only: queued */
    }
    CHECK(lf_pool_compress_pending(&p) == 0 && p.cold_frames == N, "compressed");
    size_t full = lf_pool_bytes_held(&p);
    CHECK(full >= p.cold_bytes && full > ((size_t)10 << 16), "slabs counted (%zu)", full);
    long bad = 0;
    for (int i = 0; i < N; i += 37)
        bad += lf_pool_read(&p, s[i], got) || memcmp(got, want[i], ZFB);
    CHECK(bad == 0, "values (%ld)", bad);
    for (int i = 0; i < N / 2; i++) lf_pool_decref_cold(&p, s[i]);
    CHECK(lf_pool_bytes_held(&p) < full * 2 / 3, "the oldest slabs returned");
    for (int i = N / 2; i < N; i += 37)
        bad += lf_pool_read(&p, s[i], got) || memcmp(got, want[i], ZFB);
    CHECK(bad == 0, "values after frees (%ld)", bad);
    for (int i = N - 1; i >= N / 2; i--) lf_pool_decref_cold(&p, s[i]);
    CHECK(p.live_frames == 0 &&
              lf_pool_bytes_held(&p) <=
                  ((size_t)64 << 10) + 64 * (sizeof(lf_meta) + 8) + POOL_TABLES,
          "only the current slab and one chunk stay (%zu)", lf_pool_bytes_held(&p));
    lf_pool_free(&p);
}

/* Patches: round trips of frames that differ from their reference nowhere, everywhere,
 * every other byte, in bursts, at both ends; in place and not; every malformed patch is
 * refused without a byte written past the frame (ASan). */
/* The patch encoder written byte by byte, as docs/COMPRESSION.md defines a patch: the
 * encoder's word-at-a-time scan must give the same bytes. */
static size_t patch_by_bytes(const unsigned char *f, const unsigned char *b, size_t n,
                             unsigned char *out) {
    size_t i = 0, w = 0, last = 0;
    for (;;) {
        while (i < n && f[i] == b[i]) i++;
        if (i >= n) return w;
        size_t start = i, end = i + 1;
        for (size_t j = end; j < n && j - end < LF_PATCH_GAP; j++)
            if (f[j] != b[j]) end = j + 1;
        size_t v[2] = {start - last, end - start};
        for (int k = 0; k < 2; k++) {
            for (; v[k] >= 128; v[k] >>= 7) out[w++] = (unsigned char)(v[k] | 128);
            out[w++] = (unsigned char)v[k];
        }
        memcpy(out + w, f + start, end - start);
        w += end - start;
        last = i = end;
    }
}

static void test_patches(void) {
    enum { N = 1000 };
    static unsigned char by_bytes[N + 64];
    static unsigned char base[N], frame[N], out[N], patch[N + 64];
    long bad = 0;
    for (int c = 0; c < 400; c++) {
        fill_random(base, N);
        memcpy(frame, base, N);
        int kind = c % 8;
        for (int i = 0; i < N; i++) {
            int change = kind == 1 ? 1 : kind == 2 ? i % (2 + c % 6) == 0 : kind == 3 ? i % 5 == 0
                       : kind == 4 ? (i < 3 || i >= N - 3) : kind >= 5 ? rnd() % 97 < (unsigned)(c % 7) : 0;
            if (change) frame[i] = (unsigned char)(base[i] + 1);
        }
        if (kind == 7) /* bursts */
            for (int b = 0; b < 5; b++) {
                size_t at = rnd() % N, len = 1 + rnd() % 40;
                for (size_t j = at; j < at + len && j < N; j++) frame[j] ^= 0x5A;
            }
        size_t pn = lf_patch_encode(frame, base, N, patch, sizeof(patch));
        bad += pn == (size_t)-1 || pn > N + 12;
        bad += pn != patch_by_bytes(frame, base, N, by_bytes) || memcmp(patch, by_bytes, pn);
        if (kind == 0) bad += pn != 0;
        memset(out, 0xEE, N);
        bad += lf_patch_apply(patch, pn, base, out, N) != 0 || memcmp(out, frame, N) != 0;
        memcpy(out, base, N); /* in place */
        bad += lf_patch_apply(patch, pn, out, out, N) != 0 || memcmp(out, frame, N) != 0;
        if (pn > 8) /* too small a destination: refused */
            bad += lf_patch_encode(frame, base, N, patch, pn - 1) != (size_t)-1;
    }
    CHECK(bad == 0, "patch round trips (%ld)", bad);
    /* malformed: a varint cut short, one past 64 bits, a skip or a run past the frame, a
     * run longer than the patch */
    static const unsigned char cut[] = {0x80}, wide[] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
                                                         0xFF, 0xFF, 0xFF, 0xFF, 0x01, 0x01};
    static const unsigned char far[] = {0xE9, 0x07, 0x00}, past[] = {0x00, 0xE9, 0x07, 0x00},
                               edge[] = {0xE7, 0x07, 0x02, 1, 2}, longer[] = {0x00, 0x05, 1, 2};
    bad = 0;
    bad += lf_patch_apply(cut, sizeof(cut), base, out, N) != -1;
    bad += lf_patch_apply(wide, sizeof(wide), base, out, N) != -1;
    bad += lf_patch_apply(far, sizeof(far), base, out, N) != -1;     /* skip 1001 */
    bad += lf_patch_apply(past, sizeof(past), base, out, N) != -1;   /* run of 1001 */
    bad += lf_patch_apply(edge, sizeof(edge), base, out, N) != -1;   /* 999 + 2 */
    bad += lf_patch_apply(longer, sizeof(longer), base, out, N) != -1;
    /* an empty run ends a patch: what follows (a packed patch's padding) is not read */
    static const unsigned char padded[] = {0x05, 0x01, 9, 0x00, 0x00, 0xFF, 0xFF};
    bad += lf_patch_apply(padded, sizeof(padded), base, out, N) != 0 || out[5] != 9 ||
           memcmp(out, base, 5) != 0 || memcmp(out + 6, base + 6, N - 6) != 0;
    long returned = 0; /* random corruption: an error or some bytes, never a crash */
    for (int i = 0; i < 3000; i++) {
        size_t pn = lf_patch_encode(frame, base, N, patch, sizeof(patch));
        for (int j = 0; j < 1 + i % 4 && pn; j++) patch[rnd() % pn] ^= (unsigned char)(1 + rnd() % 255);
        int rc = lf_patch_apply(patch, pn - (i % 3 == 0 && pn), base, out, N);
        returned += rc == 0 || rc == -1;
    }
    CHECK(bad == 0 && returned == 3000, "malformed patches (%ld)", bad);
}

/* A container (lf_coder_container) decoded frame by frame (lf_tree_step, lf_kind_decode),
 * then adopted by a pool (lf_pool_adopt): the same frames; a corrupted one adopted whole
 * and decodable, or refused with nothing changed. */
static void test_adopt(void) {
    enum { M = 150 };
    lf_codec c = {LF_CODEC_LZ4, 9, 16};
    unsigned char *want = malloc((size_t)M * ZFB), *got = malloc((size_t)M * ZFB), keys[M] = {0};
    unsigned char *payload = malloc((size_t)M * (ZFB + LF_BLOB_OVERHEAD)), delta[ZFB];
    int64_t offsets[M + 1], slots[M], again[M];
    uint8_t kinds[M];
    for (int i = 0; i < M; i++) series_frame(want + i * ZFB, i ? want + (i - 1) * ZFB : NULL, i);
    keys[37] = 1;
    lf_coder coder;
    CHECK(lf_coder_init(&coder, c, ZFB) == 0, "coder");
    CHECK(lf_coder_container(&coder, want, M, c.group, keys, payload, offsets, kinds) == 0, "code");
    lf_coder_free(&coder);
    void *dctx = lf_dctx_new();
    lf_tree t = {0, 0};
    long bad = 0, counts[7] = {0};
    for (int i = 0; i < M; i++) {
        int64_t r = lf_tree_step(&t, i, kinds[i]);
        counts[kinds[i]]++;
        bad += r == LF_TREE_BAD || (r != LF_TREE_KEY && (r < i - 15 || r >= i)) ||
               (i == 37 && kinds[i] != LF_KIND_KEY);
        bad += lf_kind_decode(dctx, kinds[i], payload + offsets[i], (size_t)(offsets[i + 1] - offsets[i]),
                              r == LF_TREE_KEY ? NULL : got + r * ZFB, got + i * ZFB, ZFB, delta) != 0;
    }
    CHECK(bad == 0 && memcmp(got, want, (size_t)M * ZFB) == 0, "container decodes (%ld)", bad);
    CHECK(counts[LF_KIND_KEY] && counts[LF_KIND_PATCH] && counts[LF_KIND_PACKED], "all kinds");
    lf_pool p;
    lf_pool_init(&p, ZFB, 4 * ZFB);
    CHECK(lf_pool_enable_compression(&p, c) == 0, "enable");
    CHECK(lf_pool_adopt(&p, payload, offsets, kinds, M, slots, (size_t[1]){0}) == 0, "adopt");
    bad = 0;
    for (int i = 0; i < M; i++)
        bad += lf_pool_is_hot(&p, slots[i]) || lf_pool_read(&p, slots[i], got) ||
               memcmp(got, want + i * ZFB, ZFB);
    CHECK(bad == 0 && p.cold_frames == M, "adopted frames decode (%ld)", bad);
    int k = M - 1; /* memory corrupted later: a reader's error names the slot */
    while (kinds[k] != LF_KIND_PATCH) k--;
    lf_meta *mk = lf_pool_meta(&p, slots[k]);
    unsigned char saved[10];
    size_t nk = mk->blob_bytes < 10 ? mk->blob_bytes : 10;
    memcpy(saved, lf_meta_buf(&p, mk), nk);
    memset(lf_meta_buf(&p, mk), 0xFF, nk); /* a varint past 64 bits, or past the patch's end */
    lf_reader r;
    lf_reader_init(&r, &p);
    int64_t e = lf_reader_add(&r, slots[k]);
    CHECK(e >= 0 && lf_reader_reserve(&r) == 0, "reader");
    CHECK(lf_reader_decode(&r, dctx) == -2 && r.bad == slots[k], "corrupt slot named");
    lf_reader_release(&r);
    memcpy(lf_meta_buf(&p, mk), saved, nk);
    long refused = 0;
    for (int trial = 0; trial < 2000; trial++) { /* flipped bytes or kinds */
        size_t at = rnd() % (size_t)offsets[M], k = rnd() % M, where = 0, live = p.live_frames;
        uint8_t kind = kinds[k];
        unsigned char was = payload[at];
        if (trial % 4 == 0) kinds[k] = (uint8_t)(rnd() % 8); /* 7: no kind */
        else payload[at] ^= (unsigned char)(1 + rnd() % 255);
        int rc = lf_pool_adopt(&p, payload, offsets, kinds, M, again, &where);
        if (rc == 0) {
            for (int i = 0; i < M; i++) bad += lf_pool_read(&p, again[i], got) != 0;
            for (int i = M - 1; i >= 0; i--) lf_pool_decref(&p, again[i]);
        } else {
            refused++;
            bad += rc != -2 || where >= M || p.live_frames != live;
        }
        payload[at] = was;
        kinds[k] = kind;
    }
    CHECK(bad == 0 && refused > 0, "corrupted containers (%ld bad, %ld refused)", bad, refused);
    for (int i = M - 1; i >= 0; i--) lf_pool_decref(&p, slots[i]);
    CHECK(p.live_frames == 0 && p.cold_bytes == 0, "all freed");
    lf_pool_free(&p);
    lf_ctx_free(dctx);
    free(want);
    free(got);
    free(payload);
}

/* A reader over windows of 5 consecutive frames apart from each other, each window decoded
 * (lf_reader_decode_upto) before the next, as a copy's rows are: values exact, and each
 * entry decoded once: a chain that passes the frame the reader's buffer holds (a member no
 * row asked for, e.g. frame 4 of a group for frames 5 and 6) goes on from it. */
static void test_reader_windows(void) {
    enum { N = 64 };
    lf_pool p;
    lf_pool_init(&p, ZFB, 4 * ZFB);
    CHECK(lf_pool_enable_compression(&p, (lf_codec){LF_CODEC_LZ4, 9, LF_MAX_GROUP}) == 0, "on");
    unsigned char *want = malloc((size_t)N * ZFB);
    int64_t s[N];
    fill_random(want, ZFB);
    for (int i = 0; i < N; i++) {
        if (i) memcpy(want + i * ZFB, want + (i - 1) * ZFB, ZFB);
        for (int j = 0; i && j < 3; j++) want[i * ZFB + rnd() % ZFB] = (unsigned char)rnd();
        s[i] = lf_pool_alloc(&p);
        memcpy(lf_pool_addr(&p, s[i]), want + i * ZFB, ZFB);
        lf_pool_incref_cold(&p, s[i]);
        if (i) lf_pool_set_prev(&p, s[i], s[i - 1]);
    }
    for (int i = 0; i < N; i++) lf_pool_decref(&p, s[i]);
    CHECK(lf_pool_compress_pending(&p) == 0 && p.cold_frames == N, "cold");
    /* the windows' chains loaded ahead; any id may be passed (read under ASan) */
    int64_t ids[5 * 5 + 3] = {-1, INT64_MAX, (int64_t)1 << 40};
    for (int j = 0; j < 25; j++) ids[3 + j] = s[5 + 12 * (j / 5) + j % 5];
    lf_reader_prefetch(&p, ids, sizeof(ids) / sizeof(ids[0]), -1);
    lf_reader_prefetch(&p, ids, sizeof(ids) / sizeof(ids[0]), 1);
    lf_reader r;
    lf_reader_init(&r, &p);
    /* room for at most the pool's cold frames (N), however many ids a copy has */
    CHECK(lf_reader_expect(&r, (size_t)1 << 40) == 0 && r.cap == N && r.hcap == 4 * N,
          "expect no more than the pool's frames (%zu, %zu)", r.cap, r.hcap);
    CHECK(lf_reader_expect(&r, 48) == 0 && r.cap == N, "expect never shrinks");
    const int64_t *slots = r.slots, *hkeys = r.hkeys;
    int64_t win[5][5];
    for (int w = 0; w < 5; w++)
        for (int j = 0; j < 5; j++) win[w][j] = lf_reader_add(&r, s[5 + 12 * w + j]);
    CHECK(r.n <= N && r.slots == slots && r.hkeys == hkeys, "no growth within the room asked "
          "for (%zu entries)", r.n);
    CHECK(lf_reader_reserve(&r) == 0, "reserve");
    void *dctx = lf_dctx_new();
    long bad = 0;
    for (int w = 0; w < 5; w++) {
        size_t end = 0;
        for (int j = 0; j < 5; j++) end = (size_t)win[w][j] + 1 > end ? (size_t)win[w][j] + 1 : end;
        bad += lf_reader_decode_upto(&r, dctx, end) != 0;
        for (int j = 0; j < 5; j++)
            bad += memcmp(lf_reader_frame(&r, win[w][j]), want + (5 + 12 * w + j) * ZFB, ZFB) != 0;
    }
    CHECK(bad == 0, "values (%ld)", bad);
    size_t roots = 0; /* read in place, never decoded */
    for (size_t i = 0; i < r.n; i++) roots += (r.blobs[i].flags & LF_BLOB_RAW) != 0;
    CHECK(r.n > 25 && roots <= 1 && r.decoded + roots == r.n,
          "each entry decoded once (%zu blobs, %zu entries, %zu roots)", r.decoded, r.n, roots);
    lf_reader_release(&r);
    lf_ctx_free(dctx);
    for (int i = N - 1; i >= 0; i--) lf_pool_decref_cold(&p, s[i]);
    CHECK(p.live_frames == 0, "all freed");
    lf_pool_free(&p);
    free(want);
}

/* The deltas a container may hold: a packed patch (an LZ4 block) decodes to its frame,
 * and so do a Blosc2 chunk of a patch and an XOR blob (made before) that a pool adopts; a
 * packed patch that decodes past a frame, or to a malformed patch, is refused. */
static void test_packed_and_xor_kinds(void) {
    unsigned char base[ZFB], frame[ZFB], x[ZFB + 1], patch[ZFB + LF_BLOB_OVERHEAD], got[ZFB];
    unsigned char payload[4 * (ZFB + LF_BLOB_OVERHEAD) + 8], delta[ZFB];
    fill_random(base, ZFB);
    memcpy(frame, base, ZFB);
    for (int j = 20; j < 260; j++) frame[j] = (unsigned char)(j % 3);
    void *cctx = lf_cctx_new((lf_codec){LF_CODEC_LZ4, 9, 4}), *dctx = lf_dctx_new();
    void *state = malloc(lf_pack_state_bytes());
    size_t pn = lf_patch_encode(frame, base, ZFB, patch, sizeof(patch));
    int64_t offsets[5] = {0};
    uint8_t kinds[4] = {LF_KIND_KEY, LF_KIND_XOR, LF_KIND_PACKED_BLOSC, LF_KIND_PACKED};
    long n[4];
    n[0] = lf_compress(cctx, base, ZFB, payload);
    for (int j = 0; j < ZFB; j++) x[j] = frame[j] ^ base[j];
    n[1] = lf_compress(cctx, x, ZFB, payload + n[0]);
    void *pctx = lf_cctx_new((lf_codec){LF_CODEC_LZ4, 9, 4});
    n[2] = lf_compress(pctx, patch, pn, payload + n[0] + n[1]);
    n[3] = (long)lf_pack(state, patch, pn, payload + n[0] + n[1] + n[2], pn);
    CHECK(n[0] > 0 && n[1] > 0 && n[2] > 0 && (size_t)n[2] + 128 < pn && n[3] > 0 &&
              n[3] + 32 <= n[2],
          "coded (%ld and %ld of %zu)", n[2], n[3], pn);
    CHECK(lf_pack(state, patch, pn, x, (size_t)n[3] - 1) == 0, "an LZ4 block too large: 0");
    for (int k = 0; k < 4; k++) offsets[k + 1] = offsets[k] + n[k];
    for (int k = 1; k < 4; k++) {
        memset(got, 0, ZFB);
        CHECK(lf_kind_decode(dctx, kinds[k], payload + offsets[k], (size_t)(offsets[k + 1] - offsets[k]),
                             base, got, ZFB, delta) == 0 && memcmp(got, frame, ZFB) == 0,
              "kind %d decodes", kinds[k]);
    }
    lf_pool p;
    lf_pool_init(&p, ZFB, 4 * ZFB);
    CHECK(lf_pool_enable_compression(&p, (lf_codec){LF_CODEC_LZ4, 9, 4}) == 0, "enable");
    int64_t slots[4];
    CHECK(lf_pool_adopt(&p, payload, offsets, kinds, 4, slots, (size_t[1]){0}) == 0, "adopt");
    /* the deltas against the keyframe (positions 1, 2, 3 of a tree: refs 0, 0, 2) */
    CHECK(lf_pool_read(&p, slots[1], got) == 0 && memcmp(got, frame, ZFB) == 0, "XOR adopted");
    for (int k = 2; k < 4; k++) { /* both packed kinds: stored as LZ4 blocks, of one size */
        const lf_meta *m = lf_pool_meta(&p, slots[k]);
        CHECK(lf_pool_read(&p, slots[k], got) == 0 && memcmp(got, frame, ZFB) == 0 &&
                  (m->blob_flags & (LF_BLOB_DELTA | LF_BLOB_LEAN)) == LF_BLOB_PACKED &&
                  m->blob_bytes == (uint32_t)n[3],
              "packed kind %d adopted as an LZ4 block", kinds[k]);
    }
    CHECK(lf_pool_codec_blob(&p, slots[1]) && lf_pool_codec_blob(&p, slots[2]), "codec blobs");
    for (int i = 3; i >= 0; i--) lf_pool_decref(&p, slots[i]);
    /* a Blosc2 chunk of a patch that LZ4 cannot shrink (random bytes; no coder packs one):
     * adopted as the plain patch, never as a block larger than it */
    unsigned char noisy[ZFB], np[ZFB + LF_BLOB_OVERHEAD];
    memcpy(noisy, base, ZFB);
    fill_random(noisy + 10, 250);
    size_t nn = lf_patch_encode(noisy, base, ZFB, np, sizeof(np));
    long nb = lf_compress(pctx, np, nn, payload + n[0]);
    int64_t off2[3] = {0, n[0], n[0] + nb};
    uint8_t kinds2[2] = {LF_KIND_KEY, LF_KIND_PACKED_BLOSC};
    CHECK(nb > 0 && lf_pool_adopt(&p, payload, off2, kinds2, 2, slots, (size_t[1]){0}) == 0,
          "adopt an incompressible packed patch");
    const lf_meta *mn = lf_pool_meta(&p, slots[1]);
    CHECK(lf_pool_read(&p, slots[1], got) == 0 && memcmp(got, noisy, ZFB) == 0 &&
              (mn->blob_flags & LF_BLOB_DELTA) == LF_BLOB_PATCH && mn->blob_bytes == nn,
          "stored as its patch (%u bytes of %zu)", (unsigned)mn->blob_bytes, nn);
    for (int i = 1; i >= 0; i--) lf_pool_decref(&p, slots[i]);
    lf_pool_free(&p);
    memset(x, 7, sizeof(x)); /* a "patch" one byte longer than a frame, and a malformed one */
    long big = lf_compress(pctx, x, ZFB + 1, payload), big4 = (long)lf_pack(state, x, ZFB + 1,
                                                                          payload + big, ZFB);
    long bad = lf_compress(pctx, x, 40, payload + big + big4); /* skip 7, run 7, ...: past */
    long bad4 = (long)lf_pack(state, x, 40, payload + big + big4 + bad, ZFB); /* the frame */
    const unsigned char *blob[2][2] = {{payload, payload + big + big4},
                                       {payload + big, payload + big + big4 + bad}};
    size_t bytes[2][2] = {{(size_t)big, (size_t)bad}, {(size_t)big4, (size_t)bad4}};
    for (int k = 0; k < 2; k++) {
        int kind = k ? LF_KIND_PACKED : LF_KIND_PACKED_BLOSC;
        CHECK(lf_kind_decode(dctx, kind, blob[k][0], bytes[k][0], base, got, ZFB, delta) == -1,
              "kind %d: a packed patch past a frame", kind);
        CHECK(lf_kind_decode(dctx, kind, blob[k][1], bytes[k][1], base, got, ZFB, delta) == -1,
              "kind %d: a packed patch that is no patch", kind);
        CHECK(lf_kind_decode(dctx, kind, blob[k][1], bytes[k][1], NULL, got, ZFB, delta) == -1,
              "kind %d: a packed patch needs its reference", kind);
    }
    lf_ctx_free(pctx);
    lf_ctx_free(cctx);
    lf_ctx_free(dctx);
    free(state);
}

/* A pool's keyframe against its root (lf_coder_encode_key): the smaller of the delta and
 * the codec's keyframe, the delta when they tie, whatever the delta's size; it decodes. */
static void test_coder_keyframes(void) {
    lf_coder coder;
    CHECK(lf_coder_init(&coder, (lf_codec){LF_CODEC_LZ4, 9, 8}, ZFB) == 0, "coder");
    void *dctx = lf_dctx_new();
    unsigned char root[ZFB], frame[ZFB], blob[ZFB + LF_BLOB_OVERHEAD], got[ZFB], delta[ZFB];
    const unsigned char *out;
    unsigned char kind, kk, dk;
    for (int c = 0; c < 3; c++) {
        fill_random(root, ZFB);
        memcpy(frame, root, ZFB);
        if (c == 0) { /* a few bytes changed: the patch */
            frame[40] ^= 1;
            frame[41] ^= 2;
        } else if (c == 1) { /* zeros against noise: the keyframe */
            memset(frame, 0, ZFB);
        } else { /* zeros against zeros with a run of noise: a small patch (under the
                  * scene-change size lf_coder_encode tries keyframes from) */
            memset(root, 0, ZFB);
            memset(frame, 0, ZFB);
            fill_random(root + 100, 30);
        }
        long k = lf_coder_encode(&coder, frame, NULL, &out, &kk);
        long d = lf_coder_encode(&coder, frame, root, &out, &dk);
        long e = lf_coder_encode_key(&coder, frame, root, &out, &kind);
        int is_delta = (kind & LF_BLOB_DELTA) != 0;
        long want = (dk & LF_BLOB_DELTA) && d < k + LF_CODEC_SAVES ? d : k;
        CHECK(k > 0 && e == want && is_delta == (e == d && (dk & LF_BLOB_DELTA)),
              "case %d: %ld of key %ld, delta %ld", c, e, k, d);
        memcpy(blob, out, (size_t)e);
        size_t bn = (size_t)e;
        const unsigned char *b = blob;
        if (kind & LF_BLOB_LEAN) {
            bn = lf_unlean(&coder.header, blob, bn, coder.blob);
            b = coder.blob;
        }
        memset(got, 0, ZFB);
        CHECK(lf_kind_decode(dctx, lf_coded_kind(kind), b, bn, root, got, ZFB, delta) == 0 &&
                  memcmp(got, frame, ZFB) == 0,
              "case %d decodes", c);
    }
    lf_ctx_free(dctx);
    lf_coder_free(&coder);
}

/* The codec's blob of a keyframe replaces its patch against the root only when it is
 * LF_CODEC_SAVES bytes smaller: frames of zeros with a run of random bits against zeros,
 * which zstd codes in a third of the patch's bytes, LZ4 in three quarters. */
static void test_coder_codec_saves(void) {
    enum { FB = 84 * 84 };
    unsigned char *root = calloc(FB, 1), *frame = calloc(FB, 1);
    const unsigned char *out;
    unsigned char kind;
    int codecs[] = {LF_CODEC_ZSTD, LF_CODEC_LZ4}, runs[] = {100, 400};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            lf_coder coder, keys;
            CHECK(lf_coder_init(&coder, (lf_codec){codecs[i], 1, 8}, FB) == 0 &&
                      lf_coder_init(&keys, (lf_codec){codecs[i], 1, 8}, FB) == 0,
                  "coders");
            for (int b = 0; b < runs[j]; b++) frame[b] = (unsigned char)(rnd() & 1);
            long key = lf_coder_encode(&keys, frame, NULL, &out, &kind);
            long d = lf_coder_encode(&keys, frame, root, &out, &kind);
            long e = lf_coder_encode_key(&coder, frame, root, &out, &kind);
            int blob = !(kind & LF_BLOB_DELTA), zstd_400 = i == 0 && j == 1;
            CHECK(key > 0 && d > 0 && blob == (key + LF_CODEC_SAVES <= d) && blob == zstd_400 &&
                      e == (blob ? key : d),
                  "codec %d, run %d: %ld B (key %ld, patch %ld)", codecs[i], runs[j], e, key, d);
            CHECK(i || j || key < d, "zstd, run 100: a smaller blob, yet the patch kept");
            lf_coder_free(&coder);
            lf_coder_free(&keys);
        }
    free(root);
    free(frame);
}

static void test_codec_bad_input(void) {
    unsigned char frame[ZFB], blob[ZFB + LF_BLOB_OVERHEAD], out[ZFB], bad[ZFB + LF_BLOB_OVERHEAD];
    fill_random(frame, ZFB);
    memset(frame, 0, ZFB / 2);
    void *cctx = lf_cctx_new((lf_codec){LF_CODEC_LZ4, 9, 4}), *dctx = lf_dctx_new();
    long n = lf_compress(cctx, frame, ZFB, blob);
    CHECK(n > 0 && lf_decompress(dctx, blob, (size_t)n, out, ZFB) == 0, "roundtrip");
    CHECK(memcmp(out, frame, ZFB) == 0, "roundtrip values");
    CHECK(lf_decompress(dctx, blob, (size_t)n - 1, out, ZFB) == -1, "truncated");
    CHECK(lf_decompress(dctx, blob, 8, out, ZFB) == -1, "shorter than a header");
    CHECK(lf_decompress(dctx, blob, (size_t)n, out, ZFB - 1) == -1, "another frame size");
    /* lean blobs: the header rebuilt from the template is the header */
    lf_header t;
    memset(&t, 0, sizeof(t));
    unsigned char lean[ZFB + LF_BLOB_OVERHEAD], whole[ZFB + LF_BLOB_OVERHEAD];
    memcpy(lean, blob, (size_t)n);
    size_t ln = lf_lean(&t, lean, (size_t)n);
    CHECK(ln == (size_t)n - LF_BLOB_OVERHEAD + 2 + 2, "lean: two flag bytes, a 2-byte size (%zu)", ln);
    CHECK(lf_unlean(&t, lean, ln, whole) == (size_t)n && memcmp(whole, blob, (size_t)n) == 0,
          "unlean");
    void *zctx = lf_cctx_new((lf_codec){LF_CODEC_ZSTD, 1, 4});
    long zn = lf_compress(zctx, frame, ZFB, lean);
    CHECK(zn > 0 && lf_lean(&t, lean, (size_t)zn) == (size_t)zn, "another codec's blob stays whole");
    memset(out, 0, ZFB); /* a zero frame: Blosc2's special chunk, header only */
    zn = lf_compress(cctx, out, ZFB, lean);
    ln = lf_lean(&t, lean, (size_t)zn);
    CHECK(ln == 4 && lf_unlean(&t, lean, ln, whole) == (size_t)zn, "special chunk lean");
    CHECK(lf_decompress(dctx, whole, (size_t)zn, frame, ZFB) == 0 && frame[ZFB / 2] == 0, "zeros");
    CHECK(lf_unlean(&t, lean, 2, whole) == 0 && lf_unlean(&t, lean, 1, whole) == 0,
          "a lean blob cut in its size: malformed");
    /* a blob of another size (a packed patch's) is lean with the same template; decoded
     * with a cap, never past it */
    fill_random(frame, ZFB);
    for (int j = 0; j < 120; j++) frame[j] = (unsigned char)(j % 3);
    void *pctx = lf_cctx_new((lf_codec){LF_CODEC_LZ4, 9, 4});
    long pn = lf_compress(pctx, frame, 120, blob);
    lf_ctx_free(pctx);
    memcpy(lean, blob, (size_t)pn);
    ln = lf_lean(&t, lean, (size_t)pn);
    CHECK(ln == (size_t)pn - LF_BLOB_OVERHEAD + 3 && lf_unlean(&t, lean, ln, whole) == (size_t)pn &&
              memcmp(whole, blob, (size_t)pn) == 0, "a smaller blob lean (%zu of %ld)", ln, pn);
    CHECK(lf_decompress_upto(dctx, blob, (size_t)pn, out, ZFB) == 120 &&
              memcmp(out, frame, 120) == 0, "decoded up to a cap");
    CHECK(lf_decompress_upto(dctx, blob, (size_t)pn, out, 119) == -1, "more than the cap");
    lf_ctx_free(zctx);
    long returned = 0; /* random corruption: an error or some bytes, never a crash */
    for (int i = 0; i < 2000; i++) {
        memcpy(bad, blob, (size_t)n);
        for (int j = 0; j < 1 + i % 4; j++) bad[rnd() % (size_t)n] ^= (unsigned char)(1 + rnd() % 255);
        int rc = lf_decompress(dctx, bad, (size_t)n, out, ZFB);
        returned += rc == 0 || rc == -1;
    }
    CHECK(returned == 2000, "corrupted blobs");
    lf_ctx_free(cctx);
    lf_ctx_free(dctx);
}

/* ------------------------------------------------------------------------------ */
/* sum-tree / min-tree (sumtree.c)                                                  */

static int tree_nodes_equal(const lf_sumtree *a, const lf_sumtree *b) {
    return a->size == b->size && memcmp(a->node, b->node, 2 * a->size * sizeof(lf_node)) == 0;
}

static void test_sumtree_basic(void) {
    lf_sumtree t;
    CHECK(lf_sumtree_init(&t, 5) == 0 && t.size == 8, "init 5 -> size %zu", t.size);
    CHECK(lf_sumtree_total(&t) == 0.0 && isinf(lf_sumtree_min(&t)), "empty tree");
    int64_t idx[] = {0, 2, 4, 1};
    double val[] = {1.0, 3.0, 4.0, 0.5};
    CHECK(lf_sumtree_set(&t, idx, val, 4) == 0, "set");
    CHECK(lf_sumtree_total(&t) == 8.5 && lf_sumtree_min(&t) == 0.5, "total %g min %g",
          lf_sumtree_total(&t), lf_sumtree_min(&t));
    int64_t one[] = {1};
    double zero[] = {0.0};
    CHECK(lf_sumtree_set(&t, one, zero, 1) == 0, "empty a leaf");
    CHECK(lf_sumtree_total(&t) == 8.0 && lf_sumtree_min(&t) == 1.0, "zero leaf leaves the min");
    CHECK(lf_sumtree_get(&t, 2) == 3.0 && lf_sumtree_get(&t, 1) == 0.0, "get");
    /* a repeated index keeps its last value */
    int64_t dup[] = {3, 3};
    double dv[] = {7.0, 2.0};
    CHECK(lf_sumtree_set(&t, dup, dv, 2) == 0 && lf_sumtree_get(&t, 3) == 2.0, "last wins");
    CHECK(lf_sumtree_total(&t) == 10.0, "total after dup %g", lf_sumtree_total(&t));
    /* invalid input: refused, nothing written */
    lf_sumtree before;
    lf_sumtree_init(&before, 5);
    memcpy(before.node, t.node, 2 * t.size * sizeof(lf_node));
    int64_t bad_idx[][2] = {{0, -1}, {0, 5}, {0, INT64_MIN}, {0, INT64_MAX}};
    double ok2[] = {9.0, 9.0};
    for (int c = 0; c < 4; c++) {
        CHECK(lf_sumtree_check(&t, bad_idx[c], ok2, 2) == 1, "check idx case %d", c);
        CHECK(lf_sumtree_set(&t, bad_idx[c], ok2, 2) == -1, "bad idx case %d", c);
    }
    int64_t good_idx[] = {0, 1};
    double bad_val[][2] = {{9.0, -1.0}, {9.0, NAN}, {9.0, INFINITY}, {9.0, -INFINITY}, {9.0, -0.5}};
    for (int c = 0; c < 5; c++) {
        CHECK(lf_sumtree_check(&t, good_idx, bad_val[c], 2) == 1, "check val case %d", c);
        CHECK(lf_sumtree_set(&t, good_idx, bad_val[c], 2) == -1, "bad val case %d", c);
    }
    CHECK(tree_nodes_equal(&t, &before), "refused sets wrote nothing");
    lf_sumtree_free(&before);
    /* weights: (leaf / min)^-beta */
    float w[3];
    int64_t wi[] = {0, 2, 3};
    lf_sumtree_weights(&t, wi, 3, 0.5, w); /* leaves 1, 3, 2; min 1 */
    CHECK(w[0] == 1.0f && w[1] == (float)pow(3.0, -0.5) && w[2] == (float)pow(2.0, -0.5),
          "weights %g %g %g", w[0], w[1], w[2]);
    lf_sumtree_weights(&t, wi, 3, 0.0, w);
    CHECK(w[0] == 1.0f && w[1] == 1.0f && w[2] == 1.0f, "beta 0: weights 1");
    lf_sumtree_clear(&t);
    CHECK(lf_sumtree_total(&t) == 0.0 && isinf(lf_sumtree_min(&t)), "clear");
    lf_sumtree_free(&t);
    lf_sumtree_free(&t); /* twice is safe */
    /* one leaf, and none */
    CHECK(lf_sumtree_init(&t, 1) == 0 && t.size == 1, "one leaf");
    double v1[] = {2.5};
    int64_t i0[] = {0};
    CHECK(lf_sumtree_set(&t, i0, v1, 1) == 0 && lf_sumtree_total(&t) == 2.5, "one leaf set");
    double u[] = {0.0, 0.999};
    int64_t out[2] = {-1, -1};
    CHECK(lf_sumtree_sample(&t, u, 2, out) == 0 && out[0] == 0 && out[1] == 0, "one leaf drawn");
    lf_sumtree_free(&t);
    CHECK(lf_sumtree_init(&t, 0) == 0 && lf_sumtree_set(&t, i0, v1, 1) == -1, "no leaf");
    lf_sumtree_free(&t);
}

static void test_sumtree_sample(void) {
    lf_sumtree t;
    lf_sumtree_init(&t, 6);
    int64_t idx[] = {0, 1, 2, 3, 4, 5};
    double val[] = {1.0, 0.0, 3.0, 0.0, 4.0, 0.0}; /* total 8, trailing empty leaves */
    lf_sumtree_set(&t, idx, val, 6);
    double u[8];
    int64_t out[8];
    for (int j = 0; j < 8; j++) u[j] = 0.5;
    CHECK(lf_sumtree_sample(&t, u, 8, out) == 0, "sample");
    int64_t want[] = {0, 2, 2, 2, 4, 4, 4, 4};
    CHECK(memcmp(out, want, sizeof want) == 0, "one draw per segment: %lld %lld %lld %lld %lld",
          (long long)out[0], (long long)out[1], (long long)out[3], (long long)out[4],
          (long long)out[7]);
    /* the top of the range never lands on an empty leaf */
    for (int j = 0; j < 8; j++) u[j] = nextafter(1.0, 0.0);
    CHECK(lf_sumtree_sample(&t, u, 8, out) == 0, "sample near 1");
    int empty = 0;
    for (int j = 0; j < 8; j++) empty += val[out[j]] == 0.0;
    CHECK(empty == 0 && out[7] == 4, "no empty leaf drawn (last %lld)", (long long)out[7]);
    /* u out of range, empty tree: refused, out untouched */
    double bad_u[][1] = {{1.0}, {-0.1}, {NAN}};
    for (int c = 0; c < 3; c++) {
        int64_t o = -7;
        CHECK(lf_sumtree_sample(&t, bad_u[c], 1, &o) == -1 && o == -7, "bad u %d", c);
    }
    lf_sumtree_clear(&t);
    int64_t o = -7;
    CHECK(lf_sumtree_sample(&t, u, 1, &o) == -1 && o == -7, "empty tree");
    double big[] = {1e308, 1e308}; /* finite leaves whose total overflows */
    lf_sumtree_set(&t, idx, big, 2);
    CHECK(lf_sumtree_sample(&t, u, 1, &o) == -1 && o == -7, "infinite total");
    lf_sumtree_free(&t);
    /* frequencies: with one draw per segment, each leaf gets its share within 2 draws */
    enum { N = 37, M = 100000 };
    lf_sumtree_init(&t, N);
    double p[N], tot = 0.0;
    int64_t ids[N];
    for (int i = 0; i < N; i++) {
        ids[i] = i;
        p[i] = (i % 5 == 0) ? 0.0 : (double)(rnd() % 1000 + 1) / 7.0;
        tot += p[i];
    }
    lf_sumtree_set(&t, ids, p, N);
    static double uu[M];
    static int64_t draws[M];
    for (int j = 0; j < M; j++) uu[j] = (double)(rnd() >> 11) * 0x1.0p-53;
    CHECK(lf_sumtree_sample(&t, uu, M, draws) == 0, "big sample");
    long count[N] = {0};
    for (int j = 0; j < M; j++) count[draws[j]]++;
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= fabs((double)count[i] - M * p[i] / tot) <= 2.0;
    CHECK(ok, "stratified counts within 2 of M * P(i)");
    /* draws go in groups, level by level: each equals a plain prefix-sum search (integer
     * leaves: every sum is exact), across group boundaries (m = 100) */
    for (int i = 0; i < N; i++) p[i] = (i % 5 == 0) ? 0.0 : (double)(rnd() % 10);
    lf_sumtree_set(&t, ids, p, N);
    tot = 0.0;
    for (int i = 0; i < N; i++) tot += p[i];
    CHECK(lf_sumtree_sample(&t, uu, 100, draws) == 0, "sample 100");
    ok = 1;
    for (int j = 0; j < 100; j++) {
        double x = ((double)j + uu[j]) * tot / 100.0, run = 0.0;
        int want = -1;
        for (int i = 0; i < N && want < 0; i++) {
            run += p[i];
            if (p[i] > 0.0 && x < run) want = i;
        }
        ok &= draws[j] == want;
    }
    CHECK(ok, "grouped draws == prefix-sum search");
    lf_sumtree_free(&t);
}

/* The drift guard: after millions of writes over a wide dynamic range every node equals
 * a rebuild from the leaves bit for bit, and the root is within depth * eps of the exact
 * sum. A tree that added deltas would fail both. */
static void test_sumtree_drift(void) {
    enum { N = 1000, WRITES = 2000000 };
    lf_sumtree t, fresh;
    lf_sumtree_init(&t, N);
    lf_sumtree_init(&fresh, N);
    double leaves[N] = {0};
    for (long w = 0; w < WRITES; w++) {
        int64_t i = (int64_t)(rnd() % N);
        uint64_t r = rnd();
        /* 1e-6 .. 1e6, some empties */
        double v = (r % 17 == 0) ? 0.0 : pow(10.0, (double)(r >> 11) * 0x1.0p-53 * 12.0 - 6.0);
        lf_sumtree_set(&t, &i, &v, 1);
        leaves[i] = v;
    }
    int64_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = i;
    lf_sumtree_set(&fresh, ids, leaves, N); /* the batched path: leaves, then a rebuild */
    CHECK(tree_nodes_equal(&t, &fresh), "2M writes: every node equals the rebuild");
    long double exact = 0.0L, comp = 0.0L;
    double mn = INFINITY;
    for (int i = 0; i < N; i++) { /* Kahan in long double: exact enough here */
        long double y = (long double)leaves[i] - comp, s = exact + y;
        comp = (s - exact) - y;
        exact = s;
        if (leaves[i] > 0.0 && leaves[i] < mn) mn = leaves[i];
    }
    double rel = fabs((double)((long double)lf_sumtree_total(&t) - exact) / (double)exact);
    CHECK(rel <= 10 * 0x1.0p-52, "root error %g relative", rel);
    CHECK(lf_sumtree_min(&t) == mn, "min %g vs %g", lf_sumtree_min(&t), mn);
    /* batched writes with repeats take the same path as one by one */
    lf_sumtree_free(&fresh);
    lf_sumtree_init(&fresh, N);
    static int64_t bi[4 * N];
    static double bv[4 * N];
    for (int j = 0; j < 4 * N; j++) {
        bi[j] = (int64_t)(rnd() % N);
        bv[j] = (double)(rnd() % 100);
    }
    lf_sumtree_set(&fresh, bi, bv, 4 * N); /* rebuild path */
    lf_sumtree_clear(&t);
    for (int j = 0; j < 4 * N; j++) lf_sumtree_set(&t, &bi[j], &bv[j], 1);
    CHECK(tree_nodes_equal(&t, &fresh), "batched set == one by one (repeats: last wins)");
    /* batches below the rebuild threshold go level by level, in groups: still equal,
     * with repeats inside a group and across groups (indices from a range of 50) */
    lf_sumtree_clear(&t);
    lf_sumtree_clear(&fresh);
    for (int b = 0; b < 40; b++) {
        int64_t *gi = bi + b * 97;
        double *gv = bv + b * 97;
        for (int j = 0; j < 97; j++) gi[j] = (int64_t)(rnd() % 50) * 19;
        CHECK(lf_sumtree_set(&fresh, gi, gv, 97) == 0, "grouped set %d", b);
        for (int j = 0; j < 97; j++) lf_sumtree_set(&t, &gi[j], &gv[j], 1);
    }
    CHECK(tree_nodes_equal(&t, &fresh), "grouped set == one by one (repeats: last wins)");
    lf_sumtree_free(&t);
    lf_sumtree_free(&fresh);
}

/* ------------------------------------------------------------------------------ */
/* two threads: adds against gathers                                                */

/* The protocol of the Cython layer (csrc/_copyout.pxi), with a mutex for the GIL. The
 * adding thread, holding it, pushes a frame, writes a table row (new cold references,
 * then the evicted row's dropped, then the previous frames recorded), lets the frame
 * that leaves its window go (a wrapper's ring) and compresses what went cold: slots are
 * allocated, freed and reused, chunks made, returned and their table grown, frames
 * compressed and their blobs freed. The gathering thread, holding it, picks rows, pins
 * their frames (a reference on each hot one, a reader entry with its chain on each cold
 * one) and notes which frames the rows hold; then, without it, decodes and copies them;
 * then, holding it again, unpins. Every copied frame must be the frame its row held at
 * the pick, byte for byte (a frame carries its number). Run under ThreadSanitizer by
 * tests/sanitize.sh ("test_kernels threads"); any access of the gatherer that the adder
 * may change meanwhile is a reported race. */

#define TFB 200    /* frame bytes */
#define TK 4       /* frames per row */
#define TROWS 48   /* table rows */
#define TB 8       /* rows per gather */

static void thread_frame(unsigned char *out, uint64_t n) {
    memcpy(out, &n, sizeof n);
    for (size_t i = sizeof n; i < TFB; i++) out[i] = (unsigned char)(i * 7 + n / 16);
    out[sizeof n + (n * 13) % (TFB - sizeof n)] = (unsigned char)n; /* a small change: a patch */
}

typedef struct {
    pthread_mutex_t gil;
    lf_pool p;
    int64_t table[TROWS][TK];  /* slot ids, -1 empty */
    int64_t newest[TROWS];     /* the number of each row's newest frame, -1 empty */
    int done;                  /* the adder finished */
    uint64_t seed;
    long gathers, frames, cold, bad;  /* the gatherer's counts */
} thread_case;

static void *thread_gather(void *arg) {
    thread_case *t = arg;
    uint64_t s = t->seed;
    unsigned char out[TB * TK][TFB], want[TFB];
    const unsigned char *src[TB * TK];
    int64_t ids[TB * TK], entry[TB * TK];
    uint64_t num[TB * TK];
    void *dctx = lf_dctx_new();
    for (;;) {
        pthread_mutex_lock(&t->gil);
        if (t->done) {
            pthread_mutex_unlock(&t->gil);
            break;
        }
        int m = 0;
        lf_reader r;
        lf_reader_init(&r, &t->p);
        for (int b = 0; b < TB; b++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            int row = (int)((s >> 33) % TROWS);
            if (t->newest[row] < 0) continue;
            for (int j = 0; j < TK; j++, m++) {
                ids[m] = t->table[row][j];
                num[m] = (uint64_t)t->newest[row] - (TK - 1) + (uint64_t)j;
                lf_pool_incref(&t->p, ids[m]); /* every frame pinned: a cold one's chain lives */
                if (lf_pool_is_hot(&t->p, ids[m])) {
                    src[m] = lf_pool_addr(&t->p, ids[m]);
                    entry[m] = -1;
                } else {
                    entry[m] = lf_reader_add(&r, ids[m]);
                    lf_reader_place(&r, entry[m], out[m]);
                }
            }
        }
        int ok = lf_reader_reserve(&r) == 0;
        t->p.busy++;
        pthread_mutex_unlock(&t->gil);
        /* the GIL released: only pinned frames, their chains' blobs and the reader's own
         * memory are read */
        ok = ok && lf_reader_decode(&r, dctx) == 0;
        for (int i = 0; ok && i < m; i++) {
            if (entry[i] >= 0) src[i] = lf_reader_frame(&r, entry[i]);
            if (src[i] != out[i]) memcpy(out[i], src[i], TFB);
        }
        long bad = !ok;
        for (int i = 0; ok && i < m; i++) {
            thread_frame(want, num[i]);
            bad += memcmp(out[i], want, TFB) != 0;
        }
        pthread_mutex_lock(&t->gil);
        t->p.busy--;
        for (int i = 0; i < m; i++) lf_pool_decref(&t->p, ids[i]);
        t->cold += (long)r.n;
        if (r.n) lf_reader_release(&r); /* made only for cold frames, as _copy does */
        t->gathers++;
        t->frames += m;
        t->bad += bad;
        pthread_mutex_unlock(&t->gil);
    }
    lf_ctx_free(dctx);
    return NULL;
}

/* One round: a fresh pool (chunks of 2 frames: many chunks, a growing chunk table),
 * `adds` frames pushed while the gatherer runs; then everything dropped. */
static void thread_round(int compress, lf_codec c, int adds, uint64_t seed) {
    thread_case *t = calloc(1, sizeof *t); /* its fields are read and written holding gil */
    pthread_mutex_init(&t->gil, NULL);
    lf_pool_init(&t->p, TFB, 2 * TFB);
    if (compress) CHECK(lf_pool_enable_compression(&t->p, c) == 0, "enable");
    for (int r = 0; r < TROWS; r++) {
        t->newest[r] = -1;
        for (int j = 0; j < TK; j++) t->table[r][j] = -1;
    }
    t->seed = seed;
    int64_t window[TK]; /* the wrapper's ring: a reference on each of the newest TK frames */
    for (int j = 0; j < TK; j++) {
        window[j] = lf_pool_alloc(&t->p);
        thread_frame(lf_pool_addr(&t->p, window[j]), (uint64_t)j);
    }
    pthread_t g;
    CHECK(pthread_create(&g, NULL, thread_gather, t) == 0, "thread");
    long oom = 0, seen = 0;
    for (int n = TK; n < TK + adds; n++) {
        pthread_mutex_lock(&t->gil);
        /* every 32 adds, until the gatherer has gathered again: a mutex is not fair, and
         * on a busy machine the gatherer could otherwise not run before the adds end */
        while (n % 32 == 0 && t->gathers == seen) {
            pthread_mutex_unlock(&t->gil);
            sched_yield();
            pthread_mutex_lock(&t->gil);
        }
        seen = t->gathers;
        int64_t slot = lf_pool_alloc(&t->p);
        if (slot < 0) {
            oom++;
            pthread_mutex_unlock(&t->gil);
            break;
        }
        thread_frame(lf_pool_addr(&t->p, slot), (uint64_t)n);
        int64_t gone = window[0];
        memmove(window, window + 1, (TK - 1) * sizeof(int64_t));
        window[TK - 1] = slot;
        int row = n % TROWS; /* SlotTable.set: new references, old dropped, then written */
        for (int j = 0; j < TK; j++) lf_pool_incref_cold(&t->p, window[j]);
        for (int j = 0; j < TK; j++)
            if (t->table[row][j] >= 0) lf_pool_decref_cold(&t->p, t->table[row][j]);
        for (int j = 0; j < TK; j++) {
            t->table[row][j] = window[j];
            if (j) lf_pool_set_prev(&t->p, window[j], window[j - 1]);
        }
        t->newest[row] = n;
        lf_pool_decref(&t->p, gone); /* the ring lets the oldest frame go */
        oom += lf_pool_compress_pending(&t->p) != 0;
        pthread_mutex_unlock(&t->gil);
    }
    pthread_mutex_lock(&t->gil);
    t->done = 1;
    pthread_mutex_unlock(&t->gil);
    pthread_join(g, NULL);
    CHECK(oom == 0, "out of memory (%ld)", oom);
    CHECK(t->bad == 0, "frames that are not the frame their row held (%ld of %ld)", t->bad,
          t->frames);
    CHECK(t->gathers > 0 && (!compress || t->cold > 0), "gathers (%ld), cold frames read (%ld)",
          t->gathers, t->cold);
    for (int r = 0; r < TROWS; r++)
        for (int j = 0; j < TK; j++)
            if (t->table[r][j] >= 0) lf_pool_decref_cold(&t->p, t->table[r][j]);
    for (int j = 0; j < TK; j++) lf_pool_decref(&t->p, window[j]);
    CHECK(t->p.live_frames == 0 && t->p.busy == 0, "all freed (%zu)", t->p.live_frames);
    lf_pool_free(&t->p);
    pthread_mutex_destroy(&t->gil);
    free(t);
}

static void test_pool_threads(void) {
    for (int round = 0; round < 6; round++) {
        thread_round(0, (lf_codec){LF_CODEC_LZ4, 1, 1}, 4000, 11 + round);
        thread_round(1, (lf_codec){LF_CODEC_LZ4, 1, round % 2 ? 16 : 4}, 4000, 17 + round);
    }
}

/* ------------------------------------------------------------------------------ */
/* the worker pool (parallel.c)                                                       */

typedef struct {
    int hits[64];
    int arrived[2]; /* __atomic: the meeting tasks */
    int met[2];
} par_case;

static void par_hit(void *ctx, int t) { ((par_case *)ctx)->hits[t]++; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Tasks 0 and 1 each wait (up to 60 s) for the other to start: both meet only if two
 * threads run them at once, so a pool that ran its tasks one after the other fails. */
static void par_meet(void *ctx, int t) {
    par_case *c = ctx;
    __atomic_store_n(&c->arrived[t], 1, __ATOMIC_SEQ_CST);
    double end = now_s() + 60;
    while (!__atomic_load_n(&c->arrived[1 - t], __ATOMIC_SEQ_CST) && now_s() < end)
        sched_yield();
    c->met[t] = __atomic_load_n(&c->arrived[1 - t], __ATOMIC_SEQ_CST);
}

/* Every task runs once, in any thread count, for 0 .. 40 tasks; the counter counts them. */
static void test_parallel_tasks(void) {
    int threads[] = {1, 2, 3, 8, 1000};
    for (int h = 0; h < 5; h++) {
        lf_parallel_set_threads(threads[h]);
        CHECK(lf_parallel_threads() == (threads[h] > LF_PARALLEL_MAX ? LF_PARALLEL_MAX
                                                                     : threads[h]),
              "threads %d", lf_parallel_threads());
        long bad = 0;
        for (int n = 0; n <= 40; n++) {
            par_case c;
            memset(&c, 0, sizeof c);
            unsigned long long before = lf_parallel_tasks_run();
            CHECK(lf_parallel_for(n, par_hit, &c) == 0, "for");
            for (int t = 0; t < 64; t++) bad += c.hits[t] != (t < n);
            bad += lf_parallel_tasks_run() - before != (unsigned long long)n;
        }
        CHECK(bad == 0, "each task once, counted (%ld), %d threads", bad, threads[h]);
    }
    lf_parallel_set_threads(0);
    CHECK(lf_parallel_threads() == 1, "clamped to 1");
}

/* Two threads really run at once, and a worker runs tasks. */
static int par_meets(void) {
    par_case c;
    memset(&c, 0, sizeof c);
    lf_parallel_set_threads(2);
    unsigned long long before = lf_parallel_tasks_by_workers();
    lf_parallel_for(2, par_meet, &c);
    return c.met[0] && c.met[1] && lf_parallel_tasks_by_workers() > before;
}

static void test_parallel_meet(void) {
    CHECK(par_meets(), "two tasks ran at once, one in a worker");
    lf_parallel_shutdown();
    CHECK(par_meets(), "again after shutdown: new workers");
}

/* Several threads call at once: one holds the workers, the others run alone; every
 * call's tasks run once each. */
typedef struct {
    long bad;
} par_caller;

static void par_square(void *ctx, int t) { ((long *)ctx)[t] = (long)t * t; }

static void *par_call_loop(void *arg) {
    par_caller *pc = arg;
    for (int i = 0; i < 300; i++) {
        long out[6] = {-1, -1, -1, -1, -1, -1};
        int n = 1 + i % 5;
        lf_parallel_for(n, par_square, out);
        for (int t = 0; t < 6; t++) pc->bad += out[t] != (t < n ? (long)t * t : -1);
    }
    return NULL;
}

static void test_parallel_callers(void) {
    lf_parallel_set_threads(3);
    pthread_t th[3];
    par_caller pc[3];
    memset(pc, 0, sizeof pc);
    for (int i = 0; i < 3; i++) CHECK(pthread_create(&th[i], NULL, par_call_loop, &pc[i]) == 0, "t");
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    CHECK(pc[0].bad + pc[1].bad + pc[2].bad == 0, "concurrent calls (%ld)",
          pc[0].bad + pc[1].bad + pc[2].bad);
}

/* The copy out split in parts, as csrc/_copyout.pxi does it: each part collects its own
 * reader over its rows (chains and blobs read while the pool does not change: in the
 * workers too), then, in a second parallel call, decodes with its own decompression
 * context; the parts share delta chains (consecutive rows overlap by k - 1 frames). Every
 * frame is exact. */
#define PN 160 /* frames */
#define PK 4
#define PROWS (PN - PK + 1)

typedef struct {
    lf_reader r[4];
    const int64_t *s; /* the frames' slots */
    int64_t entry[PROWS * PK];
    unsigned char *out; /* PROWS * PK frames */
    int parts, rc[4];
} par_decode;

static void par_collect_part(void *ctx, int t) {
    par_decode *d = ctx;
    for (int row = t * PROWS / d->parts; row < (t + 1) * PROWS / d->parts; row++)
        for (int j = 0; j < PK; j++) {
            int i = row * PK + j;
            d->entry[i] = lf_reader_add(&d->r[t], d->s[row + j]);
            if (d->entry[i] >= 0) lf_reader_place(&d->r[t], d->entry[i], d->out + (size_t)i * ZFB);
            else d->rc[t] = 1;
        }
}

static void par_decode_part(void *ctx, int t) {
    par_decode *d = ctx;
    void *dctx = lf_dctx_new();
    int r0 = t * PROWS / d->parts, r1 = (t + 1) * PROWS / d->parts;
    d->rc[t] = dctx == NULL || lf_reader_decode(&d->r[t], dctx) != 0;
    for (int i = r0 * PK; i < r1 * PK && !d->rc[t]; i++) {
        const unsigned char *f = lf_reader_frame(&d->r[t], d->entry[i]);
        if (f != d->out + (size_t)i * ZFB) memcpy(d->out + (size_t)i * ZFB, f, ZFB);
    }
    lf_ctx_free(dctx);
}

static void test_parallel_decode(void) {
    lf_pool p;
    lf_pool_init(&p, ZFB, 16 * ZFB);
    CHECK(lf_pool_enable_compression(&p, (lf_codec){LF_CODEC_LZ4, 1, 16}) == 0, "enable");
    unsigned char *want = malloc((size_t)PN * ZFB);
    int64_t s[PN];
    for (int i = 0; i < PN; i++) {
        series_frame(want + (size_t)i * ZFB, i ? want + (size_t)(i - 1) * ZFB : NULL, i);
        s[i] = lf_pool_alloc(&p);
        memcpy(lf_pool_addr(&p, s[i]), want + (size_t)i * ZFB, ZFB);
    }
    for (int i = 0; i < PN; i++) {
        lf_pool_incref_cold(&p, s[i]);
        if (i) lf_pool_set_prev(&p, s[i], s[i - 1]);
    }
    for (int i = 0; i < PN; i++) lf_pool_decref(&p, s[i]);
    CHECK(lf_pool_compress_pending(&p) == 0 && p.cold_frames == PN, "all cold");
    par_decode *d = calloc(1, sizeof *d);
    d->out = malloc((size_t)PROWS * PK * ZFB);
    for (int parts = 1; parts <= 4; parts++) {
        lf_parallel_set_threads(parts);
        d->parts = parts;
        memset(d->out, 0, (size_t)PROWS * PK * ZFB);
        d->s = s;
        for (int t = 0; t < parts; t++) {
            lf_reader_init(&d->r[t], &p);
            d->rc[t] = 0;
        }
        lf_parallel_for(parts, par_collect_part, d); /* the frames held by the test */
        for (int t = 0; t < parts; t++)
            CHECK(d->rc[t] == 0 && lf_reader_reserve(&d->r[t]) == 0, "collect and reserve");
        p.busy++;
        lf_parallel_for(parts, par_decode_part, d);
        p.busy--;
        long bad = 0;
        for (int t = 0; t < parts; t++) {
            bad += d->rc[t] != 0;
            lf_reader_release(&d->r[t]);
        }
        for (int row = 0; row < PROWS; row++)
            for (int j = 0; j < PK; j++)
                bad += memcmp(d->out + (size_t)(row * PK + j) * ZFB,
                              want + (size_t)(row + j) * ZFB, ZFB) != 0;
        CHECK(bad == 0, "decoded in %d parts (%ld bad)", parts, bad);
    }
    for (int i = 0; i < PN; i++) lf_pool_decref_cold(&p, s[i]);
    CHECK(p.live_frames == 0, "all freed");
    lf_pool_free(&p);
    free(d->out);
    free(d);
    free(want);
}

/* A child forked after the parent used the workers makes its own: its tasks meet. (Not
 * under ThreadSanitizer, which does not support threads made after a threaded fork.) */
static void test_parallel_fork(void) {
    CHECK(par_meets(), "the parent's workers");
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(par_meets() ? 0 : 3);
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child's tasks met (status %d)",
          status);
    CHECK(par_meets(), "the parent's workers after the fork");
}

static void test_parallel(void) {
    test_parallel_tasks();
    test_parallel_meet();
    test_parallel_callers();
    test_parallel_decode();
    lf_parallel_shutdown();
}

/* -- the handoff ring (handoff.c) --------------------------------------------------- */
#define HO_N 3      /* a small ring: the two threads meet at every slot */
#define HO_BYTES 256
#define HO_ROUNDS 200000

static unsigned char ho_byte(uint64_t seq, size_t j) { return (unsigned char)(seq * 131 + j * 7 + (seq >> 8)); }

typedef struct {
    _Alignas(64) unsigned char block[LF_HANDOFF_BYTES];
    unsigned char slots[HO_N][HO_BYTES];
    long bad_p, bad_c;  /* wrong bytes the producer, the consumer saw */
} ho_ring;

static void *ho_produce(void *arg) {
    ho_ring *r = arg;
    for (uint64_t head = 0; head < HO_ROUNDS;) {
        int64_t room = lf_handoff_room(r->block, head, HO_N);
        if (room < 0) return (void *)1;
        if (room == 0) { sched_yield(); continue; }
        unsigned char *slot = r->slots[head % HO_N], fill[HO_BYTES];
        static const unsigned char zero[HO_BYTES];
        r->bad_p += memcmp(slot, zero, HO_BYTES) != 0;  /* released, consumed */
        for (size_t j = 0; j < HO_BYTES; j++) fill[j] = ho_byte(head, j);
        memcpy(slot, fill, HO_BYTES);
        lf_handoff_publish(r->block, ++head);
    }
    return NULL;
}

static void *ho_consume(void *arg) {
    ho_ring *r = arg;
    for (uint64_t tail = 0; tail < HO_ROUNDS;) {
        int64_t ready = lf_handoff_ready(r->block, tail, HO_N);
        if (ready < 0) return (void *)1;
        if (ready == 0) { sched_yield(); continue; }
        unsigned char *slot = r->slots[tail % HO_N], got[HO_BYTES];
        memcpy(got, slot, HO_BYTES);
        for (size_t j = 0; j < HO_BYTES; j++) r->bad_c += got[j] != ho_byte(tail, j);
        memset(slot, 0, HO_BYTES);  /* zeroed once read: the producer checks it */
        lf_handoff_release(r->block, ++tail);
    }
    return NULL;
}

/* A producer and a consumer thread hand HO_ROUNDS slots over through a ring of HO_N: every
 * byte the consumer reads is the one written for that sequence number, and it zeroes the
 * slot before releasing it, which the producer checks before refilling it. Under TSan, any
 * of the four release/acquire accesses weakened to relaxed is reported as a race on the
 * slots' bytes (each checked). The slots are read and written whole (memcpy, memcmp,
 * memset: one shadow check per 8 bytes), as the server and learners do: byte by byte, a
 * thread's own accesses evicted the peer's from TSan's 4 shadow cells per 8 bytes, and a
 * relaxed producer load of tail went unreported. */
static void test_handoff_threads(void) {
    ho_ring *r = calloc(1, sizeof *r);
    pthread_t p, c;
    void *rp, *rc;
    CHECK(pthread_create(&c, NULL, ho_consume, r) == 0, "consumer thread");
    CHECK(pthread_create(&p, NULL, ho_produce, r) == 0, "producer thread");
    pthread_join(p, &rp);
    pthread_join(c, &rc);
    CHECK(rp == NULL && rc == NULL, "no side saw a broken counter");
    CHECK(r->bad_c == 0, "%ld bytes read that were not the ones published", r->bad_c);
    CHECK(r->bad_p == 0, "%ld bytes refilled before they were consumed", r->bad_p);
    CHECK(lf_handoff_load(r->block + LF_HANDOFF_HEAD) == HO_ROUNDS &&
          lf_handoff_load(r->block + LF_HANDOFF_TAIL) == HO_ROUNDS, "the counters at the end");
    free(r);
}

/* Counters a peer scribbled: each side only reports them (-1), its own count drives the
 * slot it touches; under ASan, the slots are exactly n and any write outside them fails. */
static void test_handoff_garbage(void) {
    unsigned char *block = aligned_alloc(64, LF_HANDOFF_BYTES);
    const uint64_t n = 4;
    unsigned char *slots = malloc(n * 8);
    memset(block, 0, LF_HANDOFF_BYTES);
    CHECK(lf_handoff_room(block, 0, n) == 4 && lf_handoff_ready(block, 0, n) == 0, "empty");
    lf_handoff_publish(block, 4);
    CHECK(lf_handoff_room(block, 4, n) == 0 && lf_handoff_ready(block, 0, n) == 4, "full");
    lf_handoff_release(block, 5);
    CHECK(lf_handoff_room(block, 4, n) == -1, "a tail above head is broken");
    lf_handoff_release(block, UINT64_MAX);
    CHECK(lf_handoff_room(block, 4, n) == -1, "tail 2**64-1");
    lf_handoff_publish(block, 9);
    CHECK(lf_handoff_ready(block, 4, n) == -1, "a head more than n ahead is broken");
    lf_handoff_publish(block, 3);
    CHECK(lf_handoff_ready(block, 4, n) == -1, "a head below tail is broken");
    int ok = 1;
    uint64_t head = UINT64_MAX - 100, tail = 0;  /* the counters wrap: no count goes negative */
    for (int i = 0; i < 100000; i++) {
        uint64_t garbage = rnd();
        memcpy(block + LF_HANDOFF_TAIL, &garbage, 8);
        if (i % 3 == 0) lf_handoff_release(block, head - rnd() % (n + 1)); /* honest ones too */
        int64_t room = lf_handoff_room(block, head, n);
        ok &= room >= -1 && room <= (int64_t)n;
        if (room > 0) {
            memset(slots + (head % n) * 8, (int)i, 8);  /* ASan: inside the n slots */
            lf_handoff_publish(block, ++head);
        }
        memcpy(block + LF_HANDOFF_HEAD, &garbage, 8);
        int64_t ready = lf_handoff_ready(block, tail, n);
        ok &= ready >= -1 && ready <= (int64_t)n;
        if (ready > 0) tail++;
    }
    CHECK(ok, "room and ready stay in [-1, n] whatever the peer's counter");
    uint64_t seen = 0, w = 7;
    CHECK(lf_handoff_cas(&w, 7, 9, &seen) && w == 9 && seen == 7, "a claim");
    CHECK(!lf_handoff_cas(&w, 7, 11, &seen) && w == 9 && seen == 9, "a claim taken");
    free(slots);
    free(block);
}

int main(int argc, char **argv) {
    lf_codec_init();
    if (argc > 1 && strcmp(argv[1], "threads") == 0) { /* tests/sanitize.sh, under TSan */
        test_pool_threads();
        test_parallel();
        test_handoff_threads();
        printf("%ld passed, %ld failed\n", n_pass, n_fail);
        return n_fail ? 1 : 0;
    }
    test_type_sizes();
    test_layout_shapes();
    test_geometry();
    test_u8_to_f32_scale();
    test_u8_divide_and_unscale();
    test_i16_to_f64();
    test_other_conversions();
    test_unsupported();
    test_pool_policy();
    test_pool_random_walk();
    test_compression();
    test_prev_links_and_aliases();
    test_far_links();
    test_blob_slabs();
    test_own_table();
    test_codec_bad_input();
    test_packed_and_xor_kinds();
    test_coder_keyframes();
    test_coder_codec_saves();
    test_reader_windows();
    test_adopt();
    test_patches();
    test_sumtree_basic();
    test_sumtree_sample();
    test_sumtree_drift();
    test_pool_threads();
    test_parallel();
    test_parallel_fork();
    test_handoff_garbage();
    test_handoff_threads();
    lf_parallel_shutdown();
    printf("%ld passed, %ld failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
