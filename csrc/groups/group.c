/*
 * group.c: the session (MPI start-up and shut-down, the settings init_process_group chose), the table
 * of process groups, and how an operation on a group is waited for.
 *
 * MPI is initialised once per process and finalised once, at interpreter exit. A process group is a
 * slot in a table holding its communicator and the world ranks of its members; destroy_process_group
 * frees the communicators but leaves MPI running, so a later init_process_group works, as it does in
 * torch. Every communicator gets MPI_ERRORS_RETURN the moment it exists, so no MPI error can kill the
 * interpreter silently.
 *
 * Waiting for an operation (pd_op_wait) is where the layers meet: wait.c's loop, with the session's
 * timeout, and a check that ends the wait when a rank the operation needs has exited (liveness.c
 * records departures; this file knows which ranks an operation needs). A collective that timed out
 * breaks its group (the ranks no longer agree on which collective comes next); a point-to-point call
 * that timed out does not, since collectives never match point-to-point messages.
 */
#include "core/pydist.h"

typedef struct {
    MPI_Comm comm;       // MPI_COMM_NULL: free slot, or this process is not a member
    int rank;            // this process's rank in the group
    int size;
    int in_use;
    unsigned generation; // bumped whenever the slot is freed, so a stale PdOp can tell
    int *world_ranks;    // [size]: the world rank of each group rank
    int *group_ranks;    // [world size]: the group rank of each world rank, -1 if not a member
    char broken[256];    // non-empty: a collective timed out and the group must not be used again
    // pydist's own algorithms (the ring) talk on a private dup of `comm`, made with the group, so their
    // messages never match the user's point-to-point traffic on the group.
    int algo_state;          // ALGO_NONE, ALGO_DUPPING (algo_dup pending) or ALGO_READY
    int algo_dup_waiting;    // a thread is waiting for algo_dup
    MPI_Comm algo_comm;      // ALGO_READY: the private communicator
    MPI_Request algo_dup;    // ALGO_DUPPING: the MPI_Comm_idup
    MPI_Comm *algo_dup_out;  // ALGO_DUPPING: where it writes the new handle (heap: it may outlive the slot)
    unsigned long algo_seq;  // rings started on this group: the next one's tag (mod the tag bound)
    void *shm;               // the shared-memory channel (shared_memory.c), made with the group; NULL: none
} GroupSlot;

enum { ALGO_NONE = 0, ALGO_DUPPING = 1, ALGO_READY = 2 };

static int group_setup(int slot, const char *fn);

static GroupSlot groups[PD_MAX_GROUPS];
int pd_initialized = 0;

// The session: what MPI gave us and what init_process_group asked for.
static int thread_level = -1;          // MPI's provided level; -1 before MPI_Init
static double default_timeout = -1.0;  // seconds, < 0: none
static char init_failure[300];         // non-empty: an init timed out and left MPI unusable for us
static int tag_ub = 32767;             // MPI_TAG_UB (the standard's minimum until init reads it)

// A rank whose exit notice arrived is given this long before the waits that need it fail: the normal
// race at the end of a job, where a rank that finished the last collective first announces its exit
// while a peer is still completing that same collective.
#define GRACE_SECONDS 2.0

double pd_session_timeout(void) {
    return default_timeout;
}

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
    if (pd_mpi_inherited) {   // a forked child: the MPI here is the parent's (child.c)
        pd_child_refuse(fn);
        return NULL;
    }
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

// Translations are table lookups filled in when the group was made: they cannot fail.
int pd_group_from_global(long handle, int global_rank) {
    if (global_rank < 0 || global_rank >= groups[0].size) {
        return MPI_UNDEFINED;
    }
    int r = groups[handle].group_ranks[global_rank];
    return r < 0 ? MPI_UNDEFINED : r;
}

int pd_group_to_global(long handle, int group_rank) {
    if (group_rank < 0 || group_rank >= groups[handle].size) {
        return MPI_UNDEFINED;
    }
    return groups[handle].world_ranks[group_rank];
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
    if (r == MPI_UNDEFINED) {
        PyErr_Format(PyExc_ValueError, "%s(): `%s` = %ld is not a member of `group`", fn, arg, global_rank);
        return -1;
    }
    return r;
}

// ---------------------------------------------------------------------------------------------------
// Slots

// ---------------------------------------------------------------------------------------------------
// The private communicator of pydist's own algorithms

// A dup still pending when its group goes: parked, with a capsule owning the cell MPI writes the new
// handle into, which frees that communicator once the dup has completed (pd_parked_drain).
static void dup_cell_free(PyObject *capsule) {
    MPI_Comm *cell = PyCapsule_GetPointer(capsule, "pydist.dup_cell");
    int fin = 1;
    MPI_Finalized(&fin);
    if (cell != NULL && !fin && *cell != MPI_COMM_NULL) {
        MPI_Comm_free(cell);
    }
    PyMem_RawFree(cell);
}

// Before a slot's communicators go: rings in flight on it are abandoned (their step parked), a pending
// dup is parked, a finished one freed. GIL held.
static void algo_release(int slot) {
    GroupSlot *g = &groups[slot];
    pd_paths_group_release(slot, g->generation);   // what the paths have in flight goes before the communicators
    if (g->algo_state == ALGO_DUPPING) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *keep = PyCapsule_New(g->algo_dup_out, "pydist.dup_cell", dup_cell_free);
        if (keep == NULL) {
            PyErr_Clear();   // out of memory: the cell is leaked on purpose, MPI may still write it
        }
        pd_park(g->algo_dup, keep, 0);
        PyErr_Restore(type, value, tb);
    } else if (g->algo_state == ALGO_READY) {
        MPI_Comm_free(&g->algo_comm);
    }
    g->algo_state = ALGO_NONE;
    g->algo_dup = MPI_REQUEST_NULL;
    g->algo_dup_out = NULL;
    g->algo_comm = MPI_COMM_NULL;
    g->algo_seq = 0;
}

MPI_Comm *pd_group_algo_comm(long handle, const char *fn, int *tag) {
    GroupSlot *g = &groups[handle];
    int rc;
    if (g->algo_state == ALGO_NONE) {
        // Every member makes its group's first ring call at the same point of its collective sequence,
        // so every member starts this dup there too.
        MPI_Comm *cell = PyMem_RawMalloc(sizeof *cell);
        if (cell == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        *cell = MPI_COMM_NULL;
        if ((rc = MPI_Comm_idup(g->comm, cell, &g->algo_dup)) != MPI_SUCCESS) {
            PyMem_RawFree(cell);
            pd_raise_mpi(rc, "MPI_Comm_idup");
            return NULL;
        }
        g->algo_dup_out = cell;
        g->algo_state = ALGO_DUPPING;
    }
    if (g->algo_state == ALGO_DUPPING) {
        if (g->algo_dup_waiting) {
            PyErr_Format(pd_DistError, "%s(): another thread is setting up this group's ring communicator; "
                         "collectives on one group must not be called from two threads at once", fn);
            return NULL;
        }
        // A wait given up (Ctrl-C, timeout) leaves the dup pending here: the next call waits on for it.
        PdOp op = pd_op(fn, handle, PD_PEER_ALL);
        unsigned generation = g->generation;
        g->algo_dup_waiting = 1;
        rc = pd_op_wait(&g->algo_dup, MPI_STATUS_IGNORE, &op, default_timeout, 1);
        if (g->generation != generation) {
            // another thread destroyed the group meanwhile (it parked the dup)
            if (rc == 0) {
                PyErr_Format(PyExc_ValueError, "%s(): `group` was destroyed while this call waited", fn);
            }
            return NULL;
        }
        g->algo_dup_waiting = 0;
        if (rc < 0) {
            if (g->algo_dup == MPI_REQUEST_NULL) {   // completed with an error: start again next time
                PyMem_RawFree(g->algo_dup_out);
                g->algo_dup_out = NULL;
                g->algo_state = ALGO_NONE;
            }
            return NULL;
        }
        g->algo_comm = *g->algo_dup_out;
        PyMem_RawFree(g->algo_dup_out);
        g->algo_dup_out = NULL;
        g->algo_state = ALGO_READY;
        if ((rc = MPI_Comm_set_errhandler(g->algo_comm, MPI_ERRORS_RETURN)) != MPI_SUCCESS) {
            MPI_Comm_free(&g->algo_comm);
            g->algo_state = ALGO_NONE;
            pd_raise_mpi(rc, "MPI_Comm_set_errhandler");
            return NULL;
        }
    }
    // Rings in flight at once on one group must not match each other's messages: each has its own tag,
    // in the lower half of the tags (the upper half is pd_group_ring_tag's).
    *tag = (int)(g->algo_seq++ % ((unsigned long)tag_ub / 2 + 1));
    return &g->algo_comm;
}

int pd_group_ring_tag(unsigned long long round) {
    unsigned long half = (unsigned long)tag_ub / 2;
    return (int)(half + 1 + round % ((unsigned long)tag_ub - half));
}

MPI_Comm *pd_group_private_comm(long handle) {
    return groups[handle].algo_state == ALGO_READY ? &groups[handle].algo_comm : NULL;
}

// Before every pending request is drained (destroy, finalize): nothing of ours may stay unparked.
static void algo_release_all(void) {
    for (int i = 0; i < PD_MAX_GROUPS; i++) {
        if (groups[i].in_use) {
            algo_release(i);
        }
    }
}

// Frees here and on the error paths of init and new_group ignore MPI's return code: there is nothing
// left to undo, and the error being raised (if any) is the one the caller needs to see.
static void slot_free(int slot) {
    GroupSlot *g = &groups[slot];
    if (g->in_use) {
        algo_release(slot);
    }
    if (g->in_use && g->comm != MPI_COMM_NULL) {
        MPI_Comm_free(&g->comm);
    }
    PyMem_RawFree(g->world_ranks);
    PyMem_RawFree(g->group_ranks);
    g->world_ranks = g->group_ranks = NULL;
    g->comm = MPI_COMM_NULL;
    g->in_use = 0;
    g->broken[0] = 0;
    g->generation++;
}

// Take `comm` into `slot`: error handler, rank, size and the rank tables. On failure the slot stays
// free and the caller still owns comm.
static int slot_set(int slot, MPI_Comm comm) {
    GroupSlot *g = &groups[slot];
    const char *call = "MPI_Comm_set_errhandler";
    int rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS && (rc = MPI_Comm_rank(comm, &g->rank)) != MPI_SUCCESS) call = "MPI_Comm_rank";
    if (rc == MPI_SUCCESS && (rc = MPI_Comm_size(comm, &g->size)) != MPI_SUCCESS) call = "MPI_Comm_size";
    if (rc != MPI_SUCCESS) {
        return pd_raise_mpi_int(rc, call);
    }
    int world = slot == 0 ? g->size : groups[0].size;
    int *world_ranks = PyMem_RawMalloc(sizeof(int) * (size_t)g->size);
    int *group_ranks = PyMem_RawMalloc(sizeof(int) * (size_t)world);
    int *mine = PyMem_RawMalloc(sizeof(int) * (size_t)g->size);
    if (world_ranks == NULL || group_ranks == NULL || mine == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    if (slot == 0) {
        for (int i = 0; i < g->size; i++) {
            world_ranks[i] = i;
        }
    } else {
        // Our world communicator's group, not MPI_COMM_WORLD's: ranks are the same, but this keeps the
        // translation within the communicators pydist owns.
        MPI_Group from = MPI_GROUP_NULL, to = MPI_GROUP_NULL;
        for (int i = 0; i < g->size; i++) {
            mine[i] = i;
        }
        call = "MPI_Comm_group";
        rc = MPI_Comm_group(comm, &from);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_group(groups[0].comm, &to);
        if (rc == MPI_SUCCESS) {
            call = "MPI_Group_translate_ranks";
            rc = MPI_Group_translate_ranks(from, g->size, mine, to, world_ranks);
        }
        if (from != MPI_GROUP_NULL) MPI_Group_free(&from);
        if (to != MPI_GROUP_NULL) MPI_Group_free(&to);
        if (rc != MPI_SUCCESS) {
            pd_raise_mpi(rc, call);
            goto error;
        }
    }
    for (int i = 0; i < world; i++) {
        group_ranks[i] = -1;
    }
    for (int i = 0; i < g->size; i++) {
        if (world_ranks[i] < 0 || world_ranks[i] >= world) {
            PyErr_Format(pd_DistError, "new_group(): MPI translated group rank %d to world rank %d", i,
                         world_ranks[i]);
            goto error;
        }
        group_ranks[world_ranks[i]] = i;
    }
    PyMem_RawFree(mine);
    g->world_ranks = world_ranks;
    g->group_ranks = group_ranks;
    g->comm = comm;
    g->in_use = 1;
    g->broken[0] = 0;
    g->algo_state = ALGO_NONE;
    g->algo_dup_waiting = 0;
    g->algo_comm = MPI_COMM_NULL;
    g->algo_dup = MPI_REQUEST_NULL;
    g->algo_dup_out = NULL;
    g->algo_seq = 0;
    g->shm = NULL;
    return 0;
error:
    PyMem_RawFree(world_ranks);
    PyMem_RawFree(group_ranks);
    PyMem_RawFree(mine);
    return -1;
}

static void free_groups(void) {
    for (int i = 0; i < PD_MAX_GROUPS; i++) {
        slot_free(i);
    }
}

// ---------------------------------------------------------------------------------------------------
// Waiting for an operation on a group

PdOp pd_op(const char *what, long group, int peer) {
    unsigned generation = group >= 0 && group < PD_MAX_GROUPS ? groups[group].generation : 0;
    return (PdOp){what, group, generation, peer, 0};
}

// The slot `op` was started on, or NULL if that group has since been destroyed (the slot freed, and
// perhaps taken again by another group).
static GroupSlot *op_group(const PdOp *op) {
    if (op->group < 0 || op->group >= PD_MAX_GROUPS || !groups[op->group].in_use ||
        groups[op->group].generation != op->generation) {
        return NULL;
    }
    return &groups[op->group];
}

// Does `op` need world rank `w` to complete? A stale op (its group destroyed) is assumed to need
// everyone: nothing else can be known about it.
static int op_needs(const PdOp *op, int w) {
    if (op_group(op) == NULL) {
        return 1;
    }
    int r = pd_group_from_global(op->group, w);
    if (r == MPI_UNDEFINED || r < op->survivable) {
        return 0;   // not a member (no message of this group can come from it), or one it can do without
    }
    return op->peer == PD_PEER_ALL || op->peer == MPI_ANY_SOURCE || op->peer == r;
}

// wait.c's periodic check: give up once a rank the operation needs has been gone GRACE_SECONDS.
static int departed_check(void *ctx, double wait_started) {
    const PdOp *op = ctx;
    if (op_group(op) != NULL) {
        pd_stall_check(op, wait_started);   // a wait past PYDIST_STALL_WARN says whom it waits for
    }
    pd_liveness_poll();
    if (pd_liveness_departures() == 0) {
        return 0;
    }
    double now = MPI_Wtime();
    int first = -1;   // of the ranks past their grace, the one that left first (the cause, not a consequence)
    for (int w = 0; w < groups[0].size; w++) {
        double left = pd_liveness_left(w);
        if (left == 0.0 || now - (left > wait_started ? left : wait_started) < GRACE_SECONDS || !op_needs(op, w)) {
            continue;
        }
        if (first < 0 || left < pd_liveness_left(first)) first = w;
    }
    if (first < 0) {
        return 0;
    }
    PyErr_Format(pd_DistError, "%s cannot complete: rank %d has exited (%s) while this rank was waiting for it",
                 op->what, first, pd_liveness_cause(first));
    return -1;
}

// How many of the group's ranks below op->survivable have left.
static int survivable_departures(const PdOp *op) {
    int n = 0;
    for (int r = 0; r < op->survivable; r++) {
        n += pd_liveness_left(pd_group_to_global(op->group, r)) != 0.0;
    }
    return n;
}

typedef struct {
    const PdOp *op;
    int handled;
} DepartureWatch;

// pd_op_wait_any_or_departure's check: end the wait (1) on a new departure the caller can do without;
// the others' departures as departed_check.
static int departure_check(void *ctx, double wait_started) {
    const DepartureWatch *d = ctx;
    if (departed_check((void *)d->op, wait_started) < 0) {
        return -1;
    }
    return pd_liveness_departures() > 0 && op_group(d->op) != NULL && survivable_departures(d->op) > d->handled;
}

int pd_op_wait_any_or_departure(int n, MPI_Request *reqs, int first, int *index, MPI_Status *status,
                                const PdOp *op, double since, int handled) {
    DepartureWatch d = {op, handled};
    PdWaitSpec spec = {op->what, default_timeout, departure_check, &d, since};
    int known = departure_check(&d, since > 0 ? since : MPI_Wtime());
    if (known != 0) {
        *index = -1;   // already known (or a rank it needs is gone): no need to wait a slice
        return known < 0 ? -1 : 0;
    }
    return pd_wait_any(n, reqs, first, index, status, &spec);
}

int pd_group_rank_left(long handle, int r) {
    pd_liveness_poll();
    if (handle < 0 || handle >= PD_MAX_GROUPS || !groups[handle].in_use) {
        return 0;
    }
    int w = pd_group_to_global(handle, r);
    return w != MPI_UNDEFINED && pd_liveness_left(w) != 0.0;
}

int pd_op_check(const PdOp *op, double since) {
    return departed_check((void *)op, since);
}

void pd_group_break(long handle, const char *why) {
    if (handle >= 0 && handle < PD_MAX_GROUPS && groups[handle].in_use && !groups[handle].broken[0]) {
        snprintf(groups[handle].broken, sizeof groups[handle].broken, "%s", why);
    }
}

void **pd_group_shm(long handle) {
    return &groups[handle].shm;
}

int pd_op_wait(MPI_Request *req, MPI_Status *status, const PdOp *op, double timeout, int timeout_breaks) {
    PdWaitSpec spec = {op->what, timeout, departed_check, (void *)op, 0.0};
    if (pd_wait(req, status, &spec) == 0) {
        return 0;
    }
    GroupSlot *g = op_group(op);
    if (timeout_breaks && op->peer == PD_PEER_ALL && PyErr_ExceptionMatches(pd_DistTimeoutError) && g != NULL &&
        !g->broken[0]) {
        snprintf(g->broken, sizeof g->broken, "%s timed out after %.1f s", op->what, timeout);
    }
    return -1;
}

int pd_op_wait_any(int n, MPI_Request *reqs, int first, int *index, MPI_Status *status, const PdOp *op,
                   double since) {
    PdWaitSpec spec = {op->what, default_timeout, departed_check, (void *)op, since};
    return pd_wait_any(n, reqs, first, index, status, &spec);
}

// A blocking receive that was given up must not stay posted: it would take the next message its peer
// sends, meant for a later receive. Cancel it; if the message had already arrived, the receive has
// completed after all (1: keep the result). Returns 0 when cancelled, 1 when completed, -1 when MPI
// failed (the request is then still pending).
static int cancel_receive(MPI_Request *req, MPI_Status *status) {
    MPI_Status st;
    int cancelled = 0;
    if (MPI_Cancel(req) != MPI_SUCCESS || MPI_Wait(req, &st) != MPI_SUCCESS ||
        MPI_Test_cancelled(&st, &cancelled) != MPI_SUCCESS) {
        return -1;
    }
    if (!cancelled && status != MPI_STATUS_IGNORE) {
        *status = st;
    }
    return cancelled ? 0 : 1;
}

int pd_op_wait_or_park(MPI_Request *req, MPI_Status *status, const PdOp *op, PyObject *keep, int cancellable) {
    if (pd_op_wait(req, status, op, default_timeout, 1) == 0) {
        return 0;
    }
    if (cancellable && *req != MPI_REQUEST_NULL) {
        int got = cancel_receive(req, status);
        if (got == 1 && !PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
            PyErr_Clear();   // the message arrived as the wait gave up: the receive succeeded
            return 0;
        }
        if (got >= 0) {
            return -1;       // cancelled (or interrupted): nothing is left posted
        }
    }
    if (*req != MPI_REQUEST_NULL) {
        pd_park(*req, Py_XNewRef(keep), cancellable);
        *req = MPI_REQUEST_NULL;
    }
    return -1;
}

// ---------------------------------------------------------------------------------------------------
// init / destroy / finalize

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
// naming the variable, before MPI starts. A byte count is decimal digits alone (no sign, which
// strtoull would wrap to a huge count; no spaces, suffix or exponent) up to ENV_BYTES_MAX, room to
// multiply by any node's ranks without overflow.
#define ENV_BYTES_MAX ((unsigned long long)1 << 40)   // 1 TiB

static const char *const ENV_BYTES[] = {"PYDIST_SHM_BYTES", "PYDIST_SHM_SMALL_BYTES", "PYDIST_SHM_STAGE",
                                        "PYDIST_PERSISTENT_BYTES"};
static const char *const THREAD_LEVELS[] = {"single", "funneled", "serialized", "multiple"};   // MPI's order

// 0 and *out, or -1 when v is not a byte count.
static int parse_bytes(const char *v, unsigned long long *out) {
    unsigned long long x = 0;
    for (const char *c = v; *c; c++) {
        if (*c < '0' || *c > '9' || (x = x * 10 + (unsigned long long)(*c - '0')) > ENV_BYTES_MAX) {
            return -1;
        }
    }
    *out = x;
    return *v ? 0 : -1;
}

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
    if (parse_bytes(v, &bytes) < 0) {
        PyErr_Format(PyExc_ValueError, "%s must be a byte count, decimal digits alone, at most %llu (or unset: "
                     "the default); got '%.100s'", name, ENV_BYTES_MAX, v);
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(bytes);
}

// {name: value or None} of every setting C reads; NULL with a ValueError naming the first malformed one.
static PyObject *env_settings(void) {
    PyObject *out = PyDict_New();
    for (size_t i = 0; out != NULL && i <= sizeof ENV_BYTES / sizeof *ENV_BYTES; i++) {
        const char *name = i < sizeof ENV_BYTES / sizeof *ENV_BYTES ? ENV_BYTES[i] : "PYDIST_THREAD_LEVEL";
        PyObject *value = env_setting(name);
        if (value == NULL || PyDict_SetItemString(out, name, value) < 0) {
            Py_CLEAR(out);
        }
        Py_XDECREF(value);
    }
    return out;
}

size_t pd_env_bytes(const char *name, size_t dflt) {
    const char *v = getenv(name);
    unsigned long long x;
    // init refused a malformed value; one set since (init reads most once) is ignored, as unset
    return v != NULL && parse_bytes(v, &x) == 0 ? (size_t)x : dflt;
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

// Start MPI (or adopt a running one: mpi4py may have started it) and check its thread level. We
// release the GIL around MPI calls, so another thread may call in while one waits: MULTIPLE is what
// we want; with SERIALIZED the wait loop keeps the GIL while it tests (wait.c), which serialises every
// MPI call of ours; anything less cannot be made safe, and is refused.
static int start_mpi(void) {
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
        Py_BEGIN_ALLOW_THREADS
        rc = MPI_Init_thread(NULL, NULL, required, &provided);
        Py_END_ALLOW_THREADS
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

// _C.init(timeout_seconds) -> (rank, size, thread_level). timeout < 0: none.
PyObject *pd_init(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int rc, size = 1;
    if (pd_check_nargs(nargs, 1, "init") < 0) {
        return NULL;
    }
    double timeout = PyFloat_AsDouble(args[0]);
    if ((timeout == -1.0 && PyErr_Occurred()) || pd_child_check_init() < 0) {
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
    if (start_mpi() < 0 || pd_ops_init() < 0) {
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
    if (slot_set(0, pending_world) < 0) {
        MPI_Comm_free(&pending_world);
        MPI_Comm_free(&pending_algo);
        if (want_ctl) MPI_Comm_free(&pending_ctl);
        return NULL;
    }
    pending_world = MPI_COMM_NULL;
    groups[0].algo_comm = pending_algo;   // group_setup finds it made
    groups[0].algo_state = ALGO_READY;
    pending_algo = MPI_COMM_NULL;
    if ((rc = MPI_Comm_set_errhandler(groups[0].algo_comm, MPI_ERRORS_RETURN)) != MPI_SUCCESS) {
        pd_raise_mpi(rc, "MPI_Comm_set_errhandler");
        slot_free(0);
        if (want_ctl) MPI_Comm_free(&pending_ctl);
        return NULL;
    }
    if (want_ctl) {
        if ((rc = MPI_Comm_set_errhandler(pending_ctl, MPI_ERRORS_RETURN)) != MPI_SUCCESS) {
            pd_raise_mpi(rc, "MPI_Comm_set_errhandler");
        }
        if (rc != MPI_SUCCESS || pd_liveness_start(pending_ctl) < 0) {
            MPI_Comm_free(&pending_ctl);
            slot_free(0);
            return NULL;
        }
        pending_ctl = MPI_COMM_NULL;
        ctl_made = 1;
    }
    int *ub = NULL, has_ub = 0;
    if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &has_ub) == MPI_SUCCESS && has_ub && *ub > 0) {
        tag_ub = *ub;
    }
    // The shared-memory segment of the node's ranks (collective; on failure pydist says so once and
    // uses MPI's all-reduce instead).
    pd_stall_read_env();   // before the segment: its board is written only when the inspector is on
    if (pd_shm_session_start(groups[0].comm, timeout) < 0) {
        slot_free(0);
        return NULL;
    }
    pd_wait_set_cores(pd_shm_node_ranks());
    default_timeout = timeout;
    pd_persist_read_env();
    pd_initialized = 1;   // the world group's set-up runs as a call on it
    if (group_setup(0, "init_process_group") < 0) {
        pd_initialized = 0;
        slot_free(0);
        pd_shm_session_stop();
        return NULL;
    }
    return Py_BuildValue("iii", groups[0].rank, groups[0].size, thread_level);
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
    algo_release_all();
    pd_parked_drain();
    free_groups();
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
        algo_release_all();
        if (pd_liveness_announce() < 0 || pd_parked_drain() > 0) {
            // A collective some rank never joined is still pending (or the wait for the others to
            // exit failed, timed out or was given up): MPI_Finalize would wait forever. Leave without
            // it; the launcher then reports this rank's exit and ends the job.
            const char *why = pd_liveness_exit_why();
            fprintf(stderr, "pydist: %s; skipping MPI_Finalize\n",
                    *why ? why : "an operation that never completed is still pending at exit");
            Py_RETURN_NONE;
        }
        free_groups();
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
            r >= groups[0].size || r == groups[0].rank) {
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

// _C.set_timeout(seconds) -> the old timeout: the session's for every later wait (< 0: none). The
// torch backend applies torch's init_process_group(timeout=...) with it when MPI was started earlier.
PyObject *pd_set_timeout(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (pd_check_nargs(nargs, 1, "set_timeout") < 0) {
        return NULL;
    }
    double timeout = PyFloat_AsDouble(args[0]);
    if (timeout == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    if (timeout != timeout) {
        PyErr_SetString(PyExc_ValueError, "set_timeout(): `seconds` must be a number, not NaN");
        return NULL;
    }
    double old = default_timeout;
    default_timeout = timeout > 0 ? timeout : -1.0;
    return PyFloat_FromDouble(old);
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
    return Py_BuildValue("{s:s,s:i,s:i,s:O,s:N}", "library_version", version, "mpi_version", MPI_VERSION,
                         "thread_level", thread_level, "wait_spin", pd_wait_spin ? Py_True : Py_False, "settings",
                         settings);
}


// ---------------------------------------------------------------------------------------------------
// What a group is made with

// Everything a call on the group could otherwise have to set up with its peers is made here, while
// every member is in the (collective) creation anyway: the private communicator of pydist's algorithms
// and the shared-memory channel. So no call on a group ever waits for its peers to arrive to set
// something up: an async_op=True call returns at once, its group's first call included. On failure the
// group is not made (the caller frees the slot) and the error stands.
static int group_setup(int slot, const char *fn) {
    int tag;
    if (pd_group_algo_comm(slot, fn, &tag) == NULL) {
        return -1;
    }
    groups[slot].algo_seq = 0;   // no ring has used that tag
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
    if ((nargs != 2 && pd_check_nargs(nargs, 1, fn) < 0) || pd_group_comm(0, fn) == NULL) {
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
        int rc = MPI_Comm_group(groups[0].comm, &world_group);
        if (rc == MPI_SUCCESS) {
            rc = MPI_Group_incl(world_group, (int)n, ranks, &group);
        }
        PyMem_RawFree(ranks);
        if (rc == MPI_SUCCESS && pd_wait_serialized) {   // another thread must not enter MPI meanwhile
            rc = MPI_Comm_create_group(groups[0].comm, group, MEMBERS_ONLY_TAG, &comm);
        } else if (rc == MPI_SUCCESS) {
            MPI_Comm world = groups[0].comm;
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
    int rc = MPI_Ibarrier(groups[0].comm, &req);
    if (rc != MPI_SUCCESS) {
        return pd_raise_mpi(rc, "MPI_Ibarrier");
    }
    PdOp op = pd_op(fn, 0, PD_PEER_ALL);
    if (pd_op_wait_or_park(&req, MPI_STATUS_IGNORE, &op, NULL, 0) < 0) {
        return NULL;
    }
    MPI_Comm world = groups[0].comm, comm = MPI_COMM_NULL;
    int world_rank = groups[0].rank;
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
    int slot = -1;
    for (int i = 1; i < PD_MAX_GROUPS && slot < 0; i++) {
        if (!groups[i].in_use) {
            slot = i;
        }
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
    if (group_setup(slot, "new_group") < 0) {
        slot_free(slot);
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
    if (h <= 0 || h >= PD_MAX_GROUPS || !groups[h].in_use) {
        PyErr_Format(PyExc_ValueError, "destroy_process_group(): `group` is not a live sub-group (handle %ld)", h);
        return NULL;
    }
    slot_free((int)h);
    Py_RETURN_NONE;
}

// _C.live_groups() -> number of communicators this rank holds, private ones included (for leak tests).
PyObject *pd_live_groups(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    long n = 0;
    for (int i = 0; i < PD_MAX_GROUPS; i++) {
        n += groups[i].in_use && groups[i].comm != MPI_COMM_NULL;
        n += groups[i].in_use && groups[i].algo_state == ALGO_READY;   // the ring's private dup
    }
    return PyLong_FromLong(n);
}
