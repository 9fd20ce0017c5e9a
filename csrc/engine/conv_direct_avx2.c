// conv_direct_avx2.c: conv_direct_kernels.h built for AVX2 with FMA: 8 floats a vector, 16 ymm registers.
#include "core/simd.h"
#ifdef PD_SIMD_BUILDS
#pragma GCC target("avx2,fma")
#define VL 8
#define REGS 16
#define CONV_KERNELS conv_kernels_avx2
#include "conv_direct_kernels.h"
#endif
