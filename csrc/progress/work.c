/*
 * work.c: the Work handle that async_op=True and isend/irecv return. It knows its operation only as a
 * PdPending (work.h): the operation's path (request.c, ring_path.c, shared_memory.c, persistent.c)
 * implements how it is tested, waited for and abandoned, in its own file.
 *
 * A Work owns the arrays of its operation (`keep`) until it is over, so MPI never writes into freed
 * memory. A Work dropped before completion hands its operation back to the path (abandon: parked with
 * its arrays, or kept by the path until it completes) and warns (ResourceWarning); torch's MPI backend
 * calls std::terminate there.
 *
 * A Work takes part in garbage collection: a failed operation keeps its exception, whose traceback
 * holds the frame that holds the Work, a cycle only the collector can free. tp_clear never drops the
 * arrays of a pending operation: it abandons it instead.
 *
 * One thread at a time waits on an operation (`waiting`): a second thread's wait() polls until the
 * first is done, and is_completed() answers False meanwhile rather than test what another thread is
 * testing without the GIL.
 */
#include "progress/work.h"

#include "core/errors.h"
#include "groups/child.h"
#include "progress/progress.h"
#include "progress/wait.h"


PyTypeObject *pd_WorkType = NULL;

PdWorkObject *pd_work_make(const PdPending *pending, void *state, const PdOp *op, PyObject *keep, PyObject *result) {
    PyObject *list = result ? Py_NewRef(result) : PyList_New(0);
    if (list == NULL) {
        return NULL;
    }
    PdWorkObject *w = PyObject_GC_New(PdWorkObject, pd_WorkType);
    if (w == NULL) {
        Py_DECREF(list);
        return NULL;
    }
    w->pending = pending;
    w->state = state;
    w->req = MPI_REQUEST_NULL;
    memset(&w->status, 0, sizeof w->status);
    w->op = *op;
    w->keep = Py_XNewRef(keep);
    w->result = list;
    w->is_recv = 0;
    w->waiting = 0;
    w->avg_divisor = 0;
    w->avg_dtype = NULL;
    w->avg_buf = NULL;
    w->avg_count = 0;
    w->error = NULL;
    memset(&w->call, 0, sizeof w->call);
    w->call_bytes = 0;
    w->call_path = NULL;
    PyObject_GC_Track(w);
    return w;
}

// An async_op=True call's span, from its start to the moment pydist saw it complete (timeline.h).
static void record_span(PdWorkObject *w, int failed) {
    if (w->call.t0 == 0) {
        return;
    }
    const PdCall *c = &w->call;
    pd_tl_async(c->t0, pd_tl_clock(), "comm", c->name, 6, PD_TL_INT("group", c->gid), PD_TL_INT("seq", c->seq),
                PD_TL_INT("bytes", w->call_bytes), PD_TL_STR("path", w->call_path ? w->call_path : "MPI"),
                PD_TL_INT("peer", c->peer), PD_TL_INT("failed", failed));
    w->call.t0 = 0;
}

// The operation is over: finish AVG and let go of the arrays.
void pd_work_finish(PdWorkObject *w) {
    record_span(w, 0);
    if (w->avg_divisor > 0) {
        pd_divide_inplace(w->avg_buf, w->avg_count, w->avg_dtype, w->avg_divisor);
        w->avg_divisor = 0;
    }
    Py_CLEAR(w->keep);
}

// Record a completion error so that every later wait() raises it again. MPI has released the
// request, so the arrays are free to go.
void pd_work_fail(PdWorkObject *w) {
    record_span(w, 1);
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    Py_XSETREF(w->error, value ? Py_NewRef(value) : Py_NewRef(Py_None));
    PyErr_Restore(type, value, tb);
    Py_CLEAR(w->keep);
}

// Seconds from wait()'s argument: None (the group's timeout, else the session's), a number, or a timedelta.
static int timeout_arg(PyObject *t, long group, double *out) {
    if (t == NULL || t == Py_None) {
        *out = pd_group_timeout(group);
        return 0;
    }
    PyObject *secs = PyObject_HasAttrString(t, "total_seconds") ? PyObject_CallMethod(t, "total_seconds", NULL)
                                                                : Py_NewRef(t);
    if (secs == NULL) {
        return -1;
    }
    double v = PyFloat_AsDouble(secs);
    Py_DECREF(secs);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "wait(): `timeout` must be seconds or a datetime.timedelta; got %.100s",
                     Py_TYPE(t)->tp_name);
        return -1;
    }
    if (!(v >= 0)) {   // NaN too
        PyErr_Format(PyExc_ValueError, "wait(): `timeout` must be >= 0; got %R", t);
        return -1;
    }
    *out = v;
    return 0;
}

// Another thread is waiting on this Work's request.
static int other_thread_waits(const void *p) {
    return ((const PdWorkObject *)p)->waiting;
}

static int work_wait_for(PdWorkObject *w, double timeout, int timeout_breaks) {
    if (w->waiting &&
        pd_yield_while(other_thread_waits, w, timeout, w->op.what, "another thread was waiting for it") < 0) {
        return -1;
    }
    if (w->pending != NULL) {
        Py_INCREF(w);   // the wait releases the GIL: stay alive whatever other threads drop
        w->waiting = 1;
        int rc = w->pending->wait(w, timeout, timeout_breaks);
        w->waiting = 0;
        Py_DECREF(w);
        if (rc < 0) {
            return -1;   // a timeout or a signal leaves it pending and this Work usable
        }
    }
    if (w->error != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(w->error), w->error);
        return -1;
    }
    return 0;
}

int pd_work_wait(PdWorkObject *w) {
    return work_wait_for(w, pd_group_timeout(w->op.group), 1);
}

static PyObject *work_wait(PdWorkObject *w, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *t = NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs + nkw > 1) {
        PyErr_SetString(PyExc_TypeError, "wait() takes at most one argument (timeout)");
        return NULL;
    }
    if (nkw == 1) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, 0);
        if (!PyUnicode_Check(name) || PyUnicode_CompareWithASCIIString(name, "timeout") != 0) {
            PyErr_Format(PyExc_TypeError, "wait() got an unexpected keyword argument %R", name);
            return NULL;
        }
    }
    if (nargs + nkw == 1) {
        t = args[0];
    }
    double timeout;
    if (timeout_arg(t, w->op.group, &timeout) < 0) {
        return NULL;
    }
    // Only the group's own (or the session's) timeout breaks a group, not a caller's short poll.
    if (work_wait_for(w, timeout, t == NULL || t == Py_None) < 0) {
        return NULL;
    }
    Py_RETURN_TRUE;
}

static PyObject *work_is_completed(PdWorkObject *w, PyObject *unused) {
    (void)unused;
    if (pd_mpi_inherited) {
        pd_child_refuse("is_completed");   // a Work the child inherited: its operation is the parent's
        return NULL;
    }
    if (w->waiting) {
        Py_RETURN_FALSE;   // another thread owns the operation until its wait returns
    }
    pd_progress_all();     // every path moves along, this Work's too
    if (w->pending == NULL) {
        Py_RETURN_TRUE;
    }
    Py_INCREF(w);
    int done = w->pending->test(w);
    Py_DECREF(w);
    return PyBool_FromLong(done);
}

static PyObject *work_is_success(PdWorkObject *w, PyObject *unused) {
    (void)unused;
    return PyBool_FromLong(w->pending == NULL && w->error == NULL);
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
    if (w->pending != NULL || w->error != NULL || w->waiting) {
        PyErr_SetString(PyExc_ValueError, "source_rank(): the receive has not completed; call wait() first");
        return NULL;
    }
    int rank = pd_group_to_global(w->op.group, w->status.MPI_SOURCE);
    if (rank == MPI_UNDEFINED) {
        PyErr_SetString(PyExc_ValueError, "source_rank(): the receive's group has been destroyed");
        return NULL;
    }
    return PyLong_FromLong(rank);
}

// ---------------------------------------------------------------------------------------------------
// Lifetime and garbage collection

void pd_work_warn_dropped(PdWorkObject *w) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (PyErr_WarnFormat(PyExc_ResourceWarning, 1, "a Work for %s was dropped before it completed; "
                         "its arrays are kept alive until MPI is done with them (call wait())", w->op.what) < 0) {
        PyErr_WriteUnraisable((PyObject *)w);
    }
    PyErr_Restore(type, value, tb);
}

static int work_traverse(PdWorkObject *w, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(w));
    Py_VISIT(w->keep);
    Py_VISIT(w->result);
    Py_VISIT(w->error);
    return 0;
}

static int work_clear(PdWorkObject *w) {
    if (w->pending != NULL) {
        const PdPending *pending = w->pending;
        w->pending = NULL;
        pending->abandon(w);   // what may still be written keeps its memory; it completes later
    }
    Py_CLEAR(w->keep);
    Py_CLEAR(w->result);
    Py_CLEAR(w->error);
    return 0;
}

static void work_dealloc(PdWorkObject *w) {
    PyTypeObject *tp = Py_TYPE(w);
    PyObject_GC_UnTrack(w);
    work_clear(w);
    PyObject_GC_Del(w);
    Py_DECREF(tp);
}

static PyObject *work_repr(PdWorkObject *w) {
    return PyUnicode_FromFormat("<pydist.Work %s %s>", w->op.what,
                                w->pending != NULL ? "pending"
                                : w->error ? "failed" : "completed");
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
    {Py_tp_traverse, work_traverse},
    {Py_tp_clear, work_clear},
    {Py_tp_repr, work_repr},
    {Py_tp_methods, work_methods},
    {Py_tp_doc, "Handle of an asynchronous operation (async_op=True, isend, irecv)."},
    {0, NULL},
};

static PyType_Spec work_spec = {
    .name = "pydist._C.Work",
    .basicsize = sizeof(PdWorkObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION | Py_TPFLAGS_HAVE_GC,
    .slots = work_slots,
};

// pd_call_defer: a call that returned a Work still in flight is recorded on the timeline when it completes
// (pd_work_finish / pd_work_fail).
static int take_call(PyObject *ret, const PdCall *c, long long bytes, const char *path) {
    if (!PyObject_TypeCheck(ret, pd_WorkType) || ((PdWorkObject *)ret)->pending == NULL) {
        return 0;
    }
    PdWorkObject *w = (PdWorkObject *)ret;
    w->call = *c;
    w->call_bytes = bytes;
    w->call_path = path;
    return 1;
}

int pd_work_type_init(PyObject *module) {
    pd_WorkType = (PyTypeObject *)PyType_FromModuleAndSpec(module, &work_spec, NULL);
    if (pd_WorkType == NULL) {
        return -1;
    }
    pd_call_defer = take_call;
    return PyModule_AddObjectRef(module, "Work", (PyObject *)pd_WorkType);
}
