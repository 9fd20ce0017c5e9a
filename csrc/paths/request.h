/*
 * request.h: the plain MPI path (request.c): a collective's data as MPI's nonblocking call, and one MPI
 * request as a Work, waited for the pydist way.
 */
#ifndef PYDIST_PATHS_REQUEST_H
#define PYDIST_PATHS_REQUEST_H

#include "progress/work.h"

// MPI's nonblocking collective for a call's data, as collectives.c describes it once: started on the
// group's communicator at once, or on its private one after every rank's header has matched in the
// shared-memory slots (shared_memory.c). Every pointer lives in the call's `keep`.
enum { PD_MPI_BCAST, PD_MPI_ALLREDUCE, PD_MPI_REDUCE, PD_MPI_ALLGATHER, PD_MPI_ALLGATHERV, PD_MPI_GATHERV,
       PD_MPI_SCATTERV, PD_MPI_REDUCE_SCATTER_BLOCK, PD_MPI_ALLTOALLV, PD_MPI_ALLTOALL, PD_MPI_BARRIER };
typedef struct {
    int kind;                   // PD_MPI_*
    const char *name;           // MPI's function, for errors
    const void *send;           // MPI_IN_PLACE where MPI allows it
    MPI_Count scount;
    const MPI_Count *scounts;   // the v-collectives' (bytes)
    const MPI_Aint *sdispls;
    void *recv;                 // broadcast's buffer; reductions' result
    MPI_Count rcount;
    const MPI_Count *rcounts;
    const MPI_Aint *rdispls;
    MPI_Datatype type;
    MPI_Op op;
    int root;                   // group rank
} PdMpiCall;
// Start it on `comm` (request.c): MPI's return code. *scratch: NULL, or memory MPI reads until the
// request completes (a new reference, to keep with the call's arrays).
int pd_mpi_call_start(const PdMpiCall *c, MPI_Comm comm, MPI_Request *req, PyObject **scratch);
// Whether pd_mpi_call_start may hand back scratch for `c` (the v-collectives on a library without large
// counts).
int pd_mpi_call_scratch(const PdMpiCall *c);
// The same data as point-to-point at 2 ranks, this rank being group rank `me` (request.c): MPI's return
// code with *what the MPI call made (for its error), or -1 for a call that is not one block each way
// (then pd_mpi_call_start).
int pd_mpi_call_start_pair(const PdMpiCall *c, int me, MPI_Comm comm, int tag, MPI_Request *req,
                           const char **what);
// Whether a call is of that kind (the same answer on every rank whose call matched).
int pd_mpi_call_pairs(const PdMpiCall *c);
// An all-to-all-v whose blocks are all one size and in rank order on both sides, as the plain all-to-all
// in *out: 1, else 0. Only where every rank's call is known to convert alike (MPI matches them only
// with each other).
int pd_mpi_call_even(const PdMpiCall *c, int size, PdMpiCall *out);
// If an input block overlaps an output block (MPI forbids it; MPICH may abort on it), point the call's
// input at a copy taken now, returned in *stage (new reference, to keep with the call), else *stage =
// NULL. `size`, `me`: the group's. 0, or -1 raised.
int pd_mpi_call_unalias(PdMpiCall *c, int size, int me, PyObject **stage);

// The plain MPI path (request.c): one MPI request, waited for the pydist way.
extern const PdPending pd_request_pending;
// A new Work for `req` (MPI_REQUEST_NULL: complete already). is_recv: a point-to-point receive. On
// failure the request is parked with `keep`, so its memory stays alive, and NULL is returned.
PdWorkObject *pd_work_new(MPI_Request req, const PdOp *op, PyObject *keep, PyObject *result, int is_recv);

#endif  // PYDIST_PATHS_REQUEST_H
