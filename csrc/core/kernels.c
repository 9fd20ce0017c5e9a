/*
 * kernels.c: the reduction kernels every path computes with (acc[i] = acc[i] (op) in[i] for each dtype and
 * op, as NumPy computes it), the copies the shared-memory paths move data with, and float16/bfloat16
 * <-> float32. dtypes.c's MPI user ops reduce with them too, so every path gives bitwise the same
 * result on every rank. Plain C: no Python, no MPI.
 */
// The reduction loops are the hot path: vectorize them (GCC's -O2 cost model leaves them scalar), once
// per instruction-set level (simd.h; the end of the kernels' section): AVX2 is 10-15% faster at 1-4 MiB
// than the baseline's SSE2. Every level gives bitwise the same result: each element is one operation
// on the same two inputs (C11 mode keeps GCC from contracting multiply-adds), whatever the width.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#define KERNEL static inline __attribute__((always_inline))   // built per level by SHM_KERNELS below

#include "core/kernels.h"
#include "core/minmax.h"
#include "core/simd.h"

#include <math.h>
#include <string.h>

// Reductions run block by block through a buffer that stays in L1, then go to each output.
#define BLOCK_BYTES 16384
// How far ahead copies and reductions prefetch what they read. Much of what they read was just written
// by the peer core (its staging buffer) and is fetched from that core's cache a line at a time unless
// asked for ahead: glibc's memcpy (rep movsb at these sizes) read such a buffer at 1.3 GB/s where this
// loop of 64-byte moves, prefetching, reads it at 27 GB/s.
#define PREFETCH_BYTES 2048


// ---------------------------------------------------------------------------------------------------
// float16 <-> float32, bit-exact with NumPy (round to nearest, ties to even).

float pd_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {                 // inf / nan
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {             // normal
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {            // zero
        bits = sign;
    } else {                           // subnormal: value = mant * 2^-24, exact in float
        float f = (float)mant * 5.9604644775390625e-8f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

uint16_t pd_float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) {                       // inf or nan (keep nan quiet)
        return sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u | ((absx >> 13) & 0x3ffu) : 0);
    }
    if (absx >= 0x477ff000u) {                       // rounds to >= 65520: overflow to inf
        return sign | 0x7c00u;
    }
    if (absx < 0x38800000u) {                        // below the smallest normal half: subnormal
        if (absx < 0x33000000u) {                    // below half the smallest subnormal: zero
            return sign;
        }
        uint32_t e = absx >> 23;
        uint32_t m = (absx & 0x7fffffu) | 0x800000u; // implicit bit
        uint32_t shift = 126 - e;                    // 14 + (113 - e) - 1 ... bits to drop
        uint32_t half_m = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (half_m & 1u))) {
            half_m++;
        }
        return sign | (uint16_t)half_m;
    }
    // normal: rebias exponent (127 -> 15) and round the 23-bit mantissa to 10 bits
    uint32_t h = ((absx >> 13) - (112u << 10));
    uint32_t rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) {
        h++;                                         // may carry into the exponent: still correct
    }
    return sign | (uint16_t)h;
}

// bfloat16 is float32's top half: widening is exact; narrowing rounds to nearest even as torch's
// c10::BFloat16 does, and keeps NaN quiet.
float pd_bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

uint16_t pd_float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((x >> 16) | 0x40u);
    }
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

// The same conversions for the shared-memory all-reduce's kernels (algorithms/shm.c).

static const char *const DTYPE_NAMES[SHM_DTYPES] = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                                                    "uint32", "uint64", "float16", "float32", "float64",
                                                    "complex64", "complex128", "bfloat16"};
static const size_t ITEMSIZE[SHM_DTYPES] = {1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 4, 8, 8, 16, 2};
static const char *const OP_NAMES[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"};

const char *shm_dtype_name(int dtype) {
    return dtype >= 0 && dtype < SHM_DTYPES ? DTYPE_NAMES[dtype] : "?";
}

size_t shm_itemsize(int dtype) {
    return dtype >= 0 && dtype < SHM_DTYPES ? ITEMSIZE[dtype] : 1;
}

const char *shm_op_name(int op) {
    return op >= 0 && op < 8 ? OP_NAMES[op] : "?";
}

// ---------------------------------------------------------------------------------------------------
// Kernels: acc[i] = acc[i] (op) in[i], as NumPy computes it pairwise (integers wrap, bool is logical,
// float16 and bfloat16 round after each step); floating MIN/MAX as minmax.h defines them (NaN
// propagates as with np.minimum/np.maximum, and the result does not depend on the order).

#define LOOP(T, expr)                                                                              \
    do {                                                                                           \
        T *restrict a_ = (T *)acc;                                                                 \
        const T *restrict b_ = (const T *)in;                                                      \
        for (size_t i = 0; i < n; i++) {                                                           \
            T x = a_[i], y = b_[i];                                                                \
            a_[i] = (T)(expr);                                                                     \
        }                                                                                          \
        return;                                                                                    \
    } while (0)

// Signed integers add and multiply as their unsigned twins (wrapping, never undefined behaviour).
#define INT_OPS(T, UT)                                                                             \
    switch (op) {                                                                                  \
    case SHM_SUM: LOOP(UT, x + y);                                                                 \
    case SHM_PRODUCT: LOOP(UT, (x + 0u) * y);                                                      \
    case SHM_MIN: LOOP(T, x < y ? x : y);                                                          \
    case SHM_MAX: LOOP(T, x > y ? x : y);                                                          \
    case SHM_BAND: LOOP(UT, x & y);                                                                \
    case SHM_BOR: LOOP(UT, x | y);                                                                 \
    case SHM_BXOR: LOOP(UT, x ^ y);                                                                \
    default: return;                                                                               \
    }

// MIN/MAX on the bits, by minmax.h's rule (U: the unsigned integer of T's width).
#define FLOAT_OPS(T, U, BITS)                                                                      \
    switch (op) {                                                                                  \
    case SHM_SUM: case SHM_AVG: LOOP(T, x + y);                                                    \
    case SHM_PRODUCT: LOOP(T, x * y);                                                              \
    case SHM_MIN: LOOP(U, pd_fmin##BITS(x, y));                                                    \
    case SHM_MAX: LOOP(U, pd_fmax##BITS(x, y));                                                    \
    default: return;                                                                               \
    }

// Complex: SUM componentwise; PRODUCT by the textbook formula, as MPI computes it.
#define COMPLEX_OPS(T)                                                                             \
    do {                                                                                           \
        T *restrict a_ = (T *)acc;                                                                 \
        const T *restrict b_ = (const T *)in;                                                      \
        if (op == SHM_SUM || op == SHM_AVG) {                                                      \
            for (size_t i = 0; i < 2 * n; i++) a_[i] += b_[i];                                     \
        } else if (op == SHM_PRODUCT) {                                                            \
            for (size_t i = 0; i < n; i++) {                                                       \
                T ar = a_[2 * i], ai = a_[2 * i + 1], br = b_[2 * i], bi = b_[2 * i + 1];          \
                a_[2 * i] = ar * br - ai * bi;                                                     \
                a_[2 * i + 1] = ar * bi + ai * br;                                                 \
            }                                                                                      \
        }                                                                                          \
        return;                                                                                    \
    } while (0)

#define HALF_LOOP(widen, narrow, expr)                                                             \
    do {                                                                                           \
        uint16_t *a_ = (uint16_t *)acc;                                                            \
        const uint16_t *b_ = (const uint16_t *)in;                                                 \
        for (size_t i = 0; i < n; i++) {                                                           \
            float x = widen(a_[i]), y = widen(b_[i]);                                              \
            a_[i] = narrow(expr);                                                                  \
        }                                                                                          \
        return;                                                                                    \
    } while (0)

// MIN/MAX pick one input, so they need no widening: on the bits, by minmax.h's rule.
#define HALF_OPS(widen, narrow, INF)                                                               \
    switch (op) {                                                                                  \
    case SHM_SUM: case SHM_AVG: HALF_LOOP(widen, narrow, x + y);                                   \
    case SHM_PRODUCT: HALF_LOOP(widen, narrow, x * y);                                             \
    case SHM_MIN: LOOP(uint16_t, pd_fmin16(x, y, INF));                                            \
    case SHM_MAX: LOOP(uint16_t, pd_fmax16(x, y, INF));                                            \
    default: return;                                                                               \
    }

KERNEL void combine(void *acc, const void *in, size_t n, int dtype, int op) {
    switch (dtype) {
    case SHM_BOOL:
        switch (op) {
        case SHM_SUM: case SHM_MAX: case SHM_BOR: LOOP(uint8_t, (x | y) != 0);
        case SHM_PRODUCT: case SHM_MIN: case SHM_BAND: LOOP(uint8_t, x != 0 && y != 0);
        case SHM_BXOR: LOOP(uint8_t, (x != 0) != (y != 0));
        default: return;
        }
    case SHM_I8: INT_OPS(int8_t, uint8_t)
    case SHM_I16: INT_OPS(int16_t, uint16_t)
    case SHM_I32: INT_OPS(int32_t, uint32_t)
    case SHM_I64: INT_OPS(int64_t, uint64_t)
    case SHM_U8: INT_OPS(uint8_t, uint8_t)
    case SHM_U16: INT_OPS(uint16_t, uint16_t)
    case SHM_U32: INT_OPS(uint32_t, uint32_t)
    case SHM_U64: INT_OPS(uint64_t, uint64_t)
    case SHM_F16: HALF_OPS(pd_half_to_float, pd_float_to_half, PD_F16_INF)
    case SHM_BF16: HALF_OPS(pd_bf16_to_float, pd_float_to_bf16, PD_BF16_INF)
    case SHM_F32: FLOAT_OPS(float, uint32_t, 32)
    case SHM_F64: FLOAT_OPS(double, uint64_t, 64)
    case SHM_C64: COMPLEX_OPS(float);
    case SHM_C128: COMPLEX_OPS(double);
    default: return;
    }
}

// AVG: the sum divided by the group size, as pd_divide_inplace does it (componentwise for complex).
KERNEL void divide(void *acc, size_t n, int dtype, int by) {
    switch (dtype) {
    case SHM_F16: {
        uint16_t *p = acc;
        for (size_t i = 0; i < n; i++) p[i] = pd_float_to_half(pd_half_to_float(p[i]) / (float)by);
        return;
    }
    case SHM_BF16: {
        uint16_t *p = acc;
        for (size_t i = 0; i < n; i++) p[i] = pd_float_to_bf16(pd_bf16_to_float(p[i]) / (float)by);
        return;
    }
    case SHM_F32: case SHM_C64: {
        float *p = acc;
        for (size_t i = 0; i < n * (dtype == SHM_C64 ? 2 : 1); i++) p[i] /= (float)by;
        return;
    }
    case SHM_F64: case SHM_C128: {
        double *p = acc;
        for (size_t i = 0; i < n * (dtype == SHM_C128 ? 2 : 1); i++) p[i] /= (double)by;
        return;
    }
    default: return;
    }
}

// dst[0..n) = src[0..n), a line at a time, both asked for PREFETCH_BYTES ahead (see there).
KERNEL void copy_bytes(char *restrict dst, const char *restrict src, size_t n) {
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __builtin_prefetch(src + i + PREFETCH_BYTES);
        __builtin_prefetch(dst + i + PREFETCH_BYTES, 1);
        memcpy(dst + i, src + i, 64);
    }
    memcpy(dst + i, src + i, n - i);
}

// outs[0..n_outs)[0..len) = the reduction of ins[0..R)[0..len), in rank order, block by block. The
// pass that copies ins[0] into the block also prefetches every input ahead, so that each combine
// finds its input in cache.
KERNEL void reduce_slice(char *const *outs, int n_outs, char *const *ins, int R, size_t len, int dtype, int op) {
    _Alignas(64) char tmp[BLOCK_BYTES];
    const size_t isz = ITEMSIZE[dtype], per_block = BLOCK_BYTES / isz;
    for (size_t start = 0; start < len; start += per_block) {
        size_t b = len - start < per_block ? len - start : per_block, off = start * isz, bytes = b * isz, i = 0;
        for (; i + 64 <= bytes; i += 64) {
            for (int r = 0; r < R; r++) {
                __builtin_prefetch(ins[r] + off + i + PREFETCH_BYTES);
            }
            memcpy(tmp + i, ins[0] + off + i, 64);
        }
        memcpy(tmp + i, ins[0] + off + i, bytes - i);
        for (int r = 1; r < R; r++) {
            combine(tmp, ins[r] + off, b, dtype, op);
        }
        if (op == SHM_AVG) {
            divide(tmp, b, dtype, R);
        }
        for (int o = 0; o < n_outs; o++) {
            copy_bytes(outs[o] + off, tmp, bytes);
        }
    }
}

// The kernels above, built for each level: the loops vectorize for the width of the function they are
// inlined into.
#define SHM_KERNELS(level, attr)                                                                        \
    attr static void combine_##level(void *acc, const void *in, size_t n, int dtype, int op) {           \
        combine(acc, in, n, dtype, op);                                                                  \
    }                                                                                                    \
    attr static void reduce_##level(char *const *outs, int n_outs, char *const *ins, int R, size_t len,  \
                                    int dtype, int op) {                                                 \
        reduce_slice(outs, n_outs, ins, R, len, dtype, op);                                              \
    }                                                                                                    \
    attr static void copy_##level(char *restrict dst, const char *restrict src, size_t n) {              \
        copy_bytes(dst, src, n);                                                                         \
    }
SHM_KERNELS(sse2, )
#ifdef PD_SIMD_BUILDS
SHM_KERNELS(avx2, __attribute__((target("avx2"))))
SHM_KERNELS(avx512, __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl"))))
#endif

void shm_copy_lines(char *restrict dst, const char *restrict src, size_t n) {
    PD_SIMD_PICK(copy)(dst, src, n);
}

void shm_combine(void *acc, const void *in, size_t n, int dtype, int op) {
    PD_SIMD_PICK(combine)(acc, in, n, dtype, op);
}

void shm_reduce(char *const *outs, int n_outs, char *const *ins, int R, size_t len, int dtype, int op) {
    PD_SIMD_PICK(reduce)(outs, n_outs, ins, R, len, dtype, op);
}

// The small collectives' copies (at most a slot, 64 KiB): libc's memcpy, whose wide moves beat
// copy_bytes' line-at-a-time prefetching there (all_to_all at 8 KiB, 2 ranks: 2.11 -> 1.76 us in
// benchmarks/collectives_sweep.py).
void shm_copy(void *dst, const void *src, size_t n) {
    memcpy(dst, src, n);
}
