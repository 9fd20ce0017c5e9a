/*
 * compress.c: the compressors' names, their per-rank state (the error-feedback residual, powersgd's
 * warm start) and one rank's payload: encode adds the residual and keeps what the encoding lost,
 * decode adds what a payload holds. The encodings themselves are cast16.c, topk.c, sign.c, powersgd.c.
 */
#include "compress.h"
#include "encodings.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/blas.h"
#include "core/glibc_floor.h"
#include "core/simd.h"

int compress_parse(const char *text, CompressSpec *spec, char *err, size_t errlen) {
    *spec = (CompressSpec){COMPRESS_NONE, 1.0, 0};
    const char *colon = strchr(text, ':');
    size_t head = colon ? (size_t)(colon - text) : strlen(text);
    const char *arg = colon ? colon + 1 : NULL;
    char *end = NULL;
    errno = 0;
    if (head == 4 && strncmp(text, "none", 4) == 0 && arg == NULL) {
        return 0;
    }
    if (head == 4 && strncmp(text, "fp16", 4) == 0 && arg == NULL) {
        spec->kind = COMPRESS_FP16;
        return 0;
    }
    if (head == 4 && strncmp(text, "bf16", 4) == 0 && arg == NULL) {
        spec->kind = COMPRESS_BF16;
        return 0;
    }
    if (head == 4 && strncmp(text, "sign", 4) == 0 && arg == NULL) {
        spec->kind = COMPRESS_SIGN;
        return 0;
    }
    if (head == 4 && strncmp(text, "topk", 4) == 0 && arg != NULL && *arg) {
        double r = strtod(arg, &end);
        if (*end == 0 && errno == 0 && r > 0.0 && r <= 1.0) {
            spec->kind = COMPRESS_TOPK;
            spec->ratio = r;
            return 0;
        }
        snprintf(err, errlen, "compression 'topk:R' needs 0 < R <= 1 (the fraction of entries sent); got '%s'", text);
        return -1;
    }
    if (head == 8 && strncmp(text, "powersgd", 8) == 0 && arg != NULL && *arg) {
        long k = strtol(arg, &end, 10);
        if (*end == 0 && errno == 0 && k >= 1 && k <= 4096) {
            spec->kind = COMPRESS_POWERSGD;
            spec->rank = (int)k;
            return 0;
        }
        snprintf(err, errlen, "compression 'powersgd:K' needs an integer rank 1 <= K <= 4096; got '%s'", text);
        return -1;
    }
    snprintf(err, errlen, "unknown compression '%s' (none, fp16, bf16, topk:R, sign, powersgd:K)", text);
    return -1;
}

const char *compress_kind_name(CompressKind kind) {
    switch (kind) {
    case COMPRESS_FP16: return "fp16";
    case COMPRESS_BF16: return "bf16";
    case COMPRESS_TOPK: return "topk";
    case COMPRESS_SIGN: return "sign";
    case COMPRESS_POWERSGD: return "powersgd";
    default: return "none";
    }
}

void compress_name(const CompressSpec *spec, char *buf, size_t len) {
    const char *kind = compress_kind_name(spec->kind);
    if (spec->kind == COMPRESS_TOPK) {
        snprintf(buf, len, "%s:%g", kind, spec->ratio);
    } else if (spec->kind == COMPRESS_POWERSGD) {
        snprintf(buf, len, "%s:%d", kind, spec->rank);
    } else {
        snprintf(buf, len, "%s", kind);
    }
}

void compress_fingerprint(const Compressor *z, uint64_t out[COMPRESS_FINGERPRINT]) {
    uint64_t ratio = 0, matrices = 14695981039346656037ull;   // FNV-1a over powersgd's (offset, rows, cols)
    if (z->spec.kind == COMPRESS_TOPK) {
        memcpy(&ratio, &z->spec.ratio, sizeof ratio);   // (a positive double's bits order as it does)
    }
    for (int i = 0; i < z->num_matrices; i++) {
        const long v[3] = {z->matrices[i].offset, z->matrices[i].rows, z->matrices[i].cols};
        for (int j = 0; j < 3; j++) {
            matrices = (matrices ^ (uint64_t)v[j]) * 1099511628211ull;
        }
    }
    out[0] = (uint64_t)z->spec.kind;
    out[1] = ratio;
    out[2] = z->spec.kind == COMPRESS_POWERSGD ? (uint64_t)z->spec.rank : 0;
    out[3] = (uint64_t)z->n;
    out[4] = (uint64_t)compress_payload_bytes(z, 0, z->n);
    out[5] = matrices;
}

void compress_disagreement(const uint64_t *lo, const uint64_t *hi, int field, char *buf, size_t len) {
    switch (field) {
    case 0: {
        snprintf(buf, len, "compressors of different kinds (%s to %s)", compress_kind_name((CompressKind)lo[0]),
                 compress_kind_name((CompressKind)hi[0]));
        break;
    }
    case 1: {
        double x, y;
        memcpy(&x, &lo[1], sizeof x);
        memcpy(&y, &hi[1], sizeof y);
        snprintf(buf, len, "topk ratios from %g to %g", x, y);
        break;
    }
    case 2: snprintf(buf, len, "powersgd ranks from %llu to %llu", (unsigned long long)lo[2], (unsigned long long)hi[2]);
        break;
    case 3: snprintf(buf, len, "buffers of %llu to %llu entries", (unsigned long long)lo[3], (unsigned long long)hi[3]);
        break;
    case 4: snprintf(buf, len, "payloads of %llu to %llu bytes", (unsigned long long)lo[4], (unsigned long long)hi[4]);
        break;
    default: snprintf(buf, len, "powersgd matrices of different shapes or places"); break;
    }
}

// The matrices that lie wholly inside [lo, lo + len): one run [*first, *last) (they are in buffer
// order), and where the first one's Q starts in z->q.
static void matrices_in(const Compressor *z, long lo, long len, int *first, int *last, long *q_first) {
    int i = 0;
    *q_first = 0;
    for (; i < z->num_matrices && z->matrices[i].offset < lo; i++) *q_first += z->matrices[i].cols * z->spec.rank;
    *first = i;
    for (; i < z->num_matrices && z->matrices[i].offset + z->matrices[i].rows * z->matrices[i].cols <= lo + len; i++) {
    }
    *last = i;
}

// Floats of the factors (P then Q) of the matrices [first, last).
static long factors_len(const Compressor *z, int first, int last) {
    long floats = 0;
    for (int i = first; i < last; i++) floats += (z->matrices[i].rows + z->matrices[i].cols) * z->spec.rank;
    return floats;
}

int compressor_create(Compressor *z, const CompressSpec *spec, long n, const CompressMatrix *matrices,
                      int num_matrices, uint64_t seed) {
    *z = (Compressor){.spec = *spec, .n = n, .agree_each_sum = 1};
    if (spec->kind == COMPRESS_NONE) {
        return 0;
    }
    z->residual = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    if (z->residual == NULL) {
        return -1;
    }
    // scratch: topk's magnitudes (n), or powersgd's P of its largest matrix
    z->work_len = spec->kind == COMPRESS_TOPK ? n : 0;
    if (spec->kind == COMPRESS_POWERSGD) {
        long kept = 0;
        z->matrices = malloc(sizeof(CompressMatrix) * (size_t)(num_matrices > 0 ? num_matrices : 1));
        if (z->matrices == NULL) {
            return -1;
        }
        for (int i = 0; i < num_matrices; i++) {
            const CompressMatrix *m = &matrices[i];
            // only where the factors are smaller than the matrix: else it goes as it is
            if (m->offset < 0 || m->offset + m->rows * m->cols > n ||
                (m->rows + m->cols) * (long)spec->rank >= m->rows * m->cols) {
                continue;
            }
            z->matrices[kept++] = *m;
            z->q_len += m->cols * spec->rank;
            long need = m->rows * spec->rank;
            z->work_len = need > z->work_len ? need : z->work_len;
        }
        z->num_matrices = (int)kept;
        z->q = malloc(sizeof(float) * (size_t)(z->q_len > 0 ? z->q_len : 1));
        if (z->q == NULL) {
            return -1;
        }
        // Q starts as uniform draws in [-1, 1), the same on every rank (one seed): full rank with
        // probability 1, which is all one power iteration needs
        z->draws = seed ^ 0x5057534744ull;
        for (long i = 0; i < z->q_len; i++) {
            z->q[i] = powersgd_draw(&z->draws);
        }
    }
    if (z->work_len > 0 && (z->work = malloc(sizeof(float) * (size_t)z->work_len)) == NULL) {
        return -1;
    }
    return 0;
}

void compressor_free(Compressor *z) {
    free(z->residual);
    free(z->matrices);
    free(z->q);
    free(z->work);
    free(z->buffer);
    *z = (Compressor){0};
}

void *compress_buffer(Compressor *z, size_t bytes) {
    if (bytes > z->buffer_bytes || z->buffer == NULL) {
        void *grown = realloc(z->buffer, bytes > 0 ? bytes : 1);
        if (grown == NULL) {
            return NULL;
        }
        z->buffer = grown;
        z->buffer_bytes = bytes;
    }
    return z->buffer;
}

size_t compress_payload_bytes(const Compressor *z, long lo, long len) {
    switch (z->spec.kind) {
    case COMPRESS_FP16: case COMPRESS_BF16: return (size_t)len * 2;
    case COMPRESS_TOPK: return (size_t)topk_count(z->spec.ratio, len) * 8;
    case COMPRESS_SIGN: return sign_bytes(len);
    case COMPRESS_POWERSGD: {
        int first, last;
        long q_first, floats = len;
        matrices_in(z, lo, len, &first, &last, &q_first);
        for (int i = first; i < last; i++) floats -= z->matrices[i].rows * z->matrices[i].cols;
        return (size_t)(floats + factors_len(z, first, last)) * sizeof(float);
    }
    default: return (size_t)len * sizeof(float);
    }
}

// powersgd's payload: each matrix inside as P (rows x K) then Q (cols x K), then every other entry as
// it is (its residual then nothing), in buffer order.
static void powersgd_encode(Compressor *z, long lo, float *x, long len, float *out) {
    int first, last;
    long q_at;
    matrices_in(z, lo, len, &first, &last, &q_at);
    const int k = z->spec.rank;
    float *factors = out, *raw = out + factors_len(z, first, last);
    long pos = 0;   // the next entry of x not yet placed
    for (int i = first; i <= last; i++) {
        long off = i < last ? z->matrices[i].offset - lo : len;   // up to the next matrix, or the end
        memcpy(raw, x + pos, sizeof(float) * (size_t)(off - pos));
        memset(x + pos, 0, sizeof(float) * (size_t)(off - pos));
        raw += off - pos;
        if (i == last) {
            break;
        }
        const CompressMatrix *m = &z->matrices[i];
        float *q = z->q + q_at;
        powersgd_factor(x + off, m->rows, m->cols, k, q, z->work);
        memcpy(factors, z->work, sizeof(float) * (size_t)(m->rows * k));
        memcpy(factors + m->rows * k, q, sizeof(float) * (size_t)(m->cols * k));
        powersgd_refresh_q(q, m->cols, k, &z->draws);
        factors += (m->rows + m->cols) * k;
        q_at += m->cols * k;
        pos = off + m->rows * m->cols;
    }
}

void compress_encode(Compressor *z, long lo, const float *in, long len, void *payload) {
    if (z->spec.kind == COMPRESS_NONE) {
        memcpy(payload, in, sizeof(float) * (size_t)len);
        return;
    }
    // x = in + residual, in the residual itself, which the encoding then leaves as x minus what it sends
    float *x = z->residual + lo;
    for (long i = 0; i < len; i++) x[i] += in[i];
    switch (z->spec.kind) {
    case COMPRESS_FP16: case COMPRESS_BF16:
        cast16_encode(z->spec.kind == COMPRESS_BF16, x, len, payload);
        break;
    case COMPRESS_TOPK: {
        long k = topk_count(z->spec.ratio, len);
        topk_encode(x, len, k, z->work, payload, (float *)payload + k);
        break;
    }
    case COMPRESS_SIGN:
        sign_encode(x, len, payload);
        break;
    case COMPRESS_POWERSGD:
        powersgd_encode(z, lo, x, len, payload);
        break;
    default:
        break;
    }
}

int compress_payload_check(const Compressor *z, long lo, long len, const void *payload, size_t bytes, char *err,
                           size_t errlen) {
    const size_t want = compress_payload_bytes(z, lo, len);
    if (bytes != want) {
        snprintf(err, errlen, "a payload of %ld entries is %zu bytes; got %zu", len, want, bytes);
        return -1;
    }
    switch (z->spec.kind) {
    case COMPRESS_TOPK: return topk_check(payload, topk_count(z->spec.ratio, len), len, err, errlen);
    case COMPRESS_SIGN: return sign_check(payload, len, err, errlen);
    default: return 0;   // fp16/bf16, powersgd, none: any bits are values, and the matrices are z's own
    }
}

int compress_decode_sum(Compressor *z, long lo, long len, const char *payloads, size_t bytes, int count,
                        const char *what, const char *who, float *sum) {
    for (int i = 0; i < count; i++) {
        char why[160];
        if (compress_payload_check(z, lo, len, payloads + (size_t)i * bytes, bytes, why, sizeof why) < 0) {
            snprintf(z->refused, sizeof z->refused, "%s (%s %d sent a malformed payload: %s; do the ranks' "
                     "compressors match?)", what, who, i, why);
            return -1;
        }
    }
    memset(sum, 0, sizeof(float) * (size_t)len);
    for (int i = 0; i < count; i++) compress_decode_add_checked(z, lo, payloads + (size_t)i * bytes, len, 1.0f, sum);
    return 0;
}

void compress_decode_add_checked(const Compressor *z, long lo, const void *payload, long len, float scale,
                                 float *out) {
    switch (z->spec.kind) {
    case COMPRESS_FP16: case COMPRESS_BF16:
        cast16_decode_add(z->spec.kind == COMPRESS_BF16, payload, len, scale, out);
        break;
    case COMPRESS_TOPK: {
        long k = topk_count(z->spec.ratio, len);
        topk_decode_add(payload, (const float *)payload + k, k, scale, out);
        break;
    }
    case COMPRESS_SIGN:
        sign_decode_add(payload, len, scale, out);
        break;
    case COMPRESS_POWERSGD: {
        int first, last;
        long q_first, pos = 0;
        matrices_in(z, lo, len, &first, &last, &q_first);
        const int k = z->spec.rank;
        const float *factors = payload, *raw = factors + factors_len(z, first, last);
        for (int i = first; i < last; i++) {
            const CompressMatrix *m = &z->matrices[i];
            long off = m->offset - lo;
            for (long j = pos; j < off; j++) out[j] += scale * *raw++;
            const float *p = factors, *q = factors + m->rows * k;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m->rows, (int)m->cols, k, scale, p, k, q, k,
                        1.0f, out + off, (int)m->cols);
            factors += (m->rows + m->cols) * k;
            pos = off + m->rows * m->cols;
        }
        for (long j = pos; j < len; j++) out[j] += scale * *raw++;
        break;
    }
    default: {
        const float *f = payload;
        for (long i = 0; i < len; i++) out[i] += scale * f[i];
        break;
    }
    }
}

// The state a checkpoint keeps: the residual, powersgd's Q and its generator, in that order.
size_t compress_state_bytes(const Compressor *z) {
    if (z->spec.kind == COMPRESS_NONE) {
        return 0;
    }
    return sizeof(float) * (size_t)(z->n + z->q_len) + sizeof z->draws;
}

void compress_state_save(const Compressor *z, void *out) {
    char *p = out;
    memcpy(p, z->residual, sizeof(float) * (size_t)z->n);
    p += sizeof(float) * (size_t)z->n;
    if (z->q_len > 0) {
        memcpy(p, z->q, sizeof(float) * (size_t)z->q_len);
    }
    p += sizeof(float) * (size_t)z->q_len;
    memcpy(p, &z->draws, sizeof z->draws);
}

void compress_state_load(Compressor *z, const void *in) {
    const char *p = in;
    memcpy(z->residual, p, sizeof(float) * (size_t)z->n);
    p += sizeof(float) * (size_t)z->n;
    if (z->q_len > 0) {
        memcpy(z->q, p, sizeof(float) * (size_t)z->q_len);
    }
    p += sizeof(float) * (size_t)z->q_len;
    memcpy(&z->draws, p, sizeof z->draws);
}
