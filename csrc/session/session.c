/*
 * session.c: the session. MPI's start-up and shut-down, every setting init_process_group reads, and
 * each path's session (shared memory, persistent requests, liveness, the stall board) started and
 * stopped here; new_group and destroy_process_group fill and empty the group table (groups/group.c)
 * and run the paths' hooks around that. The only file that knows every path, so it sits above them.
 *
 * MPI is initialised once per process and finalised once, at interpreter exit. destroy_process_group
 * frees the communicators but leaves MPI running, so a later init_process_group works, as it does in
 * torch.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "session/session.h"

#define PD_GLIBC_FLOOR_THREADS   // the start-up watchdog's thread (glibc_floor.h)
#include "core/glibc_floor.h"

#include "core/dtypes.h"
#include "core/errors.h"
#include "core/settings.h"
#include "groups/child.h"
#include "groups/group.h"
#include "groups/liveness.h"
#include "observe/calls.h"
#include "observe/stall.h"
#include "paths/persistent.h"
#include "paths/private_comm.h"
#include "paths/shared_memory.h"
#include "paths/tuned.h"
#include "progress/op.h"
#include "progress/progress.h"
#include "progress/wait.h"

// What MPI gave us, and an init that left MPI unusable for us.
static int thread_level = -1;          // MPI's provided level; -1 before MPI_Init
static char init_failure[300];         // non-empty: an init timed out and left MPI unusable for us

static int group_setup(int slot, const char *fn);

// A group's slot goes: the paths give up what they have in flight on it first (progress.c: in reverse
// order of registration, so the private communicator they talk on goes last), then its communicator.
static void release_slot(int slot) {
    if (pd_group_live(slot)) {
        pd_paths_group_release(slot, pd_group_generation(slot));
    }
    pd_group_slot_free(slot);
}

// Before every pending request is drained (destroy, finalize): nothing of ours may stay unparked.
static void release_all(void) {
    for (int i = 0; i < PD_MAX_GROUPS; i++) {
        if (pd_group_live(i)) {
            pd_paths_group_release(i, pd_group_generation(i));
        }
    }
}

// At interpreter exit, before MPI_Finalize: tell every other rank, then wait for all of them to
// reach exit too (liveness.c). The wait ends at the session's timeout, and under --survive once a peer
// is known to have ended without arriving (pd_liveness_exit_check). Returns -1 if that wait failed,
// was interrupted or was given up (then MPI_Finalize must be skipped; pd_liveness_exit_why says why).
static int exit_barrier(void) {
    MPI_Request req = MPI_REQUEST_NULL;
    int begun = pd_liveness_exit_begin(&req);
    if (begun <= 0) {
        return begun;   // nothing to wait for, or it could not start (its reason recorded)
    }
    PdWaitSpec spec = {"the exit barrier (waiting for every rank to reach exit)", pd_session_timeout(),
                       pd_liveness_exit_check, NULL, 0.0};
    int waited = pd_wait(&req, MPI_STATUS_IGNORE, &spec);
    if (waited < 0 || req != MPI_REQUEST_NULL) {   // an error, a signal, the timeout; or the check gave up
        if (waited < 0) {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyObject *text = value != NULL ? PyObject_Str(value) : NULL;
            const char *utf8 = text != NULL ? PyUnicode_AsUTF8(text) : NULL;
            pd_liveness_exit_given_up(utf8 != NULL ? utf8 : "the exit barrier was interrupted");
            Py_XDECREF(text);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            PyErr_Clear();
        }
        return -1;
    }
    pd_liveness_exit_end();
    return 0;
}

// ---------------------------------------------------------------------------------------------------
// Start-up

// pydist issues every collective as MPICH's nonblocking call, and for some of them MPICH's automatic
// choice of nonblocking algorithm is far slower than the one its blocking call picks (measured with
// benchmarks/collectives_sweep.py, 2 ranks, 1 MiB: MPI_Ireduce_scatter_block 510 us with "auto",
// 57 us with "sched_pairwise", MPI_Reduce_scatter_block 57 us). MPICH reads these at MPI_Init; a
// value the user has set in the environment wins.
//
// MPICH 4.0.2's recursive-doubling all-gather (its "auto" choice at 2 and 4 ranks) is wrong when a
// persistent request is started a second time: the peers' blocks are never written again (measured in
// C, every size). The ring is right every time; persistent.c caches all-gathers only under an
// algorithm known to be right (pd_persist_read_env).
static const char *const MPICH_DEFAULTS[][2] = {
    {"MPIR_CVAR_IREDUCE_SCATTER_BLOCK_INTRA_ALGORITHM", "sched_pairwise"},
    {"MPIR_CVAR_IALLGATHER_INTRA_ALGORITHM", "sched_ring"},
};

static void set_mpich_defaults(void) {
    for (size_t i = 0; i < sizeof(MPICH_DEFAULTS) / sizeof(MPICH_DEFAULTS[0]); i++) {
        setenv(MPICH_DEFAULTS[i][0], MPICH_DEFAULTS[i][1], 0);
    }
#if defined(OPEN_MPI) && OPEN_MPI
    // Open MPI's vector reduction ops (its op/avx component, 4.1 and 5.0) saturate small integer sums
    // where C, NumPy and torch wrap around (found by the conformance fuzzer: int8 SUM gave -128 for
    // 111 on Open MPI 5.0, uint16 SUM 65535 for 34 on 4.1). Its plain ops wrap: the component is left
    // out unless the user chose the ops.
    setenv("OMPI_MCA_op", "^avx", 0);
#endif
}

// MPICH discovers the machine's topology with hwloc at MPI_Init, PCI devices included (reading every
// device's config space through sysfs): a third of MPI_Init at 2 ranks here (48-51 ms with it, 28-34
// without; benchmarks/startup.py). pydist uses no device placement, so it turns hwloc's I/O discovery
// off for MPI_Init only, unless the user has set HWLOC_COMPONENTS; the CPU topology is unchanged.
#define HWLOC_SKIP_IO "-pci,-linuxio"

static int skip_hwloc_io(void) {
    return getenv("HWLOC_COMPONENTS") == NULL && setenv("HWLOC_COMPONENTS", HWLOC_SKIP_IO, 0) == 0;
}

// ---------------------------------------------------------------------------------------------------
// pydist's settings from the environment (docs/reference/environment.md)
//
// Every PYDIST_* value C reads is parsed here, strictly: unset or empty is the default; anything else
// must be what the setting takes, in full, or init_process_group (and mpi_info) raise a ValueError
// naming the variable, before MPI starts (a byte count: pd_parse_bytes, core/settings.c).

static const char *const ENV_BYTES[] = {"PYDIST_SHM_BYTES", "PYDIST_SHM_SMALL_BYTES", "PYDIST_SHM_STAGE",
                                        "PYDIST_PERSISTENT_BYTES"};
static const char *const THREAD_LEVELS[] = {"single", "funneled", "serialized", "multiple"};   // MPI's order

// What a setting holds: Py_None when unset or empty, else its value; NULL with a ValueError if malformed.
static PyObject *env_setting(const char *name) {
    const char *v = getenv(name);
    unsigned long long bytes;
    if (v == NULL || *v == 0) {
        return Py_NewRef(Py_None);
    }
    if (strcmp(name, "PYDIST_THREAD_LEVEL") == 0) {
        for (int l = 0; l < 4; l++) {
            if (strcmp(v, THREAD_LEVELS[l]) == 0) {
                return PyUnicode_FromString(v);
            }
        }
        PyErr_Format(PyExc_ValueError, "PYDIST_THREAD_LEVEL must be single, funneled, serialized or multiple (or "
                     "unset: multiple); got '%.100s'", v);
        return NULL;
    }
    if (strcmp(name, "PYDIST_STALL_WARN") == 0) {
        double seconds;
        if (pd_parse_seconds(v, &seconds) < 0) {
            PyErr_Format(PyExc_ValueError, "PYDIST_STALL_WARN must be a number of seconds, decimal digits with an "
                         "optional fraction, at most 1e9, 0 for off (or unset: 60); got '%.100s'", v);
            return NULL;
        }
        return PyFloat_FromDouble(seconds);
    }
    if (pd_parse_bytes(v, &bytes) < 0) {
        PyErr_Format(PyExc_ValueError, "%s must be a byte count, decimal digits alone, at most %llu (or unset: "
                     "the default); got '%.100s'", name, PD_ENV_BYTES_MAX, v);
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(bytes);
}

// {name: value or None} of every setting C reads; NULL with a ValueError naming the first malformed one.
static PyObject *env_settings(void) {
    PyObject *out = PyDict_New();
    static const char *const OTHERS[] = {"PYDIST_THREAD_LEVEL", "PYDIST_STALL_WARN"};
    const size_t n_bytes = sizeof ENV_BYTES / sizeof *ENV_BYTES;
    for (size_t i = 0; out != NULL && i < n_bytes + sizeof OTHERS / sizeof *OTHERS; i++) {
        const char *name = i < n_bytes ? ENV_BYTES[i] : OTHERS[i - n_bytes];
        PyObject *value = env_setting(name);
        if (value == NULL || PyDict_SetItemString(out, name, value) < 0) {
            Py_CLEAR(out);
        }
        Py_XDECREF(value);
    }
    return out;
}

static const char *level_name(int level) {
    return level == MPI_THREAD_MULTIPLE ? "MPI_THREAD_MULTIPLE"
         : level == MPI_THREAD_SERIALIZED ? "MPI_THREAD_SERIALIZED"
         : level == MPI_THREAD_FUNNELED ? "MPI_THREAD_FUNNELED" : "MPI_THREAD_SINGLE";
}

// The level we ask MPI for: MULTIPLE, since other Python threads may call in while one waits with the
// GIL released. PYDIST_THREAD_LEVEL (single, funneled, serialized) asks for less, to test how pydist
// copes with an MPI that gives less. (env_settings has checked it.)
static int requested_level(void) {
    const int levels[] = {MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED, MPI_THREAD_SERIALIZED, MPI_THREAD_MULTIPLE};
    const char *v = getenv("PYDIST_THREAD_LEVEL");
    for (int l = 0; v != NULL && l < 4; l++) {
        if (strcmp(v, THREAD_LEVELS[l]) == 0) {
            return levels[l];
        }
    }
    return MPI_THREAD_MULTIPLE;
}

// ---------------------------------------------------------------------------------------------------
// A deadline for MPI's start-up
//
// MPI_Init waits for every rank of the job, with no deadline of its own: a rank that failed before it
// (a script's error before init_process_group) never comes, and hydra does not end a job for a process
// that exits before its start-up began, so every other rank would wait for ever. A watchdog thread ends
// this process once `seconds` pass without MPI_Init returning; the launcher then ends the job (hydra and
// Open MPI's both do, for a process that had begun its start-up).

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int done, started;
    struct timespec until;   // CLOCK_MONOTONIC
    char message[400];
} StartupWatch;

static void *startup_watch_run(void *p) {
    StartupWatch *w = p;
    pthread_mutex_lock(&w->mu);
    int rc = 0;
    while (!w->done && rc != ETIMEDOUT) {
        rc = pthread_cond_timedwait(&w->cv, &w->mu, &w->until);
    }
    int fire = !w->done;
    pthread_mutex_unlock(&w->mu);
    if (fire) {
        ssize_t unused = write(STDERR_FILENO, w->message, strlen(w->message));
        (void)unused;
        _exit(1);
    }
    return NULL;
}

// Start the watch (seconds > 0); w->started says whether it runs (a thread that cannot start leaves the
// start-up as unbounded as before, which is no worse).
static void startup_watch_start(StartupWatch *w, double seconds, const char *message) {
    memset(w, 0, sizeof *w);
    snprintf(w->message, sizeof w->message, "%s", message);
    pthread_condattr_t attr;
    if (seconds <= 0 || pthread_condattr_init(&attr) != 0) {
        return;
    }
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, &attr);
    pthread_condattr_destroy(&attr);
    clock_gettime(CLOCK_MONOTONIC, &w->until);
    double whole = seconds > 1e9 ? 1e9 : seconds;
    w->until.tv_sec += (time_t)whole;
    w->until.tv_nsec += (long)((whole - (double)(time_t)whole) * 1e9);
    if (w->until.tv_nsec >= 1000000000L) {
        w->until.tv_sec++;
        w->until.tv_nsec -= 1000000000L;
    }
    w->started = pthread_create(&w->thread, NULL, startup_watch_run, w) == 0;
    if (!w->started) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
    }
}

static void startup_watch_stop(StartupWatch *w) {
    if (!w->started) {
        return;
    }
    pthread_mutex_lock(&w->mu);
    w->done = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);   // at once: it wakes on the signal
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
}

// Start MPI (or adopt a running one: mpi4py may have started it) and check its thread level. We
// release the GIL around MPI calls, so another thread may call in while one waits: MULTIPLE is what
// we want; with SERIALIZED the wait loop keeps the GIL while it tests (wait.c), which serialises every
// MPI call of ours; anything less cannot be made safe, and is refused.
static int start_mpi(double timeout) {
    int flag = 0, rc;
    if (MPI_Finalized(&flag) == MPI_SUCCESS && flag) {
        PyErr_SetString(pd_DistError, "init_process_group(): MPI has already been finalized in this "
                        "process and cannot be started again");
        return -1;
    }
    MPI_Initialized(&flag);
    if (!flag) {
        set_mpich_defaults();
        int hwloc_set = skip_hwloc_io();
        int required = requested_level(), provided = MPI_THREAD_SINGLE;
        char message[400];
        snprintf(message, sizeof message, "pydist: init_process_group(): MPI's start-up did not complete within "
                 "%g s (its timeout): a rank never began it (it may have failed before init_process_group: "
                 "see its output); this rank ends, and with it the job\n", timeout);
        StartupWatch watch;
        startup_watch_start(&watch, timeout, message);
        Py_BEGIN_ALLOW_THREADS
        rc = MPI_Init_thread(NULL, NULL, required, &provided);
        Py_END_ALLOW_THREADS
        startup_watch_stop(&watch);
        if (hwloc_set) {
            unsetenv("HWLOC_COMPONENTS");   // not for processes this one starts later
        }
        if (rc != MPI_SUCCESS) {
            return pd_raise_mpi_int(rc, "MPI_Init_thread");
        }
        if ((rc = MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN)) != MPI_SUCCESS ||
            (rc = MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN)) != MPI_SUCCESS) {
            return pd_raise_mpi_int(rc, "MPI_Comm_set_errhandler");
        }
    }
    if ((rc = MPI_Query_thread(&thread_level)) != MPI_SUCCESS) {
        return pd_raise_mpi_int(rc, "MPI_Query_thread");
    }
    if (thread_level < MPI_THREAD_SERIALIZED) {
        PyErr_Format(pd_DistError, "init_process_group(): MPI provides only %s; pydist releases the GIL "
                     "while MPI works, so it needs MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE (start MPI "
                     "with MPI_Init_thread at one of those levels, or let pydist start it)",
                     level_name(thread_level));
        return -1;
    }
    pd_wait_serialized = thread_level < MPI_THREAD_MULTIPLE;
    return 0;
}

// The communicators init makes: ours of the world (slot 0) and, once per process, liveness.c's control
// channel. They are duplicated together and waited for under one deadline. Static, because a dup that
// times out is still pending and MPI writes the handle when (if ever) it completes.
static MPI_Comm pending_world = MPI_COMM_NULL, pending_ctl = MPI_COMM_NULL, pending_algo = MPI_COMM_NULL;
static int ctl_made = 0;

// Set-up steps only this rank can fail (its private communicator, its liveness channel) do not end its
// init on the spot: the other ranks would then wait for it in the node's segment and the path table's
// broadcast until init's timeout. The failure is kept (keep_failure), this rank takes part in every
// collective of init, and agree_init then tells every rank of the first failure at once, so that every
// rank raises the same error.
//
// Test knob (tests/unit/test_setup_agreement.py): PYDIST_TEST_FAIL_SETUP=private_comm or =liveness makes
// that step fail on this rank, as if out of memory.
static int test_fail(const char *step) {
    const char *v = getenv("PYDIST_TEST_FAIL_SETUP");
    if (v != NULL && strcmp(v, step) == 0) {
        PyErr_SetString(PyExc_MemoryError, "out of memory (PYDIST_TEST_FAIL_SETUP)");
        return 1;
    }
    return 0;
}

// The raised error, as text into kept (the first failure only), and cleared.
static void keep_failure(char *kept, size_t len, int rank, const char *step) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *text = value != NULL ? PyObject_Str(value) : NULL;
    const char *utf8 = text != NULL ? PyUnicode_AsUTF8(text) : NULL;
    if (kept[0] == '\0') {
        snprintf(kept, len, "world rank %d could not set up %s: %s: %s", rank, step,
                 type != NULL ? ((PyTypeObject *)type)->tp_name : "error", utf8 != NULL ? utf8 : "?");
    }
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Clear();
}

// What is left of init's timeout (< 0: none) since `start`: its steps after MPI's start-up share one
// deadline, so that a rank that never comes costs the others one timeout, not one per step.
static double time_left(double start, double timeout) {
    if (timeout < 0) {
        return -1.0;
    }
    double left = timeout - (MPI_Wtime() - start);
    return left > 0 ? left : 0.0;
}

// Every rank learns whether any rank kept a failure (one all-reduce of the lowest failed rank) and, if
// one did, that rank's words (one broadcast). 0: none failed; 1: one did (its words in `kept` on every
// rank); -1: the exchange itself failed (raised).
static int agree_init(MPI_Comm world, int rank, double timeout, char *kept, size_t len) {
    static int first;             // static: a wait given up leaves the request parked and MPI writing here
    static char words[256];
    first = kept[0] ? rank : INT_MAX;
    for (int round = 0; round < 2; round++) {
        MPI_Request req = MPI_REQUEST_NULL;
        int rc = round == 0 ? MPI_Iallreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, world, &req)
                            : MPI_Ibcast(words, (int)sizeof words, MPI_CHAR, first, world, &req);
        if (rc != MPI_SUCCESS) {
            pd_raise_mpi(rc, round == 0 ? "MPI_Iallreduce" : "MPI_Ibcast");
            return -1;
        }
        PdWaitSpec spec = {"init_process_group", timeout, NULL, NULL, 0.0};
        if (pd_wait(&req, MPI_STATUS_IGNORE, &spec) < 0) {
            if (req != MPI_REQUEST_NULL) {
                pd_park(req, NULL, 0);
            }
            return -1;
        }
        if (round == 0 && first == INT_MAX) {
            return 0;
        }
        if (round == 0) {
            snprintf(words, sizeof words, "%s", kept);   // (read only on the rank that broadcasts)
        }
    }
    snprintf(kept, len, "%s", words);
    return 1;
}

// _C.init(timeout_seconds, startup_seconds) -> (rank, size, thread_level): startup_seconds bounds MPI_Init
// (init's timeout, or longer where a launcher bounds it first), timeout everything after. < 0: none.
PyObject *pd_init(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int rc, size = 1;
    if (pd_check_nargs(nargs, 2, "init") < 0) {
        return NULL;
    }
    double timeout = PyFloat_AsDouble(args[0]), startup;
    if ((timeout == -1.0 && PyErr_Occurred()) || ((startup = PyFloat_AsDouble(args[1])) == -1.0 && PyErr_Occurred()) ||
        pd_child_check_init() < 0) {
        return NULL;
    }
    if (pd_initialized) {
        PyErr_SetString(PyExc_ValueError, "init_process_group(): the default process group is already "
                        "initialized; call destroy_process_group() before initializing it again");
        return NULL;
    }
    if (init_failure[0]) {
        PyErr_Format(pd_DistError, "init_process_group(): %s; restart the job", init_failure);
        return NULL;
    }
    PyObject *settings = env_settings();   // a malformed one is refused before anything starts
    if (settings == NULL) {
        return NULL;
    }
    Py_DECREF(settings);
    if (start_mpi(startup) < 0 || pd_ops_init() < 0) {
        return NULL;
    }
    if ((rc = MPI_Comm_size(MPI_COMM_WORLD, &size)) != MPI_SUCCESS) {
        return pd_raise_mpi(rc, "MPI_Comm_size");
    }
    // Our own dups of MPI_COMM_WORLD, so user code using MPI_COMM_WORLD directly (mpi4py) can never
    // match our messages. Nonblocking and waited for with our poll: with more ranks than cores a
    // blocking call would spin through whole scheduler slices, and a rank that never arrives must
    // end in the user's timeout.
    // The world group's private communicator (group_setup) is duplicated with them, under the same
    // deadline: one rendezvous, whatever the other ranks' inits do.
    MPI_Request reqs[3] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int want_ctl = !ctl_made && size > 1;
    if ((rc = MPI_Comm_idup(MPI_COMM_WORLD, &pending_world, &reqs[0])) != MPI_SUCCESS ||
        (rc = MPI_Comm_idup(MPI_COMM_WORLD, &pending_algo, &reqs[2])) != MPI_SUCCESS ||
        (want_ctl && (rc = MPI_Comm_idup(MPI_COMM_WORLD, &pending_ctl, &reqs[1])) != MPI_SUCCESS)) {
        for (int j = 0; j < 3; j++) {
            if (reqs[j] != MPI_REQUEST_NULL) {
                pd_park(reqs[j], NULL, 0);
                snprintf(init_failure, sizeof init_failure, "an earlier init_process_group failed half way");
            }
        }
        return pd_raise_mpi(rc, "MPI_Comm_idup");
    }
    double start = MPI_Wtime();
    for (int i = 0; i < 3; i++) {
        double left = timeout < 0 ? -1.0 : timeout - (MPI_Wtime() - start);
        PdWaitSpec spec = {"init_process_group", left < 0 && timeout >= 0 ? 0.0 : left, NULL, NULL, 0.0};
        if (reqs[i] != MPI_REQUEST_NULL && pd_wait(&reqs[i], MPI_STATUS_IGNORE, &spec) < 0) {
            // Another rank never arrived (or Ctrl-C). The dups stay pending, parked, and may complete
            // whenever that rank comes; the ranks no longer agree on what comes next, so pydist refuses
            // to start again in this process rather than match the wrong operations.
            for (int j = 0; j < 3; j++) {
                if (reqs[j] != MPI_REQUEST_NULL) {
                    pd_park(reqs[j], NULL, 0);
                }
            }
            snprintf(init_failure, sizeof init_failure, "an earlier init_process_group did not complete "
                     "(another rank never called it, or it was interrupted)");
            return NULL;
        }
    }
    if (pd_group_slot_set(0, pending_world) < 0) {
        MPI_Comm_free(&pending_world);
        MPI_Comm_free(&pending_algo);
        if (want_ctl) MPI_Comm_free(&pending_ctl);
        return NULL;
    }
    pending_world = MPI_COMM_NULL;
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    char kept[256] = "";   // this rank's first failed step (agree_init)
    if (test_fail("private_comm") || pd_private_comm_adopt(0, pending_algo) < 0) {   // group_setup finds it made
        keep_failure(kept, sizeof kept, world_rank, "its private communicator");
        MPI_Comm_free(&pending_algo);
    }
    pending_algo = MPI_COMM_NULL;
    if (want_ctl) {
        if ((rc = MPI_Comm_set_errhandler(pending_ctl, MPI_ERRORS_RETURN)) != MPI_SUCCESS) {
            pd_raise_mpi(rc, "MPI_Comm_set_errhandler");
        }
        if (rc != MPI_SUCCESS || test_fail("liveness") || pd_liveness_start(pending_ctl) < 0) {
            keep_failure(kept, sizeof kept, world_rank, "its liveness channel (how it learns of dead ranks)");
            MPI_Comm_free(&pending_ctl);
        } else {
            pending_ctl = MPI_COMM_NULL;
            ctl_made = 1;
        }
    }
    // The shared-memory segment of the node's ranks (collective; on failure pydist says so once and
    // uses MPI's all-reduce instead).
    pd_stall_read_env();   // before the segment: its board is written only when the inspector is on
    if (pd_shm_session_start(pd_group_world_comm(), time_left(start, timeout)) < 0) {
        release_slot(0);
        return NULL;
    }
    // Every rank takes world rank 0's path table (tuned.h), under init's deadline. It acts only on groups
    // whose calls go through the segment's slots, but every rank takes part whether or not its node made
    // a segment (or it a heap): a world-wide collective is decided alike on every rank, and a node
    // without one must not leave the others waiting in it.
    if (pd_tuned_share(pd_group_world_comm(), time_left(start, timeout)) < 0) {
        snprintf(init_failure, sizeof init_failure, "an earlier init_process_group did not complete "
                 "(another rank never called it, or it was interrupted)");
        release_slot(0);
        pd_shm_session_stop();
        return NULL;
    }
    if (pd_tuned_unusable() != NULL) {   // world rank 0's named table: the same error on every rank
        PyErr_SetString(PyExc_ValueError, pd_tuned_unusable());
        release_slot(0);
        pd_shm_session_stop();
        return NULL;
    }
    int failed = agree_init(pd_group_world_comm(), world_rank, time_left(start, timeout), kept, sizeof kept);
    if (failed != 0) {   // every rank alike: the same words, or the exchange itself failed (its error raised)
        if (failed > 0) {
            PyErr_Format(pd_DistError, "init_process_group(): %s", kept);
        } else {
            snprintf(init_failure, sizeof init_failure, "an earlier init_process_group did not complete "
                     "(another rank never called it, or it was interrupted)");
        }
        if (failed > 0 && ctl_made) {   // every rank drops its channel: no exit barrier waits for one that has none
            pd_liveness_stop();
            ctl_made = 0;
        }
        release_slot(0);
        pd_shm_session_stop();
        return NULL;
    }
    pd_wait_set_cores(pd_shm_node_ranks());
    pd_set_session_timeout(timeout);
    pd_persist_read_env();
    pd_initialized = 1;   // the world group's set-up runs as a call on it
    if (group_setup(0, "init_process_group") < 0) {
        pd_initialized = 0;
        release_slot(0);
        pd_shm_session_stop();
        return NULL;
    }
    return Py_BuildValue("iii", pd_group_rank(0), pd_group_size(0), thread_level);
}

// _C.destroy(): free every group's communicator; MPI itself stays up for a later init.
PyObject *pd_destroy(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (pd_mpi_inherited) {
        pd_child_refuse("destroy_process_group");
        return NULL;
    }
    if (!pd_initialized) {
        PyErr_SetString(PyExc_ValueError, "destroy_process_group(): the default process group has not "
                        "been initialized");
        return NULL;
    }
    release_all();
    pd_parked_drain();
    pd_group_slots_free();
    pd_shm_session_stop();
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
    if (init && !fin && !pd_mpi_inherited) {   // a forked child's exit leaves the parent's MPI alone
        release_all();
        if (exit_barrier() < 0 || pd_parked_drain() > 0) {
            // A collective some rank never joined is still pending (or the wait for the others to
            // exit failed, timed out or was given up): MPI_Finalize would wait forever. Leave without
            // it; the launcher then reports this rank's exit and ends the job.
            const char *why = pd_liveness_exit_why();
            fprintf(stderr, "pydist: %s; skipping MPI_Finalize\n",
                    *why ? why : "an operation that never completed is still pending at exit");
            Py_RETURN_NONE;
        }
        pd_group_slots_free();
        pd_shm_session_stop();
        pd_initialized = 0;
        pd_ops_free();
        if (pd_liveness_forgotten() > 0 || pd_liveness_survive()) {
            // Once a rank has died, MPI_Finalize waits for it forever on MPICH 4.0.2 and 5.0.2 alike
            // (benchmarks/fault_probe/); and under --survive UCX carries large messages between ranks
            // of a host over TCP (no cross-memory attach), whose close hangs MPI_Finalize in one job
            // in a few (openucx/ucx#8738, scripts/cluster_finalize_guard.c). Every rank left has
            // completed every operation (the barrier above): leaving loses only the disconnect.
            return Py_NewRef(Py_None);
        }
        int rc;
        if (pd_wait_serialized) {
            rc = MPI_Finalize();   // serialised MPI: no other thread may be inside MPI meanwhile
        } else {
            Py_BEGIN_ALLOW_THREADS
            rc = MPI_Finalize();
            Py_END_ALLOW_THREADS
        }
        if (rc != MPI_SUCCESS) {
            return pd_raise_mpi(rc, "MPI_Finalize");   // at exit: atexit prints it
        }
    }
    Py_RETURN_NONE;
}

// _C.forget_ranks(world_ranks): see pd_liveness_forget. Collective over the survivors.
PyObject *pd_forget_ranks(PyObject *self, PyObject *arg) {
    (void)self;
    if (!pd_initialized) {
        PyErr_SetString(PyExc_ValueError, "forget_ranks(): the default process group has not been initialized");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(arg, "forget_ranks(): `world_ranks` must be a sequence of ints");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int *ranks = PyMem_RawMalloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    if (ranks == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long r;
        if (pd_arg_long(PySequence_Fast_GET_ITEM(seq, i), "forget_ranks", "world_ranks", &r) < 0 || r < 0 ||
            r >= pd_group_size(0) || r == pd_group_rank(0)) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_ValueError, "forget_ranks(): %ld is not another rank of the world", r);
            }
            PyMem_RawFree(ranks);
            Py_DECREF(seq);
            return NULL;
        }
        ranks[i] = (int)r;
    }
    Py_DECREF(seq);
    int rc = pd_liveness_forget(ranks, (int)n);
    PyMem_RawFree(ranks);
    return rc < 0 ? NULL : Py_NewRef(Py_None);
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
    if (init && !fin && !pd_mpi_inherited) {   // a forked child's failure is not the job's
        MPI_Abort(MPI_COMM_WORLD, (int)code);
    }
    Py_RETURN_NONE;
}

// _C.start_and_abort(code, seconds): a rank that fails before it started MPI, in a job of several, joins
// MPI's start-up, where the others wait for it, and aborts the job from there; at most `seconds` (the
// start-up's watch then ends this process, which ends the job as well).
PyObject *pd_start_and_abort(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long code = 1;
    double seconds;
    int init = 0, rc = MPI_SUCCESS;
    if (pd_check_nargs(nargs, 2, "start_and_abort") < 0 || pd_arg_long(args[0], "start_and_abort", "code", &code) < 0 ||
        ((seconds = PyFloat_AsDouble(args[1])) == -1.0 && PyErr_Occurred())) {
        return NULL;
    }
    MPI_Initialized(&init);
    if (!init && !pd_mpi_inherited) {
        char message[200];
        snprintf(message, sizeof message, "pydist: the other ranks did not join MPI's start-up within %g s; "
                 "ending this rank, and with it the job\n", seconds);
        StartupWatch watch;
        startup_watch_start(&watch, seconds, message);
        int provided;
        Py_BEGIN_ALLOW_THREADS
        rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SINGLE, &provided);
        Py_END_ALLOW_THREADS
        startup_watch_stop(&watch);
        if (rc == MPI_SUCCESS) {
            MPI_Abort(MPI_COMM_WORLD, (int)code);
        }
    }
    Py_RETURN_NONE;
}

// ---------------------------------------------------------------------------------------------------
// Queries: cheap, no GIL release.

PyObject *pd_get_rank(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long h;
    if (pd_check_nargs(nargs, 1, "get_rank") < 0 || pd_arg_long(args[0], "get_rank", "group", &h) < 0 ||
        pd_group_check(h, "get_rank") < 0) {
        return NULL;
    }
    return PyLong_FromLong(pd_group_rank(h));
}

PyObject *pd_get_world_size(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long h;
    if (pd_check_nargs(nargs, 1, "get_world_size") < 0 ||
        pd_arg_long(args[0], "get_world_size", "group", &h) < 0 || pd_group_check(h, "get_world_size") < 0) {
        return NULL;
    }
    return PyLong_FromLong(pd_group_size(h));
}

// Seconds from a set_*timeout argument (a number, not NaN): 0, or -1 with the exception set.
static int seconds_arg(PyObject *arg, const char *fn, double *out) {
    *out = PyFloat_AsDouble(arg);
    if (*out == -1.0 && PyErr_Occurred()) {
        return -1;
    }
    if (*out != *out) {
        PyErr_Format(PyExc_ValueError, "%s(): `seconds` must be a number, not NaN", fn);
        return -1;
    }
    return 0;
}

// _C.set_timeout(seconds) -> the old timeout: the session's for every later wait (< 0: none). The
// torch backend applies torch's init_process_group(timeout=...) with it when MPI was started earlier.
PyObject *pd_set_timeout(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    double timeout;
    if (pd_check_nargs(nargs, 1, "set_timeout") < 0 || seconds_arg(args[0], "set_timeout", &timeout) < 0) {
        return NULL;
    }
    return PyFloat_FromDouble(pd_set_session_timeout(timeout > 0 ? timeout : -1.0));
}

// _C.set_group_timeout(handle, seconds): a group's own timeout (new_group(timeout=)); < 0: the session's.
PyObject *pd_set_group_timeout(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    double timeout;
    if (pd_check_nargs(nargs, 2, "set_group_timeout") < 0 ||
        seconds_arg(args[1], "set_group_timeout", &timeout) < 0) {
        return NULL;
    }
    long handle = PyLong_AsLong(args[0]);
    if (handle == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (pd_group_set_timeout(handle, timeout < 0 ? -1.0 : timeout, "new_group") < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
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
    int len = 0, started = 0;
    MPI_Get_library_version(version, &len);
    if (thread_level < 0 && MPI_Initialized(&started) == MPI_SUCCESS && started) {
        MPI_Query_thread(&thread_level);   // MPI started by someone else (mpi4py)
    }
    PyObject *settings = env_settings();
    if (settings == NULL) {
        return NULL;
    }
    return Py_BuildValue("{s:s,s:i,s:s,s:O,s:O,s:O,s:i,s:O,s:N}", "library_version", version, "mpi_version",
                         MPI_VERSION, "abi", PD_MPI_ABI, "large_count", PD_MPI_LARGE_COUNT ? Py_True : Py_False,
                         "isendrecv", pd_mpi_has_isendrecv() ? Py_True : Py_False, "persistent_collectives",
                         pd_mpi_has_persistent() ? Py_True : Py_False, "thread_level", thread_level, "wait_spin",
                         pd_wait_spin ? Py_True : Py_False, "settings", settings);
}


// ---------------------------------------------------------------------------------------------------
// What a group is made with

// Everything a call on the group could otherwise have to set up with its peers is made here, while
// every member is in the (collective) creation anyway: the private communicator of pydist's algorithms
// and the shared-memory channel. So no call on a group ever waits for its peers to arrive to set
// something up: an async_op=True call returns at once, its group's first call included. On failure the
// group is not made (the caller frees the slot) and the error stands.
static int group_setup(int slot, const char *fn) {
    pd_call_group_made(slot);    // its id on the timeline, the same on every member
    return pd_paths_group_setup(slot, fn);
}

// ---------------------------------------------------------------------------------------------------
// Sub-groups

static PyObject *take_slot(MPI_Comm comm);

// MPI_Comm_create_group's tag for members-only groups (any fixed value: members create their groups
// in the same order, which is all MPI asks of calls with one tag).
#define MEMBERS_ONLY_TAG 7283

// _C.new_group(ranks[, members_only]) -> handle, or -1 on a rank that is not a member. Collective over
// the world, as in torch: every rank calls it with the same ranks (sorted, unique, checked by the
// caller and again here). Group ranks follow global rank order. members_only: only the members call
// it (MPI_Comm_create_group; the torch backend, whose non-members never reach it, after its own
// store-based arrival check): blocking in MPI, so the caller must know every member has arrived.
PyObject *pd_new_group(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *fn = "new_group";
    int members_only = 0;
    if (nargs == 2 && pd_arg_bool(args[1], fn, "members_only", &members_only) < 0) {
        return NULL;
    }
    if (nargs != 2 && pd_check_nargs(nargs, 1, fn) < 0) {
        return NULL;
    }
    // Members-only creation runs on the world's point-to-point messages (MPI_Comm_create_group's tag),
    // never its collectives: it still works once a timed-out collective has broken the default group,
    // which is how torch's default group is made afresh after destroy_process_group.
    if (members_only ? (pd_group_world_usable(fn) < 0) : pd_group_comm(0, fn) == NULL) {
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
        if (r < 0 || r >= pd_group_size(0) || r <= prev) {
            PyErr_Format(PyExc_ValueError, "new_group(): `ranks` must be sorted, unique ranks in [0, %d); "
                         "got %R", pd_group_size(0), args[0]);
            Py_DECREF(seq);
            return NULL;
        }
        prev = r;
        member |= (r == pd_group_rank(0));
    }
    if (members_only) {
        if (!member) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "new_group(): with members_only, only the members may call it");
            return NULL;
        }
        int *ranks = PyMem_RawMalloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
        if (ranks == NULL) {
            Py_DECREF(seq);
            return PyErr_NoMemory();
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            ranks[i] = (int)PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));   // checked above
        }
        Py_DECREF(seq);
        MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
        MPI_Comm comm = MPI_COMM_NULL;
        int rc = MPI_Comm_group(pd_group_world_comm(), &world_group);
        if (rc == MPI_SUCCESS) {
            rc = MPI_Group_incl(world_group, (int)n, ranks, &group);
        }
        PyMem_RawFree(ranks);
        if (rc == MPI_SUCCESS && pd_wait_serialized) {   // another thread must not enter MPI meanwhile
            rc = MPI_Comm_create_group(pd_group_world_comm(), group, MEMBERS_ONLY_TAG, &comm);
        } else if (rc == MPI_SUCCESS) {
            MPI_Comm world = pd_group_world_comm();
            Py_BEGIN_ALLOW_THREADS
            rc = MPI_Comm_create_group(world, group, MEMBERS_ONLY_TAG, &comm);
            Py_END_ALLOW_THREADS
        }
        if (group != MPI_GROUP_NULL) {
            MPI_Group_free(&group);
        }
        if (world_group != MPI_GROUP_NULL) {
            MPI_Group_free(&world_group);
        }
        if (rc != MPI_SUCCESS) {
            return pd_raise_mpi(rc, "MPI_Comm_create_group");
        }
        return take_slot(comm);
    }
    Py_DECREF(seq);
    // Everyone arrives first through our interruptible wait; the split itself is blocking in MPI
    // and would otherwise spin with no timeout if a rank never came.
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Ibarrier(pd_group_world_comm(), &req);
    if (rc != MPI_SUCCESS) {
        return pd_raise_mpi(rc, "MPI_Ibarrier");
    }
    PdOp op = pd_op(fn, 0, PD_PEER_ALL);
    if (pd_op_wait_or_park(&req, MPI_STATUS_IGNORE, &op, NULL, 0) < 0) {
        return NULL;
    }
    MPI_Comm world = pd_group_world_comm(), comm = MPI_COMM_NULL;
    int world_rank = pd_group_rank(0);
    if (pd_wait_serialized) {
        rc = MPI_Comm_split(world, member ? 0 : MPI_UNDEFINED, world_rank, &comm);
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = MPI_Comm_split(world, member ? 0 : MPI_UNDEFINED, world_rank, &comm);
        Py_END_ALLOW_THREADS
    }
    if (rc != MPI_SUCCESS) {
        return pd_raise_mpi(rc, "MPI_Comm_split");
    }
    if (!member) {
        return PyLong_FromLong(-1);
    }
    return take_slot(comm);
}

// A new sub-group's slot for comm (freed on failure). The slot is chosen and taken with the GIL held
// throughout, so two threads cannot take one slot.
static PyObject *take_slot(MPI_Comm comm) {
    int slot = pd_group_slot_unused();
    if (slot < 0) {
        MPI_Comm_free(&comm);
        PyErr_Format(pd_DistError, "new_group(): too many live process groups (%d); destroy some first",
                     PD_MAX_GROUPS - 1);
        return NULL;
    }
    if (pd_group_slot_set(slot, comm) < 0) {
        MPI_Comm_free(&comm);
        return NULL;
    }
    if (group_setup(slot, "new_group") < 0) {
        release_slot(slot);
        return NULL;
    }
    return PyLong_FromLong(slot);
}

// _C.destroy_group(handle): free one sub-group's communicator (local; the world is slot 0).
PyObject *pd_destroy_group(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long h;
    if (pd_check_nargs(nargs, 1, "destroy_group") < 0 || pd_arg_long(args[0], "destroy_group", "group", &h) < 0 ||
        (pd_mpi_inherited && pd_child_refuse("destroy_process_group") < 0)) {
        return NULL;
    }
    if (h <= 0 || h >= PD_MAX_GROUPS || !pd_group_live(h)) {
        PyErr_Format(PyExc_ValueError, "destroy_process_group(): `group` is not a live sub-group (handle %ld)", h);
        return NULL;
    }
    release_slot((int)h);
    Py_RETURN_NONE;
}

// _C.live_groups() -> number of communicators this rank holds, private ones included (for leak tests).
PyObject *pd_live_groups(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    long n = 0;
    for (int i = 0; i < PD_MAX_GROUPS; i++) {
        n += pd_group_live(i);
    }
    n += pd_private_comm_count();   // the private dups of pydist's algorithms
    return PyLong_FromLong(n);
}
