/*
 * shm_small.h: pydist's small collectives in shared memory (all_reduce, broadcast, reduce, all-gather,
 * reduce-scatter, all-to-all and barrier up to PD_SHM_SMALL_BYTES per rank on a group within one node).
 * Plain C: no Python and no MPI, so that it can be reasoned about (and tested) alone.
 *
 * Why: MPICH builds a schedule for every nonblocking collective and its blocking ones cannot be
 * interrupted, so a small collective the pydist way (timeouts, Ctrl-C, departed ranks) cost 2-5 us
 * more than a raw C blocking call. Here a call is one write and one read of shared memory per rank.
 *
 * The protocol. Each rank owns SMALL_SLOTS slots (a header line and SMALL_SLOT_BYTES of data) and a
 * `done` counter on a cache line of its own. Every rank calls the same collectives in the same order,
 * round 0, 1, 2, ... A round has two halves, which an async_op=True call runs apart:
 *   post      wait until every peer is done with round r - SLOTS (its slot r % SLOTS is free again),
 *             copy this rank's contribution into slot r % SLOTS, fill the header, publish the stamp
 *             r + 1 (release)
 *   complete  wait until every peer's slot r % SLOTS carries stamp r + 1 (acquire), check that all
 *             headers describe the same call, read what this rank needs out of the slots, then
 *             publish done = r + 1 (release).
 * A post never waits for a peer to arrive, only (rarely) for one to catch up, so async calls and
 * point-to-point traffic interleave as they do with MPI's nonblocking collectives. Reductions run over
 * the slots in rank order, so every rank gets bitwise the same result. A mismatch (count, dtype, op,
 * root or kind differ) is seen by every rank from the same headers. Both waits can give up (timeout,
 * signal, departed rank) and be resumed later: nothing is written until their condition holds.
 *
 * A broadcast's root reads nothing, so it completes its round without waiting for its peers (as
 * MPI_Bcast's root may return before anyone has received). It cannot see a mismatch then. So every
 * rank also publishes, per slot, the header of the call it completed there (`seen`, beside `done`);
 * the root compares its header with its peers' before it reuses the slot (its post of round r + SLOTS,
 * when the peers are done with round r and cannot complete another round in that slot yet), or
 * earlier when they are all done, and reports a mismatch at that call (shm_small_deferred_error). The
 * peers saw the mismatch in round r themselves and raised it there.
 */
#ifndef PYDIST_ALGORITHMS_SHM_SMALL_H
#define PYDIST_ALGORITHMS_SHM_SMALL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "shm.h"

#define SMALL_SLOTS 4
#define SMALL_SLOT_BYTES ((size_t)64 * 1024)
#define SMALL_MAX_RANKS 256   // larger groups use MPI's collectives

enum { SMALL_BARRIER, SMALL_BCAST, SMALL_ALLREDUCE, SMALL_REDUCE, SMALL_ALLGATHER, SMALL_REDUCE_SCATTER,
       SMALL_ALLTOALL, SMALL_GATHER, SMALL_SCATTER, SMALL_ALLGATHER_LIST, SMALL_KINDS };
// Added to a kind: a call the slots do not carry (past the small bound, or a list form), whose header
// alone goes through them (its data takes another path once every rank's header has matched). A rank
// on either side of a threshold, or in another collective, then sees the mismatch from the headers,
// as every other rank does, instead of waiting forever.
#define SMALL_HEADER_ONLY 0x10
// The count of an all-to-all with uneven blocks (split sizes): matches any count (MPI's alltoallv
// checks each pair's blocks).
#define SMALL_UNEVEN (-1)
// In a header's flags, set by shm_small_post when the slot holds the call's data. Kinds are compared
// without SMALL_HEADER_ONLY; the data moves through the slots only when every rank's is there, else
// every rank takes the data's other path (the flags' AND says which: an all-to-all of equal blocks
// beside one of uneven blocks, or beside the list form, is MPI's alltoallv everywhere).
#define SMALL_IN_SLOT 0x80000000u

// A slot's header, on a cache line of its own: the stamp and what the call is.
typedef struct {
    _Alignas(64) _Atomic uint64_t stamp;   // round + 1 once the slot holds that round's contribution
    int64_t count;                         // elements (of the buffer, or of one rank's block)
    int32_t kind, dtype, op, root;
    uint32_t flags;                        // what the caller tells its peers (not compared)
} SmallHeader;

// One rank's view of the group's small-collective area.
typedef struct {
    int rank, size;
    char *base;              // [size] ranks, each: done line, then SMALL_SLOTS x (header, data)
    uint64_t posted;         // rounds this rank has posted
    uint64_t completed;      // rounds this rank has completed (always <= posted, > posted - SLOTS)
    uint32_t flags_and, flags_or;   // of every rank's flags, in the round completed last
    uint64_t unchecked[SMALL_SLOTS];   // round + 1 of a broadcast this rank completed as its root, unchecked
    char deferred[400];             // a mismatch found in such a broadcast, not reported yet ("": none)
    uint64_t peers_done;   // the least `done` of the peers when last read: a lower bound (done only grows)
} ShmSmall;

// One call, as this rank makes it.
typedef struct {
    int kind, dtype, op, root;   // dtype: SHM_* (any value for data that is only moved); root: group rank
    int64_t count;               // elements: the whole buffer (bcast, all_reduce, reduce) or a block
    size_t itemsize;
    const void *src;             // this rank's contribution: count (or size * count for reduce-scatter,
                                 // all-to-all and scatter's root) elements; NULL for a barrier and the
                                 // ranks of a broadcast or scatter that are not its root
    void *dst;                   // where the result goes; NULL where there is none
    uint32_t flags;              // published with the header; every rank reads their AND and OR
    // The list forms (scatter's and all-to-all's input, gather's, all-gather's and all-to-all's output):
    // block p is at src + src_at[p] / dst + dst_at[p] bytes. NULL: at p * the block's bytes.
    const ptrdiff_t *src_at, *dst_at;
} SmallCall;

// Bytes of shared memory the area needs for `size` ranks.
size_t shm_small_bytes(int size);
// Lay the area over zeroed shared memory of shm_small_bytes(size).
void shm_small_init(ShmSmall *s, char *base, int rank, int size);
// This rank's contribution in bytes (what must fit a slot).
size_t shm_small_contribution(const SmallCall *c, int size);
// Post the next round (requires posted - completed < SMALL_SLOTS). 0, or -1: the wait gave up (its
// error stands) and nothing was posted.
int shm_small_post(ShmSmall *s, const SmallCall *c, const ShmWait *w);
// Whether a post would go through without waiting.
int shm_small_can_post(ShmSmall *s);
// Whether every rank has posted round `round` (no wait).
int shm_small_arrived(const ShmSmall *s, uint64_t round);
// Complete the oldest posted round (s->completed), which `c` posted. 0 done (the data moved, unless
// s->flags_and lacks SMALL_IN_SLOT: then the caller moves it another way); -1 the wait gave up (its
// error stands; nothing done, may be resumed); -2 the ranks' calls do not match (err holds the same
// message on every rank; the round counts as completed, nothing was written to c->dst).
int shm_small_complete(ShmSmall *s, const SmallCall *c, const ShmWait *w, char *err, size_t errlen);
// A mismatch found (without waiting) in a broadcast this rank completed unchecked as its root: 1 with
// its message in err (reported once), or 0.
int shm_small_deferred_error(ShmSmall *s, char *err, size_t errlen);

#endif  // PYDIST_ALGORITHMS_SHM_SMALL_H
