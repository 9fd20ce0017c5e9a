/*
 * shm.c: the shared-memory all-reduce of shm.h, its reduction kernels, and the session heap.
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
 * A wait spins briefly, then yields the core (with more ranks than cores a spinning waiter would hold
 * back the very peer it waits for), and every few ms calls the caller's slice() (signals, departed
 * ranks, the deadline). After a wait gives up the channel is out of step and must not be used again.
 */
// The reduction loops are the hot path: vectorize them (GCC's -O2 cost model leaves them scalar), once
// per instruction-set level (simd.h; the end of the kernels' section): AVX2 is 10-15% faster at 1-4 MiB
// than the baseline's SSE2. Every level gives bitwise the same result: each element is one operation
// on the same two inputs (C11 mode keeps GCC from contracting multiply-adds), whatever the width.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#define KERNEL static inline __attribute__((always_inline))   // built per level by SHM_KERNELS below

#include "shm.h"
#include "core/minmax.h"
#include "core/simd.h"

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// How long a wait spins before it starts yielding (a peer on another core is usually microseconds
// away; one that shares our core needs the core back), and how long a slice of waiting lasts before
// the caller's checks run.
#define SPIN_SECONDS 20e-6
#define SLICE_SECONDS 0.002
// Reductions run block by block through a buffer that stays in L1, then go to each output.
#define BLOCK_BYTES 16384
// How far ahead copies and reductions prefetch what they read. Much of what they read was just written
// by the peer core (its staging buffer) and is fetched from that core's cache a line at a time unless
// asked for ahead: glibc's memcpy (rep movsb at these sizes) read such a buffer at 1.3 GB/s where this
// loop of 64-byte moves, prefetching, reads it at 27 GB/s.
#define PREFETCH_BYTES 2048

static const char *const DTYPE_NAMES[SHM_DTYPES] = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                                                    "uint32", "uint64", "float16", "float32", "float64",
                                                    "complex64", "complex128", "bfloat16"};
static const size_t ITEMSIZE[SHM_DTYPES] = {1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 4, 8, 8, 16, 2};
static const char *const OP_NAMES[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"};

const char *shm_dtype_name(int dtype) {
    return dtype >= 0 && dtype < SHM_DTYPES ? DTYPE_NAMES[dtype] : "?";
}

size_t shm_itemsize(int dtype) {
    return dtype >= 0 && dtype < SHM_DTYPES ? ITEMSIZE[dtype] : 1;
}

static const char *op_name(int op) {
    return op >= 0 && op < 8 ? OP_NAMES[op] : "?";
}

// ---------------------------------------------------------------------------------------------------
// Kernels: acc[i] = acc[i] (op) in[i], as NumPy computes it pairwise (integers wrap, bool is logical,
// float16 and bfloat16 round after each step); floating MIN/MAX as minmax.h defines them (NaN
// propagates as with np.minimum/np.maximum, and the result does not depend on the order).

#define LOOP(T, expr)                                                                              \
    do {                                                                                           \
        T *restrict a_ = (T *)acc;                                                                 \
        const T *restrict b_ = (const T *)in;                                                      \
        for (size_t i = 0; i < n; i++) {                                                           \
            T x = a_[i], y = b_[i];                                                                \
            a_[i] = (T)(expr);                                                                     \
        }                                                                                          \
        return;                                                                                    \
    } while (0)

// Signed integers add and multiply as their unsigned twins (wrapping, never undefined behaviour).
#define INT_OPS(T, UT)                                                                             \
    switch (op) {                                                                                  \
    case SHM_SUM: LOOP(UT, x + y);                                                                 \
    case SHM_PRODUCT: LOOP(UT, (x + 0u) * y);                                                      \
    case SHM_MIN: LOOP(T, x < y ? x : y);                                                          \
    case SHM_MAX: LOOP(T, x > y ? x : y);                                                          \
    case SHM_BAND: LOOP(UT, x & y);                                                                \
    case SHM_BOR: LOOP(UT, x | y);                                                                 \
    case SHM_BXOR: LOOP(UT, x ^ y);                                                                \
    default: return;                                                                               \
    }

// MIN/MAX on the bits, by minmax.h's rule (U: the unsigned integer of T's width).
#define FLOAT_OPS(T, U, BITS)                                                                      \
    switch (op) {                                                                                  \
    case SHM_SUM: case SHM_AVG: LOOP(T, x + y);                                                    \
    case SHM_PRODUCT: LOOP(T, x * y);                                                              \
    case SHM_MIN: LOOP(U, pd_fmin##BITS(x, y));                                                    \
    case SHM_MAX: LOOP(U, pd_fmax##BITS(x, y));                                                    \
    default: return;                                                                               \
    }

// Complex: SUM componentwise; PRODUCT by the textbook formula, as MPI computes it.
#define COMPLEX_OPS(T)                                                                             \
    do {                                                                                           \
        T *restrict a_ = (T *)acc;                                                                 \
        const T *restrict b_ = (const T *)in;                                                      \
        if (op == SHM_SUM || op == SHM_AVG) {                                                      \
            for (size_t i = 0; i < 2 * n; i++) a_[i] += b_[i];                                     \
        } else if (op == SHM_PRODUCT) {                                                            \
            for (size_t i = 0; i < n; i++) {                                                       \
                T ar = a_[2 * i], ai = a_[2 * i + 1], br = b_[2 * i], bi = b_[2 * i + 1];          \
                a_[2 * i] = ar * br - ai * bi;                                                     \
                a_[2 * i + 1] = ar * bi + ai * br;                                                 \
            }                                                                                      \
        }                                                                                          \
        return;                                                                                    \
    } while (0)

#define HALF_LOOP(widen, narrow, expr)                                                             \
    do {                                                                                           \
        uint16_t *a_ = (uint16_t *)acc;                                                            \
        const uint16_t *b_ = (const uint16_t *)in;                                                 \
        for (size_t i = 0; i < n; i++) {                                                           \
            float x = widen(a_[i]), y = widen(b_[i]);                                              \
            a_[i] = narrow(expr);                                                                  \
        }                                                                                          \
        return;                                                                                    \
    } while (0)

// MIN/MAX pick one input, so they need no widening: on the bits, by minmax.h's rule.
#define HALF_OPS(widen, narrow, INF)                                                               \
    switch (op) {                                                                                  \
    case SHM_SUM: case SHM_AVG: HALF_LOOP(widen, narrow, x + y);                                   \
    case SHM_PRODUCT: HALF_LOOP(widen, narrow, x * y);                                             \
    case SHM_MIN: LOOP(uint16_t, pd_fmin16(x, y, INF));                                            \
    case SHM_MAX: LOOP(uint16_t, pd_fmax16(x, y, INF));                                            \
    default: return;                                                                               \
    }

KERNEL void combine(void *acc, const void *in, size_t n, int dtype, int op) {
    switch (dtype) {
    case SHM_BOOL:
        switch (op) {
        case SHM_SUM: case SHM_MAX: case SHM_BOR: LOOP(uint8_t, (x | y) != 0);
        case SHM_PRODUCT: case SHM_MIN: case SHM_BAND: LOOP(uint8_t, x != 0 && y != 0);
        case SHM_BXOR: LOOP(uint8_t, (x != 0) != (y != 0));
        default: return;
        }
    case SHM_I8: INT_OPS(int8_t, uint8_t)
    case SHM_I16: INT_OPS(int16_t, uint16_t)
    case SHM_I32: INT_OPS(int32_t, uint32_t)
    case SHM_I64: INT_OPS(int64_t, uint64_t)
    case SHM_U8: INT_OPS(uint8_t, uint8_t)
    case SHM_U16: INT_OPS(uint16_t, uint16_t)
    case SHM_U32: INT_OPS(uint32_t, uint32_t)
    case SHM_U64: INT_OPS(uint64_t, uint64_t)
    case SHM_F16: HALF_OPS(pd_half_to_float, pd_float_to_half, PD_F16_INF)
    case SHM_BF16: HALF_OPS(pd_bf16_to_float, pd_float_to_bf16, PD_BF16_INF)
    case SHM_F32: FLOAT_OPS(float, uint32_t, 32)
    case SHM_F64: FLOAT_OPS(double, uint64_t, 64)
    case SHM_C64: COMPLEX_OPS(float);
    case SHM_C128: COMPLEX_OPS(double);
    default: return;
    }
}

// AVG: the sum divided by the group size, as pd_divide_inplace does it (componentwise for complex).
KERNEL void divide(void *acc, size_t n, int dtype, int by) {
    switch (dtype) {
    case SHM_F16: {
        uint16_t *p = acc;
        for (size_t i = 0; i < n; i++) p[i] = pd_float_to_half(pd_half_to_float(p[i]) / (float)by);
        return;
    }
    case SHM_BF16: {
        uint16_t *p = acc;
        for (size_t i = 0; i < n; i++) p[i] = pd_float_to_bf16(pd_bf16_to_float(p[i]) / (float)by);
        return;
    }
    case SHM_F32: case SHM_C64: {
        float *p = acc;
        for (size_t i = 0; i < n * (dtype == SHM_C64 ? 2 : 1); i++) p[i] /= (float)by;
        return;
    }
    case SHM_F64: case SHM_C128: {
        double *p = acc;
        for (size_t i = 0; i < n * (dtype == SHM_C128 ? 2 : 1); i++) p[i] /= (double)by;
        return;
    }
    default: return;
    }
}

// dst[0..n) = src[0..n), a line at a time, both asked for PREFETCH_BYTES ahead (see there).
KERNEL void copy_bytes(char *restrict dst, const char *restrict src, size_t n) {
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __builtin_prefetch(src + i + PREFETCH_BYTES);
        __builtin_prefetch(dst + i + PREFETCH_BYTES, 1);
        memcpy(dst + i, src + i, 64);
    }
    memcpy(dst + i, src + i, n - i);
}

// outs[0..n_outs)[0..len) = the reduction of ins[0..R)[0..len), in rank order, block by block. The
// pass that copies ins[0] into the block also prefetches every input ahead, so that each combine
// finds its input in cache.
KERNEL void reduce_slice(char *const *outs, int n_outs, char *const *ins, int R, size_t len, int dtype, int op) {
    _Alignas(64) char tmp[BLOCK_BYTES];
    const size_t isz = ITEMSIZE[dtype], per_block = BLOCK_BYTES / isz;
    for (size_t start = 0; start < len; start += per_block) {
        size_t b = len - start < per_block ? len - start : per_block, off = start * isz, bytes = b * isz, i = 0;
        for (; i + 64 <= bytes; i += 64) {
            for (int r = 0; r < R; r++) {
                __builtin_prefetch(ins[r] + off + i + PREFETCH_BYTES);
            }
            memcpy(tmp + i, ins[0] + off + i, 64);
        }
        memcpy(tmp + i, ins[0] + off + i, bytes - i);
        for (int r = 1; r < R; r++) {
            combine(tmp, ins[r] + off, b, dtype, op);
        }
        if (op == SHM_AVG) {
            divide(tmp, b, dtype, R);
        }
        for (int o = 0; o < n_outs; o++) {
            copy_bytes(outs[o] + off, tmp, bytes);
        }
    }
}

// The kernels above, built for each level: the loops vectorize for the width of the function they are
// inlined into.
#define SHM_KERNELS(level, attr)                                                                        \
    attr static void combine_##level(void *acc, const void *in, size_t n, int dtype, int op) {           \
        combine(acc, in, n, dtype, op);                                                                  \
    }                                                                                                    \
    attr static void reduce_##level(char *const *outs, int n_outs, char *const *ins, int R, size_t len,  \
                                    int dtype, int op) {                                                 \
        reduce_slice(outs, n_outs, ins, R, len, dtype, op);                                              \
    }                                                                                                    \
    attr static void copy_##level(char *restrict dst, const char *restrict src, size_t n) {              \
        copy_bytes(dst, src, n);                                                                         \
    }
SHM_KERNELS(sse2, )
#ifdef PD_SIMD_BUILDS
SHM_KERNELS(avx2, __attribute__((target("avx2"))))
SHM_KERNELS(avx512, __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl"))))
#endif

static void copy_lines(char *restrict dst, const char *restrict src, size_t n) {
    PD_SIMD_PICK(copy)(dst, src, n);
}

void shm_combine(void *acc, const void *in, size_t n, int dtype, int op) {
    PD_SIMD_PICK(combine)(acc, in, n, dtype, op);
}

void shm_reduce(char *const *outs, int n_outs, char *const *ins, int R, size_t len, int dtype, int op) {
    PD_SIMD_PICK(reduce)(outs, n_outs, ins, R, len, dtype, op);
}

// The small collectives' copies (at most a slot, 64 KiB): libc's memcpy, whose wide moves beat
// copy_bytes' line-at-a-time prefetching there (all_to_all at 8 KiB, 2 ranks: 2.11 -> 1.76 us in
// benchmarks/collectives_sweep.py).
void shm_copy(void *dst, const void *src, size_t n) {
    memcpy(dst, src, n);
}

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
                spin_end = t + SPIN_SECONDS;
                slice_end = t + SLICE_SECONDS;
            } else if (t > slice_end) {
                if (w->slice(w->ctx) < 0) {
                    return -1;
                }
                slice_end = now() + SLICE_SECONDS;
            }
            yielding = t > spin_end;
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
    copy_lines(stage, arr + first * isz, lo * isz);
    copy_lines(stage + hi * isz, arr + (first + hi) * isz, (m - hi) * isz);
}

// The peers' reduced slices of the chunk [first, first + m) from their staging buffers into arr.
static void copy_out(const ShmChannel *c, char *arr, size_t first, size_t m, int buf, size_t isz) {
    for (int p = 0; p < c->size; p++) {
        if (p != c->rank) {
            size_t plo = slice_lo(m, c->size, p);
            copy_lines(arr + (first + plo) * isz, stage_of(c, p, buf) + plo * isz, slice_len(m, c->size, p) * isz);
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
                        (long long)h->count, shm_dtype_name(h->dtype), op_name(h->op));
        if (p >= 7 && c->size > 9) {
            snprintf(err + len, errlen - (size_t)len, "; ...");
            break;
        }
    }
}

int shm_allreduce(ShmChannel *c, const ShmSession *s, void *data, int64_t count, int dtype, int op,
                  int copy_ok, const ShmWait *w, char *err, size_t errlen) {
    const int R = c->size, me = c->rank;
    const size_t isz = ITEMSIZE[dtype], n = (size_t)count, nbytes = n * isz;
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
