/*
 * async.c: the asynchronous strategies. The last S ranks are servers, each owning a contiguous shard
 * of the center variable (kept in its own engine's params); the R - S workers train on their own and,
 * every `window` steps, exchange with every server (one message each way per server):
 *   downpour  push the update accumulated over the window (weights now - weights at the last pull),
 *             which the server adds to the center; pull the center;
 *   adag      the same, the server adding the accumulated update divided by the window (Hermans'
 *             accumulated gradient normalisation);
 *   dynsgd    the same, the server dividing each push by its staleness + 1 (its updates since this
 *             worker's last pull + 1);
 *   aeasgd    elastic averaging: the worker sends its weights, the server computes e = alpha (worker -
 *             center) against its center now, adds e and replies e; the worker moves by -e. With
 *             momentum the workers step with Nesterov momentum (EAMSGD).
 * Work is handed out, not divided: a call's batches (steps x workers of them) go in blocks of `window`
 * batches, the first block of each worker fixed, every later one granted by server 0 in the reply to
 * an exchange, to whichever worker asks first. A worker exchanges when its block is done, so a slow
 * worker takes fewer blocks and nobody waits for it; the epoch still sees every batch once. When no
 * block is left a worker sends DONE to every server, and a server serves the whole call until every
 * worker's DONE: between calls nothing is posted, so evaluation, checkpoints and MPI_Finalize never
 * meet a pending request.
 * A server pre-posts one receive per worker and serves whichever completes first, looking from the
 * worker after the last one it served (fair: no worker starves another, unlike MPI_ANY_SOURCE), or,
 * deterministic, in a fixed round-robin over the workers still running (a run is bitwise repeatable).
 * Every kind's hooks are the one table at the end (hooks.h); the communication is comm.c's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "compress/compress.h"
#include "engine/sgd.h"
#include "hooks.h"

enum { TAG_CENTER = 4, TAG_EXCHANGE = 5, TAG_REPLY = 6, TAG_DONE = 7, TAG_GRANT = 8 };

// Compressed: where each server's shard starts in a worker's payloads, and their total (payload_at[S]).
// 0, or -2 out of memory.
static int payload_layout(Strategy *s) {
    const int S = s->cfg.servers;
    if ((s->payload_at = malloc(sizeof(size_t) * (size_t)(S + 1))) == NULL) {
        return -2;
    }
    s->payload_at[0] = 0;
    for (int j = 0; j < S; j++) {
        long lo = shard_lo(s->n, S, j), len = shard_lo(s->n, S, j + 1) - lo;
        s->payload_at[j + 1] = s->payload_at[j] + compress_payload_bytes(&s->z, lo, len);
    }
    return 0;
}

// The registry has placed the servers (s->server, the shard); take what this rank keeps besides scratch.
static int async_create(Strategy *s, const Model *m, const char *name, char *err, size_t errlen) {
    (void)m;
    if (s->cfg.window < 1) {
        snprintf(err, errlen, "strategy '%s': the window must be >= 1; got %d", name, s->cfg.window);
        return -1;
    }
    const long n = s->n;
    if (s->server) {
        const long W = s->workers, len = s->shard_hi - s->shard_lo;
        s->replies = malloc(sizeof(float) * (size_t)(W * len > 0 ? W * len : 1));
        s->reqs = malloc(sizeof(MPI_Request) * (size_t)(3 * W));   // receives, replies, grants
        s->grants = malloc(sizeof(long long) * (size_t)(2 * W));
        s->pulled_at = calloc((size_t)W, sizeof(long long));
        if (s->reqs != NULL) {
            for (long i = 0; i < 3 * W; i++) s->reqs[i] = MPI_REQUEST_NULL;
        }
        return s->replies && s->reqs && s->grants && s->pulled_at ? 0 : -2;
    }
    s->base = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    s->reqs = malloc(sizeof(MPI_Request) * (size_t)(2 * s->cfg.servers + 1));   // + server 0's grant
    s->grants = malloc(sizeof(long long) * 2);
    return s->base && s->reqs && s->grants ? 0 : -2;
}

// Compressed (after the registry has made the compressor, which payload sizes need): a worker's payload
// block; a server's receive buffers and, for aeasgd, what it knows of each worker's weights.
static int async_compressed_create(Strategy *s) {
    if (payload_layout(s) < 0) {
        return -2;
    }
    const long W = s->workers, len = s->shard_hi - s->shard_lo;
    if (!s->server) {
        return (s->payloads = malloc(s->payload_at[s->cfg.servers] + 1)) != NULL ? 0 : -2;
    }
    s->payload_bytes = compress_payload_bytes(&s->z, s->shard_lo, len);
    s->payloads = malloc(s->payload_bytes * (size_t)W + 1);
    if (s->cfg.kind == STRATEGY_AEASGD) {
        s->known = malloc(sizeof(float) * (size_t)(W * len > 0 ? W * len : 1));
    }
    return s->payloads != NULL && (s->cfg.kind != STRATEGY_AEASGD || s->known != NULL) ? 0 : -2;
}

// A server's receive buffers, one shard per worker; a worker's message: the accumulated update, or
// aeasgd's reply e.
static long async_scratch(const Strategy *s) {
    return s->server ? (long)s->workers * (s->shard_hi - s->shard_lo) : s->n;
}

static void async_free(Strategy *s) {
    free(s->base);
    free(s->replies);
    free(s->reqs);
    free(s->pulled_at);
    free(s->grants);
    free(s->payloads);
    free(s->payload_at);
    free(s->known);
    s->base = s->replies = s->known = NULL;
    s->reqs = NULL;
    s->pulled_at = s->grants = NULL;
    s->payloads = NULL;
    s->payload_at = NULL;
}

// Every rank holds the same weights (the initial ones, or a checkpoint's center): the center and the
// workers' last pull (and, for compressed aeasgd, what the server knows of every worker's weights).
static void async_restore(Strategy *s, const float *params) {
    if (s->base != NULL) {
        memcpy(s->base, params, sizeof(float) * (size_t)s->n);
    }
    const long len = s->shard_hi - s->shard_lo;
    for (long w = 0; s->known != NULL && w < s->workers; w++) {
        memcpy(s->known + w * len, params + s->shard_lo, sizeof(float) * (size_t)len);
    }
    s->updates = 0;
    if (s->pulled_at != NULL) {
        memset(s->pulled_at, 0, sizeof(long long) * (size_t)s->workers);
    }
}

// A grant: [start, end) of the call's batches, two long longs (counted as sent, like every message).
static int grant_post(Comm *c, long long *grant, int peer, int send, MPI_Request *req) {
    c->lock(c->ctx);
    int rc = send ? MPI_Isend(grant, 2, MPI_LONG_LONG, peer, TAG_GRANT, c->comm, req)
                  : MPI_Irecv(grant, 2, MPI_LONG_LONG, peer, TAG_GRANT, c->comm, req);
    c->unlock(c->ctx);
    if (rc != MPI_SUCCESS) {
        return comm_fail(c, rc, send ? "MPI_Isend (a grant)" : "MPI_Irecv (a grant)");
    }
    if (send) {
        c->count.bytes_sent += 2 * (long long)sizeof(long long);
        c->count.messages++;
    }
    return 0;
}

// The first block of worker w in a call of batches [first, end): the w-th block of `window`.
static void first_block(long long first, long long end, long long window, int w, long long *lo, long long *hi) {
    long long start = first + (long long)w * window;
    *lo = start < end ? start : end;
    *hi = start + window < end ? start + window : end;
}

// ---------------------------------------------------------------------------------------------------
// The worker

static void async_begin_call(Strategy *s, int first, int last) {
    const long long W = s->workers;
    first_block(first * W, last * W, s->cfg.window, s->comm.rank, &s->block_pos, &s->block_end);
}

static int async_next_batch(Strategy *s, long *batch_index) {
    if (s->block_pos >= s->block_end) {
        return 0;
    }
    *batch_index = (long)s->block_pos++;
    return 1;
}

// One exchange with every server: the message out (the accumulated update, or aeasgd's weights), the
// reply in (the center shard into params, or aeasgd's e into scratch), and the next block from server 0.
static int exchange(Strategy *s, float *params) {
    Comm *c = &s->comm;
    const int S = s->cfg.servers, elastic = s->cfg.kind == STRATEGY_AEASGD, compressed = s->payloads != NULL;
    const long n = s->n;
    // the update since the last pull; compressed aeasgd too sends a difference: from its weights after
    // the last exchange (base), what the server knows of them but for this worker's residual
    if (!elastic || compressed) {
        for (long i = 0; i < n; i++) s->scratch[i] = params[i] - s->base[i];
    }
    const float *out = elastic && !compressed ? params : s->scratch;
    float *in = elastic ? s->scratch : params;
    for (int j = 0; j < S && compressed; j++) {
        long lo = shard_lo(n, S, j), len = shard_lo(n, S, j + 1) - lo;
        compress_encode(&s->z, lo, s->scratch + lo, len, s->payloads + s->payload_at[j]);
    }
    for (int j = 0; j < 2 * S + 1; j++) s->reqs[j] = MPI_REQUEST_NULL;
    int rc = grant_post(c, s->grants, s->workers, 0, &s->reqs[2 * S]);
    for (int j = 0; j < S && rc == 0; j++) {
        long lo = shard_lo(n, S, j), len = shard_lo(n, S, j + 1) - lo;
        rc = compressed ? comm_isend_bytes(c, s->payloads + s->payload_at[j], s->payload_at[j + 1] - s->payload_at[j],
                                           s->workers + j, TAG_EXCHANGE, &s->reqs[2 * j])
                        : comm_isend(c, out + lo, len, s->workers + j, TAG_EXCHANGE, &s->reqs[2 * j]);
        if (rc == 0) {
            rc = comm_irecv(c, in + lo, len, s->workers + j, TAG_REPLY, &s->reqs[2 * j + 1]);
        }
    }
    rc = rc < 0 ? (comm_park_all(c, 2 * S + 1, s->reqs), rc) : comm_waitall(c, 2 * S + 1, s->reqs);
    if (rc < 0) {
        return rc;
    }
    s->block_pos = s->grants[0];
    s->block_end = s->grants[1];
    if (elastic) {
        for (long i = 0; i < n; i++) params[i] -= s->scratch[i];
    }
    if (!elastic || compressed) {   // the next difference is from here (the server moved its copy by -e too)
        memcpy(s->base, params, sizeof(float) * (size_t)n);
    }
    s->stats.exchanges++;
    return 0;
}

// A worker's step: a local SGD step, and an exchange when its block of batches is done.
static int async_step(Strategy *s, float *params, float *grads, float *momentum, int *started, long step) {
    (void)step;
    SgdConfig sgd = s->sgd;
    if (s->cfg.kind == STRATEGY_AEASGD && sgd.momentum > 0.0f) {
        sgd.nesterov = 1;   // EAMSGD
    }
    sgd_step(&sgd, params, grads, momentum, started, s->n);
    return s->block_pos == s->block_end ? exchange(s, params) : 0;
}

// The call's last message: DONE (empty) to every server.
static int async_end_call(Strategy *s) {
    Comm *c = &s->comm;
    const int S = s->cfg.servers;
    int rc = 0;
    for (int j = 0; j < S; j++) s->reqs[j] = MPI_REQUEST_NULL;
    for (int j = 0; j < S && rc == 0; j++) {
        rc = comm_isend(c, s->scratch, 0, s->workers + j, TAG_DONE, &s->reqs[j]);
        c->count.messages--;   // not an exchange: counted apart from the training's messages
    }
    return rc < 0 ? (comm_park_all(c, S, s->reqs), rc) : comm_waitall(c, S, s->reqs);
}

// ---------------------------------------------------------------------------------------------------
// The server

// Apply worker w's message (in) to the center shard; the reply (the shard, or e) into out. Compressed
// aeasgd: `in` is what the server knows of the worker's weights, which moves by -e with the worker.
static void apply(Strategy *s, float *center, float *in, float *out, long len, long long staleness) {
    switch (s->cfg.kind) {
        case STRATEGY_AEASGD: {
            const float alpha = s->cfg.beta / (float)s->workers;
            for (long i = 0; i < len; i++) {
                out[i] = alpha * (in[i] - center[i]);
                center[i] += out[i];
            }
            for (long i = 0; i < len && s->known != NULL; i++) in[i] -= out[i];
            return;
        }
        case STRATEGY_ADAG: {
            const float f = 1.0f / (float)s->cfg.window;
            for (long i = 0; i < len; i++) center[i] += in[i] * f;
            break;
        }
        case STRATEGY_DYNSGD: {
            const float f = 1.0f / (float)(staleness + 1);
            for (long i = 0; i < len; i++) center[i] += in[i] * f;
            break;
        }
        default:
            for (long i = 0; i < len; i++) center[i] += in[i];
            break;
    }
    memcpy(out, center, sizeof(float) * (size_t)len);
}

// Post the receive of worker w's next message (an exchange, or DONE): its shard, or compressed its
// payload.
static int receive(Strategy *s, int w, long len, MPI_Request *req) {
    if (s->payloads != NULL) {
        return comm_irecv_bytes(&s->comm, s->payloads + (size_t)w * s->payload_bytes, s->payload_bytes, w,
                                MPI_ANY_TAG, req);
    }
    return comm_irecv(&s->comm, s->scratch + (long)w * len, len, w, MPI_ANY_TAG, req);
}

// The next worker still running after w, round the ring (w itself when it is the only one).
static int next_running(const int *done, int W, int w) {
    for (int k = 1; k <= W; k++) {
        int v = (w + k) % W;
        if (!done[v]) return v;
    }
    return w;
}

// Serve one train_steps call of steps [first, last): every worker's exchanges until every worker's
// DONE; server 0 also grants the next block with each reply.
static int async_serve_call(Strategy *s, float *params, int first, int last) {
    Comm *c = &s->comm;
    const int W = s->workers, granting = c->rank == W;
    const long len = s->shard_hi - s->shard_lo;
    float *center = params + s->shard_lo;
    MPI_Request *recvs = s->reqs, *sends = s->reqs + W, *grant_sends = s->reqs + 2 * W;
    long long unused;
    s->call_end = (long long)last * W;   // the first blocks are fixed: the hand-out starts after them
    first_block((long long)first * W, s->call_end, s->cfg.window, W, &s->next_block, &unused);
    int *done = calloc((size_t)W, sizeof(int));
    if (done == NULL) {
        return comm_fail(c, MPI_ERR_NO_MEM, "malloc (the server's workers)");
    }
    int rc = 0, running = W, w = 0;
    const double since = comm_now();   // a worker that leaves mid-call is named 2 s later, however busy we are
    const int compressed = s->payloads != NULL;
    for (int v = 0; v < W && rc == 0; v++) {
        rc = receive(s, v, len, &recvs[v]);
    }
    while (rc == 0 && running > 0) {
        MPI_Status status;
        int got = -1;
        // deterministic: wait for worker w itself; otherwise whichever arrives first, looking from w
        rc = s->cfg.deterministic ? comm_waitany(c, 1, &recvs[w], 0, &got, &status, since)
                                  : comm_waitany(c, W, recvs, w, &got, &status, since);
        if (rc < 0) {
            break;
        }
        if (!s->cfg.deterministic) w = got;
        if (status.MPI_TAG == TAG_DONE) {
            done[w] = 1;
            running--;
        } else {
            float *in = s->scratch + (long)w * len, *out = s->replies + (long)w * len;
            if ((rc = comm_wait(c, &sends[w])) < 0 || (rc = comm_wait(c, &grant_sends[w])) < 0) {
                break;   // (the last reply to w has left: w has sent again)
            }
            if (compressed) {   // the payload into what the server applies: the update, or aeasgd's weights
                const char *payload = s->payloads + (size_t)w * s->payload_bytes;
                if (s->known != NULL) {
                    in = s->known + (long)w * len;
                } else {
                    memset(in, 0, sizeof(float) * (size_t)len);
                }
                compress_decode_add(&s->z, s->shard_lo, payload, len, 1.0f, in);
            }
            long long staleness = s->updates - s->pulled_at[w];
            apply(s, center, in, out, len, staleness);
            s->updates++;
            s->pulled_at[w] = s->updates;
            s->stats.pushes++;
            s->stats.staleness_sum += staleness;
            if (staleness > s->stats.staleness_max) s->stats.staleness_max = staleness;
            if (granting) {   // the next block: empty once the call's batches are all handed out
                long long *g = s->grants + 2 * w;
                g[0] = s->next_block;
                g[1] = s->next_block + s->cfg.window < s->call_end ? s->next_block + s->cfg.window : s->call_end;
                s->next_block = g[1];
                rc = grant_post(c, g, w, 1, &grant_sends[w]);
            }
            if (rc == 0 && (rc = comm_isend(c, out, len, w, TAG_REPLY, &sends[w])) == 0) {
                rc = receive(s, w, len, &recvs[w]);
            }
        }
        w = next_running(done, W, w);
    }
    rc = rc < 0 ? (comm_park_all(c, 3 * W, s->reqs), rc) : comm_waitall(c, 2 * W, sends);
    free(done);
    return rc;
}

// ---------------------------------------------------------------------------------------------------
// Evaluation and checkpoints

// The center, a shard on each server.
static int async_weights(Strategy *s, const float *params, float *out) {
    return comm_gather_shards(&s->comm, params, out, s->n, s->cfg.servers, TAG_CENTER);
}

// What a checkpoint saves besides the center: the workers' mean momentum (the servers keep none).
static int async_state(Strategy *s, const float *momentum, float *momentum_out, int *started_out) {
    (void)momentum;
    if (s->server) {
        memset(momentum_out, 0, sizeof(float) * (size_t)s->n);
        *started_out = 0;
    }
    int rc = comm_allreduce_sum(&s->comm, momentum_out, s->n);
    for (long i = 0; i < s->n && rc == 0; i++) momentum_out[i] /= (float)s->workers;
    return rc == 0 ? comm_allreduce_max_int(&s->comm, started_out) : rc;
}

// ---------------------------------------------------------------------------------------------------
// The table: downpour, adag, aeasgd and dynsgd alike (apply and exchange tell them apart)

const StrategyHooks async_hooks = {.compresses = "pushed updates", .create = async_create,
                                   .create_compressed = async_compressed_create, .free = async_free, .scratch_len = async_scratch,
                                   .step = async_step, .begin_call = async_begin_call,
                                   .next_batch = async_next_batch, .end_call = async_end_call,
                                   .serve_call = async_serve_call, .weights = async_weights, .state = async_state,
                                   .restore = async_restore};
