/*
 * model.h: a network as a list of layers over ONE flat float32 parameter buffer and a gradient
 * buffer of the same layout (each layer's weight, then its bias, in layer order: exactly the order of
 * PyTorch's model.parameters(), so the buffers can be compared with torch's directly).
 * Plain C, no Python.h, no MPI.
 */
#ifndef PYDIST_ENGINE_MODEL_H
#define PYDIST_ENGINE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "layers.h"

typedef enum { LAYER_LINEAR, LAYER_CONV2D, LAYER_MAXPOOL2D, LAYER_RELU, LAYER_FLATTEN } LayerType;

typedef struct {
    LayerType type;
    int in, out;                  // Linear: features; Conv2d: channels
    int kernel, stride, padding;  // Conv2d; MaxPool2d uses kernel (stride = kernel)
} LayerSpec;

typedef struct {
    LayerSpec spec;
    int in_c, in_h, in_w, out_c, out_h, out_w;  // activation shapes per example
    long weight_offset, bias_offset, weights, biases;  // into params/grads (0 counts: no parameters)
    ConvShape conv;
} Layer;

typedef struct {
    int num_layers;
    Layer *layers;
    int in_c, in_h, in_w, classes;
    long num_params;
    float *params, *grads;   // [num_params] each
    // Set when grads was not malloc'd (pydist's shared segment, engine_py.c): model_free hands it back
    // through this instead of free().
    void (*grads_release)(void *ctx);
    void *grads_ctx;
    int max_batch;
    // Views into one block, workspace (model.c's carve_workspace says what is left out, NULL):
    float **act;             // act[0] input, act[i+1] output of layer i: [max_batch * size]
    float **dact;            // gradients of the same shapes, where backward needs them
    int32_t **argmax;        // per max-pool layer, else NULL
    float **cols;            // per convolution: its im2col, kept from forward for backward
    float *scratch;          // the GEMM output of the largest convolution
    float *workspace;
    // NULL, or [2 * num_layers + 1] seconds that the passes add to: layer i's forward at i, its backward
    // at num_layers + i, the loss at 2 * num_layers (model_profile; a fused ReLU's time is its pool's).
    double *profile;
} Model;

// Check the layer list against the input shape and allocate everything for batches up to max_batch.
// The last layer's output must be flat (classes, 1, 1). Returns 0, or -1 with a message in err.
int model_create(Model *m, const LayerSpec *specs, int num_layers, int in_c, int in_h, int in_w, int max_batch,
                 char *err, size_t errlen);
void model_free(Model *m);

// PyTorch's default initialisation (kaiming_uniform with a=sqrt(5), i.e. U(-1/sqrt(fan_in),
// 1/sqrt(fan_in)) for weights and biases alike), from a seeded generator of our own.
void model_init_params(Model *m, uint64_t seed);

// Where the model keeps its input batch ([max_batch, in_c*in_h*in_w]): a caller may gather a batch
// straight into it and pass it as x below, which saves a copy.
float *model_input(Model *m);

// Forward pass of B <= max_batch examples x (B, in_c*in_h*in_w); returns the logits (B, classes),
// valid until the next call.
const float *model_forward(Model *m, const float *x, int B);

// Forward, loss (log-softmax + NLL, mean over the batch) and backward: grads are overwritten with
// d(loss)/d(params). Returns the loss; *correct (may be NULL) counts right answers.
double model_loss_backward(Model *m, const float *x, const int32_t *labels, int B, int *correct);
// The same in its two halves, for a caller that times them apart (the step loop's timeline):
// model_forward_loss is the forward pass and the loss, whose gradient it leaves in the model;
// model_backward then overwrites grads with d(loss)/d(params) from it (the same B).
double model_forward_loss(Model *m, const float *x, const int32_t *labels, int B, int *correct);
void model_backward(Model *m, int B);

// The fastest of `reps` timings of each layer's forward and backward and of the loss on the batch (x,
// labels), into out[2 * num_layers + 1] as model.profile lays it out. Leaves grads as a step would.
// Returns 0, or -1 out of memory.
int model_profile(Model *m, const float *x, const int32_t *labels, int B, int reps, double *out);

// One layer on B examples, as model_forward/model_loss_backward run it: params is the model's flat
// buffer (the layer reads its own offsets), dparams the layer's own gradient (its weights', then its
// bias'; the model passes grads + weight_offset); cols (convolution) and argmax
// (max-pool) are the layer's buffers for these B examples, kept from forward for backward; scratch holds
// conv_tmp_floats. Backward overwrites the layer's gradients, or adds to them (accumulate); dx may be
// NULL (nobody needs it).
// The pipeline stages (csrc/strategies/pipeline.c) run their layers this way on micro-batches.
void layer_forward(const Layer *L, const float *params, const float *in, float *out, float *cols, int32_t *argmax,
                   float *scratch, int B);
void layer_backward(const Layer *L, const float *params, float *dparams, const float *in, const float *out,
                    const float *dy, float *dx, float *cols, const int32_t *argmax, float *scratch, int B,
                    int accumulate);
// Floats per example of a layer's input and output; its forward floating-point operations per
// example (multiply-adds count 2; what the pipeline balances its stages by).
long layer_input_floats(const Layer *L);
long layer_output_floats(const Layer *L);
double layer_forward_flops(const Layer *L);

const char *layer_type_name(LayerType t);

// Hash of the architecture (layer list and input shape), stored in checkpoints.
uint64_t model_hash(const Model *m);

#endif  // PYDIST_ENGINE_MODEL_H
