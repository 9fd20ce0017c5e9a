/*
 * pool2.c: max pooling with 2 x 2 windows (LeNet's), forward and backward, a vector of outputs at a time
 * in GCC's generic vectors: 16 with AVX-512, 8 with AVX2, 4 with baseline x86-64's SSE2, picked on
 * first use (below).
 * The SSE2 version before it did 4 at a time and the rest of a row (LeNet's rows are 14 and 5 outputs)
 * one by one: pooling was a fifth of the step.
 *
 * A row's vectors run past its end (LeNet's 14 outputs in a 16-lane vector): the extra lanes read the next
 * row, which is there, and write into the next row (or plane), which is written after, in order; only
 * where that would pass the end of the buffers does a row finish one output at a time.
 *
 * The comparisons are those of pool2.h's pool_take: larger, or a NaN, which wins as in torch; the
 * first maximum in raster order on ties; with relu, relu(max) = max(relu(x)), the argmax that of x.
 */
#include "pool2.h"
#include "core/simd.h"

#include <stdlib.h>
#include <string.h>

#pragma GCC diagnostic ignored "-Wpsabi"   // vectors passed between inlined helpers: no ABI crosses here

#define SELECT(take, a, b) (((take) & (a)) | (~(take) & (b)))

// One output: the window at r0[2 oj], r0[2 oj + 1], r1[2 oj], r1[2 oj + 1], by pool2.h's pool_take.
static void pool_one(const float *r0, const float *r1, float *out, int32_t *arg, int oj, int w, int at0, int relu) {
    int best = at0 + 2 * oj;
    float top = r0[2 * oj];
    pool_take(r0[2 * oj + 1], best + 1, &top, &best);
    pool_take(r1[2 * oj], at0 + 2 * oj + w, &top, &best);
    pool_take(r1[2 * oj + 1], at0 + 2 * oj + w + 1, &top, &best);
    out[oj] = relu ? relu_of(top) : top;
    arg[oj] = best;
}

// One output's gradient into its window: g at the argmax, 0 at the other three.
static void unpool_one(float g, int at, float *dr0, float *dr1, int oj, int w) {
    dr0[2 * oj] = at == 0 ? g : 0.0f;
    dr0[2 * oj + 1] = at == 1 ? g : 0.0f;
    dr1[2 * oj] = at == w ? g : 0.0f;
    dr1[2 * oj + 1] = at == w + 1 ? g : 0.0f;
}

// ---------------------------------------------------------------------------------------------------
// One build per instruction set (pool2_body.h), picked on first use by the level of simd.h. Not target_clones: a vector
// comparison's result as a vector of lanes needs AVX512DQ (vpmovm2d), which GCC 12's clones cannot ask
// for, and an always-inline helper's comparisons would be lowered for baseline x86-64 anyway.

typedef void ForwardFn(const float *, float *, int32_t *, int, int, int, int);
typedef void BackwardFn(const float *, const float *, const int32_t *, float *, int, int, int);

#define NAME(f) f##_sse2   // SSE2: 4 lanes
#define TARGET
#define PV 4
#define EVEN {0, 2, 4, 6}
#define ODD {1, 3, 5, 7}
#define LOW {0, 4, 1, 5}
#define HIGH {2, 6, 3, 7}
#include "pool2_body.h"
#ifdef PD_SIMD_BUILDS
#define NAME(f) f##_avx2
#define TARGET __attribute__((target("avx2")))
#define PV 8
#define EVEN {0, 2, 4, 6, 8, 10, 12, 14}
#define ODD {1, 3, 5, 7, 9, 11, 13, 15}
#define LOW {0, 8, 1, 9, 2, 10, 3, 11}
#define HIGH {4, 12, 5, 13, 6, 14, 7, 15}
#include "pool2_body.h"
#define NAME(f) f##_avx512
#define TARGET __attribute__((target("avx512f,avx512dq")))
#define PV 16
#define EVEN {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30}
#define ODD {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31}
#define LOW {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23}
#define HIGH {8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31}
#include "pool2_body.h"
#endif

void pool2_forward(const float *x, float *y, int32_t *argmax, int planes, int h, int w, int relu) {
    static ForwardFn *volatile picked;   // the same answer on every thread: a race only repeats it
    if (picked == NULL) picked = PD_SIMD_PICK(forward);
    picked(x, y, argmax, planes, h, w, relu);
}

void pool2_backward(const float *dy, const float *y, const int32_t *argmax, float *dx, int planes, int h, int w) {
    static BackwardFn *volatile picked;
    if (picked == NULL) picked = PD_SIMD_PICK(backward);
    picked(dy, y, argmax, dx, planes, h, w);
}
