/*
 * liveness.c: how a rank learns that a peer has exited, so that nobody waits forever for it.
 *
 * A rank whose script ends (normally, or by sys.exit) reaches MPI_Finalize. If other ranks are at
 * that moment waiting in a collective or receive that needed the leaving rank, MPICH never tells
 * them: the job hangs. (A rank killed by a signal or by os._exit is different: the launcher sees
 * the process die and ends the job within a second.) So at exit each rank first sends an exit
 * notice to every other rank on a private communicator, then waits there, in a barrier, for
 * everyone else to reach exit too.
 *
 * This file only records who has left and when (pd_liveness_poll, pd_liveness_left). Which waits a
 * departure ends is decided by group.c, which knows what each operation needs: a collective needs
 * every rank of its group, a point-to-point call its peer.
 *
 * Notices are probed for rather than received by a posted wildcard receive, so no request of ours
 * is ever left pending (nothing to cancel at exit, nothing for MPI to match against on every
 * message); probing every 2 ms (once per wait slice) costs nothing measurable.
 */
#include "pydist.h"

#define TAG_EXIT 1

static MPI_Comm ctl = MPI_COMM_NULL;     // private dup of MPI_COMM_WORLD
static double *left_at = NULL;           // [world size]: when that rank's notice arrived; 0: still here
static int world_size = 0;
static int departures = 0;               // how many notices have arrived
static int leaving = 0;                  // this rank is in pd_liveness_announce

// ---------------------------------------------------------------------------------------------------
// Start: the caller (init) dups the control communicator together with the world's, so that one
// deadline covers both; this takes the finished communicator.

int pd_liveness_start(MPI_Comm comm) {
    int size = 0, rc = MPI_Comm_size(comm, &size);
    if (rc != MPI_SUCCESS) {
        return pd_raise_mpi_int(rc, "MPI_Comm_size");
    }
    double *table = PyMem_RawCalloc((size_t)size, sizeof(double));
    if (table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyMem_RawFree(left_at);
    left_at = table;
    world_size = size;
    departures = 0;
    ctl = comm;
    return 0;
}

// Receive every notice that has arrived. GIL held (which keeps two threads from receiving the same
// notice). A failure to probe is not an error of the operation being waited for: it is ignored, and
// the next slice probes again.
void pd_liveness_poll(void) {
    if (leaving || ctl == MPI_COMM_NULL) {
        return;
    }
    for (;;) {
        int found = 0, who = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_EXIT, ctl, &found, &st) != MPI_SUCCESS || !found) {
            return;
        }
        if (MPI_Recv(&who, 1, MPI_INT, st.MPI_SOURCE, TAG_EXIT, ctl, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
            return;
        }
        if (st.MPI_SOURCE >= 0 && st.MPI_SOURCE < world_size && left_at[st.MPI_SOURCE] == 0.0) {
            left_at[st.MPI_SOURCE] = MPI_Wtime();
            departures++;
        }
    }
}

int pd_liveness_departures(void) {
    return leaving ? 0 : departures;
}

double pd_liveness_left(int world_rank) {
    if (leaving || left_at == NULL || world_rank < 0 || world_rank >= world_size) {
        return 0.0;
    }
    return left_at[world_rank];
}

// ---------------------------------------------------------------------------------------------------
// Exit

// At interpreter exit, before MPI_Finalize: tell every other rank, then wait for all of them to
// reach exit too. Returns -1 if that wait failed or was interrupted (then MPI_Finalize must be
// skipped).
int pd_liveness_announce(void) {
    if (pd_mpi_inherited) {
        return -1;   // a forked child: the parent's departure is not the child's to announce
    }
    if (ctl == MPI_COMM_NULL) {
        return 0;
    }
    int rank = 0, rc = MPI_Comm_rank(ctl, &rank);
    leaving = 1;
    for (int r = 0; rc == MPI_SUCCESS && r < world_size; r++) {
        if (r != rank) {
            MPI_Request sreq;
            if (MPI_Isend(&rank, 1, MPI_INT, r, TAG_EXIT, ctl, &sreq) == MPI_SUCCESS) {
                MPI_Request_free(&sreq);   // a one-int message: it completes on its own
            }
        }
    }
    MPI_Request req = MPI_REQUEST_NULL;
    PdWaitSpec spec = {"exit", -1.0, NULL, NULL, 0.0};
    if (rc != MPI_SUCCESS || (rc = MPI_Ibarrier(ctl, &req)) != MPI_SUCCESS ||
        pd_wait(&req, MPI_STATUS_IGNORE, &spec) < 0) {
        PyErr_Clear();
        return -1;
    }
    // Everyone has left their last operation. Drain the notices so nothing is pending at finalize.
    for (;;) {
        int flag = 0, who = 0;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_EXIT, ctl, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag ||
            MPI_Recv(&who, 1, MPI_INT, MPI_ANY_SOURCE, TAG_EXIT, ctl, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
            break;
        }
    }
    MPI_Comm_free(&ctl);
    ctl = MPI_COMM_NULL;
    return 0;
}
