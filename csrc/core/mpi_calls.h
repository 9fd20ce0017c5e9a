/*
 * mpi_calls.h: MPI's header for the ABI this build of pydist._C is for, and the MPI-4 calls that
 * ABI's libraries may lack. Every file of ours that talks to MPI includes this, never <mpi.h> itself.
 *
 * pydist._C is built once per MPI ABI (setup.py), as mpi4py's wheels are, and pydist/_libraries.py
 * loads the build that matches the library the job runs on:
 *   mpich     MPICH's ABI (libmpi.so.12: MPICH 4 and 5, Intel MPI, MVAPICH): MPICH's own mpi.h
 *   openmpi   Open MPI's (libmpi.so.40: Open MPI 4.1 and 5.0): Open MPI 5.0's mpi.h
 *   standard  the MPI-5 standard ABI (libmpi_abi.so.1: MPICH 5, Open MPI 6): MPICH's mpi_abi.h
 *
 * Open MPI before 6 has no large-count (_c) calls: each one here calls the int-count call where the
 * count fits an int, and fails with MPI_ERR_COUNT where it does not (an array of 2 GiB or more, which
 * pydist refuses up front on such a library: PD_MPI_MAX_COUNT, core/buffer.c). The v-collectives,
 * whose displacements are arrays' addresses far apart, go through MPI_Ialltoallw on MPI_BOTTOM
 * instead (paths/request.c). Open MPI 4.1 also lacks MPI_Isendrecv and the persistent collectives
 * (MPI_Bcast_init, ...): they are weak here, and pd_mpi_has_* says whether the library has them
 * (the pair exchange, the ring and the persistent cache stand aside without them).
 */
#ifndef PYDIST_CORE_MPI_CALLS_H
#define PYDIST_CORE_MPI_CALLS_H

#include <limits.h>

#if defined(PD_MPI_ABI_STANDARD)
#include <mpi_abi.h>
#else
#include <mpi.h>
#endif

#if defined(PD_MPI_ABI_STANDARD)
#define PD_MPI_ABI "standard"
#elif defined(OPEN_MPI) && OPEN_MPI
#define PD_MPI_ABI "openmpi"
#else
#define PD_MPI_ABI "mpich"
#endif

// MPI-4's large-count calls: MPICH 4 and later, Intel MPI 2021, the standard ABI; not Open MPI 4-5.
#if defined(MPI_VERSION) && MPI_VERSION >= 4
#define PD_MPI_LARGE_COUNT 1
#else
#define PD_MPI_LARGE_COUNT 0
#endif

#if !PD_MPI_LARGE_COUNT && !(defined(OPEN_MPI) && OPEN_MPI)
#error "pydist needs an MPI 4 library of MPICH's ABI, Open MPI 4.1 or later, or the MPI-5 standard ABI"
#endif

// The most elements one MPI call may carry on this build's libraries (MPI_Count's or an int's).
#if PD_MPI_LARGE_COUNT
#define PD_MPI_MAX_COUNT ((MPI_Count)1 << 62)
#else
#define PD_MPI_MAX_COUNT ((MPI_Count)INT_MAX)
#endif

// The user-op length: what MPI_Op_create_c's (or MPI_Op_create's) function is given.
#if PD_MPI_LARGE_COUNT
typedef MPI_Count PdOpLen;
typedef MPI_User_function_c PdUserFunction;
#define PD_MPI_OP_CREATE MPI_Op_create_c
#else
typedef int PdOpLen;
typedef MPI_User_function PdUserFunction;
#define PD_MPI_OP_CREATE MPI_Op_create
#endif

#if !PD_MPI_LARGE_COUNT
// Open MPI 4.1's library lacks these; 5.0's has them. Weak: NULL where the library has none.
#pragma weak MPI_Isendrecv
#pragma weak MPI_Barrier_init
#pragma weak MPI_Bcast_init
#pragma weak MPI_Allreduce_init
#pragma weak MPI_Reduce_init
#pragma weak MPI_Allgather_init
#pragma weak MPI_Reduce_scatter_block_init

// The count as an int for the int-count call, or MPI_ERR_COUNT from the enclosing wrapper.
#define PD_INT_COUNT(n) do { if ((n) < 0 || (n) > INT_MAX) return MPI_ERR_COUNT; } while (0)

static inline int pd_isendrecv_c(const void *sbuf, MPI_Count scount, MPI_Datatype stype, int dst, int stag,
                                 void *rbuf, MPI_Count rcount, MPI_Datatype rtype, int src, int rtag, MPI_Comm comm,
                                 MPI_Request *req) {
    PD_INT_COUNT(scount);
    PD_INT_COUNT(rcount);
    if (MPI_Isendrecv == NULL) {
        return MPI_ERR_UNSUPPORTED_OPERATION;
    }
    return MPI_Isendrecv(sbuf, (int)scount, stype, dst, stag, rbuf, (int)rcount, rtype, src, rtag, comm, req);
}
static inline int pd_isend_c(const void *buf, MPI_Count n, MPI_Datatype t, int dst, int tag, MPI_Comm comm,
                             MPI_Request *req) {
    PD_INT_COUNT(n);
    return MPI_Isend(buf, (int)n, t, dst, tag, comm, req);
}
static inline int pd_irecv_c(void *buf, MPI_Count n, MPI_Datatype t, int src, int tag, MPI_Comm comm,
                             MPI_Request *req) {
    PD_INT_COUNT(n);
    return MPI_Irecv(buf, (int)n, t, src, tag, comm, req);
}
static inline int pd_reduce_local_c(const void *in, void *inout, MPI_Count n, MPI_Datatype t, MPI_Op op) {
    PD_INT_COUNT(n);
    return MPI_Reduce_local(in, inout, (int)n, t, op);
}
static inline int pd_ibcast_c(void *buf, MPI_Count n, MPI_Datatype t, int root, MPI_Comm comm, MPI_Request *req) {
    PD_INT_COUNT(n);
    return MPI_Ibcast(buf, (int)n, t, root, comm, req);
}
static inline int pd_iallreduce_c(const void *s, void *r, MPI_Count n, MPI_Datatype t, MPI_Op op, MPI_Comm comm,
                                  MPI_Request *req) {
    PD_INT_COUNT(n);
    return MPI_Iallreduce(s, r, (int)n, t, op, comm, req);
}
static inline int pd_ireduce_c(const void *s, void *r, MPI_Count n, MPI_Datatype t, MPI_Op op, int root,
                               MPI_Comm comm, MPI_Request *req) {
    PD_INT_COUNT(n);
    return MPI_Ireduce(s, r, (int)n, t, op, root, comm, req);
}
static inline int pd_iallgather_c(const void *s, MPI_Count sn, MPI_Datatype st, void *r, MPI_Count rn,
                                  MPI_Datatype rt, MPI_Comm comm, MPI_Request *req) {
    PD_INT_COUNT(sn);
    PD_INT_COUNT(rn);
    return MPI_Iallgather(s, (int)sn, st, r, (int)rn, rt, comm, req);
}
static inline int pd_ialltoall_c(const void *s, MPI_Count sn, MPI_Datatype st, void *r, MPI_Count rn,
                                 MPI_Datatype rt, MPI_Comm comm, MPI_Request *req) {
    PD_INT_COUNT(sn);
    PD_INT_COUNT(rn);
    return MPI_Ialltoall(s, (int)sn, st, r, (int)rn, rt, comm, req);
}
static inline int pd_ireduce_scatter_block_c(const void *s, void *r, MPI_Count n, MPI_Datatype t, MPI_Op op,
                                             MPI_Comm comm, MPI_Request *req) {
    PD_INT_COUNT(n);
    return MPI_Ireduce_scatter_block(s, r, (int)n, t, op, comm, req);
}
static inline int pd_type_size_c(MPI_Datatype t, MPI_Count *size) {
    int s = 0, rc = MPI_Type_size(t, &s);
    *size = s;
    return rc;
}
#undef PD_INT_COUNT

#define MPI_Isendrecv_c pd_isendrecv_c
#define MPI_Isend_c pd_isend_c
#define MPI_Irecv_c pd_irecv_c
#define MPI_Reduce_local_c pd_reduce_local_c
#define MPI_Ibcast_c pd_ibcast_c
#define MPI_Iallreduce_c pd_iallreduce_c
#define MPI_Ireduce_c pd_ireduce_c
#define MPI_Iallgather_c pd_iallgather_c
#define MPI_Ialltoall_c pd_ialltoall_c
#define MPI_Ireduce_scatter_block_c pd_ireduce_scatter_block_c
#define MPI_Type_size_c pd_type_size_c
#endif  // !PD_MPI_LARGE_COUNT

// Whether the library loaded has MPI_Isendrecv (the pair exchange and the ring use it) and MPI-4's
// persistent collectives (the persistent cache). Every rank of a job runs one library, so every rank
// answers alike.
#if PD_MPI_LARGE_COUNT
#define pd_mpi_has_isendrecv() 1
#define pd_mpi_has_persistent() 1
#else
#define pd_mpi_has_isendrecv() (MPI_Isendrecv != NULL)
#define pd_mpi_has_persistent() (MPI_Bcast_init != NULL && MPI_Barrier_init != NULL && MPI_Allreduce_init != NULL && \
                                 MPI_Reduce_init != NULL && MPI_Allgather_init != NULL &&                        \
                                 MPI_Reduce_scatter_block_init != NULL)
#endif

#endif  // PYDIST_CORE_MPI_CALLS_H
