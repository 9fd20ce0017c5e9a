/*
 * comm.h: counted communication, the layer every strategy stands on. A Comm is a communicator and how
 * to wait on it; each helper takes the caller's lock around its MPI calls, waits through the caller's
 * wait loop, and adds what it sends to count and the time it spent to seconds, so every strategy
 * reports its cost the same way. Also the arithmetic of the servers' shards, which several use.
 * This file knows nothing of strategies: no Strategy, no kinds, no registry (strategy.c is above it,
 * and so is every strategy family file). MPI yes, Python.h no.
 */
#ifndef PYDIST_STRATEGIES_COMM_H
#define PYDIST_STRATEGIES_COMM_H

#include <stdint.h>

#include "core/mpi_calls.h"

#include "paths/algorithms/ring.h"

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
    // waitany, ended early (0 with *index -1) once more than `handled` of the ranks the caller may lose
    // (asynchronous workers under PYDIST_SURVIVE) have left; and whether rank `rank` has left. Both
    // called between lock() and unlock().
    int (*waitany_or_departure)(int n, MPI_Request *reqs, int first, int *index, MPI_Status *status, double since,
                                int handled, void *ctx);
    int (*left)(int rank, void *ctx);
} Comm;

// Each returns 0, or -1 when a wait failed (the caller's error is set) or -2 when an MPI call failed
// (mpi_rc / mpi_call say which).

// Record a failed MPI call (or a malloc, as MPI_ERR_NO_MEM) for the caller to raise. Returns -2.
int comm_fail(Comm *c, int rc, const char *call);
int comm_wait(Comm *c, MPI_Request *req);
// Wait for reqs[0..n) in order; after a failed wait the rest are parked.
int comm_waitall(Comm *c, int n, MPI_Request *reqs);
int comm_waitany(Comm *c, int n, MPI_Request *reqs, int first, int *index, MPI_Status *status, double since);
int comm_waitany_or_departure(Comm *c, int n, MPI_Request *reqs, int first, int *index, MPI_Status *status,
                              double since, int handled);
int comm_left(Comm *c, int rank);
// A request whose peer has died: cancelled and freed (it can never complete).
void comm_abandon(Comm *c, MPI_Request *req);
double comm_now(void);   // MPI_Wtime's clock
// Requests that will not be waited for (a post before them failed): parked, so they free nothing early.
void comm_park_all(Comm *c, int n, MPI_Request *reqs);
int comm_isend(Comm *c, const float *buf, long n, int dst, int tag, MPI_Request *req);
int comm_irecv(Comm *c, float *buf, long n, int src, int tag, MPI_Request *req);

// Servers' shards: the last S ranks each own a contiguous shard of n values, [shard_lo(j), shard_lo(j+1))
// for server j, the first n % S shards one longer.
long shard_lo(long n, int servers, int j);
// The shards of src on the servers into out[n] on every rank.
int comm_gather_shards(Comm *c, const float *src, float *out, long n, int servers, int tag);

// Sum buf[0..n) over the ranks in place: MPI's all-reduce (counted as a ring sends: 2(R-1)/R of the
// buffer in 2(R-1) messages; MPICH may choose another algorithm), or our ring (counted exactly).
int comm_allreduce_sum(Comm *c, float *buf, long n);
// The same with the shared-memory all-reduce where the Comm has one and it is usable for the group (a
// node-local group; no copy when buf lives in the segment, as the engine's gradients do), else MPI's.
// Only for a Comm over the whole group the caller's shm_allreduce belongs to.
int comm_allreduce_sum_shm(Comm *c, float *buf, long n);
int comm_ring_allreduce_sum(Comm *c, float *buf, long n, float *tmp);
int comm_allreduce_max_int(Comm *c, int *value);
// Whether every rank holds the same n (<= COMM_AGREE_MAX) values: one all-reduce (MAX of each value
// and of its complement), after which every rank holds each value's smallest (lo) and largest (hi)
// over the group, and *differs is the first i where they differ (-1: every rank agrees). Every rank
// learns the same, so every rank can refuse alike.
#define COMM_AGREE_MAX 32
int comm_agree(Comm *c, const uint64_t *mine, int n, uint64_t *lo, uint64_t *hi, int *differs);
// MPI's broadcast (counted as a flat tree: the root sends the buffer to each other rank).
int comm_bcast(Comm *c, float *buf, long n, int root);
// Bytes (a compressed payload) to one rank, and every rank's `bytes` into all[R x bytes] in rank order,
// this rank's already at all + rank x bytes (counted as a ring sends: R - 1 blocks in R - 1 messages).
int comm_isend_bytes(Comm *c, const void *buf, size_t bytes, int dst, int tag, MPI_Request *req);
int comm_irecv_bytes(Comm *c, void *buf, size_t bytes, int src, int tag, MPI_Request *req);
int comm_allgather_bytes(Comm *c, void *all, size_t bytes);

#endif  // PYDIST_STRATEGIES_COMM_H
