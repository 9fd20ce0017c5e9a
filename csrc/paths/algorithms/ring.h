/*
 * ring.h: our own all-reduce, the ring of Patarasuk & Yuan (as in Horovod and NCCL): the buffer in R
 * segments (the first n % R one element longer), R - 1 steps of reduce-scatter, then R - 1 steps of
 * all-gather, each step one nonblocking send/receive pair (MPI_Isendrecv_c) with the ring neighbours.
 * MPI yes, Python.h no: the caller supplies how to wait for a request, so Python's all_reduce waits
 * through pydist's wait loop and the engine through its own.
 *
 * Every rank ends with bitwise the same result: each segment is reduced once, on one rank, in ring
 * order, and then copied around.
 */
#ifndef PYDIST_ALGORITHMS_RING_H
#define PYDIST_ALGORITHMS_RING_H

#include "core/mpi_calls.h"
#include <stddef.h>

// Bytes and messages this rank has sent, counted where they are sent.
typedef struct {
    long long bytes_sent;
    long long messages;
} CommCount;

// Wait for *req to complete. Returns 0, or -1 with the caller's error recorded (the request is then
// the callee's to park or free; the ring is abandoned).
typedef int (*RingWaitFn)(MPI_Request *req, void *ctx);

typedef struct {
    char *buf, *tmp;          // the data (in place) and scratch for one segment; a reduce-scatter's
                              // output, and scratch for two segments (none on 2 ranks)
    const char *in;           // a reduce-scatter's input (NULL: an all-reduce)
    MPI_Count n;              // elements
    MPI_Datatype dtype;
    MPI_Op op;
    MPI_Aint extent;          // bytes per element
    MPI_Comm comm;
    int rank, size, tag;
    int step;                 // 0 .. 2 (size - 1); the next step to post
    int posted;               // a step's request is in flight
    CommCount *count;         // may be NULL
} RingAllreduce;

// Elements of scratch the ring needs for n elements on `size` ranks: the longest segment.
MPI_Count ring_scratch_elements(MPI_Count n, int size);

// Set up an all-reduce of buf[0..n) over comm (in place). tmp holds ring_scratch_elements() elements.
// All messages carry `tag`: ranks must run the same rings in the same order per tag.
// Returns MPI_SUCCESS or an MPI error code.
int ring_init(RingAllreduce *r, void *buf, MPI_Count n, MPI_Datatype dtype, MPI_Op op, MPI_Comm comm, int tag,
              void *tmp, CommCount *count);

// Set up a reduce-scatter: out (count elements) on rank r becomes the reduction of every rank's block r of
// in[0 .. R x count), which is only read. The R - 1 reduce-scatter steps of the ring, shifted so that each
// rank ends with its own block, each received into the scratch (the last one into out) and reduced there
// with this rank's block of in: each block is reduced in ring order, as the all-reduce's are. tmp holds
// ring_rs_scratch_elements() elements.
int ring_rs_init(RingAllreduce *r, const void *in, void *out, MPI_Count count, MPI_Datatype dtype, MPI_Op op,
                 MPI_Comm comm, int tag, void *tmp, CommCount *comm_count);
// Elements of scratch a reduce-scatter of `count` elements per rank needs on `size` ranks.
MPI_Count ring_rs_scratch_elements(MPI_Count count, int size);

// Post the next step's send/receive pair into *req. *req is MPI_REQUEST_NULL when nothing is left
// (the all-reduce is complete). Returns MPI_SUCCESS or an MPI error code.
int ring_post(RingAllreduce *r, MPI_Request *req);

// The posted step's request has completed: reduce what arrived (reduce-scatter steps) and move on.
// Returns MPI_SUCCESS or an MPI error code (MPI_Reduce_local's).
int ring_complete(RingAllreduce *r);

// The whole all-reduce, waiting for each step with wait(). Returns 0, or -1 (wait failed; its
// error stands) or -2 with *mpi_rc set (an MPI call failed; the caller raises with its text).
int ring_allreduce(void *buf, MPI_Count n, MPI_Datatype dtype, MPI_Op op, MPI_Comm comm, int tag, void *tmp,
                   CommCount *count, RingWaitFn wait, void *wait_ctx, int *mpi_rc, const char **mpi_call);

#endif  // PYDIST_ALGORITHMS_RING_H
