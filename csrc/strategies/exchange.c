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

#include "compress/encodings.h"

#include <stdio.h>
#include <string.h>

#include "engine/blas.h"

// Sum buf[0..n) over the Comm with our ring (tmp: its ring_scratch_elements) or, tmp NULL, MPI's.
static int allreduce(Comm *c, float *buf, long n, float *tmp) {
    return tmp != NULL && c->size > 1 ? comm_ring_allreduce_sum(c, buf, n, tmp) : comm_allreduce_sum(c, buf, n);
}

// Floats of ring scratch for all-reduces of up to n floats (0 without the ring).
static long ring_floats(const Comm *c, long n, int ring) {
    return ring ? (long)ring_scratch_elements(n, c->size) : 0;
}

static int gathered_sum(Compressor *z, Comm *c, float *buf, long n) {
    const int R = c->size;
    const size_t bytes = compress_payload_bytes(z, 0, n);
    char *all = compress_buffer(z, bytes * (size_t)R);
    if (all == NULL) {
        return comm_fail(c, MPI_ERR_NO_MEM, "malloc (compressed payloads)");
    }
    compress_encode(z, 0, buf, n, all + (size_t)c->rank * bytes);
    int rc = comm_allgather_bytes(c, all, bytes);
    if (rc < 0) {
        return rc;
    }
    // A malformed payload (a rank with another compressor, or damaged bytes) leaves buf as it was. Every rank
    // holds the same payloads, so every rank refuses alike.
    if (compress_decode_sum(z, 0, n, all, bytes, R, "the compressed sum", "group rank", buf) < 0) {
        return comm_fail(c, MPI_ERR_OTHER, z->refused);
    }
    return 0;
}

static int powersgd_sum(Compressor *z, Comm *c, float *buf, long n, int ring) {
    const int R = c->size, k = z->spec.rank;
    long p_len = 0, q_len = z->q_len, inside = 0;
    for (int i = 0; i < z->num_matrices; i++) {
        p_len += z->matrices[i].rows * k;
        inside += z->matrices[i].rows * z->matrices[i].cols;
    }
    const long raw_len = n - inside, tmp_len = ring_floats(c, p_len + raw_len > q_len ? p_len + raw_len : q_len, ring);
    float *pk = compress_buffer(z, sizeof(float) * (size_t)(p_len + raw_len + q_len + tmp_len));
    if (pk == NULL) {
        return comm_fail(c, MPI_ERR_NO_MEM, "malloc (powersgd's factors)");
    }
    float *qk = pk + p_len + raw_len, *tmp = ring ? qk + q_len : NULL;
    float *x = z->residual;   // becomes the input plus the residual, then the new residual
    for (long i = 0; i < n; i++) x[i] += buf[i];
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
    int rc = allreduce(c, pk, p_len + raw_len, tmp);
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
        rc = allreduce(c, qk, q_len, tmp);
    }
    if (rc < 0) {
        for (long i = 0; i < n; i++) x[i] -= buf[i];   // the residual as it was; the step failed anyway
        return rc;
    }
    // the sum: P Q^T on the matrices, the summed entries elsewhere; each residual keeps the rest
    at = 0, q_at = 0, raw = p_len, pos = 0;
    const float share = 1.0f / (float)R;
    for (int i = 0; i <= z->num_matrices; i++) {
        long end = i < z->num_matrices ? z->matrices[i].offset : n;   // up to the next matrix, or the end
        for (long j = pos; j < end; j++) {
            buf[j] = pk[raw++];
            x[j] = 0.0f;   // sent whole
        }
        if (i == z->num_matrices) {
            break;
        }
        const CompressMatrix *m = &z->matrices[i];
        float *out = buf + m->offset;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m->rows, (int)m->cols, k, 1.0f, pk + at, k,
                    qk + q_at, k, 0.0f, out, (int)m->cols);
        for (long j = 0; j < m->rows * m->cols; j++) x[m->offset + j] -= share * out[j];
        memcpy(z->q + q_at, qk + q_at, sizeof(float) * (size_t)(m->cols * k));   // the next warm start, alike
        powersgd_refresh_q(z->q + q_at, m->cols, k, &z->draws);
        at += m->rows * k;
        q_at += m->cols * k;
        pos = m->offset + m->rows * m->cols;
    }
    return 0;
}

// Every rank of the group has z's spec on a buffer of z's length (compress.h's fingerprint), or every
// rank refuses alike, before any payload moves: ranks that compressed differently would exchange
// payloads each reads by its own spec (fp16 read as bf16 passes every check) or of different lengths.
static int agree(Compressor *z, Comm *c) {
    uint64_t mine[COMPRESS_FINGERPRINT], lo[COMPRESS_FINGERPRINT], hi[COMPRESS_FINGERPRINT];
    int differs;
    compress_fingerprint(z, mine);
    int rc = comm_agree(c, mine, COMPRESS_FINGERPRINT, lo, hi, &differs);
    if (rc < 0 || differs < 0) {
        return rc;
    }
    char how[128], name[64];
    compress_disagreement(lo, hi, differs, how, sizeof how);
    compress_name(&z->spec, name, sizeof name);
    snprintf(z->refused, sizeof z->refused, "the compressed sum: the group's ranks have %s (every rank must "
             "compress the same buffer with the same spec; this rank: %s on %ld entries)", how, name, z->n);
    return comm_fail(c, MPI_ERR_OTHER, z->refused);
}

int compress_allreduce_sum(Compressor *z, Comm *c, float *buf, long n, int ring) {
    if (z->agree_each_sum && c->size > 1) {
        int rc = agree(z, c);
        if (rc < 0) {
            return rc;
        }
    }
    switch (z->spec.kind) {
    case COMPRESS_NONE: {
        float *tmp = ring ? compress_buffer(z, sizeof(float) * (size_t)(ring_floats(c, n, 1) + 1)) : NULL;
        if (ring && tmp == NULL) {
            return comm_fail(c, MPI_ERR_NO_MEM, "malloc (the ring's scratch)");
        }
        return allreduce(c, buf, n, tmp);
    }
    case COMPRESS_POWERSGD: return powersgd_sum(z, c, buf, n, ring);
    default: return gathered_sum(z, c, buf, n);
    }
}
