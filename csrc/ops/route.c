/*
 * route.c: the one table that chooses a collective's path. An entry point (collectives.c) describes its
 * call once, as each path takes it (PdRoute), and pd_route walks PATHS in order: the first row that
 * takes the call runs it, and a row that finds the group cannot use it (the same answer on every rank)
 * hands the call on to the next. Adding a path is a file under paths/ and a row here.
 *
 *   ring        all_reduce(algorithm="ring") only: pydist's ring (ring_path.c)
 *   shm         all_reduce, asked for by name, or automatic from PD_SHM_AUTO_BYTES up on a group within a
 *               node, past the small collectives' sizes (shared_memory.c over algorithms/shm.c)
 *   small shm   automatic: a contribution the group's shared-memory slots take (algorithms/shm_small.c)
 *   persistent  a small message's cached persistent request (persistent.c), on a group whose headers do
 *               not go through the slots
 *   MPI         MPI's nonblocking collective, its header through the slots first on a group whose calls
 *               put them there (request.c, shared_memory.c's pd_shm_header_run)
 */
#include "ops/route.h"

#include "core/dtypes.h"
#include "core/errors.h"
#include "groups/group.h"
#include "observe/calls.h"
#include "paths/ring_path.h"
#include "paths/tuned.h"
#include "progress/op.h"
#include "progress/wait.h"

// What Work.result() returns for `result` (borrowed; NULL: nothing): a new list holding it, or the
// list itself.
static PyObject *result_list(PyObject *result) {
    if (result != NULL && PyList_Check(result)) {
        return Py_NewRef(result);
    }
    PyObject *list = PyList_New(result == NULL ? 0 : 1);
    if (list != NULL && result != NULL) {
        PyList_SET_ITEM(list, 0, Py_NewRef(result));
    }
    return list;
}

// Finish a started collective: wait (blocking) or return a Work (async). `keep` owns every byte MPI
// touches; `result` is what Work.result() returns (borrowed; NULL: an empty list). When avg_buf is
// set, its avg_count elements are divided by the group size once the operation has completed.
static PyObject *finish(MPI_Request req, const char *what, long group, int async_op, PyObject *keep,
                        PyObject *result, const PdBuf *avg_buf) {
    int divisor = avg_buf ? pd_group_size(group) : 0;
    PdOp op = pd_op(what, group, PD_PEER_ALL);
    if (!async_op) {
        if (pd_op_wait_or_park(&req, MPI_STATUS_IGNORE, &op, keep, 0) < 0) {
            return NULL;
        }
        if (divisor > 0) {
            pd_divide_inplace(avg_buf->data, avg_buf->count, avg_buf->dtype, divisor);
        }
        Py_RETURN_NONE;
    }
    PyObject *list = result_list(result);
    if (list == NULL) {
        pd_park(req, Py_XNewRef(keep), 0);  // nobody can own it now: keep its memory alive
        return NULL;
    }
    PdWorkObject *w = pd_work_new(req, &op, keep, list, 0);   // parks the request if it fails
    Py_DECREF(list);
    if (w == NULL) {
        return NULL;
    }
    if (divisor > 0) {
        w->avg_divisor = divisor;
        w->avg_dtype = avg_buf->dtype;
        w->avg_buf = avg_buf->data;
        w->avg_count = avg_buf->count;
    }
    return (PyObject *)w;
}

static PyObject *start_failed(int rc, const char *call) {
    return pd_raise_mpi(rc, call);
}


// A small message's collective through the group's cache of persistent requests (persistent.c):
// the same result, waits and Work as finish(), on staging buffers. Only for calls that every rank
// sends this way: pd_persist_wanted(bytes) with bytes the same on every rank.
static PyObject *finish_persistent(const char *what, long group, MPI_Comm comm, int async_op,
                                   const PdPersistKey *key, const PdPersistCall *call, PyObject *keep,
                                   PyObject *result) {
    PdOp op = pd_op(what, group, PD_PEER_ALL);
    PyObject *list = NULL;
    if (async_op && (list = result_list(result)) == NULL) {
        return NULL;
    }
    PyObject *ret = pd_persist_run(&op, comm, key, call, keep, list);
    Py_XDECREF(list);
    return ret;
}

// A list's displacements (PdBufList.displs) serve as SmallCall's block offsets.
_Static_assert(sizeof(MPI_Aint) == sizeof(ptrdiff_t), "MPI_Aint is not ptrdiff_t's size");

// Whether the group's calls put their headers through the shared-memory slots (a group within one
// node, the small collectives on; the same answer on every rank). Then every call the slots do not
// carry sends its header there too (mpi_path), and the persistent cache is not used: a rank whose call
// differs, on either side of any threshold, raises ValueError with every other instead of waiting.
static int headers_in_slots(long group) {
    return pd_shm_small_wanted(group, 0);
}

// A collective's data as MPI's call `mc`, finished as finish() does. With `headers` (headers_in_slots),
// `call` (as the slots describe it: small_run's, whose data pd_shm_header_run leaves out when the slots
// do not take it) goes through the slots first and the data then takes MPI on the group's private
// communicator (shared_memory.c); else MPI's call on `comm` at once.
static PyObject *mpi_path_start(const char *fn, long group, MPI_Comm comm, int async_op, int headers,
                                const PdMpiCall *mc, SmallCall call, PyObject *keep, PyObject *result,
                                const PdBuf *avg) {
    if (headers) {
        PyObject *list = result_list(result);
        if (list == NULL) {
            return NULL;
        }
        int fallback = 0;
        PyObject *ret = pd_shm_header_run(fn, group, async_op, &call, mc, keep, list, avg, &fallback);
        Py_DECREF(list);
        if (ret != NULL || !fallback) {
            return ret;
        }
    }
    MPI_Request req = MPI_REQUEST_NULL;
    pd_call_path = "MPI";
    // A call whose start hands back memory MPI reads (request.c) keeps it beside `keep`, in a tuple
    // made first: once the request is started, nothing may fail before it has an owner.
    PyObject *kept = NULL, *scratch = NULL;
    if (pd_mpi_call_scratch(mc) && (kept = PyTuple_Pack(2, keep != NULL ? keep : Py_None, Py_None)) == NULL) {
        return NULL;
    }
    int rc = pd_mpi_call_start(mc, comm, &req, &scratch);
    if (rc != MPI_SUCCESS) {
        Py_XDECREF(kept);
        return start_failed(rc, mc->name);
    }
    if (kept == NULL) {
        return finish(req, fn, group, async_op, keep, result, avg);
    }
    if (scratch != NULL) {
        Py_DECREF(PyTuple_GET_ITEM(kept, 1));
        PyTuple_SET_ITEM(kept, 1, scratch);
    }
    PyObject *ret = finish(req, fn, group, async_op, kept, result, avg);
    Py_DECREF(kept);
    return ret;
}

// mpi_path_start, with an input that overlaps the output (torch's forms: all_to_all_single(t, t),
// reduce_scatter_tensor into a chunk of its input, a list's entry passed again as the tensor) sent
// from a copy taken now, as the slots' and the persistent path send: MPI forbids the overlap, and
// MPICH aborts the job on some of it.
static PyObject *mpi_path(const char *fn, long group, MPI_Comm comm, int async_op, int headers, const PdMpiCall *mc,
                          SmallCall call, PyObject *keep, PyObject *result, const PdBuf *avg) {
    PdMpiCall unaliased = *mc;
    PyObject *stage = NULL;
    if (pd_mpi_call_unalias(&unaliased, pd_group_size(group), pd_group_rank(group), &stage) < 0) {
        return NULL;
    }
    if (stage == NULL) {
        return mpi_path_start(fn, group, comm, async_op, headers, mc, call, keep, result, avg);
    }
    PyObject *kept = PyTuple_Pack(2, keep != NULL ? keep : Py_None, stage);
    Py_DECREF(stage);
    if (kept == NULL) {
        return NULL;
    }
    PyObject *ret = mpi_path_start(fn, group, comm, async_op, headers, &unaliased, call, kept, result, avg);
    Py_DECREF(kept);
    return ret;
}

// ---------------------------------------------------------------------------------------------------
// The table

// Whether the group's calls put their headers through the shared-memory slots (headers_in_slots), for a
// call that may (automatic, and not a barrier, which the slots always take where they exist).
static int headers(const PdRoute *r) {
    return r->algorithm == PD_ROUTE_AUTO && r->headers_ok && headers_in_slots(r->group);
}

// (A library without MPI_Isendrecv, Open MPI 4.1, leaves the ring's calls to MPI: the same result.)
static int ring_takes(const PdRoute *r) {
    return r->tensor != NULL && r->algorithm == PD_ROUTE_RING && pd_mpi_has_isendrecv();
}

static PyObject *ring_run(PdRoute *r, int *fallback) {
    (void)fallback;
    return pd_ring_all_reduce(r->tensor, r->buf, r->op, r->mop, r->group, r->async_op);
}

// The path table's choice for an automatic all-reduce on a group whose headers go through the slots.
static int tuned_all_reduce(const PdRoute *r) {
    return r->algorithm == PD_ROUTE_AUTO && headers_in_slots(r->group)
               ? pd_tuned_path(pd_group_size(r->group), PD_TUNE_ALL_REDUCE, (size_t)r->buf->nbytes)
               : PD_TUNED_NONE;
}

// Asked for by name; or automatic, for a size the small collectives do not take: from PD_SHM_AUTO_BYTES up,
// or where the path table names the ring or shm.
static int shm_takes(const PdRoute *r) {
    if (r->tensor == NULL) {
        return 0;
    }
    if (r->algorithm == PD_ROUTE_SHM) {
        return 1;
    }
    int tuned = tuned_all_reduce(r);
    return r->algorithm == PD_ROUTE_AUTO && !pd_shm_small_takes(r->group, &r->small) &&
           (pd_shm_auto(r->group, r->buf->nbytes) || tuned == PD_TUNED_RING || tuned == PD_TUNED_SHM);
}

// Decided after every rank's header has matched (shared_memory.c): not taken, alike everywhere, goes on.
static PyObject *shm_run(PdRoute *r, int *fallback) {
    PyObject *ret = NULL;
    int forced = r->algorithm == PD_ROUTE_SHM || r->buf->nbytes >= PD_SHM_AUTO_COPY_BYTES;
    *fallback = !pd_shm_all_reduce(r->tensor, r->buf, r->op, r->mop, r->group, r->async_op, forced,
                                   r->algorithm == PD_ROUTE_AUTO, &ret);
    return ret;
}

static int small_takes(const PdRoute *r) {
    return r->algorithm == PD_ROUTE_AUTO && r->small_first && pd_shm_small_takes(r->group, &r->small);
}

// A small collective in shared memory (shared_memory.c over algorithms/shm_small.c), small_takes having
// checked the size: *fallback when the group cannot use the slots (every rank alike).
static PyObject *small_run(PdRoute *r, int *fallback) {
    PyObject *list = NULL;
    if (r->async_op && (list = result_list(r->result)) == NULL) {
        return NULL;
    }
    SmallCall call = r->small;   // (the slots' run may fill it in; the MPI row's header needs it as described)
    PyObject *ret = pd_shm_small_run(r->fn, r->fn, r->group, r->async_op, &call, r->keep, NULL, list, fallback);
    Py_XDECREF(list);
    return ret;
}

static int persistent_takes(const PdRoute *r) {
    return r->persist_ok && !headers(r) && pd_persist_wanted(r->persist_bytes);
}

static PyObject *persistent_run(PdRoute *r, int *fallback) {
    (void)fallback;
    return finish_persistent(r->fn, r->group, r->comm, r->async_op, &r->persist_key, &r->persist_call, r->keep,
                             r->result);
}

static int mpi_takes(const PdRoute *r) {
    (void)r;
    return 1;
}

static PyObject *mpi_run(PdRoute *r, int *fallback) {
    (void)fallback;
    return mpi_path(r->fn, r->group, r->comm, r->async_op, headers(r), &r->mpi, r->small, r->keep, r->result, r->avg);
}

static const struct {
    const char *name;
    int (*takes)(const PdRoute *r);                  // from what every rank shares
    PyObject *(*run)(PdRoute *r, int *fallback);     // *fallback 1: the group cannot use it (every rank alike)
} PATHS[] = {
    {"ring", ring_takes, ring_run},
    {"shm", shm_takes, shm_run},
    {"small shm", small_takes, small_run},
    {"persistent", persistent_takes, persistent_run},
    {"MPI", mpi_takes, mpi_run},
};

static PyObject *route_on(PdRoute *r) {
    for (size_t i = 0; i < sizeof PATHS / sizeof PATHS[0]; i++) {
        int fallback = 0;
        if (!PATHS[i].takes(r)) {
            continue;
        }
        PyObject *ret = PATHS[i].run(r, &fallback);
        if (ret != NULL || !fallback) {
            return ret;
        }
    }
    PyErr_Format(PyExc_SystemError, "%s(): no path took the call", r->fn);   // (MPI takes every call)
    return NULL;
}

// One thread at a time inside a collective call on a group (pd_group_call_begin says why).
PyObject *pd_route(PdRoute *r) {
    PdOp call;
    if (pd_group_call_begin(r->group, r->fn, &call) < 0) {
        pd_call_path = pd_call_refused;
        return NULL;
    }
    PyObject *ret = route_on(r);
    pd_group_call_end(&call);
    return ret;
}
