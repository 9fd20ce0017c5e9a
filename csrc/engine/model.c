/*
 * model.c: shapes, buffers, initialisation, and the forward and backward passes of a layer list
 * (see model.h); the arithmetic is in layers.c.
 */
#include "model.h"
#include "rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const LAYER_NAMES[] = {"linear", "conv2d", "maxpool2d", "relu", "flatten"};

static long act_size(int c, int h, int w) {
    return (long)c * h * w;
}

// Buffers are 64-byte aligned for BLAS and for the vector units; zeroed so nothing uninitialised is
// ever read (a NaN from garbage would propagate everywhere).
static void *alloc_zeroed(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes > 0 ? bytes : 64) != 0) {
        return NULL;
    }
    memset(p, 0, bytes > 0 ? bytes : 64);
    return p;
}

// Every buffer of a model (the parameters; activations, their gradients and im2col columns for
// max_batch examples) holds at most MODEL_MAX_FLOATS floats. Every index and size in the kernels then
// fits in an int (BLAS takes int sizes), and no product of shapes can overflow: each is checked here,
// factor by factor, before anything is allocated. 2^31 - 1 floats is 8 GiB, far beyond our models.
#define MODEL_MAX_FLOATS 2147483647L

// a * b when both are in [0, MODEL_MAX_FLOATS] and so is the product; else -1.
static long capped_mul(long a, long b) {
    if (a < 0 || b < 0 || a > MODEL_MAX_FLOATS || b > MODEL_MAX_FLOATS || (a > 0 && b > MODEL_MAX_FLOATS / a)) {
        return -1;
    }
    return a * b;
}

static long capped_size(long c, long h, long w, long batch) {
    return capped_mul(capped_mul(capped_mul(c, h), w), batch);
}

#define TOO_BIG(what)                                                                                       \
    do {                                                                                                    \
        snprintf(err, errlen, "layer %d (%s) needs more than 2^31 - 1 floats for %s (at batch %d): the " \
                 "model is too large", i, layer_type_name(s->type), what, m->max_batch);                           \
        return -1;                                                                                          \
    } while (0)

static int shape_layers(Model *m, char *err, size_t errlen) {
    int c = m->in_c, h = m->in_h, w = m->in_w;
    long offset = 0;
    for (int i = 0; i < m->num_layers; i++) {
        Layer *L = &m->layers[i];
        const LayerSpec *s = &L->spec;
        L->in_c = c, L->in_h = h, L->in_w = w;
        L->weights = L->biases = 0;
        switch (s->type) {
        case LAYER_LINEAR:
            if (h != 1 || w != 1 || c != s->in || s->out <= 0) {
                snprintf(err, errlen, "layer %d (linear %d -> %d) gets input of shape (%d, %d, %d); a linear "
                         "layer needs a flat input of %d features (add a flatten layer, or fix `in`)",
                         i, s->in, s->out, c, h, w, s->in);
                return -1;
            }
            if ((L->weights = capped_mul(s->out, s->in)) < 0) TOO_BIG("its weights");
            L->biases = s->out;
            c = s->out;
            break;
        case LAYER_CONV2D: {
            // in long: h + 2 * padding may not fit an int; the kernels need it to
            long ph = (long)h + 2L * s->padding, pw = (long)w + 2L * s->padding;
            if (c != s->in || s->out <= 0 || s->kernel <= 0 || s->stride <= 0 || s->padding < 0 ||
                ph < s->kernel || pw < s->kernel) {
                snprintf(err, errlen, "layer %d (conv2d %d -> %d, kernel %d, stride %d, padding %d) does not fit "
                         "its input of shape (%d, %d, %d)", i, s->in, s->out, s->kernel, s->stride, s->padding,
                         c, h, w);
                return -1;
            }
            if (ph > MODEL_MAX_FLOATS || pw > MODEL_MAX_FLOATS) TOO_BIG("its padded input");
            L->conv = (ConvShape){c, h, w, s->out, s->kernel, s->stride, s->padding,
                                  (int)((ph - s->kernel) / s->stride + 1), (int)((pw - s->kernel) / s->stride + 1)};
            long patch = capped_mul(capped_mul(s->in, s->kernel), s->kernel);
            if ((L->weights = capped_mul(s->out, patch)) < 0) TOO_BIG("its weights");
            if (capped_size(patch, L->conv.out_h, L->conv.out_w, m->max_batch) < 0) TOO_BIG("its im2col columns");
            L->biases = s->out;
            c = s->out, h = L->conv.out_h, w = L->conv.out_w;
            break;
        }
        case LAYER_MAXPOOL2D:
            if (s->kernel <= 0 || h < s->kernel || w < s->kernel) {
                snprintf(err, errlen, "layer %d (maxpool2d %d) does not fit its input of shape (%d, %d, %d)", i,
                         s->kernel, c, h, w);
                return -1;
            }
            h /= s->kernel, w /= s->kernel;
            break;
        case LAYER_RELU:
            break;
        case LAYER_FLATTEN:
            // c * h * w fits an int: the input's activations passed the size check below
            c = (int)capped_size(c, h, w, 1), h = 1, w = 1;
            break;
        default:
            snprintf(err, errlen, "layer %d has an unknown type %d", i, (int)s->type);
            return -1;
        }
        if (capped_size(c, h, w, m->max_batch) < 0) TOO_BIG("its output");
        L->weight_offset = offset;
        L->bias_offset = offset + L->weights;
        offset += L->weights + L->biases;  // both at most MODEL_MAX_FLOATS: no overflow
        if (offset > MODEL_MAX_FLOATS) TOO_BIG("the parameters up to it");
        L->out_c = c, L->out_h = h, L->out_w = w;
    }
    if (m->num_layers == 0 || h != 1 || w != 1 || c < 2) {
        snprintf(err, errlen, "the last layer must give flat scores for at least 2 classes; it gives shape "
                 "(%d, %d, %d)", c, h, w);
        return -1;
    }
    m->classes = c;
    m->num_params = offset;
    return 0;
}

// Layer i is a ReLU whose output only a max-pool reads: the model runs the two as one pass
// (relu_maxpool_forward), and the ReLU's output and its gradient are never stored.
static int relu_into_pool(const Model *m, int i) {
    return i + 1 < m->num_layers && m->layers[i].spec.type == LAYER_RELU &&
           m->layers[i + 1].spec.type == LAYER_MAXPOOL2D;
}

// Whether backward needs layer i's input gradient: only when a layer before it has parameters.
static int needs_dx(const Model *m, int i) {
    for (int j = 0; j < i; j++) {
        if (m->layers[j].weights + m->layers[j].biases > 0) return 1;
    }
    return 0;
}

// The next view of n floats in the block at base (NULL: only count), 64-byte aligned like the block.
static float *carve(float *base, size_t *used, long n) {
    float *view = base != NULL ? base + *used : NULL;
    *used += ((size_t)n + 15) & ~(size_t)15;
    return view;
}

// Every per-step buffer of the model is a view into one block (as llm.c does its activations): the
// layers' outputs and their gradients, max-pools' argmax, convolutions' im2col columns, and the GEMM
// scratch. With base NULL the views stay NULL and only the size is counted; returns the floats used.
// Left out: a fused ReLU's output and gradient, and gradients nobody reads (dact[i] where needs_dx(i)
// is false, dact[0] among them).
static size_t carve_workspace(Model *m, float *base) {
    size_t used = 0;
    long B = m->max_batch, scratch = 0;
    m->act[0] = carve(base, &used, B * act_size(m->in_c, m->in_h, m->in_w));   // [B, in_c, in_h, in_w]
    for (int i = 0; i < m->num_layers; i++) {
        const Layer *L = &m->layers[i];
        long out = B * act_size(L->out_c, L->out_h, L->out_w);   // [B, out_c, out_h, out_w]
        int stored = !relu_into_pool(m, i);
        m->act[i + 1] = stored ? carve(base, &used, out) : NULL;
        m->dact[i + 1] = stored && (i + 1 == m->num_layers || needs_dx(m, i + 1)) ? carve(base, &used, out) : NULL;
        if (L->spec.type == LAYER_MAXPOOL2D) {
            m->argmax[i] = (int32_t *)carve(base, &used, out);   // [B, out_c, out_h, out_w]
        }
        if (L->spec.type == LAYER_CONV2D) {
            m->cols[i] = carve(base, &used, conv_cols_floats(&L->conv, (int)B));   // [in_c*k*k, B*out_h*out_w]
            long need = conv_tmp_floats(&L->conv, (int)B);
            scratch = need > scratch ? need : scratch;
        }
    }
    m->scratch = carve(base, &used, scratch);   // [out_c, B*out_h*out_w] of the largest convolution
    return used;
}

int model_create(Model *m, const LayerSpec *specs, int num_layers, int in_c, int in_h, int in_w, int max_batch,
                 char *err, size_t errlen) {
    memset(m, 0, sizeof(*m));
    if (num_layers <= 0 || in_c <= 0 || in_h <= 0 || in_w <= 0 || max_batch <= 0) {
        snprintf(err, errlen, "a model needs at least one layer, a positive input shape and batch size");
        return -1;
    }
    if (capped_size(in_c, in_h, in_w, max_batch) < 0) {
        snprintf(err, errlen, "an input of shape (%d, %d, %d) at batch %d needs more than 2^31 - 1 floats: "
                 "the model is too large", in_c, in_h, in_w, max_batch);
        return -1;
    }
    m->num_layers = num_layers;
    m->in_c = in_c, m->in_h = in_h, m->in_w = in_w;
    m->max_batch = max_batch;
    m->layers = calloc((size_t)num_layers, sizeof(Layer));
    if (m->layers == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < num_layers; i++) {
        m->layers[i].spec = specs[i];
    }
    if (shape_layers(m, err, errlen) < 0) {
        model_free(m);
        return -1;
    }
    m->params = alloc_zeroed(sizeof(float) * (size_t)m->num_params);
    m->grads = alloc_zeroed(sizeof(float) * (size_t)m->num_params);
    m->act = calloc((size_t)num_layers + 1, sizeof(float *));
    m->dact = calloc((size_t)num_layers + 1, sizeof(float *));
    m->argmax = calloc((size_t)num_layers, sizeof(int32_t *));
    m->cols = calloc((size_t)num_layers, sizeof(float *));
    int ok = m->params && m->grads && m->act && m->dact && m->argmax && m->cols;
    if (ok) {
        size_t floats = carve_workspace(m, NULL);   // first the sizes, then the block, then the views
        ok = (m->workspace = alloc_zeroed(sizeof(float) * floats)) != NULL;
        if (ok) carve_workspace(m, m->workspace);
    }
    if (!ok) {
        snprintf(err, errlen, "out of memory for a model of %ld parameters at batch %d", m->num_params, max_batch);
        model_free(m);
        return -1;
    }
    return 0;
}

void model_free(Model *m) {
    free(m->cols);
    free(m->act);
    free(m->dact);
    free(m->argmax);
    free(m->workspace);
    free(m->params);
    if (m->grads_release != NULL) {
        m->grads_release(m->grads_ctx);
    } else {
        free(m->grads);
    }
    free(m->layers);
    memset(m, 0, sizeof(*m));
}

// ---------------------------------------------------------------------------------------------------

void model_init_params(Model *m, uint64_t seed) {
    uint64_t state = seed ^ 0x5044495354ull;  // "PDIST": a seed of 0 is fine too
    for (int i = 0; i < m->num_layers; i++) {
        const Layer *L = &m->layers[i];
        if (L->weights == 0) {
            continue;
        }
        long fan_in = L->weights / L->biases;  // in features, or in_c * k * k
        float bound = 1.0f / sqrtf((float)fan_in);
        for (long j = 0; j < L->weights + L->biases; j++) {
            double u = (double)(splitmix64(&state) >> 11) * 0x1.0p-53;  // [0, 1)
            m->params[L->weight_offset + j] = (float)((2.0 * u - 1.0) * bound);
        }
    }
}

// FNV-1a over the little-endian bytes of one int.
static uint64_t fnv_int(uint64_t h, int v) {
    for (int b = 0; b < 4; b++) {
        h = (h ^ (uint8_t)(v >> (8 * b))) * 1099511628211ull;
    }
    return h;
}

uint64_t model_hash(const Model *m) {
    uint64_t h = 1469598103934665603ull;
    h = fnv_int(fnv_int(fnv_int(fnv_int(h, m->num_layers), m->in_c), m->in_h), m->in_w);
    for (int i = 0; i < m->num_layers; i++) {
        const LayerSpec *s = &m->layers[i].spec;
        int fields[6] = {(int)s->type, s->in, s->out, s->kernel, s->stride, s->padding};
        for (int f = 0; f < 6; f++) {
            h = fnv_int(h, fields[f]);
        }
    }
    return h;
}

// ---------------------------------------------------------------------------------------------------

void layer_forward(const Layer *L, const float *params, const float *in, float *out, float *cols, int32_t *argmax,
                   float *scratch, int B) {
    const float *W = params + L->weight_offset, *b = params + L->bias_offset;
    long n_out = (long)B * act_size(L->out_c, L->out_h, L->out_w);
    switch (L->spec.type) {
    case LAYER_LINEAR:
        linear_forward(in, W, b, out, B, L->spec.in, L->spec.out);
        break;
    case LAYER_CONV2D:
        conv2d_forward(&L->conv, in, W, b, out, cols, scratch, B);
        break;
    case LAYER_MAXPOOL2D:
        maxpool_forward(in, out, argmax, B * L->in_c, L->in_h, L->in_w, L->spec.kernel);
        break;
    case LAYER_RELU:
        relu_forward(in, out, n_out);
        break;
    case LAYER_FLATTEN:
        memcpy(out, in, sizeof(float) * (size_t)n_out);
        break;
    }
}

void layer_backward(const Layer *L, const float *params, float *dparams, const float *in, const float *out,
                    const float *dy, float *dx, float *cols, const int32_t *argmax, float *scratch, int B,
                    int accumulate) {
    const float *W = params + L->weight_offset;
    float *dW = dparams, *db = dparams + L->weights;
    long n_in = (long)B * act_size(L->in_c, L->in_h, L->in_w);
    switch (L->spec.type) {
    case LAYER_LINEAR:
        linear_backward(in, W, dy, dW, db, dx, B, L->spec.in, L->spec.out, accumulate);
        break;
    case LAYER_CONV2D:
        conv2d_backward(&L->conv, cols, W, dy, dW, db, dx, scratch, B, accumulate);
        break;
    case LAYER_MAXPOOL2D:
        if (dx) maxpool_backward(dy, argmax, dx, B * L->in_c, L->in_h, L->in_w, L->spec.kernel);
        break;
    case LAYER_RELU:
        if (dx) relu_backward(out, dy, dx, n_in);
        break;
    case LAYER_FLATTEN:
        if (dx) memcpy(dx, dy, sizeof(float) * (size_t)n_in);
        break;
    }
}

long layer_output_floats(const Layer *L) {
    return act_size(L->out_c, L->out_h, L->out_w);
}

long layer_input_floats(const Layer *L) {
    return act_size(L->in_c, L->in_h, L->in_w);
}

double layer_forward_flops(const Layer *L) {
    double out = (double)layer_output_floats(L);
    switch (L->spec.type) {
    case LAYER_LINEAR:
    case LAYER_CONV2D: return 2.0 * (double)L->weights * (L->spec.type == LAYER_CONV2D ? L->out_h * L->out_w : 1);
    case LAYER_MAXPOOL2D: return (double)layer_input_floats(L);   // a comparison per input
    default: return out;                                           // relu: a comparison; flatten: a copy
    }
}

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// Adds the seconds since *t0 to m->profile[slot] (when profiling) and restarts *t0.
static void profile_mark(Model *m, int slot, double *t0) {
    if (m->profile == NULL) return;
    double t = seconds_now();
    m->profile[slot] += t - *t0;
    *t0 = t;
}

float *model_input(Model *m) {
    return m->act[0];
}

const float *model_forward(Model *m, const float *x, int B) {
    if (x != m->act[0]) {
        memcpy(m->act[0], x, sizeof(float) * (size_t)B * act_size(m->in_c, m->in_h, m->in_w));
    }
    double t0 = m->profile != NULL ? seconds_now() : 0.0;
    for (int i = 0; i < m->num_layers; i++) {
        if (relu_into_pool(m, i)) {
            const Layer *P = &m->layers[i + 1];
            relu_maxpool_forward(m->act[i], m->act[i + 2], m->argmax[i + 1], B * P->in_c, P->in_h, P->in_w,
                                 P->spec.kernel);
            profile_mark(m, ++i, &t0);
            continue;
        }
        layer_forward(&m->layers[i], m->params, m->act[i], m->act[i + 1], m->cols[i], m->argmax[i], m->scratch, B);
        profile_mark(m, i, &t0);
    }
    return m->act[m->num_layers];
}

double model_forward_loss(Model *m, const float *x, const int32_t *labels, int B, int *correct) {
    const float *logits = model_forward(m, x, B);
    double t0 = m->profile != NULL ? seconds_now() : 0.0;
    double loss = log_softmax_nll(logits, labels, m->dact[m->num_layers], B, m->classes, correct);
    profile_mark(m, 2 * m->num_layers, &t0);
    return loss;
}

void model_backward(Model *m, int B) {
    double t0 = m->profile != NULL ? seconds_now() : 0.0;
    for (int i = m->num_layers - 1; i >= 0; i--) {
        if (i > 0 && relu_into_pool(m, i - 1)) {   // the max-pool and its ReLU (no parameters)
            const Layer *P = &m->layers[i];
            if (m->dact[i - 1] != NULL) {
                relu_maxpool_backward(m->dact[i + 1], m->act[i + 1], m->argmax[i], m->dact[i - 1], B * P->in_c,
                                      P->in_h, P->in_w, P->spec.kernel);
            }
            profile_mark(m, m->num_layers + i, &t0);
            i--;
            continue;
        }
        layer_backward(&m->layers[i], m->params, m->grads + m->layers[i].weight_offset, m->act[i], m->act[i + 1],
                       m->dact[i + 1], m->dact[i], m->cols[i], m->argmax[i], m->scratch, B, 0);
        profile_mark(m, m->num_layers + i, &t0);
    }
}

int model_profile(Model *m, const float *x, const int32_t *labels, int B, int reps, double *out) {
    int slots = 2 * m->num_layers + 1;
    double *run = malloc(sizeof(double) * (size_t)slots);
    if (run == NULL) return -1;
    for (int r = 0; r < reps; r++) {
        memset(run, 0, sizeof(double) * (size_t)slots);
        m->profile = run;
        model_forward_loss(m, x, labels, B, NULL);
        model_backward(m, B);
        m->profile = NULL;
        for (int k = 0; k < slots; k++) out[k] = r == 0 || run[k] < out[k] ? run[k] : out[k];
    }
    free(run);
    return 0;
}

double model_loss_backward(Model *m, const float *x, const int32_t *labels, int B, int *correct) {
    double loss = model_forward_loss(m, x, labels, B, correct);
    model_backward(m, B);
    return loss;
}

const char *layer_type_name(LayerType t) {
    return (unsigned)t < sizeof(LAYER_NAMES) / sizeof(LAYER_NAMES[0]) ? LAYER_NAMES[t] : "?";
}
