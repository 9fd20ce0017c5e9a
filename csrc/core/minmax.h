/*
 * minmax.h: MIN and MAX of floating-point values as pydist defines them, the one definition that every
 * path uses: the shared-memory kernels (shm.c, which the small collectives in shm_small.c call too) and
 * the MPI user ops (dtypes.c) that MPI's collectives, the persistent requests and the ring
 * (MPI_Reduce_local) reduce with. Plain C, no MPI, no Python.
 *
 * Why our own: a reduction's inputs meet in a different order on each path and, under MPI, on each
 * rank, and the usual (a < b ? a : b) is not commutative for NaN and signed zeros: MPICH's MPI_MIN gave
 * rank 0 [1.0, nan] and rank 1 [nan, 1.0] from the same inputs. The rule here is commutative and
 * associative, so any order on any rank gives bitwise the same result:
 *   - any NaN among the inputs gives NaN (as np.minimum/np.maximum), the format's canonical quiet NaN
 *     (sign 0, top mantissa bit alone: float32 0x7fc00000), whatever NaNs came in;
 *   - otherwise the smallest (MIN) or largest (MAX) value, with -0.0 below +0.0: MIN(-0.0, +0.0) is
 *     -0.0 and MAX(-0.0, +0.0) is +0.0 (the only equal values with different bits).
 * A reduction over one rank combines nothing: its result is the input, NaN payload and all.
 *
 * Why a canonical NaN rather than one of the inputs': so that the test for it is one unordered compare
 * and one select. Branch-free with compare masks, float32 MIN/MAX cost 7 vector operations (the old,
 * order-dependent (a < b || a != a) ? a : b cost 4); choosing among several NaNs by their bits took 13
 * and ran the kernel at half its old speed. benchmarks/minmax_kernels.c measures the kernels. (GCC 12
 * leaves the float64 loops scalar in shm.c's baseline SSE2 clone, which only CPUs without AVX2 run.)
 */
#ifndef PYDIST_ALGORITHMS_MINMAX_H
#define PYDIST_ALGORITHMS_MINMAX_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define PD_F16_INF 0x7c00u
#define PD_BF16_INF 0x7f80u
#define PD_F16_QNAN 0x7e00u
#define PD_BF16_QNAN 0x7fc0u
#define PD_F32_QNAN 0x7fc00000u
#define PD_F64_QNAN 0x7ff8000000000000u

// x, or the canonical quiet NaN when x is a NaN (dtypes.c's SUM/PRODUCT ops: which NaN IEEE
// arithmetic gives depends on the operands' order). One compare and one select: loops vectorise.
static inline float pd_canon_f32(float x) {
    const uint32_t bits = PD_F32_QNAN;
    float nan;
    memcpy(&nan, &bits, sizeof nan);
    return x == x ? x : nan;
}

static inline double pd_canon_f64(double x) {
    const uint64_t bits = PD_F64_QNAN;
    double nan;
    memcpy(&nan, &bits, sizeof nan);
    return x == x ? x : nan;
}

// float32 and float64, on their values. Masks, not ?:, so that GCC vectorizes the loops with compares
// and ands (its if-conversion of nested ?: made chains of blends at twice the cost). U: the bits'
// unsigned integer; the result's bits.
#define PD_FLOAT_MINMAX(T, U, BITS, QNAN)                                                          \
    static inline U pd_fmin##BITS(U a, U b) {                                                      \
        T x, y;                                                                                    \
        memcpy(&x, &a, sizeof x);                                                                  \
        memcpy(&y, &b, sizeof y);                                                                  \
        U lt = -(U)(x < y), eq = -(U)(x == y), nan = -(U)isunordered(x, y);                        \
        U m = (b ^ ((a ^ b) & lt)) | (a & eq);   /* equal: a | b, -0.0 if either is */             \
        return (m & ~nan) | ((U)QNAN & nan);                                                       \
    }                                                                                              \
    static inline U pd_fmax##BITS(U a, U b) {                                                      \
        T x, y;                                                                                    \
        memcpy(&x, &a, sizeof x);                                                                  \
        memcpy(&y, &b, sizeof y);                                                                  \
        U gt = -(U)(x > y), eq = -(U)(x == y), nan = -(U)isunordered(x, y);                        \
        U m = (b ^ ((a ^ b) & gt)) & (a | ~eq);   /* equal: a & b, +0.0 if either is */            \
        return (m & ~nan) | ((U)QNAN & nan);                                                       \
    }

PD_FLOAT_MINMAX(float, uint32_t, 32, PD_F32_QNAN)
PD_FLOAT_MINMAX(double, uint64_t, 64, PD_F64_QNAN)
#undef PD_FLOAT_MINMAX

// float16 and bfloat16 (no vector compares for them): on the bits, inf being +infinity's (0x7c00 or
// 0x7f80). key() is a signed integer that orders as the values do: negatives flip their magnitude
// bits, so -0.0 is -1 and +0.0 is 0. A NaN is a magnitude above infinity's.
static inline int16_t pd_half_key(uint16_t a) {
    return (int16_t)(a ^ ((uint16_t)((int16_t)a >> 15) & 0x7fffu));
}

static inline uint16_t pd_half_minmax(uint16_t a, uint16_t b, uint16_t inf, int max) {
    const uint16_t qnan = (uint16_t)(inf | ((inf & -inf) >> 1));   // the top mantissa bit set
    int16_t ka = pd_half_key(a), kb = pd_half_key(b);
    uint16_t pick_a = -(uint16_t)(max ? ka > kb : ka < kb);
    uint16_t nan = -(uint16_t)(((a & 0x7fffu) > inf) | ((b & 0x7fffu) > inf));
    uint16_t m = b ^ ((a ^ b) & pick_a);
    return (uint16_t)((m & ~nan) | (qnan & nan));
}

static inline uint16_t pd_fmin16(uint16_t a, uint16_t b, uint16_t inf) {
    return pd_half_minmax(a, b, inf, 0);
}

static inline uint16_t pd_fmax16(uint16_t a, uint16_t b, uint16_t inf) {
    return pd_half_minmax(a, b, inf, 1);
}

#endif  // PYDIST_ALGORITHMS_MINMAX_H
