/*
 * shm.h: pydist's intra-node all-reduce in shared memory (all_reduce(algorithm="shm")), and the
 * first-fit heap of the session segment that dist.empty/zeros allocate from. Plain C and MPI: no
 * Python here, so the training engine's strategies can use it too; every wait goes through the
 * caller's ShmWait, whose slice() runs the caller's checks (signals, departed ranks, deadline).
 *
 * Two kinds of segment, both POSIX shared memory mapped by every rank of one node:
 *   session  made at init_process_group over the node's ranks: one heap region per rank, from which
 *            dist.empty allocates (memory is committed block by block, with fallocate, as it is used);
 *   channel  made at a group's first shm all-reduce over the group's ranks: per rank a control block
 *            (its barrier counter on a cache line of its own, then the published header of the
 *            current call) and three staging buffers (a rank fills one while its peers still read
 *            the one before: one barrier per chunk).
 * See shm.c for the protocol.
 */
#ifndef PYDIST_ALGORITHMS_SHM_H
#define PYDIST_ALGORITHMS_SHM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/kernels.h"

#define SHM_BUFFERS 3   // staging buffers per rank

// One rank's control block in a channel: 128 bytes, its two halves on separate cache lines.
typedef struct {
    _Alignas(64) _Atomic uint64_t seq;   // barriers this rank has entered
    _Alignas(64) int64_t count;          // the published header of this rank's current call
    int64_t offset;                      // in_segment: the array's byte offset in the session segment
    int64_t nbytes;
    int32_t dtype, op, in_segment, pad;
} ShmControl;

// A channel as one rank sees it (the mapping is local; seq and round advance identically everywhere).
typedef struct {
    int rank, size;
    char *base;            // the mapping: [size] ShmControl, then [size][SHM_BUFFERS][stage_bytes] staging
    size_t bytes;
    ShmControl *ctl;
    char *stage;
    size_t stage_bytes;    // one staging buffer (the same on every rank: the group's minimum)
    uint64_t seq;          // barriers this rank has entered
    uint64_t round;        // staging rounds done: which buffer the next one fills
    char **ptrs;           // [2 * size + 2] scratch for the kernels' input and output pointers
} ShmChannel;

// The session segment as one rank sees it: node_size regions of region_bytes, region i is node rank i's.
typedef struct {
    char *base;
    size_t region_bytes;
    int node_rank, node_size;
} ShmSession;

// The caller's wait: slice() is called after each slice (about 2 ms) of spinning and yielding; it
// returns 0 to wait on, or -1 to give up (its error stands; the channel is then out of step). spin:
// whether the wait may spin its first microseconds (the node's ranks fit its cores), or must yield
// almost at once (a peer that shares our core runs only when we let it).
typedef struct {
    int (*slice)(void *ctx);
    void *ctx;
    int spin;
} ShmWait;

// Wait until ready(arg): spin briefly, then yield the core, and call w->slice() every slice. 0, or -1
// when slice() gave up.
int shm_spin_until(int (*ready)(const void *arg), const void *arg, const ShmWait *w);

// Bytes a channel needs for `size` ranks with staging buffers of stage_bytes.
size_t shm_channel_bytes(int size, size_t stage_bytes);
// Lay a channel over a mapping of shm_channel_bytes() (zeroed by the creator). -1: out of memory.
int shm_channel_init(ShmChannel *c, char *base, int rank, int size, size_t stage_bytes);
// Free what init allocated (not the mapping).
void shm_channel_release(ShmChannel *c);

// The all-reduce of data[0..count) in place over the channel's ranks. session: NULL when there is none
// (no zero-copy). copy_ok: 0 to do it only in place (every rank's array in the session segment), else
// return 2 on every rank, having done nothing (the caller then uses MPI's). Returns 0 (done through
// the staging buffers), 1 (done in place: zero-copy), 2 (not done: see copy_ok), -1 (the wait gave up:
// its error stands), or -2 (the ranks' calls do not match: err holds the same message on every rank,
// and every rank returns -2 in step).
int shm_allreduce(ShmChannel *c, const ShmSession *session, void *data, int64_t count, int dtype, int op,
                  int copy_ok, const ShmWait *wait, char *err, size_t errlen);

// ---------------------------------------------------------------------------------------------------
// The heap: first-fit over one rank's region, its bookkeeping private to the rank.

typedef struct {
    size_t offset, len;
} ShmExtent;

typedef struct {
    size_t lo, hi;          // the region: [lo, hi) byte offsets in the segment
    ShmExtent *free;        // sorted by offset, coalesced
    size_t n_free, cap;
    size_t used;
} ShmHeap;

int shm_heap_init(ShmHeap *h, size_t lo, size_t hi);
void shm_heap_free_all(ShmHeap *h);
// A block of `len` bytes (64-byte aligned) at *offset; -1 when nothing fits (or out of memory).
int shm_heap_alloc(ShmHeap *h, size_t len, size_t *offset);
void shm_heap_release(ShmHeap *h, size_t offset, size_t len);
// The block size shm_heap_alloc reserves for len bytes.
size_t shm_heap_rounded(size_t len);

#endif  // PYDIST_ALGORITHMS_SHM_H
