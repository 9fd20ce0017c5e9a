/*
 * p2p.c: send, recv, isend, irecv.
 *
 * torch semantics: `dst`/`src` are global ranks whatever the group; sending to or receiving from
 * yourself is a ValueError; recv(src=None) receives from anyone and returns the sender's rank.
 * The blocking calls are the nonblocking ones plus pd_op_wait (progress/op.c). A point-to-point wait needs
 * only its peer (any member of the group for a receive from anyone), and its timeout never breaks the
 * group: collectives never match point-to-point messages.
 *
 * The timeline and the stall inspector (calls.c) see each call from its checks to its return, with its
 * peer as a global rank (a receive from anyone: the sender, once known) and the bytes of its array.
 */
#include "ops/p2p.h"

#include "core/buffer.h"
#include "core/errors.h"
#include "groups/group.h"
#include "observe/calls.h"
#include "paths/request.h"
#include "progress/op.h"
#include "progress/wait.h"

// A call whose checks failed before pd_call_begin: pd_call_end at `done:` has nothing to end.
#define CALL_NOT_BEGUN {.skip = 1}

static int tag_ub = -1;

static int check_tag(long tag, const char *fn) {
    if (tag_ub < 0) {
        int *ub = NULL, flag = 0;
        int rc = MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
        tag_ub = (rc == MPI_SUCCESS && flag && ub) ? *ub : 32767;  // 32767 is the least MPI guarantees
    }
    if (tag < 0 || tag > tag_ub) {
        PyErr_Format(PyExc_ValueError, "%s(): `tag` must be in [0, %d]; got %ld", fn, tag_ub, tag);
        return -1;
    }
    return 0;
}

// Shared argument handling: (tensor, peer, tag, group). For receives, peer None means any source.
typedef struct {
    PdBuf buf;
    MPI_Comm comm;
    long group;
    int peer;         // group rank, or MPI_ANY_SOURCE
    int global_peer;  // the same as a global rank, or -1 for any source
    int tag;
} P2PArgs;

static int parse(PyObject *const *args, Py_ssize_t nargs, const char *fn, int is_recv, P2PArgs *a) {
    long peer, tag, group;
    const char *peer_name = is_recv ? "src" : "dst";
    a->buf = (PdBuf){0};   // what `done:` reads (its bytes, what to release) even when the checks fail
    int any_source = is_recv && nargs == 4 && args[1] == Py_None;
    if (pd_check_nargs(nargs, 4, fn) < 0 || (!any_source && pd_arg_long(args[1], fn, peer_name, &peer) < 0) ||
        pd_arg_long(args[2], fn, "tag", &tag) < 0 || pd_arg_long(args[3], fn, "group", &group) < 0) {
        return -1;
    }
    MPI_Comm *comm = pd_group_comm(group, fn);
    if (comm == NULL || check_tag(tag, fn) < 0) {
        return -1;
    }
    a->global_peer = any_source ? -1 : (int)peer;
    if (any_source) {
        a->peer = MPI_ANY_SOURCE;
    } else if ((a->peer = pd_group_peer(group, peer, fn, peer_name, 0)) < 0) {
        return -1;
    }
    if (pd_buf_get(args[0], fn, "tensor", is_recv, &a->buf) < 0) {
        return -1;
    }
    a->comm = *comm;
    a->group = group;
    a->tag = (int)tag;
    return 0;
}

static int start(P2PArgs *a, int is_recv, MPI_Request *req) {
    int rc;
    pd_call_path = "MPI";
    if (is_recv) {
        rc = MPI_Irecv_c(a->buf.data, a->buf.count, a->buf.dtype->mpi, a->peer, a->tag, a->comm, req);
    } else {
        rc = MPI_Isend_c(a->buf.data, a->buf.count, a->buf.dtype->mpi, a->peer, a->tag, a->comm, req);
    }
    return rc == MPI_SUCCESS ? 0 : pd_raise_mpi_int(rc, is_recv ? "MPI_Irecv_c" : "MPI_Isend_c");
}

// ---------------------------------------------------------------------------------------------------

// _C.send(tensor, dst, tag, group) -> None
PyObject *pd_send(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    P2PArgs a;
    MPI_Request req = MPI_REQUEST_NULL;
    PdCall call = CALL_NOT_BEGUN;
    PyObject *ret = NULL;
    if (parse(args, nargs, "send", 0, &a) < 0) {
        goto done;
    }
    pd_call_begin(&call, "send", a.group, 0, a.global_peer);
    if (start(&a, 0, &req) < 0) {
        goto done;
    }
    PdOp op = pd_op("send", a.group, a.peer);
    if (pd_op_wait_or_park(&req, MPI_STATUS_IGNORE, &op, (PyObject *)a.buf.arr, 0) < 0) {
        goto done;
    }
    ret = Py_NewRef(Py_None);
done:
    pd_call_end(&call, ret, a.buf.nbytes);
    pd_buf_release(&a.buf);
    return ret;
}

// _C.recv(tensor, src, tag, group) -> sender's global rank. src None: any source.
PyObject *pd_recv(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    P2PArgs a;
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_Status status;
    PdCall call = CALL_NOT_BEGUN;
    PyObject *ret = NULL;
    if (parse(args, nargs, "recv", 1, &a) < 0) {
        goto done;
    }
    pd_call_begin(&call, "recv", a.group, 0, a.global_peer);
    if (start(&a, 1, &req) < 0) {
        goto done;
    }
    PdOp op = pd_op("recv", a.group, a.peer);
    if (pd_op_wait_or_park(&req, &status, &op, (PyObject *)a.buf.arr, 1) < 0) {
        goto done;
    }
    call.peer = pd_group_to_global(a.group, status.MPI_SOURCE);   // the sender, for a receive from anyone
    ret = PyLong_FromLong(call.peer);
done:
    pd_call_end(&call, ret, a.buf.nbytes);
    pd_buf_release(&a.buf);
    return ret;
}

static PyObject *start_async(PyObject *const *args, Py_ssize_t nargs, int is_recv) {
    const char *fn = is_recv ? "irecv" : "isend";
    P2PArgs a;
    MPI_Request req = MPI_REQUEST_NULL;
    PdCall call = CALL_NOT_BEGUN;
    PyObject *result = NULL, *ret = NULL;
    if (parse(args, nargs, fn, is_recv, &a) < 0) {
        goto done;
    }
    pd_call_begin(&call, fn, a.group, 0, a.global_peer);
    if (pd_validate_only) {   // batch_isend_irecv's first pass: checks only, nothing posted
        ret = Py_NewRef(Py_None);
        goto done;
    }
    result = PyList_New(1);
    if (result == NULL) {
        goto done;
    }
    PyList_SET_ITEM(result, 0, Py_NewRef(args[0]));
    if (start(&a, is_recv, &req) < 0) {
        goto done;
    }
    PdOp op = pd_op(fn, a.group, a.peer);
    // parks the request (a receive as cancellable) if it fails
    ret = (PyObject *)pd_work_new(req, &op, (PyObject *)a.buf.arr, result, is_recv);
done:
    pd_call_end(&call, ret, a.buf.nbytes);
    Py_XDECREF(result);
    pd_buf_release(&a.buf);
    return ret;
}

// _C.isend(tensor, dst, tag, group) -> Work
PyObject *pd_isend(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return start_async(args, nargs, 0);
}

// _C.irecv(tensor, src, tag, group) -> Work; src None: any source
PyObject *pd_irecv(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return start_async(args, nargs, 1);
}
