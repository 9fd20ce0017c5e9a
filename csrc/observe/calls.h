/*
 * calls.h: a communication call as the timeline and the stall inspector see it (calls.c).
 */
#ifndef PYDIST_OBSERVE_CALLS_H
#define PYDIST_OBSERVE_CALLS_H

#include <stdint.h>
#include "core/base.h"
#include "observe/timeline.h"


// Every _C communication function (collectives.c, p2p.c) brackets its work with pd_call_begin and
// pd_call_end; the path that carries the call names itself in pd_call_path on the way (a single store,
// on or off): "small shm", "shm", "ring", "persistent", "MPI".
typedef struct PdCall {
    const char *name;      // the call: "all_reduce", "send", ...
    long group;
    int peer;              // a point-to-point call's peer (global rank), else -1
    int skip;              // a PYDIST_DEBUG=DETAIL checks-only pass: nothing is recorded
    int64_t t0;            // timeline clock at the start; 0: not recording
    uint64_t gid;          // the group's id in the trace (the same on every member)
    unsigned long seq;     // a collective's number among the group's collectives since the timeline
                           // started (the same on every member: MPI orders them alike); 0 for point-to-point
    unsigned long board_seq;   // the same since the group was made, never renumbered: what the stall
                               // board compares across ranks (stall.c)
} PdCall;
extern PD_THREAD_LOCAL const char *pd_call_path;
// pd_call_path for a collective refused before anything was sent (another thread is inside a collective
// on its group): pd_call_end gives its number back, so that the next call's matches the other ranks'.
extern const char pd_call_refused[];
// collective: 1 for a collective (numbered), 0 for point-to-point (peer: the global peer rank).
void pd_call_begin(PdCall *c, const char *name, long group, int collective, int peer);
// `ret` is what the function returns (NULL: it failed; a Work in flight: pd_call_defer takes the call, and
// its span is recorded when it completes); `bytes` what this rank's buffers hold.
void pd_call_end(PdCall *c, PyObject *ret, long long bytes);
// Set by the progress engine (work.c) at module exec: takes the call over when `ret` is an operation still
// in flight (1), else 0. The observer never looks into what the layers above it make.
extern int (*pd_call_defer)(PyObject *ret, const PdCall *c, long long bytes, const char *path);
// The id of a group in the trace (a hash of its world ranks and its ordinal among the groups of those
// members; see calls.c), recording its members for
// _C.timeline_groups() on the first call.
uint64_t pd_call_group_id(long group);
// The session, as each group is made on its members (collectively): give it its id.
void pd_call_group_made(long group);
PyObject *pd_last_call_path(PyObject *self, PyObject *unused);
PyObject *pd_timeline_clock(PyObject *self, PyObject *unused);
PyObject *pd_timeline_start(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_timeline_write(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_timeline_event(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_timeline_groups(PyObject *self, PyObject *unused);
PyObject *pd_timeline_thread_name(PyObject *self, PyObject *name);
// This thread's collectives, isend and irecv check their arguments and return without sending
// (PYDIST_DEBUG=DETAIL's checks, batch_isend_irecv's first pass). Per thread: another thread's call
// must never become a no-op.
extern PD_THREAD_LOCAL int pd_validate_only;

#endif  // PYDIST_OBSERVE_CALLS_H
