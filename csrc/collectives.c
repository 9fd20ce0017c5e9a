/*
 * collectives.c: barrier, broadcast and all_reduce over MPI, on the array's own memory.
 *
 * Each call validates everything with the GIL held, starts MPI's nonblocking collective, and then
 * either waits for it (pd_wait: interruptible, yields the core) or hands the request to a Work
 * (async_op=True) that owns the array until the operation completes. all_reduce is in place
 * (MPI_IN_PLACE), as torch's is. AVG is SUM followed by a division by the group size.
 */
#include "pydist.h"

// Finish a started collective: wait (blocking) or return a Work (async). `keep` owns the memory,
// `orig` is what Work.result() lists. avg_* describe a pending AVG division (avg_divisor 0: none).
static PyObject *finish(MPI_Request req, const char *what, int async_op, PyObject *keep, PyObject *orig,
                        int avg_divisor, const PdBuf *buf) {
    if (!async_op) {
        if (pd_wait_or_park(&req, MPI_STATUS_IGNORE, what, keep, 0) < 0) {
            return NULL;
        }
        if (avg_divisor > 0) {
            pd_divide_inplace(buf->data, buf->count, buf->dtype, avg_divisor);
        }
        Py_RETURN_NONE;
    }
    PyObject *result = orig ? PyList_New(1) : PyList_New(0);
    PdWorkObject *w = NULL;
    if (result != NULL) {
        if (orig) {
            PyList_SET_ITEM(result, 0, Py_NewRef(orig));
        }
        w = pd_work_new(req, what, keep, result);
        Py_DECREF(result);
    }
    if (w == NULL) {
        pd_park(req, Py_XNewRef(keep), 0);
        return NULL;
    }
    if (avg_divisor > 0) {
        w->avg_divisor = avg_divisor;
        w->avg_dtype = buf->dtype;
        w->avg_buf = buf->data;
        w->avg_count = buf->count;
    }
    return (PyObject *)w;
}

// _C.barrier(group, async_op) -> None | Work
PyObject *pd_barrier(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long group;
    int async_op;
    MPI_Request req = MPI_REQUEST_NULL;
    if (pd_check_nargs(nargs, 2, "barrier") < 0 || pd_arg_long(args[0], "barrier", "group", &group) < 0 ||
        pd_arg_bool(args[1], "barrier", "async_op", &async_op) < 0) {
        return NULL;
    }
    MPI_Comm *comm = pd_group_comm(group, "barrier");
    if (comm == NULL) {
        return NULL;
    }
    int rc = MPI_Ibarrier(*comm, &req);
    if (rc != MPI_SUCCESS) {
        return pd_raise_mpi(rc, "MPI_Ibarrier");
    }
    return finish(req, "barrier", async_op, NULL, NULL, 0, NULL);
}

// _C.broadcast(tensor, src, group, async_op) -> None | Work. src is a global rank.
PyObject *pd_broadcast(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long src, group;
    int async_op, root;
    PdBuf buf = {0};
    MPI_Request req = MPI_REQUEST_NULL;
    PyObject *ret = NULL;
    if (pd_check_nargs(nargs, 4, "broadcast") < 0 || pd_arg_long(args[1], "broadcast", "src", &src) < 0 ||
        pd_arg_long(args[2], "broadcast", "group", &group) < 0 ||
        pd_arg_bool(args[3], "broadcast", "async_op", &async_op) < 0) {
        return NULL;
    }
    MPI_Comm *comm = pd_group_comm(group, "broadcast");
    if (comm == NULL || (root = pd_group_peer(group, src, "broadcast", "src", 1)) < 0) {
        return NULL;
    }
    // Only the receivers write; the root may broadcast from a read-only array.
    if (pd_buf_get(args[0], "broadcast", "tensor", root != pd_group_rank(group), &buf) < 0) {
        return NULL;
    }
    int rc = MPI_Ibcast_c(buf.data, buf.count, buf.dtype->mpi, root, *comm, &req);
    if (rc != MPI_SUCCESS) {
        pd_raise_mpi(rc, "MPI_Ibcast_c");
        goto done;
    }
    ret = finish(req, "broadcast", async_op, (PyObject *)buf.arr, args[0], 0, &buf);
done:
    pd_buf_release(&buf);
    return ret;
}

// _C.all_reduce(tensor, op, group, async_op) -> None | Work. In place.
PyObject *pd_all_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long op, group;
    int async_op;
    PdBuf buf = {0};
    MPI_Op mop;
    MPI_Request req = MPI_REQUEST_NULL;
    PyObject *ret = NULL;
    if (pd_check_nargs(nargs, 4, "all_reduce") < 0 || pd_arg_long(args[1], "all_reduce", "op", &op) < 0 ||
        pd_arg_long(args[2], "all_reduce", "group", &group) < 0 ||
        pd_arg_bool(args[3], "all_reduce", "async_op", &async_op) < 0) {
        return NULL;
    }
    MPI_Comm *comm = pd_group_comm(group, "all_reduce");
    if (comm == NULL || pd_buf_get(args[0], "all_reduce", "tensor", 1, &buf) < 0) {
        return NULL;
    }
    if (pd_op_resolve(op, buf.dtype, "all_reduce", &mop) < 0) {
        goto done;
    }
    int rc = MPI_Iallreduce_c(MPI_IN_PLACE, buf.data, buf.count, buf.dtype->mpi, mop, *comm, &req);
    if (rc != MPI_SUCCESS) {
        pd_raise_mpi(rc, "MPI_Iallreduce_c");
        goto done;
    }
    ret = finish(req, "all_reduce", async_op, (PyObject *)buf.arr, args[0],
                 op == PD_OP_AVG ? pd_group_size(group) : 0, &buf);
done:
    pd_buf_release(&buf);
    return ret;
}
