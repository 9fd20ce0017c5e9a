/*
 * layers.c: forward and backward kernels (see layers.h). Matrix products go through CBLAS (OpenBLAS);
 * a convolution is im2col of the whole batch and one GEMM, so BLAS sees large matrices.
 */
#include "layers.h"

#include <cblas.h>
#include <float.h>
#include <math.h>
#include <string.h>

// ---------------------------------------------------------------------------------------------------
// Linear

void linear_forward(const float *x, const float *W, const float *b, float *y, int B, int in, int out) {
    for (int n = 0; n < B; n++) {
        memcpy(y + (long)n * out, b, sizeof(float) * out);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, out, in, 1.0f, x, in, W, in, 1.0f, y, out);
}

void linear_backward(const float *x, const float *W, const float *dy, float *dW, float *db, float *dx,
                     int B, int in, int out) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, B, 1.0f, dy, out, x, in, 0.0f, dW, in);
    for (int o = 0; o < out; o++) {
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

long conv_scratch_floats(const ConvShape *s, int B) {
    long ohw = (long)s->out_h * s->out_w;
    return ((long)s->in_c * s->k * s->k + s->out_c) * B * ohw;
}

static void im2col(const ConvShape *s, const float *x, float *cols, int B) {
    long ohw = (long)s->out_h * s->out_w, width = B * ohw;
    for (int c = 0; c < s->in_c; c++) {
        for (int ki = 0; ki < s->k; ki++) {
            for (int kj = 0; kj < s->k; kj++) {
                float *row = cols + ((long)(c * s->k + ki) * s->k + kj) * width;
                for (int n = 0; n < B; n++) {
                    const float *plane = x + ((long)n * s->in_c + c) * s->in_h * s->in_w;
                    float *out = row + n * ohw;
                    for (int oi = 0; oi < s->out_h; oi++) {
                        int i = oi * s->stride - s->pad + ki;
                        for (int oj = 0; oj < s->out_w; oj++) {
                            int j = oj * s->stride - s->pad + kj;
                            int inside = i >= 0 && i < s->in_h && j >= 0 && j < s->in_w;
                            *out++ = inside ? plane[i * s->in_w + j] : 0.0f;
                        }
                    }
                }
            }
        }
    }
}

// The adjoint of im2col: dx (zeroed here) receives the sum of every patch entry that came from it.
static void col2im(const ConvShape *s, const float *cols, float *dx, int B) {
    long ohw = (long)s->out_h * s->out_w, width = B * ohw;
    memset(dx, 0, sizeof(float) * (size_t)B * s->in_c * s->in_h * s->in_w);
    for (int c = 0; c < s->in_c; c++) {
        for (int ki = 0; ki < s->k; ki++) {
            for (int kj = 0; kj < s->k; kj++) {
                const float *row = cols + ((long)(c * s->k + ki) * s->k + kj) * width;
                for (int n = 0; n < B; n++) {
                    float *plane = dx + ((long)n * s->in_c + c) * s->in_h * s->in_w;
                    const float *in = row + n * ohw;
                    for (int oi = 0; oi < s->out_h; oi++) {
                        int i = oi * s->stride - s->pad + ki;
                        for (int oj = 0; oj < s->out_w; oj++, in++) {
                            int j = oj * s->stride - s->pad + kj;
                            if (i >= 0 && i < s->in_h && j >= 0 && j < s->in_w) {
                                plane[i * s->in_w + j] += *in;
                            }
                        }
                    }
                }
            }
        }
    }
}

void conv2d_forward(const ConvShape *s, const float *x, const float *W, const float *b, float *y, float *cols, int B) {
    int patch = s->in_c * s->k * s->k;
    long ohw = (long)s->out_h * s->out_w, width = B * ohw;
    float *tmp = cols + (long)patch * width;
    im2col(s, x, cols, B);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->out_c, (int)width, patch, 1.0f, W, patch, cols,
                (int)width, 0.0f, tmp, (int)width);
    for (int n = 0; n < B; n++) {
        for (int oc = 0; oc < s->out_c; oc++) {
            const float *src = tmp + oc * width + n * ohw;
            float *dst = y + ((long)n * s->out_c + oc) * ohw;
            for (long p = 0; p < ohw; p++) {
                dst[p] = src[p] + b[oc];
            }
        }
    }
}

void conv2d_backward(const ConvShape *s, const float *x, const float *W, const float *dy, float *dW, float *db,
                     float *dx, float *cols, int B) {
    int patch = s->in_c * s->k * s->k;
    long ohw = (long)s->out_h * s->out_w, width = B * ohw;
    float *dtmp = cols + (long)patch * width;  // dy in the GEMM's (out_c, B*ohw) order
    for (int oc = 0; oc < s->out_c; oc++) {
        double sum = 0.0;
        for (int n = 0; n < B; n++) {
            const float *src = dy + ((long)n * s->out_c + oc) * ohw;
            float *dst = dtmp + oc * width + n * ohw;
            float part = 0.0f;
            for (long p = 0; p < ohw; p++) {
                dst[p] = src[p];
                part += src[p];
            }
            sum += part;
        }
        db[oc] = (float)sum;
    }
    im2col(s, x, cols, B);  // recomputed rather than kept from forward: memory for one layer only
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s->out_c, patch, (int)width, 1.0f, dtmp, (int)width,
                cols, (int)width, 0.0f, dW, patch);
    if (dx != NULL) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, patch, (int)width, s->out_c, 1.0f, W, patch, dtmp,
                    (int)width, 0.0f, cols, (int)width);
        col2im(s, cols, dx, B);
    }
}

// ---------------------------------------------------------------------------------------------------
// MaxPool2d (kernel k, stride k), ReLU

void maxpool_forward(const float *x, float *y, int32_t *argmax, int planes, int h, int w, int k) {
    int oh = h / k, ow = w / k;
    for (long p = 0; p < planes; p++) {
        const float *in = x + p * h * w;
        for (int oi = 0; oi < oh; oi++) {
            for (int oj = 0; oj < ow; oj++) {
                int best = (oi * k) * w + oj * k;
                for (int di = 0; di < k; di++) {
                    for (int dj = 0; dj < k; dj++) {
                        int at = (oi * k + di) * w + oj * k + dj;
                        if (in[at] > in[best] || isnan(in[at])) {
                            best = at;
                        }
                    }
                }
                long o = (p * oh + oi) * ow + oj;
                y[o] = in[best];
                argmax[o] = best;
            }
        }
    }
}

void maxpool_backward(const float *dy, const int32_t *argmax, float *dx, int planes, int h, int w, int k) {
    int oh = h / k, ow = w / k;
    memset(dx, 0, sizeof(float) * (size_t)planes * h * w);
    for (long p = 0; p < planes; p++) {
        for (long o = p * oh * ow; o < (p + 1) * oh * ow; o++) {
            dx[p * h * w + argmax[o]] += dy[o];
        }
    }
}

void relu_forward(const float *x, float *y, long n) {
    for (long i = 0; i < n; i++) {
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    }
}

void relu_backward(const float *y, const float *dy, float *dx, long n) {
    for (long i = 0; i < n; i++) {
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
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
