/*
 * comm.c: counted communication (comm.h), the helpers every strategy shares. Each takes the caller's
 * lock around its MPI calls and adds what it sends to comm.count and the time it spent to comm.seconds,
 * so every strategy reports its cost the same way. Nothing here knows a strategy: the registry
 * (strategy.c) and the strategy families (sync.c, averaging.c, async.c, pipeline.c) call down into it.
 */
#include "comm.h"

#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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

int comm_waitany_or_departure(Comm *c, int n, MPI_Request *reqs, int first, int *index, MPI_Status *status,
                              double since, int handled) {
    double t0 = now();
    c->lock(c->ctx);
    int rc = c->waitany_or_departure(n, reqs, first, index, status, since, handled, c->ctx);
    c->unlock(c->ctx);
    c->seconds += now() - t0;
    return rc;
}

int comm_left(Comm *c, int rank) {
    c->lock(c->ctx);
    int left = c->left(rank, c->ctx);
    c->unlock(c->ctx);
    return left;
}

void comm_abandon(Comm *c, MPI_Request *req) {
    if (*req == MPI_REQUEST_NULL) {
        return;
    }
    c->lock(c->ctx);
    MPI_Cancel(req);
    MPI_Request_free(req);   // a receive's cancel completes at once; a send to the dead is left to MPI
    c->unlock(c->ctx);
    *req = MPI_REQUEST_NULL;
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

// count items of `type` (bytes of them in all), counted as sent.
static int isend(Comm *c, const void *buf, MPI_Count count, MPI_Datatype type, size_t bytes, int dst, int tag,
                 MPI_Request *req) {
    double t0 = now();
    c->lock(c->ctx);
    int rc = MPI_Isend_c(buf, count, type, dst, tag, c->comm, req);
    c->unlock(c->ctx);
    c->seconds += now() - t0;
    if (rc != MPI_SUCCESS) {
        return comm_fail(c, rc, "MPI_Isend_c");
    }
    c->count.bytes_sent += (long long)bytes;
    c->count.messages++;
    return 0;
}

static int irecv(Comm *c, void *buf, MPI_Count count, MPI_Datatype type, int src, int tag, MPI_Request *req) {
    double t0 = now();
    c->lock(c->ctx);
    int rc = MPI_Irecv_c(buf, count, type, src, tag, c->comm, req);
    c->unlock(c->ctx);
    c->seconds += now() - t0;
    return rc != MPI_SUCCESS ? comm_fail(c, rc, "MPI_Irecv_c") : 0;
}

int comm_isend(Comm *c, const float *buf, long n, int dst, int tag, MPI_Request *req) {
    return isend(c, buf, (MPI_Count)n, MPI_FLOAT, (size_t)n * sizeof(float), dst, tag, req);
}

int comm_irecv(Comm *c, float *buf, long n, int src, int tag, MPI_Request *req) {
    return irecv(c, buf, (MPI_Count)n, MPI_FLOAT, src, tag, req);
}

int comm_isend_bytes(Comm *c, const void *buf, size_t bytes, int dst, int tag, MPI_Request *req) {
    return isend(c, buf, (MPI_Count)bytes, MPI_BYTE, bytes, dst, tag, req);
}

int comm_irecv_bytes(Comm *c, void *buf, size_t bytes, int src, int tag, MPI_Request *req) {
    return irecv(c, buf, (MPI_Count)bytes, MPI_BYTE, src, tag, req);
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
    if (!pd_mpi_has_isendrecv()) {
        return comm_allreduce_sum(c, buf, n);   // Open MPI 4.1: MPI's all-reduce, the same sum's role
    }
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

int comm_agree(Comm *c, const uint64_t *mine, int n, uint64_t *lo, uint64_t *hi, int *differs) {
    uint64_t both[2 * COMM_AGREE_MAX];
    *differs = -1;
    if (n < 0 || n > COMM_AGREE_MAX) {
        return comm_fail(c, MPI_ERR_COUNT, "comm_agree (more values than COMM_AGREE_MAX)");
    }
    for (int i = 0; i < n; i++) {
        both[i] = mine[i];
        both[n + i] = ~mine[i];   // the largest complement is the complement of the smallest
    }
    if (c->size > 1) {
        MPI_Request req = MPI_REQUEST_NULL;
        double t0 = now();
        c->lock(c->ctx);
        int rc = collective(c, &req, MPI_Iallreduce(MPI_IN_PLACE, both, 2 * n, MPI_UINT64_T, MPI_MAX, c->comm, &req),
                            "MPI_Iallreduce");
        c->seconds += now() - t0;
        if (rc < 0) {
            return rc;
        }
    }
    for (int i = 0; i < n; i++) {
        hi[i] = both[i];
        lo[i] = ~both[n + i];
        if (*differs < 0 && lo[i] != hi[i]) {
            *differs = i;
        }
    }
    return 0;
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

int comm_allgather_bytes(Comm *c, void *all, size_t bytes) {
    const int R = c->size;
    if (R == 1) {
        return 0;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    double t0 = now();
    c->lock(c->ctx);
    int rc = collective(c, &req, MPI_Iallgather_c(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all, (MPI_Count)bytes, MPI_BYTE,
                                                  c->comm, &req), "MPI_Iallgather_c");
    c->seconds += now() - t0;
    c->count.bytes_sent += (long long)(R - 1) * (long long)bytes;
    c->count.messages += R - 1;
    return rc;
}
