/*
 * hooks.h: what a strategy is to the files that implement one. A strategy is its state (Strategy,
 * below) and a small table of hooks (StrategyHooks) that the step loop (csrc/engine/train.c) reaches
 * at fixed points through the registry (strategy.c):
 *   step      after backward on a worker: bring the gradients (or weights) together and update;
 *   serve     on a rank that computes nothing (a parameter server): one step's exchange;
 *   weights   at evaluation: which weights count (the replica, the average, the center);
 *   state     at checkpoint: what must be saved (gathered from where the strategy keeps it);
 *   restore   after a checkpoint was loaded on every rank.
 * Each family file (sync.c, averaging.c, async.c, pipeline.c) fills one table per kind it implements
 * and includes only this header, comm.h (the counted communication below it) and the engine's headers.
 * Nothing here is strategy.c's: a family never calls up into the registry, and knows no other family.
 * MPI yes, Python.h no: every wait goes through the function the caller passes in (pydist's wait loop),
 * and every MPI call is made between lock() and unlock() (the caller's GIL, which serialises MPI).
 *
 * A strategy has its own communicator, so only a family's own messages meet; their tags still differ
 * from family to family (sync.c 1-3, async.c 4-8, pipeline.c 9-11), so a trace reads unambiguously.
 *
 * The timeline (timeline.h): inside a worker's "step" span (train.c) each family records its own
 * phases, siblings that never overlap: "gradient sync" (cat "sync", args TL_EXCHANGE below) and
 * "update" (cat "compute"); "averaging round"; "server exchange" and "serve"; the pipeline's
 * micro-batches and its stage sends and receives. Off, each costs the one branch in pd_tl_begin.
 */
#ifndef PYDIST_STRATEGIES_HOOKS_H
#define PYDIST_STRATEGIES_HOOKS_H

#include <stddef.h>

#include "comm.h"
#include "compress/compress.h"
#include "engine/data.h"
#include "engine/model.h"
#include "engine/sgd.h"
#include "observe/timeline.h"

typedef enum {
    STRATEGY_ALLREDUCE, STRATEGY_RING, STRATEGY_CENTRAL, STRATEGY_PS, STRATEGY_AVERAGE, STRATEGY_EASGD,
    STRATEGY_DOWNPOUR, STRATEGY_ADAG, STRATEGY_AEASGD, STRATEGY_DYNSGD, STRATEGY_PIPELINE,
    STRATEGY_KINDS
} StrategyKind;

typedef enum { MOMENTUM_LOCAL, MOMENTUM_AVERAGE, MOMENTUM_RESET } MomentumPlacement;
typedef enum { SCHEDULE_GPIPE, SCHEDULE_1F1B } PipelineSchedule;

typedef struct {
    StrategyKind kind;
    int servers;                   // ps and the asynchronous ones: dedicated ranks, the last `servers`
    int period;                    // average, easgd: steps between exchanges
    int warmup;                    // average: steps of synchronous SGD first
    MomentumPlacement placement;   // average: what happens to momentum at an averaging step
    float beta;                    // easgd, aeasgd: moving rate; alpha = beta / workers
    int window;                    // asynchronous: a worker's steps between exchanges
    int deterministic;             // asynchronous: servers serve in a fixed round-robin (repeatable)
    int stages, micro_batches;     // pipeline: P stages (R = P x replicas), M micro-batches per batch
    PipelineSchedule schedule;
    const int *split;              // pipeline: stage q runs layers [split[q], split[q + 1]); read at create
    CompressSpec compression;      // what the strategy sends, compressed (compress/compress.h); 0: none
    int survive;                   // asynchronous: a worker that dies is carried on without (async.c)
} StrategyConfig;

// What the asynchronous servers saw (summed over this rank's calls; a worker's stay 0 but exchanges).
typedef struct {
    long long pushes;          // server: exchanges served
    long long staleness_sum;   // server: its updates between each push's pull and the push, summed
    long long staleness_max;
    long long exchanges;       // worker: exchanges made (one per server each)
} AsyncStats;

// A pipeline stage's measurements (summed over steps; pipeline.c).
typedef struct {
    int stage, replica, first_layer, last_layer;  // layers [first_layer, last_layer)
    long parameters;                 // its slice of the flat buffers
    long steps;
    double busy, idle, sync;         // seconds computing, waiting for neighbours, all-reducing over replicas
    double step_seconds;             // wall time of its steps
    int slots, peak_slots;           // micro-batches' activations it can hold, and held at most at once
    long slot_bytes, workspace_bytes;  // one micro-batch's activations; backward's scratch
} PipelineStats;

// One block of the last step's timeline: a forward or backward of micro-batch `micro`, or the update.
typedef struct {
    int kind;            // 0 forward, 1 backward, 2 all-reduce over replicas + update
    int micro;
    double start, end;   // CLOCK_MONOTONIC seconds (one clock for every process of a host)
} PipelineEvent;

typedef struct Pipeline Pipeline;

typedef struct {
    StrategyConfig cfg;
    SgdConfig sgd;
    Comm comm;
    long n;                   // parameters
    int workers;              // ranks that compute gradients (all but ps's servers)
    int server;               // this rank is one of the servers (ps, the asynchronous ones): the last cfg.servers
    long shard_lo, shard_hi;  // server: its shard of the parameters
    float *center;            // easgd: the center variable, the same on every rank
    float *scratch;           // per strategy: a ring segment, received gradients, a sum
    long scratch_len;
    // asynchronous: a worker's weights at its last pull (base); a server's replies in flight, one per
    // worker, its requests (W receives, then W reply sends) and its update count at each worker's pull
    float *base, *replies;
    // asynchronous, compressed: a worker's payloads (one block, a shard's after another, at payload_at),
    // a server's receive buffers (one worker's payload each) and, for aeasgd, each worker's weights as
    // the server knows them (what its compressed differences have told it)
    char *payloads;
    size_t *payload_at, payload_bytes;
    float *known;
    MPI_Request *reqs;
    long long *pulled_at, updates;
    // asynchronous: a worker's block of batches [block_pos, block_end) of this call; server 0 hands
    // the blocks out (grants: [start, end) per worker, in flight) from next_block up to call_end
    long long block_pos, block_end, *grants, next_block, call_end;
    // asynchronous, server 0: the block each worker holds ([lo, hi) per worker) and the batches of
    // every block a worker finished (an exchange) in the last call; under cfg.survive also the blocks
    // of dead workers waiting for another (orphans) and the workers whose empty grant is held back
    // while a block may still come free
    long long *held, *orphans, batches_done, regranted, call_batches;
    int orphan_count, *waiting;
    // asynchronous under cfg.survive: the workers the last call went on without (server 0's word,
    // sent to every rank at the end of the call), and when this server noticed (CLOCK_REALTIME)
    int *dead;
    double *noticed;
    AsyncStats stats;
    Pipeline *pipe;           // pipeline: the stage (pipeline.c)
    Compressor z;             // cfg.compression's state: this rank's residual (and powersgd's warm start)
    // The timeline: the id of the group the strategy runs on (calls.c's, the same on every member; set
    // by the glue, 0: none), so that a report pairs the ranks' spans of one exchange; and the number of
    // the next run_step (the pipeline's hook is not given its step: the glue sets it for each call).
    long long trace_group;
    long trace_step;
} Strategy;

// The args of an exchange's span: the group and the step, alike on every rank that takes part.
#define TL_EXCHANGE(s, step) PD_TL_INT("group", (s)->trace_group), PD_TL_INT("seq", (step))

// ---------------------------------------------------------------------------------------------------
// The table a kind gives the registry

// A hook a kind does without is NULL. The registry does the common part around them: it places the
// servers (workers, server, shard_lo/hi) before create, allocates scratch_len floats of zeroed scratch
// after it and frees it, and supplies what a NULL hook means (below). The glue calls only the role hooks
// the rank has: step on a worker, serve on a ps server, the call hooks on an asynchronous rank, run_step
// on a pipeline stage. Hooks that communicate return 0, or -1 when a wait failed (the caller's error
// is set) or -2 when an MPI call failed (comm.mpi_rc / comm.mpi_call say which).
typedef struct {
    // What the kind sends compressed when cfg.compression asks (its step's gradients, pushed updates or
    // weight differences); NULL: the kind takes no compression, and asking is an error.
    const char *compresses;
    // Check the kind's options and take what it keeps besides scratch. 0; -1 with a message in err
    // (name: the strategy's, as the command line spells it); -2 out of memory (the registry says so, in
    // one wording for every strategy). The registry calls free after a failure. NULL: nothing to check.
    int (*create)(Strategy *s, const Model *m, const char *name, char *err, size_t errlen);
    // With compression, after the registry has made the compressor (s->z): what the kind keeps for it.
    // 0, or -2 out of memory. NULL: nothing.
    int (*create_compressed)(Strategy *s);
    void (*free)(Strategy *s);                            // NULL: nothing but scratch
    long (*scratch_len)(const Strategy *s);               // floats of scratch on this rank; NULL: none
    int (*worker_rank)(const Strategy *s);                // its data shard's index; NULL: the rank itself

    int (*step)(Strategy *s, float *params, float *grads, float *momentum, int *started, long step);
    int (*serve)(Strategy *s, float *params, float *momentum, int *started, long step);   // ps's servers
    // Asynchronous (the kind has servers that serve whole calls): a worker begins a call, takes its
    // batches and ends it; a server serves the call.
    void (*begin_call)(Strategy *s, int first, int last);
    int (*next_batch)(Strategy *s, long *batch_index);
    int (*end_call)(Strategy *s);
    int (*serve_call)(Strategy *s, float *params, int first, int last);
    // The pipeline: one whole step of this stage (it computes as well as communicates).
    int (*run_step)(Strategy *s, const Dataset *ds, const int *perm, int offset, int batch, float *params,
                    float *momentum, int *started, double *loss, int *correct);

    // Collective: the weights that count, into out[n] on every rank. NULL: params (every rank holds the same).
    int (*weights)(Strategy *s, const float *params, float *out);
    // Collective, after weights: momentum_out and *started_out hold this rank's momentum and started;
    // make them what a checkpoint saves, the same on every rank. NULL: they already are.
    int (*state)(Strategy *s, const float *momentum, float *momentum_out, int *started_out);
    // After every rank has loaded the same params/momentum (a checkpoint) or at create: take them up.
    void (*restore)(Strategy *s, const float *params);
} StrategyHooks;

// sync.c
extern const StrategyHooks allreduce_hooks, ring_hooks, central_hooks, ps_hooks;
// averaging.c
extern const StrategyHooks average_hooks, easgd_hooks;
// async.c: one table for downpour, adag, aeasgd and dynsgd, which differ only in how a server applies a push
extern const StrategyHooks async_hooks;
// pipeline.c, and its measurements for the glue (NULL / 0: not a pipeline)
extern const StrategyHooks pipeline_hooks;
const PipelineStats *pipeline_stats(const Strategy *s);
int pipeline_trace(const Strategy *s, const PipelineEvent **events);   // the last step's, in order

#endif  // PYDIST_STRATEGIES_HOOKS_H
