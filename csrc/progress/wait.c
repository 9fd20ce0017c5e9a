/*
 * wait.c: how pydist waits for an MPI request. It knows about deadlines, signals and one periodic
 * check supplied by the caller; it knows nothing of groups, ranks or Work objects.
 *
 * Why our own wait: MPICH's blocking calls busy-poll and never yield, so with more ranks than cores a
 * small all-reduce costs a whole scheduler slice (about 5 ms at 4 ranks on 2 cores). Every blocking
 * call is therefore a nonblocking call plus pd_wait: MPI_Test in a loop, spinning briefly and then
 * calling sched_yield() between tests, with the GIL released. When the node's ranks fit its cores
 * (pd_wait_spin) nobody of ours is waiting for the core, and the loop spins its first 200 us without
 * yielding, as MPI's blocking calls do: each sched_yield is a system call that the test after it
 * waits behind (benchmarks/wait_probe.c, 2 ranks on 2 cores: an Ibcast of 64 KiB 3.6 us with tests
 * alone, 4.5 us yielding after 64 tests). Every few milliseconds the loop takes the GIL back to run Python's signal
 * handlers (Ctrl-C), to run the caller's check (progress/op.c uses it to notice ranks that have exited) and
 * to check the deadline (timeout=), as the lock wait in CPython's Python/thread.c does.
 * PYDIST_WAIT=mpi (or _C.set_wait_mode(1)) switches to a plain MPI_Wait for benchmarks. pd_wait_any is
 * the same loop over several requests, testing them in turn from a given one (the asynchronous
 * parameter servers wait so for whichever worker speaks first).
 *
 * When MPI gives less than MPI_THREAD_MULTIPLE (pd_wait_serialized), no two threads may be inside MPI
 * at once. Every other MPI call of ours runs with the GIL held, so the loop then tests with the GIL
 * held too and releases it only to yield: the GIL is the lock that serialises our MPI calls.
 *
 * The loop also runs the progress engine (progress.c, GIL held) when it starts and after every slice:
 * what the paths have in flight that only we can move (a ring's next step, a small collective whose
 * peers have posted) moves along in every wait.
 *
 * A wait that is given up (signal, timeout, check) leaves its request pending, and MPI may still
 * write into the caller's memory. Such requests are parked with a reference to their owners until MPI
 * is done with them, so that memory can never be freed under MPI.
 */
#include "progress/wait.h"

#include "core/errors.h"
#include "groups/child.h"
#include "progress/progress.h"

#include <sched.h>

int pd_wait_mode = PD_WAIT_POLL;
int pd_wait_serialized = 0;
int pd_wait_spin = 0;

// Tests before the loop starts yielding: enough to catch a reply that is microseconds away without
// a syscall, short enough that an oversubscribed peer gets the core back quickly.
#define SPIN_TESTS 64
// When the node's ranks fit its cores (pd_wait_spin): how long a slice tests without yielding.
#define SPIN_SECONDS 0.0002
// How long the GIL stays released between signal, check and deadline checks.
#define SLICE_SECONDS 0.002

// ---------------------------------------------------------------------------------------------------
// The wait

// Test reqs[first], reqs[first + 1], ... (wrapping) once each; the first complete one sets *index. Null
// requests are skipped (a wait on one request never passes a null one).
static int test_round(int n, MPI_Request *reqs, int first, int *index, MPI_Status *status, int *done) {
    for (int k = 0; k < n; k++) {
        int i = first + k < n ? first + k : first + k - n;
        if (reqs[i] == MPI_REQUEST_NULL) {
            continue;
        }
        int rc = MPI_Test(&reqs[i], done, status);
        if (rc != MPI_SUCCESS || *done) {
            *index = i;
            return rc;
        }
    }
    return MPI_SUCCESS;
}

// One slice of tests, with the GIL released (or, serialized, released only around each yield).
static int test_for_a_slice(int n, MPI_Request *reqs, int first, int *index, MPI_Status *status, int *done) {
    int rc = MPI_SUCCESS;
    double slice_end = MPI_Wtime() + SLICE_SECONDS;
    if (pd_wait_serialized) {
        for (long tests = 1; !*done; tests++) {
            rc = test_round(n, reqs, first, index, status, done);
            if (rc != MPI_SUCCESS || *done || ((tests & 31) == 0 && MPI_Wtime() > slice_end)) {
                break;
            }
            if (tests > SPIN_TESTS) {
                Py_BEGIN_ALLOW_THREADS
                sched_yield();
                Py_END_ALLOW_THREADS
            }
        }
        return rc;
    }
    // Spinning ends SPIN_SECONDS into the slice: a collective that is microseconds away gets no system
    // call in its way, and a thread that waits long (the torch backend's worker, during a backward
    // pass) still hands the core to the rank's own computing thread.
    int spinning = pd_wait_spin;
    double spin_end = slice_end - (SLICE_SECONDS - SPIN_SECONDS);
    Py_BEGIN_ALLOW_THREADS
    for (long tests = 1; !*done; tests++) {
        rc = test_round(n, reqs, first, index, status, done);
        if (rc != MPI_SUCCESS) {
            break;
        }
        if (tests > SPIN_TESTS && !spinning) {
            sched_yield();
        }
        if ((tests & 31) == 0) {
            double now = MPI_Wtime();
            spinning = spinning && now < spin_end;
            if (now > slice_end) break;
        }
    }
    Py_END_ALLOW_THREADS
    return rc;
}

void pd_wait_set_cores(int node_ranks) {
    cpu_set_t cpus;
    int cores = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 0;
    // Ranks bound one to a core see one core each and keep yielding: the safe side of not knowing.
    pd_wait_spin = node_ranks > 0 && cores > 0 && node_ranks <= cores;
}

int pd_wait(MPI_Request *req, MPI_Status *status, const PdWaitSpec *spec) {
    int index;
    return pd_wait_any(1, req, 0, &index, status, spec);
}

int pd_wait_any(int n, MPI_Request *reqs, int first, int *index, MPI_Status *status, const PdWaitSpec *spec) {
    int done = 0, rc;
    *index = -1;
    if (pd_mpi_inherited) {
        return pd_child_refuse(spec->what);   // a Work the child inherited: its request is the parent's
    }
    pd_progress_all();   // once per wait, however short, and then once per slice
    int live = 0;
    for (int i = 0; i < n; i++) live += reqs[i] != MPI_REQUEST_NULL;
    if (n == 1 && live == 0) {
        live = 1;         // a single null request completes at once, as MPI_Wait says
    }
    if (live == 0) {
        return 0;         // nothing to wait for: *index stays -1, as MPI_Waitany's MPI_UNDEFINED
    }
    rc = n == 1 ? MPI_Test(reqs, &done, status) : test_round(n, reqs, first, index, status, &done);
    if (rc != MPI_SUCCESS) {
        return pd_raise_mpi_int(rc, spec->what);
    }
    if (done) {
        *index = n == 1 ? 0 : *index;
        return 0;
    }
    if (n == 1 && pd_wait_mode == PD_WAIT_MPI && spec->timeout < 0 && !pd_wait_serialized) {
        Py_BEGIN_ALLOW_THREADS
        rc = MPI_Wait(reqs, status);
        Py_END_ALLOW_THREADS
        *index = 0;
        return rc == MPI_SUCCESS ? 0 : pd_raise_mpi_int(rc, spec->what);
    }
    double start = MPI_Wtime();
    for (;;) {
        rc = test_for_a_slice(n, reqs, first, index, status, &done);
        if (rc != MPI_SUCCESS) {
            return pd_raise_mpi_int(rc, spec->what);
        }
        if (done) {
            return 0;
        }
        pd_progress_all();   // never raises: what it moves along records its own errors
        if (PyErr_CheckSignals() < 0) {
            return -1;
        }
        int checked = spec->check != NULL ? spec->check(spec->check_ctx, spec->check_since > 0 ? spec->check_since : start) : 0;
        if (checked != 0) {
            *index = -1;
            return checked < 0 ? -1 : 0;
        }
        double waited = MPI_Wtime() - start;
        if (spec->timeout >= 0 && waited >= spec->timeout) {
            return pd_raise_timeout(spec->what, waited, spec->timeout, "another rank may not have called it");
        }
    }
}

// Another thread is finishing what we need (busy(ctx) true meanwhile): yield until it has, checking
// signals and our own deadline. 0, or -1 with the error set.
int pd_yield_while(int (*busy)(const void *), const void *ctx, double timeout, const char *what, const char *why) {
    double start = MPI_Wtime();
    while (busy(ctx)) {
        Py_BEGIN_ALLOW_THREADS
        sched_yield();
        Py_END_ALLOW_THREADS
        if (PyErr_CheckSignals() < 0) {
            return -1;
        }
        double waited = MPI_Wtime() - start;
        if (timeout >= 0 && waited >= timeout && busy(ctx)) {
            return pd_raise_timeout(what, waited, timeout, why);
        }
    }
    return 0;
}

int pd_raise_timeout(const char *what, double waited, double timeout, const char *why) {
    // PyErr_Format has no float conversions: format the message first
    char msg[400];
    PyOS_snprintf(msg, sizeof msg, "%s timed out after %.3f s, past its timeout of %.3f s: %s", what, waited, timeout,
                  why);
    PyErr_SetString(pd_DistTimeoutError, msg);
    return -1;
}

PyObject *pd_set_wait_mode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long mode;
    if (pd_check_nargs(nargs, 1, "set_wait_mode") < 0 || pd_arg_long(args[0], "set_wait_mode", "mode", &mode) < 0) {
        return NULL;
    }
    if (mode != PD_WAIT_POLL && mode != PD_WAIT_MPI) {
        PyErr_Format(PyExc_ValueError, "set_wait_mode(): `mode` must be 0 (poll) or 1 (MPI_Wait); got %ld", mode);
        return NULL;
    }
    long old = pd_wait_mode;
    pd_wait_mode = (int)mode;
    return PyLong_FromLong(old);
}

// ---------------------------------------------------------------------------------------------------
// Parked requests: pending MPI operations whose owner went away (a wait given up, a dropped Work).
// The list is only touched with the GIL held.

typedef struct Parked {
    MPI_Request req;
    PyObject *keep;
    int cancellable;
    struct Parked *next;
} Parked;

static Parked *parked = NULL;

void pd_park(MPI_Request req, PyObject *keep, int cancellable) {
    Parked *p = PyMem_RawMalloc(sizeof *p);
    if (p == NULL) {
        // Out of memory: the only safe thing left is to keep the memory alive forever.
        return;
    }
    p->req = req;
    p->keep = keep;
    p->cancellable = cancellable;
    p->next = parked;
    parked = p;
}

// Complete what can be completed; cancel pending receives; anything else (a collective that a peer
// never joined) stays parked with its memory alive, since MPI may still own it. Returns how many
// stay parked. An error from MPI here means the request is unusable; it is dropped from the list,
// but its memory is kept alive (leaked on purpose) since nothing says MPI is done with it.
int pd_parked_drain(void) {
    int left = 0;
    Parked **link = &parked;
    while (*link != NULL) {
        Parked *p = *link;
        int done = 0, failed = 0;
        if (MPI_Test(&p->req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
            failed = 1;
        } else if (!done && p->cancellable) {
            // a receive nobody will ever match: cancelling it completes it at once
            failed = MPI_Cancel(&p->req) != MPI_SUCCESS || MPI_Wait(&p->req, MPI_STATUS_IGNORE) != MPI_SUCCESS;
            done = !failed;
        }
        if (done || failed) {
            *link = p->next;
            if (done) {
                Py_XDECREF(p->keep);
            }
            PyMem_RawFree(p);
        } else {
            link = &p->next;
            left++;
        }
    }
    return left;
}

// _C.parked() -> number of parked requests (for tests)
PyObject *pd_parked_count(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    long n = 0;
    for (Parked *p = parked; p != NULL; p = p->next) {
        n++;
    }
    return PyLong_FromLong(n);
}
