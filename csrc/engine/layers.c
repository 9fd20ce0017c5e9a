/*
 * layers.c: forward and backward kernels (see layers.h). Matrix products go through CBLAS (OpenBLAS);
 * a convolution is im2col of the whole batch and one GEMM, so BLAS sees large matrices.
 */
#include "layers.h"

#include "blas.h"
#include <math.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

// ---------------------------------------------------------------------------------------------------
// Linear

void linear_forward(const float *x, const float *W, const float *b, float *y, int B, int in, int out) {
    for (int n = 0; n < B; n++) {
        memcpy(y + (long)n * out, b, sizeof(float) * out);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, out, in, 1.0f, x, in, W, in, 1.0f, y, out);
}

void linear_backward(const float *x, const float *W, const float *dy, float *dW, float *db, float *dx,
                     int B, int in, int out, int accumulate) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, B, 1.0f, dy, out, x, in, accumulate ? 1.0f : 0.0f,
                dW, in);
    for (int o = 0; !accumulate && o < out; o++) {
        db[o] = 0.0f;
    }
    for (int n = 0; n < B; n++) {
        const float *row = dy + (long)n * out;
        for (int o = 0; o < out; o++) {
            db[o] += row[o];
        }
    }
    if (dx != NULL) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, in, out, 1.0f, dy, out, W, in, 0.0f, dx, in);
    }
}

// ---------------------------------------------------------------------------------------------------
// Conv2d: cols is (in_c*k*k, B*out_h*out_w), column n*ohw + p holding the patch under output pixel p
// of sample n; tmp is (out_c, B*ohw), the GEMM's output before it is put back into NCHW order.

long conv_cols_floats(const ConvShape *s, int B) {
    if (conv_direct_applies(s)) return conv_direct_cols_floats(s, B);
    return (long)s->in_c * s->k * s->k * B * s->out_h * s->out_w;
}

long conv_tmp_floats(const ConvShape *s, int B) {
    if (conv_direct_applies(s)) return conv_direct_tmp_floats(s, B);
    return (long)s->out_c * B * s->out_h * s->out_w;
}

// The output columns oj whose input column oj*stride - pad + kj lies inside [0, in_w): [lo, hi).
static void valid_span(const ConvShape *s, int kj, int *lo, int *hi) {
    int first = s->pad - kj, a = first > 0 ? (first + s->stride - 1) / s->stride : 0;
    int b = (s->in_w - 1 + s->pad - kj) / s->stride + 1;  // one past the last valid oj
    if (s->in_w - 1 + s->pad - kj < 0) b = 0;
    *lo = a < s->out_w ? a : s->out_w;
    *hi = b < s->out_w ? (b > *lo ? b : *lo) : s->out_w;
}

// The short rows of im2col (a patch row is out_w floats, 28 or 10 in LeNet): as calls to memcpy and
// memset they cost more than the copying itself (a tenth of the step). So: 4 floats at a time, the
// last 4 overlapping what is already written; n < 4 one by one. GCC turns such loops back into calls
// (its loop distribution), hence the pragma, for these helpers and im2col only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-tree-loop-distribute-patterns")
#endif
static inline void copy_row(float *restrict dst, const float *restrict src, int n) {
#ifdef __SSE2__
    if (n >= 4) {
        for (int i = 0; i + 4 < n; i += 4) _mm_storeu_ps(dst + i, _mm_loadu_ps(src + i));
        _mm_storeu_ps(dst + n - 4, _mm_loadu_ps(src + n - 4));
        return;
    }
#endif
    for (int i = 0; i < n; i++) dst[i] = src[i];
}

static inline void zero_row(float *dst, int n) {
#ifdef __SSE2__
    if (n >= 4) {
        for (int i = 0; i + 4 < n; i += 4) _mm_storeu_ps(dst + i, _mm_setzero_ps());
        _mm_storeu_ps(dst + n - 4, _mm_setzero_ps());
        return;
    }
#endif
    for (int i = 0; i < n; i++) dst[i] = 0.0f;
}

static void im2col(const ConvShape *s, const float *restrict x, float *restrict cols, int B) {
    long ohw = (long)s->out_h * s->out_w, width = B * ohw;
    for (int c = 0; c < s->in_c; c++) {
        for (int ki = 0; ki < s->k; ki++) {
            for (int kj = 0; kj < s->k; kj++) {
                int lo, hi;
                valid_span(s, kj, &lo, &hi);
                float *row = cols + ((long)(c * s->k + ki) * s->k + kj) * width;
                for (int n = 0; n < B; n++) {
                    const float *plane = x + ((long)n * s->in_c + c) * s->in_h * s->in_w;
                    for (int oi = 0; oi < s->out_h; oi++) {
                        float *out = row + n * ohw + (long)oi * s->out_w;
                        int i = oi * s->stride - s->pad + ki;
                        if (i < 0 || i >= s->in_h || lo == hi) {
                            zero_row(out, s->out_w);
                            continue;
                        }
                        const float *in = plane + (long)i * s->in_w - s->pad + kj;
                        if (lo > 0 || hi < s->out_w) {   // the padding, then the row over it
                            zero_row(out, s->out_w);
                        }
                        if (s->stride == 1) {
                            copy_row(out + lo, in + lo, hi - lo);
                        } else {
                            for (int oj = lo; oj < hi; oj++) out[oj] = in[oj * s->stride];
                        }
                    }
                }
            }
        }
    }
}

// dst[i] += src[i] (restrict: the loop vectorizes)
static void add_floats(float *restrict dst, const float *restrict src, int n) {
    for (int i = 0; i < n; i++) {
        dst[i] += src[i];
    }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

// The adjoint of im2col: dx (zeroed here) receives the sum of every patch entry that came from it.
static void col2im(const ConvShape *s, const float *restrict cols, float *restrict dx, int B) {
    long ohw = (long)s->out_h * s->out_w, width = B * ohw;
    memset(dx, 0, sizeof(float) * (size_t)B * s->in_c * s->in_h * s->in_w);
    for (int c = 0; c < s->in_c; c++) {
        for (int ki = 0; ki < s->k; ki++) {
            for (int kj = 0; kj < s->k; kj++) {
                int lo, hi;
                valid_span(s, kj, &lo, &hi);
                const float *row = cols + ((long)(c * s->k + ki) * s->k + kj) * width;
                for (int n = 0; n < B; n++) {
                    float *plane = dx + ((long)n * s->in_c + c) * s->in_h * s->in_w;
                    for (int oi = 0; oi < s->out_h; oi++) {
                        int i = oi * s->stride - s->pad + ki;
                        if (i < 0 || i >= s->in_h) {
                            continue;
                        }
                        const float *in = row + n * ohw + (long)oi * s->out_w;
                        float *out = plane + (long)i * s->in_w - s->pad + kj;
                        if (s->stride == 1) {
                            add_floats(out + lo, in + lo, hi - lo);
                        } else {
                            for (int oj = lo; oj < hi; oj++) {
                                out[oj * s->stride] += in[oj];
                            }
                        }
                    }
                }
            }
        }
    }
}

// dst[i] = src[i] + bias: one block of the GEMM's output into NCHW order (restrict and a local bias,
// so the loop vectorizes).
static void add_bias_copy(float *restrict dst, const float *restrict src, float bias, long n) {
    for (long i = 0; i < n; i++) {
        dst[i] = src[i] + bias;
    }
}

void conv2d_forward(const ConvShape *s, const float *x, const float *W, const float *b, float *y, float *cols,
                    float *tmp, int B) {
    int patch = s->in_c * s->k * s->k;
    long ohw = (long)s->out_h * s->out_w, width = B * ohw;
    if (conv_direct_applies(s)) {
        conv_direct_forward(s, x, W, b, y, cols, B);
        return;
    }
    im2col(s, x, cols, B);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->out_c, (int)width, patch, 1.0f, W, patch, cols,
                (int)width, 0.0f, tmp, (int)width);
    for (int n = 0; n < B; n++) {
        for (int oc = 0; oc < s->out_c; oc++) {
            add_bias_copy(y + ((long)n * s->out_c + oc) * ohw, tmp + oc * width + n * ohw, b[oc], ohw);
        }
    }
}

void conv2d_backward(const ConvShape *s, float *cols, const float *W, const float *dy, float *dW, float *db,
                     float *dx, float *dtmp, int B, int accumulate) {
    int patch = s->in_c * s->k * s->k;
    long ohw = (long)s->out_h * s->out_w, width = B * ohw;
    if (conv_direct_applies(s)) {
        conv_direct_backward(s, cols, W, dy, dW, db, dx, dtmp, B, accumulate);
        return;
    }
    conv_bias_grad(s, dy, db, B, accumulate);
    for (int oc = 0; oc < s->out_c; oc++) {
        float *row = dtmp + oc * width;   // (B, ohw): this channel's gradients, from NCHW
        for (int n = 0; n < B; n++) {
            memcpy(row + n * ohw, dy + ((long)n * s->out_c + oc) * ohw, sizeof(float) * (size_t)ohw);
        }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s->out_c, patch, (int)width, 1.0f, dtmp, (int)width,
                cols, (int)width, accumulate ? 1.0f : 0.0f, dW, patch);
    if (dx != NULL) {  // cols is done with: it takes the patches' gradients
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, patch, (int)width, s->out_c, 1.0f, W, patch, dtmp,
                    (int)width, 0.0f, cols, (int)width);
        col2im(s, cols, dx, B);
    }
}

// ---------------------------------------------------------------------------------------------------
// MaxPool2d (kernel k, stride k), ReLU

static void pool_forward(const float *restrict x, float *restrict y, int32_t *restrict argmax, int planes, int h,
                         int w, int k, int relu) {
    if (k == 2) {   // LeNet's: pool2.c, in vectors
        pool2_forward(x, y, argmax, planes, h, w, relu);
        return;
    }
    int oh = h / k, ow = w / k;
    for (long p = 0; p < planes; p++) {
        const float *in = x + p * h * w;
        float *out = y + p * oh * ow;
        int32_t *arg = argmax + p * oh * ow;
        for (int oi = 0; oi < oh; oi++) {
            for (int oj = 0; oj < ow; oj++) {
                int best = (oi * k) * w + oj * k;
                float top = in[best];
                for (int di = 0; di < k; di++) {
                    for (int dj = 0; dj < k; dj++) {
                        int at = (oi * k + di) * w + oj * k + dj;
                        pool_take(in[at], at, &top, &best);
                    }
                }
                out[oi * ow + oj] = relu ? relu_of(top) : top;
                arg[oi * ow + oj] = best;
            }
        }
    }
}

void maxpool_forward(const float *x, float *y, int32_t *argmax, int planes, int h, int w, int k) {
    pool_forward(x, y, argmax, planes, h, w, k, 0);
}

void relu_maxpool_forward(const float *x, float *y, int32_t *argmax, int planes, int h, int w, int k) {
    pool_forward(x, y, argmax, planes, h, w, k, 1);
}

// y == NULL: plain max pooling; else relu's mask too (gradient only where the output is > 0).
static void pool_backward(const float *restrict dy, const float *restrict y, const int32_t *restrict argmax,
                          float *restrict dx, int planes, int h, int w, int k) {
    int oh = h / k, ow = w / k;
    if (k != 2 || oh * 2 != h || ow * 2 != w) {   // windows that leave inputs uncovered: zero, then scatter
        memset(dx, 0, sizeof(float) * (size_t)planes * h * w);
        for (long p = 0; p < planes; p++) {
            for (long o = p * oh * ow; o < (p + 1) * oh * ow; o++) {
                dx[p * h * w + argmax[o]] += y == NULL || y[o] > 0.0f ? dy[o] : 0.0f;
            }
        }
        return;
    }
    pool2_backward(dy, y, argmax, dx, planes, h, w);   // 2 x 2 windows tiling the plane: pool2.c
}

void maxpool_backward(const float *dy, const int32_t *argmax, float *dx, int planes, int h, int w, int k) {
    pool_backward(dy, NULL, argmax, dx, planes, h, w, k);
}

void relu_maxpool_backward(const float *dy, const float *y, const int32_t *argmax, float *dx, int planes, int h,
                           int w, int k) {
    pool_backward(dy, y, argmax, dx, planes, h, w, k);
}

void relu_forward(const float *restrict x, float *restrict y, long n) {
    for (long i = 0; i < n; i++) {
        y[i] = relu_of(x[i]);
    }
}

void relu_backward(const float *restrict y, const float *restrict dy, float *restrict dx, long n) {
    for (long i = 0; i < n; i++) {
        dx[i] = keep_if(dy[i], y[i] > 0.0f);
    }
}

// ---------------------------------------------------------------------------------------------------
// log-softmax + negative log-likelihood, averaged over the batch (PyTorch's cross_entropy)

double log_softmax_nll(const float *logits, const int32_t *labels, float *dlogits, int B, int classes,
                       int *correct) {
    double total = 0.0;
    int right = 0;
    for (int n = 0; n < B; n++) {
        const float *z = logits + (long)n * classes;
        int best = 0;
        float zmax = z[0];
        for (int c = 1; c < classes; c++) {
            if (z[c] > zmax) {
                zmax = z[c];
                best = c;
            }
        }
        double sum = 0.0;
        for (int c = 0; c < classes; c++) {
            sum += exp((double)(z[c] - zmax));
        }
        double log_norm = (double)zmax + log(sum);
        total += log_norm - (double)z[labels[n]];
        right += best == labels[n];
        if (dlogits != NULL) {
            float *d = dlogits + (long)n * classes;
            for (int c = 0; c < classes; c++) {
                d[c] = (float)((exp((double)z[c] - log_norm) - (c == labels[n])) / B);
            }
        }
    }
    if (correct != NULL) {
        *correct = right;
    }
    return total / B;
}
