/*
 * stall.c: the stall inspector. A blocking call that has waited longer than PYDIST_STALL_WARN seconds
 * (default 60; 0 turns it off) prints, once, on the waiting rank, which ranks it still waits for and
 * what they are doing now; then it keeps waiting until its timeout, as Horovod's stall inspector does.
 *
 * How a rank knows what the others do: every rank keeps its current call on a board in its host's
 * shared-memory session segment (one page per rank, the first of its region; shared_memory.c attaches
 * it at init). pd_call_begin writes the call's name, its group's id and its number among the group's
 * collectives since the group was made (PdCall.board_seq: a timeline's start renumbers the trace's
 * numbers, never these, or a late rank still showing a call from before it would seem to have
 * arrived); pd_call_end writes when it returned; the engine writes its phase (pd_activity). A rank
 * has arrived at our collective when its board shows the same group at our number or later (a short
 * history per group covers a rank that has gone on to a call on another group). Ranks on other hosts
 * are not on this host's board: the warning says so rather than guess. Writing the board costs a few
 * stores per call; reading it happens only in a stalled wait.
 */
#include "observe/stall.h"

#include "core/errors.h"
#include "core/settings.h"
#include "groups/group.h"
#include "groups/liveness.h"
#include "observe/timeline.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RECENT 8

// The board's clock: the coarse one (a few ms of resolution, enough for "for 61.2 s") reads in a few
// ns where CLOCK_MONOTONIC costs 25-50 ns on this VM, and the board is written twice per call.
static inline int64_t board_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

typedef struct {
    atomic_ulong version;          // odd while its rank writes it (a seqlock: readers retry)
    int64_t since_ns;              // CLOCK_MONOTONIC (one clock per host) when the call or phase began
    int64_t ended_ns;              // when the call returned; 0: in it now
    uint64_t gid;                  // the call's group (calls.c's id), 0: none (an engine phase)
    uint64_t seq;                  // its number among the group's collectives; 0: point-to-point
    int32_t peer;                  // a point-to-point call's peer, else -1
    int32_t engine;                // an engine phase (pd_activity), not a pydist call
    int64_t step;                  // the engine's step, or -1
    struct { uint64_t gid, seq; } recent[RECENT];   // the latest collective per recently used group
    int32_t recent_next;
    char what[64];
} BoardSlot;

static char *board = NULL;         // the session segment; rank k of the node at board + k * stride
static size_t stride = 0;
static int node_size = 0, my_node_rank = -1;
static int *node_world = NULL;     // [node_size]: each node rank's world rank
static double stall_warn = 60.0;
static double warned_since = -1.0;  // the wait already warned about (its start)
static PD_THREAD_LOCAL uint64_t cur_gid, cur_seq;
static PD_THREAD_LOCAL const char *cur_name;

void pd_stall_read_env(void) {
    // init refused a malformed value (session.c); one set since is taken as unset
    const char *v = getenv("PYDIST_STALL_WARN");
    double seconds;
    stall_warn = v != NULL && pd_parse_seconds(v, &seconds) == 0 ? seconds : 60.0;
}

void pd_stall_board_attach(void *slots, size_t slot_stride, int size, int node_rank, const int *world_ranks) {
    pd_stall_board_detach();
    if (stall_warn <= 0) {
        return;   // PYDIST_STALL_WARN=0: nobody reads the board, so nobody writes it
    }
    node_world = malloc(sizeof(int) * (size_t)size);
    if (node_world == NULL) {
        return;
    }
    memcpy(node_world, world_ranks, sizeof(int) * (size_t)size);
    board = slots;
    stride = slot_stride;
    node_size = size;
    my_node_rank = node_rank;
    BoardSlot *me = (BoardSlot *)(board + (size_t)node_rank * stride);
    memset(me, 0, sizeof *me);
    me->step = -1;
    me->peer = -1;
    me->ended_ns = board_clock();
    snprintf(me->what, sizeof me->what, "init_process_group");
}

void pd_stall_board_detach(void) {
    board = NULL;
    free(node_world);
    node_world = NULL;
    node_size = 0;
    my_node_rank = -1;
}

static BoardSlot *slot_of_world(int w) {
    for (int k = 0; k < node_size; k++) {
        if (node_world[k] == w) {
            return (BoardSlot *)(board + (size_t)k * stride);
        }
    }
    return NULL;
}

static BoardSlot *my_slot(void) {
    return board != NULL ? (BoardSlot *)(board + (size_t)my_node_rank * stride) : NULL;
}

// The seqlock's writer: plain stores and fences (no locked instruction: this runs twice per call). A
// second thread of the same rank writing at once can only mix two of its calls in what a reader sees.
static void write_begin(BoardSlot *s) {
    atomic_store_explicit(&s->version, atomic_load_explicit(&s->version, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    atomic_thread_fence(memory_order_release);   // the odd version is seen before the fields change
}

static void write_end(BoardSlot *s) {
    atomic_store_explicit(&s->version, atomic_load_explicit(&s->version, memory_order_relaxed) + 1,
                          memory_order_release);
}

// What this rank is in now, on its slot (under the seqlock).
static void note(BoardSlot *s, const char *what, uint64_t gid, uint64_t seq, int peer, int engine, long long step) {
    write_begin(s);
    s->since_ns = board_clock();
    s->ended_ns = 0;
    s->gid = gid;
    s->seq = seq;
    s->peer = peer;
    s->engine = engine;
    s->step = step;
    // up to the NUL, not strncpy, which pads all 64 bytes at every call; readers stop at the NUL
    size_t n = strnlen(what, sizeof s->what - 1);
    memcpy(s->what, what, n);
    s->what[n] = 0;
    if (seq > 0) {   // the group's latest collective, kept while the rank goes on to other groups
        int k = 0;
        while (k < RECENT && s->recent[k].gid != gid) k++;
        if (k == RECENT) {
            k = s->recent_next;
            s->recent_next = (s->recent_next + 1) % RECENT;
        }
        s->recent[k].gid = gid;
        s->recent[k].seq = seq;
    }
    write_end(s);
}

void pd_stall_note_call(const char *name, uint64_t gid, unsigned long board_seq, int peer) {
    cur_gid = gid;
    cur_seq = board_seq;   // not the call's seq: a timeline's start renumbers that, and the other ranks'
    cur_name = name;       // boards may still show their calls from before it
    BoardSlot *s = my_slot();
    if (s != NULL) {
        note(s, name, gid, board_seq, peer, 0, -1);
    }
}

void pd_stall_note_return(void) {
    cur_name = NULL;
    BoardSlot *s = my_slot();
    if (s != NULL) {
        // one aligned 8-byte field: a reader sees it before or after, never torn; no seqlock needed
        __atomic_store_n(&s->ended_ns, board_clock(), __ATOMIC_RELEASE);
    }
}

void pd_activity(const char *what, long long step) {
    BoardSlot *s = my_slot();
    if (s != NULL) {
        note(s, what, 0, 0, -1, 1, step);
    }
}

// ---------------------------------------------------------------------------------------------------
// The warning

// A consistent copy of another rank's slot (its writer may be mid-update: retry a few times, then
// take what is there, which at worst mixes two of its calls).
static void read_slot(const BoardSlot *s, BoardSlot *out) {
    for (int tries = 0; tries < 100; tries++) {
        unsigned long v0 = atomic_load_explicit(&((BoardSlot *)s)->version, memory_order_acquire);
        memcpy((void *)out, (const void *)s, sizeof *out);
        atomic_thread_fence(memory_order_acquire);
        unsigned long v1 = atomic_load_explicit(&((BoardSlot *)s)->version, memory_order_relaxed);
        if (v0 == v1 && (v0 & 1) == 0) {
            break;
        }
    }
    out->what[sizeof out->what - 1] = 0;
}

static int arrived(const BoardSlot *s, uint64_t gid, uint64_t seq) {
    if (s->gid == gid && s->seq >= seq) {
        return 1;
    }
    for (int k = 0; k < RECENT; k++) {
        if (s->recent[k].gid == gid && s->recent[k].seq >= seq) {
            return 1;
        }
    }
    return 0;
}

// What rank `w` is doing, as its board says, into buf.
static void describe(char *buf, size_t len, const BoardSlot *s, uint64_t gid, int64_t now) {
    double since = (double)(now - s->since_ns) * 1e-9;
    if (s->what[0] == 0) {
        snprintf(buf, len, "not known (its stall inspector is off: PYDIST_STALL_WARN=0 there)");
    } else if (s->engine) {
        snprintf(buf, len, "in the training engine: %s (step %lld) for %.1f s", s->what, (long long)s->step, since);
    } else if (s->ended_ns == 0) {
        char which[64] = "";
        if (s->seq > 0) {
            snprintf(which, sizeof which, " (collective #%llu of %s group)", (unsigned long long)s->seq,
                     s->gid == gid ? "this" : "another");
        } else if (s->peer >= 0) {
            snprintf(which, sizeof which, " (with rank %d)", s->peer);
        }
        snprintf(buf, len, "in %s%s for %.1f s", s->what, which, since);
    } else {
        snprintf(buf, len, "not in a pydist call; its last call, %s, returned %.1f s ago", s->what,
                 (double)(now - s->ended_ns) * 1e-9);
    }
}

void pd_stall_check(const PdOp *op, double wait_started) {
    if (stall_warn <= 0) {
        return;
    }
    double waited = MPI_Wtime() - wait_started;
    if (waited < stall_warn || wait_started == warned_since) {
        return;
    }
    warned_since = wait_started;
    int me = pd_group_to_global(0, pd_group_rank(0));
    int size = pd_group_size(op->group);
    int64_t now = board_clock();
    char line[512], text[4096];
    size_t cap = sizeof text, used = 0;
    used += (size_t)snprintf(text, cap, "[rank %d] pydist: stall: %s has waited %.1f s (PYDIST_STALL_WARN=%g)", me,
                             op->what, waited, stall_warn);
    if (cur_name != NULL && cur_seq > 0) {
        used += (size_t)snprintf(text + used, cap - used, ", collective #%llu of its group",
                                 (unsigned long long)cur_seq);
    }
    used += (size_t)snprintf(text + used, cap - used, "; still waiting for:");
    int missing = 0;
    for (int r = 0; r < size && used < cap - 600; r++) {
        int w = pd_group_to_global(op->group, r);
        if (w == me || (op->peer != PD_PEER_ALL && op->peer != MPI_ANY_SOURCE && op->peer != r)) {
            continue;
        }
        const BoardSlot *s = slot_of_world(w);
        if (pd_liveness_left(w) != 0.0) {
            snprintf(line, sizeof line, "\n  rank %d: has exited (%s)", w, pd_liveness_cause(w));
        } else if (board == NULL) {
            snprintf(line, sizeof line, "\n  rank %d: not known (this host has no shared-memory board: "
                     "PYDIST_SHM_BYTES=0, or its segment could not be made)", w);
        } else if (s == NULL) {
            snprintf(line, sizeof line, "\n  rank %d: on another host, whose board this rank cannot read "
                     "(whether it has arrived is not known here)", w);
        } else {
            BoardSlot copy;
            read_slot(s, &copy);
            if (op->peer == PD_PEER_ALL && cur_name != NULL && cur_seq > 0 && arrived(&copy, cur_gid, cur_seq)) {
                continue;   // it has arrived
            }
            char doing[300];
            describe(doing, sizeof doing, &copy, cur_gid, now);
            snprintf(line, sizeof line, "\n  rank %d: %s", w, doing);
        }
        used += (size_t)snprintf(text + used, cap - used, "%s", line);
        missing++;
    }
    if (missing == 0) {
        used += (size_t)snprintf(text + used, cap - used, " every rank has arrived (MPI has not completed yet)");
    }
    snprintf(text + used, cap - used, "\n  (it keeps waiting until its timeout)\n");
    fputs(text, stderr);
    fflush(stderr);
}
