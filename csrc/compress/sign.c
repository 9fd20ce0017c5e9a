/*
 * sign.c: one bit per entry (1: negative) and, per chunk of SIGN_CHUNK entries, one float32 scale,
 * the chunk's mean magnitude, so that the decoded chunk keeps the input's L1 norm (EF-SignSGD,
 * Karimireddy et al. 2019; 1-bit SGD, Seide et al. 2014, with error feedback). Layout: the scales,
 * then the bits, little end first.
 *
 * The mean's sum runs in float64 over four interleaved partial sums (entry i of a chunk into sum i mod
 * 4, then (s0 + s1) + (s2 + s3)): the order the AVX2 loop takes, so that it and the scalar loop give the
 * same bits. A chunk with a NaN gets the one quiet NaN as its scale and residual. With AVX2 a byte of
 * bits is one movemask of eight signs.
 */
#include "encodings.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static long chunks(long len) {
    return (len + SIGN_CHUNK - 1) / SIGN_CHUNK;
}

size_t sign_bytes(long len) {
    return (size_t)chunks(len) * sizeof(float) + (size_t)(len + 7) / 8;
}

// Entries [from, n) of a chunk: into the partial sums; their bits and residual.
static void sum_scalar(const float *x, long from, long n, double sums[4]) {
    for (long i = from; i < n; i++) sums[i & 3] += fabs((double)x[i]);
}

static void signs_scalar(float *x, long from, long n, float s, unsigned char *bits) {
    for (long i = from; i < n; i++) {
        int negative = signbit(x[i]) != 0;
        bits[i >> 3] |= (unsigned char)(negative << (i & 7));
        x[i] -= negative ? -s : s;
    }
}

static void decode_scalar(const float *scales, const unsigned char *bits, long from, long len, float scale,
                          float *out) {
    for (long i = from; i < len; i++) {
        float v = scales[i / SIGN_CHUNK];
        out[i] += scale * ((bits[i >> 3] >> (i & 7)) & 1 ? -v : v);
    }
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define VECTOR_SIGN 1

// The entries of a chunk it did (a multiple of 4 for the sums, of 8 for the signs).
__attribute__((target("avx2"))) static long sum_vector(const float *x, long n, double sums[4]) {
    const __m128 magnitude = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    __m256d acc = _mm256_loadu_pd(sums);
    long i = 0;
    for (; i + 4 <= n; i += 4) acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm_and_ps(_mm_loadu_ps(x + i), magnitude)));
    _mm256_storeu_pd(sums, acc);
    return i;
}

__attribute__((target("avx2"))) static long signs_vector(float *x, long n, float s, unsigned char *bits) {
    const __m256 sign = _mm256_set1_ps(-0.0f), scale = _mm256_set1_ps(s);
    long i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        bits[i >> 3] = (unsigned char)_mm256_movemask_ps(v);
        // s with v's sign: -s where v is negative (s is a mean of magnitudes, its sign bit clear)
        _mm256_storeu_ps(x + i, _mm256_sub_ps(v, _mm256_or_ps(scale, _mm256_and_ps(v, sign))));
    }
    return i;
}

__attribute__((target("avx2"))) static long decode_vector(const float *scales, const unsigned char *bits, long len,
                                                           float scale, float *out) {
    const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256 sign = _mm256_set1_ps(-0.0f), by = _mm256_set1_ps(scale);
    long i = 0;
    for (; i + 8 <= len; i += 8) {   // eight entries never straddle a chunk (SIGN_CHUNK is a multiple of 8)
        __m256i set = _mm256_and_si256(_mm256_set1_epi32(bits[i >> 3]), lane_bit);
        __m256 negative = _mm256_castsi256_ps(_mm256_cmpeq_epi32(set, lane_bit));
        __m256 v = _mm256_or_ps(_mm256_set1_ps(scales[i / SIGN_CHUNK]), _mm256_and_ps(negative, sign));
        _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i), _mm256_mul_ps(by, v)));
    }
    return i;
}
#endif

void sign_encode(float *x, long len, void *out) {
    float *scale = out;
    unsigned char *bits = (unsigned char *)out + (size_t)chunks(len) * sizeof(float);
    memset(bits, 0, (size_t)(len + 7) / 8);
#ifdef VECTOR_SIGN
    const int vector = compress_vector_ok();
#else
    const int vector = 0;
#endif
    for (long c = 0; c < chunks(len); c++) {
        long lo = c * SIGN_CHUNK, n = lo + SIGN_CHUNK < len ? SIGN_CHUNK : len - lo;
        double sums[4] = {0.0, 0.0, 0.0, 0.0};
        long done = 0;
#ifdef VECTOR_SIGN
        if (vector) done = sum_vector(x + lo, n, sums);
#endif
        sum_scalar(x + lo, done, n, sums);
        float s = (float)(((sums[0] + sums[1]) + (sums[2] + sums[3])) / (double)n);
        scale[c] = s;
        if (isnan(s)) {   // a NaN in the chunk: its bits as ever, the one quiet NaN as its scale and residual
            scale[c] = NAN;   // (which NaN arithmetic on NaNs gives depends on the compiler's operand order)
            signs_scalar(x + lo, 0, n, NAN, bits + lo / 8);
            for (long i = lo; i < lo + n; i++) x[i] = NAN;
            continue;
        }
        done = 0;
#ifdef VECTOR_SIGN
        if (vector) done = signs_vector(x + lo, n, s, bits + lo / 8);
#endif
        signs_scalar(x + lo, done, n, s, bits + lo / 8);
    }
    (void)vector;
}

// A scale is a mean of magnitudes: never negative (its sign bit clear), a NaN only as the one quiet NaN
// that encode writes for a chunk holding one. The bits past len in the last byte are encode's zeros.
// (Scales are read with memcpy: a payload inside a gathered block need not be 4-byte aligned.)
int sign_check(const void *in, long len, char *err, size_t errlen) {
    const unsigned char *p = in;
    for (long c = 0; c < chunks(len); c++) {
        uint32_t bits;
        memcpy(&bits, p + (size_t)c * sizeof bits, sizeof bits);
        if ((bits >> 31) != 0 || (bits > 0x7f800000u && bits != 0x7fc00000u)) {
            float v;
            memcpy(&v, &bits, sizeof v);
            snprintf(err, errlen, "sign chunk %ld has scale %g (bits 0x%08x): a scale is a mean magnitude, never "
                     "negative, and a NaN only as the quiet NaN 0x7fc00000", c, (double)v, (unsigned)bits);
            return -1;
        }
    }
    if (len % 8 == 0) {
        return 0;
    }
    const unsigned char last = p[sign_bytes(len) - 1];
    if ((last >> (len % 8)) != 0) {
        snprintf(err, errlen, "sign payload of %ld entries has bits set past its last entry (last byte 0x%02x)", len,
                 last);
        return -1;
    }
    return 0;
}

void sign_decode_add(const void *in, long len, float scale, float *out) {
    const float *scales = in;
    const unsigned char *bits = (const unsigned char *)in + (size_t)chunks(len) * sizeof(float);
    long done = 0;
#ifdef VECTOR_SIGN
    if (compress_vector_ok()) done = decode_vector(scales, bits, len, scale, out);
#endif
    decode_scalar(scales, bits, done, len, scale, out);
}
