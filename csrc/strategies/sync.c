/*
 * sync.c: the synchronous strategies, each equal to one process taking the whole global batch
 * (tests/mpi/test_strategies.py checks each against allreduce):
 *   allreduce  the all-reduce of the gradients (our shared-memory one when the replicas share a node and
 *              the gradients are large enough, as all_reduce's automatic choice; else MPI's), then
 *              every rank applies the same update;
 *   ring       the same with our ring all-reduce (csrc/paths/algorithms/ring.c);
 *   central    tf.distribute's central storage: gradients to rank 0, which alone keeps the optimizer
 *              state and updates, then sends the weights to every rank;
 *   ps         a sharded parameter server: the last S ranks each own a contiguous shard of the
 *              parameters and its momentum; the workers push gradient shards and pull weight shards.
 * The gradients are the mean over the workers' batches, as one process with their union would take.
 * Each kind's hooks are its table at the end (hooks.h); the communication is comm.c's.
 * On the timeline a worker's step records "gradient sync" (the gradients' exchange, their sum included)
 * and "update" (the SGD step, where this rank takes it); central's rank 0 and ps's servers also record
 * "weight sync" (the new weights going out; args step only: the other ranks' side of it lies inside
 * their "gradient sync", which is what a report pairs by group and seq).
 */
#include <stdlib.h>
#include <string.h>

#include "paths/algorithms/ring.h"
#include "comm.h"
#include "strategies/exchange.h"
#include "engine/sgd.h"
#include "hooks.h"

enum { TAG_GRADS = 1, TAG_WEIGHTS = 2, TAG_STATE = 3 };

// ---------------------------------------------------------------------------------------------------
// allreduce and ring

// The gradients' sum (rc: how getting it went; t: when the exchange began, for the timeline), then
// every rank's same update with their mean. The mean is the sum times 1/R, applied inside the update's
// one pass over the parameters (grads keep the sum). 1/R: the bits that scaling first gave; at R = 1
// the factor is exactly 1.
static int update_with_mean(Strategy *s, int rc, int64_t t, long step, float *params, float *grads, float *momentum,
                            int *started) {
    if (t) pd_tl_span(t, "sync", "gradient sync", 2, TL_EXCHANGE(s, step));
    if (rc < 0) {
        return rc;
    }
    t = pd_tl_begin();
    sgd_step_scaled(&s->sgd, 1.0f / (float)s->comm.size, params, grads, momentum, started, s->n);
    if (t) pd_tl_span(t, "compute", "update", 0);
    return 0;
}

static int allreduce_step(Strategy *s, float *params, float *grads, float *momentum, int *started, long step) {
    const int64_t t = pd_tl_begin();
    int rc = s->z.spec.kind != COMPRESS_NONE ? compress_allreduce_sum(&s->z, &s->comm, grads, s->n, 0)
                                             : comm_allreduce_sum_shm(&s->comm, grads, s->n);
    return update_with_mean(s, rc, t, step, params, grads, momentum, started);
}

static int ring_step(Strategy *s, float *params, float *grads, float *momentum, int *started, long step) {
    const int64_t t = pd_tl_begin();
    int rc = s->z.spec.kind != COMPRESS_NONE ? compress_allreduce_sum(&s->z, &s->comm, grads, s->n, 1)
                                             : comm_ring_allreduce_sum(&s->comm, grads, s->n, s->scratch);
    return update_with_mean(s, rc, t, step, params, grads, momentum, started);
}

// ---------------------------------------------------------------------------------------------------
// Compressed gradients to one rank (central, ps)

// This rank's payloads of the shards [lo[j], lo[j + 1]) of grads, one after another in the compressor's
// buffer (bytes_at[j]: where shard j's starts; bytes_at[count]: the end), which it returns: NULL out of
// memory. `room`: bytes the buffer holds besides, from bytes_at[count] on.
static char *encode_shards(Strategy *s, const float *grads, const long *lo, int count, size_t room,
                           size_t *bytes_at) {
    bytes_at[0] = 0;
    for (int j = 0; j < count; j++) bytes_at[j + 1] = bytes_at[j] + compress_payload_bytes(&s->z, lo[j], lo[j + 1] - lo[j]);
    char *out = compress_buffer(&s->z, bytes_at[count] + room);
    for (int j = 0; j < count && out != NULL; j++) {
        compress_encode(&s->z, lo[j], grads + lo[j], lo[j + 1] - lo[j], out + bytes_at[j]);
    }
    return out;
}

// sum[0..len) = the sum of `count` payloads of the entries [lo, lo + len), in order: 0. A malformed one
// (another rank's bytes) fails the step with why.
static int decode_sum(Strategy *s, const char *payloads, size_t bytes, int count, long lo, long len, float *sum) {
    if (compress_decode_sum(&s->z, lo, len, payloads, bytes, count, "the compressed gradients", "rank", sum) < 0) {
        return comm_fail(&s->comm, MPI_ERR_OTHER, s->z.refused);
    }
    return 0;
}

// central, compressed: every rank's gradient payload to rank 0 (its own too, encoded where it is), which
// sums them in rank order and updates; the weights go back whole.
static int central_compressed_step(Strategy *s, float *params, float *grads, float *momentum, int *started,
                                   long step) {
    Comm *c = &s->comm;
    int64_t t = pd_tl_begin();
    const int R = c->size;
    const long n = s->n;
    long lo[2] = {0, n};
    size_t at[2];
    const size_t bytes = compress_payload_bytes(&s->z, 0, n);
    // rank 0: every rank's payload, its own first; another rank: its own
    char *all = encode_shards(s, grads, lo, 1, c->rank == 0 ? bytes * (size_t)(R - 1) : 0, at);
    MPI_Request *reqs = malloc(sizeof(MPI_Request) * (size_t)(R + 1));
    int rc = 0;
    if (all == NULL || reqs == NULL) {
        rc = comm_fail(c, MPI_ERR_NO_MEM, "malloc (central's payloads)");
        goto done;
    }
    for (int r = 0; r <= R; r++) reqs[r] = MPI_REQUEST_NULL;
    if (c->rank != 0) {
        if ((rc = comm_isend_bytes(c, all, bytes, 0, TAG_GRADS, &reqs[0])) < 0 ||
            (rc = comm_irecv(c, params, n, 0, TAG_WEIGHTS, &reqs[1])) < 0) {
            comm_park_all(c, 2, reqs);
            goto done;
        }
        rc = comm_waitall(c, 2, reqs);
        goto done;
    }
    for (int r = 1; r < R && rc == 0; r++) {
        rc = comm_irecv_bytes(c, all + (size_t)r * bytes, bytes, r, TAG_GRADS, &reqs[r - 1]);
    }
    rc = rc < 0 ? (comm_park_all(c, R - 1, reqs), rc) : comm_waitall(c, R - 1, reqs);
    if (rc == 0 && (rc = decode_sum(s, all, bytes, R, 0, n, grads)) == 0) {
        if (t) pd_tl_span(t, "sync", "gradient sync", 2, TL_EXCHANGE(s, step));
        t = pd_tl_begin();
        sgd_step_scaled(&s->sgd, 1.0f / (float)R, params, grads, momentum, started, n);
        if (t) pd_tl_span(t, "compute", "update", 0);
        t = pd_tl_begin();
        for (int r = 1; r < R && rc == 0; r++) {
            rc = comm_isend(c, params, n, r, TAG_WEIGHTS, &reqs[r - 1]);
        }
        rc = rc < 0 ? (comm_park_all(c, R - 1, reqs), rc) : comm_waitall(c, R - 1, reqs);
        if (t) pd_tl_span(t, "sync", "weight sync", 1, PD_TL_INT("step", step));
        t = 0;   // recorded
    }
done:
    if (t) pd_tl_span(t, "sync", "gradient sync", 2, TL_EXCHANGE(s, step));   // another rank's whole exchange
    free(reqs);
    return rc;
}

static long ring_scratch(const Strategy *s) {
    return (long)ring_scratch_elements(s->n, s->comm.size);
}

// ---------------------------------------------------------------------------------------------------
// central

// Rank 0 gathers, sums in rank order, updates, and sends the weights back; alone it is plain SGD.
static int central_step(Strategy *s, float *params, float *grads, float *momentum, int *started, long step) {
    Comm *c = &s->comm;
    const int R = c->size;
    const long n = s->n;
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int rc = 0;
    if (s->z.spec.kind != COMPRESS_NONE) {
        return central_compressed_step(s, params, grads, momentum, started, step);
    }
    int64_t t = pd_tl_begin();
    if (R == 1) {
        sgd_step(&s->sgd, params, grads, momentum, started, n);
        if (t) pd_tl_span(t, "compute", "update", 0);
        return 0;
    }
    if (c->rank != 0) {   // one exchange: the gradients out, the weights back
        if ((rc = comm_isend(c, grads, n, 0, TAG_GRADS, &reqs[0])) < 0 ||
            (rc = comm_irecv(c, params, n, 0, TAG_WEIGHTS, &reqs[1])) < 0) {
            comm_park_all(c, 2, reqs);
        } else {
            rc = comm_waitall(c, 2, reqs);
        }
        if (t) pd_tl_span(t, "sync", "gradient sync", 2, TL_EXCHANGE(s, step));
        return rc;
    }
    MPI_Request *many = malloc(sizeof(MPI_Request) * (size_t)(R - 1));
    if (many == NULL) {
        return comm_fail(c, MPI_ERR_NO_MEM, "malloc (central's requests)");
    }
    for (int r = 1; r < R; r++) many[r - 1] = MPI_REQUEST_NULL;
    for (int r = 1; r < R && rc == 0; r++) {
        rc = comm_irecv(c, s->scratch + (long)(r - 1) * n, n, r, TAG_GRADS, &many[r - 1]);
    }
    rc = rc < 0 ? (comm_park_all(c, R - 1, many), rc) : comm_waitall(c, R - 1, many);
    if (rc == 0) {
        for (int r = 1; r < R; r++) {
            const float *g = s->scratch + (long)(r - 1) * n;
            for (long i = 0; i < n; i++) grads[i] += g[i];
        }
        if (t) pd_tl_span(t, "sync", "gradient sync", 2, TL_EXCHANGE(s, step));
        t = pd_tl_begin();
        sgd_step_scaled(&s->sgd, 1.0f / (float)R, params, grads, momentum, started, n);
        if (t) pd_tl_span(t, "compute", "update", 0);
        t = pd_tl_begin();
        for (int r = 1; r < R && rc == 0; r++) {
            rc = comm_isend(c, params, n, r, TAG_WEIGHTS, &many[r - 1]);
        }
        rc = rc < 0 ? (comm_park_all(c, R - 1, many), rc) : comm_waitall(c, R - 1, many);
        if (t) pd_tl_span(t, "sync", "weight sync", 1, PD_TL_INT("step", step));
    }
    free(many);
    return rc;
}

static long central_scratch(const Strategy *s) {   // rank 0 receives every other rank's gradients
    return s->comm.rank == 0 ? (long)(s->comm.size - 1) * s->n : 0;
}

// Rank 0 alone keeps the optimizer state: every rank saves its.
static int central_state(Strategy *s, const float *momentum, float *momentum_out, int *started_out) {
    (void)momentum;
    int rc = comm_bcast(&s->comm, momentum_out, s->n, 0);
    return rc < 0 ? rc : comm_allreduce_max_int(&s->comm, started_out);
}

// ---------------------------------------------------------------------------------------------------
// ps

// A worker's step: push each server its gradient shard, pull its weight shard (the servers update).
static int ps_step(Strategy *s, float *params, float *grads, float *momentum, int *started, long step) {
    (void)momentum, (void)started;
    const int64_t t = pd_tl_begin();   // all of it is the exchange: the servers update
    Comm *c = &s->comm;
    const int S = s->cfg.servers;
    MPI_Request *reqs = malloc(sizeof(MPI_Request) * (size_t)(2 * S));
    if (reqs == NULL) {
        return comm_fail(c, MPI_ERR_NO_MEM, "malloc (ps requests)");
    }
    int rc = 0;
    // compressed: each shard's payload (encoded here, one block for them all)
    long *lo = malloc(sizeof(long) * (size_t)(S + 1));
    size_t *at = malloc(sizeof(size_t) * (size_t)(S + 1));
    char *payloads = NULL;
    if (lo == NULL || at == NULL) {
        rc = comm_fail(c, MPI_ERR_NO_MEM, "malloc (ps shards)");
        goto done;
    }
    for (int j = 0; j <= S; j++) lo[j] = shard_lo(s->n, S, j);
    if (s->z.spec.kind != COMPRESS_NONE && (payloads = encode_shards(s, grads, lo, S, 0, at)) == NULL) {
        rc = comm_fail(c, MPI_ERR_NO_MEM, "malloc (ps payloads)");
        goto done;
    }
    for (int j = 0; j < 2 * S; j++) reqs[j] = MPI_REQUEST_NULL;
    for (int j = 0; j < S && rc == 0; j++) {
        long len = lo[j + 1] - lo[j];
        rc = payloads != NULL ? comm_isend_bytes(c, payloads + at[j], at[j + 1] - at[j], s->workers + j, TAG_GRADS,
                                                 &reqs[2 * j])
                              : comm_isend(c, grads + lo[j], len, s->workers + j, TAG_GRADS, &reqs[2 * j]);
        if (rc == 0) {
            rc = comm_irecv(c, params + lo[j], len, s->workers + j, TAG_WEIGHTS, &reqs[2 * j + 1]);
        }
    }
    rc = rc < 0 ? (comm_park_all(c, 2 * S, reqs), rc) : comm_waitall(c, 2 * S, reqs);
done:
    if (t) pd_tl_span(t, "sync", "gradient sync", 2, TL_EXCHANGE(s, step));
    free(at);
    free(lo);
    free(reqs);
    return rc;
}

// ps server: one step: every worker's gradient shard, their mean, the update of this shard, and the
// new weights to every worker.
static int ps_serve(Strategy *s, float *params, float *momentum, int *started, long step) {
    int64_t t = pd_tl_begin();
    Comm *c = &s->comm;
    const int W = s->workers;
    const long lo = s->shard_lo, len = s->shard_hi - s->shard_lo;
    MPI_Request *reqs = malloc(sizeof(MPI_Request) * (size_t)W);
    if (reqs == NULL) {
        return comm_fail(c, MPI_ERR_NO_MEM, "malloc (ps server requests)");
    }
    int rc = 0;
    const int compressed = s->z.spec.kind != COMPRESS_NONE;
    const size_t bytes = compressed ? compress_payload_bytes(&s->z, lo, len) : 0;
    char *payloads = compressed ? compress_buffer(&s->z, bytes * (size_t)W) : NULL;
    if (compressed && payloads == NULL) {
        free(reqs);
        return comm_fail(c, MPI_ERR_NO_MEM, "malloc (ps server payloads)");
    }
    for (int w = 0; w < W; w++) reqs[w] = MPI_REQUEST_NULL;
    for (int w = 0; w < W && rc == 0; w++) {
        rc = compressed ? comm_irecv_bytes(c, payloads + (size_t)w * bytes, bytes, w, TAG_GRADS, &reqs[w])
                        : comm_irecv(c, s->scratch + (long)w * len, len, w, TAG_GRADS, &reqs[w]);
    }
    rc = rc < 0 ? (comm_park_all(c, W, reqs), rc) : comm_waitall(c, W, reqs);
    if (rc == 0 && compressed) {
        rc = decode_sum(s, payloads, bytes, W, lo, len, s->scratch);
    }
    if (rc == 0) {
        float *sum = s->scratch;  // worker 0's shard, then the others added in worker order
        for (int w = 1; w < W && !compressed; w++) {
            const float *g = s->scratch + (long)w * len;
            for (long i = 0; i < len; i++) sum[i] += g[i];
        }
        if (t) pd_tl_span(t, "sync", "gradient sync", 2, TL_EXCHANGE(s, step));
        t = pd_tl_begin();
        sgd_step_scaled(&s->sgd, 1.0f / (float)W, params + lo, sum, momentum + lo, started, len);
        if (t) pd_tl_span(t, "compute", "update", 0);
        t = pd_tl_begin();
        for (int w = 0; w < W && rc == 0; w++) {
            rc = comm_isend(c, params + lo, len, w, TAG_WEIGHTS, &reqs[w]);
        }
        rc = rc < 0 ? (comm_park_all(c, W, reqs), rc) : comm_waitall(c, W, reqs);
        if (t) pd_tl_span(t, "sync", "weight sync", 1, PD_TL_INT("step", step));
    }
    free(reqs);
    return rc;
}

static long ps_scratch(const Strategy *s) {   // a server receives every worker's gradient shard
    return s->server ? (long)s->workers * (s->shard_hi - s->shard_lo) : 0;
}

// The workers hold every shard after each pull; rank 0 (a worker) tells the servers.
static int ps_weights(Strategy *s, const float *params, float *out) {
    for (long i = 0; i < s->n; i++) out[i] = params[i];
    return comm_bcast(&s->comm, out, s->n, 0);
}

// The momentum lives on the servers, a shard each: gather it to every rank.
static int ps_state(Strategy *s, const float *momentum, float *momentum_out, int *started_out) {
    (void)momentum;
    int rc = comm_gather_shards(&s->comm, momentum_out, momentum_out, s->n, s->cfg.servers, TAG_STATE);
    if (rc == 0) rc = comm_allreduce_max_int(&s->comm, started_out);
    return rc;
}

// ---------------------------------------------------------------------------------------------------
// The tables

const StrategyHooks allreduce_hooks = {.compresses = "gradients", .step = allreduce_step};
const StrategyHooks ring_hooks = {.compresses = "gradients", .scratch_len = ring_scratch, .step = ring_step};
const StrategyHooks central_hooks = {.compresses = "gradients", .scratch_len = central_scratch, .step = central_step,
                                     .state = central_state};
const StrategyHooks ps_hooks = {.compresses = "gradients", .scratch_len = ps_scratch, .step = ps_step,
                                .serve = ps_serve, .weights = ps_weights,
                                .state = ps_state};
