// conv_direct_avx512.c: conv_direct_kernels.h built for AVX-512: 16 floats a vector, 32 zmm registers.
#include "core/simd.h"
#ifdef PD_SIMD_BUILDS
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,fma")
#define VL 16
#define REGS 32
#define CONV_KERNELS conv_kernels_avx512
#include "conv_direct_kernels.h"
#endif
