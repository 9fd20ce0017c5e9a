/*
 * train.h: the data-parallel step loop. Plain C: the communication comes in as a callback, so the loop
 * knows nothing of MPI or Python (engine_py.c passes one that all-reduces on a pydist group).
 */
#ifndef PYDIST_ENGINE_TRAIN_H
#define PYDIST_ENGINE_TRAIN_H

#include <stdint.h>

#include "data.h"
#include "model.h"
#include "sgd.h"

// Sum buf[0..n) across the ranks, in place. Returns 0, or -1 (the caller's error is set).
typedef int (*AllreduceFn)(float *buf, long n, void *ctx);

typedef struct {
    double loss_sum;     // sum over steps of this rank's batch loss
    long correct;        // right answers on this rank's batches
    int steps;           // steps taken
    double t_comp;       // seconds in forward, backward and update
    double t_sync;       // seconds in the gradient all-reduce
} StepStats;

typedef struct {
    int rank, world, batch;  // batch: per rank
    SgdConfig sgd;
    AllreduceFn allreduce;   // NULL when world == 1
    void *ctx;
} TrainConfig;

// Steps [step_begin, step_end) of an epoch whose order is perm: each rank takes its shard (data.h's
// shard_start), computes its gradient, the gradients are summed and divided by world, and every rank
// applies the same SGD update. x, y are scratch for one batch. Stats are added to *stats.
// Returns 0, or -1 when the all-reduce failed (the step is not applied).
int train_steps(Model *m, const TrainConfig *c, float *momentum, int *momentum_started, const Dataset *ds,
                const int *perm, int step_begin, int step_end, float *x, int32_t *y, StepStats *stats);

#endif  // PYDIST_ENGINE_TRAIN_H
