/*
 * simd.h: the instruction-set level every vector kernel runs at, one answer for the whole process.
 * Plain C, no MPI, no Python: the engine's kernels, the shared-memory reductions and the compressors
 * all ask here, so PYDIST_SIMD caps every one of them at once.
 *
 *   sse2    baseline x86-64 (16 xmm registers, 4 floats)
 *   avx2    AVX2 + FMA + F16C, every x86-64 CPU since 2013 (16 ymm, 8 floats)
 *   avx512  AVX-512 F, DQ, BW and VL: Skylake-X and later, Zen 4 and later (32 zmm, 16 floats)
 *
 * The level is the widest the CPU runs, capped by PYDIST_SIMD (unset or empty: no cap). A cap the CPU
 * cannot run, or a name that is no level, is refused when pydist._C is imported (pd_simd_check), so
 * pd_simd_level() itself never fails: it clamps to what the CPU runs.
 */
#ifndef PYDIST_SIMD_H
#define PYDIST_SIMD_H

#include <stddef.h>

enum { PD_SIMD_SSE2 = 0, PD_SIMD_AVX2 = 1, PD_SIMD_AVX512 = 2, PD_SIMD_LEVELS = 3 };

// The level every kernel runs at (read once: PYDIST_SIMD and the CPU do not change under a process).
int pd_simd_level(void);
// The widest level this CPU runs.
int pd_simd_cpu_level(void);
// "sse2", "avx2" or "avx512".
const char *pd_simd_name(int level);
// 0 when PYDIST_SIMD is unset, empty or a level this CPU runs; else -1 and why in err.
int pd_simd_check(char *err, size_t errlen);

// Picks one of three builds of a kernel by the level: PD_SIMD_PICK(fn) is fn_sse2, fn_avx2 or fn_avx512.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PD_SIMD_BUILDS 1
#define PD_SIMD_PICK(fn) \
    (pd_simd_level() == PD_SIMD_AVX512 ? fn##_avx512 : pd_simd_level() == PD_SIMD_AVX2 ? fn##_avx2 : fn##_sse2)
#else
#define PD_SIMD_PICK(fn) fn##_sse2
#endif

#endif
