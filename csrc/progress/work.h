/*
 * work.h: Work handles (work.c): async_op=True, isend/irecv. A Work knows its operation only as a
 * PdPending, which the operation's path implements in its own file.
 */
#ifndef PYDIST_PROGRESS_WORK_H
#define PYDIST_PROGRESS_WORK_H

#include "core/dtypes.h"
#include "groups/group.h"
#include "observe/calls.h"

typedef struct PdWorkObject PdWorkObject;

typedef struct {
    // Move it along without waiting. 1: over (finished, or failed with w->error set); 0: not yet.
    // GIL held; never raises.
    int (*test)(PdWorkObject *w);
    // Wait for it (GIL held on entry and exit). 0: over (finished, or failed with w->error set); -1:
    // raised, still pending (timeout, signal, a departed rank; the session's own timeout breaks the
    // group when timeout_breaks).
    int (*wait)(PdWorkObject *w, double timeout, int timeout_breaks);
    // The Work is going before it is over (dropped, or cleared by the collector): whatever MPI or the
    // peers may still write keeps its memory (its arrays, parked or owned by the path), and the
    // operation still completes. GIL held.
    void (*abandon)(PdWorkObject *w);
} PdPending;

struct PdWorkObject {
    PyObject_HEAD
    const PdPending *pending;  // how its path moves it along; NULL once over
    void *state;           // that path's own state for it (a ring, a cache entry, a group's channel)
    MPI_Request req;       // the path's MPI request, if it has one
    MPI_Status status;
    PdOp op;               // what, group and peers, for the wait and for messages
    PyObject *keep;        // owns the memory MPI reads/writes (a tuple of arrays); NULL when done
    PyObject *result;      // what result() returns (list of arrays)
    int is_recv;           // a point-to-point receive: has a source rank, and may be cancelled
    int waiting;           // a thread is in wait() on this operation: nobody else may touch it
    int avg_divisor;       // >0: divide the result by this after completion (AVG)
    const PdDtype *avg_dtype;
    void *avg_buf;
    MPI_Count avg_count;
    PyObject *error;       // exception raised by a failed completion, re-raised by later wait()s
    PdCall call;           // the call that made it, for the timeline (call.t0 == 0: not recorded)
    long long call_bytes;
    const char *call_path;
};

extern PyTypeObject *pd_WorkType;
int pd_work_type_init(PyObject *module);
// A new Work for a pending operation of `pending`'s path (NULL: over already) that keeps `keep` alive
// and returns `result` from result() (new references taken; result NULL: an empty list). NULL with an
// exception; the caller still owns its operation then.
PdWorkObject *pd_work_make(const PdPending *pending, void *state, const PdOp *op, PyObject *keep, PyObject *result);
// The operation is over: let go of the arrays (and finish AVG) / record the exception set as its error.
void pd_work_finish(PdWorkObject *w);
void pd_work_fail(PdWorkObject *w);
// Work.wait() under the session's timeout, from C: 0, or -1 raised (its error, a timeout, a signal).
int pd_work_wait(PdWorkObject *w);
// A dropped Work's caller never learned whether it completed: say so (ResourceWarning). GIL held.
void pd_work_warn_dropped(PdWorkObject *w);

#endif  // PYDIST_PROGRESS_WORK_H
