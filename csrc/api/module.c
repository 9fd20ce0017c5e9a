/*
 * module.c: the pydist._C extension module: its function table, exception types and constants.
 *
 * It imports NumPy's C API (core/numpy_api.c) before anything uses it. Multi-phase init (PEP 489), as in
 * CPython's Modules/xxlimited.c. The functions are positional with fixed signatures; keywords,
 * defaults, groups and warnings live in pydist/ (Python), and every function here re-validates what
 * it uses, so calling _C directly cannot crash the interpreter.
 */
#include "api/compress_py.h"
#include "api/engine_py.h"
#include "core/dtypes.h"
#include "core/errors.h"
#include "core/simd.h"
#include "groups/child.h"
#include "groups/group.h"
#include "observe/calls.h"
#include "ops/collectives.h"
#include "ops/p2p.h"
#include "paths/persistent.h"
#include "paths/private_comm.h"
#include "paths/ring_path.h"
#include "paths/shared_memory.h"
#include "paths/tuned.h"
#include "progress/progress.h"
#include "progress/wait.h"
#include "progress/work.h"
#include "session/session.h"

#define FAST(name, fn, doc) {name, (PyCFunction)(void (*)(void))fn, METH_FASTCALL, doc}

// simd_info() -> {"level": the instruction-set level every vector kernel runs at, "cpu": the widest
// this CPU runs} (simd.h)
static PyObject *simd_info(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return Py_BuildValue("{ssss}", "level", pd_simd_name(pd_simd_level()), "cpu", pd_simd_name(pd_simd_cpu_level()));
}

static PyMethodDef module_methods[] = {
    FAST("init", pd_init, "init(timeout_seconds, startup_seconds) -> (rank, size, thread_level)"),
    {"destroy", pd_destroy, METH_NOARGS, "destroy() -> None: free every group's communicator"},
    {"finalize", pd_finalize, METH_NOARGS, "finalize() -> None: MPI_Finalize, at interpreter exit"},
    FAST("abort", pd_abort, "abort(code): MPI_Abort(MPI_COMM_WORLD, code)"),
    FAST("start_and_abort", pd_start_and_abort,
         "start_and_abort(code, seconds): MPI_Init, then MPI_Abort (a rank that failed before starting MPI)"),
    {"forget_ranks", pd_forget_ranks, METH_O, "forget_ranks(world_ranks): the survivors go on without them "
                                             "(called by every survivor alike; exit skips MPI_Finalize)"},
    {"is_initialized", pd_is_initialized, METH_NOARGS, "is_initialized() -> bool"},
    FAST("set_timeout", pd_set_timeout, "set_timeout(seconds) -> old: the session's timeout (<= 0: none)"),
    FAST("set_group_timeout", pd_set_group_timeout,
         "set_group_timeout(group, seconds): the group's own timeout (0: none at all; < 0: the session's)"),
    {"mpi_info", pd_mpi_info, METH_NOARGS, "mpi_info() -> dict"},
    FAST("get_rank", pd_get_rank, "get_rank(group) -> int"),
    FAST("get_world_size", pd_get_world_size, "get_world_size(group) -> int"),
    FAST("send", pd_send, "send(tensor, dst, tag, group) -> None"),
    FAST("recv", pd_recv, "recv(tensor, src, tag, group) -> int (src None: any source)"),
    FAST("isend", pd_isend, "isend(tensor, dst, tag, group) -> Work"),
    FAST("irecv", pd_irecv, "irecv(tensor, src, tag, group) -> Work"),
    FAST("barrier", pd_barrier, "barrier(group, async_op) -> None | Work"),
    FAST("broadcast", pd_broadcast, "broadcast(tensor, src, group, async_op) -> None | Work"),
    FAST("all_reduce", pd_all_reduce,
         "all_reduce(tensor, op, group, async_op[, algorithm 0 MPI, 1 ring, 2 shm, 3 auto]) -> None | Work"),
    FAST("shm_empty", pd_shm_empty, "shm_empty(shape, dtype, zero) -> ndarray in this rank's shared segment"),
    {"shm_info", pd_shm_info, METH_NOARGS, "shm_info() -> dict: the shared segment, or why there is none"},
    FAST("set_shm_small_bytes", pd_set_shm_small_bytes,
         "set_shm_small_bytes(n) -> old: small collectives in shared memory up to n bytes per rank (0: off)"),
    {"set_path_table", pd_set_path_table, METH_O,
     "set_path_table(rows | None): the path table, rows (ranks, op, path, upto); init shares world rank 0's"},
    {"path_table_unusable", pd_path_table_unusable, METH_O,
     "path_table_unusable(message): no table, and why the one named cannot be used (init raises world rank 0's)"},
    {"path_table", pd_path_table, METH_NOARGS, "path_table() -> [(ranks, op, path, upto)]: the table in use"},
    FAST("reduce", pd_reduce, "reduce(tensor, dst, op, group, async_op) -> None | Work"),
    FAST("all_gather_into_tensor", pd_all_gather_into_tensor,
         "all_gather_into_tensor(output, input, group, async_op) -> None | Work"),
    FAST("all_gather", pd_all_gather, "all_gather(tensor_list, tensor, group, async_op) -> None | Work"),
    FAST("gather", pd_gather, "gather(tensor, gather_list|None, dst, group, async_op) -> None | Work"),
    FAST("scatter", pd_scatter, "scatter(tensor, scatter_list|None, src, group, async_op) -> None | Work"),
    FAST("reduce_scatter_tensor", pd_reduce_scatter_tensor,
         "reduce_scatter_tensor(output, input, op, group, async_op) -> None | Work"),
    FAST("reduce_scatter", pd_reduce_scatter, "reduce_scatter(output, input_list, op, group, async_op)"),
    FAST("all_to_all_single", pd_all_to_all_single,
         "all_to_all_single(output, input, out_splits|None, in_splits|None, group, async_op)"),
    FAST("all_to_all", pd_all_to_all, "all_to_all(output_list, input_list, group, async_op)"),
    FAST("set_validate_only", pd_set_validate_only, "set_validate_only(flag) -> old flag (PYDIST_DEBUG=DETAIL)"),
    FAST("new_group", pd_new_group, "new_group(sorted_ranks[, members_only]) -> handle, or -1 on non-members"),
    FAST("destroy_group", pd_destroy_group, "destroy_group(handle) -> None"),
    {"live_groups", pd_live_groups, METH_NOARGS, "live_groups() -> number of communicators held"},
    {"parent_rank", pd_parent_rank, METH_NOARGS,
     "parent_rank() -> None, or in a process forked from a rank, the rank whose MPI it inherited"},
    {"parked", pd_parked_count, METH_NOARGS, "parked() -> number of requests parked until MPI completes them"},
    {"timeline_clock", pd_timeline_clock, METH_NOARGS, "timeline_clock() -> int: CLOCK_MONOTONIC, ns"},
    {"last_call_path", pd_last_call_path, METH_NOARGS,
     "last_call_path() -> str | None: the path that carried this thread's last call (the timeline's name)"},
    FAST("timeline_start", pd_timeline_start, "timeline_start(origin_ns, rank, max_events): record the timeline"),
    FAST("timeline_write", pd_timeline_write, "timeline_write(path, label, extra_json) -> (events, dropped)"),
    FAST("timeline_event", pd_timeline_event, "timeline_event(cat, name, t0_ns, t1_ns, args): a span from Python"),
    {"timeline_groups", pd_timeline_groups, METH_NOARGS, "timeline_groups() -> {gid: [world ranks]}"},
    {"timeline_thread_name", pd_timeline_thread_name, METH_O, "timeline_thread_name(name): this thread's name"},
    FAST("persistent_stats", pd_persistent_stats,
         "persistent_stats(group) -> (keys, requests, active requests, staging bytes) of the group's cache"),
    FAST("set_wait_mode", pd_set_wait_mode, "set_wait_mode(mode) -> old mode (0: poll, 1: MPI_Wait)"),
    FAST("load_idx", pd_load_idx, "load_idx(images_path, labels_path) -> (images float32 (n, rows, cols), labels int32)"),
    FAST("epoch_permutation", pd_epoch_permutation, "epoch_permutation(n, seed, epoch) -> int32 array"),
    FAST("set_blas_threads", pd_set_blas_threads, "set_blas_threads(n): OpenBLAS threads in this process"),
    {"simd_info", simd_info, METH_NOARGS, "simd_info() -> {'level': the kernels' instruction set, 'cpu': the CPU's widest}"},
    {"blas_core", pd_blas_core, METH_NOARGS, "blas_core() -> the kernel family of the engine's OpenBLAS"},
    FAST("sgemm_seconds", pd_sgemm_seconds,
         "sgemm_seconds(n, reps) -> the fastest of reps n x n x n float32 GEMMs through the engine's BLAS"),
    FAST("check_op", pd_check_op, "check_op(op, dtype): raise if the op is not defined for the dtype"),
    {NULL, NULL, 0, NULL},
};

static int add_exception(PyObject *m, PyObject **slot, const char *name, PyObject *base, const char *doc) {
    *slot = PyErr_NewExceptionWithDoc(name, doc, base, NULL);
    if (*slot == NULL) {
        return -1;
    }
    return PyModule_AddObjectRef(m, strrchr(name, '.') + 1, *slot);
}

static int module_exec(PyObject *m) {
    if (pd_import_numpy() < 0) {
        return -1;
    }
    char err[256];
    if (pd_simd_check(err, sizeof err) < 0) {   // a cap this CPU cannot run: refused before any kernel runs
        PyErr_SetString(PyExc_ValueError, err);
        return -1;
    }
    (void)pd_simd_level();   // fixed now, as checked: a PYDIST_SIMD set after import changes nothing
    if (pd_DistError == NULL) {  // the types are process-wide: MPI is too
        if (add_exception(m, &pd_DistError, "pydist.DistError", PyExc_RuntimeError,
                          "A distributed operation failed.") < 0 ||
            add_exception(m, &pd_DistBackendError, "pydist.DistBackendError", pd_DistError,
                          "MPI reported an error; the message carries MPI's own text.") < 0 ||
            add_exception(m, &pd_DistTimeoutError, "pydist.DistTimeoutError", pd_DistError,
                          "A wait ran past its timeout.") < 0) {
            return -1;
        }
    } else if (PyModule_AddObjectRef(m, "DistError", pd_DistError) < 0 ||
               PyModule_AddObjectRef(m, "DistBackendError", pd_DistBackendError) < 0 ||
               PyModule_AddObjectRef(m, "DistTimeoutError", pd_DistTimeoutError) < 0) {
        return -1;
    }
    if (pd_child_register() < 0 || pd_work_type_init(m) < 0 || pd_engine_type_init(m) < 0 ||
        pd_compressor_type_init(m) < 0 || pd_shm_type_init(m) < 0) {
        return -1;
    }
    // The paths. A group's set-up reaches them in this order and its release in the reverse: the
    // persistent requests are freed before the communicators they were made on, the rings in flight
    // abandoned, then the shared channel goes, and last the private communicator they talk on.
    if (pd_path_register(&pd_private_comm_path) < 0 || pd_path_register(&pd_shm_path) < 0 ||
        pd_path_register(&pd_ring_path) < 0 || pd_path_register(&pd_persistent_path) < 0) {
        return -1;
    }
    static const struct { const char *name; int value; } ints[] = {
        {"OP_SUM", PD_OP_SUM}, {"OP_AVG", PD_OP_AVG}, {"OP_PRODUCT", PD_OP_PRODUCT},
        {"OP_MIN", PD_OP_MIN}, {"OP_MAX", PD_OP_MAX}, {"OP_BAND", PD_OP_BAND},
        {"OP_BOR", PD_OP_BOR}, {"OP_BXOR", PD_OP_BXOR},
        {"WAIT_POLL", PD_WAIT_POLL}, {"WAIT_MPI", PD_WAIT_MPI},
        {"MAX_GROUPS", PD_MAX_GROUPS}, {"SHM_AUTO_BYTES", PD_SHM_AUTO_BYTES},
        {"SHM_AUTO_COPY_BYTES", PD_SHM_AUTO_COPY_BYTES},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (PyModule_AddIntConstant(m, ints[i].name, ints[i].value) < 0) {
            return -1;
        }
    }
    return 0;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "pydist._C",
    .m_doc = "pydist's C core: MPI collectives and point-to-point on NumPy arrays.",
    .m_size = 0,
    .m_methods = module_methods,
    .m_slots = module_slots,
};

PyMODINIT_FUNC PyInit__C(void) {
    return PyModuleDef_Init(&module_def);
}
