/*
 * train.c: the step loop of train.h. The strategy's hook gets the whole gradient once per step: at
 * LeNet-5's 61,706 parameters (241 KiB) one fused message costs less than several.
 *
 * On the timeline (timeline.h) a worker's step is a span "step" (args: step, the strategy's number)
 * holding its phases in order: "slow" (the injected delay), "batch", "forward" (with the loss),
 * "backward", then what the strategy's hook records ("gradient sync", "update", ...; csrc/strategies/),
 * or "update" alone. Off, each costs the one branch in pd_tl_begin. pd_activity tells the stall
 * inspector (stall.c) which phase a step is in: at most three calls a step (an asynchronous worker's
 * exchange adds a fourth).
 */
#include "train.h"

#include <time.h>

#include "observe/timeline.h"

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

// One step on the batch at perm[offset ...]: forward, backward, and the strategy's step (alone: SGD).
static int one_step(Model *m, const TrainConfig *c, float *momentum, int *momentum_started, const Dataset *ds,
                    const int *perm, int offset, long number, int32_t *y, StepStats *stats) {
    const StepHooks *h = &c->hooks;
    double t0 = now(), s0 = h->sync_seconds ? h->sync_seconds(h->ctx) : 0.0;
    const int64_t step_t0 = pd_tl_begin();
    int64_t t;
    int correct = 0, rc = 0;
    if (c->slow_ms > 0) {
        pd_activity("slow (injected delay)", number);
        t = pd_tl_begin();
        sleep_ms(c->slow_ms);
        if (t) pd_tl_span(t, "compute", "slow", 0);
    }
    if (h->run_step != NULL) {   // the strategy computes the step itself (the pipeline)
        double loss = 0.0;
        pd_activity("pipeline step", number);
        rc = h->run_step(h->ctx, ds, perm, offset, c->batch, m->params, momentum, momentum_started, &loss, &correct);
        stats->loss_sum += loss;
    } else {
        pd_activity("forward/backward", number);
        t = pd_tl_begin();
        batch_gather(model_input(m), y, ds, perm, offset, c->batch);   // straight into the model: one copy
        if (t) pd_tl_span(t, "compute", "batch", 0);
        t = pd_tl_begin();
        stats->loss_sum += model_forward_loss(m, model_input(m), y, c->batch, &correct);
        if (t) pd_tl_span(t, "compute", "forward", 0);
        t = pd_tl_begin();
        model_backward(m, c->batch);
        if (t) pd_tl_span(t, "compute", "backward", 0);
        if (h->step != NULL) {   // its phases ("gradient sync", "update") are the strategy's to record
            pd_activity("gradient sync", number);
            rc = h->step(h->ctx, m->params, m->grads, momentum, momentum_started, number);
        } else {
            t = pd_tl_begin();
            sgd_step(&c->sgd, m->params, m->grads, momentum, momentum_started, m->num_params);
            if (t) pd_tl_span(t, "compute", "update", 0);
        }
    }
    if (step_t0) pd_tl_span(step_t0, "step", "step", 1, PD_TL_INT("step", number));
    stats->correct += correct;
    if (rc < 0) {
        return rc;
    }
    stats->steps++;
    double sync = (h->sync_seconds ? h->sync_seconds(h->ctx) : 0.0) - s0;
    stats->t_sync += sync;
    stats->t_comp += now() - t0 - sync;
    return 0;
}

// Time a call of the asynchronous hooks as communication.
static int timed(StepStats *stats, int rc, double t0) {
    stats->t_sync += now() - t0;
    return rc;
}

int train_steps(Model *m, const TrainConfig *c, float *momentum, int *momentum_started, const Dataset *ds,
                const int *perm, int step_begin, int step_end, int32_t *y, StepStats *stats) {
    const StepHooks *h = &c->hooks;
    if (h->serve_call != NULL) {   // a server only communicates (each push it serves is on the timeline)
        pd_activity("serving workers", c->number);
        double t0 = now();
        return timed(stats, h->serve_call(h->ctx, m->params, step_begin, step_end), t0);
    }
    if (h->next_batch != NULL) {
        // Asynchronous: the batches of steps [step_begin, step_end) go to whichever worker asks first,
        // so a slow worker takes fewer of them and no one waits for it.
        long batch_index, taken = 0;
        int rc = 0;
        h->begin_call(h->ctx, step_begin, step_end);
        while (rc == 0 && h->next_batch(h->ctx, &batch_index)) {
            rc = one_step(m, c, momentum, momentum_started, ds, perm, (int)batch_index * c->batch, c->number + taken,
                          y, stats);
            taken++;
        }
        if (rc < 0) {
            return rc;
        }
        double t0 = now();
        return timed(stats, h->end_call(h->ctx), t0);
    }
    for (int step = step_begin; step < step_end; step++) {
        const long number = c->number + (step - step_begin);
        int rc;
        if (h->serve != NULL) {   // a server's step: no "step" span (it computes none), its exchange's
            double t0 = now();
            pd_activity("serving workers", number);
            int64_t t = pd_tl_begin();
            rc = timed(stats, h->serve(h->ctx, m->params, momentum, momentum_started, number), t0);
            if (t) pd_tl_span(t, "strategy", "serve step", 1, PD_TL_INT("step", number));
        } else {
            rc = one_step(m, c, momentum, momentum_started, ds, perm, shard_start(step, c->rank, c->world, c->batch),
                          number, y, stats);
        }
        if (rc < 0) {
            return rc;
        }
    }
    return 0;
}
