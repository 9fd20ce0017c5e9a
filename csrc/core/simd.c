/*
 * simd.c: which instruction-set level the vector kernels run at (simd.h).
 */
#include "core/simd.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const NAMES[PD_SIMD_LEVELS] = {"sse2", "avx2", "avx512"};

const char *pd_simd_name(int level) {
    return level >= 0 && level < PD_SIMD_LEVELS ? NAMES[level] : "?";
}

int pd_simd_cpu_level(void) {
#ifdef PD_SIMD_BUILDS
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) {
        return PD_SIMD_AVX512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        return PD_SIMD_AVX2;
    }
#endif
    return PD_SIMD_SSE2;
}

// PYDIST_SIMD as a level; PD_SIMD_LEVELS when unset or empty, -1 when it names no level.
static int asked_level(void) {
    const char *cap = getenv("PYDIST_SIMD");
    if (cap == NULL || *cap == 0) {
        return PD_SIMD_LEVELS;
    }
    for (int l = 0; l < PD_SIMD_LEVELS; l++) {
        if (strcmp(cap, NAMES[l]) == 0) {
            return l;
        }
    }
    return -1;
}

int pd_simd_level(void) {
    static atomic_int known = -1;   // threads that race here all store the same answer
    int level = atomic_load_explicit(&known, memory_order_relaxed);
    if (level < 0) {
        int cpu = pd_simd_cpu_level(), asked = asked_level();
        level = asked >= 0 && asked < cpu ? asked : cpu;
        atomic_store_explicit(&known, level, memory_order_relaxed);
    }
    return level;
}

int pd_simd_check(char *err, size_t errlen) {
    int asked = asked_level(), cpu = pd_simd_cpu_level();
    if (asked < 0) {
        snprintf(err, errlen, "PYDIST_SIMD must be sse2, avx2 or avx512 (or unset: the widest this CPU runs, %s); got '%s'",
                 NAMES[cpu], getenv("PYDIST_SIMD"));
        return -1;
    }
    if (asked < PD_SIMD_LEVELS && asked > cpu) {
        snprintf(err, errlen, "PYDIST_SIMD=%s, but this CPU runs at most %s (%s); unset it, or set sse2%s",
                 NAMES[asked], NAMES[cpu],
                 asked == PD_SIMD_AVX512 ? "avx512 needs AVX-512 F, DQ, BW and VL" : "avx2 needs AVX2, FMA and F16C",
                 cpu == PD_SIMD_AVX2 ? " or avx2" : "");
        return -1;
    }
    return 0;
}
