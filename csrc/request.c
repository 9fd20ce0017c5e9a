/*
 * request.c: the plain MPI path's pending operation: one MPI request (a nonblocking collective, isend,
 * irecv), tested with MPI_Test, waited for the pydist way (group.c's pd_op_wait: deadline, Ctrl-C,
 * departed ranks), and parked with its arrays when its Work is dropped before it completes; and the one
 * place that starts a collective's data as MPI's nonblocking call (PdMpiCall).
 */
#include "pydist.h"

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

int pd_mpi_call_start(const PdMpiCall *c, MPI_Comm comm, MPI_Request *req) {
    switch (c->kind) {
    case PD_MPI_BCAST:
        return MPI_Ibcast_c(c->recv, c->rcount, c->type, c->root, comm, req);
    case PD_MPI_ALLREDUCE:
        return MPI_Iallreduce_c(c->send, c->recv, c->rcount, c->type, c->op, comm, req);
    case PD_MPI_REDUCE:
        return MPI_Ireduce_c(c->send, c->recv, c->scount, c->type, c->op, c->root, comm, req);
    case PD_MPI_ALLGATHER:
        return MPI_Iallgather_c(c->send, c->scount, c->type, c->recv, c->rcount, c->type, comm, req);
    case PD_MPI_ALLGATHERV:
        return MPI_Iallgatherv_c(c->send, c->scount, c->type, c->recv, c->rcounts, c->rdispls, c->type, comm, req);
    case PD_MPI_GATHERV:
        return MPI_Igatherv_c(c->send, c->scount, c->type, c->recv, c->rcounts, c->rdispls, c->type, c->root, comm,
                              req);
    case PD_MPI_SCATTERV:
        return MPI_Iscatterv_c(c->send, c->scounts, c->sdispls, c->type, c->recv, c->rcount, c->type, c->root, comm,
                               req);
    case PD_MPI_REDUCE_SCATTER_BLOCK:
        return MPI_Ireduce_scatter_block_c(c->send, c->recv, c->rcount, c->type, c->op, comm, req);
    case PD_MPI_ALLTOALLV:
        return MPI_Ialltoallv_c(c->send, c->scounts, c->sdispls, c->type, c->recv, c->rcounts, c->rdispls, c->type,
                                comm, req);
    default:
        return MPI_ERR_INTERN;
    }
}
