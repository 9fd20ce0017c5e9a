/*
 * exchange.c: the sum of a buffer over a group, compressed (compress.h): what allreduce and ring send
 * instead of the full all-reduce. Every rank ends with bitwise the same sum.
 *   fp16, bf16, topk, sign: each rank's payload to every rank (an all-gather; sparse and sign payloads
 *     cannot be added while compressed, and 16-bit ones are added here in float32, never in 16 bits),
 *     then every rank decodes the payloads in rank order into a float32 sum;
 *   powersgd: Vogels et al.'s scheme, which all-reduces the factors themselves: P = M Q summed over
 *     the ranks (the entries outside the matrices ride along uncompressed), orthonormalised alike on
 *     every rank, Q = M^T P summed, and the sum of the M's taken as P Q^T. Each rank's residual is its
 *     M minus 1/R of that, so the residuals and the sum together still hold every rank's whole input.
 */
#include "exchange.h"

#include <stdlib.h>
#include <string.h>

#include "engine/blas.h"

// Sum buf[0..n) over the Comm with our ring (ring != 0) or MPI's all-reduce.
static int allreduce(Comm *c, float *buf, long n, int ring) {
    if (!ring || c->size == 1) {
        return comm_allreduce_sum(c, buf, n);
    }
    float *tmp = malloc(sizeof(float) * (size_t)(ring_scratch_elements(n, c->size) + 1));
    if (tmp == NULL) {
        return comm_fail(c, MPI_ERR_NO_MEM, "malloc (compressed ring's scratch)");
    }
    int rc = comm_ring_allreduce_sum(c, buf, n, tmp);
    free(tmp);
    return rc;
}

static int gathered_sum(Compressor *z, Comm *c, float *buf, long n) {
    const int R = c->size;
    const size_t bytes = compress_payload_bytes(z, 0, n);
    char *mine = malloc(bytes > 0 ? bytes : 1), *all = malloc(bytes * (size_t)R + 1);
    int rc = 0;
    if (mine == NULL || all == NULL || compress_encode(z, 0, buf, n, mine) < 0) {
        rc = comm_fail(c, MPI_ERR_NO_MEM, "malloc (compressed payloads)");
    } else if ((rc = comm_allgather_bytes(c, mine, bytes, all)) == 0) {
        memset(buf, 0, sizeof(float) * (size_t)n);
        for (int r = 0; r < R; r++) compress_decode_add(z, 0, all + (size_t)r * bytes, n, 1.0f, buf);
    }
    free(mine);
    free(all);
    return rc;
}

static int powersgd_sum(Compressor *z, Comm *c, float *buf, long n, int ring) {
    const int R = c->size, k = z->spec.rank;
    float *x = z->residual;   // becomes the input plus the residual, then the new residual
    for (long i = 0; i < n; i++) x[i] += buf[i];
    long p_len = 0, q_len = z->q_len, inside = 0;
    for (int i = 0; i < z->num_matrices; i++) {
        p_len += z->matrices[i].rows * k;
        inside += z->matrices[i].rows * z->matrices[i].cols;
    }
    const long raw_len = n - inside;
    float *pk = malloc(sizeof(float) * (size_t)(p_len + raw_len + 1)), *qk = malloc(sizeof(float) * (size_t)(q_len + 1));
    if (pk == NULL || qk == NULL) {
        free(pk);
        free(qk);
        for (long i = 0; i < n; i++) x[i] -= buf[i];   // as it was
        return comm_fail(c, MPI_ERR_NO_MEM, "malloc (powersgd's factors)");
    }
    // P of every matrix, then the other entries, in buffer order
    long at = 0, raw = p_len, pos = 0, q_at = 0;
    for (int i = 0; i < z->num_matrices; i++) {
        const CompressMatrix *m = &z->matrices[i];
        memcpy(pk + raw, x + pos, sizeof(float) * (size_t)(m->offset - pos));
        raw += m->offset - pos;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m->rows, k, (int)m->cols, 1.0f, x + m->offset,
                    (int)m->cols, z->q + q_at, k, 0.0f, pk + at, k);
        at += m->rows * k;
        q_at += m->cols * k;
        pos = m->offset + m->rows * m->cols;
    }
    memcpy(pk + raw, x + pos, sizeof(float) * (size_t)(n - pos));
    int rc = allreduce(c, pk, p_len + raw_len, ring);
    if (rc == 0) {
        at = 0, q_at = 0;
        for (int i = 0; i < z->num_matrices; i++) {   // Q = M^T P, P orthonormalised alike everywhere
            const CompressMatrix *m = &z->matrices[i];
            powersgd_orthonormalize(pk + at, m->rows, k);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)m->cols, k, (int)m->rows, 1.0f, x + m->offset,
                        (int)m->cols, pk + at, k, 0.0f, qk + q_at, k);
            at += m->rows * k;
            q_at += m->cols * k;
        }
        rc = allreduce(c, qk, q_len, ring);
    }
    if (rc == 0) {
        // the sum: P Q^T on the matrices, the summed entries elsewhere; each residual keeps the rest
        at = 0, q_at = 0, raw = p_len, pos = 0;
        const float share = 1.0f / (float)R;
        for (int i = 0; i < z->num_matrices; i++) {
            const CompressMatrix *m = &z->matrices[i];
            for (long j = pos; j < m->offset; j++) {
                buf[j] = pk[raw++];
                x[j] = 0.0f;   // sent whole
            }
            float *out = buf + m->offset;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m->rows, (int)m->cols, k, 1.0f, pk + at, k,
                        qk + q_at, k, 0.0f, out, (int)m->cols);
            for (long j = 0; j < m->rows * m->cols; j++) x[m->offset + j] -= share * out[j];
            at += m->rows * k;
            q_at += m->cols * k;
            pos = m->offset + m->rows * m->cols;
        }
        for (long j = pos; j < n; j++) {
            buf[j] = pk[raw++];
            x[j] = 0.0f;
        }
        memcpy(z->q, qk, sizeof(float) * (size_t)q_len);   // the next step's warm start, the same everywhere
        q_at = 0;
        for (int i = 0; i < z->num_matrices; i++) {
            powersgd_refresh_q(z->q + q_at, z->matrices[i].cols, k, &z->draws);
            q_at += z->matrices[i].cols * k;
        }
    } else {
        for (long i = 0; i < n; i++) x[i] -= buf[i];   // the residual as it was; the step failed anyway
    }
    free(pk);
    free(qk);
    return rc;
}

int compress_allreduce_sum(Compressor *z, Comm *c, float *buf, long n, int ring) {
    switch (z->spec.kind) {
    case COMPRESS_NONE: return allreduce(c, buf, n, ring);
    case COMPRESS_POWERSGD: return powersgd_sum(z, c, buf, n, ring);
    default: return gathered_sum(z, c, buf, n);
    }
}
