/*
 * shm.c: the shared-memory all-reduce of shm.h and the session heap (the kernels it reduces with are
 * core/kernels.c).
 *
 * The protocol. Every rank of a channel has a barrier counter `seq` (its own cache line). A barrier:
 * bump your counter (release), then wait until every peer's counter has reached it (acquire). All
 * ranks pass the same barriers in the same order, so the counters never need resetting, and one
 * rank is never more than one barrier ahead of another.
 *
 *   rank:      publish header ──H── check headers ──┬── zero-copy: reduce my slice of every rank's
 *   (and pre-copy chunk 0 if                        │   array, write it into every rank's array ──F
 *    my array is not in the                         └── copy: for each chunk k (staging buffer r % 3):
 *    session segment)                                   copy k in ──k── copy the peers' slices of
 *                                                       chunk k - 1 out of their buffers, reduce my
 *                                                       slice of chunk k from all staging buffers
 *                                                       (my own part straight from my array)
 *                                                       into mine and my array; after the last ──L──
 *                                                       copy the peers' slices of it out
 *
 * Each rank reduces 1/R of the elements (its slice, offsets as the ring's), in rank order, so every
 * rank ends with bitwise the same result. The header (count, dtype, op, and where the array is) is
 * read by every rank between H and the next barrier, and no rank writes the next call's header before
 * passing that barrier, so all ranks judge the same headers: a mismatch gives the same error on every
 * rank (after one more barrier, so they all leave in step), and zero-copy is chosen only when every
 * rank published an array inside the session segment. Triple buffering, one barrier per chunk: a rank fills buffer
 * r % 3 for round r only after barrier r - 1, which every rank enters after copying round r - 3 out
 * (in round r - 2), so no rank overwrites a buffer a peer still reads; and round r - 1's slices are
 * copied out only after barrier r, which every rank enters after reducing its slice of round r - 1.
 * The round counter lives with the channel, so the rotation continues from one call to the next (and
 * chunk 0 of a call may be copied in before H). Fewer barriers matter: with more processes than cores
 * a barrier whose peer is not running costs a scheduler slice.
 *
 * A wait spins briefly (not at all with more ranks than cores), then yields the core (with more ranks
 * than cores a spinning waiter would hold back the very peer it waits for), and every few ms calls the
 * caller's slice() (signals, departed ranks, the deadline). After a wait gives up the channel is out of
 * step and must not be used again.
 */
#include "shm.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// How long a wait spins before it starts yielding when the ranks fit the cores (a peer on another core
// is usually microseconds away), and how long a slice of waiting lasts before the caller's checks
// run. With more ranks than cores the wait yields after its first 16 checks: a peer that shares our
// core needs the core back, and spinning 20 us there cost every small call 25-33 us at 3 and 4 ranks
// on 2 cores (5-7 us yielding; docs/performance.md).
#define SPIN_SECONDS 20e-6
#define SLICE_SECONDS 0.002

// ---------------------------------------------------------------------------------------------------
// Barriers

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

int shm_spin_until(int (*ready)(const void *arg), const void *arg, const ShmWait *w) {
    int yielding = 0;
    double spin_end = 0.0, slice_end = 0.0;
    for (long checks = 1;; checks++) {
        if (ready(arg)) {
            return 0;
        }
        if (yielding) {
            sched_yield();
        } else {
            cpu_relax();
        }
        if ((checks & 15) == 0) {
            double t = now();
            if (slice_end == 0.0) {
                spin_end = t + (w->spin ? SPIN_SECONDS : 0.0);
                slice_end = t + SLICE_SECONDS;
            } else if (t > slice_end) {
                if (w->slice(w->ctx) < 0) {
                    return -1;
                }
                slice_end = now() + SLICE_SECONDS;
            }
            yielding = t >= spin_end;   // (>=: without spin, from this first check on)
        }
    }
}

typedef struct {
    ShmChannel *c;
    uint64_t target;
    int p;   // the peer we are waiting for: earlier ones have arrived
} PeersAt;

static int peers_at(const void *arg) {
    PeersAt *a = (PeersAt *)arg;
    while (a->p < a->c->size && (a->p == a->c->rank ||
                                 atomic_load_explicit(&a->c->ctl[a->p].seq, memory_order_acquire) >= a->target)) {
        a->p++;
    }
    return a->p == a->c->size;
}

// Wait until every peer's counter has reached `target`.
static int wait_for_peers(ShmChannel *c, uint64_t target, const ShmWait *w) {
    PeersAt arg = {c, target, 0};
    return shm_spin_until(peers_at, &arg, w);
}

static int barrier(ShmChannel *c, const ShmWait *w) {
    uint64_t target = ++c->seq;
    atomic_store_explicit(&c->ctl[c->rank].seq, target, memory_order_release);
    return wait_for_peers(c, target, w);
}

// ---------------------------------------------------------------------------------------------------
// The channel and the all-reduce

static size_t round_up(size_t x, size_t to) {
    return (x + to - 1) / to * to;
}

size_t shm_channel_bytes(int size, size_t stage_bytes) {
    return round_up((size_t)size * sizeof(ShmControl), 4096) + (size_t)size * SHM_BUFFERS * round_up(stage_bytes, 64);
}

int shm_channel_init(ShmChannel *c, char *base, int rank, int size, size_t stage_bytes) {
    *c = (ShmChannel){rank, size, base, shm_channel_bytes(size, stage_bytes), (ShmControl *)base,
                      base + round_up((size_t)size * sizeof(ShmControl), 4096), round_up(stage_bytes, 64), 0, 0,
                      malloc(sizeof(char *) * (2 * (size_t)size + 2))};   // outputs: R in place, 2 copied
    return c->ptrs == NULL ? -1 : 0;
}

void shm_channel_release(ShmChannel *c) {
    free(c->ptrs);
    c->ptrs = NULL;
}

static char *stage_of(const ShmChannel *c, int rank, int buf) {
    return c->stage + ((size_t)rank * SHM_BUFFERS + (size_t)buf) * c->stage_bytes;
}

// Rank p's slice of n elements: n / R each, the first n % R ranks one more (as the ring's segments).
static size_t slice_lo(size_t n, int R, int p) {
    size_t extra = n % (size_t)R;
    return (size_t)p * (n / (size_t)R) + ((size_t)p < extra ? (size_t)p : extra);
}

static size_t slice_len(size_t n, int R, int p) {
    return n / (size_t)R + ((size_t)p < n % (size_t)R ? 1 : 0);
}

// This rank's contribution to the chunk [first, first + m) into its staging buffer: all but its own
// slice, which only it reads (straight from its array).
static void copy_in(const ShmChannel *c, const char *arr, size_t first, size_t m, int buf, size_t isz) {
    char *stage = stage_of(c, c->rank, buf);
    size_t lo = slice_lo(m, c->size, c->rank), hi = lo + slice_len(m, c->size, c->rank);
    shm_copy_lines(stage, arr + first * isz, lo * isz);
    shm_copy_lines(stage + hi * isz, arr + (first + hi) * isz, (m - hi) * isz);
}

// The peers' reduced slices of the chunk [first, first + m) from their staging buffers into arr.
static void copy_out(const ShmChannel *c, char *arr, size_t first, size_t m, int buf, size_t isz) {
    for (int p = 0; p < c->size; p++) {
        if (p != c->rank) {
            size_t plo = slice_lo(m, c->size, p);
            shm_copy_lines(arr + (first + plo) * isz, stage_of(c, p, buf) + plo * isz, slice_len(m, c->size, p) * isz);
        }
    }
}

// Whether a published header names a valid array inside one rank's region of the session segment.
static int header_in_segment(const ShmControl *h, const ShmSession *s, size_t isz) {
    if (s == NULL || !h->in_segment || h->offset < 0 || h->count <= 0) {
        return 0;
    }
    size_t off = (size_t)h->offset, total = s->region_bytes * (size_t)s->node_size;
    size_t bytes = (size_t)h->count * isz;
    return (size_t)h->nbytes == bytes && off < total && bytes <= total - off &&
           off / s->region_bytes == (off + bytes - 1) / s->region_bytes;
}

// The same message on every rank: each one's published call.
static void mismatch_message(const ShmChannel *c, char *err, size_t errlen) {
    int len = snprintf(err, errlen, "the ranks' calls do not match (every rank must pass the same number of "
                       "elements, dtype and op):");
    for (int p = 0; p < c->size && len > 0 && (size_t)len < errlen; p++) {
        const ShmControl *h = &c->ctl[p];
        len += snprintf(err + len, errlen - (size_t)len, "%s group rank %d: %lld %s, %s", p ? ";" : "", p,
                        (long long)h->count, shm_dtype_name(h->dtype), shm_op_name(h->op));
        if (p >= 7 && c->size > 9) {
            snprintf(err + len, errlen - (size_t)len, "; ...");
            break;
        }
    }
}

int shm_allreduce(ShmChannel *c, const ShmSession *s, void *data, int64_t count, int dtype, int op,
                  int copy_ok, const ShmWait *w, char *err, size_t errlen) {
    const int R = c->size, me = c->rank;
    const size_t isz = shm_itemsize(dtype), n = (size_t)count, nbytes = n * isz;
    const size_t chunk = c->stage_bytes / isz;   // elements per staging round
    char *arr = data;
    ShmControl *mine = &c->ctl[me];

    // Publish this call; an array outside the segment has its first chunk copied in at once.
    int in_seg = 0;
    if (s != NULL && n > 0) {
        char *lo = s->base + s->region_bytes * (size_t)s->node_rank;
        in_seg = arr >= lo && arr < lo + s->region_bytes && nbytes <= (size_t)(lo + s->region_bytes - arr);
    }
    int precopied = copy_ok && !in_seg && n > 0;
    if (precopied) {
        copy_in(c, arr, 0, n < chunk ? n : chunk, (int)(c->round % SHM_BUFFERS), isz);
    }
    mine->count = count;
    mine->dtype = dtype;
    mine->op = op;
    mine->in_segment = in_seg;
    mine->offset = in_seg ? (int64_t)(arr - s->base) : -1;
    mine->nbytes = (int64_t)nbytes;
    if (barrier(c, w) < 0) {   // H
        return -1;
    }
    int same = 1, all_in = 1, none_in = 1;
    for (int p = 0; p < R; p++) {
        const ShmControl *h = &c->ctl[p];
        same &= h->count == count && h->dtype == dtype && h->op == op;
        all_in &= header_in_segment(h, s, isz);
        none_in &= !h->in_segment;
    }
    if (!same) {
        mismatch_message(c, err, errlen);
        return barrier(c, w) < 0 ? -1 : -2;   // all read the headers before anyone writes new ones
    }
    if (n == 0) {
        return barrier(c, w) < 0 ? -1 : 0;
    }
    if (!all_in && !copy_ok) {
        return barrier(c, w) < 0 ? -1 : 2;   // every rank read the headers before anyone leaves
    }

    char **ins = c->ptrs, **outs = c->ptrs + R;

    if (all_in) {
        // Zero-copy: my slice of every rank's array, straight from and into the arrays.
        size_t lo = slice_lo(n, R, me), len = slice_len(n, R, me);
        for (int p = 0; p < R; p++) {
            ins[p] = outs[p] = s->base + c->ctl[p].offset + lo * isz;
        }
        shm_reduce(outs, R, ins, R, len, dtype, op);
        return barrier(c, w) < 0 ? -1 : 1;   // F
    }

    size_t prev_first = 0, prev_m = 0;   // the chunk whose peers' slices are still to be copied out
    for (size_t first = 0; first < n; first += chunk) {
        const size_t m = n - first < chunk ? n - first : chunk;
        const int buf = (int)(c->round % SHM_BUFFERS);
        char *mine_stage = stage_of(c, me, buf);
        if (first > 0 || !none_in) {
            // Chunk 0 was copied in before H by every rank whose array is outside the segment; if every
            // rank's was, H was this round's barrier.
            if (first > 0 || !precopied) {
                copy_in(c, arr, first, m, buf, isz);
            }
            if (barrier(c, w) < 0) {
                return -1;
            }
        }
        if (prev_m > 0) {
            copy_out(c, arr, prev_first, prev_m, (int)((c->round - 1) % SHM_BUFFERS), isz);
        }
        size_t lo = slice_lo(m, R, me), len = slice_len(m, R, me);
        for (int p = 0; p < R; p++) {
            ins[p] = p == me ? arr + (first + lo) * isz : stage_of(c, p, buf) + lo * isz;
        }
        outs[0] = mine_stage + lo * isz;   // read by the peers in their copy out
        outs[1] = arr + (first + lo) * isz;
        shm_reduce(outs, 2, ins, R, len, dtype, op);
        prev_first = first, prev_m = m;
        c->round++;
    }
    if (barrier(c, w) < 0) {   // every slice of the last chunk is reduced
        return -1;
    }
    copy_out(c, arr, prev_first, prev_m, (int)((c->round - 1) % SHM_BUFFERS), isz);
    return 0;
}

// ---------------------------------------------------------------------------------------------------
// The heap: a sorted, coalesced list of free extents; first fit.

#define HEAP_ALIGN 64

size_t shm_heap_rounded(size_t len) {
    return round_up(len > 0 ? len : 1, HEAP_ALIGN);
}

int shm_heap_init(ShmHeap *h, size_t lo, size_t hi) {
    *h = (ShmHeap){lo, hi, NULL, 0, 0, 0};
    if ((h->free = malloc(sizeof(ShmExtent) * 16)) == NULL) {
        return -1;
    }
    h->cap = 16;
    if (hi > lo) {
        h->free[0] = (ShmExtent){lo, hi - lo};
        h->n_free = 1;
    }
    return 0;
}

void shm_heap_free_all(ShmHeap *h) {
    free(h->free);
    h->free = NULL;
    h->n_free = h->cap = 0;
}

int shm_heap_alloc(ShmHeap *h, size_t len, size_t *offset) {
    len = shm_heap_rounded(len);
    for (size_t i = 0; i < h->n_free; i++) {
        ShmExtent *e = &h->free[i];
        if (e->len >= len) {
            *offset = e->offset;
            e->offset += len;
            e->len -= len;
            if (e->len == 0) {
                memmove(e, e + 1, sizeof *e * (h->n_free - i - 1));
                h->n_free--;
            }
            h->used += len;
            return 0;
        }
    }
    return -1;
}

void shm_heap_release(ShmHeap *h, size_t offset, size_t len) {
    len = shm_heap_rounded(len);
    size_t i = 0;
    while (i < h->n_free && h->free[i].offset < offset) {
        i++;
    }
    h->used -= len;
    int joins_prev = i > 0 && h->free[i - 1].offset + h->free[i - 1].len == offset;
    int joins_next = i < h->n_free && offset + len == h->free[i].offset;
    if (joins_prev && joins_next) {
        h->free[i - 1].len += len + h->free[i].len;
        memmove(&h->free[i], &h->free[i + 1], sizeof(ShmExtent) * (h->n_free - i - 1));
        h->n_free--;
    } else if (joins_prev) {
        h->free[i - 1].len += len;
    } else if (joins_next) {
        h->free[i].offset = offset;
        h->free[i].len += len;
    } else {
        if (h->n_free == h->cap) {
            ShmExtent *more = realloc(h->free, sizeof(ShmExtent) * h->cap * 2);
            if (more == NULL) {
                return;   // out of memory: the block is lost to the heap, never handed out twice
            }
            h->free = more;
            h->cap *= 2;
        }
        memmove(&h->free[i + 1], &h->free[i], sizeof(ShmExtent) * (h->n_free - i));
        h->free[i] = (ShmExtent){offset, len};
        h->n_free++;
    }
}
