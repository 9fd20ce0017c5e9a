/*
 * liveness.h: exit notices (liveness.c): who has left, and when. progress/op.c decides which waits
 * that ends.
 */
#ifndef PYDIST_GROUPS_LIVENESS_H
#define PYDIST_GROUPS_LIVENESS_H

#include "core/base.h"

int pd_liveness_start(MPI_Comm ctl);     // at init, with the control communicator (takes it)
void pd_liveness_stop(void);             // an init that every rank gave up: the channel goes on every rank
void pd_liveness_poll(void);             // receive the notices that have arrived (GIL held)
int pd_liveness_departures(void);        // how many ranks have left
double pd_liveness_left(int world_rank); // MPI_Wtime() when that rank's notice arrived; 0: still here
// The exit barrier, at exit before MPI_Finalize (the session waits for it): send every other rank the
// exit notice and start the barrier in *req: 1 started, 0 nothing to do (one rank, or no control
// communicator), -1 not started (the reason kept for pd_liveness_exit_why). pd_liveness_exit_check is
// the wait's check under --survive: 1 once a peer's watcher has recorded its end and EXIT_GRACE_SECONDS
// have passed (the barrier is given up, the reason kept). After the barrier completes,
// pd_liveness_exit_end drains the notices and frees the control communicators; after it was given up,
// pd_liveness_exit_given_up keeps the wait's reason.
int pd_liveness_exit_begin(MPI_Request *req);
int pd_liveness_exit_check(void *ctx, double wait_started);
void pd_liveness_exit_end(void);
void pd_liveness_exit_given_up(const char *why);
const char *pd_liveness_exit_why(void);  // why the exit barrier gave up ("": it did not, or a pending operation)
const char *pd_liveness_cause(int world_rank);  // how that rank's departure was learnt, for messages
// The survivors of a job that goes on without some ranks (the asynchronous strategies under
// PYDIST_SURVIVE, issue 27): every survivor calls it with the same world ranks, which are then left
// out of the exit (its notices and barrier); MPI_Finalize, which hangs with a dead rank, is skipped.
// 0, or -1 with an exception.
int pd_liveness_forget(const int *world_ranks, int n);
int pd_liveness_forgotten(void);          // how many ranks were forgotten
int pd_liveness_survive(void);            // under pydist.run --survive (the watchers' records are read)

#endif  // PYDIST_GROUPS_LIVENESS_H
