/*
 * strategy.h: the registry of strategies, how ranks cooperate in training. It maps a name to a kind
 * and a kind to its table of hooks (hooks.h), and is what the glue (csrc/api/engine_py.c) calls: create a
 * strategy, then reach its hooks through the functions below. The layers, each calling only down:
 *   strategy.c   the registry: names, kinds, the servers' places, scratch, dispatch through the
 *                tables; the only file that knows every strategy.
 *   sync.c (allreduce, ring, central, ps), averaging.c (average, easgd), async.c (downpour, adag,
 *   aeasgd, dynsgd: a server loop), pipeline.c (stages): the families, each filling its kinds'
 *                tables (hooks.h); none knows the registry or another family.
 *   comm.c       counted communication and the servers' shards (comm.h); knows no strategy.
 */
#ifndef PYDIST_STRATEGIES_STRATEGY_H
#define PYDIST_STRATEGIES_STRATEGY_H

#include <stddef.h>

#include "hooks.h"

// Names as the command line spells them ("allreduce", ...); -1 for an unknown name.
int strategy_kind_of(const char *name);
const char *strategy_name(StrategyKind kind);

// Check cfg against the group (size ranks) and the model and allocate; the model's params are the
// initial weights, the same on every rank. The pipeline splits its communicator (collective). Returns
// 0, or -1 with a message in err.
int strategy_create(Strategy *s, const StrategyConfig *cfg, const SgdConfig *sgd, Comm comm, const Model *model,
                    char *err, size_t errlen);
void strategy_free(Strategy *s);

int strategy_is_server(const Strategy *s);
// ps and the asynchronous strategies put servers last; the asynchronous ones serve a whole call at once.
int strategy_has_servers(StrategyKind kind);
int strategy_is_async(StrategyKind kind);
// This rank's place among the workers (data shards are split over workers only).
int strategy_worker_rank(const Strategy *s);

// The hooks. Each returns 0, or -1 when a wait failed (the caller's error is set) or -2 when an MPI
// call failed (comm.mpi_rc / comm.mpi_call say which).
int strategy_step(Strategy *s, float *params, float *grads, float *momentum, int *started, long step);
int strategy_serve(Strategy *s, float *params, float *momentum, int *started, long step);
// Asynchronous: a worker begins a train_steps call of steps [first, last) (the call's batches are
// first * workers ... last * workers), takes the next batch it was granted (0: no more), and ends the
// call (DONE to every server); a server serves the whole call, until every worker's DONE.
void strategy_begin_call(Strategy *s, int first, int last);
int strategy_next_batch(Strategy *s, long *batch_index);
int strategy_end_call(Strategy *s);
int strategy_serve_call(Strategy *s, float *params, int first, int last);
// Pipeline: one whole step of this stage on the replica's batch perm[offset .. offset + batch): its
// forwards and backwards of the micro-batches, the all-reduce over replicas and the update of its
// slice. *loss (the batch's mean loss) and *correct on the last stage, 0 elsewhere.
int strategy_run_step(Strategy *s, const Dataset *ds, const int *perm, int offset, int batch, float *params,
                      float *momentum, int *started, double *loss, int *correct);
// Collective: the weights that count, into out[n] on every rank.
int strategy_weights(Strategy *s, const float *params, float *out);
// Collective: what to save, into params_out/momentum_out on every rank (and *started).
int strategy_state(Strategy *s, const float *params, const float *momentum, int started, float *params_out,
                   float *momentum_out, int *started_out);
// After every rank has loaded the same params/momentum (a checkpoint): take them up.
void strategy_restore(Strategy *s, const float *params);

#endif  // PYDIST_STRATEGIES_STRATEGY_H
