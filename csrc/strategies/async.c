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
 * Under cfg.survive (PYDIST_SURVIVE, issue 27) a worker may die mid-call: its servers learn it from
 * liveness.c within a second (comm_waitany_or_departure), stop serving it, and server 0 hands the block
 * it had not finished to the next worker that asks. So that a block freed late still finds a taker,
 * server 0 then holds back a worker's empty grant until no live worker holds a block. At the end of
 * the call server 0 tells every rank which workers it went on without (the one word all agree on);
 * the Trainer then carries on with a communicator of the survivors (engine.py).
 * On the timeline a worker's step records "update" (its local SGD step) and, when its block is done,
 * one "server exchange" per server (cat "strategy", args server: the server's rank in the group; the
 * worker does not know its staleness, so none); a server records each push it serves as "serve" (args
 * worker: the worker's rank, staleness: the server's updates between that worker's pull and this push).
 * Every kind's hooks are the one table at the end (hooks.h); the communication is comm.c's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"
#include "compress/compress.h"
#include "engine/sgd.h"
#include "hooks.h"

enum { TAG_CENTER = 4, TAG_EXCHANGE = 5, TAG_REPLY = 6, TAG_DONE = 7, TAG_GRANT = 8, TAG_DEAD = 9 };

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
        s->reqs = malloc(sizeof(MPI_Request) * (size_t)(3 * W + s->cfg.servers));   // receives, replies, grants, words
        s->grants = malloc(sizeof(long long) * (size_t)(2 * W));
        s->pulled_at = calloc((size_t)W, sizeof(long long));
        s->held = malloc(sizeof(long long) * (size_t)(4 * W));   // held, then orphans
        s->waiting = calloc((size_t)W, sizeof(int));
        s->dead = calloc((size_t)W, sizeof(int));
        s->noticed = calloc((size_t)W, sizeof(double));
        s->orphans = s->held != NULL ? s->held + 2 * W : NULL;
        if (s->reqs != NULL) {
            for (long i = 0; i < 3 * W + s->cfg.servers; i++) s->reqs[i] = MPI_REQUEST_NULL;
        }
        return s->replies && s->reqs && s->grants && s->pulled_at && s->held && s->waiting && s->dead && s->noticed
                   ? 0 : -2;
    }
    s->base = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    s->reqs = malloc(sizeof(MPI_Request) * (size_t)(2 * s->cfg.servers + 1));   // + server 0's grant
    s->grants = malloc(sizeof(long long) * 2);
    s->dead = calloc((size_t)s->workers, sizeof(int));
    return s->base && s->reqs && s->grants && s->dead ? 0 : -2;
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
    free(s->held);
    free(s->waiting);
    free(s->dead);
    free(s->noticed);
    s->base = s->replies = s->known = NULL;
    s->reqs = NULL;
    s->pulled_at = s->grants = s->held = s->orphans = NULL;
    s->waiting = s->dead = NULL;
    s->noticed = NULL;
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

// Server 0's word on which workers a call went on without: s->dead, W ints, to `peer` or from server 0
// (not counted: it is not the training's traffic).
static int dead_post(Strategy *s, int peer, int send, MPI_Request *req) {
    Comm *c = &s->comm;
    c->lock(c->ctx);
    int rc = send ? MPI_Isend(s->dead, s->workers, MPI_INT, peer, TAG_DEAD, c->comm, req)
                  : MPI_Irecv(s->dead, s->workers, MPI_INT, peer, TAG_DEAD, c->comm, req);
    c->unlock(c->ctx);
    return rc != MPI_SUCCESS ? comm_fail(c, rc, send ? "MPI_Isend (the dead workers)" : "MPI_Irecv (the dead workers)")
                             : 0;
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
    int64_t t = pd_tl_begin();   // the first server's span holds the making of the message too
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
    // The servers' replies in turn (server 0's with its grant): on the timeline each server's exchange
    // runs from the end of the one before to its reply, so that they never overlap.
    for (int j = 0; j < S && rc == 0; j++) {
        if ((rc = comm_waitall(c, 2, &s->reqs[2 * j])) == 0 && j == 0) {
            rc = comm_wait(c, &s->reqs[2 * S]);
        }
        if (t) {
            const int64_t t1 = pd_tl_clock();
            pd_tl_span_to(t, t1, "strategy", "server exchange", 1, PD_TL_INT("server", s->workers + j));
            t = t1;
        }
    }
    if (rc < 0) {
        comm_park_all(c, 2 * S + 1, s->reqs);   // (the failed wait parked its own; null ones are skipped)
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
    SgdConfig sgd = s->sgd;
    if (s->cfg.kind == STRATEGY_AEASGD && sgd.momentum > 0.0f) {
        sgd.nesterov = 1;   // EAMSGD
    }
    const int64_t t = pd_tl_begin();
    sgd_step(&sgd, params, grads, momentum, started, s->n);
    if (t) pd_tl_span(t, "compute", "update", 0);
    if (s->block_pos != s->block_end) {
        return 0;
    }
    pd_activity("server exchange", step);
    return exchange(s, params);
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
    rc = rc < 0 ? (comm_park_all(c, S, s->reqs), rc) : comm_waitall(c, S, s->reqs);
    if (rc == 0 && s->cfg.survive && (rc = dead_post(s, s->workers, 0, &s->reqs[0])) == 0) {
        rc = comm_waitall(c, 1, s->reqs);   // after every worker's DONE: server 0's word on the dead
    }
    return rc;
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

// The next worker still to be served after w, round the ring (w itself when it is the only one): not
// done (DONE, or dead) and not waiting for a grant held back.
static int next_running(const int *done, const int *waiting, int W, int w) {
    for (int k = 1; k <= W; k++) {
        int v = (w + k) % W;
        if (!done[v] && !waiting[v]) return v;
    }
    return w;
}

// Server 0: the next block to hand out, a dead worker's first; 0 when none is left ([end, end)).
static int take_block(Strategy *s, long long *lo, long long *hi) {
    if (s->orphan_count > 0) {
        s->orphan_count--;
        *lo = s->orphans[2 * s->orphan_count], *hi = s->orphans[2 * s->orphan_count + 1];
        s->regranted += *hi - *lo;
        return 1;
    }
    *lo = s->next_block;
    *hi = s->next_block + s->cfg.window < s->call_end ? s->next_block + s->cfg.window : s->call_end;
    s->next_block = *hi;
    return *hi > *lo;
}

// Server 0: grant [lo, hi) to worker w (the block it now holds).
static int grant(Strategy *s, int w, long long lo, long long hi) {
    long long *g = s->grants + 2 * w;
    g[0] = lo, g[1] = hi;
    s->held[2 * w] = lo, s->held[2 * w + 1] = hi;
    s->waiting[w] = 0;
    return grant_post(&s->comm, g, w, 1, &s->reqs[2 * s->workers + w]);
}

// Server 0 under cfg.survive: blocks come free (a worker died) or run out: hand the dead workers' blocks
// to the workers waiting, and once no live worker holds a block, release the waiting with empty grants.
static int hand_out(Strategy *s, const int *done) {
    const int W = s->workers;
    int rc = 0;
    for (int v = 0; v < W && rc == 0; v++) {
        long long lo, hi;
        if (s->waiting[v] && s->orphan_count > 0 && take_block(s, &lo, &hi)) {
            rc = grant(s, v, lo, hi);
        }
    }
    int holding = 0;
    for (int v = 0; v < W; v++) holding |= !done[v] && !s->waiting[v] && s->held[2 * v + 1] > s->held[2 * v];
    for (int v = 0; v < W && rc == 0 && !holding; v++) {
        if (s->waiting[v]) rc = grant(s, v, s->call_end, s->call_end);
    }
    return rc;
}

// Under cfg.survive: the workers that have left since the last look. Their requests are given up, and
// server 0 takes back the block each held. Returns how many departures are now handled.
static int bury(Strategy *s, int *done, int *running, int handled) {
    Comm *c = &s->comm;
    const int W = s->workers, granting = c->rank == W;
    for (int v = 0; v < W; v++) {
        if (s->dead[v] || !comm_left(c, v)) {
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s->noticed[v] = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
        s->dead[v] = 1;
        handled++;
        if (!done[v]) {
            done[v] = 1;
            (*running)--;
        }
        for (int k = 0; k < 3; k++) comm_abandon(c, &s->reqs[k * W + v]);   // its receive, reply, grant
        if (granting && s->held[2 * v + 1] > s->held[2 * v]) {   // the block it had not finished
            s->orphans[2 * s->orphan_count] = s->held[2 * v];
            s->orphans[2 * s->orphan_count + 1] = s->held[2 * v + 1];
            s->orphan_count++;
            s->held[2 * v] = s->held[2 * v + 1] = 0;
        }
        s->waiting[v] = 0;
    }
    return handled;
}

// Serve one train_steps call of steps [first, last): every worker's exchanges until every worker's
// DONE; server 0 also grants the next block with each reply.
static int async_serve_call(Strategy *s, float *params, int first, int last) {
    Comm *c = &s->comm;
    const int W = s->workers, granting = c->rank == W, survive = s->cfg.survive;
    const long len = s->shard_hi - s->shard_lo;
    float *center = params + s->shard_lo;
    MPI_Request *recvs = s->reqs, *sends = s->reqs + W, *grant_sends = s->reqs + 2 * W;
    s->call_end = (long long)last * W;   // the first blocks are fixed: the hand-out starts after them
    s->next_block = (long long)first * W + (long long)W * s->cfg.window;
    if (s->next_block > s->call_end) s->next_block = s->call_end;
    for (int v = 0; v < W; v++) {
        first_block((long long)first * W, s->call_end, s->cfg.window, v, &s->held[2 * v], &s->held[2 * v + 1]);
        s->waiting[v] = s->dead[v] = 0;
        s->noticed[v] = 0.0;
    }
    s->orphan_count = 0;
    s->batches_done = s->regranted = 0;
    s->call_batches = s->call_end - (long long)first * W;
    int *done = calloc((size_t)W, sizeof(int));
    if (done == NULL) {
        return comm_fail(c, MPI_ERR_NO_MEM, "malloc (the server's workers)");
    }
    int rc = 0, running = W, w = 0, handled = 0;
    const double since = comm_now();   // a worker that leaves mid-call is named 2 s later, however busy we are
    const int compressed = s->payloads != NULL;
    for (int v = 0; v < W && rc == 0; v++) {
        rc = receive(s, v, len, &recvs[v]);
    }
    while (rc == 0 && running > 0) {
        MPI_Status status;
        int got = -1;
        // deterministic: wait for worker w itself; otherwise whichever arrives first, looking from w
        int n = s->cfg.deterministic ? 1 : W, from = s->cfg.deterministic ? 0 : w;
        MPI_Request *watched = s->cfg.deterministic ? &recvs[w] : recvs;
        rc = survive ? comm_waitany_or_departure(c, n, watched, from, &got, &status, since, handled)
                     : comm_waitany(c, n, watched, from, &got, &status, since);
        if (rc < 0) {
            break;
        }
        if (got < 0 && !survive) {
            break;   // (every request null: not reached while a worker runs)
        }
        if (got < 0) {   // a worker has left: carry on without it
            handled = bury(s, done, &running, handled);
            if (granting) rc = hand_out(s, done);
            w = done[w] || s->waiting[w] ? next_running(done, s->waiting, W, w) : w;
            continue;
        }
        if (!s->cfg.deterministic) w = got;
        if (status.MPI_TAG == TAG_DONE) {
            done[w] = 1;
            running--;
        } else {
            const int64_t t = pd_tl_begin();
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
                char why[160];
                if (compress_payload_check(&s->z, s->shard_lo, len, payload, s->payload_bytes, why, sizeof why) < 0) {
                    snprintf(s->z.refused, sizeof s->z.refused, "a compressed push (worker rank %d sent a "
                             "malformed payload: %s)", w, why);
                    rc = comm_fail(c, MPI_ERR_OTHER, s->z.refused);
                    break;
                }
                compress_decode_add_checked(&s->z, s->shard_lo, payload, len, 1.0f, in);
            }
            long long staleness = s->updates - s->pulled_at[w];
            apply(s, center, in, out, len, staleness);
            s->updates++;
            s->pulled_at[w] = s->updates;
            s->stats.pushes++;
            s->stats.staleness_sum += staleness;
            if (staleness > s->stats.staleness_max) s->stats.staleness_max = staleness;
            if (granting) {   // w finished its block; the next one (empty once the call's are all handed out)
                long long lo, hi;
                s->batches_done += s->held[2 * w + 1] - s->held[2 * w];
                s->held[2 * w] = s->held[2 * w + 1] = 0;
                if (take_block(s, &lo, &hi) || !survive) {
                    rc = grant(s, w, lo, hi);
                } else {
                    s->waiting[w] = 1;   // held back while another worker's block may come free
                    rc = hand_out(s, done);
                }
            }
            if (rc == 0 && (rc = comm_isend(c, out, len, w, TAG_REPLY, &sends[w])) == 0) {
                rc = receive(s, w, len, &recvs[w]);
            }
            if (t) pd_tl_span(t, "strategy", "serve", 2, PD_TL_INT("worker", w), PD_TL_INT("staleness", staleness));
        }
        w = next_running(done, s->waiting, W, w);
    }
    if (rc == 0) {
        rc = comm_waitall(c, 2 * W, sends);   // (a dead worker's were given up: null)
    }
    for (int v = 0; v < W && rc == 0 && survive; v++) {   // server 0's word on the dead, to every rank
        if (granting && !s->dead[v]) {
            rc = dead_post(s, v, 1, &sends[v]);
        }
    }
    MPI_Request *words = s->reqs + 3 * W;   // server 0's to the other servers
    for (int j = 1; j < s->cfg.servers && rc == 0 && survive; j++) {
        rc = granting ? dead_post(s, W + j, 1, &words[j]) : 0;
    }
    if (rc == 0 && survive && !granting) {
        rc = dead_post(s, W, 0, &words[0]);
    }
    if (rc == 0 && survive && (rc = comm_waitall(c, 2 * W, sends)) == 0) {
        rc = comm_waitall(c, s->cfg.servers, words);
    }
    if (rc < 0) {
        comm_park_all(c, 3 * W + s->cfg.servers, s->reqs);   // (a post of the word failed: what was posted)
    }
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
