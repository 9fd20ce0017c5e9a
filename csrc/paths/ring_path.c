/*
 * ring_path.c: our ring all-reduce and reduce-scatter (algorithms/ring.c) as a path of the progress
 * engine: the blocking call, and the pending operation of an async one.
 *
 * A ring all-reduce (algorithm="ring", or after the header round a blocking 2-rank all-reduce or
 * reduce-scatter, or the path table's ring) is a sequence of steps, each one send/receive pair on the
 * group's private communicator with a tag of its own, and the next step is ours to post when one
 * completes: MPI cannot move it along for us as it does its own collectives. A rank
 * waiting for ring B may hold up a neighbour that waits for ring A first, so every ring in flight is
 * on one list that the path's progress (every wait slice of pydist, and every is_completed()) moves
 * along with MPI_Test. The list holds a reference to the Work: one dropped unwaited keeps its arrays
 * and still completes, as MPI's own collectives do.
 */
#include "paths/ring_path.h"

#include "core/dtypes.h"
#include "core/errors.h"
#include "groups/group.h"
#include "observe/calls.h"
#include "paths/algorithms/ring.h"
#include "paths/private_comm.h"
#include "progress/op.h"
#include "progress/wait.h"

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
    PyMem_RawFree(w->state);
    w->state = NULL;
    w->pending = NULL;
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

static int complete_step(RingAllreduce *r) {
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
    int rc = complete_step(w->state);
    if (rc == MPI_SUCCESS) {
        call = "MPI_Isendrecv_c";
        rc = ring_post(w->state, &w->req);
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

// The path's progress: every ring in flight that no thread is waiting for, moved along. Never raises.
static void ring_progress(void) {
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

static const PdPending ring_pending;

// A Work for a ring whose first step is posted in `req` (takes `ring`; `keep` owns the array and the
// scratch). Until the ring completes, the list of rings in flight holds a reference to the Work, and
// every wait slice of pydist moves it along: rings started in the same order everywhere complete
// whatever order they are waited in, and one dropped unwaited still completes. On failure the step is
// parked with `keep`, and NULL is returned.
static PdWorkObject *ring_work_new(MPI_Request req, const PdOp *op, PyObject *keep, PyObject *result,
                                   RingAllreduce *ring) {
    if (req == MPI_REQUEST_NULL) {   // nothing to send (one rank): complete already
        PyMem_RawFree(ring);
        return pd_work_make(NULL, NULL, op, keep, result);
    }
    PdWorkObject *w = inflight_reserve() < 0 ? NULL : pd_work_make(&ring_pending, ring, op, keep, result);
    if (w == NULL) {
        pd_park(req, Py_XNewRef(keep), 0);
        PyMem_RawFree(ring);
        return NULL;
    }
    w->req = req;
    inflight[n_inflight++] = (PdWorkObject *)Py_NewRef(w);
    return w;
}

// The path's group_release: the rings in flight on the group are given up (its communicators are
// going): each posted step is parked with its arrays, and the Work fails with DistError.
static void ring_group_release(long group, unsigned generation) {
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

// ---------------------------------------------------------------------------------------------------
// The call

static void scratch_free(PyObject *capsule) {
    PyMem_RawFree(PyCapsule_GetPointer(capsule, "pydist.ring_scratch"));
}

// `bytes` of scratch owned by a capsule, so that a parked step's receive buffer outlives this call.
static PyObject *scratch_new(size_t bytes, void **data) {
    void *p = PyMem_RawMalloc(bytes > 0 ? bytes : 1);
    if (p == NULL) {
        return PyErr_NoMemory();
    }
    PyObject *capsule = PyCapsule_New(p, "pydist.ring_scratch", scratch_free);
    if (capsule == NULL) {
        PyMem_RawFree(p);
        return NULL;
    }
    *data = p;
    return capsule;
}

// The ring all-reduce of buf (validated) on the group's private communicator. Blocking: each step is
// waited for the pydist way (pd_op_wait_or_park: timeouts, Ctrl-C, departed ranks), and a step given
// up is parked with the array and the scratch. Async: a Work that moves the steps along (work.c).
PyObject *pd_ring_all_reduce(PyObject *tensor, PdBuf *buf, long op, MPI_Op mop, long group, int async_op) {
    PyObject *ret = NULL, *scratch = NULL, *keep = NULL, *list = NULL;
    RingAllreduce *ring = NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    void *tmp = NULL;
    int tag, rc, size = pd_group_size(group);
    pd_call_path = "ring";
    MPI_Comm *comm = pd_group_algo_comm(group, "all_reduce", &tag);
    if (comm == NULL) {
        return NULL;
    }
    size_t extent = (size_t)PyArray_ITEMSIZE(buf->arr);
    if ((scratch = scratch_new((size_t)ring_scratch_elements(buf->count, size) * extent, &tmp)) == NULL ||
        (keep = PyTuple_Pack(2, (PyObject *)buf->arr, scratch)) == NULL) {
        goto done;
    }
    if ((ring = PyMem_RawMalloc(sizeof *ring)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if ((rc = ring_init(ring, buf->data, buf->count, buf->dtype->mpi, mop, *comm, tag, tmp, NULL)) != MPI_SUCCESS) {
        pd_raise_mpi(rc, "MPI_Comm_size");
        goto done;
    }
    PdOp pop = pd_op("all_reduce (ring)", group, PD_PEER_ALL);
    if ((rc = ring_post(ring, &req)) != MPI_SUCCESS) {
        pd_raise_mpi(rc, "MPI_Isendrecv_c");
        goto done;
    }
    if (async_op) {
        if ((list = PyList_New(1)) == NULL) {
            pd_park(req, Py_NewRef(keep), 0);   // nobody can own the step now: keep its memory alive
            goto done;
        }
        PyList_SET_ITEM(list, 0, Py_NewRef(tensor));
        PdWorkObject *w = ring_work_new(req, &pop, keep, list, ring);   // takes ring, parks on failure
        ring = NULL;
        if (w != NULL && op == PD_OP_AVG) {
            w->avg_divisor = size;
            w->avg_dtype = buf->dtype;
            w->avg_buf = buf->data;
            w->avg_count = buf->count;
        }
        ret = (PyObject *)w;
        goto done;
    }
    while (req != MPI_REQUEST_NULL) {
        if (pd_op_wait_or_park(&req, MPI_STATUS_IGNORE, &pop, keep, 0) < 0) {
            goto done;
        }
        if ((rc = complete_step(ring)) != MPI_SUCCESS) {
            pd_raise_mpi(rc, "MPI_Reduce_local_c");
            goto done;
        }
        if ((rc = ring_post(ring, &req)) != MPI_SUCCESS) {
            pd_raise_mpi(rc, "MPI_Isendrecv_c");
            goto done;
        }
    }
    if (op == PD_OP_AVG) {
        pd_divide_inplace(buf->data, buf->count, buf->dtype, size);
    }
    ret = Py_NewRef(Py_None);
done:
    PyMem_RawFree(ring);
    Py_XDECREF(list);
    Py_XDECREF(keep);
    Py_XDECREF(scratch);
    return ret;
}

// w goes on as `ring` (set up, its scratch not yet given): see pd_ring_start_on. Takes ring.
static int start_on(PdWorkObject *w, RingAllreduce *ring, size_t scratch_bytes) {
    PyObject *scratch = NULL, *keep = NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    void *tmp = NULL;
    int rc;
    if ((scratch = scratch_new(scratch_bytes, &tmp)) == NULL ||
        (keep = PyTuple_Pack(2, w->keep != NULL ? w->keep : Py_None, scratch)) == NULL || inflight_reserve() < 0) {
        goto error;
    }
    ring->tmp = tmp;
    if ((rc = ring_post(ring, &req)) != MPI_SUCCESS) {
        pd_raise_mpi(rc, "MPI_Isendrecv_c");
        goto error;
    }
    Py_SETREF(w->keep, keep);   // the arrays and the scratch, until the ring is over
    Py_DECREF(scratch);
    if (req == MPI_REQUEST_NULL) {   // nothing to send (one rank)
        PyMem_RawFree(ring);
        w->pending = NULL;
        return 0;
    }
    w->pending = &ring_pending;
    w->state = ring;
    w->req = req;
    inflight[n_inflight++] = (PdWorkObject *)Py_NewRef(w);
    return 0;
error:
    Py_XDECREF(keep);
    Py_XDECREF(scratch);
    PyMem_RawFree(ring);
    return -1;
}

int pd_ring_start_on(PdWorkObject *w, void *data, MPI_Count count, MPI_Datatype dtype, MPI_Op op, MPI_Comm comm,
                     int tag) {
    RingAllreduce *ring = PyMem_RawMalloc(sizeof *ring);
    if (ring == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int rc = ring_init(ring, data, count, dtype, op, comm, tag, NULL, NULL);
    if (rc != MPI_SUCCESS) {
        PyMem_RawFree(ring);
        pd_raise_mpi(rc, "MPI_Comm_size");
        return -1;
    }
    return start_on(w, ring, (size_t)ring_scratch_elements(count, ring->size) * (size_t)ring->extent);
}

int pd_ring_reduce_scatter_start_on(PdWorkObject *w, const void *in, void *out, MPI_Count count, MPI_Datatype dtype,
                                    MPI_Op op, MPI_Comm comm, int tag) {
    RingAllreduce *ring = PyMem_RawMalloc(sizeof *ring);
    if (ring == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int rc = ring_rs_init(ring, in, out, count, dtype, op, comm, tag, NULL, NULL);
    if (rc != MPI_SUCCESS) {
        PyMem_RawFree(ring);
        pd_raise_mpi(rc, "MPI_Comm_size");
        return -1;
    }
    return start_on(w, ring, (size_t)ring_rs_scratch_elements(count, ring->size) * (size_t)ring->extent);
}

// ---------------------------------------------------------------------------------------------------
// The pending operation

// Move it along as far as MPI_Test allows (ring_test), as its Work asks.
static int ring_pending_test(PdWorkObject *w) {
    if (ring_test(w) < 0) {
        PyErr_Clear();   // recorded in w->error
    }
    return w->pending == NULL;
}

// Wait for each step under one deadline, completing and posting the next.
static int ring_pending_wait(PdWorkObject *w, double timeout, int timeout_breaks) {
    double start = MPI_Wtime();
    while (w->pending != NULL) {
        double left = timeout < 0 ? -1.0 : timeout - (MPI_Wtime() - start);
        if (pd_op_wait(&w->req, &w->status, &w->op, timeout < 0 || left > 0 ? left : 0.0, timeout_breaks) < 0) {
            if (w->req != MPI_REQUEST_NULL) {
                return -1;   // a timeout or a signal leaves the step pending and the Work usable
            }
            ring_end(w);     // MPI completed the step with an error
            pd_work_fail(w);
            PyErr_Clear();
            return 0;
        }
        if (ring_advance(w) < 0) {
            pd_work_fail(w);
            PyErr_Clear();
            return 0;
        }
    }
    pd_work_finish(w);
    return 0;
}

// The list holds a reference until the ring ends, so a Work still in flight is never dropped.
static void ring_pending_abandon(PdWorkObject *w) {
    PyMem_RawFree(w->state);
    w->state = NULL;
}

static const PdPending ring_pending = {ring_pending_test, ring_pending_wait, ring_pending_abandon};

const PdPath pd_ring_path = {"ring", ring_progress, NULL, ring_group_release};
