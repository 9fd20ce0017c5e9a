/*
 * pool2.h: LeNet's 2 x 2 max pooling in vectors (pool2.c), and the branch-free comparisons it shares with
 * layers.c's general pooling and ReLU.
 */
#ifndef PYDIST_ENGINE_POOL2_H
#define PYDIST_ENGINE_POOL2_H

#include <stdint.h>
#include <string.h>

// Branch-free for the same reason as pool_take below: keep the bits where the mask is all ones. NaN
// passes through (it is not <= 0), as in torch.
static inline float keep_if(float v, int keep) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    bits &= (uint32_t)-keep;
    memcpy(&v, &bits, sizeof v);
    return v;
}

static inline float relu_of(float v) {
    return keep_if(v, !(v <= 0.0f));
}

// Max pooling's comparison (layers.c and pool2.c), without branches (they become conditional moves):
// which element is largest is a coin toss on real data, and a mispredicted branch per element cost
// more than the rest of the pooling. `relu`: the output is relu(max), which equals max(relu(x)) (the two
// commute), so a ReLU before the pooling costs a comparison per output instead of a pass over its
// input. The argmax is then that of x; it differs from that of relu(x) only where the output is <= 0,
// and there backward passes no gradient either way.
static inline void pool_take(float v, int at, float *top, int *best) {
    int take = !(v <= *top) & (*top == *top);  // larger, or a NaN, which wins as in torch
    *best = take ? at : *best;
    *top = take ? v : *top;
}

// The k = 2 cases of layers.h's max pooling: y, argmax of (h / 2) x (w / 2) outputs per plane, relu or not;
// backward needs h and w even (windows tiling the plane), y NULL for plain pooling.
void pool2_forward(const float *x, float *y, int32_t *argmax, int planes, int h, int w, int relu);
void pool2_backward(const float *dy, const float *y, const int32_t *argmax, float *dx, int planes, int h, int w);

#endif  // PYDIST_ENGINE_POOL2_H
