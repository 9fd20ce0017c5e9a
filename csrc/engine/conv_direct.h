/*
 * conv_direct.h: the direct convolutions' kernels (conv_direct_kernels.h), one table of entry points per
 * instruction-set level; conv_direct.c picks the table of the level simd.h says and serves layers.h's
 * conv_direct_* and conv_bias_grad from it.
 */
#ifndef PYDIST_ENGINE_CONV_DIRECT_H
#define PYDIST_ENGINE_CONV_DIRECT_H

#include "layers.h"

typedef struct {
    long (*cols_floats)(const ConvShape *s, int B);
    long (*tmp_floats)(const ConvShape *s, int B);
    void (*forward)(const ConvShape *s, const float *x, const float *W, const float *b, float *y, float *cols, int B);
    void (*backward)(const ConvShape *s, const float *cols, const float *W, const float *dy, float *dW, float *db,
                     float *dx, float *tmp, int B, int accumulate);
    void (*bias_grad)(const ConvShape *s, const float *dy, float *db, int B, int accumulate);
} ConvKernels;

extern const ConvKernels conv_kernels_sse2, conv_kernels_avx2, conv_kernels_avx512;

#endif
