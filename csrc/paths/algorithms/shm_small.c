/*
 * shm_small.c: the small collectives of shm_small.h (protocol described there).
 */
#include "shm_small.h"

#include <stdio.h>
#include <string.h>

#define LINE 64

static const char *const KIND_NAMES[SMALL_KINDS] = {"barrier", "broadcast", "all_reduce", "reduce",
                                                    "all_gather_into_tensor", "reduce_scatter", "all_to_all",
                                                    "gather", "scatter", "all_gather"};
static const char *const OP_NAMES[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"};

// A rank's area: its done line, the headers of the calls it completed last (SEEN of them), the slots.
// Twice the slots: a peer that is itself a broadcast's root completes rounds without waiting, up to
// SLOTS past the round a root has yet to settle, and must not overwrite that round's record (it
// would need this rank to have posted round u + SLOTS, which settles round u first).
#define SEEN (2 * SMALL_SLOTS)
#define DONE_BYTES (LINE + SEEN * sizeof(SmallHeader))

// Each slot's data starts a page, its header in the line before: a peer's block then spans as few
// pages as it can, and the hardware prefetcher, which stops at a page's end, streams it whole
// (broadcast of 4 KiB at 2 ranks: 0.86 -> 0.80 us; all_gather of 64 KiB 5.5 -> 5.1).
#define PAGE ((size_t)4096)
#define ROUND_UP(n, m) (((n) + (m) - 1) / (m) * (m))
#define FIRST_DATA ROUND_UP(DONE_BYTES + sizeof(SmallHeader), PAGE)
#define SLOT_STRIDE ROUND_UP(SMALL_SLOT_BYTES + sizeof(SmallHeader), PAGE)

static size_t rank_bytes(void) {
    return FIRST_DATA + SMALL_SLOTS * SLOT_STRIDE;
}

static _Atomic uint64_t *done_of(const ShmSmall *s, int rank) {
    return (_Atomic uint64_t *)(s->base + (size_t)rank * rank_bytes());
}

// The header of the call `rank` completed in `round`, or in a later one of the same record (stamp: that
// round + 1).
static SmallHeader *seen_of(const ShmSmall *s, int rank, uint64_t round) {
    return (SmallHeader *)(s->base + (size_t)rank * rank_bytes() + LINE) + round % SEEN;
}

static char *data_of(const ShmSmall *s, int rank, uint64_t round) {
    return s->base + (size_t)rank * rank_bytes() + FIRST_DATA + (size_t)(round % SMALL_SLOTS) * SLOT_STRIDE;
}

static SmallHeader *header_of(const ShmSmall *s, int rank, uint64_t round) {
    return (SmallHeader *)data_of(s, rank, round) - 1;
}

// Where in its slot a round's contribution of `bytes` sits, the same for every rank (every rank's of a
// round has the same size once the headers match). Successive uses of a slot move along it, as far as
// it has room: a slot reused every SMALL_SLOTS rounds at the same place made the writer invalidate,
// line by line, what the readers had just read (broadcast of 8 KiB at 2 ranks: about 1.4 us a call,
// 1.2 moving along).
static size_t place_of(uint64_t round, size_t bytes) {
    size_t stride = (bytes + 63) / 64 * 64, places = stride ? SMALL_SLOT_BYTES / stride : 1;
    return (size_t)((round / SMALL_SLOTS) % places) * stride;
}

size_t shm_small_bytes(int size) {
    return (size_t)size * rank_bytes();
}

void shm_small_init(ShmSmall *s, char *base, int rank, int size) {
    *s = (ShmSmall){rank, size, base, 0, 0, 0, 0, {0}, {0}, 0};
}

size_t shm_small_contribution(const SmallCall *c, int size) {
    size_t block = (size_t)c->count * c->itemsize;
    if (c->kind & SMALL_HEADER_ONLY) {
        return 0;
    }
    switch (c->kind) {
    case SMALL_BARRIER: return 0;
    case SMALL_REDUCE_SCATTER: case SMALL_ALLTOALL: case SMALL_SCATTER: return block * (size_t)size;
    default: return block;
    }
}

typedef struct {
    const ShmSmall *s;
    int want_done;        // 1: every peer's done >= target; 0: every peer's slot for `round` stamped
    uint64_t target, round;
    int p;                // the peer we are waiting for: earlier ones are there
} PeersAt;

static int peers_at(const void *arg) {
    PeersAt *a = (PeersAt *)arg;
    const ShmSmall *s = a->s;
    for (; a->p < s->size; a->p++) {
        if (a->p == s->rank) {
            continue;
        }
        uint64_t v = a->want_done ? atomic_load_explicit(done_of(s, a->p), memory_order_acquire)
                                  : atomic_load_explicit(&header_of(s, a->p, a->round)->stamp, memory_order_acquire);
        if (a->want_done ? v < a->target : v != a->round + 1) {
            return 0;
        }
    }
    return 1;
}

// Wait until every peer's `done` has reached `target` (want_done) or its slot for `round` carries
// stamp round + 1 (shm.c's spin, yield and slice). 0, or -1 when the caller's slice() gave up.
static int wait_peers(const ShmSmall *s, int want_done, uint64_t target, uint64_t round, const ShmWait *w) {
    PeersAt arg = {s, want_done, target, round, 0};
    return shm_spin_until(peers_at, &arg, w);
}

static void mismatch_message(const ShmSmall *s, const SmallHeader *const *hs, char *err, size_t errlen);

// Whether every peer has completed round target - 1 (done >= target): from s->peers_done when that says
// so, else reading their `done` lines, which change at every call of theirs (a cache miss each), and
// raising the bound. The acquire of the read that raised it still orders what they did before it.
static int peers_done_at(ShmSmall *s, uint64_t target) {
    if (s->peers_done >= target) {
        return 1;
    }
    uint64_t least = UINT64_MAX;
    for (int p = 0; p < s->size; p++) {
        uint64_t v = p == s->rank ? UINT64_MAX : atomic_load_explicit(done_of(s, p), memory_order_acquire);
        least = v < least ? v : least;
    }
    s->peers_done = least;
    return least >= target;
}

static int same_call(const SmallHeader *a, const SmallHeader *b) {
    int uneven = a->count == SMALL_UNEVEN || b->count == SMALL_UNEVEN;
    int counts = a->count == b->count || ((a->kind & ~SMALL_HEADER_ONLY) == SMALL_ALLTOALL && uneven);
    return counts && (a->kind & ~SMALL_HEADER_ONLY) == (b->kind & ~SMALL_HEADER_ONLY) && a->dtype == b->dtype &&
           a->op == b->op && a->root == b->root;
}

// Compare an unchecked broadcast of slot i (this rank its root) with what the peers completed there,
// once they all have: a mismatch becomes s->deferred. Always settles when this rank is about to post
// the slot's next round (its peers are done with the slot, and cannot complete a later round in it).
static void settle(ShmSmall *s, int i) {
    uint64_t u = s->unchecked[i];
    if (u == 0) {
        return;
    }
    const SmallHeader *hs[SMALL_MAX_RANKS];
    int same = 1;
    if (!peers_done_at(s, u)) {
        return;   // not yet: look again later
    }
    for (int p = 0; p < s->size; p++) {
        hs[p] = p == s->rank ? header_of(s, p, u - 1) : seen_of(s, p, u - 1);
        if (p != s->rank && atomic_load_explicit(&hs[p]->stamp, memory_order_relaxed) != u) {
            s->unchecked[i] = 0;   // cannot happen (SEEN above); never report what cannot be known
            return;
        }
        same &= same_call(hs[p], header_of(s, s->rank, u - 1));
    }
    s->unchecked[i] = 0;
    if (!same && s->deferred[0] == 0) {
        mismatch_message(s, hs, s->deferred, sizeof s->deferred);
    }
}

int shm_small_deferred_error(ShmSmall *s, char *err, size_t errlen) {
    for (int i = 0; i < SMALL_SLOTS; i++) {
        settle(s, i);
    }
    if (s->deferred[0] == 0) {
        return 0;
    }
    snprintf(err, errlen, "%s", s->deferred);
    s->deferred[0] = 0;
    return 1;
}

int shm_small_post(ShmSmall *s, const SmallCall *c, const ShmWait *w) {
    const uint64_t r = s->posted;
    if (!shm_small_can_post(s) && wait_peers(s, 1, r + 1 - SMALL_SLOTS, 0, w) < 0) {
        return -1;   // a peer still reads round r - SLOTS out of our slot: wait for it
    }
    settle(s, (int)(r % SMALL_SLOTS));   // before our header of round r replaces that of r - SLOTS
    SmallHeader *h = header_of(s, s->rank, r);
    size_t bytes = shm_small_contribution(c, s->size);
    char *mine = data_of(s, s->rank, r) + place_of(r, bytes);
    // An all-to-all's or a scatter's own block is read from the input at completion (own_block), never
    // from the slot: not copying it saves 1/R of the copy (all-to-all of 64 KiB at 2 ranks: half).
    const int skip = c->kind == SMALL_ALLTOALL || c->kind == SMALL_SCATTER ? s->rank : -1;
    const size_t block = (size_t)c->count * c->itemsize;
    if (c->src != NULL && bytes > 0 && c->src_at != NULL) {   // a list: one block per rank
        for (int p = 0; p < s->size; p++) {
            if (p != skip) {
                memcpy(mine + (size_t)p * block, (const char *)c->src + c->src_at[p], block);
            }
        }
    } else if (c->src != NULL && bytes > 0 && skip >= 0) {   // the blocks before ours, then after it
        const size_t own = (size_t)skip * block;
        memcpy(mine, c->src, own);
        memcpy(mine + own + block, (const char *)c->src + own + block, bytes - own - block);
    } else if (c->src != NULL && bytes > 0) {
        memcpy(mine, c->src, bytes);
    }
    h->count = c->count;
    h->kind = c->kind;
    h->dtype = c->dtype;
    h->op = c->op;
    h->root = c->root;
    h->flags = c->flags | (c->kind & SMALL_HEADER_ONLY ? 0 : SMALL_IN_SLOT);
    atomic_store_explicit(&h->stamp, r + 1, memory_order_release);
    s->posted = r + 1;
    return 0;
}

int shm_small_can_post(ShmSmall *s) {
    return s->posted < SMALL_SLOTS || peers_done_at(s, s->posted + 1 - SMALL_SLOTS);
}

int shm_small_arrived(const ShmSmall *s, uint64_t round) {
    for (int p = 0; p < s->size; p++) {
        if (p != s->rank && atomic_load_explicit(&header_of(s, p, round)->stamp, memory_order_acquire) != round + 1) {
            return 0;
        }
    }
    return 1;
}

// The same message on every rank: each one's call, from the headers (hs[p]: group rank p's).
static void mismatch_message(const ShmSmall *s, const SmallHeader *const *hs, char *err, size_t errlen) {
    int len = snprintf(err, errlen, "the ranks' calls do not match (every rank must make the same collective "
                       "with the same number of elements, dtype, op and root):");
    for (int p = 0; p < s->size && len > 0 && (size_t)len < errlen; p++) {
        const SmallHeader *h = hs[p];
        int kind = h->kind & ~SMALL_HEADER_ONLY;
        kind = kind >= 0 && kind < SMALL_KINDS ? kind : 0;
        int moved = kind != SMALL_ALLREDUCE && kind != SMALL_REDUCE && kind != SMALL_REDUCE_SCATTER;   // as bytes
        const char *through = h->kind & SMALL_HEADER_ONLY ? " (a large one)" : "";
        if (h->count == SMALL_UNEVEN) {
            len += snprintf(err + len, errlen - (size_t)len, "%s group rank %d: %s%s with uneven split sizes",
                            p ? ";" : "", p, KIND_NAMES[kind], through);
        } else {
            len += snprintf(err + len, errlen - (size_t)len, "%s group rank %d: %s%s of %lld %s", p ? ";" : "", p,
                            KIND_NAMES[kind], through, (long long)h->count, moved ? "bytes" : shm_dtype_name(h->dtype));
        }
        if (len > 0 && (size_t)len < errlen && (kind == SMALL_ALLREDUCE || kind == SMALL_REDUCE ||
                                                 kind == SMALL_REDUCE_SCATTER)) {
            len += snprintf(err + len, errlen - (size_t)len, ", %s", h->op >= 0 && h->op < 8 ? OP_NAMES[h->op] : "?");
        }
        if (len > 0 && (size_t)len < errlen &&
            (kind == SMALL_BCAST || kind == SMALL_REDUCE || kind == SMALL_GATHER || kind == SMALL_SCATTER)) {
            len += snprintf(err + len, errlen - (size_t)len, ", root %d", h->root);
        }
        if (p >= 7 && s->size > 9) {
            snprintf(err + len, errlen - (size_t)len, "; ...");
            break;
        }
    }
}

// Where block p of the result goes (a list form's array, or p blocks into dst).
static char *block_at(const SmallCall *c, int p, size_t block) {
    return (char *)c->dst + (c->dst_at != NULL ? (size_t)c->dst_at[p] : (size_t)p * block);
}

// Where this rank's own block of the result comes from: its input (src; block `me` of a list or an
// all-to-all's row), or NULL if it has none here. Reading it there rather than back out of our slot
// leaves the slot's lines to the peers reading them at the same moment (all_gather of 16 KiB at 2
// ranks: 3.0 -> 2.4 us).
static const char *own_block(const SmallCall *c, int me, size_t block, int row) {
    if (c->src == NULL) {
        return NULL;
    }
    return (const char *)c->src + (c->src_at != NULL ? (size_t)c->src_at[me] : row ? (size_t)me * block : 0);
}

// Copy this rank's own block first, from its input (memmove: an in-place call's input may be that very
// block of the output, and only it is read from the input), then the peers' blocks out of their slots
// (`within`: the offset of our block inside each peer's contribution).
static void copy_blocks(const ShmSmall *s, const SmallCall *c, uint64_t r, size_t at, size_t block, int row,
                        size_t within) {
    const int me = s->rank;
    const char *own = own_block(c, me, block, row);
    if (own != NULL && own != block_at(c, me, block)) {
        memmove(block_at(c, me, block), own, block);
    }
    for (int p = 0; p < s->size; p++) {
        if (p != me || own == NULL) {
            shm_copy(block_at(c, p, block), data_of(s, p, r) + at + within, block);
        }
    }
}

// Publish the header of the call this rank completes in round r (for a broadcast's root), then done.
static void publish_done(ShmSmall *s, uint64_t r) {
    SmallHeader *seen = seen_of(s, s->rank, r);
    const SmallHeader *mine = header_of(s, s->rank, r);
    seen->count = mine->count;
    seen->kind = mine->kind;
    seen->dtype = mine->dtype;
    seen->op = mine->op;
    seen->root = mine->root;
    atomic_store_explicit(&seen->stamp, r + 1, memory_order_relaxed);
    s->completed = r + 1;
    atomic_store_explicit(done_of(s, s->rank), r + 1, memory_order_release);   // releases `seen` too
}

int shm_small_complete(ShmSmall *s, const SmallCall *c, const ShmWait *w, char *err, size_t errlen) {
    const uint64_t r = s->completed;
    const int R = s->size, me = s->rank;
    if (c->kind == SMALL_BCAST && c->root == me && !shm_small_arrived(s, r)) {
        s->unchecked[r % SMALL_SLOTS] = r + 1;   // checked later (settle), without making the root wait
        s->flags_and = s->flags_or = header_of(s, me, r)->flags;   // its own data, in its slot
        publish_done(s, r);
        return 0;
    }
    if (wait_peers(s, 0, 0, r, w) < 0) {
        return -1;
    }
    const SmallHeader *hs[SMALL_MAX_RANKS];
    const SmallHeader *mine = header_of(s, me, r);
    int same = 1;
    s->flags_and = ~0u;
    s->flags_or = 0;
    for (int p = 0; p < R; p++) {
        const SmallHeader *h = hs[p] = header_of(s, p, r);
        same &= same_call(h, mine);
        s->flags_and &= h->flags;
        s->flags_or |= h->flags;
    }
    int rc = 0;
    if (!same) {
        mismatch_message(s, hs, err, errlen);
        rc = -2;
    } else if (s->flags_and & SMALL_IN_SLOT) {
        const size_t block = (size_t)c->count * c->itemsize, at = place_of(r, shm_small_contribution(c, R));
        char *in[SMALL_MAX_RANKS], *out = c->dst;
        switch (c->kind) {
        case SMALL_BCAST:
            if (me != c->root) {
                shm_copy(c->dst, data_of(s, c->root, r) + at, block);
            }
            break;
        case SMALL_ALLREDUCE: case SMALL_REDUCE: case SMALL_REDUCE_SCATTER:
            if (out == NULL) {
                break;   // reduce's non-roots
            }
            for (int p = 0; p < R; p++) {
                in[p] = data_of(s, p, r) + at + (c->kind == SMALL_REDUCE_SCATTER ? (size_t)me * block : 0);
            }
            if (c->src != NULL) {   // our own input from where it is, as copy_blocks does
                char *own = (char *)c->src + (c->kind == SMALL_REDUCE_SCATTER ? (size_t)me * block : 0);
                // shm_reduce reads each stretch of every input before writing it to the output: an input
                // that is the output is fine, one overlapping it elsewhere is not
                if (own == out || own + block <= out || out + block <= own) {
                    in[me] = own;
                }
            }
            shm_reduce(&out, 1, in, R, (size_t)c->count, c->dtype, c->op);
            break;
        case SMALL_ALLGATHER: case SMALL_ALLGATHER_LIST: case SMALL_GATHER:
            if (out != NULL) {   // gather's non-roots: no output
                copy_blocks(s, c, r, at, block, 0, 0);
            }
            break;
        case SMALL_ALLTOALL:
            copy_blocks(s, c, r, at, block, 1, (size_t)me * block);
            break;
        case SMALL_SCATTER:
            if (me == c->root && c->src != NULL) {
                const char *own = own_block(c, me, block, 1);
                if (own != c->dst) {
                    memmove(c->dst, own, block);
                }
            } else {
                shm_copy(c->dst, data_of(s, c->root, r) + at + (size_t)me * block, block);
            }
            break;
        default:
            break;   // barrier: arriving was all
        }
    }
    publish_done(s, r);
    return rc;
}
