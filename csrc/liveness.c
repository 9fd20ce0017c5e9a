/*
 * liveness.c: how a rank learns that a peer has exited, so that nobody waits forever for it.
 *
 * A rank whose script ends (normally, or by sys.exit) reaches MPI_Finalize. If other ranks are at
 * that moment waiting in a collective or receive that needed the leaving rank, MPICH never tells
 * them: the job hangs. (A rank killed by a signal or by os._exit is different: the launcher sees
 * the process die and ends the job within a second.) So at exit each rank first sends an exit
 * notice to every other rank on a private communicator, then waits there, in a barrier, for
 * everyone else to reach exit too. pd_wait probes for such notices between polling slices (every
 * 2 ms), and a wait that is still pending GRACE_SECONDS after a peer left raises DistError naming
 * that rank. The exception (unhandled) then aborts the whole job.
 *
 * Notices are probed for rather than received by a posted wildcard receive, so no request of ours
 * is ever left pending (nothing to cancel at exit, nothing for MPI to match against on every
 * message); probing every 2 ms costs nothing measurable.
 *
 * The grace period covers the normal race at the end of a job: a rank that finished the last
 * collective first may announce its exit while a peer is still completing that same collective.
 */
#include "pydist.h"

#define TAG_EXIT 1
#define GRACE_SECONDS 2.0

static MPI_Comm ctl = MPI_COMM_NULL;     // private dup of MPI_COMM_WORLD
static int notice_from = -1;             // rank whose notice arrived, -1: none yet
static int notice_buf = 0;
static double notice_time = 0.0;
static int leaving = 0;                  // this rank is in pd_liveness_announce

int pd_liveness_start(void) {
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (ctl != MPI_COMM_NULL || size == 1) {
        return 0;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Comm_idup(MPI_COMM_WORLD, &ctl, &req);
    if (rc != MPI_SUCCESS) {
        return pd_raise_mpi_int(rc, "MPI_Comm_idup");
    }
    if (pd_wait(&req, MPI_STATUS_IGNORE, pd_default_timeout, "init_process_group") < 0) {
        return -1;
    }
    MPI_Comm_set_errhandler(ctl, MPI_ERRORS_RETURN);
    return 0;
}

// Called by pd_wait with the GIL held (which also keeps two threads from receiving the same notice).
// Returns -1 with DistError set when the wait should give up.
int pd_liveness_check(double wait_started, const char *what) {
    if (leaving || ctl == MPI_COMM_NULL) {
        return 0;
    }
    if (notice_from < 0) {
        int found = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_EXIT, ctl, &found, &st) == MPI_SUCCESS && found) {
            MPI_Recv(&notice_buf, 1, MPI_INT, st.MPI_SOURCE, TAG_EXIT, ctl, MPI_STATUS_IGNORE);
            notice_from = st.MPI_SOURCE;
            notice_time = MPI_Wtime();
        }
    }
    if (notice_from < 0) {
        return 0;
    }
    double since = MPI_Wtime() - (notice_time > wait_started ? notice_time : wait_started);
    if (since < GRACE_SECONDS) {
        return 0;
    }
    PyErr_Format(pd_DistError, "%s cannot complete: rank %d has exited (its script ended or called "
                 "sys.exit) while this rank was waiting for it", what, notice_from);
    return -1;
}

// At interpreter exit, before MPI_Finalize: tell every other rank, then wait for all of them to
// reach exit too. Returns -1 if that wait was interrupted (then MPI_Finalize must be skipped).
int pd_liveness_announce(void) {
    if (ctl == MPI_COMM_NULL) {
        return 0;
    }
    int rank, size;
    MPI_Comm_rank(ctl, &rank);
    MPI_Comm_size(ctl, &size);
    leaving = 1;
    for (int r = 0; r < size; r++) {
        if (r != rank) {
            MPI_Request sreq;
            if (MPI_Isend(&rank, 1, MPI_INT, r, TAG_EXIT, ctl, &sreq) == MPI_SUCCESS) {
                MPI_Request_free(&sreq);   // a one-int message: it completes on its own
            }
        }
    }
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Ibarrier(ctl, &req);
    if (rc != MPI_SUCCESS || pd_wait(&req, MPI_STATUS_IGNORE, -1.0, "exit") < 0) {
        PyErr_Clear();
        return -1;
    }
    // Everyone has left their last operation. Drain the notices so nothing is pending at finalize.
    for (;;) {
        int flag = 0;
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_EXIT, ctl, &flag, MPI_STATUS_IGNORE);
        if (!flag) {
            break;
        }
        MPI_Recv(&notice_buf, 1, MPI_INT, MPI_ANY_SOURCE, TAG_EXIT, ctl, MPI_STATUS_IGNORE);
    }
    MPI_Comm_free(&ctl);
    return 0;
}
