/*
 * group.h: the table of process groups (group.c), and what an operation on a group is (PdOp).
 */
#ifndef PYDIST_GROUPS_GROUP_H
#define PYDIST_GROUPS_GROUP_H

#include "core/base.h"

// Groups are slots in a table of communicators; Python refers to them by slot index. Slot 0 is the
// default (world) group, a dup of MPI_COMM_WORLD.
#define PD_MAX_GROUPS 4096
extern int pd_initialized;           // init_process_group has run and destroy has not
// The session's default timeout for blocking calls (seconds, < 0: none), from init_process_group;
// set returns the old one.
double pd_session_timeout(void);
double pd_set_session_timeout(double seconds);
// The timeout of a wait on group `handle`: its own (pd_group_set_timeout: torch's
// new_group(timeout=...), 0 meaning "no time at all"), else the session's (< 0: none).
double pd_group_timeout(long handle);
// Give the live group `handle` (not the default group) a timeout of its own; < 0: the session's again.
// 0, or -1 with ValueError set.
int pd_group_set_timeout(long handle, double seconds, const char *fn);
// Initialised, and a live group of this rank? 0, or -1 with ValueError raised. A broken group passes.
int pd_group_check(long handle, const char *fn);
// The communicator for a handle, or NULL with ValueError raised (bad handle, not initialized) or
// DistError (a broken group, or a forked child).
MPI_Comm *pd_group_comm(long handle, const char *fn);
// Rank/size in a group, for a handle pd_group_comm accepted.
int pd_group_size(long handle);
int pd_group_rank(long handle);
// Translate a global rank to the group's rank and back (MPI_UNDEFINED when not a member).
int pd_group_from_global(long handle, int global_rank);
int pd_group_to_global(long handle, int group_rank);
// A `src`/`dst`/root argument: a global rank, as in torch, checked against the world and the group.
// Returns its rank in the group, or -1 with ValueError raised. A peer equal to this rank is refused
// unless allow_self (roots may be yourself; point-to-point partners may not).
int pd_group_peer(long handle, long global_rank, const char *fn, const char *arg, int allow_self);
// The world group's communicator (slot 0), whatever its state: for the session's own calls on it.
MPI_Comm pd_group_world_comm(void);
// The world's communicator may be used for point-to-point work (not a forked child's, the session up),
// broken by a timed-out collective or not: 0, or -1 with the exception set.
int pd_group_world_usable(const char *fn);
// Whether the handle names a slot in use with a communicator of this rank.
int pd_group_live(long handle);
// The slot's generation: bumped whenever it is freed, so that a stale PdOp can tell.
unsigned pd_group_generation(long handle);
// A collective call on a group, from entry to return (ops/route.c). MPI matches a communicator's
// collectives in the order each process issues them and leaves ordering threads to the user (MPI 4.1,
// 11.6.2): two threads inside collective calls on one group at once have no order, and some rank would
// pair the wrong calls. So the second thread's call raises DistError before it sends anything (0, or
// -1 raised). The same thread may enter again (a signal handler's collective). With the GIL, the test
// and the set are one step; without it they would need a compare-and-swap. *call is the call as an
// operation on the group (PdOp, below), so that its end can tell a group destroyed meanwhile.
typedef struct PdOp PdOp;
int pd_group_call_begin(long handle, const char *fn, PdOp *call);
void pd_group_call_end(const PdOp *call);
// Mark a group broken (its members no longer agree on what comes next): every later call refuses.
void pd_group_break(long handle, const char *why);
// The group's slot for shared_memory.c's channel (freed with the group by the shm path's release).
void **pd_group_shm(long handle);

// The session's use of the table: take `comm` into `slot` (error handler, rank, size, the rank tables;
// on failure the slot stays free and the caller still owns comm: -1 raised), free a slot's communicator
// (after the paths have let go of it), every slot, and the first free sub-group slot (-1: none).
int pd_group_slot_set(int slot, MPI_Comm comm);
void pd_group_slot_free(int slot);
// Free a destroyed group's communicator (MPI_COMM_NULL after): at once, or on Open MPI at session end
// (group.c says why).
void pd_comm_free(MPI_Comm *comm);
void pd_group_slots_free(void);
int pd_group_slot_unused(void);

// An operation on a group, as its wait needs to know it: which ranks must take part for it to
// complete. peer: PD_PEER_ALL for a collective, else the point-to-point peer's group rank or
// MPI_ANY_SOURCE.
#define PD_PEER_ALL (-1000)
struct PdOp {
    const char *what;
    long group;
    unsigned generation;  // the group slot's generation when the operation started
    int peer;
    int survivable;       // group ranks below this may leave without ending the operation (0: none)
};
PdOp pd_op(const char *what, long group, int peer);
// Whether op's group is still the one it started on (not destroyed, its slot not taken again).
int pd_op_current(const PdOp *op);

#endif  // PYDIST_GROUPS_GROUP_H
