/*
 * sgd.c: the update of sgd.h, term by term in torch's order so results agree to the last bits that
 * float32 allows.
 */
#include "sgd.h"

void sgd_step(const SgdConfig *c, float *params, const float *grads, float *buf, int *started, long n) {
    sgd_step_scaled(c, 1.0f, params, grads, buf, started, n);   // g * 1.0f is g: the same bits
}

void sgd_step_scaled(const SgdConfig *c, float grad_scale, float *params, const float *grads, float *buf,
                     int *started, long n) {
    const float lr = c->lr, mu = c->momentum, wd = c->weight_decay, keep = 1.0f - c->dampening;
    const int first = !*started;
    for (long i = 0; i < n; i++) {
        float d = grads[i] * grad_scale;
        if (wd != 0.0f) {
            d = d + wd * params[i];
        }
        if (mu != 0.0f) {
            float b = first ? d : mu * buf[i] + keep * d;
            buf[i] = b;
            d = c->nesterov ? d + mu * b : b;
        }
        params[i] = params[i] - lr * d;
    }
    if (mu != 0.0f) {
        *started = 1;
    }
}
