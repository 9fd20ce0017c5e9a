/*
 * comm_glue.c: the Comm callbacks of comm_glue.h, shared by the engine's strategies (engine_py.c) and
 * the compressors' Python type (compress_py.c).
 */
#include "strategies/comm_glue.h"

#include "core/errors.h"
#include "groups/group.h"
#include "paths/shared_memory.h"
#include "progress/op.h"
#include "progress/wait.h"

static void sync_lock(void *ctx) {
    PdSyncContext *s = ctx;
    PyEval_RestoreThread(s->released);
}

static void sync_unlock(void *ctx) {
    PdSyncContext *s = ctx;
    s->released = PyEval_SaveThread();
}

// Wait the way every pydist call waits; a request given up is parked with the owner, whose buffers it
// reads or writes. GIL held.
static int sync_wait(MPI_Request *req, void *ctx) {
    PdSyncContext *s = ctx;
    PdOp op = pd_op("the training step's communication", s->group, PD_PEER_ALL);
    op.survivable = s->survivable;
    return pd_op_wait_or_park(req, MPI_STATUS_IGNORE, &op, s->owner, 0);
}

static int sync_waitany(int n, MPI_Request *reqs, int first, int *index, MPI_Status *status, double since,
                        void *ctx) {
    PdSyncContext *s = ctx;
    PdOp op = pd_op("the training step's communication", s->group, PD_PEER_ALL);
    op.survivable = s->survivable;
    return pd_op_wait_any(n, reqs, first, index, status, &op, since);
}

static int sync_waitany_or_departure(int n, MPI_Request *reqs, int first, int *index, MPI_Status *status,
                                     double since, int handled, void *ctx) {
    PdSyncContext *s = ctx;
    PdOp op = pd_op("the training step's communication", s->group, PD_PEER_ALL);
    op.survivable = s->survivable;
    return pd_op_wait_any_or_departure(n, reqs, first, index, status, &op, since, handled);
}

static int sync_left(int rank, void *ctx) {
    PdSyncContext *s = ctx;
    return pd_group_rank_left(s->group, rank);
}

// The shared-memory all-reduce of the gradients (1 done, 0 MPI's instead, -1 failed). GIL held.
static int sync_shm_allreduce(float *buf, long n, void *ctx) {
    PdSyncContext *s = ctx;
    return pd_shm_allreduce_floats(s->group, buf, n);
}

static void sync_park(MPI_Request *req, void *ctx) {
    PdSyncContext *s = ctx;
    pd_park(*req, Py_NewRef(s->owner), 0);
    *req = MPI_REQUEST_NULL;
}

Comm pd_comm_for(MPI_Comm comm, int rank, int size) {
    Comm c = {comm, rank, size, sync_wait, sync_lock, sync_unlock, sync_park, NULL, {0, 0}, 0.0, MPI_SUCCESS, NULL,
              sync_waitany, sync_shm_allreduce, sync_waitany_or_departure, sync_left};
    return c;
}
