/*
 * strategy.h: how ranks cooperate in training. A strategy is a small table of hooks the step loop
 * (csrc/engine/train.c) calls at fixed points, plus its state:
 *   step      after backward on a worker: bring the gradients (or weights) together and update;
 *   serve     on a rank that computes nothing (a parameter server): one step's exchange;
 *   weights   at evaluation: which weights count (the replica, the average, the center);
 *   state     at checkpoint: what must be saved (gathered from where the strategy keeps it);
 *   restore   after a checkpoint was loaded on every rank.
 * MPI yes, Python.h no: every wait goes through the function the caller passes in (pydist's wait loop),
 * and every MPI call is made between lock() and unlock() (the caller's GIL, which serialises MPI).
 *
 * sync.c: allreduce, ring, central, ps. averaging.c: average, easgd. async.c: downpour, adag, aeasgd,
 * dynsgd (a server loop). pipeline.c: pipeline stages (its own step: run_step). strategy.c: the table, and the counted communication every strategy uses.
 */
#ifndef PYDIST_STRATEGIES_STRATEGY_H
#define PYDIST_STRATEGIES_STRATEGY_H

#include <mpi.h>
#include <stddef.h>

#include "algorithms/ring.h"
#include "engine/data.h"
#include "engine/model.h"
#include "engine/sgd.h"

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
} StrategyConfig;

// The communicator and how to wait on it, with what was sent counted where it is sent.
typedef struct {
    MPI_Comm comm;            // MPI_COMM_NULL: alone
    int rank, size;
    RingWaitFn wait;          // called between lock() and unlock()
    void (*lock)(void *ctx);
    void (*unlock)(void *ctx);
    // Keep a request that will not be waited for (a wait before it failed) from writing freed memory.
    void (*park)(MPI_Request *req, void *ctx);
    void *ctx;
    CommCount count;
    double seconds;           // wall time inside communication (Tsync)
    int mpi_rc;               // the last MPI call that failed, for the caller to raise
    const char *mpi_call;
    // Wait for whichever of reqs[0..n) completes first, testing from reqs[first] round the array; the
    // same contract as wait (nothing parked on failure). *index: which one (-1: all were null).
    // since: when the caller's loop of waits began (a rank that left is given its grace from then).
    int (*waitany)(int n, MPI_Request *reqs, int first, int *index, MPI_Status *status, double since, void *ctx);
    // The shared-memory all-reduce (sum of floats in place), called between lock() and unlock(): 1 done,
    // 0 not usable for this buffer on this group (the same answer on every rank: MPI's is used), -1 failed
    // (the caller's error is set). NULL: none.
    int (*shm_allreduce)(float *buf, long n, void *ctx);
} Comm;

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
    long shard_lo, shard_hi;  // ps server: its shard of the parameters
    float *center;            // easgd: the center variable, the same on every rank
    float *scratch;           // per strategy: a ring segment, received gradients, a sum
    long scratch_len;
    // asynchronous: a worker's weights at its last pull (base); a server's replies in flight, one per
    // worker, its requests (W receives, then W reply sends) and its update count at each worker's pull
    float *base, *replies;
    MPI_Request *reqs;
    long long *pulled_at, updates;
    // asynchronous: a worker's block of batches [block_pos, block_end) of this call; server 0 hands
    // the blocks out (grants: [start, end) per worker, in flight) from next_block up to call_end
    long long block_pos, block_end, *grants, next_block, call_end;
    AsyncStats stats;
    Pipeline *pipe;           // pipeline: the stage (pipeline.c)
} Strategy;

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
int pipeline_run_step(Strategy *s, const Dataset *ds, const int *perm, int offset, int batch, float *params,
                      float *momentum, int *started, double *loss, int *correct);
const PipelineStats *pipeline_stats(const Strategy *s);         // NULL: not a pipeline
int pipeline_trace(const Strategy *s, const PipelineEvent **events);   // the last step's, in order
// Collective: the weights that count, into out[n] on every rank.
int strategy_weights(Strategy *s, const float *params, float *out);
// Collective: what to save, into params_out/momentum_out on every rank (and *started).
int strategy_state(Strategy *s, const float *params, const float *momentum, int started, float *params_out,
                   float *momentum_out, int *started_out);
// After every rank has loaded the same params/momentum (a checkpoint): take them up.
void strategy_restore(Strategy *s, const float *params);

// Counted communication (strategy.c), for the strategies' files.
int comm_fail(Comm *c, int rc, const char *call);
int comm_wait(Comm *c, MPI_Request *req);
int comm_waitall(Comm *c, int n, MPI_Request *reqs);
int comm_waitany(Comm *c, int n, MPI_Request *reqs, int first, int *index, MPI_Status *status, double since);
double comm_now(void);   // MPI_Wtime's clock
void comm_park_all(Comm *c, int n, MPI_Request *reqs);
int comm_isend(Comm *c, const float *buf, long n, int dst, int tag, MPI_Request *req);
int comm_irecv(Comm *c, float *buf, long n, int src, int tag, MPI_Request *req);
// Shards [shard_lo(j), shard_lo(j+1)) of src on the servers (the last S ranks) into out[n] on every rank.
int comm_gather_shards(Comm *c, const float *src, float *out, long n, int servers, int tag);
long shard_lo(long n, int servers, int j);
// Sum buf[0..n) over the ranks in place: MPI's all-reduce (counted as a ring sends: 2(R-1)/R of the
// buffer in 2(R-1) messages; MPICH may choose another algorithm), or our ring (counted exactly).
int comm_allreduce_sum(Comm *c, float *buf, long n);
// The same with the shared-memory all-reduce where the Comm has one and it is usable for the group (a
// node-local group; no copy when buf lives in the segment, as the engine's gradients do), else MPI's.
// Only for a Comm over the whole group the caller's shm_allreduce belongs to.
int comm_allreduce_sum_shm(Comm *c, float *buf, long n);
int comm_ring_allreduce_sum(Comm *c, float *buf, long n, float *tmp);
int comm_allreduce_max_int(Comm *c, int *value);
// MPI's broadcast (counted as a flat tree: the root sends the buffer to each other rank).
int comm_bcast(Comm *c, float *buf, long n, int root);

#endif  // PYDIST_STRATEGIES_STRATEGY_H
