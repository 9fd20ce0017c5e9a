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
 * an averaging step every rank holds the same bits. Compressed, each rank sends its weights' difference
 * from a point every rank holds alike (average: the last mean; easgd: the center), and its residual
 * keeps what was not sent; the sum is still the same on every rank.
 * Each kind's hooks are its table at the end (hooks.h); the communication is comm.c's.
 * On the timeline a step records "update" (the local SGD step) and, every period, "averaging round"
 * (cat "strategy", args round: the exchange's number from 0 since the warm-up, and the group); average's
 * warm-up steps record "gradient sync" and "update", as allreduce's do.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "strategies/exchange.h"
#include "engine/sgd.h"
#include "hooks.h"

static int mean_in_place(Comm *c, float *buf, long n) {
    int rc = comm_allreduce_sum(c, buf, n);
    if (rc == 0 && c->size > 1) {
        const float f = 1.0f / (float)c->size;
        for (long i = 0; i < n; i++) buf[i] *= f;
    }
    return rc;
}

// Compressed (s->z), the weights' sum over the ranks as `anchor` x R plus the compressed sum of each
// rank's difference from it: what goes is the difference, whose unsent part the residual keeps. The
// anchor is the same on every rank (the last mean, or the center), so the sum is too. Into sum[n].
static int compressed_weights_sum(Strategy *s, const float *params, const float *anchor, float *sum) {
    const long n = s->n;
    const float R = (float)s->comm.size;
    for (long i = 0; i < n; i++) sum[i] = params[i] - anchor[i];
    int rc = compress_allreduce_sum(&s->z, &s->comm, sum, n, 0);
    for (long i = 0; i < n && rc == 0; i++) sum[i] += R * anchor[i];
    return rc;
}

// Both exchange every `period` steps.
static int check_period(Strategy *s, const char *name, char *err, size_t errlen) {
    if (s->cfg.period < 1) {
        snprintf(err, errlen, "strategy '%s': the period must be >= 1; got %d", name, s->cfg.period);
        return -1;
    }
    return 0;
}

// The workers' momenta differ: a checkpoint saves their mean, as the weights' mean.
static int mean_state(Strategy *s, const float *momentum, float *momentum_out, int *started_out) {
    (void)momentum;
    int rc = comm_allreduce_sum(&s->comm, momentum_out, s->n);
    if (rc < 0) {
        return rc;
    }
    for (long i = 0; i < s->n; i++) momentum_out[i] /= (float)s->comm.size;
    return comm_allreduce_max_int(&s->comm, started_out);
}

// ---------------------------------------------------------------------------------------------------
// average

static int average_create(Strategy *s, const Model *m, const char *name, char *err, size_t errlen) {
    (void)m;
    if (check_period(s, name, err, errlen) < 0) {
        return -1;
    }
    // compressed: the last mean, from which each rank's difference goes (center: the anchor)
    if (s->cfg.compression.kind != COMPRESS_NONE) {
        s->center = malloc(sizeof(float) * (size_t)(s->n > 0 ? s->n : 1));
        return s->center != NULL ? 0 : -2;
    }
    return 0;
}

static long average_scratch(const Strategy *s) {   // compressed: the differences' sum
    return s->cfg.compression.kind != COMPRESS_NONE ? s->n : 0;
}

// The local SGD step, on the timeline as the step's "update".
static void update(Strategy *s, float *params, float *grads, float *momentum, int *started) {
    const int64_t t = pd_tl_begin();
    sgd_step(&s->sgd, params, grads, momentum, started, s->n);
    if (t) pd_tl_span(t, "compute", "update", 0);
}

// Round `round`'s exchange, begun at t, on the timeline.
static void record_round(const Strategy *s, int64_t t, long round) {
    if (t) {
        pd_tl_span(t, "strategy", "averaging round", 2, PD_TL_INT("round", round), PD_TL_INT("group", s->trace_group));
    }
}

// The weights' (and momentum's) mean, every rank alike.
static int average_exchange(Strategy *s, float *params, float *momentum, int *started) {
    const long n = s->n;
    int rc;
    if (s->z.spec.kind != COMPRESS_NONE) {   // the mean of the differences from the last mean
        if ((rc = compressed_weights_sum(s, params, s->center, s->scratch)) < 0) return rc;
        const float f = 1.0f / (float)s->comm.size;
        for (long i = 0; i < n; i++) s->center[i] = params[i] = s->scratch[i] * f;
    } else if ((rc = mean_in_place(&s->comm, params, n)) < 0) {
        return rc;
    }
    if (s->cfg.placement == MOMENTUM_AVERAGE) {
        return mean_in_place(&s->comm, momentum, n);
    }
    if (s->cfg.placement == MOMENTUM_RESET) {
        memset(momentum, 0, sizeof(float) * (size_t)n);
        *started = 0;
    }
    return 0;
}

static int average_step(Strategy *s, float *params, float *grads, float *momentum, int *started, long step) {
    int rc;
    if (step < s->cfg.warmup) {  // synchronous SGD: the mean gradient, the same update everywhere
        const int64_t t = pd_tl_begin();
        rc = mean_in_place(&s->comm, grads, s->n);
        if (t) pd_tl_span(t, "sync", "gradient sync", 2, TL_EXCHANGE(s, step));
        if (rc < 0) return rc;
        update(s, params, grads, momentum, started);
        return 0;
    }
    update(s, params, grads, momentum, started);
    if ((step - s->cfg.warmup + 1) % s->cfg.period != 0) {
        return 0;
    }
    const int64_t t = pd_tl_begin();
    rc = average_exchange(s, params, momentum, started);
    record_round(s, t, (step - s->cfg.warmup + 1) / s->cfg.period - 1);
    return rc;
}

static int average_weights(Strategy *s, const float *params, float *out) {
    memcpy(out, params, sizeof(float) * (size_t)s->n);
    return mean_in_place(&s->comm, out, s->n);
}

// ---------------------------------------------------------------------------------------------------
// easgd

static int easgd_create(Strategy *s, const Model *m, const char *name, char *err, size_t errlen) {
    (void)m;
    if (check_period(s, name, err, errlen) < 0) {
        return -1;
    }
    s->center = malloc(sizeof(float) * (size_t)(s->n > 0 ? s->n : 1));
    return s->center != NULL ? 0 : -2;
}

static long easgd_scratch(const Strategy *s) {   // the workers' weights, summed
    return s->n;
}

static void center_free(Strategy *s) {
    free(s->center);
    s->center = NULL;
}

// The center (average's anchor) starts (and resumes) where every rank's weights are.
static void center_restore(Strategy *s, const float *params) {
    if (s->center != NULL) {
        memcpy(s->center, params, sizeof(float) * (size_t)s->n);
    }
}

static int easgd_weights(Strategy *s, const float *params, float *out) {
    (void)params;
    memcpy(out, s->center, sizeof(float) * (size_t)s->n);
    return 0;
}

// The elastic exchange: every worker toward the center, the center toward the workers.
static int easgd_exchange(Strategy *s, float *params) {
    const long n = s->n;
    float *sum = s->scratch;
    int rc;
    if (s->z.spec.kind != COMPRESS_NONE) {   // each worker's difference from the center goes compressed
        rc = compressed_weights_sum(s, params, s->center, sum);
    } else {
        memcpy(sum, params, sizeof(float) * (size_t)n);
        rc = comm_allreduce_sum(&s->comm, sum, n);
    }
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

static int easgd_step(Strategy *s, float *params, float *grads, float *momentum, int *started, long step) {
    update(s, params, grads, momentum, started);
    if ((step + 1) % s->cfg.period != 0) {
        return 0;
    }
    const int64_t t = pd_tl_begin();
    int rc = easgd_exchange(s, params);
    record_round(s, t, (step + 1) / s->cfg.period - 1);
    return rc;
}

// ---------------------------------------------------------------------------------------------------
// The tables

const StrategyHooks average_hooks = {.compresses = "weight differences", .create = average_create,
                                     .free = center_free, .scratch_len = average_scratch, .step = average_step,
                                     .weights = average_weights, .state = mean_state, .restore = center_restore};
const StrategyHooks easgd_hooks = {.compresses = "weight differences", .create = easgd_create, .free = center_free,
                                   .scratch_len = easgd_scratch, .step = easgd_step, .weights = easgd_weights,
                                   .state = mean_state, .restore = center_restore};
