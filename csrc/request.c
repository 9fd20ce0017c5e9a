/*
 * request.c: the plain MPI path's pending operation: one MPI request (a nonblocking collective, isend,
 * irecv), tested with MPI_Test, waited for the pydist way (group.c's pd_op_wait: deadline, Ctrl-C,
 * departed ranks), and parked with its arrays when its Work is dropped before it completes.
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
