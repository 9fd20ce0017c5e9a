/*
 * work.c: the Work handle that async_op=True and isend/irecv return. How it waits is group.c's
 * pd_op_wait (and below it wait.c); this file is only the Python type.
 *
 * A Work owns the arrays of its operation (`keep`) until the request completes, so MPI never writes
 * into freed memory. A Work dropped before completion parks its request with those arrays and warns
 * (ResourceWarning); torch's MPI backend calls std::terminate there.
 *
 * A Work takes part in garbage collection: a failed operation keeps its exception, whose traceback
 * holds the frame that holds the Work, a cycle only the collector can free. tp_clear never drops the
 * arrays of a pending request: it parks them instead.
 *
 * One thread at a time waits on a request (`waiting`): a second thread's wait() polls until the first
 * is done, and is_completed() answers False meanwhile rather than test a request another thread is
 * testing without the GIL.
 *
 * A small collective's Work may hold a cached persistent request (persistent.c): MPI never nulls such a
 * handle, so completion goes through pd_persist_work_finished (copy the result out, free the entry for
 * the next call); a dropped one hands its arrays to the entry, which delivers the result later.
 *
 * A ring all-reduce (algorithm="ring") is a sequence of steps, each one send/receive pair, and the next
 * step is ours to post when one completes: MPI cannot move it along for us as it does its own
 * collectives. A rank waiting for ring B may hold up a neighbour that waits for ring A first, so every
 * ring in flight is on one list that every wait slice of pydist (pd_wait_hook) and every is_completed()
 * moves along with MPI_Test. The list holds a reference to the Work: one dropped unwaited keeps its
 * arrays and still completes, as MPI's own collectives do.
 */
#include "pydist.h"


PyTypeObject *pd_WorkType = NULL;

PdWorkObject *pd_work_new(MPI_Request req, const PdOp *op, PyObject *keep, PyObject *result, int is_recv) {
    PdWorkObject *w = PyObject_GC_New(PdWorkObject, pd_WorkType);
    PyObject *list = w == NULL ? NULL : result ? Py_NewRef(result) : PyList_New(0);
    if (list == NULL) {
        if (w != NULL) {
            w->req = MPI_REQUEST_NULL;   // nothing filled in yet: dealloc must not look at it
            w->keep = w->result = w->error = NULL;
            w->ring = NULL;
            w->persist = NULL;
            w->shm = NULL;
            Py_DECREF(w);
        }
        pd_park(req, Py_XNewRef(keep), is_recv);  // nobody can own the request now: keep its memory alive
        return NULL;
    }
    w->req = req;
    memset(&w->status, 0, sizeof w->status);
    w->op = *op;
    w->keep = Py_XNewRef(keep);
    w->result = list;
    w->is_recv = is_recv;
    w->waiting = 0;
    w->avg_divisor = 0;
    w->avg_dtype = NULL;
    w->avg_buf = NULL;
    w->avg_count = 0;
    w->error = NULL;
    w->ring = NULL;
    w->persist = NULL;
    w->shm = NULL;
    PyObject_GC_Track(w);
    return w;
}

// The request has completed: finish AVG and let go of the arrays.
void pd_work_finish(PdWorkObject *w) {
    if (w->avg_divisor > 0) {
        pd_divide_inplace(w->avg_buf, w->avg_count, w->avg_dtype, w->avg_divisor);
        w->avg_divisor = 0;
    }
    Py_CLEAR(w->keep);
}

// Record a completion error so that every later wait() raises it again. MPI has released the
// request, so the arrays are free to go.
void pd_work_fail(PdWorkObject *w) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    Py_XSETREF(w->error, value ? Py_NewRef(value) : Py_NewRef(Py_None));
    PyErr_Restore(type, value, tb);
    Py_CLEAR(w->keep);
}

// ---------------------------------------------------------------------------------------------------
// Rings in flight

// The ring Works not yet complete, each holding a reference. GIL held whenever touched.
static PdWorkObject **inflight = NULL;
static Py_ssize_t n_inflight = 0, cap_inflight = 0;

static int inflight_reserve(void) {
    if (n_inflight < cap_inflight) {
        return 0;
    }
    Py_ssize_t cap = cap_inflight ? 2 * cap_inflight : 16;
    PdWorkObject **grown = PyMem_RawRealloc(inflight, sizeof(*grown) * (size_t)cap);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    inflight = grown;
    cap_inflight = cap;
    return 0;
}

// The ring is over (complete, failed or abandoned): off the list. The caller holds its own reference.
static void ring_end(PdWorkObject *w) {
    PyMem_RawFree(w->ring);
    w->ring = NULL;
    for (Py_ssize_t i = 0; i < n_inflight; i++) {
        if (inflight[i] == w) {
            inflight[i] = inflight[--n_inflight];
            Py_DECREF(w);
            break;
        }
    }
    if (n_inflight == 0) {
        PyMem_RawFree(inflight);
        inflight = NULL;
        cap_inflight = 0;
    }
}

int pd_ring_complete_step(RingAllreduce *r) {
    // Only reduce-scatter steps compute; release the GIL when that is more than a moment's work.
    MPI_Count longest = r->n / r->size + 1;
    if (pd_wait_serialized || !r->posted || r->step >= r->size - 1 || longest * r->extent < (1 << 16)) {
        return ring_complete(r);
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ring_complete(r);
    Py_END_ALLOW_THREADS
    return rc;
}

// w's posted step has completed: reduce what arrived and post the next step (w->req stays NULL when
// there is none). Returns 0, or -1 with DistBackendError raised and the ring ended. The caller holds a
// reference and has set w->waiting.
static int ring_advance(PdWorkObject *w) {
    const char *call = "MPI_Reduce_local_c";
    int rc = pd_ring_complete_step(w->ring);
    if (rc == MPI_SUCCESS) {
        call = "MPI_Isendrecv_c";
        rc = ring_post(w->ring, &w->req);
    }
    if (rc != MPI_SUCCESS) {
        w->req = MPI_REQUEST_NULL;
        ring_end(w);
        pd_raise_mpi(rc, call);
        return -1;
    }
    if (w->req == MPI_REQUEST_NULL) {
        ring_end(w);
    }
    return 0;
}

// Move w along as far as MPI_Test allows, without waiting. Returns 1 when complete, 0 while pending,
// -1 when it failed (recorded in w, and raised).
static int ring_test(PdWorkObject *w) {
    while (w->req != MPI_REQUEST_NULL) {
        int done = 0;
        int rc = MPI_Test(&w->req, &done, &w->status);
        if (rc != MPI_SUCCESS) {
            w->req = MPI_REQUEST_NULL;
            ring_end(w);
            pd_raise_mpi(rc, w->op.what);
            pd_work_fail(w);
            return -1;
        }
        if (!done) {
            return 0;
        }
        if (ring_advance(w) < 0) {
            pd_work_fail(w);
            return -1;
        }
    }
    pd_work_finish(w);
    return 1;
}

// pd_wait_hook: every ring in flight that no thread is waiting for, moved along, and every small
// shm collective whose peers are there completed (a peer may need it: shm_small.h). Never raises.
static void ring_progress(void) {
    pd_shm_progress();
    if (n_inflight == 0) {
        return;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    // Backwards: a ring that ends is swapped with the last entry, which has been seen already.
    for (Py_ssize_t i = n_inflight - 1; i >= 0; i--) {
        if (i >= n_inflight) {
            continue;   // the list shrank while a reduction ran without the GIL
        }
        PdWorkObject *w = inflight[i];
        if (w->waiting) {
            continue;
        }
        Py_INCREF(w);
        w->waiting = 1;
        if (ring_test(w) < 0) {
            PyErr_Clear();   // kept in w->error for its wait()
        }
        w->waiting = 0;
        Py_DECREF(w);
    }
    PyErr_Restore(type, value, tb);
}

PdWorkObject *pd_ring_work_new(MPI_Request req, const PdOp *op, PyObject *keep, PyObject *result,
                               RingAllreduce *ring) {
    if (req == MPI_REQUEST_NULL) {   // nothing to send (one rank): complete already
        PyMem_RawFree(ring);
        return pd_work_new(req, op, keep, result, 0);
    }
    if (inflight_reserve() < 0) {
        pd_park(req, Py_XNewRef(keep), 0);
        PyMem_RawFree(ring);
        return NULL;
    }
    PdWorkObject *w = pd_work_new(req, op, keep, result, 0);   // parks the step if it fails
    if (w == NULL) {
        PyMem_RawFree(ring);
        return NULL;
    }
    w->ring = ring;
    inflight[n_inflight++] = (PdWorkObject *)Py_NewRef(w);
    return w;
}

void pd_ring_works_abandon(long group, unsigned generation) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    for (Py_ssize_t i = n_inflight - 1; i >= 0; i--) {
        if (i >= n_inflight) {
            continue;
        }
        PdWorkObject *w = inflight[i];
        if (w->op.group != group || w->op.generation != generation) {
            continue;
        }
        Py_INCREF(w);
        if (w->req != MPI_REQUEST_NULL) {
            pd_park(w->req, w->keep, 0);   // steals keep: MPI may still write into the arrays
            w->keep = NULL;
            w->req = MPI_REQUEST_NULL;
        }
        ring_end(w);
        PyErr_Format(pd_DistError, "%s was abandoned: its process group was destroyed before it completed",
                     w->op.what);
        pd_work_fail(w);
        PyErr_Clear();
        Py_DECREF(w);
    }
    PyErr_Restore(type, value, tb);
}

// Seconds from wait()'s argument: None (the session's timeout), a number, or a timedelta.
static int timeout_arg(PyObject *t, double *out) {
    if (t == NULL || t == Py_None) {
        *out = pd_session_timeout();
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
    if (timeout_arg(t, &timeout) < 0) {
        return NULL;
    }
    if (w->waiting &&
        pd_yield_while(other_thread_waits, w, timeout, w->op.what, "another thread was waiting for it") < 0) {
        return NULL;
    }
    if (w->shm != NULL) {
        Py_INCREF(w);   // the wait releases the GIL: stay alive whatever other threads drop
        w->waiting = 1;
        int rc = pd_shm_work_wait(w, timeout, t == NULL || t == Py_None);
        w->waiting = 0;
        Py_DECREF(w);
        if (rc < 0) {
            return NULL;
        }
    }
    if (w->error != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(w->error), w->error);
        return NULL;
    }
    if (w->req != MPI_REQUEST_NULL) {
        Py_INCREF(w);   // the wait releases the GIL: stay alive whatever other threads drop
        w->waiting = 1;
        int rc = 0;
        double start = MPI_Wtime();
        // One pass for MPI's operations; one per step for a ring, under one deadline.
        while (w->req != MPI_REQUEST_NULL) {
            double left = timeout < 0 ? -1.0 : timeout - (MPI_Wtime() - start);
            // Only the session's own timeout breaks a group, not a caller's short poll.
            rc = pd_op_wait(&w->req, &w->status, &w->op, timeout < 0 || left > 0 ? left : 0.0,
                            t == NULL || t == Py_None);
            if (rc < 0) {
                if (w->req == MPI_REQUEST_NULL) {   // MPI completed the request with an error
                    if (w->ring != NULL) {
                        ring_end(w);
                    }
                    pd_work_fail(w);
                }
                break;   // a timeout or a signal leaves the request pending and this Work usable
            }
            if (w->persist != NULL) {
                pd_persist_work_finished(w);   // a persistent handle stays non-null: complete it here
            }
            if (w->ring != NULL && (rc = ring_advance(w)) < 0) {
                pd_work_fail(w);
                break;
            }
        }
        w->waiting = 0;
        Py_DECREF(w);
        if (rc < 0) {
            return NULL;
        }
    }
    pd_work_finish(w);
    Py_RETURN_TRUE;
}

static PyObject *work_is_completed(PdWorkObject *w, PyObject *unused) {
    (void)unused;
    if (w->waiting) {
        Py_RETURN_FALSE;   // another thread owns the request until its wait returns
    }
    ring_progress();   // every ring in flight, this Work's too if it is one (and every small shm call)
    if (w->ring != NULL || w->shm != NULL) {
        Py_RETURN_FALSE;   // still in flight
    }
    if (w->req != MPI_REQUEST_NULL) {
        int done = 0;
        int rc = MPI_Test(&w->req, &done, &w->status);
        if (rc != MPI_SUCCESS) {
            pd_raise_mpi(rc, w->op.what);
            pd_work_fail(w);
            PyErr_Clear();  // reported by wait() / exception()
            Py_RETURN_TRUE;
        }
        if (!done) {
            Py_RETURN_FALSE;
        }
        if (w->persist != NULL) {
            pd_persist_work_finished(w);
        }
    }
    pd_work_finish(w);
    Py_RETURN_TRUE;
}

static PyObject *work_is_success(PdWorkObject *w, PyObject *unused) {
    (void)unused;
    return PyBool_FromLong(w->req == MPI_REQUEST_NULL && w->shm == NULL && w->error == NULL);
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
    if (w->req != MPI_REQUEST_NULL || w->error != NULL || w->waiting) {
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

// The caller never learned whether a dropped Work's operation completed: say so (a ResourceWarning).
static void warn_dropped(PdWorkObject *w) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (PyErr_WarnFormat(PyExc_ResourceWarning, 1, "a Work for %s was dropped before it completed; "
                         "its arrays are kept alive until MPI is done with them (call wait())", w->op.what) < 0) {
        PyErr_WriteUnraisable((PyObject *)w);
    }
    PyErr_Restore(type, value, tb);
}

// A request still pending when its Work goes (dropped, or cleared by the collector): park it with the
// arrays it owns, and warn.
static void work_let_go(PdWorkObject *w) {
    if (w->req == MPI_REQUEST_NULL) {
        return;
    }
    int done = 0, fin = 0;
    MPI_Finalized(&fin);
    if (w->persist != NULL) {
        // A cached persistent request: complete now if MPI has, else its entry finishes it later.
        if (!fin && MPI_Test(&w->req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
            pd_persist_work_finished(w);
            return;
        }
        if (!fin) {
            warn_dropped(w);
        }
        pd_persist_work_dropped(w);
        return;
    }
    if (!fin && MPI_Test(&w->req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) {
        warn_dropped(w);
        pd_park(w->req, w->keep, w->is_recv);  // steals keep; a receive nobody waits for can be cancelled
        w->keep = NULL;
    }
    w->req = MPI_REQUEST_NULL;
}

static int work_traverse(PdWorkObject *w, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(w));
    Py_VISIT(w->keep);
    Py_VISIT(w->result);
    Py_VISIT(w->error);
    return 0;
}

static int work_clear(PdWorkObject *w) {
    // A ring in flight is on the list, which holds a reference: it cannot be here unless abandoned.
    PyMem_RawFree(w->ring);
    w->ring = NULL;
    work_let_go(w);   // a pending request keeps its arrays, on the parked list
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
                                w->req != MPI_REQUEST_NULL || w->shm != NULL ? "pending"
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

int pd_work_type_init(PyObject *module) {
    pd_WorkType = (PyTypeObject *)PyType_FromModuleAndSpec(module, &work_spec, NULL);
    if (pd_WorkType == NULL) {
        return -1;
    }
    pd_wait_hook = ring_progress;
    return PyModule_AddObjectRef(module, "Work", (PyObject *)pd_WorkType);
}
