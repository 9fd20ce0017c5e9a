/*
 * child.c: a process made from a rank never uses, finalizes or aborts the rank's MPI.
 *
 * After fork (os.fork, multiprocessing's "fork" start method, a forkserver that had imported pydist)
 * the child holds a copy of all MPI set up in the parent: its connection to the launcher, UCX's
 * endpoints and shared-memory queues, our groups' communicators and shared-memory channels. Any MPI
 * call there acts as the parent's rank on the parent's resources: MPI_Finalize at the child's exit
 * tells the launcher that rank has finished (UCX asserts, and the parent later dies in its own
 * finalize), a collective takes the parent's messages. So a pthread_atfork handler marks the child,
 * and every way into MPI checks the mark: the entry gate of every call (pd_group_comm), init,
 * destroy and the wait loop refuse with a DistError saying whose MPI it is; finalize, abort and the
 * exit notice (liveness.c) do nothing, so the child's exit, normal or not, is the child's alone.
 *
 * A forked child of a process whose MPI had not started yet shares the parent's launcher connection
 * (PMI_FD is the same socket): init refuses there too when the launcher's variables are present.
 * Fresh interpreters (spawn, forkserver, subprocess) share nothing but the environment;
 * pydist/distributed.py checks that before init.
 */
#include "groups/child.h"

#include "core/errors.h"

#include <pthread.h>
#include <unistd.h>

int pd_mpi_inherited = 0;        // this process was forked from one whose MPI had started
static int forked = 0;           // this process was forked from one that had loaded pydist
static int parent_rank = -1;     // the world rank whose MPI this process inherited (-1: unknown)
static long parent_pid = 0;      // the process that owns that MPI

// ---------------------------------------------------------------------------------------------------
// The mark

// In the child, right after fork (one thread; nothing of Python's may run here). A grandchild keeps
// what its parent inherited: the MPI is still the first rank's.
static void after_fork_in_child(void) {
    forked = 1;
    if (pd_mpi_inherited) {
        return;
    }
    int init = 0, fin = 0;
    if (MPI_Initialized(&init) != MPI_SUCCESS || MPI_Finalized(&fin) != MPI_SUCCESS || !init || fin) {
        return;
    }
    pd_mpi_inherited = 1;
    parent_pid = (long)getppid();
    if (MPI_Comm_rank(MPI_COMM_WORLD, &parent_rank) != MPI_SUCCESS) {   // (the world group's rank too: a dup)
        parent_rank = -1;
    }
}

// Once per process, from the module's exec (a second interpreter must not register it twice).
int pd_child_register(void) {
    static int registered = 0;
    if (!registered) {
        if (pthread_atfork(NULL, NULL, after_fork_in_child) != 0) {
            PyErr_SetString(PyExc_OSError, "pydist: pthread_atfork failed");
            return -1;
        }
        registered = 1;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------------
// The checks

// Raise the child's DistError for fn and return -1.
int pd_child_refuse(const char *fn) {
    PyErr_Format(pd_DistError, "%s(): this is a child process (pid %ld) of rank %d (pid %ld), made by fork: "
                 "MPI belongs to the parent, and a child cannot use it (communicate through the parent, "
                 "or start the work as an MPI job of its own)", fn, (long)getpid(), parent_rank, parent_pid);
    return -1;
}

// Before MPI_Init: refused where MPI is the parent's, and in a forked child that holds the launcher's
// variables (and so its connection): MPI_Init would talk to the launcher as the parent's rank.
int pd_child_check_init(void) {
    if (pd_mpi_inherited) {
        return pd_child_refuse("init_process_group");
    }
    if (forked && (getenv("PMI_FD") != NULL || getenv("PMI_PORT") != NULL)) {
        const char *rank = getenv("PMI_RANK");
        PyErr_Format(pd_DistError, "init_process_group(): this is a child process (pid %ld) of rank %s (pid "
                     "%ld), made by fork: it holds that rank's connection to the launcher, and MPI_Init "
                     "here would join the job as that rank (start the work as an MPI job of its own)",
                     (long)getpid(), rank != NULL ? rank : "?", (long)getppid());
        return -1;
    }
    return 0;
}

// _C.parent_rank() -> None where this process's MPI (if any) is its own; in a forked child of a rank,
// that rank (-1 if unknown). pydist/distributed.py's exit hooks do nothing then.
PyObject *pd_parent_rank(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (!pd_mpi_inherited) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLong(parent_rank);
}
