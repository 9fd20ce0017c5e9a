/*
 * request.c: the plain MPI path's pending operation: one MPI request (a nonblocking collective, isend,
 * irecv), tested with MPI_Test, waited for the pydist way (progress/op.c's pd_op_wait: deadline, Ctrl-C,
 * departed ranks), and parked with its arrays when its Work is dropped before it completes; and the one
 * place that starts a collective's data as MPI's nonblocking call (PdMpiCall).
 */
#include "paths/request.h"

#include "core/errors.h"
#include "progress/op.h"
#include "progress/wait.h"

// MPI_Test once. 1 over (finished, or failed and recorded), 0 pending.
static int request_test(PdWorkObject *w) {
    int done = 0;
    int rc = MPI_Test(&w->req, &done, &w->status);
    if (rc != MPI_SUCCESS) {
        w->pending = NULL;
        pd_raise_mpi(rc, w->op.what);
        pd_work_fail(w);
        PyErr_Clear();   // reported by wait() / exception()
        return 1;
    }
    if (!done) {
        return 0;
    }
    w->pending = NULL;
    pd_work_finish(w);
    return 1;
}

static int request_wait(PdWorkObject *w, double timeout, int timeout_breaks) {
    if (pd_op_wait(&w->req, &w->status, &w->op, timeout, timeout_breaks) < 0) {
        if (w->req != MPI_REQUEST_NULL) {
            return -1;   // a timeout or a signal leaves the request pending and the Work usable
        }
        w->pending = NULL;   // MPI completed the request with an error
        pd_work_fail(w);
        PyErr_Clear();
        return 0;
    }
    w->pending = NULL;
    pd_work_finish(w);
    return 0;
}

// Dropped: complete now if MPI has, else park the request with the arrays (a receive nobody waits for
// may be cancelled at finalize), and warn.
static void request_abandon(PdWorkObject *w) {
    int done = 0, fin = 0;
    MPI_Finalized(&fin);
    if (!fin && MPI_Test(&w->req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) {
        pd_work_warn_dropped(w);
        pd_park(w->req, w->keep, w->is_recv);  // steals keep
        w->keep = NULL;
    }
    w->req = MPI_REQUEST_NULL;
}

const PdPending pd_request_pending = {request_test, request_wait, request_abandon};

PdWorkObject *pd_work_new(MPI_Request req, const PdOp *op, PyObject *keep, PyObject *result, int is_recv) {
    PdWorkObject *w = pd_work_make(req == MPI_REQUEST_NULL ? NULL : &pd_request_pending, NULL, op, keep, result);
    if (w == NULL) {
        pd_park(req, Py_XNewRef(keep), is_recv);  // nobody can own the request now: keep its memory alive
        return NULL;
    }
    w->req = req;
    w->is_recv = is_recv;
    return w;
}

#if !PD_MPI_LARGE_COUNT
// ---------------------------------------------------------------------------------------------------
// The v-collectives without MPI-4's large counts (Open MPI before 6)
//
// Their int displacements cannot reach a list's arrays, which lie anywhere in the address space
// (small ones on the heap, large ones mapped far away). So each block is a datatype at its absolute
// address (hindexed, on MPI_BOTTOM), and the call is MPI_Ialltoallw, which takes one datatype per
// peer: every rank makes the same call, whatever its own addresses. The arrays MPI reads (counts,
// displacements, datatypes) stay in *scratch until the request completes; the datatypes are freed
// once started (MPI keeps them for the operation, MPI_Type_free's rule).

// Block p's address and size (in c->type's elements) on the send (send=1) or receive side; NULL: none.
static const char *v_block(const PdMpiCall *c, int send, int p, int me, MPI_Count *n) {
    *n = 0;
    int in_place = c->send == MPI_IN_PLACE || c->recv == MPI_IN_PLACE;
    if (in_place && p == me) {
        return NULL;   // this rank's own block is in place already
    }
    switch (c->kind) {
    case PD_MPI_ALLGATHERV:
        if (send && c->send == MPI_IN_PLACE) {   // this rank's block, from where it already is
            *n = c->rcounts[me];
            return (const char *)c->recv + c->rdispls[me];
        }
        *n = send ? c->scount : c->rcounts[p];
        return send ? c->send : (const char *)c->recv + c->rdispls[p];
    case PD_MPI_GATHERV:
        if (send ? p != c->root : me != c->root) {
            return NULL;
        }
        *n = send ? c->scount : c->rcounts[p];
        return send ? c->send : (const char *)c->recv + c->rdispls[p];
    case PD_MPI_SCATTERV:
        if (send ? me != c->root : p != c->root) {
            return NULL;
        }
        *n = send ? c->scounts[p] : c->rcount;
        return send ? (const char *)c->send + c->sdispls[p] : c->recv;
    case PD_MPI_ALLTOALLV:
        *n = send ? c->scounts[p] : c->rcounts[p];
        return send ? (const char *)c->send + c->sdispls[p] : (const char *)c->recv + c->rdispls[p];
    default:
        return NULL;
    }
}

static int v_start_alltoallw(const PdMpiCall *c, MPI_Comm comm, MPI_Request *req, PyObject **scratch) {
    int size = 0, me = 0, rc = MPI_Comm_size(comm, &size);
    if (rc != MPI_SUCCESS || (rc = MPI_Comm_rank(comm, &me)) != MPI_SUCCESS) {
        return rc;
    }
    // counts[2][size], displacements[size] (all 0: the types carry the addresses), types[2][size]
    size_t ints = 3 * (size_t)size, bytes = 2 * (size_t)size * sizeof(MPI_Datatype) + ints * sizeof(int);
    PyObject *mem = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)bytes);
    if (mem == NULL) {
        PyErr_Clear();
        return MPI_ERR_NO_MEM;
    }
    MPI_Datatype *types = (MPI_Datatype *)PyBytes_AS_STRING(mem);   // first: aligned for a pointer
    int *counts = (int *)(types + 2 * size), *displs = counts + 2 * size;
    int made = 0;
    for (int side = 0; side < 2 && rc == MPI_SUCCESS; side++) {
        for (int p = 0; p < size && rc == MPI_SUCCESS; p++) {
            MPI_Count n;
            const char *at = v_block(c, side == 0, p, me, &n);
            MPI_Datatype *t = &types[side * size + p];
            displs[p] = 0;
            counts[side * size + p] = at != NULL && n > 0;
            *t = c->type;
            if (at == NULL || n == 0) {
                continue;
            }
            MPI_Aint addr;
            int len = (int)n;
            if (n > INT_MAX) {
                rc = MPI_ERR_COUNT;
            } else if ((rc = MPI_Get_address(at, &addr)) == MPI_SUCCESS &&
                       (rc = MPI_Type_create_hindexed(1, &len, &addr, c->type, t)) == MPI_SUCCESS) {
                made++;
                rc = MPI_Type_commit(t);
            }
        }
    }
    if (rc == MPI_SUCCESS) {
        rc = MPI_Ialltoallw(MPI_BOTTOM, counts, displs, types, MPI_BOTTOM, counts + size, displs, types + size, comm,
                            req);
    }
    for (int i = 0; i < 2 * size && made > 0; i++) {
        if (types[i] != c->type && types[i] != MPI_DATATYPE_NULL) {
            MPI_Type_free(&types[i]);
            made--;
        }
    }
    if (rc != MPI_SUCCESS) {
        Py_DECREF(mem);
        return rc;
    }
    *scratch = mem;
    return rc;
}
#endif

int pd_mpi_call_scratch(const PdMpiCall *c) {
    return !PD_MPI_LARGE_COUNT && (c->kind == PD_MPI_ALLGATHERV || c->kind == PD_MPI_GATHERV ||
                                   c->kind == PD_MPI_SCATTERV || c->kind == PD_MPI_ALLTOALLV);
}

int pd_mpi_call_start(const PdMpiCall *c, MPI_Comm comm, MPI_Request *req, PyObject **scratch) {
    *scratch = NULL;
#if !PD_MPI_LARGE_COUNT
    if (pd_mpi_call_scratch(c)) {
        return v_start_alltoallw(c, comm, req, scratch);
    }
#endif
    switch (c->kind) {
    case PD_MPI_BARRIER:
        return MPI_Ibarrier(comm, req);
    case PD_MPI_BCAST:
        return MPI_Ibcast_c(c->recv, c->rcount, c->type, c->root, comm, req);
    case PD_MPI_ALLREDUCE:
        return MPI_Iallreduce_c(c->send, c->recv, c->rcount, c->type, c->op, comm, req);
    case PD_MPI_REDUCE:
        return MPI_Ireduce_c(c->send, c->recv, c->scount, c->type, c->op, c->root, comm, req);
    case PD_MPI_ALLGATHER:
        return MPI_Iallgather_c(c->send, c->scount, c->type, c->recv, c->rcount, c->type, comm, req);
#if PD_MPI_LARGE_COUNT
    case PD_MPI_ALLGATHERV:
        return MPI_Iallgatherv_c(c->send, c->scount, c->type, c->recv, c->rcounts, c->rdispls, c->type, comm, req);
    case PD_MPI_GATHERV:
        return MPI_Igatherv_c(c->send, c->scount, c->type, c->recv, c->rcounts, c->rdispls, c->type, c->root, comm,
                              req);
    case PD_MPI_SCATTERV:
        return MPI_Iscatterv_c(c->send, c->scounts, c->sdispls, c->type, c->recv, c->rcount, c->type, c->root, comm,
                               req);
#endif
    case PD_MPI_REDUCE_SCATTER_BLOCK:
        return MPI_Ireduce_scatter_block_c(c->send, c->recv, c->rcount, c->type, c->op, comm, req);
#if PD_MPI_LARGE_COUNT
    case PD_MPI_ALLTOALLV:
        return MPI_Ialltoallv_c(c->send, c->scounts, c->sdispls, c->type, c->recv, c->rcounts, c->rdispls, c->type,
                                comm, req);
#endif
    case PD_MPI_ALLTOALL:
        return MPI_Ialltoall_c(c->send, c->scount, c->type, c->recv, c->rcount, c->type, comm, req);
    default:
        return MPI_ERR_INTERN;
    }
}

// Two ranks: a broadcast, an all-gather and an all-to-all each move one block each way, so the data
// goes as one point-to-point request (MPI_Isend, MPI_Irecv or MPI_Isendrecv on `comm` with `tag`) and
// this rank's own block is copied here, at the start. MPICH's all-gather at 2 ranks, blocking or not,
// took 2.4x the exchange's time at 256 KiB and 7.4x at 1 MiB (benchmarks/pair_probe.c); its broadcast
// and all-to-all tie with it, less the schedule of the nonblocking call. Like MPI's call, the request never waits for the peer to start, and any
// MPI call moves it along. Byte-typed calls only (collectives.c sends these as bytes).
int pd_mpi_call_pairs(const PdMpiCall *c) {
    switch (c->kind) {
    case PD_MPI_BCAST: case PD_MPI_ALLGATHER: case PD_MPI_ALLGATHERV:
        return c->type == MPI_BYTE;
    case PD_MPI_ALLTOALL: case PD_MPI_ALLTOALLV:   // never made in place (collectives.c stages an aliased input)
        return c->type == MPI_BYTE && c->send != MPI_IN_PLACE;
    default:
        return 0;
    }
}

int pd_mpi_call_start_pair(const PdMpiCall *c, int me, MPI_Comm comm, int tag, MPI_Request *req,
                           const char **what) {
    if (!pd_mpi_call_pairs(c) || (me != 0 && me != 1)) {
        return -1;
    }
    *what = "MPI_Isendrecv_c";
    int p = 1 - me;
    const char *send = c->send == MPI_IN_PLACE ? NULL : (const char *)c->send;
    char *recv = c->recv;
    const char *src = NULL, *mine_in = NULL;   // the block sent to p; this rank's own block (NULL: in place)
    char *dst = NULL, *mine_out = NULL;        // where p's block lands; where this rank's own block goes
    MPI_Count scount = 0, rcount = 0, own = 0;
    switch (c->kind) {
    case PD_MPI_BCAST:
        *what = me == c->root ? "MPI_Isend_c" : "MPI_Irecv_c";
        return me == c->root ? MPI_Isend_c(recv, c->rcount, MPI_BYTE, p, tag, comm, req)
                             : MPI_Irecv_c(recv, c->rcount, MPI_BYTE, p, tag, comm, req);
    case PD_MPI_ALLGATHER:
        scount = rcount = own = c->rcount;
        mine_out = recv + (size_t)me * (size_t)own;
        dst = recv + (size_t)p * (size_t)own;
        mine_in = send;
        src = send != NULL ? send : mine_out;
        break;
    case PD_MPI_ALLGATHERV:
        scount = c->scount;
        rcount = c->rcounts[p];
        own = scount < c->rcounts[me] ? scount : c->rcounts[me];
        mine_out = recv + c->rdispls[me];
        dst = recv + c->rdispls[p];
        mine_in = send;
        src = send != NULL ? send : mine_out;
        break;
    case PD_MPI_ALLTOALL:
        scount = rcount = own = c->scount;
        src = send + (size_t)p * (size_t)own;
        dst = recv + (size_t)p * (size_t)own;
        mine_in = send + (size_t)me * (size_t)own;
        mine_out = recv + (size_t)me * (size_t)own;
        break;
    case PD_MPI_ALLTOALLV:   // this rank's own block is as large on both sides (collectives.c checks)
        scount = c->scounts[p];
        rcount = c->rcounts[p];
        own = c->scounts[me] < c->rcounts[me] ? c->scounts[me] : c->rcounts[me];
        src = send + c->sdispls[p];
        dst = recv + c->rdispls[p];
        mine_in = send + c->sdispls[me];
        mine_out = recv + c->rdispls[me];
        break;
    default:
        return -1;
    }
    int rc = MPI_Isendrecv_c(src, scount, MPI_BYTE, p, tag, dst, rcount, MPI_BYTE, p, tag, comm, req);
    if (rc == MPI_SUCCESS && mine_in != NULL && mine_in != mine_out && own > 0) {
        memmove(mine_out, mine_in, (size_t)own);   // while the peer's block is in flight
    }
    return rc;
}

// MPICH 4.0.2's alltoallv sends each rank's block to itself through its point-to-point layer, where
// its alltoall copies it (benchmarks/wait_probe.c, 2 ranks, Ialltoallv against Ialltoall: 256 KiB 12.0
// against 9.7 us, 1 MiB 52.7 against 47.9, 64 MiB 8.0 against 6.8 ms), so equal blocks may take the
// plain call (shared_memory.c decides, at 2 ranks).
int pd_mpi_call_even(const PdMpiCall *c, int size, PdMpiCall *out) {
    if (c->kind != PD_MPI_ALLTOALLV || size < 1) {
        return 0;
    }
    MPI_Count block = c->scounts[0];
    for (int p = 0; p < size; p++) {
        if (c->scounts[p] != block || c->rcounts[p] != block || c->sdispls[p] != (MPI_Aint)p * (MPI_Aint)block ||
            c->rdispls[p] != (MPI_Aint)p * (MPI_Aint)block) {
            return 0;
        }
    }
    *out = (PdMpiCall){PD_MPI_ALLTOALL, "MPI_Ialltoall_c", c->send, block, NULL, NULL, c->recv, block, NULL, NULL,
                       c->type, MPI_OP_NULL, -1};
    return 1;
}

// ---------------------------------------------------------------------------------------------------
// An input that overlaps the output

// The byte range of block p (of `size`) on one side of the call; len 0: none. send: the input side.
static void block_range(const PdMpiCall *c, int send, int p, int size, int me, MPI_Count type_size,
                        const char **at, size_t *len) {
    *at = NULL;
    *len = 0;
    const char *base = send ? (const char *)c->send : (const char *)c->recv;
    const MPI_Count *counts = send ? c->scounts : c->rcounts;
    const MPI_Aint *displs = send ? c->sdispls : c->rdispls;
    if (base == NULL || base == (const char *)MPI_IN_PLACE) {
        return;
    }
    if (counts != NULL) {   // the v-collectives' blocks, in bytes
        *at = base + displs[p];
        *len = (size_t)counts[p];
    } else if (!send && c->kind == PD_MPI_ALLGATHER) {   // one block per rank
        *at = base + (size_t)p * (size_t)c->rcount * (size_t)type_size;
        *len = (size_t)c->rcount * (size_t)type_size;
    } else if (p == me) {   // one buffer, given as this rank's block (a reduce-scatter's input: all of them)
        MPI_Count n = !send ? c->rcount : c->kind == PD_MPI_REDUCE_SCATTER_BLOCK ? c->rcount * size : c->scount;
        *at = base;
        *len = (size_t)n * (size_t)type_size;
    }
}

static int overlap(const char *a, size_t an, const char *b, size_t bn) {
    return an > 0 && bn > 0 && a < b + bn && b < a + an;
}

int pd_mpi_call_unalias(PdMpiCall *c, int size, int me, PyObject **stage) {
    *stage = NULL;
    if (c->kind == PD_MPI_BCAST || c->kind == PD_MPI_ALLREDUCE || c->kind == PD_MPI_REDUCE || c->kind == PD_MPI_BARRIER ||
        c->send == NULL || c->send == MPI_IN_PLACE || c->recv == NULL) {
        return 0;   // one buffer, or MPI_IN_PLACE: nothing to overlap
    }
    MPI_Count type_size = 1;
    if (c->type != MPI_BYTE && MPI_Type_size_c(c->type, &type_size) != MPI_SUCCESS) {
        return pd_raise_mpi_int(MPI_ERR_TYPE, c->name);
    }
    // Each side's extent first: separate arrays (the usual case) cost one pass over the blocks.
    const char *lo[2] = {NULL, NULL}, *hi[2] = {NULL, NULL};
    size_t total = 0;
    for (int side = 0; side < 2; side++) {
        for (int p = 0; p < size; p++) {
            const char *at;
            size_t len;
            block_range(c, side == 0, p, size, me, type_size, &at, &len);
            if (len == 0) {
                continue;
            }
            total += side == 0 ? len : 0;
            lo[side] = lo[side] == NULL || at < lo[side] ? at : lo[side];
            hi[side] = hi[side] == NULL || at + len > hi[side] ? at + len : hi[side];
        }
    }
    if (lo[0] == NULL || lo[1] == NULL || !overlap(lo[0], (size_t)(hi[0] - lo[0]), lo[1], (size_t)(hi[1] - lo[1]))) {
        return 0;
    }
    int aliased = 0;
    for (int p = 0; p < size && !aliased; p++) {
        const char *s;
        size_t sn;
        block_range(c, 1, p, size, me, type_size, &s, &sn);
        for (int q = 0; q < size && !aliased && sn > 0; q++) {
            const char *r;
            size_t rn;
            block_range(c, 0, q, size, me, type_size, &r, &rn);
            aliased = overlap(s, sn, r, rn);
        }
    }
    if (!aliased) {
        return 0;
    }
    // Send from a copy taken now (what the input held at the call, as the slots' path sends), with
    // its own displacements where the call has them.
    size_t displs_bytes = c->sdispls != NULL ? (size_t)size * sizeof(MPI_Aint) : 0;
    PyObject *copy = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(displs_bytes + total));
    if (copy == NULL) {
        return -1;
    }
    char *mem = PyByteArray_AS_STRING(copy), *data = mem + displs_bytes;
    if (c->sdispls != NULL) {
        MPI_Aint *displs = (MPI_Aint *)mem;   // bytearray's storage: malloc'd, aligned for MPI_Aint
        size_t at = 0;
        for (int p = 0; p < size; p++) {
            displs[p] = (MPI_Aint)at;
            memcpy(data + at, (const char *)c->send + c->sdispls[p], (size_t)c->scounts[p]);
            at += (size_t)c->scounts[p];
        }
        c->sdispls = displs;
    } else {
        memcpy(data, c->send, total);
    }
    c->send = data;
    *stage = copy;
    return 0;
}
