/*
 * pydist.h: the one header every csrc/ file includes.
 *
 * It pulls in Python, NumPy (shared API table, imported only in module.c) and MPI, and declares what
 * the files share: the module state (exception types), the dtype/op tables, the array converter, the
 * communicator table, the interruptible wait, and the Work type. Nothing here is exported from the
 * shared object except PyInit__C (we build with -fvisibility=hidden).
 */
#ifndef PYDIST_H
#define PYDIST_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL pydist_ARRAY_API
#ifndef PD_IMPORT_NUMPY
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#include <mpi.h>

#include "observe/timeline.h"
#include "paths/algorithms/ring.h"
#include "paths/algorithms/shm.h"
#include "paths/algorithms/shm_small.h"

#if !defined(MPI_VERSION) || MPI_VERSION < 4
#error "pydist needs an MPI 4 library (large-count calls); Debian/Ubuntu: apt-get install mpich libmpich-dev"
#endif

// ---------------------------------------------------------------------------------------------------
// Errors (errors.c)

// Exception types, created in module.c and shared by every file. DistError is a RuntimeError;
// DistBackendError (MPI failures) and DistTimeoutError (waits that ran past their deadline) derive
// from it, as in torch.distributed.
extern PyObject *pd_DistError;
extern PyObject *pd_DistBackendError;
extern PyObject *pd_DistTimeoutError;

// Raise DistBackendError "<call> failed: <MPI_Error_string> (error class N)". Returns NULL.
PyObject *pd_raise_mpi(int rc, const char *call);
// Same, returning -1, for int-returning helpers.
int pd_raise_mpi_int(int rc, const char *call);

// Check an MPI return code where the caller returns PyObject* on error via `goto error`.
#define PD_CHECK_MPI(rc, call)                 \
    do {                                       \
        if ((rc) != MPI_SUCCESS) {             \
            pd_raise_mpi((rc), (call));        \
            goto error;                        \
        }                                      \
    } while (0)

// ---------------------------------------------------------------------------------------------------
// Dtypes and reduction ops (dtypes.c)

// torch.distributed's ReduceOp values, in torch's order.
enum {
    PD_OP_SUM = 0, PD_OP_AVG = 1, PD_OP_PRODUCT = 2, PD_OP_MIN = 3, PD_OP_MAX = 4,
    PD_OP_BAND = 5, PD_OP_BOR = 6, PD_OP_BXOR = 7, PD_OP_COUNT = 8
};

typedef struct {
    MPI_Datatype mpi;   // what MPI moves (float16, bfloat16 travel as MPI_UINT16_T with our own ops)
    const char *name;   // NumPy's name, for messages
    char kind;          // 'b' bool, 'i' signed, 'u' unsigned, 'f' float, 'c' complex
    int half;           // PD_HALF_F16 or PD_HALF_BF16: reductions need our user ops; else 0
} PdDtype;

enum { PD_HALF_F16 = 1, PD_HALF_BF16 = 2 };

// Look up the table entry for an array's dtype; raises TypeError naming fn/arg and returns NULL
// when the dtype is not one we move.
const PdDtype *pd_dtype_of(PyArrayObject *arr, const char *fn, const char *arg);
// The MPI op for (op, dtype); raises TypeError/ValueError and returns -1 when the pair is invalid.
int pd_op_resolve(long op, const PdDtype *dt, const char *fn, MPI_Op *out);
const char *pd_op_name(int op);
// bfloat16's entry: a torch bfloat16 tensor is viewed as int16 words and described by it.
const PdDtype *pd_dtype_bfloat16(void);
int pd_ops_init(void);   // create the float16/bfloat16 user ops (after MPI_Init)
void pd_ops_free(void);  // before MPI_Finalize
// AVG is SUM followed by this division (elementwise, in place, on the reduced buffer).
void pd_divide_inplace(void *buf, MPI_Count count, const PdDtype *dt, int divisor);

// ---------------------------------------------------------------------------------------------------
// Arrays (buffer.c)

typedef struct {
    PyArrayObject *arr;  // new reference; NULL when unused
    const PdDtype *dtype;
    void *data;
    MPI_Count count;     // number of elements
    Py_ssize_t nbytes;
} PdBuf;

// Validate `obj` as an array argument: ndarray (or a torch CPU tensor, viewed, not copied),
// C-contiguous, aligned, native byte order, writeable if `writable`, a dtype we support.
// On success fills *buf (holding a new reference) and returns 0; otherwise raises and returns -1.
int pd_buf_get(PyObject *obj, const char *fn, const char *arg, int writable, PdBuf *buf);
void pd_buf_release(PdBuf *buf);

// A list of arrays of one dtype and size, described for MPI's v-collectives as bytes at
// displacements from the lowest address. `keep` (a tuple of the arrays and `meta`, which holds the
// counts and displacements) must outlive the MPI operation.
typedef struct {
    Py_ssize_t n;
    PdBuf *bufs;
    char *base;
    MPI_Count *counts;  // bytes, in meta
    MPI_Aint *displs;   // bytes from base, in meta
    PyObject *meta;
    PyObject *keep;
} PdBufList;

int pd_buflist_get(PyObject *seq, Py_ssize_t n, const char *fn, const char *arg, int writable,
                   const PdBuf *like, PdBufList *out);
void pd_buflist_release(PdBufList *l);

// ---------------------------------------------------------------------------------------------------
// Waiting (wait.c): a deadline, signals and one periodic check; nothing about groups or Work.

// How blocking calls wait: PD_WAIT_POLL (MPI_Test + sched_yield, interruptible, the default) or
// PD_WAIT_MPI (plain MPI_Wait with the GIL released, for benchmarks).
enum { PD_WAIT_POLL = 0, PD_WAIT_MPI = 1 };
extern int pd_wait_mode;
// MPI gave MPI_THREAD_SERIALIZED, not MULTIPLE: the wait loop keeps the GIL while it calls MPI, so
// the GIL serialises every MPI call of ours (set by group.c at init).
extern int pd_wait_serialized;
// The node's ranks fit its cores (pd_wait_set_cores at init): the wait loop's first 200 us of a slice
// test without yielding, as MPI's blocking calls do, since no rank of ours needs the core.
extern int pd_wait_spin;
// Decide pd_wait_spin from the node's rank count (0: unknown, which keeps yielding).
void pd_wait_set_cores(int node_ranks);

typedef struct {
    const char *what;      // operation name, for messages
    double timeout;        // seconds; < 0: forever
    // Called with the GIL held every slice (about 2 ms) with the wait's start time (MPI_Wtime);
    // returns -1 with an exception set to give the wait up, 1 to end it without an error (nothing
    // completed: *index -1), 0 to go on. NULL: none.
    int (*check)(void *ctx, double wait_started);
    void *check_ctx;
    double check_since;    // > 0: the check's start instead of the wait's (a loop of many short waits)
} PdWaitSpec;

// Wait for `req` with the GIL held on entry and exit; released while waiting. Returns 0 when complete,
// otherwise raises (KeyboardInterrupt or another signal's exception, DistTimeoutError, the check's
// error, DistBackendError) and returns -1 with the request still pending.
int pd_wait(MPI_Request *req, MPI_Status *status, const PdWaitSpec *spec);
// The same for whichever of reqs[0..n) completes first, testing from reqs[first] round the array (so a
// caller that moves `first` past the last one served is fair to all); null requests are skipped.
// *index: the one that completed (-1 when every request is null: returns 0 at once).
int pd_wait_any(int n, MPI_Request *reqs, int first, int *index, MPI_Status *status, const PdWaitSpec *spec);


// Raise DistTimeoutError "<what> timed out after <waited> s (timeout <timeout> s): <why>"; returns -1.
int pd_raise_timeout(const char *what, double waited, double timeout, const char *why);
// Yield (GIL released) while busy(ctx): another thread is finishing what we need. Checks signals and
// `timeout` (raising DistTimeoutError "<what> timed out ...: <why>"). 0, or -1 with the error set.
int pd_yield_while(int (*busy)(const void *), const void *ctx, double timeout, const char *what, const char *why);

// ---------------------------------------------------------------------------------------------------
// The progress engine (progress.c): all the wait loop, Work and the group table know of the paths.

// A path (request.c, ring_path.c, shared_memory.c, persistent.c) registers once, at module exec.
typedef struct {
    const char *name;
    // Move along what no thread waits for. GIL held, never raises; called when every pydist wait
    // starts and after each of its slices (about 2 ms), and by Work.is_completed. NULL: nothing.
    void (*progress)(void);
    // What the path makes with a new group, every member being in its (collective) creation: 0, or -1
    // raised (the group is not made). NULL: nothing.
    int (*group_setup)(long group, const char *fn);
    // The group's communicators are going (destroy, exit): give up what is in flight on it. Called
    // again harmlessly. NULL: nothing.
    void (*group_release)(long group, unsigned generation);
} PdPath;
int pd_path_register(const PdPath *path);
void pd_progress_all(void);
int pd_paths_group_setup(long group, const char *fn);
void pd_paths_group_release(long group, unsigned generation);

// Move a pending request and a reference to its owners onto the parked list (steals `keep`), so MPI
// never writes into freed memory. GIL held.
void pd_park(MPI_Request req, PyObject *keep, int cancellable);
// Complete or cancel what was parked (called before MPI_Finalize / at destroy). Returns how many stay.
int pd_parked_drain(void);

// ---------------------------------------------------------------------------------------------------
// Exit notices (liveness.c): who has left, and when. group.c decides which waits that ends.

int pd_liveness_start(MPI_Comm ctl);     // at init, with the control communicator (takes it)
void pd_liveness_poll(void);             // receive the notices that have arrived (GIL held)
int pd_liveness_departures(void);        // how many ranks have left
double pd_liveness_left(int world_rank); // MPI_Wtime() when that rank's notice arrived; 0: still here
int pd_liveness_announce(void);          // at exit, before MPI_Finalize
const char *pd_liveness_exit_why(void);  // why announce gave up ("": it did not, or a pending operation)
const char *pd_liveness_cause(int world_rank);  // how that rank's departure was learnt, for messages
// The survivors of a job that goes on without some ranks (the asynchronous strategies under
// PYDIST_SURVIVE, issue 27): every survivor calls it with the same world ranks, which are then left
// out of the exit (its notices and barrier); MPI_Finalize, which hangs with a dead rank, is skipped.
// 0, or -1 with an exception.
int pd_liveness_forget(const int *world_ranks, int n);
int pd_liveness_forgotten(void);          // how many ranks were forgotten
int pd_liveness_survive(void);            // under pydist.run --survive (the watchers' records are read)

// ---------------------------------------------------------------------------------------------------
// A process forked from a rank (child.c)

extern int pd_mpi_inherited;             // forked from a process whose MPI had started: not ours to use
int pd_child_register(void);             // module exec: the pthread_atfork handler that sets it
int pd_child_refuse(const char *fn);     // raise DistError ("a child process of rank N") and return -1
int pd_child_check_init(void);           // before MPI_Init: -1 with DistError raised in such a child

// ---------------------------------------------------------------------------------------------------
// The session and its process groups (group.c)

// Groups are slots in a table of communicators; Python refers to them by slot index. Slot 0 is the
// default (world) group, a dup of MPI_COMM_WORLD.
#define PD_MAX_GROUPS 4096
extern int pd_initialized;           // init_process_group has run and destroy has not
// The session's default timeout for blocking calls (seconds, < 0: none), from init_process_group.
double pd_session_timeout(void);
// The communicator for a handle, or NULL with ValueError raised (bad handle, not initialized) or
// DistError (a broken group).
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

// An operation on a group, as its wait needs to know it: which ranks must take part for it to
// complete. peer: PD_PEER_ALL for a collective, else the point-to-point peer's group rank or
// MPI_ANY_SOURCE.
#define PD_PEER_ALL (-1000)
typedef struct {
    const char *what;
    long group;
    unsigned generation;  // the group slot's generation when the operation started
    int peer;
    int survivable;       // group ranks below this may leave without ending the operation (0: none)
} PdOp;
PdOp pd_op(const char *what, long group, int peer);

// Wait for an operation: wait.c's loop, ended early when a rank the operation needs has exited.
// A collective's timeout breaks its group when timeout_breaks (the session's own timeout, not a
// caller's short poll); a point-to-point timeout never does.
int pd_op_wait(MPI_Request *req, MPI_Status *status, const PdOp *op, double timeout, int timeout_breaks);
// A blocking call's wait, with the session's timeout: if it fails, the request is parked with `keep`
// (the objects owning its memory; a new reference is taken). GIL held.
int pd_op_wait_or_park(MPI_Request *req, MPI_Status *status, const PdOp *op, PyObject *keep, int cancellable);
// pd_wait_any with the session's timeout and the departed-rank check, which counts a departure's
// grace from `since` (MPI_Wtime; 0: this wait's start); nothing is parked (the caller owns the
// requests and parks what it gives up).
int pd_op_wait_any(int n, MPI_Request *reqs, int first, int *index, MPI_Status *status, const PdOp *op,
                   double since);
// The same, but ended (returning 0 with *index = -1, nothing raised) as soon as more than `handled` of
// the group's ranks below op->survivable have left: the caller (an asynchronous server) carries on
// without them. Departures of the other ranks end it with DistError, as pd_op_wait_any's do.
int pd_op_wait_any_or_departure(int n, MPI_Request *reqs, int first, int *index, MPI_Status *status,
                                const PdOp *op, double since, int handled);
// Has group rank `r` of `handle` left (its exit notice, or its watcher's record under pydist.run)?
int pd_group_rank_left(long handle, int r);

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
// The departed-rank check of pd_op_wait, for waits that are not MPI requests (shared_memory.c):
// 0, or -1 with DistError set when a rank `op` needs has been gone past its grace since `since`.
int pd_op_check(const PdOp *op, double since);
// Mark a group broken (its members no longer agree on what comes next): every later call refuses.
void pd_group_break(long handle, const char *why);
// The group's slot for shared_memory.c's channel (freed with the group by pd_shm_group_release).
void **pd_group_shm(long handle);

// A byte count from the environment (group.c): `dflt` when unset or empty. init_process_group has refused
// a malformed one (a ValueError naming it); one set malformed since is taken as unset.
size_t pd_env_bytes(const char *name, size_t dflt);

// ---------------------------------------------------------------------------------------------------
// A collective's data as MPI's call

// MPI's nonblocking collective for a call's data, as collectives.c describes it once: started on the
// group's communicator at once, or on its private one after every rank's header has matched in the
// shared-memory slots (shared_memory.c). Every pointer lives in the call's `keep`.
enum { PD_MPI_BCAST, PD_MPI_ALLREDUCE, PD_MPI_REDUCE, PD_MPI_ALLGATHER, PD_MPI_ALLGATHERV, PD_MPI_GATHERV,
       PD_MPI_SCATTERV, PD_MPI_REDUCE_SCATTER_BLOCK, PD_MPI_ALLTOALLV, PD_MPI_ALLTOALL };
typedef struct {
    int kind;                   // PD_MPI_*
    const char *name;           // MPI's function, for errors
    const void *send;           // MPI_IN_PLACE where MPI allows it
    MPI_Count scount;
    const MPI_Count *scounts;   // the v-collectives' (bytes)
    const MPI_Aint *sdispls;
    void *recv;                 // broadcast's buffer; reductions' result
    MPI_Count rcount;
    const MPI_Count *rcounts;
    const MPI_Aint *rdispls;
    MPI_Datatype type;
    MPI_Op op;
    int root;                   // group rank
} PdMpiCall;
// Start it on `comm` (request.c): MPI's return code.
int pd_mpi_call_start(const PdMpiCall *c, MPI_Comm comm, MPI_Request *req);
// The same data as point-to-point at 2 ranks, this rank being group rank `me` (request.c): MPI's return
// code with *what the MPI call made (for its error), or -1 for a call that is not one block each way
// (then pd_mpi_call_start).
int pd_mpi_call_start_pair(const PdMpiCall *c, int me, MPI_Comm comm, int tag, MPI_Request *req,
                           const char **what);
// Whether a call is of that kind (the same answer on every rank whose call matched).
int pd_mpi_call_pairs(const PdMpiCall *c);
// An all-to-all-v whose blocks are all one size and in rank order on both sides, as the plain all-to-all
// in *out: 1, else 0. Only where every rank's call is known to convert alike (MPI matches them only
// with each other).
int pd_mpi_call_even(const PdMpiCall *c, int size, PdMpiCall *out);
// If an input block overlaps an output block (MPI forbids it; MPICH may abort on it), point the call's
// input at a copy taken now, returned in *stage (new reference, to keep with the call), else *stage =
// NULL. `size`, `me`: the group's. 0, or -1 raised.
int pd_mpi_call_unalias(PdMpiCall *c, int size, int me, PyObject **stage);

// ---------------------------------------------------------------------------------------------------
// The shared-memory all-reduce and dist.empty (shared_memory.c over algorithms/shm.c)

// all_reduce with algorithm "shm" or chosen automatically (bytes >= PD_SHM_AUTO_BYTES on a group whose
// ranks share a node, and then only if every rank's array is in the segment). The crossover was
// measured with benchmarks/shm_allreduce.py (README).
#define PD_SHM_AUTO_BYTES (64 * 1024)
// From this size the automatic choice copies ordinary arrays through shm too: benchmarks/shm_allreduce.py
// has shown the copy path ahead of MPICH from 16 or 32 MiB up in every run on this machine (README).
#define PD_SHM_AUTO_COPY_BYTES ((Py_ssize_t)32 << 20)
// Whether the automatic choice takes shm for `nbytes` on this group: depends only on the size and the
// group's layout, so every rank decides alike.
int pd_shm_auto(long group, Py_ssize_t nbytes);
// Run the shm all-reduce of buf (validated) on the group. Returns 1 with *ret set (the result, or
// NULL with an exception), or 0 when the caller must use MPI's all-reduce: the group cannot use shared
// memory (spans nodes, or its segment could not be made), or, when not forced (the automatic choice),
// not every rank's array is in the segment (then MPICH's all-reduce is faster than copying through
// ours; measured in README; at 2 ranks, all blocking, our ring instead). Every rank decides alike (from
// the headers all ranks published).
int pd_shm_all_reduce(PyObject *tensor, PdBuf *buf, long op, MPI_Op mop, long group, int async_op, int forced,
                      PyObject **ret);
// At init (collective over the world) and at destroy/finalize (local).
int pd_shm_session_start(MPI_Comm world, double timeout);
void pd_shm_session_stop(void);
// The world ranks on this rank's node, as the session's start found them; 0: not known.
int pd_shm_node_ranks(void);
// The shared-memory path: a group's channel is made with the group (collective over its members, at
// init_process_group / new_group; a group that cannot use shared memory gets none and takes MPI's
// paths) and released with it; its progress completes small collectives whose peers have posted.
extern const PdPath pd_shm_path;
int pd_shm_type_init(PyObject *module);
// n floats in this rank's heap region (zeroed), owned by *owner (release with pd_shm_owner_release, GIL
// held); NULL when there is no segment or no room (no exception).
float *pd_shm_alloc_floats(long n, void **owner);
void pd_shm_owner_release(void *owner);
// Sum buf[0..n) over the group in place with the shm all-reduce when pd_shm_auto says so for n floats:
// 1 done, 0 not used (MPI's instead; the same answer on every rank), -1 failed (raised). GIL held.
int pd_shm_allreduce_floats(long group, float *buf, long n);
PyObject *pd_shm_empty(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
// Small collectives in shared memory (algorithms/shm_small.h): contributions up to this many bytes
// (PYDIST_SHM_SMALL_BYTES, read at init; 0: off; at most SMALL_SLOT_BYTES).
extern Py_ssize_t pd_shm_small_bytes;
// Whether this call goes through them: depends only on the size and the group, so every rank agrees.
int pd_shm_small_wanted(long group, size_t contribution);
// Whether the call's data goes through them (pd_shm_small_wanted for its contribution, but for a 2-rank
// broadcast past 32 KiB): the same answer on every rank whose call matches.
int pd_shm_small_takes(long group, const SmallCall *c);
// Run `call` (filled in but for dtype codes the caller took from pd_shm_dtype) on the group's channel:
// `a` and `b` are the arrays it reads and writes (kept until it completes), `list` what an async Work's
// result() returns. None, or a Work (async_op); NULL with an exception; NULL with *fallback = 1: the
// group cannot use shared memory (the same answer on every rank): use MPI's collective.
PyObject *pd_shm_small_run(const char *fn, const char *what, long group, int async_op, SmallCall *call,
                           PyObject *a, PyObject *b, PyObject *list, int *fallback);
// A call the slots do not carry (past the small bound, or a list form), on a group whose calls go
// through them (pd_shm_small_wanted(group, 0)): `header` (its kind without SMALL_HEADER_ONLY, count,
// dtype, op and root, as every rank describes the call alike) goes through the slots in order with the
// small calls, so that a rank whose call differs, on either side of any threshold, raises ValueError
// with every other; the data then goes as `mpi` on the group's private communicator. With src or dst
// set (an all-to-all of equal blocks) its data goes into the slots too where it fits, and moves there
// when every rank's did. `keep` owns every byte MPI touches; AVG divides `avg` when it completes.
// Returns as pd_shm_small_run.
PyObject *pd_shm_header_run(const char *fn, long group, int async_op, const SmallCall *header, const PdMpiCall *mpi,
                            PyObject *keep, PyObject *list, const PdBuf *avg, int *fallback);
int pd_shm_dtype(const PdBuf *buf);
PyObject *pd_set_shm_small_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_shm_info(PyObject *self, PyObject *unused);

// ---------------------------------------------------------------------------------------------------
// A communication call as the timeline and the stall inspector see it (calls.c)

// Every _C communication function (collectives.c, p2p.c) brackets its work with pd_call_begin and
// pd_call_end; the path that carries the call names itself in pd_call_path on the way (a single store,
// on or off): "small shm", "shm", "ring", "persistent", "MPI".
typedef struct {
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
// collective: 1 for a collective (numbered), 0 for point-to-point (peer: the global peer rank).
void pd_call_begin(PdCall *c, const char *name, long group, int collective, int peer);
// `ret` is what the function returns (NULL: it failed; a Work: the span is recorded when it completes,
// from pd_work_finish/fail); `bytes` what this rank's buffers hold.
void pd_call_end(PdCall *c, PyObject *ret, long long bytes);
// The id of a group in the trace (a hash of its world ranks and its ordinal among the groups of those
// members; see calls.c), recording its members for
// _C.timeline_groups() on the first call.
uint64_t pd_call_group_id(long group);
// group.c, as each group is made on its members (collectively): give it its id.
void pd_call_group_made(long group);
PyObject *pd_timeline_clock(PyObject *self, PyObject *unused);                           // calls.c
PyObject *pd_timeline_start(PyObject *self, PyObject *const *args, Py_ssize_t nargs);   // calls.c
PyObject *pd_timeline_write(PyObject *self, PyObject *const *args, Py_ssize_t nargs);   // calls.c
PyObject *pd_timeline_event(PyObject *self, PyObject *const *args, Py_ssize_t nargs);   // calls.c
PyObject *pd_timeline_groups(PyObject *self, PyObject *unused);                          // calls.c
PyObject *pd_timeline_thread_name(PyObject *self, PyObject *name);                      // calls.c

// The stall inspector (stall.c): each rank's current call on its host's shared-memory board, and a
// warning (once per wait) naming the ranks a wait longer than PYDIST_STALL_WARN seconds still waits for.
// shared_memory.c, at init: the board's slots, `stride` bytes apart, one per rank of the node (in node
// rank order, with their world ranks), this rank's at node_rank.
void pd_stall_board_attach(void *slots, size_t stride, int node_size, int node_rank, const int *node_world_ranks);
void pd_stall_board_detach(void);
void pd_stall_note_call(const PdCall *c);      // pd_call_begin
void pd_stall_note_return(void);               // pd_call_end
void pd_stall_check(const PdOp *op, double wait_started);   // group.c's departed_check, every slice
void pd_stall_read_env(void);                  // at init

// ---------------------------------------------------------------------------------------------------
// Work handles (work.c): async_op=True, isend/irecv. A Work knows its operation only as a PdPending,
// which the operation's path implements in its own file.

typedef struct PdWorkObject PdWorkObject;

typedef struct {
    // Move it along without waiting. 1: over (finished, or failed with w->error set); 0: not yet.
    // GIL held; never raises.
    int (*test)(PdWorkObject *w);
    // Wait for it (GIL held on entry and exit). 0: over (finished, or failed with w->error set); -1:
    // raised, still pending (timeout, signal, a departed rank; the session's own timeout breaks the
    // group when timeout_breaks).
    int (*wait)(PdWorkObject *w, double timeout, int timeout_breaks);
    // The Work is going before it is over (dropped, or cleared by the collector): whatever MPI or the
    // peers may still write keeps its memory (its arrays, parked or owned by the path), and the
    // operation still completes. GIL held.
    void (*abandon)(PdWorkObject *w);
} PdPending;

struct PdWorkObject {
    PyObject_HEAD
    const PdPending *pending;  // how its path moves it along; NULL once over
    void *state;           // that path's own state for it (a ring, a cache entry, a group's channel)
    MPI_Request req;       // the path's MPI request, if it has one
    MPI_Status status;
    PdOp op;               // what, group and peers, for the wait and for messages
    PyObject *keep;        // owns the memory MPI reads/writes (a tuple of arrays); NULL when done
    PyObject *result;      // what result() returns (list of arrays)
    int is_recv;           // a point-to-point receive: has a source rank, and may be cancelled
    int waiting;           // a thread is in wait() on this operation: nobody else may touch it
    int avg_divisor;       // >0: divide the result by this after completion (AVG)
    const PdDtype *avg_dtype;
    void *avg_buf;
    MPI_Count avg_count;
    PyObject *error;       // exception raised by a failed completion, re-raised by later wait()s
    PdCall call;           // the call that made it, for the timeline (call.t0 == 0: not recorded)
    long long call_bytes;
    const char *call_path;
};

extern PyTypeObject *pd_WorkType;
int pd_work_type_init(PyObject *module);
// A new Work for a pending operation of `pending`'s path (NULL: over already) that keeps `keep` alive
// and returns `result` from result() (new references taken; result NULL: an empty list). NULL with an
// exception; the caller still owns its operation then.
PdWorkObject *pd_work_make(const PdPending *pending, void *state, const PdOp *op, PyObject *keep, PyObject *result);
// The operation is over: let go of the arrays (and finish AVG) / record the exception set as its error.
void pd_work_finish(PdWorkObject *w);
void pd_work_fail(PdWorkObject *w);
// Work.wait() under the session's timeout, from C: 0, or -1 raised (its error, a timeout, a signal).
int pd_work_wait(PdWorkObject *w);
// A dropped Work's caller never learned whether it completed: say so (ResourceWarning). GIL held.
void pd_work_warn_dropped(PdWorkObject *w);

// The plain MPI path (request.c): one MPI request, waited for the pydist way.
extern const PdPending pd_request_pending;
// A new Work for `req` (MPI_REQUEST_NULL: complete already). is_recv: a point-to-point receive. On
// failure the request is parked with `keep`, so its memory stays alive, and NULL is returned.
PdWorkObject *pd_work_new(MPI_Request req, const PdOp *op, PyObject *keep, PyObject *result, int is_recv);

// Our ring all-reduce as a path (ring_path.c): blocking, or a Work whose steps every wait moves along.
PyObject *pd_ring_all_reduce(PyObject *tensor, PdBuf *buf, long op, MPI_Op mop, long group, int async_op);
// The ring all-reduce of `data` (count elements, in place) as w's operation, on `comm` with `tag`: w's
// arrays stay with it and the ring's scratch joins them, and from here on w is a ring in flight (or,
// with nothing to send, over: w->pending NULL). 0, or -1 with the error raised and w as it was.
int pd_ring_start_on(PdWorkObject *w, void *data, MPI_Count count, MPI_Datatype dtype, MPI_Op op, MPI_Comm comm,
                     int tag);
extern const PdPath pd_ring_path;

// ---------------------------------------------------------------------------------------------------
// Cached persistent requests for small collectives (persistent.c)

enum { PD_PERSIST_BARRIER, PD_PERSIST_BCAST, PD_PERSIST_ALLREDUCE, PD_PERSIST_REDUCE, PD_PERSIST_ALLGATHER,
       PD_PERSIST_REDUCE_SCATTER };

// What identifies a cached request: the same on every rank for the same call (never an address).
typedef struct {
    int kind;
    MPI_Count count;     // the init's count: elements per rank's block (all_gather, reduce_scatter,
                         // all_to_all) or of the whole buffer
    MPI_Datatype type;
    size_t extent;       // bytes per element of `type`
    MPI_Op op;           // MPI_OP_NULL where there is none
    int root;            // group rank; -1 where there is none
    int rank, size;      // this rank's and the group's: fixed per group, not compared
} PdPersistKey;

// One call's data: src (src_bytes) is copied into the staging before the start, the result is copied
// out into dst (dst_bytes) on completion and then divided by avg_divisor (AVG, avg_count elements).
typedef struct {
    const void *src;
    size_t src_bytes;
    void *dst;
    size_t dst_bytes;
    int avg_divisor;
    const PdDtype *avg_dtype;
    MPI_Count avg_count;
} PdPersistCall;

typedef struct PdPersistEntry PdPersistEntry;

// Messages up to this many bytes take the cached path (PYDIST_PERSISTENT_BYTES, read at init; 0: off).
extern Py_ssize_t pd_persist_bytes;
static inline int pd_persist_wanted(size_t message_bytes) {
    return pd_persist_bytes > 0 && message_bytes <= (size_t)pd_persist_bytes;
}
// 0: all-gathers stay nonblocking (MPICH's chosen algorithm is wrong on a restarted request).
extern int pd_persist_allgather_ok;
void pd_persist_read_env(void);
// Run a collective through the group's cache: blocking (list == NULL: waits the pydist way, returns
// None) or async (returns a Work holding `keep` whose result() is `list`). NULL with an exception.
PyObject *pd_persist_run(const PdOp *op, MPI_Comm comm, const PdPersistKey *key, const PdPersistCall *call,
                         PyObject *keep, PyObject *list);
extern const PdPath pd_persistent_path;
PyObject *pd_persistent_stats(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

// ---------------------------------------------------------------------------------------------------
// The training engine (engine_py.c over csrc/engine/)

int pd_engine_type_init(PyObject *module);
int pd_compressor_type_init(PyObject *module);   // _C.Compressor (compress_py.c over csrc/compress/)
PyObject *pd_load_idx(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_epoch_permutation(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_set_blas_threads(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_blas_core(PyObject *self, PyObject *unused);
PyObject *pd_sgemm_seconds(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

// ---------------------------------------------------------------------------------------------------
// Module functions, one file per concern

PyObject *pd_init(PyObject *self, PyObject *const *args, Py_ssize_t nargs);          // group.c
PyObject *pd_destroy(PyObject *self, PyObject *unused);                               // group.c
PyObject *pd_finalize(PyObject *self, PyObject *unused);                              // group.c
PyObject *pd_forget_ranks(PyObject *self, PyObject *ranks);                           // group.c
PyObject *pd_abort(PyObject *self, PyObject *const *args, Py_ssize_t nargs);          // group.c
PyObject *pd_get_rank(PyObject *self, PyObject *const *args, Py_ssize_t nargs);       // group.c
PyObject *pd_get_world_size(PyObject *self, PyObject *const *args, Py_ssize_t nargs); // group.c
PyObject *pd_is_initialized(PyObject *self, PyObject *unused);                        // group.c
PyObject *pd_set_timeout(PyObject *self, PyObject *const *args, Py_ssize_t nargs);     // group.c
PyObject *pd_mpi_info(PyObject *self, PyObject *unused);                              // group.c
PyObject *pd_new_group(PyObject *self, PyObject *const *args, Py_ssize_t nargs);      // group.c
PyObject *pd_destroy_group(PyObject *self, PyObject *const *args, Py_ssize_t nargs);  // group.c
PyObject *pd_live_groups(PyObject *self, PyObject *unused);                           // group.c
PyObject *pd_parent_rank(PyObject *self, PyObject *unused);                           // child.c

PyObject *pd_send(PyObject *self, PyObject *const *args, Py_ssize_t nargs);   // p2p.c
PyObject *pd_recv(PyObject *self, PyObject *const *args, Py_ssize_t nargs);   // p2p.c
PyObject *pd_isend(PyObject *self, PyObject *const *args, Py_ssize_t nargs);  // p2p.c
PyObject *pd_irecv(PyObject *self, PyObject *const *args, Py_ssize_t nargs);  // p2p.c

PyObject *pd_barrier(PyObject *self, PyObject *const *args, Py_ssize_t nargs);     // collectives.c
PyObject *pd_broadcast(PyObject *self, PyObject *const *args, Py_ssize_t nargs);   // collectives.c
PyObject *pd_all_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs);  // collectives.c
PyObject *pd_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs);      // collectives.c
PyObject *pd_all_gather_into_tensor(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_all_gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_scatter(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_reduce_scatter_tensor(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_reduce_scatter(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_all_to_all_single(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_all_to_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_set_validate_only(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
// This thread's collectives, isend and irecv check their arguments and return without sending
// (PYDIST_DEBUG=DETAIL's checks, batch_isend_irecv's first pass). Per thread: another thread's call
// must never become a no-op.
extern PD_THREAD_LOCAL int pd_validate_only;

PyObject *pd_set_wait_mode(PyObject *self, PyObject *const *args, Py_ssize_t nargs); // wait.c
PyObject *pd_parked_count(PyObject *self, PyObject *unused);                         // wait.c
PyObject *pd_check_op(PyObject *self, PyObject *const *args, Py_ssize_t nargs);     // dtypes.c

// Small helpers for the positional _C signatures: parse a C long / bool argument or raise TypeError.
int pd_arg_long(PyObject *obj, const char *fn, const char *arg, long *out);
int pd_arg_bool(PyObject *obj, const char *fn, const char *arg, int *out);
int pd_check_nargs(Py_ssize_t nargs, Py_ssize_t want, const char *fn);

#endif  // PYDIST_H
