/*
 * private_comm.h: the private communicator of pydist's own algorithms on each group (private_comm.c), a
 * dup of the group's made with the group, so that their messages never match the user's point-to-point
 * traffic on it. A path: made by its group_setup, let go by its group_release.
 */
#ifndef PYDIST_PATHS_PRIVATE_COMM_H
#define PYDIST_PATHS_PRIVATE_COMM_H

#include "progress/progress.h"

// The communicator of pydist's own algorithms on a group pd_group_comm accepted (a private dup, made
// on the first call and waited for here), and the tag of this call's messages (the group's sequence
// number of such calls). Every member must make these calls in the same order. NULL with an exception.
MPI_Comm *pd_group_algo_comm(long handle, const char *fn, int *tag);
// The same private communicator, made with the group, for calls whose order every member shares but
// that take no ring tag (shared_memory.c's large all-reduces past their header round). NULL: none.
MPI_Comm *pd_group_private_comm(long handle);
// The tag of a ring on that communicator started past its header round (shared_memory.c), from the
// round: the same on every member, and never one of pd_group_algo_comm's.
int pd_group_ring_tag(unsigned long long round);
// At init: the world's private communicator, duplicated together with the world's own (takes it), and
// MPI's tag bound. 0, or -1 raised (the caller frees comm).
int pd_private_comm_adopt(long handle, MPI_Comm comm);
// How many private communicators this rank holds (_C.live_groups, for leak tests).
int pd_private_comm_count(void);
extern const PdPath pd_private_comm_path;

#endif  // PYDIST_PATHS_PRIVATE_COMM_H
