/*
 * group.c: the table of process groups. A process group is a slot holding its communicator and the
 * world ranks of its members; Python refers to it by the slot's index (slot 0: the world, a dup of
 * MPI_COMM_WORLD). Every communicator gets MPI_ERRORS_RETURN the moment it exists, so no MPI error can
 * kill the interpreter silently.
 *
 * Below everything that communicates: lookups, rank translation, and what an operation on a group is
 * (PdOp). It calls nothing above it; the session (session/session.c) fills and empties the slots, and
 * runs the paths' hooks around that (a slot's communicators go only after the paths have let go).
 */
#include <stdio.h>
#include <string.h>

#include "groups/group.h"
#include "groups/child.h"
#include "core/errors.h"

typedef struct {
    MPI_Comm comm;       // MPI_COMM_NULL: free slot, or this process is not a member
    int rank;            // this process's rank in the group
    int size;
    int in_use;
    unsigned generation; // bumped whenever the slot is freed, so a stale PdOp can tell
    int *world_ranks;    // [size]: the world rank of each group rank
    int *group_ranks;    // [world size]: the group rank of each world rank, -1 if not a member
    char broken[256];    // non-empty: a collective timed out and the group must not be used again
    void *shm;           // the shared-memory channel (shared_memory.c), made with the group; NULL: none
    unsigned long caller;  // the thread inside a collective call on the group (calls > 0)
    int calls;             // how deep that thread is (a signal handler's collective may nest)
    const char *calling;   // the outermost call's name, for the error another thread gets
    double timeout;        // this group's own (torch's new_group(timeout=)), seconds; < 0: the session's
} GroupSlot;

static GroupSlot groups[PD_MAX_GROUPS];
int pd_initialized = 0;
static double default_timeout = -1.0;  // the session's, seconds; < 0: none

double pd_session_timeout(void) {
    return default_timeout;
}

double pd_set_session_timeout(double seconds) {
    double old = default_timeout;
    default_timeout = seconds;
    return old;
}

double pd_group_timeout(long handle) {
    if (handle > 0 && handle < PD_MAX_GROUPS && groups[handle].in_use && groups[handle].timeout >= 0) {
        return groups[handle].timeout;
    }
    return default_timeout;
}

int pd_group_set_timeout(long handle, double seconds, const char *fn) {
    if (handle == 0) {
        PyErr_Format(PyExc_ValueError, "%s(): the default group's timeout is the session's "
                     "(init_process_group(timeout=...))", fn);
        return -1;
    }
    if (pd_group_check(handle, fn) < 0) {
        return -1;
    }
    groups[handle].timeout = seconds;
    return 0;
}

// ---------------------------------------------------------------------------------------------------
// Lookup

// Initialised, and a live group of this rank? (Raises ValueError otherwise.) Queries stop here:
// a broken group still answers get_rank/get_world_size.
int pd_group_check(long handle, const char *fn) {
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
    if (pd_group_check(handle, fn) < 0) {
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

int pd_group_world_usable(const char *fn) {
    if (pd_mpi_inherited) {
        pd_child_refuse(fn);
        return -1;
    }
    return pd_group_check(0, fn);
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
        // a world of one asked for rank 1: the usual cause is a script started without its launcher
        PyErr_Format(PyExc_ValueError, "%s(): `%s` must be a rank in [0, %d); got %ld%s", fn, arg, world,
                     global_rank, world == 1 ? " (this process is a world of one: was it started by mpiexec "
                                               "-n N or python -m pydist.run -n N?)" : "");
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
// Slots: filled and emptied by the session

// Open MPI's nonblocking collectives (its libnbc) do not hold on to their communicator: one freed
// while such a call is pending crashes the call's next MPI_Test (a destroyed group's pending Work, on
// Open MPI 5.0). MPICH keeps a freed communicator until its pending calls complete, as the standard
// says. So on Open MPI a destroyed group's communicators wait here, and go with the session's
// (pd_group_slots_free), once every pending request has been drained: one communicator kept per
// group destroyed during a session.
#if defined(OPEN_MPI) && OPEN_MPI
static MPI_Comm *later;
static int later_n, later_cap;

void pd_comm_free(MPI_Comm *comm) {
    if (*comm == MPI_COMM_NULL) {
        return;
    }
    if (later_n == later_cap) {
        int cap = later_cap ? 2 * later_cap : 16;
        MPI_Comm *grown = PyMem_RawRealloc(later, (size_t)cap * sizeof *later);
        if (grown == NULL) {
            return;   // out of memory: the communicator is kept for good, never freed under a pending call
        }
        later = grown;
        later_cap = cap;
    }
    later[later_n++] = *comm;
    *comm = MPI_COMM_NULL;
}

static void free_later(void) {
    int fin = 1;
    MPI_Finalized(&fin);
    for (int i = 0; i < later_n && !fin; i++) {
        MPI_Comm_free(&later[i]);
    }
    PyMem_RawFree(later);
    later = NULL;
    later_n = later_cap = 0;
}
#else
void pd_comm_free(MPI_Comm *comm) {
    if (*comm != MPI_COMM_NULL) {
        MPI_Comm_free(comm);
    }
}

static void free_later(void) {
}
#endif

// Frees here and on the error paths of init and new_group ignore MPI's return code: there is nothing
// left to undo, and the error being raised (if any) is the one the caller needs to see.
void pd_group_slot_free(int slot) {
    GroupSlot *g = &groups[slot];
    if (g->in_use && g->comm != MPI_COMM_NULL) {
        pd_comm_free(&g->comm);
    }
    PyMem_RawFree(g->world_ranks);
    PyMem_RawFree(g->group_ranks);
    g->world_ranks = g->group_ranks = NULL;
    g->comm = MPI_COMM_NULL;
    g->in_use = 0;
    g->broken[0] = 0;
    g->calls = 0;
    g->generation++;
}

// Take `comm` into `slot`: error handler, rank, size and the rank tables. On failure the slot stays
// free and the caller still owns comm.
int pd_group_slot_set(int slot, MPI_Comm comm) {
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
    g->shm = NULL;
    g->timeout = -1.0;
    return 0;
error:
    PyMem_RawFree(world_ranks);
    PyMem_RawFree(group_ranks);
    PyMem_RawFree(mine);
    return -1;
}

void pd_group_slots_free(void) {
    for (int i = 0; i < PD_MAX_GROUPS; i++) {
        pd_group_slot_free(i);
    }
    free_later();
}

int pd_group_slot_unused(void) {
    for (int i = 1; i < PD_MAX_GROUPS; i++) {
        if (!groups[i].in_use) {
            return i;
        }
    }
    return -1;
}

int pd_group_live(long handle) {
    return handle >= 0 && handle < PD_MAX_GROUPS && groups[handle].in_use && groups[handle].comm != MPI_COMM_NULL;
}

unsigned pd_group_generation(long handle) {
    return handle >= 0 && handle < PD_MAX_GROUPS ? groups[handle].generation : 0;
}

// ---------------------------------------------------------------------------------------------------
// Operations

PdOp pd_op(const char *what, long group, int peer) {
    return (PdOp){what, group, pd_group_generation(group), peer, 0};
}

int pd_op_current(const PdOp *op) {
    return op->group >= 0 && op->group < PD_MAX_GROUPS && groups[op->group].in_use &&
           groups[op->group].generation == op->generation;
}

int pd_group_call_begin(long handle, const char *fn, PdOp *call) {
    GroupSlot *g = &groups[handle];
    unsigned long me = PyThread_get_thread_ident();
    if (g->calls > 0 && g->caller != me) {
        PyErr_Format(pd_DistError, "%s(): another thread of this process is inside %s() on the same group. MPI "
                     "matches a group's collectives in the order each process calls them, and two threads in "
                     "collective calls on one group at once have no order (some rank would pair the wrong "
                     "calls), so this call was refused before sending anything. Give each thread its own "
                     "group (new_group), or hold a lock around each call until it returns, taken in the "
                     "same order on every rank", fn, g->calling);
        return -1;
    }
    if (g->calls++ == 0) {
        g->caller = me;
        g->calling = fn;
    }
    *call = pd_op(fn, handle, PD_PEER_ALL);
    return 0;
}

void pd_group_call_end(const PdOp *call) {
    if (pd_op_current(call) && groups[call->group].calls > 0) {   // (a group destroyed meanwhile starts afresh)
        groups[call->group].calls--;
    }
}

void pd_group_break(long handle, const char *why) {
    if (handle >= 0 && handle < PD_MAX_GROUPS && groups[handle].in_use && !groups[handle].broken[0]) {
        snprintf(groups[handle].broken, sizeof groups[handle].broken, "%s", why);
    }
}

void **pd_group_shm(long handle) {
    return &groups[handle].shm;
}

MPI_Comm pd_group_world_comm(void) {
    return groups[0].comm;
}
