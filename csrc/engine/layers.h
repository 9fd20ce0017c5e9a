/*
 * layers.h: the forward and backward kernels of the engine's layers, on float32 NCHW batches.
 * Plain C, no Python.h, no MPI: a model (model.c) strings them together.
 *
 * Weights are laid out exactly as PyTorch's: Linear weight (out, in) row-major, Conv2d weight
 * (out_c, in_c, kh, kw), then the bias, so a flat buffer of ours equals torch's parameters()
 * concatenated. Backward kernels overwrite (not accumulate) the gradients they produce.
 */
#ifndef PYDIST_ENGINE_LAYERS_H
#define PYDIST_ENGINE_LAYERS_H

#include <stdint.h>
#include <string.h>

#include "pool2.h"

// y (B, out) = x (B, in) W^T + b
void linear_forward(const float *x, const float *W, const float *b, float *y, int B, int in, int out);
// dW = dy^T x, db = sum_B dy, dx = dy W (dx may be NULL: the first layer needs none). accumulate:
// dW and db are added to instead (the sum over a pipeline's micro-batches).
void linear_backward(const float *x, const float *W, const float *dy, float *dW, float *db, float *dx,
                     int B, int in, int out, int accumulate);

typedef struct {
    int in_c, in_h, in_w;     // input (C, H, W)
    int out_c, k, stride, pad;
    int out_h, out_w;         // (in + 2 pad - k) / stride + 1
} ConvShape;

// y (B, out_c, out_h, out_w) = conv(x, W) + b, by im2col of the whole batch into `cols`
// (conv_cols_floats) and one GEMM into `tmp` (conv_tmp_floats), which is then put in NCHW order.
long conv_cols_floats(const ConvShape *s, int B);
long conv_tmp_floats(const ConvShape *s, int B);
void conv2d_forward(const ConvShape *s, const float *x, const float *W, const float *b, float *y, float *cols,
                    float *tmp, int B);
// dW, db (added to when accumulate) from dy and the forward pass's `cols`; dx (may be NULL) by GEMM into `cols` (overwritten),
// then col2im. `tmp` as above.
void conv2d_backward(const ConvShape *s, float *cols, const float *W, const float *dy, float *dW, float *db,
                     float *dx, float *tmp, int B, int accumulate);

// Stride-1 convolutions with pad <= k - 1 and k <= 7 (LeNet's) run directly (conv_direct.c), with no
// im2col: `cols` then holds the padded input and packed weights, `tmp` dy's padded copies. The
// functions above take that path themselves; these are its parts.
int conv_direct_applies(const ConvShape *s);
long conv_direct_cols_floats(const ConvShape *s, int B);
long conv_direct_tmp_floats(const ConvShape *s, int B);
void conv_direct_forward(const ConvShape *s, const float *x, const float *W, const float *b, float *y, float *cols,
                         int B);
void conv_direct_backward(const ConvShape *s, const float *cols, const float *W, const float *dy, float *dW,
                          float *db, float *dx, float *tmp, int B, int accumulate);
// db (added to when accumulate) = the sum of dy over examples and pixels, per example in float, over
// examples in double (both paths use it).
void conv_bias_grad(const ConvShape *s, const float *dy, float *db, int B, int accumulate);

// Max pooling with a k x k window and stride k over (B*C) planes of h x w; out is (h/k) x (w/k).
// argmax records, per output, the input offset of the maximum (the first one on ties, as PyTorch).
void maxpool_forward(const float *x, float *y, int32_t *argmax, int planes, int h, int w, int k);
void maxpool_backward(const float *dy, const int32_t *argmax, float *dx, int planes, int h, int w, int k);
// A ReLU and then that max pooling in one pass: y = maxpool(relu(x)) = relu(maxpool(x)), argmax that of
// x. Backward: dx (of the ReLU's input) gets dy at each window's argmax where y > 0, and 0 elsewhere.
void relu_maxpool_forward(const float *x, float *y, int32_t *argmax, int planes, int h, int w, int k);
void relu_maxpool_backward(const float *dy, const float *y, const int32_t *argmax, float *dx, int planes, int h,
                           int w, int k);

void relu_forward(const float *x, float *y, long n);
// dx = dy where y > 0, else 0 (PyTorch's threshold_backward on the output)
void relu_backward(const float *y, const float *dy, float *dx, long n);

// Mean over the batch of -log_softmax(logits)[label]; dlogits = (softmax - onehot) / B.
// Returns the mean loss; *correct (may be NULL) counts argmax == label. dlogits may be NULL.
double log_softmax_nll(const float *logits, const int32_t *labels, float *dlogits, int B, int classes,
                       int *correct);

#endif  // PYDIST_ENGINE_LAYERS_H
