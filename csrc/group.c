/*
 * group.c: MPI start-up and shut-down, and the table of process groups (communicators).
 *
 * MPI is initialised once per process (MPI_THREAD_MULTIPLE, since other Python threads may call in
 * while one waits with the GIL released) and finalised once, at interpreter exit. A process group is
 * a slot in a table holding its communicator; destroy_process_group frees the communicators but
 * leaves MPI running, so a later init_process_group works, as it does in torch. Every communicator
 * gets MPI_ERRORS_RETURN the moment it exists, so no MPI error can kill the interpreter silently.
 */
#include "pydist.h"

typedef struct {
    MPI_Comm comm;   // MPI_COMM_NULL: free slot, or this process is not a member
    MPI_Group group; // the comm's group, kept for rank translation
    int rank;        // this process's rank in the group
    int size;
    int in_use;
    char broken[256];  // non-empty: an operation timed out and the group must not be used again
} GroupSlot;

static GroupSlot groups[PD_MAX_GROUPS];
int pd_initialized = 0;
static int thread_level = MPI_THREAD_SINGLE;

// ---------------------------------------------------------------------------------------------------
// Lookup

// Initialised, and a live group of this rank? (Raises ValueError otherwise.) Queries stop here:
// a broken group still answers get_rank/get_world_size.
static int check_handle(long handle, const char *fn) {
    if (!pd_initialized) {
        PyErr_Format(PyExc_ValueError, "%s(): the default process group has not been initialized; "
                     "call pydist.init_process_group(backend=\"mpi\") first", fn);
        return -1;
    }
    if (handle < 0 || handle >= PD_MAX_GROUPS || !groups[handle].in_use ||
        groups[handle].comm == MPI_COMM_NULL) {
        PyErr_Format(PyExc_ValueError, "%s(): `group` is not a live process group of this rank "
                     "(handle %ld; destroyed?)", fn, handle);
        return -1;
    }
    return 0;
}

MPI_Comm *pd_group_comm(long handle, const char *fn) {
    if (check_handle(handle, fn) < 0) {
        return NULL;
    }
    if (groups[handle].broken[0]) {
        // After a timeout the ranks no longer agree on which collective comes next: any further call
        // could match the wrong peer operation, so refuse at once, as torch's watchdog does.
        PyErr_Format(pd_DistError, "%s(): the process group is broken: %s; restart the job "
                     "(or destroy and recreate the group on every rank)", fn, groups[handle].broken);
        return NULL;
    }
    return &groups[handle].comm;
}

int pd_group_size(long handle) {
    return groups[handle].size;
}

int pd_group_rank(long handle) {
    return groups[handle].rank;
}

int pd_group_from_global(long handle, int global_rank) {
    int out = MPI_UNDEFINED;
    if (handle == 0) {
        return global_rank;
    }
    MPI_Group_translate_ranks(groups[0].group, 1, &global_rank, groups[handle].group, &out);
    return out;
}

int pd_group_to_global(long handle, int group_rank) {
    int out = MPI_UNDEFINED;
    if (handle == 0) {
        return group_rank;
    }
    MPI_Group_translate_ranks(groups[handle].group, 1, &group_rank, groups[0].group, &out);
    return out;
}

void pd_group_mark_broken(long handle, const char *why) {
    if (handle >= 0 && handle < PD_MAX_GROUPS && groups[handle].in_use && !groups[handle].broken[0]) {
        snprintf(groups[handle].broken, sizeof groups[handle].broken, "%s", why);
    }
}

static int slot_set(int slot, MPI_Comm comm) {
    int rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(comm, &groups[slot].rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(comm, &groups[slot].size);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_group(comm, &groups[slot].group);
    if (rc != MPI_SUCCESS) {
        return pd_raise_mpi_int(rc, "MPI_Comm_set_errhandler");
    }
    groups[slot].comm = comm;
    groups[slot].in_use = 1;
    groups[slot].broken[0] = 0;
    return 0;
}

static void slot_free(int slot) {
    if (groups[slot].in_use && groups[slot].comm != MPI_COMM_NULL) {
        MPI_Group_free(&groups[slot].group);
        MPI_Comm_free(&groups[slot].comm);
    }
    groups[slot].comm = MPI_COMM_NULL;
    groups[slot].group = MPI_GROUP_NULL;
    groups[slot].in_use = 0;
    groups[slot].broken[0] = 0;
}

// ---------------------------------------------------------------------------------------------------
// init / destroy / finalize

// pydist issues every collective as MPICH's nonblocking call, and for some of them MPICH's automatic
// choice of nonblocking algorithm is far slower than the one its blocking call picks (measured with
// benchmarks/collectives_sweep.py, 2 ranks, 1 MiB: MPI_Ireduce_scatter_block 510 us with "auto",
// 57 us with "sched_pairwise", MPI_Reduce_scatter_block 57 us). MPICH reads these at MPI_Init; a
// value the user has set in the environment wins.
static const char *const MPICH_DEFAULTS[][2] = {
    {"MPIR_CVAR_IREDUCE_SCATTER_BLOCK_INTRA_ALGORITHM", "sched_pairwise"},
};

static void set_mpich_defaults(void) {
    for (size_t i = 0; i < sizeof(MPICH_DEFAULTS) / sizeof(MPICH_DEFAULTS[0]); i++) {
        setenv(MPICH_DEFAULTS[i][0], MPICH_DEFAULTS[i][1], 0);
    }
}

// _C.init(timeout_seconds) -> (rank, size, thread_level). timeout < 0: none.
PyObject *pd_init(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int flag = 0, rc;
    if (pd_check_nargs(nargs, 1, "init") < 0) {
        return NULL;
    }
    double timeout = PyFloat_AsDouble(args[0]);
    if (timeout == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    if (pd_initialized) {
        PyErr_SetString(PyExc_ValueError, "init_process_group(): the default process group is already "
                        "initialized; call destroy_process_group() before initializing it again");
        return NULL;
    }
    MPI_Finalized(&flag);
    if (flag) {
        PyErr_SetString(pd_DistError, "init_process_group(): MPI has already been finalized in this "
                        "process and cannot be started again");
        return NULL;
    }
    MPI_Initialized(&flag);
    if (!flag) {
        set_mpich_defaults();
        Py_BEGIN_ALLOW_THREADS
        rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &thread_level);
        Py_END_ALLOW_THREADS
        if (rc != MPI_SUCCESS) {
            return pd_raise_mpi(rc, "MPI_Init_thread");
        }
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    }
    if (pd_ops_init() < 0) {
        return NULL;
    }
    // Our own dup of MPI_COMM_WORLD, so user code using MPI_COMM_WORLD directly (mpi4py) can never
    // match our messages. Started nonblocking and waited on with our poll: with more ranks than
    // cores a blocking call would spin through whole scheduler slices.
    MPI_Comm world = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    rc = MPI_Comm_idup(MPI_COMM_WORLD, &world, &req);
    if (rc != MPI_SUCCESS) {
        return pd_raise_mpi(rc, "MPI_Comm_idup");
    }
    if (pd_wait(&req, MPI_STATUS_IGNORE, timeout, "init_process_group") < 0) {
        return NULL;  // the dup never completed (another rank never arrived): leave MPI as it is
    }
    if (slot_set(0, world) < 0) {
        MPI_Comm_free(&world);
        return NULL;
    }
    if (pd_liveness_start() < 0) {
        slot_free(0);
        return NULL;
    }
    pd_default_timeout = timeout;
    pd_initialized = 1;
    return Py_BuildValue("iii", groups[0].rank, groups[0].size, thread_level);
}

static void free_groups(void) {
    for (int i = 0; i < PD_MAX_GROUPS; i++) {
        slot_free(i);
    }
}

// _C.destroy(): free every group's communicator; MPI itself stays up for a later init.
PyObject *pd_destroy(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (!pd_initialized) {
        PyErr_SetString(PyExc_ValueError, "destroy_process_group(): the default process group has not "
                        "been initialized");
        return NULL;
    }
    pd_parked_drain();
    free_groups();
    pd_initialized = 0;
    Py_RETURN_NONE;
}

// _C.finalize(): at interpreter exit. Safe to call when MPI never started or already ended.
PyObject *pd_finalize(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) {
        if (pd_liveness_announce() < 0 || pd_parked_drain() > 0) {
            // A collective some rank never joined is still pending (or the wait for the others to
            // exit was interrupted): MPI_Finalize would wait forever. Leave without it; the launcher
            // then reports this rank's exit and ends the job.
            fprintf(stderr, "pydist: an operation that never completed is still pending at exit; "
                            "skipping MPI_Finalize\n");
            Py_RETURN_NONE;
        }
        free_groups();
        pd_initialized = 0;
        pd_ops_free();
        Py_BEGIN_ALLOW_THREADS
        MPI_Finalize();
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

// _C.abort(code): end the whole job. Used by the exception hook: MPI_Finalize here would leave the
// other ranks waiting forever in their next collective, MPI_Abort makes the launcher kill them.
PyObject *pd_abort(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long code = 1;
    int init = 0, fin = 0;
    if (pd_check_nargs(nargs, 1, "abort") < 0 || pd_arg_long(args[0], "abort", "code", &code) < 0) {
        return NULL;
    }
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) {
        MPI_Abort(MPI_COMM_WORLD, (int)code);
    }
    Py_RETURN_NONE;
}

// ---------------------------------------------------------------------------------------------------
// Queries: cheap, no GIL release.

PyObject *pd_get_rank(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long h;
    if (pd_check_nargs(nargs, 1, "get_rank") < 0 || pd_arg_long(args[0], "get_rank", "group", &h) < 0 ||
        check_handle(h, "get_rank") < 0) {
        return NULL;
    }
    return PyLong_FromLong(groups[h].rank);
}

PyObject *pd_get_world_size(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long h;
    if (pd_check_nargs(nargs, 1, "get_world_size") < 0 ||
        pd_arg_long(args[0], "get_world_size", "group", &h) < 0 || check_handle(h, "get_world_size") < 0) {
        return NULL;
    }
    return PyLong_FromLong(groups[h].size);
}

PyObject *pd_is_initialized(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyBool_FromLong(pd_initialized);
}

// _C.mpi_info() -> dict: the library version string and thread level, for diagnostics.
PyObject *pd_mpi_info(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
    int len = 0;
    MPI_Get_library_version(version, &len);
    return Py_BuildValue("{s:s,s:i,s:i}", "library_version", version, "mpi_version", MPI_VERSION,
                         "thread_level", thread_level);
}

int pd_group_peer(long handle, long global_rank, const char *fn, const char *arg, int allow_self) {
    int world = groups[0].size;
    if (global_rank < 0 || global_rank >= world) {
        PyErr_Format(PyExc_ValueError, "%s(): `%s` must be a rank in [0, %d); got %ld", fn, arg, world,
                     global_rank);
        return -1;
    }
    if (!allow_self && global_rank == groups[0].rank) {
        PyErr_Format(PyExc_ValueError, "%s(): `%s` must be another rank; rank %ld cannot %s itself", fn,
                     arg, global_rank, strcmp(arg, "dst") == 0 ? "send to" : "receive from");
        return -1;
    }
    int r = pd_group_from_global(handle, (int)global_rank);
    if (r == MPI_UNDEFINED || r < 0) {
        PyErr_Format(PyExc_ValueError, "%s(): `%s` = %ld is not a member of `group`", fn, arg, global_rank);
        return -1;
    }
    return r;
}

// ---------------------------------------------------------------------------------------------------
// Sub-groups

// _C.new_group(ranks) -> handle, or -1 on a rank that is not a member. Collective over the world,
// as in torch: every rank calls it with the same ranks (sorted, unique, checked by the caller and
// again here). Group ranks follow global rank order.
PyObject *pd_new_group(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *fn = "new_group";
    if (pd_check_nargs(nargs, 1, fn) < 0 || pd_group_comm(0, fn) == NULL) {
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "new_group(): `ranks` must be a sequence of ints");
    if (seq == NULL) {
        return NULL;
    }
    int member = 0;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    long prev = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        long r;
        if (pd_arg_long(PySequence_Fast_GET_ITEM(seq, i), fn, "ranks", &r) < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        if (r < 0 || r >= groups[0].size || r <= prev) {
            PyErr_Format(PyExc_ValueError, "new_group(): `ranks` must be sorted, unique ranks in [0, %d); "
                         "got %R", groups[0].size, args[0]);
            Py_DECREF(seq);
            return NULL;
        }
        prev = r;
        member |= (r == groups[0].rank);
    }
    Py_DECREF(seq);
    int slot = -1;
    for (int i = 1; i < PD_MAX_GROUPS && slot < 0; i++) {
        if (!groups[i].in_use) {
            slot = i;
        }
    }
    // Everyone arrives first through our interruptible wait; the split itself is blocking in MPI
    // and would otherwise spin with no timeout if a rank never came.
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Ibarrier(groups[0].comm, &req);
    if (rc != MPI_SUCCESS) {
        return pd_raise_mpi(rc, "MPI_Ibarrier");
    }
    if (pd_wait_or_park(&req, MPI_STATUS_IGNORE, fn, NULL, 0, 0) < 0) {
        return NULL;
    }
    MPI_Comm comm = MPI_COMM_NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = MPI_Comm_split(groups[0].comm, member ? 0 : MPI_UNDEFINED, groups[0].rank, &comm);
    Py_END_ALLOW_THREADS
    if (rc != MPI_SUCCESS) {
        return pd_raise_mpi(rc, "MPI_Comm_split");
    }
    if (!member) {
        return PyLong_FromLong(-1);
    }
    if (slot < 0) {
        MPI_Comm_free(&comm);
        PyErr_Format(pd_DistError, "new_group(): too many live process groups (%d); destroy some first",
                     PD_MAX_GROUPS - 1);
        return NULL;
    }
    if (slot_set(slot, comm) < 0) {
        MPI_Comm_free(&comm);
        return NULL;
    }
    return PyLong_FromLong(slot);
}

// _C.destroy_group(handle): free one sub-group's communicator (local; the world is slot 0).
PyObject *pd_destroy_group(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long h;
    if (pd_check_nargs(nargs, 1, "destroy_group") < 0 || pd_arg_long(args[0], "destroy_group", "group", &h) < 0) {
        return NULL;
    }
    if (h <= 0 || h >= PD_MAX_GROUPS || !groups[h].in_use) {
        PyErr_Format(PyExc_ValueError, "destroy_process_group(): `group` is not a live sub-group (handle %ld)", h);
        return NULL;
    }
    slot_free((int)h);
    Py_RETURN_NONE;
}

// _C.live_groups() -> number of communicators this rank holds (for leak tests).
PyObject *pd_live_groups(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    long n = 0;
    for (int i = 0; i < PD_MAX_GROUPS; i++) {
        n += groups[i].in_use && groups[i].comm != MPI_COMM_NULL;
    }
    return PyLong_FromLong(n);
}
