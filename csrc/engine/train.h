/*
 * train.h: the step loop. Plain C: how ranks cooperate comes in as hooks (csrc/strategies/), so the
 * loop knows nothing of MPI or Python.
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
    int steps;           // steps taken (computed; a server's served steps are not counted)
    double t_comp;       // seconds in forward, backward and update
    double t_sync;       // seconds the strategy spent communicating
} StepStats;

// How ranks cooperate, as the loop sees it (csrc/strategies/ fills it; NULL hooks: alone, plain SGD).
typedef struct {
    // After backward: bring the gradients together and update the parameters. Returns 0, or < 0
    // when communication failed (the caller's error is recorded; the step is not complete).
    int (*step)(void *ctx, float *params, float *grads, float *momentum, int *started, long step);
    // On a rank that computes no gradients (a parameter server): serve the step instead.
    int (*serve)(void *ctx, float *params, float *momentum, int *started, long step);
    double (*sync_seconds)(void *ctx);  // the strategy's communication time so far
    // Asynchronous: a server serves a whole call of steps [first, last) at once (serve is then NULL);
    // a worker begins the call, takes batches as next_batch hands them out (the index of a batch of
    // the epoch's order; 0 when there are no more), then ends the call. NULL: not used.
    int (*serve_call)(void *ctx, float *params, int first, int last);
    void (*begin_call)(void *ctx, int first, int last);
    int (*next_batch)(void *ctx, long *batch_index);
    int (*end_call)(void *ctx);
    // A whole step instead of forward + backward + step (the pipeline: its stage's share of the batch
    // perm[offset .. offset + batch), micro-batch by micro-batch, with the update). *loss and *correct
    // as this rank sees them (0 where it does not compute the loss). NULL: not used.
    int (*run_step)(void *ctx, const Dataset *ds, const int *perm, int offset, int batch, float *params,
                    float *momentum, int *started, double *loss, int *correct);
    void *ctx;
} StepHooks;

typedef struct {
    int rank, world, batch;  // this rank's place among the ranks that compute, and the batch of each
    SgdConfig sgd;
    StepHooks hooks;
    long number;             // the strategy's number for step_begin (periods run across epochs)
    int slow_ms;             // sleep this long per step (straggler experiments); 0: none
} TrainConfig;

// Steps [step_begin, step_end) of an epoch whose order is perm: each rank takes its shard (data.h's
// shard_start), computes its gradient, and the strategy's step hook brings the ranks together and
// updates (alone: plain SGD). The images are gathered into the model's input (model_input), the
// labels into y (scratch for one batch). Stats are added to *stats.
// Returns 0, or the hook's negative code (the step it failed in is not applied).
int train_steps(Model *m, const TrainConfig *c, float *momentum, int *momentum_started, const Dataset *ds,
                const int *perm, int step_begin, int step_end, int32_t *y, StepStats *stats);

#endif  // PYDIST_ENGINE_TRAIN_H
