/*
 * minmax.h: MIN and MAX of floating-point values as pydist defines them, the one definition that every
 * path uses: the shared-memory kernels (shm.c, which the small collectives in shm_small.c call too) and
 * the MPI user ops (dtypes.c) that MPI's collectives, the persistent requests and the ring
 * (MPI_Reduce_local) reduce with. Plain C, no MPI, no Python.
 *
 * Why our own: a reduction's inputs meet in a different order on each path and, under MPI, on each
 * rank, and the usual (a < b ? a : b) is not commutative for NaN and signed zeros: MPICH's MPI_MIN gave
 * rank 0 [1.0, nan] and rank 1 [nan, 1.0] from the same inputs. The rule here is a commutative and
 * associative choice of one input's bits, so any order on any rank gives bitwise the same result:
 *   - any NaN among the inputs gives NaN (as np.minimum/np.maximum); of several NaNs, the one whose
 *     bits are the largest unsigned integer (payload and sign kept, a signalling NaN is not quieted);
 *   - otherwise the smallest (MIN) or largest (MAX) value, with -0.0 below +0.0: MIN(-0.0, +0.0) is
 *     -0.0 and MAX(-0.0, +0.0) is +0.0.
 * At one rank nothing is reduced and the result is the input, which this rule also gives.
 *
 * It works on the bits, branch-free, so the kernels' loops vectorize. key() makes a signed integer
 * that orders as the values do (IEEE's totalOrder on non-NaNs): negatives flip their magnitude bits,
 * so -0.0 is -1 and +0.0 is 0. A NaN is a magnitude above infinity's; non-NaNs count as 0 in the NaN
 * choice, and no NaN's bits are 0, so "any NaN" is "the chosen NaN bits are not 0".
 * The same code serves float16 and bfloat16 (16 bits, infinity 0x7c00 and 0x7f80), float32 and float64.
 */
#ifndef PYDIST_ALGORITHMS_MINMAX_H
#define PYDIST_ALGORITHMS_MINMAX_H

#include <stdint.h>

#define PD_F16_INF 0x7c00u
#define PD_BF16_INF 0x7f80u
#define PD_F32_INF 0x7f800000u
#define PD_F64_INF 0x7ff0000000000000u

// NAME(a, b, inf): the bits of MIN (CMP <) or MAX (CMP >) of the floats with bits a and b; U the
// unsigned and S the signed integer of their width, inf the bits of +infinity.
#define PD_FLOAT_MINMAX(NAME, U, S, CMP)                                                           \
    static inline U NAME(U a, U b, U inf) {                                                        \
        const U sign = (U)((U)1 << (sizeof(U) * 8 - 1)), mag = (U)(sign - 1);                      \
        S ka = (S)(U)(a ^ ((a & sign) ? mag : 0)), kb = (S)(U)(b ^ ((b & sign) ? mag : 0));        \
        U na = (U)(a & mag) > inf ? a : 0, nb = (U)(b & mag) > inf ? b : 0;                        \
        U nan = na > nb ? na : nb;                                                                 \
        return nan ? nan : (ka CMP kb ? a : b);                                                    \
    }

PD_FLOAT_MINMAX(pd_fmin16, uint16_t, int16_t, <)
PD_FLOAT_MINMAX(pd_fmax16, uint16_t, int16_t, >)
PD_FLOAT_MINMAX(pd_fmin32, uint32_t, int32_t, <)
PD_FLOAT_MINMAX(pd_fmax32, uint32_t, int32_t, >)
PD_FLOAT_MINMAX(pd_fmin64, uint64_t, int64_t, <)
PD_FLOAT_MINMAX(pd_fmax64, uint64_t, int64_t, >)

#undef PD_FLOAT_MINMAX

#endif  // PYDIST_ALGORITHMS_MINMAX_H
