/*
 * conv_levels.c: every build of the direct convolutions (csrc/engine/conv_direct_*.c) against a plain
 * double-precision convolution, on shapes that reach every tile and block size, every kernel size the
 * kernels take (1-7), padding, batches that split into several dW chunks, and widths that leave partial
 * vectors. Builds this CPU cannot run are skipped by name; the 16-lane, 32-register tiles of the AVX-512
 * build also run as conv_wide.c (AVX2 instructions) wherever AVX2 does, so their logic is checked on
 * any AVX2 machine. Prints each build's worst error; exits 1 if one is over the tolerance.
 *
 *   tests/unit/test_simd.py builds and runs it (gcc -O2 -Icsrc ..., and under AddressSanitizer).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/conv_direct.h"
#include "core/simd.h"

extern const ConvKernels conv_kernels_wide;

typedef struct {
    const char *name;
    const ConvKernels *k;
    int level;   // the simd.h level the CPU needs
} Build;

static unsigned long long state = 88172645463325252ull;

static float uniform(void) {   // xorshift64: the same inputs on every machine
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return (float)((state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static float *random_floats(long n) {
    float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    for (long i = 0; i < n; i++) p[i] = uniform();
    return p;
}

// The largest |a - ref| over the largest |ref|.
static double rel_error(const float *a, const double *ref, long n) {
    double worst = 0.0, scale = 1e-30;
    for (long i = 0; i < n; i++) {
        worst = fmax(worst, fabs(a[i] - ref[i]));
        scale = fmax(scale, fabs(ref[i]));
    }
    return worst / scale;
}

// y, dW, db, dx of the convolution, in double, the textbook way.
static void reference(const ConvShape *s, int B, const float *x, const float *W, const float *b, const float *dy,
                      double *y, double *dW, double *db, double *dx) {
    long kk = (long)s->k * s->k;
    for (long i = 0; i < (long)s->out_c * s->in_c * kk; i++) dW[i] = 0.0;
    for (int o = 0; o < s->out_c; o++) db[o] = 0.0;
    for (long i = 0; i < (long)B * s->in_c * s->in_h * s->in_w; i++) dx[i] = 0.0;
    for (int n = 0; n < B; n++) {
        for (int o = 0; o < s->out_c; o++) {
            for (int oi = 0; oi < s->out_h; oi++) {
                for (int oj = 0; oj < s->out_w; oj++) {
                    long at = (((long)n * s->out_c + o) * s->out_h + oi) * s->out_w + oj;
                    double sum = b[o], g = dy[at];
                    db[o] += g;
                    for (int c = 0; c < s->in_c; c++) {
                        for (int ki = 0; ki < s->k; ki++) {
                            for (int kj = 0; kj < s->k; kj++) {
                                int i = oi + ki - s->pad, j = oj + kj - s->pad;
                                if (i < 0 || j < 0 || i >= s->in_h || j >= s->in_w) continue;
                                long xi = (((long)n * s->in_c + c) * s->in_h + i) * s->in_w + j;
                                long wi = (((long)o * s->in_c + c) * s->k + ki) * s->k + kj;
                                sum += (double)W[wi] * x[xi];
                                dW[wi] += g * x[xi];
                                dx[xi] += g * W[wi];
                            }
                        }
                    }
                    y[at] = sum;
                }
            }
        }
    }
}

// One shape and batch through one build; its worst relative error over y, dW, db and dx.
static double check(const Build *bd, const ConvShape *s, int B) {
    long xs = (long)B * s->in_c * s->in_h * s->in_w, ys = (long)B * s->out_c * s->out_h * s->out_w;
    long ws = (long)s->out_c * s->in_c * s->k * s->k;
    float *x = random_floats(xs), *W = random_floats(ws), *b = random_floats(s->out_c), *dy = random_floats(ys);
    float *y = malloc(sizeof(float) * ys), *dW = malloc(sizeof(float) * ws), *db = malloc(sizeof(float) * s->out_c);
    float *dx = malloc(sizeof(float) * xs);
    float *cols = malloc(sizeof(float) * bd->k->cols_floats(s, B)), *tmp = malloc(sizeof(float) * bd->k->tmp_floats(s, B));
    double *ry = malloc(sizeof(double) * ys), *rdW = malloc(sizeof(double) * ws), *rdb = malloc(sizeof(double) * s->out_c);
    double *rdx = malloc(sizeof(double) * xs);
    reference(s, B, x, W, b, dy, ry, rdW, rdb, rdx);
    bd->k->forward(s, x, W, b, y, cols, B);
    bd->k->backward(s, cols, W, dy, dW, db, dx, tmp, B, 0);
    double err = fmax(fmax(rel_error(y, ry, ys), rel_error(dW, rdW, ws)), fmax(rel_error(db, rdb, s->out_c),
                                                                             rel_error(dx, rdx, xs)));
    free(x), free(W), free(b), free(dy), free(y), free(dW), free(db), free(dx), free(cols), free(tmp);
    free(ry), free(rdW), free(rdb), free(rdx);
    return err;
}

int main(void) {
    // in_c, in_h, in_w, out_c, k, stride, pad: LeNet-5's two, then every k, channel counts on and off
    // the blocks (4, 6, 8, 12, 16 and past), widths of one vector or less at every width, and more
    static const int shapes[][7] = {
        {1, 28, 28, 6, 5, 1, 2}, {6, 14, 14, 16, 5, 1, 0}, {3, 9, 11, 13, 3, 1, 1}, {2, 9, 40, 4, 7, 1, 0},
        {5, 12, 7, 12, 1, 1, 0}, {4, 10, 33, 20, 2, 1, 1}, {2, 8, 17, 7, 4, 1, 3}, {3, 11, 6, 9, 6, 1, 2},
        {1, 6, 3, 17, 3, 1, 2}, {7, 13, 13, 33, 5, 1, 4},
    };
    static const int batches[] = {1, 3, 70};   // 70: the dW kernels' examples in several chunks
    Build builds[] = {{"sse2", &conv_kernels_sse2, PD_SIMD_SSE2}, {"avx2", &conv_kernels_avx2, PD_SIMD_AVX2},
                      {"avx512", &conv_kernels_avx512, PD_SIMD_AVX512}, {"avx512 tiles on avx2", &conv_kernels_wide,
                                                                       PD_SIMD_AVX2}};
    int failed = 0, ran = 0;
    for (size_t bi = 0; bi < sizeof builds / sizeof builds[0]; bi++) {
        if (builds[bi].level > pd_simd_cpu_level()) {
            printf("%-22s not run: this CPU runs at most %s\n", builds[bi].name, pd_simd_name(pd_simd_cpu_level()));
            continue;
        }
        double worst = 0.0;
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int *v = shapes[si];
            ConvShape s = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], 0, 0};
            s.out_h = s.in_h + 2 * s.pad - s.k + 1, s.out_w = s.in_w + 2 * s.pad - s.k + 1;
            if (s.out_h < 1 || s.out_w < 1 || !conv_direct_applies(&s)) {
                printf("shape %zu is not one the direct kernels take\n", si);
                return 1;
            }
            for (size_t n = 0; n < sizeof batches / sizeof batches[0]; n++) {
                double err = check(&builds[bi], &s, batches[n]);
                worst = fmax(worst, err);
                if (!(err < 2e-5)) {
                    printf("%-22s FAILED: %dx%dx%d -> %d, k %d pad %d, batch %d: relative error %.2e\n",
                           builds[bi].name, s.in_c, s.in_h, s.in_w, s.out_c, s.k, s.pad, batches[n], err);
                    failed++;
                }
                ran++;
            }
        }
        printf("%-22s worst relative error %.2e over %zu shapes x %zu batches\n", builds[bi].name, worst,
               sizeof shapes / sizeof shapes[0], sizeof batches / sizeof batches[0]);
    }
    printf("%d checks, %d failed\n", ran, failed);
    return failed ? 1 : 0;
}
