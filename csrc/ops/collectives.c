/*
 * collectives.c: every collective of torch.distributed, over MPI, on the arrays' own memory.
 *
 * Each call validates everything with the GIL held, starts MPI's nonblocking collective, and then
 * either waits for it (pd_op_wait: interruptible, yields the core, honours the session's timeout) or hands
 * the request to a Work (async_op=True) that owns the arrays until the operation completes. Small
 * messages (pd_persist_wanted, decided from sizes every rank shares) of barrier, broadcast, all_reduce,
 * reduce, all_gather_into_tensor and reduce_scatter(_tensor) run
 * instead as cached persistent requests on staging buffers (persistent.c): MPICH builds a schedule for
 * every nonblocking call, and for a small message that is most of its cost.
 *
 * In place where torch is: all_reduce, broadcast and reduce (on dst) write into `tensor`. AVG is
 * SUM followed by a division by the group size, done on completion. List forms (all_gather, gather,
 * scatter, all_to_all) move each rank's block straight into or out of the listed arrays, as bytes
 * at displacements from the lowest array (pd_buflist_get); only reduce_scatter's list form copies,
 * because MPI reductions need one contiguous input.
 *
 * all_reduce(algorithm="ring") runs our own ring (csrc/paths/algorithms/ring.c) instead of MPI's, on the
 * group's private communicator with a tag of its own (pd_group_algo_comm), one step at a time.
 *
 * pd_validate_only (PYDIST_DEBUG=DETAIL) makes every collective of the calling thread return right
 * after its argument checks, so that debug.py can raise local argument errors before its cross-rank
 * comparison. It is thread-local: another thread's collective must not silently become a no-op.
 *
 * Each call describes itself once, as every path would take it (PdRoute), and route.c's one table picks
 * the path: the shared-memory slots, the persistent cache, all_reduce's ring and large shared-memory
 * all-reduce, or MPI's nonblocking call.
 *
 * The timeline and the stall inspector (calls.c) see each call from its checks to its return:
 * pd_call_begin once the arguments are valid, pd_call_end at `done:` on every way out, with the bytes
 * of this rank's larger side (nccl-tests' convention: an all-gather counts its output, a reduce-scatter
 * and an all-to-all their input, gather and scatter the list on the root and the one array elsewhere).
 * The path that takes the call names itself in pd_call_path on the way.
 */
#include "ops/collectives.h"

#include "core/buffer.h"
#include "core/dtypes.h"
#include "core/errors.h"
#include "groups/group.h"
#include "observe/calls.h"
#include "paths/persistent.h"
#include "paths/request.h"
#include "paths/ring_path.h"
#include "ops/route.h"
#include "paths/shared_memory.h"


// A call whose checks failed before pd_call_begin: pd_call_end at `done:` has nothing to end (calls.c
// records nothing for a skipped call, and leaves the stall inspector's board alone).
#define CALL_NOT_BEGUN {.skip = 1}

static long long larger(long long a, long long b) {
    return a > b ? a : b;
}

// ---------------------------------------------------------------------------------------------------
// Shared plumbing

// The last two positional arguments of every collective: (group, async_op).
static MPI_Comm *group_and_async(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, const char *fn,
                                 long *group, int *async_op) {
    if (pd_check_nargs(nargs, want, fn) < 0 || pd_arg_long(args[want - 2], fn, "group", group) < 0 ||
        pd_arg_bool(args[want - 1], fn, "async_op", async_op) < 0) {
        return NULL;
    }
    return pd_group_comm(*group, fn);
}

// A tuple (a, b) of two owners, for operations with an input and an output.
static PyObject *pair(PdBuf *a, PdBuf *b) {
    return PyTuple_Pack(2, (PyObject *)a->arr, (PyObject *)b->arr);
}

static PdPersistKey persist_key(int kind, long group, MPI_Count count, MPI_Datatype type, size_t extent, MPI_Op op,
                                int root) {
    return (PdPersistKey){kind, count, type, extent, op, root, pd_group_rank(group), pd_group_size(group)};
}

// AVG's division on completion, for a persistent call whose result is `out`.
static void persist_avg(PdPersistCall *call, long op, long group, const PdBuf *out) {
    if (op == PD_OP_AVG) {
        call->avg_divisor = pd_group_size(group);
        call->avg_dtype = out->dtype;
        call->avg_count = out->count;
    }
}

// A collective as every path would take it (route.h): automatic, its slots' form tried first, its header
// through the slots on a group whose calls put them there; the caller fills in the rest.
static PdRoute route(const char *fn, long group, MPI_Comm comm, int async_op, PyObject *keep, PyObject *result) {
    return (PdRoute){.fn = fn, .group = group, .comm = comm, .async_op = async_op, .algorithm = PD_ROUTE_AUTO,
                     .small_first = 1, .headers_ok = 1, .keep = keep, .result = result};
}

// ---------------------------------------------------------------------------------------------------
// barrier, broadcast, all_reduce, reduce

// _C.barrier(group, async_op) -> None | Work
PyObject *pd_barrier(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long group;
    int async_op;
    PdCall call;
    PyObject *ret = NULL;
    MPI_Comm *comm = group_and_async(args, nargs, 2, "barrier", &group, &async_op);
    if (comm == NULL) {
        return NULL;
    }
    pd_call_begin(&call, "barrier", group, 1, -1);
    if (pd_validate_only) {   // PYDIST_DEBUG=DETAIL: checks only, nothing sent
        ret = Py_NewRef(Py_None);
        goto done;
    }
    PdRoute r = route("barrier", group, *comm, async_op, NULL, NULL);
    r.small = (SmallCall){SMALL_BARRIER, SHM_U8, 0, -1, 0, 1, NULL, NULL, 0, NULL, NULL};
    r.headers_ok = 0;   // the slots take every barrier where the group has them
    r.persist_ok = 1;
    r.persist_key = persist_key(PD_PERSIST_BARRIER, group, 0, MPI_BYTE, 1, MPI_OP_NULL, -1);
    r.mpi = (PdMpiCall){.kind = PD_MPI_BARRIER, .name = "MPI_Ibarrier", .type = MPI_BYTE, .op = MPI_OP_NULL, .root = -1};
    ret = pd_route(&r);
done:
    pd_call_end(&call, ret, 0);
    return ret;
}

// _C.broadcast(tensor, src, group, async_op) -> None | Work. src is a global rank.
PyObject *pd_broadcast(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *fn = "broadcast";
    long src, group;
    int async_op, root;
    PdBuf buf = {0};
    PdCall call;
    PyObject *ret = NULL;
    MPI_Comm *comm = group_and_async(args, nargs, 4, fn, &group, &async_op);
    if (comm == NULL || pd_arg_long(args[1], fn, "src", &src) < 0 ||
        (root = pd_group_peer(group, src, fn, "src", 1)) < 0) {
        return NULL;
    }
    // Only the receivers write; the root may broadcast from a read-only array.
    if (pd_buf_get(args[0], fn, "tensor", root != pd_group_rank(group), &buf) < 0) {
        return NULL;
    }
    pd_call_begin(&call, fn, group, 1, -1);
    if (pd_validate_only) {   // PYDIST_DEBUG=DETAIL: checks only, nothing sent
        ret = Py_NewRef(Py_None);
        goto done;
    }
    int is_root = root == pd_group_rank(group);
    // As bytes, as below: ranks may hold different dtypes of one size.
    SmallCall small = {SMALL_BCAST, SHM_U8, 0, root, (int64_t)buf.nbytes, 1, is_root ? buf.data : NULL,
                       is_root ? NULL : buf.data, 0, NULL, NULL};
    PdRoute r = route(fn, group, *comm, async_op, (PyObject *)buf.arr, args[0]);
    r.small = small;
    r.persist_ok = 1;   // as bytes: the same key whatever dtype each rank holds
    r.persist_bytes = (size_t)buf.nbytes;
    r.persist_key = persist_key(PD_PERSIST_BCAST, group, buf.nbytes, MPI_BYTE, 1, MPI_OP_NULL, root);
    r.persist_call = (PdPersistCall){is_root ? buf.data : NULL, is_root ? (size_t)buf.nbytes : 0,
                                     is_root ? NULL : buf.data, is_root ? 0 : (size_t)buf.nbytes, 0, NULL, 0};
    r.mpi = (PdMpiCall){PD_MPI_BCAST, "MPI_Ibcast_c", NULL, 0, NULL, NULL, buf.data, buf.nbytes, NULL, NULL, MPI_BYTE,
                        MPI_OP_NULL, root};
    ret = pd_route(&r);
done:
    pd_call_end(&call, ret, buf.nbytes);
    pd_buf_release(&buf);
    return ret;
}

// all_reduce's `algorithm` (pydist maps the names; route.h's PD_ROUTE_*): MPI's own, our ring
// (csrc/paths/algorithms/ring.h), our shared-memory all-reduce (shared_memory.c), or automatic: on a group
// whose ranks share a node, the small collectives up to pd_shm_small_bytes, shm from PD_SHM_AUTO_BYTES up
// when every rank's array is in the segment (decided inside, from what every rank publishes) and for any
// array from PD_SHM_AUTO_COPY_BYTES up (from PD_SHM_AUTO_BYTES when the ranks outnumber the cores); else
// MPI's.
// _C.all_reduce(tensor, op, group, async_op[, algorithm]) -> None | Work. In place. algorithm: 0 MPI's
// MPI_Iallreduce, 1 our ring, 2 our shared-memory all-reduce, 3 automatic (the default).
PyObject *pd_all_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *fn = "all_reduce";
    long op, group, algorithm = PD_ROUTE_AUTO;
    int async_op;
    PdBuf buf = {0};
    MPI_Op mop;
    PdCall call = CALL_NOT_BEGUN;
    PyObject *ret = NULL;
    if (nargs == 5) {
        if (pd_arg_long(args[4], fn, "algorithm", &algorithm) < 0) {
            return NULL;
        }
        if (algorithm < PD_ROUTE_MPI || algorithm > PD_ROUTE_AUTO) {
            PyErr_Format(PyExc_ValueError, "all_reduce(): `algorithm` must be 0 (MPI), 1 (ring), 2 (shm) or 3 "
                         "(automatic); got %ld", algorithm);
            return NULL;
        }
        nargs = 4;
    } else if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "%s() takes 4 or 5 arguments (%zd given)", fn, nargs);
        return NULL;
    }
    MPI_Comm *comm = group_and_async(args, nargs, 4, fn, &group, &async_op);
    if (comm == NULL || pd_arg_op(args[1], fn, &op) < 0 ||
        pd_buf_get(args[0], fn, "tensor", 1, &buf) < 0) {
        return NULL;
    }
    if (pd_op_resolve(op, buf.dtype, fn, &mop) < 0) {
        goto done;
    }
    pd_call_begin(&call, fn, group, 1, -1);
    if (pd_validate_only) {   // PYDIST_DEBUG=DETAIL: checks only, nothing sent
        ret = Py_NewRef(Py_None);
        goto done;
    }
    // Automatic: a size the small collectives take goes there; larger ones to shm or MPI's, chosen after
    // every rank's header has matched (shared_memory.c). algorithm="mpi" is MPI's own all-reduce on the
    // group's communicator, asked for by name (route.c).
    PdRoute r = route(fn, group, *comm, async_op, (PyObject *)buf.arr, args[0]);
    r.algorithm = (int)algorithm;
    r.tensor = args[0], r.buf = &buf, r.op = op, r.mop = mop;
    r.small = (SmallCall){SMALL_ALLREDUCE, pd_shm_dtype(&buf), (int)op, -1, (int64_t)buf.count,
                          (size_t)PyArray_ITEMSIZE(buf.arr), buf.data, buf.data, 0, NULL, NULL};
    r.persist_ok = 1;
    r.persist_bytes = (size_t)buf.nbytes;
    r.persist_key = persist_key(PD_PERSIST_ALLREDUCE, group, buf.count, buf.dtype->mpi,
                                (size_t)PyArray_ITEMSIZE(buf.arr), mop, -1);
    r.persist_call = (PdPersistCall){buf.data, (size_t)buf.nbytes, buf.data, (size_t)buf.nbytes, 0, NULL, 0};
    persist_avg(&r.persist_call, op, group, &buf);
    r.mpi = (PdMpiCall){PD_MPI_ALLREDUCE, "MPI_Iallreduce_c", MPI_IN_PLACE, 0, NULL, NULL, buf.data, buf.count, NULL,
                        NULL, buf.dtype->mpi, mop, -1};
    r.avg = op == PD_OP_AVG ? &buf : NULL;
    ret = pd_route(&r);
done:
    pd_call_end(&call, ret, buf.nbytes);
    pd_buf_release(&buf);
    return ret;
}

// _C.reduce(tensor, dst, op, group, async_op) -> None | Work. The result lands in `tensor` on dst
// only; the other ranks' arrays are left as they were (MPI only reads them).
PyObject *pd_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *fn = "reduce";
    long dst, op, group;
    int async_op, root;
    PdBuf buf = {0};
    MPI_Op mop;
    PdCall call = CALL_NOT_BEGUN;
    PyObject *ret = NULL;
    MPI_Comm *comm = group_and_async(args, nargs, 5, fn, &group, &async_op);
    if (comm == NULL || pd_arg_long(args[1], fn, "dst", &dst) < 0 || pd_arg_op(args[2], fn, &op) < 0 ||
        (root = pd_group_peer(group, dst, fn, "dst", 1)) < 0) {
        return NULL;
    }
    int is_root = root == pd_group_rank(group);
    if (pd_buf_get(args[0], fn, "tensor", is_root, &buf) < 0) {
        return NULL;
    }
    if (pd_op_resolve(op, buf.dtype, fn, &mop) < 0) {
        goto done;
    }
    pd_call_begin(&call, fn, group, 1, -1);
    if (pd_validate_only) {   // PYDIST_DEBUG=DETAIL: checks only, nothing sent
        ret = Py_NewRef(Py_None);
        goto done;
    }
    SmallCall small = {SMALL_REDUCE, pd_shm_dtype(&buf), (int)op, root, (int64_t)buf.count,
                       (size_t)PyArray_ITEMSIZE(buf.arr), buf.data, is_root ? buf.data : NULL, 0, NULL, NULL};
    PdRoute r = route(fn, group, *comm, async_op, (PyObject *)buf.arr, args[0]);
    r.small = small;
    r.persist_ok = 1;
    r.persist_bytes = (size_t)buf.nbytes;
    r.persist_key = persist_key(PD_PERSIST_REDUCE, group, buf.count, buf.dtype->mpi, (size_t)PyArray_ITEMSIZE(buf.arr),
                                mop, root);
    r.persist_call = (PdPersistCall){buf.data, (size_t)buf.nbytes, is_root ? buf.data : NULL,
                                     is_root ? (size_t)buf.nbytes : 0, 0, NULL, 0};
    if (is_root) {
        persist_avg(&r.persist_call, op, group, &buf);
    }
    r.mpi = (PdMpiCall){PD_MPI_REDUCE, "MPI_Ireduce_c", is_root ? MPI_IN_PLACE : buf.data, buf.count, NULL, NULL,
                        is_root ? buf.data : NULL, 0, NULL, NULL, buf.dtype->mpi, mop, root};
    r.avg = (op == PD_OP_AVG && is_root) ? &buf : NULL;
    ret = pd_route(&r);
done:
    pd_call_end(&call, ret, buf.nbytes);
    pd_buf_release(&buf);
    return ret;
}

// ---------------------------------------------------------------------------------------------------
// Gathers

// _C.all_gather_into_tensor(output, input, group, async_op): output holds the group's inputs one after
// another, in group rank order (output.size == input.size * group size). `input` may be this rank's
// own slot of `output` (torch's in-place form).
PyObject *pd_all_gather_into_tensor(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *fn = "all_gather_into_tensor";
    long group;
    int async_op;
    PdBuf out = {0}, in = {0};
    PdCall call = CALL_NOT_BEGUN;
    PyObject *ret = NULL, *keep = NULL;
    MPI_Comm *comm = group_and_async(args, nargs, 4, fn, &group, &async_op);
    if (comm == NULL || pd_buf_get(args[0], fn, "output_tensor", 1, &out) < 0) {
        return NULL;
    }
    if (pd_buf_get(args[1], fn, "input_tensor", 0, &in) < 0) {
        goto done;
    }
    int size = pd_group_size(group), rank = pd_group_rank(group);
    // out == in x size, by division: the product could overflow
    if (in.dtype != out.dtype || out.count % size != 0 || out.count / size != in.count) {
        PyErr_Format(PyExc_ValueError, "%s(): `output_tensor` must be %s with %d x %lld elements (group size "
                     "x input); got %s with %lld", fn, in.dtype->name, size, (long long)in.count,
                     out.dtype->name, (long long)out.count);
        goto done;
    }
    int in_place = (char *)in.data == (char *)out.data + (Py_ssize_t)rank * in.nbytes;
    if ((keep = pair(&out, &in)) == NULL) {
        goto done;
    }
    pd_call_begin(&call, fn, group, 1, -1);
    if (pd_validate_only) {   // PYDIST_DEBUG=DETAIL: checks only, nothing sent
        ret = Py_NewRef(Py_None);
        goto done;
    }
    // The staging copy makes the in-place form no different (here as below).
    SmallCall small = {SMALL_ALLGATHER, SHM_U8, 0, -1, (int64_t)in.nbytes, 1, in.data, out.data, 0, NULL, NULL};
    PdRoute r = route(fn, group, *comm, async_op, keep, args[0]);
    r.small = small;
    r.persist_ok = pd_persist_allgather_ok;
    r.persist_bytes = (size_t)out.nbytes;
    r.persist_key = persist_key(PD_PERSIST_ALLGATHER, group, in.nbytes, MPI_BYTE, 1, MPI_OP_NULL, -1);
    r.persist_call = (PdPersistCall){in.data, (size_t)in.nbytes, out.data, (size_t)out.nbytes, 0, NULL, 0};
    r.mpi = (PdMpiCall){PD_MPI_ALLGATHER, "MPI_Iallgather_c", in_place ? MPI_IN_PLACE : in.data, in.nbytes, NULL, NULL,
                        out.data, in.nbytes, NULL, NULL, MPI_BYTE, MPI_OP_NULL, -1};
    ret = pd_route(&r);
done:
    pd_call_end(&call, ret, out.nbytes);
    Py_XDECREF(keep);
    pd_buf_release(&out);
    pd_buf_release(&in);
    return ret;
}

// _C.all_gather(tensor_list, tensor, group, async_op): tensor_list[i] receives group rank i's tensor.
PyObject *pd_all_gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *fn = "all_gather";
    long group;
    int async_op;
    PdBuf in = {0};
    PdBufList outs = {0};
    PdCall call = CALL_NOT_BEGUN;
    PyObject *ret = NULL, *keep = NULL;
    MPI_Comm *comm = group_and_async(args, nargs, 4, fn, &group, &async_op);
    if (comm == NULL || pd_buf_get(args[1], fn, "tensor", 0, &in) < 0) {
        return NULL;
    }
    if (pd_buflist_get(args[0], pd_group_size(group), fn, "tensor_list", 1, &in, &outs) < 0) {
        goto done;
    }
    if ((keep = PyTuple_Pack(2, outs.keep, (PyObject *)in.arr)) == NULL) {
        goto done;
    }
    pd_call_begin(&call, fn, group, 1, -1);
    if (pd_validate_only) {   // PYDIST_DEBUG=DETAIL: checks only, nothing sent
        ret = Py_NewRef(Py_None);
        goto done;
    }
    // A kind of its own: past the small bound its MPI call (allgatherv) is not all_gather_into_tensor's.
    SmallCall small = {SMALL_ALLGATHER_LIST, SHM_U8, 0, -1, (int64_t)in.nbytes, 1, in.data, outs.base, 0, NULL,
                       outs.displs};
    PdRoute r = route(fn, group, *comm, async_op, keep, args[0]);
    r.small = small;
    r.mpi = (PdMpiCall){PD_MPI_ALLGATHERV, "MPI_Iallgatherv_c", in.data, in.nbytes, NULL, NULL, outs.base, 0,
                        outs.counts, outs.displs, MPI_BYTE, MPI_OP_NULL, -1};
    ret = pd_route(&r);
done:
    pd_call_end(&call, ret, (long long)outs.n * in.nbytes);
    Py_XDECREF(keep);
    pd_buflist_release(&outs);
    pd_buf_release(&in);
    return ret;
}

// _C.gather(tensor, gather_list or None, dst, group, async_op): on dst, gather_list[i] receives group
// rank i's tensor; other ranks pass None.
PyObject *pd_gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *fn = "gather";
    long dst, group;
    int async_op, root;
    PdBuf in = {0};
    PdBufList outs = {0};
    PdCall call = CALL_NOT_BEGUN;
    PyObject *ret = NULL, *keep = NULL;
    MPI_Comm *comm = group_and_async(args, nargs, 5, fn, &group, &async_op);
    if (comm == NULL || pd_arg_long(args[2], fn, "dst", &dst) < 0 ||
        (root = pd_group_peer(group, dst, fn, "dst", 1)) < 0 || pd_buf_get(args[0], fn, "tensor", 0, &in) < 0) {
        return NULL;
    }
    int is_root = root == pd_group_rank(group);
    if (is_root != (args[1] != Py_None)) {
        PyErr_Format(PyExc_ValueError, is_root ? "%s(): `gather_list` is required on the destination rank"
                                               : "%s(): `gather_list` must be None on ranks other than dst", fn);
        goto done;
    }
    if (is_root) {
        if (pd_buflist_get(args[1], pd_group_size(group), fn, "gather_list", 1, &in, &outs) < 0 ||
            (keep = PyTuple_Pack(2, outs.keep, (PyObject *)in.arr)) == NULL) {
            goto done;
        }
    } else {
        keep = Py_NewRef((PyObject *)in.arr);
    }
    pd_call_begin(&call, fn, group, 1, -1);
    if (pd_validate_only) {   // PYDIST_DEBUG=DETAIL: checks only, nothing sent
        ret = Py_NewRef(Py_None);
        goto done;
    }
    // outs: empty but on the root
    SmallCall small = {SMALL_GATHER, SHM_U8, 0, root, (int64_t)in.nbytes, 1, in.data, outs.base, 0, NULL,
                       outs.displs};
    PdRoute r = route(fn, group, *comm, async_op, keep, is_root ? args[1] : NULL);
    r.small = small;
    r.mpi = (PdMpiCall){PD_MPI_GATHERV, "MPI_Igatherv_c", in.data, in.nbytes, NULL, NULL, outs.base, 0, outs.counts,
                        outs.displs, MPI_BYTE, MPI_OP_NULL, root};
    ret = pd_route(&r);
done:
    pd_call_end(&call, ret, larger(in.nbytes, (long long)outs.n * in.nbytes));   // outs: the root's
    Py_XDECREF(keep);
    pd_buflist_release(&outs);
    pd_buf_release(&in);
    return ret;
}

// _C.scatter(tensor, scatter_list or None, src, group, async_op): group rank i receives
// scatter_list[i] of src into `tensor`; other ranks pass None.
PyObject *pd_scatter(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *fn = "scatter";
    long src, group;
    int async_op, root;
    PdBuf out = {0};
    PdBufList ins = {0};
    PdCall call = CALL_NOT_BEGUN;
    PyObject *ret = NULL, *keep = NULL;
    MPI_Comm *comm = group_and_async(args, nargs, 5, fn, &group, &async_op);
    if (comm == NULL || pd_arg_long(args[2], fn, "src", &src) < 0 ||
        (root = pd_group_peer(group, src, fn, "src", 1)) < 0 || pd_buf_get(args[0], fn, "tensor", 1, &out) < 0) {
        return NULL;
    }
    int is_root = root == pd_group_rank(group);
    if (is_root != (args[1] != Py_None)) {
        PyErr_Format(PyExc_ValueError, is_root ? "%s(): `scatter_list` is required on the source rank"
                                               : "%s(): `scatter_list` must be None on ranks other than src", fn);
        goto done;
    }
    if (is_root) {
        if (pd_buflist_get(args[1], pd_group_size(group), fn, "scatter_list", 0, &out, &ins) < 0 ||
            (keep = PyTuple_Pack(2, ins.keep, (PyObject *)out.arr)) == NULL) {
            goto done;
        }
    } else {
        keep = Py_NewRef((PyObject *)out.arr);
    }
    pd_call_begin(&call, fn, group, 1, -1);
    if (pd_validate_only) {   // PYDIST_DEBUG=DETAIL: checks only, nothing sent
        ret = Py_NewRef(Py_None);
        goto done;
    }
    // ins: empty but on the root
    SmallCall small = {SMALL_SCATTER, SHM_U8, 0, root, (int64_t)out.nbytes, 1, ins.base, out.data, 0, ins.displs,
                       NULL};
    PdRoute r = route(fn, group, *comm, async_op, keep, args[0]);
    r.small = small;
    r.mpi = (PdMpiCall){PD_MPI_SCATTERV, "MPI_Iscatterv_c", ins.base, 0, ins.counts, ins.displs, out.data, out.nbytes,
                        NULL, NULL, MPI_BYTE, MPI_OP_NULL, root};
    ret = pd_route(&r);
done:
    pd_call_end(&call, ret, larger(out.nbytes, (long long)ins.n * out.nbytes));   // ins: the root's
    Py_XDECREF(keep);
    pd_buflist_release(&ins);
    pd_buf_release(&out);
    return ret;
}

// ---------------------------------------------------------------------------------------------------
// Reduce-scatter

// Start the reduce-scatter (op resolved as mop) from `in` (group size x out.count elements) into
// `out`: the slots, the persistent cache or MPI_Ireduce_scatter_block. The caller has begun the call.
static PyObject *reduce_scatter_start(const char *fn, PdBuf *out, void *in_data, PyObject *keep, long op,
                                      MPI_Op mop, long group, int async_op, MPI_Comm comm, PyObject *result) {
    if (pd_validate_only) {   // PYDIST_DEBUG=DETAIL: checks only, nothing sent
        Py_RETURN_NONE;
    }
    int size = pd_group_size(group);
    PdRoute r = route(fn, group, comm, async_op, keep, result);
    r.small = (SmallCall){SMALL_REDUCE_SCATTER, pd_shm_dtype(out), (int)op, -1, (int64_t)out->count,
                          (size_t)PyArray_ITEMSIZE(out->arr), in_data, out->data, 0, NULL, NULL};
    r.persist_ok = 1;
    r.persist_bytes = (size_t)out->nbytes * (size_t)size;   // the input's size, as the sweep counts
    r.persist_key = persist_key(PD_PERSIST_REDUCE_SCATTER, group, out->count, out->dtype->mpi,
                                (size_t)PyArray_ITEMSIZE(out->arr), mop, -1);
    r.persist_call = (PdPersistCall){in_data, (size_t)out->nbytes * (size_t)size, out->data, (size_t)out->nbytes, 0,
                                     NULL, 0};
    persist_avg(&r.persist_call, op, group, out);
    r.mpi = (PdMpiCall){PD_MPI_REDUCE_SCATTER_BLOCK, "MPI_Ireduce_scatter_block_c", in_data, 0, NULL, NULL, out->data,
                        out->count, NULL, NULL, out->dtype->mpi, mop, -1};
    r.avg = op == PD_OP_AVG ? out : NULL;
    return pd_route(&r);
}

// _C.reduce_scatter_tensor(output, input, op, group, async_op): input holds group-size blocks of
// output's size; rank i gets the reduction of every rank's block i.
PyObject *pd_reduce_scatter_tensor(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *fn = "reduce_scatter_tensor";
    long op, group;
    int async_op;
    PdBuf out = {0}, in = {0};
    MPI_Op mop;
    PdCall call = CALL_NOT_BEGUN;
    PyObject *ret = NULL, *keep = NULL;
    MPI_Comm *comm = group_and_async(args, nargs, 5, fn, &group, &async_op);
    if (comm == NULL || pd_arg_op(args[2], fn, &op) < 0 || pd_buf_get(args[0], fn, "output", 1, &out) < 0) {
        return NULL;
    }
    if (pd_buf_get(args[1], fn, "input", 0, &in) < 0) {
        goto done;
    }
    int size = pd_group_size(group);
    // in == out x size, by division: the product could overflow
    if (in.dtype != out.dtype || in.count % size != 0 || in.count / size != out.count) {
        PyErr_Format(PyExc_ValueError, "%s(): `input` must be %s with %d x %lld elements (group size x output); "
                     "got %s with %lld", fn, out.dtype->name, size, (long long)out.count, in.dtype->name,
                     (long long)in.count);
        goto done;
    }
    if ((keep = pair(&out, &in)) == NULL || pd_op_resolve(op, out.dtype, fn, &mop) < 0) {
        goto done;
    }
    pd_call_begin(&call, fn, group, 1, -1);
    ret = reduce_scatter_start(fn, &out, in.data, keep, op, mop, group, async_op, *comm, args[0]);
done:
    pd_call_end(&call, ret, in.nbytes);
    Py_XDECREF(keep);
    pd_buf_release(&out);
    pd_buf_release(&in);
    return ret;
}

// _C.reduce_scatter(output, input_list, op, group, async_op): rank i gets the reduction of every
// rank's input_list[i]. MPI reduces one contiguous buffer, so the list is copied into one first.
PyObject *pd_reduce_scatter(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *fn = "reduce_scatter";
    long op, group;
    int async_op;
    PdBuf out = {0};
    PdBufList ins = {0};
    MPI_Op mop;
    PdCall call = CALL_NOT_BEGUN;
    PyObject *ret = NULL, *keep = NULL, *packed = NULL;
    MPI_Comm *comm = group_and_async(args, nargs, 5, fn, &group, &async_op);
    if (comm == NULL || pd_arg_op(args[2], fn, &op) < 0 || pd_buf_get(args[0], fn, "output", 1, &out) < 0) {
        return NULL;
    }
    int size = pd_group_size(group);
    if (pd_buflist_get(args[1], size, fn, "input_list", 0, &out, &ins) < 0) {
        goto done;
    }
    npy_intp total = (npy_intp)out.count * size;
    packed = PyArray_SimpleNewFromDescr(1, &total, (Py_INCREF(PyArray_DESCR(out.arr)), PyArray_DESCR(out.arr)));
    if (packed == NULL) {
        goto done;
    }
    for (int i = 0; i < size; i++) {
        memcpy((char *)PyArray_DATA((PyArrayObject *)packed) + (Py_ssize_t)i * out.nbytes, ins.bufs[i].data,
               out.nbytes);
    }
    if ((keep = PyTuple_Pack(2, (PyObject *)out.arr, packed)) == NULL ||
        pd_op_resolve(op, out.dtype, fn, &mop) < 0) {
        goto done;
    }
    pd_call_begin(&call, fn, group, 1, -1);
    ret = reduce_scatter_start(fn, &out, PyArray_DATA((PyArrayObject *)packed), keep, op, mop, group, async_op,
                               *comm, args[0]);
done:
    pd_call_end(&call, ret, (long long)ins.n * out.nbytes);
    Py_XDECREF(keep);
    Py_XDECREF(packed);
    pd_buflist_release(&ins);
    pd_buf_release(&out);
    return ret;
}

// ---------------------------------------------------------------------------------------------------
// All-to-all

// Row sizes for all_to_all_single: `splits` over dimension 0 of `b`, as byte counts and
// displacements into counts/displs. None or an empty sequence means equal rows (as in torch).
// Otherwise a sequence of one int per rank: Python ints or NumPy integers (anything with __index__
// but bool, as torch's int arguments take), each checked against the rows not yet assigned, so no
// sum or product can overflow: every count and displacement is at most the array's own byte size.
// Returns -1 with TypeError/ValueError on bad splits, before anything is sent.
static int split_bytes(PyObject *splits, const PdBuf *b, int size, const char *fn, const char *arg,
                       const char *splits_name, MPI_Count *counts, MPI_Aint *displs) {
    int nd = PyArray_NDIM(b->arr);
    if (nd == 0) {
        PyErr_Format(PyExc_ValueError, "%s(): `%s` must have at least one dimension", fn, arg);
        return -1;
    }
    npy_intp rows = PyArray_DIM(b->arr, 0);
    // From the array's own size: with 0 rows the other dimensions may multiply past any integer.
    Py_ssize_t row_bytes = rows > 0 ? b->nbytes / rows : 0;
    PyObject *seq = NULL;
    if (splits != Py_None) {
        if (!PySequence_Check(splits) || PyUnicode_Check(splits) || PyBytes_Check(splits) ||
            PyByteArray_Check(splits)) {
            PyErr_Format(PyExc_TypeError, "%s(): `%s` must be a list of ints or None; got %.100s", fn, splits_name,
                         Py_TYPE(splits)->tp_name);
            return -1;
        }
        if ((seq = PySequence_Tuple(splits)) == NULL) {  // a snapshot: __index__ below runs Python code
            return -1;
        }
        if (PyTuple_GET_SIZE(seq) == 0) {
            Py_CLEAR(seq);
        }
    }
    if (seq == NULL) {
        if (rows % size != 0) {
            PyErr_Format(PyExc_ValueError, "%s(): dimension 0 of `%s` (%zd) must divide evenly by the group "
                         "size %d when no split sizes are given", fn, arg, (Py_ssize_t)rows, size);
            return -1;
        }
        for (int i = 0; i < size; i++) {
            counts[i] = (MPI_Count)(rows / size) * row_bytes;
            displs[i] = (MPI_Aint)i * (MPI_Aint)counts[i];
        }
        return 0;
    }
    if (PyTuple_GET_SIZE(seq) != size) {
        PyErr_Format(PyExc_ValueError, "%s(): `%s` must have one entry per rank of the group (%d); got %zd", fn,
                     splits_name, size, PyTuple_GET_SIZE(seq));
        goto error;
    }
    npy_intp left = rows;  // rows not yet given to a rank
    for (int i = 0; i < size; i++) {
        PyObject *item = PyTuple_GET_ITEM(seq, i);
        if (PyBool_Check(item) || !PyIndex_Check(item)) {
            PyErr_Format(PyExc_TypeError, "%s(): `%s` must hold ints; got %.100s at index %d", fn, splits_name,
                         Py_TYPE(item)->tp_name, i);
            goto error;
        }
        PyObject *index = PyNumber_Index(item);
        if (index == NULL) {
            goto error;
        }
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
        Py_DECREF(index);
        if (v == -1 && PyErr_Occurred()) {
            goto error;
        }
        if (overflow || v < 0 || v > left) {
            PyErr_Format(PyExc_ValueError, "%s(): `%s` must be %d non-negative ints summing to dimension 0 of "
                         "`%s` (%zd); got %R", fn, splits_name, size, arg, (Py_ssize_t)rows, splits);
            goto error;
        }
        counts[i] = (MPI_Count)v * row_bytes;
        displs[i] = (MPI_Aint)(rows - left) * row_bytes;
        left -= (npy_intp)v;
    }
    if (left != 0) {
        PyErr_Format(PyExc_ValueError, "%s(): `%s` must be %d non-negative ints summing to dimension 0 of `%s` "
                     "(%zd); got %R", fn, splits_name, size, arg, (Py_ssize_t)rows, splits);
        goto error;
    }
    Py_DECREF(seq);
    return 0;
error:
    Py_DECREF(seq);
    return -1;
}

// Whether `counts`/`displs` (split_bytes's) are the blocks of no split sizes: `nbytes` in `size` equal
// blocks, in order.
static int even_blocks(const MPI_Count *counts, const MPI_Aint *displs, int size, Py_ssize_t nbytes) {
    for (int i = 0; i < size; i++) {
        if (counts[i] * size != nbytes || displs[i] != (MPI_Aint)i * (MPI_Aint)counts[i]) {
            return 0;
        }
    }
    return 1;
}

// _C.all_to_all_single(output, input, output_split_sizes, input_split_sizes, group, async_op):
// rank i's block j of input (rows along dimension 0) becomes rank j's block i of output.
PyObject *pd_all_to_all_single(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *fn = "all_to_all_single";
    long group;
    int async_op;
    PdBuf out = {0}, in = {0};
    PdCall call = CALL_NOT_BEGUN;
    PyObject *ret = NULL, *keep = NULL, *meta = NULL;
    MPI_Comm *comm = group_and_async(args, nargs, 6, fn, &group, &async_op);
    if (comm == NULL || pd_buf_get(args[0], fn, "output", 1, &out) < 0) {
        return NULL;
    }
    if (pd_buf_get(args[1], fn, "input", 0, &in) < 0) {
        goto done;
    }
    if (in.dtype != out.dtype) {
        PyErr_Format(PyExc_TypeError, "%s(): `output` and `input` must have one dtype; got %s and %s", fn,
                     out.dtype->name, in.dtype->name);
        goto done;
    }
    int size = pd_group_size(group);
    // counts and displacements for both sides, kept alive with the arrays until MPI completes
    meta = PyBytes_FromStringAndSize(NULL, 2 * (Py_ssize_t)size * (sizeof(MPI_Count) + sizeof(MPI_Aint)));
    if (meta == NULL) {
        goto done;
    }
    MPI_Count *rcounts = (MPI_Count *)PyBytes_AS_STRING(meta), *scounts = rcounts + size;
    MPI_Aint *rdispls = (MPI_Aint *)(scounts + size), *sdispls = rdispls + size;
    if (split_bytes(args[2], &out, size, fn, "output", "output_split_sizes", rcounts, rdispls) < 0 ||
        split_bytes(args[3], &in, size, fn, "input", "input_split_sizes", scounts, sdispls) < 0) {
        goto done;
    }
    // The one block this rank can check alone: the one it sends itself. Other blocks' sizes are the
    // peers' business (MPI reports a too-small receive as a truncation error).
    int rank = pd_group_rank(group);
    if (scounts[rank] != rcounts[rank]) {
        PyErr_Format(PyExc_ValueError, "%s(): this rank's block to itself must be as large in `output` as in "
                     "`input`; got %lld and %lld bytes (check the split sizes and the shapes)", fn,
                     (long long)rcounts[rank], (long long)scounts[rank]);
        goto done;
    }
    if ((keep = PyTuple_Pack(3, (PyObject *)out.arr, (PyObject *)in.arr, meta)) == NULL) {
        goto done;
    }
    pd_call_begin(&call, fn, group, 1, -1);
    if (pd_validate_only) {   // PYDIST_DEBUG=DETAIL: checks only, nothing sent
        ret = Py_NewRef(Py_None);
        goto done;
    }
    // Equal blocks (no split sizes, or split sizes that say the same) are the same size on every rank
    // that has them, and go through the slots when small; uneven ones are MPI's alltoallv, and their
    // header matches any count. When a rank's blocks are uneven, every rank's data takes MPI's path.
    int even = even_blocks(scounts, sdispls, size, in.nbytes) && even_blocks(rcounts, rdispls, size, out.nbytes);
    // Never the persistent cache: its key (an alltoall of equal blocks) cannot be known alike on a rank
    // whose blocks are uneven, whose alltoallv would then meet a cached alltoall and wait forever.
    PdRoute r = route(fn, group, *comm, async_op, keep, args[0]);
    r.small = (SmallCall){SMALL_ALLTOALL, SHM_U8, 0, -1, even ? (int64_t)(in.nbytes / size) : SMALL_UNEVEN, 1,
                          even ? in.data : NULL, even ? out.data : NULL, 0, NULL, NULL};
    r.small_first = 0;   // its header goes through the slots, and its data where it fits (pd_shm_header_run)
    r.mpi = (PdMpiCall){PD_MPI_ALLTOALLV, "MPI_Ialltoallv_c", in.data, 0, scounts, sdispls, out.data, 0, rcounts,
                        rdispls, MPI_BYTE, MPI_OP_NULL, -1};
    ret = pd_route(&r);
done:
    pd_call_end(&call, ret, larger(in.nbytes, out.nbytes));
    Py_XDECREF(keep);
    Py_XDECREF(meta);
    pd_buf_release(&out);
    pd_buf_release(&in);
    return ret;
}

// _C.set_validate_only(flag) -> old flag
PyObject *pd_set_validate_only(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int flag;
    if (pd_check_nargs(nargs, 1, "set_validate_only") < 0 ||
        pd_arg_bool(args[0], "set_validate_only", "flag", &flag) < 0) {
        return NULL;
    }
    int old = pd_validate_only;
    pd_validate_only = flag;
    return PyBool_FromLong(old);
}

// _C.all_to_all(output_list, input_list, group, async_op): rank i's input_list[j] becomes rank j's
// output_list[i]. Every array has the dtype and size of input_list[0].
PyObject *pd_all_to_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *fn = "all_to_all";
    long group;
    int async_op;
    PdBuf first = {0};
    PdBufList outs = {0}, ins = {0};
    PdCall call = CALL_NOT_BEGUN;
    PyObject *ret = NULL, *keep = NULL;
    MPI_Comm *comm = group_and_async(args, nargs, 4, fn, &group, &async_op);
    if (comm == NULL) {
        return NULL;
    }
    int size = pd_group_size(group);
    if ((PyList_Check(args[1]) || PyTuple_Check(args[1])) && PySequence_Size(args[1]) > 0) {
        PyObject *item = PySequence_GetItem(args[1], 0);
        int bad = item == NULL || pd_buf_get(item, fn, "input_tensor_list[0]", 0, &first) < 0;
        Py_XDECREF(item);
        if (bad) {
            return NULL;
        }
    } else {
        PyErr_Format(PyExc_ValueError, "%s(): `input_tensor_list` must be a list of %d arrays", fn, size);
        return NULL;
    }
    if (pd_buflist_get(args[1], size, fn, "input_tensor_list", 0, &first, &ins) < 0 ||
        pd_buflist_get(args[0], size, fn, "output_tensor_list", 1, &first, &outs) < 0) {
        goto done;
    }
    if ((keep = PyTuple_Pack(2, outs.keep, ins.keep)) == NULL) {
        goto done;
    }
    pd_call_begin(&call, fn, group, 1, -1);
    if (pd_validate_only) {   // PYDIST_DEBUG=DETAIL: checks only, nothing sent
        ret = Py_NewRef(Py_None);
        goto done;
    }
    // An all-to-all of equal blocks, as all_to_all_single's (whose MPI call it shares): through the slots
    // when small, with MPI's alltoallv to fall back on beside a rank whose blocks are uneven.
    PdRoute r = route(fn, group, *comm, async_op, keep, args[0]);
    r.small = (SmallCall){SMALL_ALLTOALL, SHM_U8, 0, -1, (int64_t)first.nbytes, 1, ins.base, outs.base, 0, ins.displs,
                          outs.displs};
    r.small_first = 0;   // as all_to_all_single's
    r.mpi = (PdMpiCall){PD_MPI_ALLTOALLV, "MPI_Ialltoallv_c", ins.base, 0, ins.counts, ins.displs, outs.base, 0,
                        outs.counts, outs.displs, MPI_BYTE, MPI_OP_NULL, -1};
    ret = pd_route(&r);
done:
    pd_call_end(&call, ret, (long long)ins.n * first.nbytes);
    Py_XDECREF(keep);
    pd_buflist_release(&outs);
    pd_buflist_release(&ins);
    pd_buf_release(&first);
    return ret;
}
