/*
 * minmax_kernels.c: the shared-memory reduction kernels alone (shm_reduce of csrc/paths/algorithms/shm.c, the
 * loop every shm path and, through shm_combine, every MPI user op runs), one core, no MPI: GB/s of
 * input reduced for MIN, MAX and SUM (the control) per float dtype, two inputs into one output, at
 * 64 KiB (in cache) and 8 MiB (memory) per input. Built against a tree's shm.c, so that two trees'
 * kernels compare on the same machine in one session:
 *
 *   gcc -O3 -D_GNU_SOURCE -I csrc benchmarks/minmax_kernels.c csrc/paths/algorithms/shm.c -o /tmp/k_after
 *   gcc -O3 -D_GNU_SOURCE -I csrc benchmarks/minmax_kernels.c OTHER/csrc/paths/algorithms/shm.c -o /tmp/k_before
 *   /tmp/k_before; /tmp/k_after     (alternate a few times on a busy machine; the best of 5 runs is shown)
 *
 * The float16/bfloat16 conversions that shm.c takes from dtypes.c (which needs Python) are copied here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "algorithms/shm.h"

float pd_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {
        float f = (float)mant * 5.9604644775390625e-8f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

uint16_t pd_float_to_half(float f) {   // round to nearest even; enough for timing (no subnormal care)
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) {
        return sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u | ((absx >> 13) & 0x3ffu) : 0);
    }
    if (absx >= 0x477ff000u) {
        return sign | 0x7c00u;
    }
    if (absx < 0x38800000u) {
        return sign;
    }
    uint32_t h = ((absx >> 13) - (112u << 10)), rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) {
        h++;
    }
    return sign | (uint16_t)h;
}

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

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);   // CPU time: a busy machine takes the core away, not this
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(void) {
    const int dtypes[] = {SHM_F16, SHM_BF16, SHM_F32, SHM_F64};
    const char *dnames[] = {"float16", "bfloat16", "float32", "float64"};
    const int ops[] = {SHM_MIN, SHM_MAX, SHM_SUM};
    const char *onames[] = {"MIN", "MAX", "SUM"};
    const size_t sizes[] = {64 << 10, 8 << 20};
    char *a = aligned_alloc(64, 8 << 20), *b = aligned_alloc(64, 8 << 20), *out = aligned_alloc(64, 8 << 20);
    if (a == NULL || b == NULL || out == NULL) {
        return 1;
    }
    for (size_t i = 0; i < (8 << 20); i++) {   // small values of every sign; no NaN (the common case)
        a[i] = (char)(i * 7 % 61);
        b[i] = (char)(i * 13 % 59);
    }
    printf("%-9s %-4s %8s %10s\n", "dtype", "op", "input", "GB/s");
    for (int d = 0; d < 4; d++) {
        for (int o = 0; o < 3; o++) {
            for (int s = 0; s < 2; s++) {
                size_t bytes = sizes[s], n = bytes / shm_itemsize(dtypes[d]);
                char *ins[2] = {a, b}, *outs[1] = {out};
                int iters = (int)((32u << 20) / bytes);
                double best = 1e30;
                for (int rep = 0; rep < 5; rep++) {
                    double t0 = now();
                    for (int it = 0; it < iters; it++) {
                        shm_reduce(outs, 1, ins, 2, n, dtypes[d], ops[o]);
                    }
                    double t = (now() - t0) / iters;
                    best = t < best ? t : best;
                }
                printf("%-9s %-4s %5zu KiB %10.2f\n", dnames[d], onames[o], bytes >> 10, 2.0 * (double)bytes / best / 1e9);
            }
        }
    }
    free(a);
    free(b);
    free(out);
    return 0;
}
