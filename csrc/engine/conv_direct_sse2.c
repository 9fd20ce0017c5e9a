// conv_direct_sse2.c: conv_direct_kernels.h built for baseline x86-64's SSE2 (and any other CPU GCC builds for): 4 floats a vector, 16 registers.
#include "core/simd.h"
#define VL 4
#define REGS 16
#define CONV_KERNELS conv_kernels_sse2
#include "conv_direct_kernels.h"
