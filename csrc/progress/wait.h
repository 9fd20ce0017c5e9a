/*
 * wait.h: the interruptible wait every blocking call goes through, and the parked requests
 * (wait.c): a deadline, signals and one periodic check; nothing about groups or Work.
 */
#ifndef PYDIST_PROGRESS_WAIT_H
#define PYDIST_PROGRESS_WAIT_H

#include "core/base.h"

// How blocking calls wait: PD_WAIT_POLL (MPI_Test + sched_yield, interruptible, the default) or
// PD_WAIT_MPI (plain MPI_Wait with the GIL released, for benchmarks).
enum { PD_WAIT_POLL = 0, PD_WAIT_MPI = 1 };
extern int pd_wait_mode;
// MPI gave MPI_THREAD_SERIALIZED, not MULTIPLE: the wait loop keeps the GIL while it calls MPI, so
// the GIL serialises every MPI call of ours (set by the session at init).
extern int pd_wait_serialized;
// The node's ranks fit its cores (pd_wait_set_cores at init): the wait loop's first 200 us of a slice
// test without yielding, as MPI's blocking calls do, since no rank of ours needs the core.
extern int pd_wait_spin;
// Decide pd_wait_spin from the node's rank count (0: unknown, which keeps yielding).
void pd_wait_set_cores(int node_ranks);

typedef struct {
    const char *what;      // operation name, for messages
    double timeout;        // seconds; < 0: forever
    // Called with the GIL held every slice (about 2 ms) with the wait's start time (MPI_Wtime);
    // returns -1 with an exception set to give the wait up, 1 to end it without an error (nothing
    // completed: *index -1), 0 to go on. NULL: none.
    int (*check)(void *ctx, double wait_started);
    void *check_ctx;
    double check_since;    // > 0: the check's start instead of the wait's (a loop of many short waits)
} PdWaitSpec;

// Wait for `req` with the GIL held on entry and exit; released while waiting. Returns 0 when complete,
// otherwise raises (KeyboardInterrupt or another signal's exception, DistTimeoutError, the check's
// error, DistBackendError) and returns -1 with the request still pending.
int pd_wait(MPI_Request *req, MPI_Status *status, const PdWaitSpec *spec);
// The same for whichever of reqs[0..n) completes first, testing from reqs[first] round the array (so a
// caller that moves `first` past the last one served is fair to all); null requests are skipped.
// *index: the one that completed (-1 when every request is null: returns 0 at once).
int pd_wait_any(int n, MPI_Request *reqs, int first, int *index, MPI_Status *status, const PdWaitSpec *spec);

// Raise DistTimeoutError "<what> timed out after <waited> s, past its timeout of <timeout> s: <why>"; returns -1.
int pd_raise_timeout(const char *what, double waited, double timeout, const char *why);
// Yield (GIL released) while busy(ctx): another thread is finishing what we need. Checks signals and
// `timeout` (raising DistTimeoutError "<what> timed out ...: <why>"). 0, or -1 with the error set.
int pd_yield_while(int (*busy)(const void *), const void *ctx, double timeout, const char *what, const char *why);

// Move a pending request and a reference to its owners onto the parked list (steals `keep`), so MPI
// never writes into freed memory. GIL held.
void pd_park(MPI_Request req, PyObject *keep, int cancellable);
// Complete or cancel what was parked (called before MPI_Finalize / at destroy). Returns how many stay.
int pd_parked_drain(void);

PyObject *pd_set_wait_mode(PyObject *self, PyObject *const *args, Py_ssize_t nargs); 
PyObject *pd_parked_count(PyObject *self, PyObject *unused);

#endif  // PYDIST_PROGRESS_WAIT_H
