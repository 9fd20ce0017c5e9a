/*
 * conv_direct.c: stride-1 convolutions computed directly, without im2col (layers.h says when). LeNet's
 * convolutions have 6 and 16 output channels: as im2col and one GEMM, BLAS multiplies matrices 6 or 16
 * rows tall, where it reaches a tenth of its peak, after copying the input 25 times over. Here a tile of
 * output (a block of channels x one or two vectors of a row, or one vector of two rows) lives in vector
 * registers, and each filter tap is one load of the input row per vector and a multiply-add per
 * channel, with the tap's weights broadcast from a packed copy.
 *
 *   forward:  y = b + W * x, over x padded once per call into `cols` (kept for the backward pass)
 *   dx:       the same kernel, on dy padded by k - 1 - pad and W flipped with its channels swapped
 *   dW:       sums over the batch (in cache-sized chunks) and the output pixels, in vector registers:
 *             across a vector of columns, one accumulator per (channel, kernel column) of a kernel row;
 *             or, with 12 output channels or more, across channels, one accumulator per tap
 *
 * The kernels are conv_direct_kernels.h, built once per instruction-set level (conv_direct_sse2.c,
 * _avx2.c, _avx512.c) with tiles sized to that level's registers: the 16-float tiles first written for
 * AVX-512's 32 zmm spilled every accumulator in AVX2's 16 ymm (LeNet-5's step at 2.8% of the core's
 * peak). This file picks the table of the level simd.h says and serves layers.h's entry points from it.
 */
#include "conv_direct.h"
#include "core/simd.h"

static const ConvKernels *kernels(void) {
    return PD_SIMD_PICK(&conv_kernels);
}

int conv_direct_applies(const ConvShape *s) {
    return s->stride == 1 && s->pad <= s->k - 1 && s->k <= 7;
}

long conv_direct_cols_floats(const ConvShape *s, int B) {
    return kernels()->cols_floats(s, B);
}

long conv_direct_tmp_floats(const ConvShape *s, int B) {
    return kernels()->tmp_floats(s, B);
}

void conv_direct_forward(const ConvShape *s, const float *x, const float *W, const float *b, float *y, float *cols,
                         int B) {
    kernels()->forward(s, x, W, b, y, cols, B);
}

void conv_direct_backward(const ConvShape *s, const float *cols, const float *W, const float *dy, float *dW,
                          float *db, float *dx, float *tmp, int B, int accumulate) {
    kernels()->backward(s, cols, W, dy, dW, db, dx, tmp, B, accumulate);
}

void conv_bias_grad(const ConvShape *s, const float *dy, float *db, int B, int accumulate) {
    kernels()->bias_grad(s, dy, db, B, accumulate);
}
