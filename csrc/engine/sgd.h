/*
 * sgd.h: stochastic gradient descent with momentum and weight decay, exactly PyTorch's torch.optim.SGD
 * (single-tensor path, as torch uses on CPU):
 *     d = g + weight_decay * p
 *     buf = d                                   on the first step
 *     buf = momentum * buf + (1 - dampening) * d  afterwards
 *     d = d + momentum * buf  (nesterov)   or   d = buf
 *     p = p - lr * d
 */
#ifndef PYDIST_ENGINE_SGD_H
#define PYDIST_ENGINE_SGD_H

typedef struct {
    float lr, momentum, dampening, weight_decay;
    int nesterov;
} SgdConfig;

// One update of n parameters. *started says whether buf holds a momentum yet (it is set here).
void sgd_step(const SgdConfig *c, float *params, const float *grads, float *buf, int *started, long n);
// The same with g = grad_scale * grads (the 1/R that turns a sum over R ranks into their mean), in the
// same pass: the result has the bits of scaling the gradients first and then calling sgd_step. (Folding
// 1/R into lr instead would need wd * R too, since weight decay adds wd * p to the mean gradient, and
// would round differently.)
void sgd_step_scaled(const SgdConfig *c, float grad_scale, float *params, const float *grads, float *buf,
                     int *started, long n);

#endif  // PYDIST_ENGINE_SGD_H
