/*
 * op.c: how an operation on a group is waited for. wait.c's loop, with the session's timeout, and a
 * check that ends the wait when a rank the operation needs has exited (liveness.c records departures;
 * this file knows which ranks an operation needs). A collective that timed out breaks its group (the
 * ranks no longer agree on which collective comes next); a point-to-point call that timed out does not,
 * since collectives never match point-to-point messages.
 */
#include <stdio.h>

#include "progress/op.h"

#include "core/errors.h"
#include "groups/liveness.h"
#include "observe/stall.h"
#include "progress/wait.h"

// A rank whose exit notice arrived is given this long before the waits that need it fail: the normal
// race at the end of a job, where a rank that finished the last collective first announces its exit
// while a peer is still completing that same collective.
#define GRACE_SECONDS 2.0

// Does `op` need world rank `w` to complete? A stale op (its group destroyed) is assumed to need
// everyone: nothing else can be known about it.
static int op_needs(const PdOp *op, int w) {
    if (!pd_op_current(op)) {
        return 1;
    }
    int r = pd_group_from_global(op->group, w);
    if (r == MPI_UNDEFINED || r < op->survivable) {
        return 0;   // not a member (no message of this group can come from it), or one it can do without
    }
    return op->peer == PD_PEER_ALL || op->peer == MPI_ANY_SOURCE || op->peer == r;
}

// wait.c's periodic check: give up once a rank the operation needs has been gone GRACE_SECONDS.
static int departed_check(void *ctx, double wait_started) {
    const PdOp *op = ctx;
    if (pd_op_current(op)) {
        pd_stall_check(op, wait_started);   // a wait past PYDIST_STALL_WARN says whom it waits for
    }
    pd_liveness_poll();
    if (pd_liveness_departures() == 0) {
        return 0;
    }
    double now = MPI_Wtime();
    int first = -1;   // of the ranks past their grace, the one that left first (the cause, not a consequence)
    for (int w = 0; w < pd_group_size(0); w++) {
        double left = pd_liveness_left(w);
        if (left == 0.0 || now - (left > wait_started ? left : wait_started) < GRACE_SECONDS || !op_needs(op, w)) {
            continue;
        }
        if (first < 0 || left < pd_liveness_left(first)) first = w;
    }
    if (first < 0) {
        return 0;
    }
    PyErr_Format(pd_DistError, "%s cannot complete: rank %d has exited (%s) while this rank was waiting for it",
                 op->what, first, pd_liveness_cause(first));
    return -1;
}

// How many of the group's ranks below op->survivable have left.
static int survivable_departures(const PdOp *op) {
    int n = 0;
    for (int r = 0; r < op->survivable; r++) {
        n += pd_liveness_left(pd_group_to_global(op->group, r)) != 0.0;
    }
    return n;
}

typedef struct {
    const PdOp *op;
    int handled;
} DepartureWatch;

// pd_op_wait_any_or_departure's check: end the wait (1) on a new departure the caller can do without;
// the others' departures as departed_check.
static int departure_check(void *ctx, double wait_started) {
    const DepartureWatch *d = ctx;
    if (departed_check((void *)d->op, wait_started) < 0) {
        return -1;
    }
    return pd_liveness_departures() > 0 && pd_op_current(d->op) && survivable_departures(d->op) > d->handled;
}

int pd_op_wait_any_or_departure(int n, MPI_Request *reqs, int first, int *index, MPI_Status *status,
                                const PdOp *op, double since, int handled) {
    DepartureWatch d = {op, handled};
    PdWaitSpec spec = {op->what, pd_group_timeout(op->group), departure_check, &d, since};
    int known = departure_check(&d, since > 0 ? since : MPI_Wtime());
    if (known != 0) {
        *index = -1;   // already known (or a rank it needs is gone): no need to wait a slice
        return known < 0 ? -1 : 0;
    }
    return pd_wait_any(n, reqs, first, index, status, &spec);
}

int pd_group_rank_left(long handle, int r) {
    pd_liveness_poll();
    if (!pd_group_live(handle)) {
        return 0;
    }
    int w = pd_group_to_global(handle, r);
    return w != MPI_UNDEFINED && pd_liveness_left(w) != 0.0;
}

int pd_op_check(const PdOp *op, double since) {
    return departed_check((void *)op, since);
}

int pd_op_wait(MPI_Request *req, MPI_Status *status, const PdOp *op, double timeout, int timeout_breaks) {
    PdWaitSpec spec = {op->what, timeout, departed_check, (void *)op, 0.0};
    if (pd_wait(req, status, &spec) == 0) {
        return 0;
    }
    if (timeout_breaks && op->peer == PD_PEER_ALL && PyErr_ExceptionMatches(pd_DistTimeoutError) && pd_op_current(op)) {
        char why[256];
        snprintf(why, sizeof why, "%s timed out after %.1f s", op->what, timeout);
        pd_group_break(op->group, why);   // (a group already broken keeps its first reason)
    }
    return -1;
}

int pd_op_wait_any(int n, MPI_Request *reqs, int first, int *index, MPI_Status *status, const PdOp *op,
                   double since) {
    PdWaitSpec spec = {op->what, pd_group_timeout(op->group), departed_check, (void *)op, since};
    return pd_wait_any(n, reqs, first, index, status, &spec);
}

// A blocking receive that was given up must not stay posted: it would take the next message its peer
// sends, meant for a later receive. Cancel it; if the message had already arrived, the receive has
// completed after all (1: keep the result). Returns 0 when cancelled, 1 when completed, -1 when MPI
// failed (the request is then still pending).
static int cancel_receive(MPI_Request *req, MPI_Status *status) {
    MPI_Status st;
    int cancelled = 0;
    if (MPI_Cancel(req) != MPI_SUCCESS || MPI_Wait(req, &st) != MPI_SUCCESS ||
        MPI_Test_cancelled(&st, &cancelled) != MPI_SUCCESS) {
        return -1;
    }
    if (!cancelled && status != MPI_STATUS_IGNORE) {
        *status = st;
    }
    return cancelled ? 0 : 1;
}

int pd_op_wait_or_park(MPI_Request *req, MPI_Status *status, const PdOp *op, PyObject *keep, int cancellable) {
    if (pd_op_wait(req, status, op, pd_group_timeout(op->group), 1) == 0) {
        return 0;
    }
    if (cancellable && *req != MPI_REQUEST_NULL) {
        int got = cancel_receive(req, status);
        if (got == 1 && !PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
            PyErr_Clear();   // the message arrived as the wait gave up: the receive succeeded
            return 0;
        }
        if (got >= 0) {
            return -1;       // cancelled (or interrupted): nothing is left posted
        }
    }
    if (*req != MPI_REQUEST_NULL) {
        pd_park(*req, Py_XNewRef(keep), cancellable);
        *req = MPI_REQUEST_NULL;
    }
    return -1;
}