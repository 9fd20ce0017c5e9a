// conv_wide.c: conv_direct_kernels.h at 16 floats a vector and 32 registers (the AVX-512 build's tile
// sizes and paths) compiled for AVX2, where GCC lowers each 16-float vector to two: the same loops, tile
// choices and offsets as the AVX-512 build, runnable on a CPU without AVX-512. tests/c/conv_levels.c
// checks it with the others.
#include "core/simd.h"
#ifdef PD_SIMD_BUILDS
#pragma GCC target("avx2,fma")
#define VL 16
#define REGS 32
#define CONV_KERNELS conv_kernels_wide
#include "engine/conv_direct_kernels.h"
#endif
