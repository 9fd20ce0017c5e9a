/*
 * train.c: the step loop of train.h. One fused all-reduce of the whole gradient per step: at
 * LeNet-5's 61,706 parameters (241 KiB) one message costs less than several.
 */
#include "train.h"

#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int train_steps(Model *m, const TrainConfig *c, float *momentum, int *momentum_started, const Dataset *ds,
                const int *perm, int step_begin, int step_end, float *x, int32_t *y, StepStats *stats) {
    const float scale = 1.0f / (float)c->world;
    for (int step = step_begin; step < step_end; step++) {
        double t0 = now();
        batch_gather(x, y, ds, perm, shard_start(step, c->rank, c->world, c->batch), c->batch);
        int correct = 0;
        stats->loss_sum += model_loss_backward(m, x, y, c->batch, &correct);
        stats->correct += correct;
        double t1 = now();
        if (c->world > 1) {
            if (c->allreduce(m->grads, m->num_params, c->ctx) < 0) {
                return -1;
            }
            for (long i = 0; i < m->num_params; i++) {
                m->grads[i] *= scale;  // the mean over world * batch examples, as one process would take
            }
        }
        double t2 = now();
        sgd_step(&c->sgd, m->params, m->grads, momentum, momentum_started, m->num_params);
        double t3 = now();
        stats->t_comp += (t1 - t0) + (t3 - t2);
        stats->t_sync += t2 - t1;
        stats->steps++;
    }
    return 0;
}
