/*
 * route.h: which path carries a collective (route.c). An entry point (collectives.c) describes its call
 * once, as every path would take it, and pd_route walks one table of paths in order: the first that
 * takes the call runs it. Every row decides from what every rank of the group shares (sizes, the
 * group, the asked-for algorithm), so every rank takes the same path.
 */
#ifndef PYDIST_OPS_ROUTE_H
#define PYDIST_OPS_ROUTE_H

#include "core/buffer.h"
#include "paths/persistent.h"
#include "paths/request.h"
#include "paths/shared_memory.h"

// all_reduce's `algorithm` (pydist maps the names): automatic (the table decides), or a path asked for
// by name: MPI's own, our ring, our shared-memory all-reduce.
enum { PD_ROUTE_MPI = 0, PD_ROUTE_RING = 1, PD_ROUTE_SHM = 2, PD_ROUTE_AUTO = 3 };

typedef struct {
    const char *fn;
    long group;
    MPI_Comm comm;
    int async_op;
    int algorithm;             // PD_ROUTE_AUTO, or all_reduce's path by name
    // The shared-memory slots' form of the call: run there first when small_first and the slots take its
    // size; else, on a group whose calls put their headers through the slots (headers_ok), its header
    // goes there and its data takes MPI (pd_shm_header_run).
    SmallCall small;
    int small_first;
    int headers_ok;
    // The cached persistent form (persist_ok), for a message of persist_bytes.
    int persist_ok;
    size_t persist_bytes;
    PdPersistKey persist_key;
    PdPersistCall persist_call;
    PdMpiCall mpi;             // MPI's nonblocking collective
    PyObject *keep;            // owns every byte any path touches (kept until the call completes)
    PyObject *result;          // what Work.result() returns (borrowed; NULL: an empty list)
    const PdBuf *avg;          // AVG by MPI: divide this by the group size on completion (NULL: none)
    // all_reduce's own paths (the ring, the large shared-memory all-reduce): its tensor; NULL elsewhere.
    PyObject *tensor;
    PdBuf *buf;
    long op;
    MPI_Op mop;
} PdRoute;

// Run the call on the first path of the table that takes it: None, a Work (async_op), or NULL raised.
PyObject *pd_route(PdRoute *r);

#endif  // PYDIST_OPS_ROUTE_H
