/*
 * averaging.c: strategies where every rank steps on its own and the weights meet every `period` steps.
 *   average  model averaging / local SGD (torch's PeriodicModelAverager): after every period-th local
 *            step the weights are replaced by their mean; `warmup` steps of synchronous SGD first.
 *            Momentum stays local (MOMENTUM_LOCAL), is averaged too, or is reset.
 *   easgd    synchronous elastic averaging SGD (Zhang, Choromanska, LeCun 2015): after every period-th
 *            step each worker moves alpha of the way toward the center and the center moves alpha times
 *            the workers' summed distance toward them, alpha = beta / workers. The exchange conserves
 *            the workers' weights plus the center; the center is kept, identical, on every rank.
 * The mean comes from one all-reduce of the weights, whose result MPI gives every rank alike, so after
 * an averaging step every rank holds the same bits.
 */
#include <string.h>

#include "strategy.h"

static int mean_in_place(Comm *c, float *buf, long n) {
    int rc = comm_allreduce_sum(c, buf, n);
    if (rc == 0 && c->size > 1) {
        const float f = 1.0f / (float)c->size;
        for (long i = 0; i < n; i++) buf[i] *= f;
    }
    return rc;
}

int average_step(Strategy *s, float *params, float *grads, float *momentum, int *started, long step) {
    const long n = s->n;
    int rc;
    if (step < s->cfg.warmup) {  // synchronous SGD: the mean gradient, the same update everywhere
        if ((rc = mean_in_place(&s->comm, grads, n)) < 0) return rc;
        sgd_step(&s->sgd, params, grads, momentum, started, n);
        return 0;
    }
    sgd_step(&s->sgd, params, grads, momentum, started, n);
    if ((step - s->cfg.warmup + 1) % s->cfg.period != 0) {
        return 0;
    }
    if ((rc = mean_in_place(&s->comm, params, n)) < 0) return rc;
    if (s->cfg.placement == MOMENTUM_AVERAGE) {
        return mean_in_place(&s->comm, momentum, n);
    }
    if (s->cfg.placement == MOMENTUM_RESET) {
        memset(momentum, 0, sizeof(float) * (size_t)n);
        *started = 0;
    }
    return 0;
}

int average_weights(Strategy *s, const float *params, float *out) {
    memcpy(out, params, sizeof(float) * (size_t)s->n);
    return mean_in_place(&s->comm, out, s->n);
}

int easgd_step(Strategy *s, float *params, float *grads, float *momentum, int *started, long step) {
    const long n = s->n;
    sgd_step(&s->sgd, params, grads, momentum, started, n);
    if ((step + 1) % s->cfg.period != 0) {
        return 0;
    }
    float *sum = s->scratch;
    memcpy(sum, params, sizeof(float) * (size_t)n);
    int rc = comm_allreduce_sum(&s->comm, sum, n);
    if (rc < 0) {
        return rc;
    }
    const float R = (float)s->comm.size, alpha = s->cfg.beta / R;
    for (long i = 0; i < n; i++) {
        const float c = s->center[i];
        params[i] = params[i] - alpha * (params[i] - c);
        s->center[i] = c + alpha * (sum[i] - R * c);
    }
    return 0;
}
