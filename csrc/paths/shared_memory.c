/*
 * shared_memory.c: the Python side of the shared-memory all-reduce (algorithms/shm.c): the segments,
 * all_reduce(algorithm="shm"), and dist.empty/zeros, whose arrays live in this rank's part of the
 * session segment so that the all-reduce reads and writes them in place, with no copy.
 *
 * Segments are shared memory made by shm_segment.c (a memfd, which can never be left in /dev/shm; a
 * named segment only where that cannot work) and mapped, not MPI windows: an MPI window is freed
 * collectively (MPI_Win_free), which destroy_process_group (a local call) cannot do when a peer has
 * gone, and it would pull the memory from under arrays that outlive the session. A mapping here is
 * reference counted: the session holds one reference and every dist.empty block another, so such an
 * array stays valid memory after destroy_process_group (a later session treats it as an ordinary array).
 *
 * Collective points, each reached alike by every rank: the session segment at init_process_group (over
 * the node's ranks, MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)); a group's channel at its first shm
 * all-reduce. A group whose ranks are not all on one node uses MPI's all-reduce (decided from the node
 * of every world rank, gathered at init, so every rank decides alike), and so does one whose segment
 * could not be made (decided collectively). Either is said once on stderr and in _C.shm_info().
 *
 * Sizes: PYDIST_SHM_BYTES (bytes of heap per rank, default 256 MiB of address space; memory is committed
 * only as blocks are allocated, with fallocate, so a full /dev/shm is a MemoryError, never a SIGBUS;
 * 0 turns shared memory off, and init makes no collective call of its own for it) and PYDIST_SHM_STAGE (bytes per staging buffer, default 1 MiB, read
 * on the group's first rank; tests make it small to reach the multi-chunk path cheaply).
 *
 * async_op=True runs the all-reduce at once and returns a completed Work.
 *
 * The same channel carries the small collectives (algorithms/shm_small.h): every collective up to
 * PYDIST_SHM_SMALL_BYTES per rank (default and most 64 KiB) on a group within one node. Their calls
 * are posted at once and completed in order from the group's queue: by the call itself (blocking),
 * by Work.wait/is_completed, by the next call on the group, or by any pydist wait (the path's progress,
 * from the wait hook), so an async call that nobody waits for still completes, as MPI's do.
 */
#include "paths/shared_memory.h"

#include "core/errors.h"
#include "core/settings.h"
#include "groups/group.h"
#include "observe/calls.h"
#include "observe/stall.h"
#include "paths/algorithms/shm.h"
#include "paths/private_comm.h"
#include "paths/ring_path.h"
#include "paths/shm_segment.h"
#include "paths/tuned.h"
#include "progress/op.h"
#include "progress/wait.h"
#include "progress/work.h"
#include "shm_segment.h"

#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEFAULT_HEAP_BYTES ((size_t)256 << 20)
#define DEFAULT_STAGE_BYTES ((size_t)1 << 20)
#define PAGE 4096

// ---------------------------------------------------------------------------------------------------
// Mappings and how they are made

typedef struct {
    long refs;            // the session (while current) and every live dist.empty block
    char *base;
    size_t bytes;
    int fd;               // kept open: blocks commit their pages with fallocate
    ShmSession view;
    ShmHeap heap;
} Session;

static Session *session = NULL;     // the current session's segment; NULL: none
static int *node_of = NULL;         // [world size]: each world rank's node (its node's first world rank)
static int world_size = 0;
static int node_ranks = 0;          // world ranks on this rank's node; 0: not known (no split at init)
static char unavailable[300];       // why there is no segment (empty: there is one)
static int said_unavailable = 0;
static long long calls_copied = 0, calls_in_place = 0;   // shm all-reduces by path (for tests)
static long long calls_declined = 0;                     // automatic ones left to MPI (not all in place)

static void say_once(const char *what) {
    if (!said_unavailable) {
        said_unavailable = 1;
        fprintf(stderr, "pydist: shared-memory all-reduce unavailable (%s); using MPI's all-reduce instead\n", what);
    }
}

// Set-up waits at init do not break the world group when they time out: init then goes on without a
// segment (pd_shm_session_start), and the group must stay usable.
static int init_waits = 0;

static int wait_op(MPI_Request *req, long group, const char *what, double timeout) {
    PdOp op = pd_op(what, group, PD_PEER_ALL);
    if (pd_op_wait(req, MPI_STATUS_IGNORE, &op, timeout, !init_waits) < 0) {
        if (*req != MPI_REQUEST_NULL) {
            pd_park(*req, NULL, 0);   // its buffer is leaked on purpose by the caller
        }
        return -1;
    }
    return 0;
}

static void session_decref(Session *s) {
    if (s != NULL && --s->refs == 0) {
        munmap(s->base, s->bytes);
        close(s->fd);
        shm_heap_free_all(&s->heap);
        PyMem_RawFree(s);
    }
}

// ---------------------------------------------------------------------------------------------------
// The session segment (init / destroy)

static int session_start(MPI_Comm world, double timeout);

// A set-up that cannot complete (a rank's own init timed out and it went on without us, so our
// collectives here never match) is not init's failure: init succeeds without a segment, as the rank
// whose init timed out left it (tests/unit/test_departures.py). Only Ctrl-C ends init.
int pd_shm_session_start(MPI_Comm world, double timeout) {
    size_t small = pd_env_bytes("PYDIST_SHM_SMALL_BYTES", SMALL_SLOT_BYTES);
    pd_shm_small_bytes = (Py_ssize_t)(small < SMALL_SLOT_BYTES ? small : SMALL_SLOT_BYTES);
    init_waits = 1;
    int rc = session_start(world, timeout);
    init_waits = 0;
    if (rc < 0 && !PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *text = value ? PyObject_Str(value) : NULL;
        snprintf(unavailable, sizeof unavailable, "setting up the segment at init did not complete: %.200s",
                 text && PyUnicode_Check(text) ? PyUnicode_AsUTF8(text) : "?");
        Py_XDECREF(text);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        PyErr_Clear();
        say_once(unavailable);
        return 0;
    }
    return rc;
}

static int session_start(MPI_Comm world, double timeout) {
    int rc, wrank, wsize, nrank, nsize;
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    unavailable[0] = 0;
    MPI_Comm_rank(world, &wrank);
    MPI_Comm_size(world, &wsize);
    PyMem_RawFree(node_of);
    node_of = NULL;
    world_size = 0;
    node_ranks = 0;
    // A rank's own PYDIST_SHM_BYTES=0 turns its node's segment off, decided on the node below: it takes part
    // in the world's collectives here whatever its setting, or a node set otherwise would wait for it.
    int off = pd_env_bytes("PYDIST_SHM_BYTES", 1) == 0;
    // Init's own collectives have completed here, but a rank whose init timed out has gone on without
    // them: meet first through our interruptible wait, then split (blocking in MPI).
    if ((rc = MPI_Ibarrier(world, &req)) != MPI_SUCCESS) {
        return pd_raise_mpi_int(rc, "MPI_Ibarrier");
    }
    if (wait_op(&req, 0, "init_process_group (shared memory)", timeout) < 0) {
        return -1;
    }
    if ((rc = MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node)) != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, text, &len);
        snprintf(unavailable, sizeof unavailable, "MPI_Comm_split_type failed: %.200s", text);
        say_once(unavailable);   // every rank fails alike here or MPI itself is broken
        return 0;
    }
    MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN);
    MPI_Comm_rank(node, &nrank);
    MPI_Comm_size(node, &nsize);
    node_ranks = nsize;
    // Each rank's node, named by the node's first world rank (the lowest: split_type keeps world order).
    int *nodes = PyMem_RawMalloc(sizeof(int) * (size_t)wsize), leader = wrank;
    if (nodes == NULL) {
        MPI_Comm_free(&node);
        PyErr_NoMemory();
        return -1;
    }
    MPI_Allreduce(&wrank, &leader, 1, MPI_INT, MPI_MIN, node);   // blocking: the node's ranks are all here
    if ((rc = MPI_Iallgather(&leader, 1, MPI_INT, nodes, 1, MPI_INT, world, &req)) != MPI_SUCCESS) {
        MPI_Comm_free(&node);
        PyMem_RawFree(nodes);
        return pd_raise_mpi_int(rc, "MPI_Iallgather");
    }
    if (wait_op(&req, 0, "init_process_group", timeout) < 0) {
        MPI_Comm_free(&node);
        return -1;   // nodes leaked on purpose: MPI may still write it
    }
    MPI_Allreduce(MPI_IN_PLACE, &off, 1, MPI_INT, MPI_MAX, node);   // blocking: the node's ranks are all here
    if (off) {   // this node has no segment: its groups use MPI's paths, as decided alike on each of its ranks
        MPI_Comm_free(&node);
        PyMem_RawFree(nodes);
        node_ranks = 0;
        snprintf(unavailable, sizeof unavailable, "PYDIST_SHM_BYTES=0 turns it off");
        return 0;
    }
    node_of = nodes;
    world_size = wsize;
    size_t region = pd_env_bytes("PYDIST_SHM_BYTES", DEFAULT_HEAP_BYTES) / PAGE * PAGE;
    char *base;
    int fd;
    size_t bytes = (region > PAGE ? region : PAGE) * (size_t)nsize;
    int made = pd_shm_segment_make(node, nrank, &bytes, 0, 0, "init_process_group (shm set-up)", timeout, NULL, &base,
                                   &fd, unavailable, sizeof unavailable, wait_op);
    MPI_Comm_free(&node);
    region = bytes / (size_t)nsize;   // rank 0's
    if (made < 0) {
        return -1;
    }
    if (made == 0) {
        say_once(unavailable);
        return 0;
    }
    // The first page of each rank's region is its slot of the stall inspector's board (stall.c), its
    // pages committed now so that writing it can never fault; the heap follows.
    size_t board = region >= 2 * PAGE && posix_fallocate(fd, (off_t)(region * (size_t)nrank), PAGE) == 0 ? PAGE : 0;
    Session *s = PyMem_RawCalloc(1, sizeof *s);
    // (PYDIST_TEST_SEGMENT_FALLBACK=heap: this rank makes no heap, as if out of memory, for the tests)
    const char *test = getenv("PYDIST_TEST_SEGMENT_FALLBACK");
    if (s == NULL || (test != NULL && strcmp(test, "heap") == 0) ||
        shm_heap_init(&s->heap, region * (size_t)nrank + board, region * (size_t)(nrank + 1)) < 0) {
        PyMem_RawFree(s);
        munmap(base, bytes);
        close(fd);
        snprintf(unavailable, sizeof unavailable, "out of memory");
        return 0;   // this rank alone has no heap: its arrays are ordinary, which every path handles
    }
    s->refs = 1;
    s->base = base;
    s->bytes = bytes;
    s->fd = fd;
    s->view = (ShmSession){base, region, nrank, nsize};
    session = s;
    if (board) {
        int *node_world = PyMem_RawMalloc(sizeof(int) * (size_t)nsize);
        if (node_world != NULL) {
            for (int w = 0, k = 0; w < wsize && k < nsize; w++) {
                if (node_of[w] == node_of[wrank]) node_world[k++] = w;   // split_type keeps world order
            }
            pd_stall_board_attach(base, region, nsize, nrank, node_world);
            PyMem_RawFree(node_world);
        }
    }
    return 0;
}

void pd_shm_session_stop(void) {
    pd_stall_board_detach();
    Session *s = session;
    session = NULL;
    session_decref(s);   // the mapping stays while dist.empty arrays use it
}

// ---------------------------------------------------------------------------------------------------
// A group's channel

// Where a call's data goes when the slots do not carry it (large_data): as `mpi` on the group's private
// communicator, or (an all-reduce whose flags allow it) through the shm all-reduce. AVG's division, if
// any, happens when it completes.
typedef struct {
    PdMpiCall mpi;
    void *avg_buf;
    const PdDtype *avg_dtype;
    MPI_Count avg_count;
} Elsewhere;

// A small collective posted and not yet completed by this rank (completed in order, oldest first).
typedef struct {
    SmallCall call;
    const char *what;
    PyObject *a, *b;       // the arrays it reads and writes (new references; either may be NULL)
    PdWorkObject *work;    // its Work (a new reference), or NULL: a blocking call that was interrupted
    Elsewhere *elsewhere;  // owned, or NULL: a call whose data only the slots carry (work is never NULL
                           // where it is set); out of line, as the small calls copy Pending around
} Pending;

typedef struct {
    int state;            // CHANNEL_READY, CHANNEL_MPI (fall back), CHANNEL_BROKEN
    int busy;             // a thread is inside an all-reduce on it (or making it)
    int orphaned;         // its group was destroyed meanwhile: that thread frees it when it leaves
    ShmChannel ch;
    int fd;
    char why[300];
    long group;
    int small_ok;         // the small collectives' area exists (groups up to SMALL_MAX_RANKS)
    ShmSmall small;
    // The calls this rank has made and not completed, oldest first: queue[q_head .. q_head + q_len).
    // The first q_posted of them are in the slots; the rest wait for a slot (a rank may be any number
    // of calls ahead: a post never waits, and progress posts them as the peers free their slots).
    Pending *queue;
    int q_cap, q_head, q_len, q_posted;
} GroupChannel;

static void small_abandon(GroupChannel *g);

enum { CHANNEL_READY = 1, CHANNEL_MPI = 2, CHANNEL_BROKEN = 3 };

static void channel_release(void *p) {
    GroupChannel *g = p;
    if (g == NULL) {
        return;
    }
    if (g->busy) {
        g->orphaned = 1;   // another thread still waits on its mapping (the GIL released)
        return;
    }
    small_abandon(g);
    PyMem_RawFree(g->queue);
    if (g->ch.base != NULL) {
        munmap(g->ch.base, g->ch.bytes);
    }
    if (g->fd >= 0) {
        close(g->fd);
    }
    shm_channel_release(&g->ch);
    PyMem_RawFree(g);
}

// Whether the group's ranks all share this rank's node (the same answer on every member).
static int group_on_one_node(long group) {
    if (node_of == NULL) {
        return 0;
    }
    int size = pd_group_size(group), first = node_of[pd_group_to_global(group, 0)];
    for (int r = 1; r < size; r++) {
        if (node_of[pd_group_to_global(group, r)] != first) {
            return 0;
        }
    }
    return 1;
}

int pd_shm_node_ranks(void) {
    return node_ranks;
}

int pd_shm_auto(long group, Py_ssize_t nbytes) {
    return nbytes >= PD_SHM_AUTO_BYTES && pd_group_size(group) > 1 && group_on_one_node(group);
}

// Make the group's channel (g is in its slot, busy: the waits release the GIL). Sets g->state; returns
// 0, or with an exception set -1 (the call cannot go on) or -2 (its group was destroyed meanwhile: g is
// freed).
static int channel_make(GroupChannel *g, long group, const char *fn) {
    if (!group_on_one_node(group)) {
        g->state = CHANNEL_MPI;
        snprintf(g->why, sizeof g->why, "the group's ranks are on more than one node");
        return 0;
    }
    MPI_Comm *comm = pd_group_comm(group, fn);
    if (comm == NULL) {
        g->state = CHANNEL_BROKEN;
        snprintf(g->why, sizeof g->why, "its group was unusable when it was first used");
        return -1;
    }
    int rank = pd_group_rank(group), size = pd_group_size(group);
    size_t stage = pd_env_bytes("PYDIST_SHM_STAGE", DEFAULT_STAGE_BYTES);
    stage = stage < 64 ? 64 : stage / 64 * 64;   // room for one element of every dtype
    size_t bytes = shm_channel_bytes(size, stage);
    g->small_ok = size <= SMALL_MAX_RANKS;
    bytes += g->small_ok ? shm_small_bytes(size) : 0;   // rank 0's bytes win too: the same stage, the same size
    char *base;
    // rank 0's size and staging win (pd_shm_segment_make), so every rank lays the channel out alike
    int made = pd_shm_segment_make(*comm, rank, &bytes, 1, group, fn, pd_session_timeout(), &stage, &base, &g->fd,
                                   g->why, sizeof g->why, wait_op);
    if (g->orphaned) {   // its group was destroyed while we waited
        if (made == 1) munmap(base, bytes);
        g->busy = 0;
        channel_release(g);
        if (made >= 0) {
            PyErr_Format(PyExc_ValueError, "%s(): `group` was destroyed while this call waited", fn);
        }
        return -2;
    }
    if (made < 0) {
        g->state = CHANNEL_BROKEN;
        snprintf(g->why, sizeof g->why, "setting up its shared segment did not complete");
        return -1;
    }
    if (made == 0) {
        g->state = CHANNEL_MPI;
        say_once(g->why);
        return 0;
    }
    if (shm_channel_init(&g->ch, base, rank, size, stage) < 0) {
        g->ch.base = NULL;
        munmap(base, bytes);
        g->state = CHANNEL_BROKEN;
        snprintf(g->why, sizeof g->why, "out of memory");
        PyErr_NoMemory();
        return -1;
    }
    g->ch.bytes = bytes;   // the whole mapping (munmap'd with the group)
    if (g->small_ok) {
        shm_small_init(&g->small, base + shm_channel_bytes(size, stage), rank, size);
    }
    g->group = group;
    g->state = CHANNEL_READY;
    return 0;
}

static int channel_new(long group, const char *fn);

// The path's group_setup: the channel, made while every member is in the group's creation. A group of
// one rank gets its channel only if algorithm="shm" asks for it (channel_of): it waits for nobody.
static int shm_group_setup(long group, const char *fn) {
    if (*pd_group_shm(group) != NULL || pd_group_size(group) < 2 || !group_on_one_node(group)) {
        return 0;   // nothing to share: MPI's paths (decided alike on every member)
    }
    return channel_new(group, fn);
}

static int channel_new(long group, const char *fn) {
    void **slot = pd_group_shm(group);
    GroupChannel *g = PyMem_RawCalloc(1, sizeof *g);
    if (g == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    g->fd = -1;
    g->busy = 1;   // while it is made (the waits release the GIL): other threads keep off
    *slot = g;
    init_waits++;   // a wait given up fails the group's creation; it breaks nothing
    int rc = channel_make(g, group, fn);
    init_waits--;
    if (rc == -2) {
        return -1;   // freed with its destroyed group
    }
    g->busy = 0;
    return rc < 0 ? -1 : 0;
}

// Whether another thread is inside the group's channel (and the group is still the one we looked at).
static int channel_busy(const void *p) {
    const PdOp *op = p;
    if (!pd_op_current(op)) {
        return 0;
    }
    GroupChannel *g = *pd_group_shm(op->group);
    return g != NULL && g->busy;
}

// The group's channel, made with the group. NULL with *fallback = 1: use MPI; NULL otherwise: raised.
static GroupChannel *channel_of(long group, const char *fn, int *fallback) {
    GroupChannel *g = *pd_group_shm(group);
    *fallback = 0;
    if (g == NULL && pd_group_size(group) == 1 && group_on_one_node(group)) {
        if (channel_new(group, fn) < 0) {
            return NULL;
        }
        g = *pd_group_shm(group);
    }
    if (g == NULL || g->state == CHANNEL_MPI) {
        *fallback = 1;
        return NULL;
    }
    if (g->state == CHANNEL_BROKEN) {
        PyErr_Format(pd_DistError, "%s(): the group's shared-memory channel is out of step (%s); "
                     "use algorithm=\"mpi\" or recreate the group", fn, g->why);
        return NULL;
    }
    if (g->busy) {
        // Another thread waits inside the channel: for one of the group's Works (legal while this call
        // is issued; a second thread's collective call was refused in ops/route.c). This call queues
        // behind it, and looks again: the group may have gone meanwhile.
        PdOp op = pd_op(fn, group, PD_PEER_ALL);
        if (pd_yield_while(channel_busy, &op, pd_group_timeout(group), fn,
                           "another thread of this rank was waiting in the group's shared-memory channel") < 0) {
            return NULL;
        }
        if (!pd_op_current(&op)) {
            PyErr_Format(PyExc_ValueError, "%s(): `group` was destroyed while this call waited", fn);
            return NULL;
        }
        return channel_of(group, fn, fallback);
    }
    return g;
}

// ---------------------------------------------------------------------------------------------------
// The all-reduce

typedef struct {
    PyThreadState *released;
    PdOp op;
    double start, timeout;
    int no_signals;   // a Ctrl-C waits for the end of this call (its peers are all in it, in step)
} SliceCtx;

// Every slice of a wait: the GIL, the wait hook, signals, departed ranks, the deadline.
static int wait_slice(void *p) {
    SliceCtx *w = p;
    int rc = 0;
    PyEval_RestoreThread(w->released);
    pd_progress_all();
    if ((!w->no_signals && PyErr_CheckSignals() < 0) || pd_op_check(&w->op, w->start) < 0) {
        rc = -1;
    } else {
        double waited = MPI_Wtime() - w->start;
        if (w->timeout >= 0 && waited >= w->timeout) {
            pd_raise_timeout(w->op.what, waited, w->timeout, "another rank may not have called it");
            rc = -1;
        }
    }
    w->released = PyEval_SaveThread();
    return rc;
}

static int dtype_code(const PdBuf *buf) {
    const PdDtype *d = buf->dtype;
    int size = (int)PyArray_ITEMSIZE(buf->arr);
    switch (d->kind) {
    case 'b': return SHM_BOOL;
    case 'i': return size == 1 ? SHM_I8 : size == 2 ? SHM_I16 : size == 4 ? SHM_I32 : SHM_I64;
    case 'u': return size == 1 ? SHM_U8 : size == 2 ? SHM_U16 : size == 4 ? SHM_U32 : SHM_U64;
    case 'f': return d->half == PD_HALF_BF16 ? SHM_BF16 : size == 2 ? SHM_F16 : size == 4 ? SHM_F32 : SHM_F64;
    default: return size == 8 ? SHM_C64 : SHM_C128;
    }
}

// The all-reduce on the group's channel, the GIL released meanwhile. 0 done, -1 raised.
// 0 done, 2 not done (copy_ok = 0 and some rank's array is not in the segment), -1 raised.
static int run(GroupChannel *g, long group, const char *what, void *data, int64_t count, int dtype, long op,
               int copy_ok, int no_signals) {
    char err[600] = {0};
    SliceCtx ctx = {NULL, pd_op(what, group, PD_PEER_ALL), MPI_Wtime(), pd_group_timeout(group), no_signals};
    ShmWait wait = {wait_slice, &ctx, pd_wait_spin};
    g->busy = 1;
    ctx.released = PyEval_SaveThread();
    int rc = shm_allreduce(&g->ch, session ? &session->view : NULL, data, count, dtype, (int)op, copy_ok, &wait,
                           err, sizeof err);
    PyEval_RestoreThread(ctx.released);
    g->busy = 0;
    if (g->orphaned) {   // another thread destroyed the group meanwhile: the channel is ours to free
        channel_release(g);
        g = NULL;
    }
    if (rc == -1) {
        // The ranks are no longer in step on this channel; a timeout breaks the group, as MPI's do.
        if (g != NULL) {
            g->state = CHANNEL_BROKEN;
            snprintf(g->why, sizeof g->why, "an all-reduce on it was interrupted or timed out");
            if (PyErr_ExceptionMatches(pd_DistTimeoutError)) {
                pd_group_break(group, "all_reduce (shm) timed out");
            }
        }
        return -1;
    }
    if (rc == -2) {
        PyErr_Format(PyExc_ValueError, "all_reduce(algorithm=\"shm\"): %s", err);
        return -1;
    }
    if (rc == 2) {
        return 2;
    }
    if (rc == 1) {
        calls_in_place++;
    } else {
        calls_copied++;
    }
    return 0;
}

int pd_shm_allreduce_floats(long group, float *buf, long n) {
    int fallback;
    if (!pd_shm_auto(group, (Py_ssize_t)n * (Py_ssize_t)sizeof(float))) {
        return 0;
    }
    GroupChannel *g = channel_of(group, "all_reduce", &fallback);
    if (g == NULL) {
        return fallback ? 0 : -1;
    }
    int rc = run(g, group, "the training step's all-reduce (shm)", buf, n, SHM_F32, SHM_SUM, 0, 0);
    return rc < 0 ? -1 : rc == 2 ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------------
// Small collectives (algorithms/shm_small.h): up to pd_shm_small_bytes per rank, every collective of
// a group within one node, chosen alike on every rank from the size and the group's layout.

Py_ssize_t pd_shm_small_bytes = (Py_ssize_t)SMALL_SLOT_BYTES;
static long long calls_small = 0;

static const PdPending small_pending;
static void shm_progress(void);

// The channels with posted, uncompleted calls: shm_progress moves them along.
static GroupChannel *with_pending[PD_MAX_GROUPS];
static int n_with_pending = 0;

static void unlist(GroupChannel *g) {
    for (int i = 0; i < n_with_pending; i++) {
        if (with_pending[i] == g) {
            with_pending[i] = with_pending[--n_with_pending];
            return;
        }
    }
}

int pd_shm_small_wanted(long group, size_t contribution) {
    return contribution <= (size_t)pd_shm_small_bytes && pd_shm_small_bytes > 0 && pd_group_size(group) > 1 &&
           group_on_one_node(group);
}

// A 2-rank broadcast's data crosses cores one way only: each round the root writes into slot lines the
// receiver has just read, and on some CPUs taking those lines back costs more than the copies (AMD EPYC
// here: 64 KiB written back into lines the other core had read took 7.5 us, reading them 1.9 us). Past
// PAIR_BCAST_BYTES it goes as one MPI message (the pair path, large_data), which the receiver reads.
#define PAIR_BCAST_BYTES ((size_t)32 << 10)

int pd_shm_small_takes(long group, const SmallCall *c) {
    int size = pd_group_size(group);
    size_t bytes = shm_small_contribution(c, size);
    int tuned = pd_tuned_path(size, pd_tuned_op_of_kind(c->kind), bytes);
    if (tuned != PD_TUNED_NONE) {
        return tuned == PD_TUNED_SLOTS && pd_shm_small_wanted(group, bytes);
    }
    if ((c->kind & ~SMALL_HEADER_ONLY) == SMALL_BCAST && size == 2 && bytes > PAIR_BCAST_BYTES) {
        return 0;
    }
    return pd_shm_small_wanted(group, bytes);
}

static void pending_clear(Pending *e) {
    Py_CLEAR(e->a);
    Py_CLEAR(e->b);
    Py_CLEAR(e->work);
    PyMem_RawFree(e->elsewhere);
    e->elsewhere = NULL;
}

// The group went (destroyed, or the session ended) with calls pending: their Works fail.
static void small_abandon(GroupChannel *g) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    for (; g->q_len > 0; g->q_len--, g->q_head++) {
        Pending *e = &g->queue[g->q_head];
        if (e->work != NULL) {
            e->work->pending = NULL;
            e->work->state = NULL;
            PyErr_Format(pd_DistError, "%s was abandoned: its process group was destroyed before it completed",
                         e->what);
            pd_work_fail(e->work);
            PyErr_Clear();
        }
        pending_clear(e);
    }
    g->q_head = g->q_posted = 0;
    unlist(g);
    PyErr_Restore(type, value, tb);
}

// After a wait without the GIL: if the group was destroyed meanwhile, free the channel and raise.
static int check_orphaned(GroupChannel *g, const char *what) {
    if (!g->orphaned) {
        return 0;
    }
    if (!PyErr_Occurred()) {
        PyErr_Format(pd_DistError, "%s: its group was destroyed while this call waited", what);
    }
    channel_release(g);
    return -1;
}

// A wait that gave up: a timeout of the session's own breaks the group, as MPI's collectives do.
static void gave_up(long group, int timeout_breaks, const char *what) {
    if (timeout_breaks && PyErr_ExceptionMatches(pd_DistTimeoutError)) {
        pd_group_break(group, what);
    }
}

// What a large all-reduce's header tells the peers (SmallCall.flags); every rank reads the AND and OR.
enum {
    LARGE_ASYNC = 1,        // an async_op=True call: the data must take a path that never waits (MPI's)
    LARGE_IN_SEGMENT = 2,   // the array is in this rank's region of the session segment (zero copy)
    LARGE_COPY_OK = 4,      // copying through shm pays (copy_pays); taken where any rank says so (the OR)
    LARGE_EVEN = 8,         // an all-to-all whose blocks are equal and in order (pd_mpi_call_even)
    // The path table's choice for this rank's call (tuned.h), one bit at most: taken where every rank
    // chose it (in the AND), else the built-in choice
    LARGE_TUNED_PAIR = 16,
    LARGE_TUNED_MPI = 32,
    LARGE_TUNED_RING = 64,
    LARGE_TUNED_SHM = 128,
    LARGE_TUNED = LARGE_TUNED_PAIR | LARGE_TUNED_MPI | LARGE_TUNED_RING | LARGE_TUNED_SHM,
};

// The flag for the table's path for a call of `kind` with `bytes` of input on a group of `size` (0: none).
static uint32_t tuned_flag(int kind, int size, size_t bytes) {
    switch (pd_tuned_path(size, pd_tuned_op_of_kind(kind), bytes)) {
    case PD_TUNED_PAIR: return LARGE_TUNED_PAIR;
    case PD_TUNED_MPI: return LARGE_TUNED_MPI;
    case PD_TUNED_RING: return LARGE_TUNED_RING;
    case PD_TUNED_SHM: return LARGE_TUNED_SHM;
    default: return 0;
    }
}

// Whether copying an all-reduce's ordinary array through shm pays on this rank: asked for
// (algorithm="shm"), past PD_SHM_AUTO_COPY_BYTES, or, when the wait must yield (pd_wait_spin 0: more
// ranks than cores, or ranks bound one to a core), from PD_SHM_AUTO_BYTES. There MPICH's all-reduce moves only while each rank is in MPI_Test and
// running, where the shm all-reduce's barriers yield to the peer they wait for (3-4 ranks on 2 cores,
// 256 KiB - 16 MiB: 2.4-3.3x faster, docs/performance.md).
static int copy_pays(int forced, Py_ssize_t nbytes) {
    return forced || nbytes >= PD_SHM_AUTO_COPY_BYTES || (!pd_wait_spin && nbytes >= PD_SHM_AUTO_BYTES);
}

static int in_this_segment(const void *data, size_t nbytes) {
    if (session == NULL || nbytes == 0) {
        return 0;
    }
    const char *lo = session->base + session->view.region_bytes * (size_t)session->view.node_rank, *p = data;
    return p >= lo && p < lo + session->view.region_bytes && nbytes <= (size_t)(lo + session->view.region_bytes - p);
}

// AVG: MPI (or the ring) sums; the Work divides once it completes.
static void set_avg(PdWorkObject *w, const Elsewhere *x, int size) {
    if (x->avg_buf != NULL) {
        w->avg_divisor = size;
        w->avg_dtype = x->avg_dtype;
        w->avg_buf = x->avg_buf;
        w->avg_count = x->avg_count;
    }
}

// A call whose headers have all matched and whose data the slots do not carry (GIL held): the same choice
// on every rank, from every rank's flags. An all-reduce takes shared memory when no rank is asynchronous
// and it pays (every array in the segment, or copying allowed): every rank is then in this call, blocking,
// so it runs to the end with Ctrl-C held back until it is done (an interrupted rank would leave its peers
// out of step). Otherwise an all-reduce or reduce-scatter of 2 ranks that both block takes our ring, and
// everything else is MPI's nonblocking call (the plain all-to-all where every rank's blocks are even): both
// on the group's private communicator, which only these calls and the rings use, in the order their headers
// matched: the same on every rank, whenever each rank gets here. The Work gets the outcome. g may be freed
// here (its group destroyed while the shm all-reduce waited).
static void large_data(GroupChannel *g, Pending *e) {
    PdWorkObject *w = e->work;
    long group = g->group;
    uint32_t and_ = g->small.flags_and, or_ = g->small.flags_or, tuned = and_ & LARGE_TUNED;
    int size = g->small.size, rc;
    int all_reduce = (e->call.kind & ~SMALL_HEADER_ONLY) == SMALL_ALLREDUCE;
    w->pending = NULL;
    w->state = NULL;
    if (all_reduce && !(or_ & LARGE_ASYNC) &&
        ((and_ & LARGE_IN_SEGMENT) || (tuned ? tuned == LARGE_TUNED_SHM : (or_ & LARGE_COPY_OK) != 0))) {
        pd_call_path = "shm";   // only ever a blocking call's, completed on its own thread
        if (run(g, group, e->what, e->elsewhere->mpi.recv, e->call.count, e->call.dtype, e->call.op, 1, 1) < 0) {
            pd_work_fail(w);
            PyErr_Clear();   // the Work's wait() raises it
        }
        pd_work_finish(w);
        return;
    }
    calls_declined += all_reduce;
    MPI_Comm *comm = pd_group_private_comm(group);
    const Elsewhere *x = e->elsewhere;
    int reduce_scatter = (e->call.kind & ~SMALL_HEADER_ONLY) == SMALL_REDUCE_SCATTER &&
                         x->mpi.kind == PD_MPI_REDUCE_SCATTER_BLOCK;
    if ((all_reduce || reduce_scatter) && (tuned ? tuned == LARGE_TUNED_RING : size == 2) && comm != NULL &&
        !(or_ & LARGE_ASYNC) && pd_mpi_has_isendrecv()) {
        // Two ranks (or the path table's ring at any size), each in this call and blocking: our ring,
        // which each rank's own wait moves along; the same result on every rank, as each block is reduced
        // once and sent on.
        // MPICH reduces with our ops (canonical NaN, dtypes.c) by recursive doubling, each rank reducing
        // the whole buffer; the ring reduces half on each (its reduce-scatter and all-gather are what
        // MPICH's own ops get), and a pair reduces alike in either order. A reduce-scatter is the ring's
        // first half (2 ranks: one exchange of the peer's block and one reduction, where MPICH's
        // nonblocking call took 2-7x as long). An async call keeps MPI's, which any MPI call moves along,
        // as a program may expect of a nonblocking collective.
        pd_call_path = w->call.t0 == 0 ? "shm header + ring" : pd_call_path;
        int tag = pd_group_ring_tag(g->small.completed - 1);
        if ((all_reduce ? pd_ring_start_on(w, x->mpi.recv, x->mpi.rcount, x->mpi.type, x->mpi.op, *comm, tag)
                        : pd_ring_reduce_scatter_start_on(w, x->mpi.send, x->mpi.recv, x->mpi.rcount, x->mpi.type,
                                                          x->mpi.op, *comm, tag)) < 0) {
            pd_work_fail(w);
            PyErr_Clear();
            pd_work_finish(w);
            return;
        }
        set_avg(w, x, size);
        if (w->pending == NULL) {
            pd_work_finish(w);
        }
        return;
    }
    // The data offered to the slots goes to MPI after all (a peer's did not fit). Only for a call still in
    // progress on this thread (a blocking one, or an async one not yet returned): a Work recorded already
    // has its path, and this may run in another call's progress.
    pd_call_path = w->call.t0 == 0 ? "shm header + MPI" : pd_call_path;
    PdMpiCall mpi = x->mpi, even;
    // Two ranks: a broadcast, all-gather or all-to-all as one point-to-point exchange (request.c), by
    // every rank alike (its kind matched). Tagged by the round, as a ring: the private communicator's
    // point-to-point never meets another call's.
    int pair = size == 2 && comm != NULL && tuned != LARGE_TUNED_MPI &&   // (the table's MPI: MPI's own call)
               pd_mpi_has_isendrecv();
    rc = pair ? pd_mpi_call_start_pair(&mpi, pd_group_rank(group), *comm, pd_group_ring_tag(g->small.completed - 1),
                                       &w->req, &mpi.name)
              : -1;
    if (rc >= 0) {
        pd_call_path = w->call.t0 == 0 ? "shm header + pair" : pd_call_path;
    } else {
        if (size == 2 && (and_ & LARGE_EVEN) && pd_mpi_call_even(&x->mpi, size, &even)) {
            // Every rank's blocks are even: every rank makes the plain call (pd_mpi_call_even). Only at 2
            // ranks: at 4 on 2 cores MPICH's alltoall (pairwise steps) lost to its alltoallv (every block
            // posted at once), 256 KiB 109 against 88 us.
            mpi = even;
        }
        // Memory MPI reads until the end (request.c) joins the Work's keep, in a tuple made first.
        PyObject *kept = NULL, *scratch = NULL;
        if (comm != NULL && pd_mpi_call_scratch(&mpi)) {
            if ((kept = PyTuple_Pack(2, w->keep != NULL ? w->keep : Py_None, Py_None)) == NULL) {
                pd_work_fail(w);
                PyErr_Clear();
                pd_work_finish(w);
                return;
            }
            Py_XSETREF(w->keep, kept);
        }
        rc = comm == NULL ? MPI_ERR_COMM : pd_mpi_call_start(&mpi, *comm, &w->req, &scratch);
        if (scratch != NULL) {
            Py_DECREF(PyTuple_GET_ITEM(kept, 1));
            PyTuple_SET_ITEM(kept, 1, scratch);
        }
    }
    if (rc != MPI_SUCCESS) {
        pd_raise_mpi(rc, mpi.name);
        pd_work_fail(w);
        PyErr_Clear();
        pd_work_finish(w);
        return;
    }
    w->pending = &pd_request_pending;   // from here on, the plain MPI path's
    set_avg(w, x, size);
}

// Post the queue's calls that can go into a slot without waiting, in order. GIL held.
static void post_ready(GroupChannel *g) {
    while (!g->busy && g->q_posted < g->q_len && g->q_posted < SMALL_SLOTS && shm_small_can_post(&g->small)) {
        shm_small_post(&g->small, &g->queue[g->q_head + g->q_posted].call, NULL);   // no wait: cannot fail
        g->q_posted++;
    }
}

// Run `step` (a post or a completion of the oldest call), with the GIL released unless `ready` says
// it will not wait. 0, or -1 raised (the wait gave up, or the group went meanwhile: g is then freed).
static int small_step(GroupChannel *g, int ready, const Pending *e, int complete, const ShmWait *wait,
                      char *err, size_t errlen, int *rc) {
    SliceCtx *ctx = wait->ctx;
    if (ready) {
        *rc = complete ? shm_small_complete(&g->small, &e->call, wait, err, errlen)
                       : shm_small_post(&g->small, &e->call, wait);
        return 0;
    }
    if (ctx->start == 0.0) {
        ctx->start = MPI_Wtime();   // a call that never waits never reads the clock
    }
    g->busy = 1;
    ctx->released = PyEval_SaveThread();
    *rc = complete ? shm_small_complete(&g->small, &e->call, wait, err, errlen)
                   : shm_small_post(&g->small, &e->call, wait);
    PyEval_RestoreThread(ctx->released);
    g->busy = 0;
    return check_orphaned(g, e->what);
}

// Complete the oldest pending call, posting it first if it waits for a slot (a blocking call, or a
// Work's wait: these may wait for the peers). 0 done (a mismatch of a call with a Work is the Work's
// error); -1 raised: the wait gave up (the call stays pending), the group went, or a call without a
// Work did not match.
static int complete_oldest(GroupChannel *g, double timeout, int timeout_breaks) {
    Pending *e = &g->queue[g->q_head];
    char err[700] = {0};
    SliceCtx ctx = {NULL, pd_op(e->what, g->group, PD_PEER_ALL), 0.0, timeout, 0};   // start: at the first wait
    ShmWait wait = {wait_slice, &ctx, pd_wait_spin};
    long group = g->group;
    int rc;
    if (g->q_posted == 0) {
        if (small_step(g, shm_small_can_post(&g->small), e, 0, &wait, NULL, 0, &rc) < 0) {
            return -1;
        }
        if (rc < 0) {
            gave_up(group, timeout_breaks, e->what);
            return -1;
        }
        g->q_posted = 1;
    }
    if (small_step(g, shm_small_arrived(&g->small, g->small.completed), e, 1, &wait, err, sizeof err, &rc) < 0) {
        return -1;
    }
    if (rc == -1) {
        gave_up(group, timeout_breaks, e->what);
        return -1;
    }
    Pending done = *e;
    *e = (Pending){0};
    g->q_head++;
    g->q_posted--;
    if (--g->q_len == 0) {
        g->q_head = 0;
        unlist(g);
    }
    calls_small += !(done.call.kind & SMALL_HEADER_ONLY);   // a large call's header is not a small call
    post_ready(g);   // a slot came free
    int ret = 0;
    if (rc == -2) {
        PyErr_Format(PyExc_ValueError, "%s: %s", done.what, err);
        if (done.work != NULL) {
            pd_work_fail(done.work);
            PyErr_Clear();   // the Work's wait() raises it
        } else {
            ret = -1;
        }
    }
    if (rc == 0 && done.work != NULL && done.elsewhere != NULL &&
        ((done.call.kind & SMALL_HEADER_ONLY) || !(g->small.flags_and & SMALL_IN_SLOT))) {
        large_data(g, &done);   // g may be freed (its group destroyed meanwhile)
    } else if (done.work != NULL) {
        done.work->pending = NULL;
        done.work->state = NULL;
        pd_work_finish(done.work);
    }
    pending_clear(&done);
    return ret;
}

// Room at the queue's end (moving it to the front or growing it). 0, or -1 with MemoryError.
static int queue_reserve(GroupChannel *g) {
    if (g->q_head + g->q_len < g->q_cap) {
        return 0;
    }
    if (g->q_head > 0) {
        memmove(g->queue, g->queue + g->q_head, sizeof(Pending) * (size_t)g->q_len);
        g->q_head = 0;
        return 0;
    }
    int cap = g->q_cap ? 2 * g->q_cap : 2 * SMALL_SLOTS;
    Pending *q = PyMem_RawRealloc(g->queue, sizeof(Pending) * (size_t)cap);
    if (q == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    g->queue = q;
    g->q_cap = cap;
    return 0;
}

// A broadcast this rank made as its root did not match the peers' calls, as it found out now: the call
// just made stands (queued, or done), and this raises ValueError naming the broadcast. Steals ret.
static PyObject *deferred_error(GroupChannel *g, PyObject *ret) {
    char err[500];
    if (!shm_small_deferred_error(&g->small, err, sizeof err)) {
        return ret;
    }
    Py_DECREF(ret);
    return PyErr_Format(PyExc_ValueError, "broadcast: an earlier broadcast this rank made as its root on this "
                        "group did not match the other ranks' calls (they raised this error at that call; "
                        "the root did not wait for them, and this call itself went ahead): %s", err);
}

// A call through the slots; `elsewhere` is where its data goes when the slots do not carry it (NULL for
// the small ones, which they always do).
static PyObject *small_run(const char *fn, const char *what, long group, int async_op, SmallCall *call, PyObject *a,
                           PyObject *b, PyObject *list, int *fallback, const Elsewhere *elsewhere);

PyObject *pd_shm_small_run(const char *fn, const char *what, long group, int async_op, SmallCall *call,
                           PyObject *a, PyObject *b, PyObject *list, int *fallback) {
    pd_call_path = "small shm";
    return small_run(fn, what, group, async_op, call, a, b, list, fallback, NULL);
}

static PyObject *small_run(const char *fn, const char *what, long group, int async_op, SmallCall *call, PyObject *a,
                           PyObject *b, PyObject *list, int *fallback, const Elsewhere *elsewhere) {
    pd_progress_all();   // as every MPI wait of pydist does: what is in flight moves on
    GroupChannel *g = channel_of(group, fn, fallback);
    if (g == NULL) {
        return NULL;
    }
    if (!g->small_ok) {
        *fallback = 1;
        return NULL;
    }
    PdWorkObject *w = NULL;
    if (async_op) {
        PdOp wop = pd_op(what, group, PD_PEER_ALL);
        PyObject *keep = b != NULL ? PyTuple_Pack(2, a, b) : Py_XNewRef(a);   // NULL for a barrier
        w = keep == NULL && a != NULL ? NULL : pd_work_make(&small_pending, g, &wop, keep, list);
        Py_XDECREF(keep);
        if (w == NULL) {
            return NULL;   // nothing queued
        }
    }
    Elsewhere *x = elsewhere != NULL ? PyMem_RawMalloc(sizeof *x) : NULL;
    if (elsewhere != NULL && x == NULL) {
        Py_XDECREF(w);
        return PyErr_NoMemory();
    }
    if (queue_reserve(g) < 0) {
        PyMem_RawFree(x);
        Py_XDECREF(w);
        return NULL;
    }
    if (x != NULL) {
        *x = *elsewhere;
    }
    // Queued: it is ours to post and complete, in order, whatever happens to this call. Its arrays stay
    // alive with it (a call waiting for a slot reads its input when it is posted, as MPI may).
    Pending *e = &g->queue[g->q_head + g->q_len];
    *e = (Pending){*call, what, Py_XNewRef(a), Py_XNewRef(b), w != NULL ? (PdWorkObject *)Py_NewRef(w) : NULL, x};
    if (g->q_len++ == 0) {
        with_pending[n_with_pending++] = g;
    }
    post_ready(g);
    if (async_op) {
        shm_progress();   // done already if every peer is there
        return deferred_error(g, (PyObject *)w);
    }
    double timeout = pd_group_timeout(group);
    while (g->q_len > 0) {   // earlier async calls first, then this one (the newest)
        if (complete_oldest(g, timeout, 1) < 0) {
            return NULL;
        }
    }
    return deferred_error(g, Py_NewRef(Py_None));
}

// A call whose data may take MPI's path (or the shm all-reduce) once the headers have matched: its
// header alone in the slots, or (an all-to-all) its data too when every rank's may be there. Always as
// a Work, whose data starts in the progress engine if need be; a blocking call waits for that Work (on
// Ctrl-C the Work completes it later, as it would a dropped one).
static PyObject *header_run(const char *fn, long group, int async_op, SmallCall *call, const PdMpiCall *mpi,
                            PyObject *keep, PyObject *list, const PdBuf *avg, int *fallback) {
    Elsewhere x = {*mpi, avg ? avg->data : NULL, avg ? avg->dtype : NULL, avg ? avg->count : 0};
    PyObject *work = small_run(fn, fn, group, 1, call, keep, NULL, list, fallback, &x);
    if (work == NULL || async_op) {
        return work;
    }
    int rc = pd_work_wait((PdWorkObject *)work);
    Py_DECREF(work);
    if (rc < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

int pd_shm_all_reduce(PyObject *tensor, PdBuf *buf, long op, MPI_Op mop, long group, int async_op, int forced,
                      int tuned, PyObject **ret) {
    int fallback;
    *ret = NULL;
    GroupChannel *g = channel_of(group, "all_reduce", &fallback);
    if (g == NULL) {
        return fallback ? 0 : 1;
    }
    if (!g->small_ok) {   // a group too large for the slots: the shm all-reduce alone (blocking)
        pd_call_path = "shm";
        int rc = run(g, group, "all_reduce (shm)", buf->data, (int64_t)buf->count, dtype_code(buf), op,
                     forced || buf->nbytes >= PD_SHM_AUTO_COPY_BYTES, 0);
        if (rc == 2) {
            calls_declined++;
            return 0;
        }
        if (rc == 0 && async_op) {
            PyObject *list = PyList_New(1);
            if (list != NULL) {
                PyList_SET_ITEM(list, 0, Py_NewRef(tensor));
                PdOp wop = pd_op("all_reduce (shm)", group, PD_PEER_ALL);
                *ret = (PyObject *)pd_work_new(MPI_REQUEST_NULL, &wop, NULL, list, 0);
                Py_DECREF(list);
            }
        } else if (rc == 0) {
            *ret = Py_NewRef(Py_None);
        }
        return 1;
    }
    // The header goes through the small collectives' slots, in order with them: a rank on the other
    // side of a threshold sees the mismatch, and the data's path is chosen from every rank's flags.
    uint32_t flags = (async_op ? LARGE_ASYNC : 0) | (in_this_segment(buf->data, (size_t)buf->nbytes) ? LARGE_IN_SEGMENT : 0) |
                     (copy_pays(forced, buf->nbytes) ? LARGE_COPY_OK : 0) |
                     (tuned ? tuned_flag(SMALL_ALLREDUCE, pd_group_size(group), (size_t)buf->nbytes) : 0);
    SmallCall call = {SMALL_ALLREDUCE | SMALL_HEADER_ONLY, dtype_code(buf), (int)op, -1, (int64_t)buf->count,
                      (size_t)PyArray_ITEMSIZE(buf->arr), NULL, NULL, flags, NULL, NULL};
    PdMpiCall mpi = {PD_MPI_ALLREDUCE, "MPI_Iallreduce_c", MPI_IN_PLACE, 0, NULL, NULL, buf->data, buf->count,
                     NULL, NULL, buf->dtype->mpi, mop, -1};
    PyObject *list = PyList_New(1);
    if (list == NULL) {
        return 1;
    }
    PyList_SET_ITEM(list, 0, Py_NewRef(tensor));
    // large_data makes it "shm" when the data takes shared memory
    uint32_t tuned_ring = flags & LARGE_TUNED ? flags & LARGE_TUNED_RING : pd_group_size(group) == 2;
    pd_call_path = tuned_ring && !async_op && pd_mpi_has_isendrecv() ? "shm header + ring" : "shm header + MPI";
    *ret = header_run("all_reduce", group, async_op, &call, &mpi, (PyObject *)buf->arr, list,
                      op == PD_OP_AVG ? buf : NULL, &fallback);
    Py_DECREF(list);
    return 1;   // the channel exists: no fallback
}

PyObject *pd_shm_header_run(const char *fn, long group, int async_op, const SmallCall *header, const PdMpiCall *mpi,
                            PyObject *keep, PyObject *list, const PdBuf *avg, int *fallback) {
    SmallCall call = *header;
    PdMpiCall even;
    int size = pd_group_size(group);
    // MPI's path for the data, whatever it is; but a reduce-scatter where every rank blocks may take the ring
    int rs = (call.kind & ~SMALL_HEADER_ONLY) == SMALL_REDUCE_SCATTER;
    call.flags = async_op || !rs ? LARGE_ASYNC : 0;
    call.flags |= pd_mpi_call_even(mpi, size, &even) ? LARGE_EVEN : 0;
    if (call.count != SMALL_UNEVEN) {
        call.flags |= tuned_flag(call.kind, size, shm_small_contribution(&call, size));
    }
    if ((call.src == NULL && call.dst == NULL) ||
        !pd_shm_small_takes(group, &call)) {
        call.kind |= SMALL_HEADER_ONLY;
        call.src = NULL;
        call.dst = NULL;
    }
    // large_data may say otherwise, for a call still on this thread when its headers match
    uint32_t tuned = call.flags & LARGE_TUNED;
    int ring = rs && !async_op && mpi->kind == PD_MPI_REDUCE_SCATTER_BLOCK &&
               (tuned ? tuned == LARGE_TUNED_RING : size == 2) && pd_mpi_has_isendrecv();
    pd_call_path = !(call.kind & SMALL_HEADER_ONLY) ? "small shm"
                   : size == 2 && pd_mpi_call_pairs(mpi) && tuned != LARGE_TUNED_MPI && pd_mpi_has_isendrecv()
                   ? "shm header + pair"
                   : ring ? "shm header + ring" : "shm header + MPI";
    return header_run(fn, group, async_op, &call, mpi, keep, list, avg, fallback);
}

// The path's progress: every pending small collective whose peers have all posted completes (no wait).
static void shm_progress(void) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    for (int i = n_with_pending - 1; i >= 0; i--) {
        if (i >= n_with_pending) {
            continue;   // the list shrank
        }
        GroupChannel *g = with_pending[i];
        post_ready(g);
        while (!g->busy && g->q_posted > 0 && shm_small_arrived(&g->small, g->small.completed)) {
            if (complete_oldest(g, -1.0, 0) < 0) {
                PyErr_Clear();   // a blocking call's mismatch, given up long ago: nobody to tell
                break;
            }
        }
    }
    PyErr_Restore(type, value, tb);
}

// ---------------------------------------------------------------------------------------------------
// The pending operation of an async call through the slots, and the path

// Whether the Work is still in the slots and another thread is inside its channel. (A channel freed
// meanwhile has abandoned its Works first: w->pending is then no longer small_pending.)
static int work_channel_busy(const void *p) {
    const PdWorkObject *w = p;
    return w->pending == &small_pending && ((const GroupChannel *)w->state)->busy;
}

// Complete the group's calls in order up to this one (they may wait: a Work's wait is blocking); a
// large all-reduce then goes on as MPI's request (large_data), under the same deadline.
static int small_wait(PdWorkObject *w, double timeout, int timeout_breaks) {
    GroupChannel *g = w->state;
    double start = MPI_Wtime();
    while (w->pending == &small_pending) {
        double left = timeout < 0 ? -1.0 : timeout - (MPI_Wtime() - start);
        if (g->busy) {   // another thread waits in the channel (a call, or another Work): after it
            if (pd_yield_while(work_channel_busy, w, timeout < 0 || left > 0 ? left : 0.0, w->op.what,
                               "another thread of this rank was waiting in the group's shared-memory channel") < 0) {
                return -1;
            }
            g = w->state;   // (NULL, and w->pending moved on, if the group went meanwhile)
            continue;
        }
        if (complete_oldest(g, timeout < 0 || left > 0 ? left : 0.0, timeout_breaks) < 0) {
            return -1;
        }
    }
    if (w->pending != NULL) {
        double left = timeout < 0 ? -1.0 : timeout - (MPI_Wtime() - start);
        return w->pending->wait(w, timeout < 0 || left > 0 ? left : 0.0, timeout_breaks);
    }
    return 0;
}

static int small_test(PdWorkObject *w) {
    shm_progress();
    if (w->pending == &small_pending) {
        return 0;
    }
    return w->pending == NULL || w->pending->test(w);
}

// Never reached while queued (the queue holds a reference to the Work).
static void small_pending_abandon(PdWorkObject *w) {
    w->state = NULL;
}

static const PdPending small_pending = {small_test, small_wait, small_pending_abandon};

// The path's group_release: the channel goes with its group (its calls still queued fail).
static void shm_group_release(long group, unsigned generation) {
    (void)generation;
    void **slot = pd_group_shm(group);
    channel_release(*slot);
    *slot = NULL;
}

const PdPath pd_shm_path = {"shm", shm_progress, shm_group_setup, shm_group_release};

// _C.set_shm_small_bytes(n) -> the old bound: tests reach MPI's paths with 0 (every rank alike).
PyObject *pd_set_shm_small_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long n;
    if (pd_check_nargs(nargs, 1, "set_shm_small_bytes") < 0 || pd_arg_long(args[0], "set_shm_small_bytes", "n", &n) < 0) {
        return NULL;
    }
    if (n < 0 || (size_t)n > SMALL_SLOT_BYTES) {
        PyErr_Format(PyExc_ValueError, "set_shm_small_bytes(): `n` must be 0 to %zu; got %ld", SMALL_SLOT_BYTES, n);
        return NULL;
    }
    Py_ssize_t old = pd_shm_small_bytes;
    pd_shm_small_bytes = (Py_ssize_t)n;
    return PyLong_FromSsize_t(old);
}

int pd_shm_dtype(const PdBuf *buf) {
    return dtype_code(buf);
}

// ---------------------------------------------------------------------------------------------------
// dist.empty / dist.zeros: arrays in this rank's heap region. The array's base is a ShmBlock, which
// returns the block to the heap and drops its reference to the mapping when the array goes.

typedef struct {
    PyObject_HEAD
    Session *session;
    size_t offset, len;
} ShmBlockObject;

static PyTypeObject *ShmBlockType = NULL;

static void block_dealloc(ShmBlockObject *b) {
    if (b->session != NULL) {
        shm_heap_release(&b->session->heap, b->offset, b->len);
        session_decref(b->session);
    }
    PyTypeObject *tp = Py_TYPE(b);
    tp->tp_free(b);
    Py_DECREF(tp);
}

static PyType_Slot block_slots[] = {
    {Py_tp_dealloc, block_dealloc},
    {Py_tp_doc, "A block of pydist's shared-memory segment, owned by the array that lives in it."},
    {0, NULL},
};

static PyType_Spec block_spec = {"pydist._C.ShmBlock", sizeof(ShmBlockObject), 0, Py_TPFLAGS_DEFAULT, block_slots};

int pd_shm_type_init(PyObject *module) {
    ShmBlockType = (PyTypeObject *)PyType_FromModuleAndSpec(module, &block_spec, NULL);
    return ShmBlockType == NULL ? -1 : 0;
}

// A block of nbytes in this rank's region, its pages committed; NULL with MemoryError.
static ShmBlockObject *block_new(const char *fn, size_t nbytes) {
    size_t offset;
    if (shm_heap_alloc(&session->heap, nbytes, &offset) < 0) {
        PyErr_Format(PyExc_MemoryError, "%s(): %zu bytes do not fit in this rank's shared segment (%zu of %zu "
                     "bytes in use; PYDIST_SHM_BYTES sets its size)", fn, nbytes, session->heap.used,
                     session->view.region_bytes);
        return NULL;
    }
    size_t len = shm_heap_rounded(nbytes), lo = offset / PAGE * PAGE, hi = (offset + len + PAGE - 1) / PAGE * PAGE;
    int e = posix_fallocate(session->fd, (off_t)lo, (off_t)(hi - lo));   // commit now: no SIGBUS later
    if (e != 0) {
        shm_heap_release(&session->heap, offset, nbytes);
        PyErr_Format(PyExc_MemoryError, "%s(): /dev/shm has no room for %zu bytes (%s)", fn, nbytes, strerror(e));
        return NULL;
    }
    ShmBlockObject *block = PyObject_New(ShmBlockObject, ShmBlockType);
    if (block == NULL) {
        shm_heap_release(&session->heap, offset, nbytes);
        return NULL;
    }
    block->session = session;
    block->offset = offset;
    block->len = nbytes;
    session->refs++;
    return block;
}

float *pd_shm_alloc_floats(long n, void **owner) {
    *owner = NULL;
    if (session == NULL || n < 0) {
        return NULL;
    }
    ShmBlockObject *block = block_new("Engine", sizeof(float) * (size_t)n);
    if (block == NULL) {
        PyErr_Clear();   // the caller keeps its own buffer
        return NULL;
    }
    *owner = block;
    char *data = block->session->base + block->offset;
    memset(data, 0, sizeof(float) * (size_t)n);
    return (float *)data;
}

void pd_shm_owner_release(void *owner) {
    Py_XDECREF((PyObject *)owner);
}

// _C.shm_empty(shape, dtype, zero) -> ndarray in the segment (an ordinary one when there is no segment).
PyObject *pd_shm_empty(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *fn = nargs == 3 && PyObject_IsTrue(args[2]) == 1 ? "zeros" : "empty";
    PyArray_Dims shape = {NULL, 0};
    PyArray_Descr *descr = NULL;
    PyObject *arr = NULL;
    int zero;
    if (pd_check_nargs(nargs, 3, fn) < 0 || pd_arg_bool(args[2], fn, "zero", &zero) < 0) {
        return NULL;
    }
    if (!PyArray_IntpConverter(args[0], &shape) || !PyArray_DescrConverter(args[1], &descr)) {
        goto done;
    }
    char kinds[] = "biufc";
    int esize = (int)PyDataType_ELSIZE(descr);
    if (strchr(kinds, descr->kind) == NULL || PyDataType_HASFIELDS(descr) || PyDataType_HASSUBARRAY(descr) ||
        (descr->kind == 'f' && esize > 8) || (descr->kind == 'c' && esize > 16) || !PyArray_ISNBO(descr->byteorder)) {
        PyErr_Format(PyExc_TypeError, "%s(): `dtype` must be one pydist moves (bool, int8..int64, uint8..uint64, "
                     "float16, float32, float64, complex64, complex128) in native byte order; got %R", fn,
                     (PyObject *)descr);
        goto done;
    }
    size_t nbytes = (size_t)esize;
    for (int i = 0; i < shape.len; i++) {
        if (shape.ptr[i] < 0) {
            PyErr_Format(PyExc_ValueError, "%s(): `shape` must hold non-negative sizes; got %zd at index %d", fn,
                         (Py_ssize_t)shape.ptr[i], i);
            goto done;
        }
        if (shape.ptr[i] > 0 && nbytes > (size_t)PY_SSIZE_T_MAX / (size_t)shape.ptr[i]) {
            PyErr_Format(PyExc_ValueError, "%s(): `shape` is too large to allocate", fn);
            goto done;
        }
        nbytes *= (size_t)shape.ptr[i];
    }
    if (session == NULL) {   // no segment: an ordinary array (every algorithm takes it)
        arr = zero ? PyArray_Zeros(shape.len, shape.ptr, descr, 0) : PyArray_Empty(shape.len, shape.ptr, descr, 0);
        descr = NULL;   // stolen
        goto done;
    }
    ShmBlockObject *block = block_new(fn, nbytes);
    if (block == NULL) {
        goto done;
    }
    char *data = session->base + block->offset;
    arr = PyArray_NewFromDescr(&PyArray_Type, descr, shape.len, shape.ptr, NULL, data, NPY_ARRAY_CARRAY, NULL);
    descr = NULL;   // stolen
    if (arr == NULL) {
        Py_DECREF(block);
        goto done;
    }
    if (PyArray_SetBaseObject((PyArrayObject *)arr, (PyObject *)block) < 0) {   // steals block, even failing
        Py_CLEAR(arr);
        goto done;
    }
    if (zero) {
        memset(data, 0, nbytes);
    }
done:
    Py_XDECREF(descr);
    if (shape.ptr != NULL) {
        PyDimMem_FREE(shape.ptr);
    }
    return arr;
}

// _C.shm_info() -> dict: whether the segment exists, why not, and its sizes.
PyObject *pd_shm_info(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    Session *s = session;
    return Py_BuildValue("{s:O,s:s,s:n,s:n,s:i,s:i,s:n,s:n,s:L,s:L,s:L,s:n,s:L,s:n}", "segment", s ? Py_True : Py_False,
                         "unavailable", unavailable, "region_bytes", (Py_ssize_t)(s ? s->view.region_bytes : 0),
                         "heap_used", (Py_ssize_t)(s ? s->heap.used : 0), "node_rank", s ? s->view.node_rank : -1,
                         "node_size", s ? s->view.node_size : 0, "auto_min_bytes", (Py_ssize_t)PD_SHM_AUTO_BYTES,
                         "stage_bytes", (Py_ssize_t)pd_env_bytes("PYDIST_SHM_STAGE", DEFAULT_STAGE_BYTES),
                         "calls_copied", calls_copied, "calls_in_place", calls_in_place,
                         "calls_declined", calls_declined, "small_bytes", pd_shm_small_bytes,
                         "calls_small", calls_small, "pair_broadcast_bytes", (Py_ssize_t)PAIR_BCAST_BYTES);
}
