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
 * departure ends is decided by progress/op.c, which knows what each operation needs: a collective needs
 * every rank of its group, a point-to-point call its peer.
 *
 * Notices are probed for rather than received by a posted wildcard receive, so no request of ours
 * is ever left pending (nothing to cancel at exit, nothing for MPI to match against on every
 * message); probing every 2 ms (once per wait slice) costs nothing measurable.
 *
 * A rank that dies (a signal, os._exit, a crash) sends no notice. Under `python -m pydist.run
 * --survive` (PYDIST_SURVIVE=1) each rank's watcher writes rank-R.json into the attempt's folder
 * (PYDIST_RUN_ATTEMPT_DIR) when its rank ends, however it ends, and exits with a status rather than
 * a signal, so that hydra (with -disable-auto-cleanup) leaves the others running; the others look for
 * those records every RECORD_SCAN_SECONDS. The asynchronous strategies then carry on without a dead
 * worker (async.c), and the survivors forget it (pd_liveness_forget): the exit's notices and barrier
 * go to the survivors only, and MPI_Finalize, which hangs on MPICH 4.0.2 and 5.0.2 once a rank has
 * died (benchmarks/fault_probe/), is skipped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "groups/liveness.h"

#include "core/errors.h"
#include "groups/child.h"

#define RECORD_SCAN_SECONDS 0.2
// At exit under --survive: how long the barrier may go on once a peer's watcher has recorded its end. A
// peer that passed the barrier completes it for us within milliseconds; one that died never will.
#define EXIT_GRACE_SECONDS 3.0

#define TAG_EXIT 1

static MPI_Comm ctl = MPI_COMM_NULL;     // private dup of MPI_COMM_WORLD
static double *left_at = NULL;           // [world size]: when that rank's notice arrived; 0: still here
static int world_size = 0;
static int departures = 0;               // how many notices have arrived
static int leaving = 0;                  // this rank is in the exit barrier (pd_liveness_exit_begin)
static char *records = NULL;             // the watchers' folder under PYDIST_SURVIVE; NULL: no records
static char *from_record = NULL;         // [world size]: 1 when that departure was learnt from a record
static double scanned_at = 0.0;          // when the records were last looked for
static MPI_Comm survivors = MPI_COMM_NULL;   // after pd_liveness_forget: the control communicator without them
static int forgotten = 0;
static char exit_why[256];               // why the exit barrier was given up ("" when it was not)

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
    PyMem_RawFree(from_record);
    PyMem_RawFree(records);
    left_at = table;
    from_record = PyMem_RawCalloc((size_t)size, 1);
    records = NULL;
    world_size = size;
    departures = 0;
    forgotten = 0;
    const char *survive = getenv("PYDIST_SURVIVE"), *folder = getenv("PYDIST_RUN_ATTEMPT_DIR");
    const int read_records = survive != NULL && strcmp(survive, "1") == 0 && folder != NULL && *folder != '\0';
    if (read_records && (records = PyMem_RawMalloc(strlen(folder) + 1)) != NULL) {
        strcpy(records, folder);
    }
    if (from_record == NULL || (read_records && records == NULL)) {
        PyErr_NoMemory();
        return -1;   // (the caller frees comm: it is not ours yet)
    }
    ctl = comm;
    return 0;
}

void pd_liveness_stop(void) {
    if (ctl != MPI_COMM_NULL) {
        MPI_Comm_free(&ctl);   // no request is ever left on it: notices are probed for
    }
    ctl = MPI_COMM_NULL;
}

static void departed(int world_rank, int by_record) {
    if (world_rank >= 0 && world_rank < world_size && left_at[world_rank] == 0.0) {
        left_at[world_rank] = MPI_Wtime();
        from_record[world_rank] = (char)by_record;
        departures++;
    }
}

// The watchers' records of ranks that have ended (a few stat calls every RECORD_SCAN_SECONDS).
static void scan_records(void) {
    double now = MPI_Wtime();
    if (records == NULL || now - scanned_at < RECORD_SCAN_SECONDS) {
        return;
    }
    scanned_at = now;
    int me = -1;
    MPI_Comm_rank(ctl, &me);
    char path[4096];
    for (int r = 0; r < world_size; r++) {
        if (r != me && left_at[r] == 0.0 &&
            snprintf(path, sizeof path, "%s/rank-%d.json", records, r) < (int)sizeof path && access(path, F_OK) == 0) {
            departed(r, 1);
        }
    }
}

// Receive every notice that has arrived. GIL held (which keeps two threads from receiving the same
// notice). A failure to probe is not an error of the operation being waited for: it is ignored, and
// the next slice probes again.
void pd_liveness_poll(void) {
    if (leaving || ctl == MPI_COMM_NULL) {
        return;
    }
    scan_records();
    for (;;) {
        int found = 0, who = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_EXIT, ctl, &found, &st) != MPI_SUCCESS || !found) {
            return;
        }
        if (MPI_Recv(&who, 1, MPI_INT, st.MPI_SOURCE, TAG_EXIT, ctl, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
            return;
        }
        departed(st.MPI_SOURCE, 0);
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

const char *pd_liveness_cause(int world_rank) {
    return world_rank >= 0 && world_rank < world_size && from_record != NULL && from_record[world_rank]
               ? "it died: its watcher under pydist.run recorded its end"
               : "its script ended or called sys.exit";
}

int pd_liveness_forgotten(void) {
    return forgotten;
}

int pd_liveness_survive(void) {
    return records != NULL;
}

int pd_liveness_forget(const int *world_ranks, int n) {
    if (ctl == MPI_COMM_NULL || n <= 0) {
        return 0;
    }
    MPI_Comm base = survivors != MPI_COMM_NULL ? survivors : ctl;
    MPI_Group all = MPI_GROUP_NULL, gone = MPI_GROUP_NULL, rest = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    int *in_base = PyMem_RawMalloc(sizeof(int) * (size_t)n);
    if (in_base == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    // the ranks to drop as ranks of `base` (the world's, or the survivors' of an earlier forget)
    int rc = MPI_Comm_group(base, &all);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_group(ctl, &world);
    if (rc == MPI_SUCCESS) rc = MPI_Group_translate_ranks(world, n, world_ranks, all, in_base);
    int kept = 0;   // (a rank already gone from base is not in it)
    for (int i = 0; rc == MPI_SUCCESS && i < n; i++) {
        if (in_base[i] != MPI_UNDEFINED) in_base[kept++] = in_base[i];
    }
    if (rc == MPI_SUCCESS) rc = MPI_Group_incl(all, kept, in_base, &gone);
    PyMem_RawFree(in_base);
    if (rc == MPI_SUCCESS) rc = MPI_Group_difference(all, gone, &rest);
    MPI_Comm next = MPI_COMM_NULL;
    if (rc == MPI_SUCCESS) {
        Py_BEGIN_ALLOW_THREADS
        rc = MPI_Comm_create_group(base, rest, 7284, &next);   // only the survivors call it
        Py_END_ALLOW_THREADS
    }
    MPI_Group *gs[] = {&all, &gone, &rest, &world};
    for (int i = 0; i < 4; i++) {
        if (*gs[i] != MPI_GROUP_NULL) MPI_Group_free(gs[i]);
    }
    if (rc != MPI_SUCCESS) {
        return pd_raise_mpi_int(rc, "MPI_Comm_create_group (the survivors)");
    }
    if (survivors != MPI_COMM_NULL) {
        MPI_Comm_free(&survivors);
    }
    survivors = next;
    for (int i = 0; i < n; i++) {
        if (world_ranks[i] >= 0 && world_ranks[i] < world_size) departed(world_ranks[i], from_record[world_ranks[i]]);
    }
    forgotten += n;
    return 0;
}

// ---------------------------------------------------------------------------------------------------
// Exit

// Whether world rank r's watcher has recorded its end (the file exists), whatever `leaving` says.
static int has_record(int r) {
    char path[4096];
    return records != NULL && snprintf(path, sizeof path, "%s/rank-%d.json", records, r) < (int)sizeof path &&
           access(path, F_OK) == 0;
}

// The exit barrier's check under --survive: a peer that the survivors did not forget and whose watcher has
// recorded its end either passed the barrier (which then completes at once) or died outside any
// collective (after the last one, or between two) and will never arrive. After EXIT_GRACE_SECONDS the
// barrier is given up: every survivor sees the same record, so all of them leave.
int pd_liveness_exit_check(void *ctx, double wait_started) {
    (void)ctx;
    (void)wait_started;
    static double seen_at = 0.0, checked_at = 0.0;
    static int seen_rank = -1;
    double now = MPI_Wtime();
    if (records == NULL || now - checked_at < RECORD_SCAN_SECONDS) {
        return 0;
    }
    checked_at = now;
    int me = -1;
    MPI_Comm_rank(ctl, &me);
    for (int r = 0; seen_rank < 0 && r < world_size; r++) {
        if (r != me && !(forgotten && left_at[r] != 0.0) && has_record(r)) {
            seen_rank = r;
            seen_at = now;
        }
    }
    if (seen_rank >= 0 && now - seen_at >= EXIT_GRACE_SECONDS) {
        snprintf(exit_why, sizeof exit_why,
                 "rank %d ended without reaching exit (its watcher under pydist.run recorded its end)", seen_rank);
        return 1;
    }
    return 0;
}

const char *pd_liveness_exit_why(void) {
    return exit_why;
}

void pd_liveness_exit_given_up(const char *why) {
    snprintf(exit_why, sizeof exit_why, "%s", why);
}

int pd_liveness_exit_begin(MPI_Request *req) {
    if (pd_mpi_inherited) {
        return -1;   // a forked child: the parent's departure is not the child's to announce
    }
    if (ctl == MPI_COMM_NULL) {
        return 0;
    }
    int rank = 0, rc = MPI_Comm_rank(ctl, &rank);
    leaving = 1;
    for (int r = 0; rc == MPI_SUCCESS && r < world_size; r++) {
        if (r != rank && !(forgotten && left_at[r] != 0.0)) {   // not to a rank the survivors forgot
            MPI_Request sreq;
            if (MPI_Isend(&rank, 1, MPI_INT, r, TAG_EXIT, ctl, &sreq) == MPI_SUCCESS) {
                MPI_Request_free(&sreq);   // a one-int message: it completes on its own
            }
        }
    }
    exit_why[0] = '\0';
    if (rc != MPI_SUCCESS || (rc = MPI_Ibarrier(survivors != MPI_COMM_NULL ? survivors : ctl, req)) != MPI_SUCCESS) {
        snprintf(exit_why, sizeof exit_why, "the exit barrier could not start (MPI error %d)", rc);
        return -1;
    }
    return 1;
}

void pd_liveness_exit_end(void) {
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
    if (survivors != MPI_COMM_NULL) {
        MPI_Comm_free(&survivors);
    }
}
