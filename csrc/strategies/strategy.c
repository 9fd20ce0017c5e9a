/*
 * strategy.c: the table of strategies (strategy.h) and the counted communication they share. Each
 * helper takes the caller's lock around its MPI calls and adds what it sends to comm.count and the
 * time it spent to comm.seconds, so every strategy reports its cost the same way.
 */
#include "strategy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// sync.c and averaging.c
int sync_step(Strategy *s, float *params, float *grads, float *momentum, int *started, long step);
int ps_serve(Strategy *s, float *params, float *momentum, int *started, long step);
int ps_weights(Strategy *s, const float *params, float *out);
int ps_state(Strategy *s, float *momentum_out, int *started_out);
int average_step(Strategy *s, float *params, float *grads, float *momentum, int *started, long step);
int average_weights(Strategy *s, const float *params, float *out);
int easgd_step(Strategy *s, float *params, float *grads, float *momentum, int *started, long step);
// async.c
int async_create(Strategy *s);
void async_free(Strategy *s);
int async_step(Strategy *s, float *params, float *grads, float *momentum, int *started, long step);
void async_begin_call(Strategy *s, int first, int last);
int async_next_batch(Strategy *s, long *batch_index);
int async_end_call(Strategy *s);
int async_serve_call(Strategy *s, float *params, int first, int last);
int async_state(Strategy *s, float *momentum_out, int *started_out);
void async_restore(Strategy *s, const float *params);
// pipeline.c
int pipeline_create(Strategy *s, const Model *m, char *err, size_t errlen);
void pipeline_free(Strategy *s);
int pipeline_gather(Strategy *s, const float *src, float *out);

static const char *const NAMES[STRATEGY_KINDS] = {"allreduce", "ring", "central", "ps", "average", "easgd",
                                                   "downpour", "adag", "aeasgd", "dynsgd", "pipeline"};

enum { TAG_CENTER = 4 };   // sync.c uses 1-3, async.c 5-8, pipeline.c 9-11

int strategy_kind_of(const char *name) {
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        if (strcmp(name, NAMES[k]) == 0) return k;
    }
    return -1;
}

const char *strategy_name(StrategyKind kind) {
    return kind >= 0 && kind < STRATEGY_KINDS ? NAMES[kind] : "?";
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int strategy_create(Strategy *s, const StrategyConfig *cfg, const SgdConfig *sgd, Comm comm, const Model *model,
                    char *err, size_t errlen) {
    const long n = model->num_params;
    const float *params = model->params;
    *s = (Strategy){.cfg = *cfg, .sgd = *sgd, .comm = comm, .n = n, .workers = comm.size};
    const int R = comm.size;
    if (strategy_has_servers(cfg->kind)) {
        if (cfg->servers < 1 || cfg->servers >= R) {
            snprintf(err, errlen, "strategy '%s' with %d server(s) needs more ranks than servers (at least one "
                     "worker); the group has %d", NAMES[cfg->kind], cfg->servers, R);
            return -1;
        }
        if (cfg->servers > n) {
            snprintf(err, errlen, "strategy '%s': %d servers but only %ld parameters to shard", NAMES[cfg->kind],
                     cfg->servers, n);
            return -1;
        }
        s->workers = R - cfg->servers;
        if (strategy_is_server(s)) {
            int j = comm.rank - s->workers;
            s->shard_lo = shard_lo(n, cfg->servers, j);
            s->shard_hi = shard_lo(n, cfg->servers, j + 1);
        }
    }
    if (strategy_is_async(cfg->kind) && cfg->window < 1) {
        snprintf(err, errlen, "strategy '%s': the window must be >= 1; got %d", NAMES[cfg->kind], cfg->window);
        return -1;
    }
    if ((cfg->kind == STRATEGY_AVERAGE || cfg->kind == STRATEGY_EASGD) && cfg->period < 1) {
        snprintf(err, errlen, "strategy '%s': the period must be >= 1; got %d", NAMES[cfg->kind], cfg->period);
        return -1;
    }
    if (cfg->kind == STRATEGY_PIPELINE && pipeline_create(s, model, err, errlen) < 0) {
        strategy_free(s);
        return -1;
    }
    s->cfg.split = NULL;   // the caller's: the pipeline has taken what it needs
    long scratch = 0;
    switch (cfg->kind) {
        case STRATEGY_RING: scratch = (long)ring_scratch_elements(n, R); break;
        case STRATEGY_CENTRAL: scratch = comm.rank == 0 ? (long)(R - 1) * n : 0; break;
        case STRATEGY_PS:
            scratch = strategy_is_server(s) ? (long)s->workers * (s->shard_hi - s->shard_lo) : 0;
            break;
        case STRATEGY_AVERAGE: scratch = n; break;
        case STRATEGY_EASGD: scratch = n; break;
        default: break;
    }
    s->scratch_len = scratch;
    s->scratch = calloc(scratch > 0 ? (size_t)scratch : 1, sizeof(float));
    if (cfg->kind == STRATEGY_EASGD) {
        s->center = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    }
    if (s->scratch == NULL || (cfg->kind == STRATEGY_EASGD && s->center == NULL) ||
        (strategy_is_async(cfg->kind) && async_create(s) < 0)) {
        strategy_free(s);
        snprintf(err, errlen, "out of memory for strategy '%s' on %ld parameters", NAMES[cfg->kind], n);
        return -1;
    }
    strategy_restore(s, params);
    return 0;
}

void strategy_free(Strategy *s) {
    free(s->scratch);
    free(s->center);
    s->scratch = s->center = NULL;
    async_free(s);
    pipeline_free(s);
}

int strategy_is_async(StrategyKind kind) {
    return kind == STRATEGY_DOWNPOUR || kind == STRATEGY_ADAG || kind == STRATEGY_AEASGD || kind == STRATEGY_DYNSGD;
}

int strategy_has_servers(StrategyKind kind) {
    return kind == STRATEGY_PS || strategy_is_async(kind);
}

int strategy_is_server(const Strategy *s) {
    return strategy_has_servers(s->cfg.kind) && s->comm.rank >= s->workers;
}

int strategy_worker_rank(const Strategy *s) {
    if (s->cfg.kind == STRATEGY_PIPELINE) return s->comm.rank % s->workers;   // the replica: its data shard
    return s->comm.rank;  // ps puts its servers last, so workers keep their ranks
}

int strategy_step(Strategy *s, float *params, float *grads, float *momentum, int *started, long step) {
    switch (s->cfg.kind) {
        case STRATEGY_AVERAGE: return average_step(s, params, grads, momentum, started, step);
        case STRATEGY_EASGD: return easgd_step(s, params, grads, momentum, started, step);
        default:
            if (strategy_is_async(s->cfg.kind)) return async_step(s, params, grads, momentum, started, step);
            return sync_step(s, params, grads, momentum, started, step);
    }
}

void strategy_begin_call(Strategy *s, int first, int last) {
    async_begin_call(s, first, last);
}

int strategy_next_batch(Strategy *s, long *batch_index) {
    return async_next_batch(s, batch_index);
}

int strategy_end_call(Strategy *s) {
    return async_end_call(s);
}

int strategy_serve_call(Strategy *s, float *params, int first, int last) {
    return async_serve_call(s, params, first, last);
}

int strategy_serve(Strategy *s, float *params, float *momentum, int *started, long step) {
    return ps_serve(s, params, momentum, started, step);
}

int strategy_weights(Strategy *s, const float *params, float *out) {
    switch (s->cfg.kind) {
        case STRATEGY_PS: return ps_weights(s, params, out);
        case STRATEGY_PIPELINE: return pipeline_gather(s, params, out);
        case STRATEGY_AVERAGE: return average_weights(s, params, out);
        case STRATEGY_EASGD: memcpy(out, s->center, sizeof(float) * (size_t)s->n); return 0;
        case STRATEGY_DOWNPOUR:
        case STRATEGY_ADAG:
        case STRATEGY_AEASGD:
        case STRATEGY_DYNSGD:  // the center, a shard on each server
            return comm_gather_shards(&s->comm, params, out, s->n, s->cfg.servers, TAG_CENTER);
        default: memcpy(out, params, sizeof(float) * (size_t)s->n); return 0;  // every rank holds the same
    }
}

int strategy_state(Strategy *s, const float *params, const float *momentum, int started, float *params_out,
                   float *momentum_out, int *started_out) {
    int rc = strategy_weights(s, params, params_out);
    if (rc < 0) {
        return rc;
    }
    memcpy(momentum_out, momentum, sizeof(float) * (size_t)s->n);
    *started_out = started;
    switch (s->cfg.kind) {
        case STRATEGY_PS: return ps_state(s, momentum_out, started_out);
        case STRATEGY_PIPELINE:  // each stage holds its slice's momentum; every stage has started alike
            return pipeline_gather(s, momentum, momentum_out);
        case STRATEGY_CENTRAL:  // rank 0 alone keeps the optimizer state
            if ((rc = comm_bcast(&s->comm, momentum_out, s->n, 0)) < 0) return rc;
            return comm_allreduce_max_int(&s->comm, started_out);
        case STRATEGY_AVERAGE:
        case STRATEGY_EASGD:  // the workers' momenta differ: save their mean, as the weights' mean
            if ((rc = comm_allreduce_sum(&s->comm, momentum_out, s->n)) < 0) return rc;
            for (long i = 0; i < s->n; i++) momentum_out[i] /= (float)s->comm.size;
            return comm_allreduce_max_int(&s->comm, started_out);
        default:
            return strategy_is_async(s->cfg.kind) ? async_state(s, momentum_out, started_out) : 0;
    }
}

void strategy_restore(Strategy *s, const float *params) {
    if (s->center != NULL) {
        memcpy(s->center, params, sizeof(float) * (size_t)s->n);
    }
    if (strategy_is_async(s->cfg.kind)) {
        async_restore(s, params);
    }
}

// ---------------------------------------------------------------------------------------------------
// Counted communication

int comm_fail(Comm *c, int rc, const char *call) {
    c->mpi_rc = rc;
    c->mpi_call = call;
    return -2;
}

int comm_wait(Comm *c, MPI_Request *req) {
    double t0 = now();
    c->lock(c->ctx);
    int rc = c->wait(req, c->ctx);
    c->unlock(c->ctx);
    c->seconds += now() - t0;
    return rc;
}

int comm_waitall(Comm *c, int n, MPI_Request *reqs) {
    for (int i = 0; i < n; i++) {
        if (comm_wait(c, &reqs[i]) < 0) {
            c->lock(c->ctx);  // the failed wait parked its own request; the rest are parked here
            for (int j = i + 1; j < n; j++) {
                if (reqs[j] != MPI_REQUEST_NULL) c->park(&reqs[j], c->ctx);
            }
            c->unlock(c->ctx);
            return -1;
        }
    }
    return 0;
}

double comm_now(void) {
    return MPI_Wtime();
}

int comm_waitany(Comm *c, int n, MPI_Request *reqs, int first, int *index, MPI_Status *status, double since) {
    double t0 = now();
    c->lock(c->ctx);
    int rc = c->waitany(n, reqs, first, index, status, since, c->ctx);
    c->unlock(c->ctx);
    c->seconds += now() - t0;
    return rc;
}

void comm_park_all(Comm *c, int n, MPI_Request *reqs) {
    c->lock(c->ctx);
    for (int i = 0; i < n; i++) {
        if (reqs[i] != MPI_REQUEST_NULL) c->park(&reqs[i], c->ctx);
    }
    c->unlock(c->ctx);
}

long shard_lo(long n, int servers, int j) {
    return j * (n / servers) + (j < n % servers ? j : n % servers);
}

// Rank 0 (a worker) receives each server's shard of src, then broadcasts the whole.
int comm_gather_shards(Comm *c, const float *src, float *out, long n, int servers, int tag) {
    const int W = c->size - servers;
    int rc = 0;
    if (c->rank == 0 || c->rank >= W) {
        MPI_Request *reqs = malloc(sizeof(MPI_Request) * (size_t)servers);
        if (reqs == NULL) {
            return comm_fail(c, MPI_ERR_NO_MEM, "malloc (gathering shards)");
        }
        int posts = c->rank == 0 ? servers : 1;
        for (int j = 0; j < posts; j++) reqs[j] = MPI_REQUEST_NULL;
        for (int j = 0; j < posts && rc == 0; j++) {
            int server = c->rank == 0 ? j : c->rank - W;
            long lo = shard_lo(n, servers, server), len = shard_lo(n, servers, server + 1) - lo;
            rc = c->rank == 0 ? comm_irecv(c, out + lo, len, W + server, tag, &reqs[j])
                              : comm_isend(c, src + lo, len, 0, tag, &reqs[j]);
        }
        rc = rc < 0 ? (comm_park_all(c, posts, reqs), rc) : comm_waitall(c, posts, reqs);
        free(reqs);
    }
    return rc == 0 ? comm_bcast(c, out, n, 0) : rc;
}

int comm_isend(Comm *c, const float *buf, long n, int dst, int tag, MPI_Request *req) {
    double t0 = now();
    c->lock(c->ctx);
    int rc = MPI_Isend_c(buf, (MPI_Count)n, MPI_FLOAT, dst, tag, c->comm, req);
    c->unlock(c->ctx);
    c->seconds += now() - t0;
    if (rc != MPI_SUCCESS) {
        return comm_fail(c, rc, "MPI_Isend_c");
    }
    c->count.bytes_sent += (long long)n * (long long)sizeof(float);
    c->count.messages++;
    return 0;
}

int comm_irecv(Comm *c, float *buf, long n, int src, int tag, MPI_Request *req) {
    double t0 = now();
    c->lock(c->ctx);
    int rc = MPI_Irecv_c(buf, (MPI_Count)n, MPI_FLOAT, src, tag, c->comm, req);
    c->unlock(c->ctx);
    c->seconds += now() - t0;
    return rc != MPI_SUCCESS ? comm_fail(c, rc, "MPI_Irecv_c") : 0;
}

static int collective(Comm *c, MPI_Request *req, int rc, const char *call) {
    if (rc != MPI_SUCCESS) {
        c->unlock(c->ctx);
        return comm_fail(c, rc, call);
    }
    rc = c->wait(req, c->ctx);
    c->unlock(c->ctx);
    return rc;
}

int comm_allreduce_sum(Comm *c, float *buf, long n) {
    const int R = c->size;
    if (R == 1) return 0;
    MPI_Request req = MPI_REQUEST_NULL;
    double t0 = now();
    c->lock(c->ctx);
    int rc = collective(c, &req, MPI_Iallreduce_c(MPI_IN_PLACE, buf, (MPI_Count)n, MPI_FLOAT, MPI_SUM, c->comm, &req),
                        "MPI_Iallreduce_c");
    c->seconds += now() - t0;
    c->count.bytes_sent += 2LL * (R - 1) * (long long)n * (long long)sizeof(float) / R;
    c->count.messages += 2 * (R - 1);
    return rc;
}

int comm_allreduce_sum_shm(Comm *c, float *buf, long n) {
    const int R = c->size;
    if (R == 1 || c->shm_allreduce == NULL) {
        return comm_allreduce_sum(c, buf, n);
    }
    double t0 = now();
    c->lock(c->ctx);
    int done = c->shm_allreduce(buf, n, c->ctx);
    c->unlock(c->ctx);
    if (done == 0) {
        return comm_allreduce_sum(c, buf, n);   // not usable here (the same answer on every rank)
    }
    c->seconds += now() - t0;
    c->count.bytes_sent += 2LL * (R - 1) * (long long)n * (long long)sizeof(float) / R;   // as MPI's is counted
    c->count.messages += 2 * (R - 1);
    return done < 0 ? -1 : 0;
}

int comm_ring_allreduce_sum(Comm *c, float *buf, long n, float *tmp) {
    if (c->size == 1) return 0;
    int mpi_rc = MPI_SUCCESS;
    const char *call = NULL;
    double t0 = now();
    c->lock(c->ctx);
    int rc = ring_allreduce(buf, (MPI_Count)n, MPI_FLOAT, MPI_SUM, c->comm, 0, tmp, &c->count, c->wait, c->ctx,
                            &mpi_rc, &call);
    c->unlock(c->ctx);
    c->seconds += now() - t0;
    return rc == -2 ? comm_fail(c, mpi_rc, call) : rc;
}

int comm_allreduce_max_int(Comm *c, int *value) {
    if (c->size == 1) return 0;
    MPI_Request req = MPI_REQUEST_NULL;
    double t0 = now();
    c->lock(c->ctx);
    int rc = collective(c, &req, MPI_Iallreduce(MPI_IN_PLACE, value, 1, MPI_INT, MPI_MAX, c->comm, &req),
                        "MPI_Iallreduce");
    c->seconds += now() - t0;
    return rc;
}

int comm_bcast(Comm *c, float *buf, long n, int root) {
    if (c->size == 1) return 0;
    MPI_Request req = MPI_REQUEST_NULL;
    double t0 = now();
    c->lock(c->ctx);
    int rc = collective(c, &req, MPI_Ibcast_c(buf, (MPI_Count)n, MPI_FLOAT, root, c->comm, &req), "MPI_Ibcast_c");
    c->seconds += now() - t0;
    if (c->rank == root) {
        c->count.bytes_sent += (long long)(c->size - 1) * (long long)n * (long long)sizeof(float);
        c->count.messages += c->size - 1;
    }
    return rc;
}
