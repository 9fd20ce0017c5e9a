/*
 * train.c: the step loop of train.h. The strategy's hook gets the whole gradient once per step: at
 * LeNet-5's 61,706 parameters (241 KiB) one fused message costs less than several.
 */
#include "train.h"

#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

int train_steps(Model *m, const TrainConfig *c, float *momentum, int *momentum_started, const Dataset *ds,
                const int *perm, int step_begin, int step_end, float *x, int32_t *y, StepStats *stats) {
    const StepHooks *h = &c->hooks;
    if (h->serve_call != NULL) {
        double t0 = now();
        int rc = h->serve_call(h->ctx, m->params);
        stats->t_sync += now() - t0;   // a server only communicates
        return rc;
    }
    for (int step = step_begin; step < step_end; step++) {
        const long number = c->number + (step - step_begin);
        double t0 = now(), s0 = h->sync_seconds ? h->sync_seconds(h->ctx) : 0.0;
        int rc = 0;
        if (h->serve != NULL) {
            rc = h->serve(h->ctx, m->params, momentum, momentum_started, number);
        } else {
            batch_gather(x, y, ds, perm, shard_start(step, c->rank, c->world, c->batch), c->batch);
            int correct = 0;
            stats->loss_sum += model_loss_backward(m, x, y, c->batch, &correct);
            stats->correct += correct;
            if (c->slow_ms > 0) {
                sleep_ms(c->slow_ms);
            }
            if (h->step != NULL) {
                rc = h->step(h->ctx, m->params, m->grads, momentum, momentum_started, number);
            } else {
                sgd_step(&c->sgd, m->params, m->grads, momentum, momentum_started, m->num_params);
            }
        }
        if (rc < 0) {
            return rc;
        }
        stats->steps += h->serve == NULL;
        double sync = (h->sync_seconds ? h->sync_seconds(h->ctx) : 0.0) - s0;
        stats->t_sync += sync;
        stats->t_comp += now() - t0 - sync;
    }
    if (h->end_call != NULL) {
        double t0 = now();
        int rc = h->end_call(h->ctx);
        stats->t_sync += now() - t0;
        return rc;
    }
    return 0;
}
