/*
 * powersgd.c: the low-rank algebra of PowerSGD (Vogels et al. 2019), row-major throughout. One power
 * iteration from the previous step's Q: P = M Q, P orthonormalised, Q = M^T P, and M ~ P Q^T, the
 * projection of M onto P's columns (exact when K >= the rank of M). The sum over a group (exchange.c)
 * all-reduces P and Q between these steps; one rank alone (a worker's push) factors its own M here.
 */
#include "encodings.h"

#include <math.h>

#include "engine/blas.h"
#include "engine/rng.h"

// Modified Gram-Schmidt, twice (once is not enough in float32 when columns are nearly dependent). A
// column whose norm falls below a small fraction of its norm before (dependent on the earlier ones,
// as when K exceeds M's rank) becomes zero rather than noise blown up to unit length.
void powersgd_orthonormalize(float *p, long rows, int k) {
    for (int j = 0; j < k; j++) {
        double before = 0.0;
        for (long r = 0; r < rows; r++) before += (double)p[r * k + j] * p[r * k + j];
        for (int pass = 0; pass < 2; pass++) {
            for (int i = 0; i < j; i++) {
                double dot = 0.0;
                for (long r = 0; r < rows; r++) dot += (double)p[r * k + i] * p[r * k + j];
                for (long r = 0; r < rows; r++) p[r * k + j] -= (float)dot * p[r * k + i];
            }
        }
        double norm = 0.0;
        for (long r = 0; r < rows; r++) norm += (double)p[r * k + j] * p[r * k + j];
        // (an absolute floor too: 1 / sqrt of a norm of subnormals overflows float32)
        float inv = norm > 1e-10 * before && norm > 1e-30 ? (float)(1.0 / sqrt(norm)) : 0.0f;
        for (long r = 0; r < rows; r++) p[r * k + j] *= inv;
    }
}

float powersgd_draw(uint64_t *state) {
    return (float)((double)(splitmix64(state) >> 40) * (2.0 / 16777216.0) - 1.0);
}

void powersgd_refresh_q(float *q, long cols, int k, uint64_t *state) {
    for (int j = 0; j < k; j++) {
        double norm = 0.0;
        for (long c = 0; c < cols; c++) norm += (double)q[c * k + j] * q[c * k + j];
        if (norm > 1e-30) {
            continue;
        }
        for (long c = 0; c < cols; c++) {
            q[c * k + j] = powersgd_draw(state);
        }
    }
}

void powersgd_factor(float *m, long rows, long cols, int k, float *q, float *p) {
    // P (rows x K) = M (rows x cols) Q (cols x K)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, k, (int)cols, 1.0f, m, (int)cols, q, k, 0.0f,
                p, k);
    powersgd_orthonormalize(p, rows, k);
    // Q (cols x K) = M^T P
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)cols, k, (int)rows, 1.0f, m, (int)cols, p, k, 0.0f, q,
                k);
    // M -= P Q^T: what the payload (which carries this Q, before any refresh) leaves of M
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)cols, k, -1.0f, p, k, q, k, 1.0f, m,
                (int)cols);
}
