/*
 * op.h: waiting for an operation on a group (op.c): wait.c's loop with the session's timeout, ended
 * early when a rank the operation needs has exited.
 */
#ifndef PYDIST_PROGRESS_OP_H
#define PYDIST_PROGRESS_OP_H

#include "groups/group.h"

// Wait for an operation: wait.c's loop, ended early when a rank the operation needs has exited.
// A collective's timeout breaks its group when timeout_breaks (the session's own timeout, not a
// caller's short poll); a point-to-point timeout never does.
int pd_op_wait(MPI_Request *req, MPI_Status *status, const PdOp *op, double timeout, int timeout_breaks);
// A blocking call's wait, with the session's timeout: if it fails, the request is parked with `keep`
// (the objects owning its memory; a new reference is taken). GIL held.
int pd_op_wait_or_park(MPI_Request *req, MPI_Status *status, const PdOp *op, PyObject *keep, int cancellable);
// pd_wait_any with the session's timeout and the departed-rank check, which counts a departure's
// grace from `since` (MPI_Wtime; 0: this wait's start); nothing is parked (the caller owns the
// requests and parks what it gives up).
int pd_op_wait_any(int n, MPI_Request *reqs, int first, int *index, MPI_Status *status, const PdOp *op,
                   double since);
// The same, but ended (returning 0 with *index = -1, nothing raised) as soon as more than `handled` of
// the group's ranks below op->survivable have left: the caller (an asynchronous server) carries on
// without them. Departures of the other ranks end it with DistError, as pd_op_wait_any's do.
int pd_op_wait_any_or_departure(int n, MPI_Request *reqs, int first, int *index, MPI_Status *status,
                                const PdOp *op, double since, int handled);
// Has group rank `r` of `handle` left (its exit notice, or its watcher's record under pydist.run)?
int pd_group_rank_left(long handle, int r);

// The departed-rank check of pd_op_wait, for waits that are not MPI requests (shared_memory.c):
// 0, or -1 with DistError set when a rank `op` needs has been gone past its grace since `since`.
int pd_op_check(const PdOp *op, double since);

#endif  // PYDIST_PROGRESS_OP_H
