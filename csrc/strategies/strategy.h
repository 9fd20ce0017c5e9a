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
 * dynsgd (a server loop). strategy.c: the table, and the counted communication every strategy uses.
 */
#ifndef PYDIST_STRATEGIES_STRATEGY_H
#define PYDIST_STRATEGIES_STRATEGY_H

#include <mpi.h>
#include <stddef.h>

#include "algorithms/ring.h"
#include "engine/model.h"
#include "engine/sgd.h"

typedef enum {
    STRATEGY_ALLREDUCE, STRATEGY_RING, STRATEGY_CENTRAL, STRATEGY_PS, STRATEGY_AVERAGE, STRATEGY_EASGD,
    STRATEGY_DOWNPOUR, STRATEGY_ADAG, STRATEGY_AEASGD, STRATEGY_DYNSGD,
    STRATEGY_KINDS
} StrategyKind;

typedef enum { MOMENTUM_LOCAL, MOMENTUM_AVERAGE, MOMENTUM_RESET } MomentumPlacement;

typedef struct {
    StrategyKind kind;
    int servers;                   // ps and the asynchronous ones: dedicated ranks, the last `servers`
    int period;                    // average, easgd: steps between exchanges
    int warmup;                    // average: steps of synchronous SGD first
    MomentumPlacement placement;   // average: what happens to momentum at an averaging step
    float beta;                    // easgd, aeasgd: moving rate; alpha = beta / workers
    int window;                    // asynchronous: a worker's steps between exchanges
    int deterministic;             // asynchronous: servers serve in a fixed round-robin (repeatable)
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
} Comm;

// What the asynchronous servers saw (summed over this rank's calls; a worker's stay 0 but exchanges).
typedef struct {
    long long pushes;          // server: exchanges served
    long long staleness_sum;   // server: its updates between each push's pull and the push, summed
    long long staleness_max;
    long long exchanges;       // worker: exchanges made (one per server each)
} AsyncStats;

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
} Strategy;

// Names as the command line spells them ("allreduce", ...); -1 for an unknown name.
int strategy_kind_of(const char *name);
const char *strategy_name(StrategyKind kind);

// Check cfg against the group (size ranks) and n parameters and allocate. params: the initial weights,
// the same on every rank. Returns 0, or -1 with a message in err.
int strategy_create(Strategy *s, const StrategyConfig *cfg, const SgdConfig *sgd, Comm comm, long n,
                    const float *params, char *err, size_t errlen);
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
int comm_ring_allreduce_sum(Comm *c, float *buf, long n, float *tmp);
int comm_allreduce_max_int(Comm *c, int *value);
// MPI's broadcast (counted as a flat tree: the root sends the buffer to each other rank).
int comm_bcast(Comm *c, float *buf, long n, int root);

#endif  // PYDIST_STRATEGIES_STRATEGY_H
