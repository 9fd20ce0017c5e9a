/*
 * encodings.h: the compressors' encodings, one file each (cast16.c, topk.c, sign.c, powersgd.c), below
 * compress.c, which picks one by the Compressor's spec.
 */
#ifndef PYDIST_COMPRESS_ENCODINGS_H
#define PYDIST_COMPRESS_ENCODINGS_H

#include <stddef.h>
#include <stdint.h>

#include "core/simd.h"

#define SIGN_CHUNK 256

// Whether the encodings may use AVX2 and F16C: the level of simd.h is avx2 or wider (PYDIST_SIMD=sse2
// keeps the scalar loops; both give the same bits).
static inline int compress_vector_ok(void) {
    return pd_simd_level() >= PD_SIMD_AVX2;
}

// The encodings (cast16.c, topk.c, sign.c, powersgd.c), on x[0..len) in place: x (the input plus the
// residual) becomes the new residual, x minus what the payload decodes to.
void cast16_encode(int bf16, float *x, long len, uint16_t *out);
void cast16_decode_add(int bf16, const uint16_t *in, long len, float scale, float *out);
long topk_count(double ratio, long len);
// mag: len floats of scratch.
void topk_encode(float *x, long len, long k, float *mag, int32_t *index, float *value);
// The checks of compress_payload_check (0, or -1 with err); the decoders trust what they passed.
int topk_check(const int32_t *index, long k, long len, char *err, size_t errlen);
void topk_decode_add(const int32_t *index, const float *value, long k, float scale, float *out);
size_t sign_bytes(long len);
void sign_encode(float *x, long len, void *out);
int sign_check(const void *in, long len, char *err, size_t errlen);
void sign_decode_add(const void *in, long len, float scale, float *out);
// powersgd.c: orthonormalise the K columns of P (rows x K, row-major) in place (a column that comes
// out (near) zero stays zero); and one rank's own rank-K factorisation of M (rows x cols), P then Q,
// M becoming what P Q^T leaves of it (p: rows x K floats).
void powersgd_orthonormalize(float *p, long rows, int k);
void powersgd_factor(float *m, long rows, long cols, int k, float *q, float *p);
// A column of the warm start Q that has gone (near) zero (a matrix that was zero: a dead layer) would
// keep every later P zero: it starts again from fresh draws of `state` (the same on every rank).
void powersgd_refresh_q(float *q, long cols, int k, uint64_t *state);
// One draw, uniform in [-1, 1), of Q's generator.
float powersgd_draw(uint64_t *state);

#endif  // PYDIST_COMPRESS_ENCODINGS_H
