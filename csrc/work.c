/*
 * work.c: how we wait for MPI, and the Work handle that async_op=True and isend/irecv return.
 *
 * Why our own wait: MPICH's blocking calls busy-poll and never yield, so with more ranks than cores a
 * small all-reduce costs a whole scheduler slice (about 5 ms at 4 ranks on 2 cores). Every blocking
 * call is therefore a nonblocking call plus pd_wait: MPI_Test in a loop, spinning briefly and then
 * calling sched_yield() between tests, with the GIL released. Every few milliseconds the loop takes
 * the GIL back to run Python's signal handlers (Ctrl-C) and to check the deadline (timeout=), as the
 * lock wait in CPython's Python/thread.c does. PYDIST_WAIT=mpi (or _C.set_wait_mode(1)) switches to
 * a plain MPI_Wait for benchmarks.
 *
 * A wait that is interrupted leaves its request pending, and MPI may still write into the array.
 * The request and a reference to the array are then parked until MPI is done with them, so the
 * memory can never be freed under MPI. A Work dropped before completion is parked the same way,
 * with a ResourceWarning (torch's MPI backend calls std::terminate there).
 */
#include "pydist.h"

#include <sched.h>

int pd_wait_mode = PD_WAIT_POLL;
double pd_default_timeout = -1.0;

// Tests before the loop starts yielding: enough to catch a reply that is microseconds away without
// a syscall, short enough that an oversubscribed peer gets the core back quickly.
#define SPIN_TESTS 64
// How long the GIL stays released between signal and deadline checks.
#define SLICE_SECONDS 0.002

// ---------------------------------------------------------------------------------------------------
// The wait

int pd_wait(MPI_Request *req, MPI_Status *status, double timeout, const char *what) {
    int done = 0, rc;
    rc = MPI_Test(req, &done, status);
    if (rc != MPI_SUCCESS) {
        return pd_raise_mpi_int(rc, what);
    }
    if (done) {
        return 0;
    }
    if (pd_wait_mode == PD_WAIT_MPI && timeout < 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = MPI_Wait(req, status);
        Py_END_ALLOW_THREADS
        return rc == MPI_SUCCESS ? 0 : pd_raise_mpi_int(rc, what);
    }
    double start = MPI_Wtime();
    for (;;) {
        Py_BEGIN_ALLOW_THREADS
        double slice_end = MPI_Wtime() + SLICE_SECONDS;
        for (long tests = 1; !done; tests++) {
            rc = MPI_Test(req, &done, status);
            if (rc != MPI_SUCCESS) {
                break;
            }
            if (tests > SPIN_TESTS) {
                sched_yield();
            }
            if ((tests & 31) == 0 && MPI_Wtime() > slice_end) {
                break;
            }
        }
        Py_END_ALLOW_THREADS
        if (rc != MPI_SUCCESS) {
            return pd_raise_mpi_int(rc, what);
        }
        if (done) {
            return 0;
        }
        if (PyErr_CheckSignals() < 0 || pd_liveness_check(start, what) < 0) {
            return -1;
        }
        double waited = MPI_Wtime() - start;
        if (timeout >= 0 && waited >= timeout) {
            // PyErr_Format has no float conversions: format the message first
            char msg[300];
            PyOS_snprintf(msg, sizeof msg, "%s timed out after %.3f s (timeout %.3f s): another rank may "
                          "not have called it", what, waited, timeout);
            PyErr_SetString(pd_DistTimeoutError, msg);
            return -1;
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Parked requests: pending MPI operations whose owner went away (interrupted wait, dropped Work).

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
// stay parked.
int pd_parked_drain(void) {
    int left = 0;
    Parked **link = &parked;
    while (*link != NULL) {
        Parked *p = *link;
        int done = 0;
        MPI_Test(&p->req, &done, MPI_STATUS_IGNORE);
        if (!done && p->cancellable) {
            MPI_Cancel(&p->req);
            MPI_Wait(&p->req, MPI_STATUS_IGNORE);
            done = 1;
        }
        if (done) {
            *link = p->next;
            Py_XDECREF(p->keep);
            PyMem_RawFree(p);
        } else {
            link = &p->next;
            left++;
        }
    }
    return left;
}

int pd_wait_or_park(MPI_Request *req, MPI_Status *status, const char *what, PyObject *keep,
                    int cancellable, long group) {
    if (pd_wait(req, status, pd_default_timeout, what) == 0) {
        return 0;
    }
    if (PyErr_ExceptionMatches(pd_DistTimeoutError)) {
        char why[200];
        snprintf(why, sizeof why, "%s timed out after %.1f s", what, pd_default_timeout);
        pd_group_mark_broken(group, why);
    }
    if (*req != MPI_REQUEST_NULL) {
        Py_XINCREF(keep);
        pd_park(*req, keep, cancellable);
        *req = MPI_REQUEST_NULL;
    }
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
// The Work type

PyTypeObject *pd_WorkType = NULL;

PdWorkObject *pd_work_new(MPI_Request req, const char *what, PyObject *keep, PyObject *result) {
    PdWorkObject *w = PyObject_New(PdWorkObject, pd_WorkType);
    if (w == NULL) {
        return NULL;
    }
    w->req = req;
    memset(&w->status, 0, sizeof w->status);
    w->what = what;
    Py_XINCREF(keep);
    w->keep = keep;
    w->result = result ? result : PyList_New(0);
    if (result) {
        Py_INCREF(result);
    }
    w->cancellable = 0;
    w->is_recv = 0;
    w->group = 0;
    w->avg_divisor = 0;
    w->avg_dtype = NULL;
    w->avg_buf = NULL;
    w->avg_count = 0;
    w->error = NULL;
    if (w->result == NULL) {
        Py_DECREF(w);
        return NULL;
    }
    return w;
}

// The request has completed: finish AVG and let go of the arrays.
static void work_complete(PdWorkObject *w) {
    if (w->avg_divisor > 0) {
        pd_divide_inplace(w->avg_buf, w->avg_count, w->avg_dtype, w->avg_divisor);
        w->avg_divisor = 0;
    }
    Py_CLEAR(w->keep);
}

// Record a completion error so that every later wait() raises it again.
static void work_fail(PdWorkObject *w) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    Py_XSETREF(w->error, value ? value : Py_NewRef(Py_None));
    PyErr_Restore(type, value ? Py_NewRef(value) : NULL, tb);
    Py_CLEAR(w->keep);
}

static PyObject *work_wait(PdWorkObject *w, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *what_default = "wait";
    double timeout = pd_default_timeout;
    PyObject *t = NULL;
    if (nargs > 1 || (kwnames && PyTuple_GET_SIZE(kwnames) + nargs > 1)) {
        PyErr_SetString(PyExc_TypeError, "wait() takes at most one argument (timeout)");
        return NULL;
    }
    if (nargs == 1) {
        t = args[0];
    } else if (kwnames && PyTuple_GET_SIZE(kwnames) == 1) {
        if (!PyUnicode_Check(PyTuple_GET_ITEM(kwnames, 0)) ||
            PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "timeout") != 0) {
            PyErr_Format(PyExc_TypeError, "wait() got an unexpected keyword argument %R",
                         PyTuple_GET_ITEM(kwnames, 0));
            return NULL;
        }
        t = args[0];
    }
    if (t != NULL && t != Py_None) {
        // a float of seconds or a datetime.timedelta, as torch accepts
        PyObject *secs = PyObject_HasAttrString(t, "total_seconds")
                             ? PyObject_CallMethod(t, "total_seconds", NULL)
                             : Py_NewRef(t);
        if (secs == NULL) {
            return NULL;
        }
        timeout = PyFloat_AsDouble(secs);
        Py_DECREF(secs);
        if (timeout == -1.0 && PyErr_Occurred()) {
            PyErr_Format(PyExc_TypeError, "wait(): `timeout` must be seconds or a datetime.timedelta; got %.100s",
                         Py_TYPE(t)->tp_name);
            return NULL;
        }
        if (timeout < 0) {
            PyErr_Format(PyExc_ValueError, "wait(): `timeout` must be >= 0; got %R", t);
            return NULL;
        }
    }
    if (w->error != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(w->error), w->error);
        return NULL;
    }
    if (w->req != MPI_REQUEST_NULL) {
        int rc = pd_wait(&w->req, &w->status, timeout, w->what ? w->what : what_default);
        if (rc < 0 && t == NULL && PyErr_ExceptionMatches(pd_DistTimeoutError)) {
            // the group's own timeout ran out (not a caller's short poll): the group is unusable
            char why[200];
            snprintf(why, sizeof why, "%s timed out after %.1f s", w->what, timeout);
            pd_group_mark_broken(w->group, why);
        }
        if (rc < 0) {
            // a timeout or a signal leaves the request pending and this Work still usable
            if (w->req == MPI_REQUEST_NULL) {
                work_fail(w);
            }
            return NULL;
        }
    }
    work_complete(w);
    Py_RETURN_TRUE;
}

static PyObject *work_is_completed(PdWorkObject *w, PyObject *unused) {
    (void)unused;
    if (w->req != MPI_REQUEST_NULL) {
        int done = 0;
        int rc = MPI_Test(&w->req, &done, &w->status);
        if (rc != MPI_SUCCESS) {
            pd_raise_mpi(rc, w->what);
            work_fail(w);
            PyErr_Clear();  // reported by wait() / exception()
            Py_RETURN_TRUE;
        }
        if (!done) {
            Py_RETURN_FALSE;
        }
    }
    work_complete(w);
    Py_RETURN_TRUE;
}

static PyObject *work_is_success(PdWorkObject *w, PyObject *unused) {
    (void)unused;
    return PyBool_FromLong(w->req == MPI_REQUEST_NULL && w->error == NULL);
}

static PyObject *work_exception(PdWorkObject *w, PyObject *unused) {
    (void)unused;
    return Py_NewRef(w->error ? w->error : Py_None);
}

static PyObject *work_result(PdWorkObject *w, PyObject *unused) {
    (void)unused;
    return Py_NewRef(w->result);
}

// The sender's global rank, for a completed irecv (torch: Work._source_rank / source_rank).
static PyObject *work_source_rank(PdWorkObject *w, PyObject *unused) {
    (void)unused;
    if (!w->is_recv) {
        PyErr_SetString(PyExc_ValueError, "source_rank(): only a receive's Work has a source rank");
        return NULL;
    }
    if (w->req != MPI_REQUEST_NULL || w->error != NULL) {
        PyErr_SetString(PyExc_ValueError, "source_rank(): the receive has not completed; call wait() first");
        return NULL;
    }
    return PyLong_FromLong(pd_group_to_global(w->group, w->status.MPI_SOURCE));
}

static void work_dealloc(PdWorkObject *w) {
    if (w->req != MPI_REQUEST_NULL) {
        int done = 0;
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) {
            MPI_Test(&w->req, &done, MPI_STATUS_IGNORE);
        }
        if (!done && !fin) {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            if (PyErr_WarnFormat(PyExc_ResourceWarning, 1, "a Work for %s was dropped before it completed; "
                                 "its arrays are kept alive until MPI is done with them (call wait())",
                                 w->what) < 0) {
                PyErr_WriteUnraisable((PyObject *)w);
            }
            PyErr_Restore(type, value, tb);
            pd_park(w->req, w->keep, w->cancellable);  // steals keep
            w->keep = NULL;
        }
        w->req = MPI_REQUEST_NULL;
    }
    Py_XDECREF(w->keep);
    Py_XDECREF(w->result);
    Py_XDECREF(w->error);
    PyTypeObject *tp = Py_TYPE(w);
    PyObject_Free(w);
    Py_DECREF(tp);
}

static PyObject *work_repr(PdWorkObject *w) {
    return PyUnicode_FromFormat("<pydist.Work %s %s>", w->what,
                                w->req == MPI_REQUEST_NULL ? (w->error ? "failed" : "completed") : "pending");
}

static PyMethodDef work_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))work_wait, METH_FASTCALL | METH_KEYWORDS,
     "wait(timeout=None) -> True\n\nBlock until the operation completes; raises DistError on failure and "
     "DistTimeoutError after `timeout` seconds (the operation then stays pending)."},
    {"is_completed", (PyCFunction)work_is_completed, METH_NOARGS, "True once the operation has completed."},
    {"is_success", (PyCFunction)work_is_success, METH_NOARGS, "True if it completed without an error."},
    {"exception", (PyCFunction)work_exception, METH_NOARGS, "The error it failed with, or None."},
    {"result", (PyCFunction)work_result, METH_NOARGS, "The arrays of the operation, as a list."},
    {"source_rank", (PyCFunction)work_source_rank, METH_NOARGS, "A completed receive's sender (global rank)."},
    {"_source_rank", (PyCFunction)work_source_rank, METH_NOARGS, "Alias of source_rank(), as in torch."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot work_slots[] = {
    {Py_tp_dealloc, work_dealloc},
    {Py_tp_repr, work_repr},
    {Py_tp_methods, work_methods},
    {Py_tp_doc, "Handle of an asynchronous operation (async_op=True, isend, irecv)."},
    {0, NULL},
};

static PyType_Spec work_spec = {
    .name = "pydist._C.Work",
    .basicsize = sizeof(PdWorkObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = work_slots,
};

int pd_work_type_init(PyObject *module) {
    pd_WorkType = (PyTypeObject *)PyType_FromModuleAndSpec(module, &work_spec, NULL);
    if (pd_WorkType == NULL) {
        return -1;
    }
    return PyModule_AddObjectRef(module, "Work", (PyObject *)pd_WorkType);
}
