/*
 * private_comm.c: the private communicator of pydist's own algorithms (the ring, shared_memory.c's large
 * all-reduces past their header round) on each group. Made with the group (its group_setup), while every
 * member is in the creation anyway, so that no call ever waits for its peers to set it up; let go with
 * the group (its group_release, after the paths that talk on it: the paths release in reverse order).
 */
#include "paths/private_comm.h"

#include "core/errors.h"
#include "groups/group.h"
#include "progress/op.h"
#include "progress/wait.h"

enum { ALGO_NONE = 0, ALGO_DUPPING = 1, ALGO_READY = 2 };

typedef struct {
    int algo_state;          // ALGO_NONE, ALGO_DUPPING (algo_dup pending) or ALGO_READY
    int algo_dup_waiting;    // a thread is waiting for algo_dup
    MPI_Comm algo_comm;      // ALGO_READY: the private communicator
    MPI_Request algo_dup;    // ALGO_DUPPING: the MPI_Comm_idup
    MPI_Comm *algo_dup_out;  // ALGO_DUPPING: where it writes the new handle (heap: it may outlive the slot)
    unsigned long algo_seq;  // rings started on this group: the next one's tag (mod the tag bound)
} PrivateComm;

static PrivateComm groups[PD_MAX_GROUPS];   // by group handle
static int tag_ub = 32767;                   // MPI_TAG_UB (the standard's minimum until adopt reads it)


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
static void algo_release(long slot, unsigned generation) {
    (void)generation;
    PrivateComm *g = &groups[slot];
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
        pd_comm_free(&g->algo_comm);
    }
    g->algo_state = ALGO_NONE;
    g->algo_dup = MPI_REQUEST_NULL;
    g->algo_dup_out = NULL;
    g->algo_comm = MPI_COMM_NULL;
    g->algo_seq = 0;
}

MPI_Comm *pd_group_algo_comm(long handle, const char *fn, int *tag) {
    PrivateComm *g = &groups[handle];
    int rc;
    if (g->algo_state == ALGO_NONE) {
        // Every member makes its group's first ring call at the same point of its collective sequence,
        // so every member starts this dup there too.
        MPI_Comm *comm = pd_group_comm(handle, fn), *cell = comm != NULL ? PyMem_RawMalloc(sizeof *cell) : NULL;
        if (comm == NULL) {
            return NULL;
        }
        if (cell == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        *cell = MPI_COMM_NULL;
        if ((rc = MPI_Comm_idup(*comm, cell, &g->algo_dup)) != MPI_SUCCESS) {
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
        g->algo_dup_waiting = 1;
        rc = pd_op_wait(&g->algo_dup, MPI_STATUS_IGNORE, &op, pd_group_timeout(handle), 1);
        if (!pd_op_current(&op)) {
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

int pd_private_comm_adopt(long handle, MPI_Comm comm) {
    int rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) {
        return pd_raise_mpi_int(rc, "MPI_Comm_set_errhandler");
    }
    int *ub = NULL, has_ub = 0;
    if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &has_ub) == MPI_SUCCESS && has_ub && *ub > 0) {
        tag_ub = *ub;
    }
    PrivateComm *g = &groups[handle];
    *g = (PrivateComm){ALGO_READY, 0, comm, MPI_REQUEST_NULL, NULL, 0};
    return 0;
}

int pd_private_comm_count(void) {
    int n = 0;
    for (int i = 0; i < PD_MAX_GROUPS; i++) {
        n += groups[i].algo_state == ALGO_READY;
    }
    return n;
}

// Made with the group: collective over its members, who all create it at the same point.
static int private_setup(long group, const char *fn) {
    int tag;
    if (pd_group_algo_comm(group, fn, &tag) == NULL) {
        return -1;
    }
    groups[group].algo_seq = 0;   // no ring has used that tag
    return 0;
}

const PdPath pd_private_comm_path = {"private communicator", NULL, private_setup, algo_release};
