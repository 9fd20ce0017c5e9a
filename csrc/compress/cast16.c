/*
 * cast16.c: fp16 and bf16, each value rounded to the nearest 16-bit one (ties to even, as NumPy and
 * torch round), summed by the caller in float32. A value past float16's range becomes its largest
 * finite value, not infinity: the error feedback then sends the rest later, where an infinity would
 * poison the sum and the residual for good. NaN stays NaN.
 *
 * Where the CPU has F16C and AVX2 (the avx2 level of simd.h; PYDIST_SIMD=sse2 says no), eight values at a
 * time: vcvtps2ph rounds to nearest even and keeps a NaN quiet with its payload's top bits, as the
 * scalar conversion does, so both give the same bits (tests/unit/test_compression_kernels.py compares
 * them over every kind of value). The scalar conversions, a call per value, took 10 ns a value.
 */
#include "encodings.h"

#include <math.h>

#include "core/kernels.h"

#define HALF_MAX 65504.0f

static void encode_scalar(int bf16, float *x, long from, long len, uint16_t *out) {
    for (long i = from; i < len; i++) {
        float v = x[i];
        if (!bf16 && fabsf(v) > HALF_MAX && !isnan(v)) {
            v = v > 0 ? HALF_MAX : -HALF_MAX;
        }
        uint16_t h = bf16 ? pd_float_to_bf16(v) : pd_float_to_half(v);
        out[i] = h;
        x[i] -= bf16 ? pd_bf16_to_float(h) : pd_half_to_float(h);
    }
}

static void decode_add_scalar(int bf16, const uint16_t *in, long from, long len, float scale, float *out) {
    if (bf16) {
        for (long i = from; i < len; i++) out[i] += scale * pd_bf16_to_float(in[i]);
    } else {
        for (long i = from; i < len; i++) out[i] += scale * pd_half_to_float(in[i]);
    }
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define VECTOR_CAST 1

// bf16's rounding on float32's bits (dtypes.c's float_to_bf16): x + 0x7fff + (bit 16), the top half;
// a NaN keeps its top half, made quiet.
__attribute__((target("avx2"))) static __m256i bf16_round(__m256i bits) {
    const __m256i one = _mm256_set1_epi32(1);
    __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                                _mm256_and_si256(_mm256_srli_epi32(bits, 16), one))), 16);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(rounded, quiet, nan);
}

// Returns how many leading values it did (a multiple of 8); the scalar loop does the rest.
__attribute__((target("avx2,f16c"))) static long encode_vector(int bf16, float *x, long len, uint16_t *out) {
    const __m256 hi = _mm256_set1_ps(HALF_MAX), lo = _mm256_set1_ps(-HALF_MAX);
    long i = 0;
    for (; i + 8 <= len; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i), back;
        __m128i h;
        if (bf16) {
            __m256i r = bf16_round(_mm256_castps_si256(v));
            back = _mm256_castsi256_ps(_mm256_slli_epi32(r, 16));
            // 8 x 32 -> 8 x 16 bits: packus works per 128-bit lane, the permute joins the lanes' halves
            h = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
        } else {
            // min/max return their second operand when either is NaN: a NaN passes through untouched
            __m256 clamped = _mm256_max_ps(lo, _mm256_min_ps(hi, v));
            h = _mm256_cvtps_ph(clamped, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            back = _mm256_cvtph_ps(h);
        }
        _mm_storeu_si128((__m128i *)(out + i), h);
        _mm256_storeu_ps(x + i, _mm256_sub_ps(v, back));
    }
    return i;
}

__attribute__((target("avx2,f16c"))) static long decode_add_vector(int bf16, const uint16_t *in, long len, float scale,
                                                                    float *out) {
    const __m256 s = _mm256_set1_ps(scale);
    long i = 0;
    for (; i + 8 <= len; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(in + i));
        __m256 v = bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h);
        // a product, then a sum: no fused multiply-add, so that the bits are the scalar loop's
        _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i), _mm256_mul_ps(s, v)));
    }
    return i;
}
#endif

void cast16_encode(int bf16, float *x, long len, uint16_t *out) {
    long done = 0;
#ifdef VECTOR_CAST
    if (compress_vector_ok()) done = encode_vector(bf16, x, len, out);
#endif
    encode_scalar(bf16, x, done, len, out);
}

void cast16_decode_add(int bf16, const uint16_t *in, long len, float scale, float *out) {
    long done = 0;
#ifdef VECTOR_CAST
    if (compress_vector_ok()) done = decode_add_vector(bf16, in, len, scale, out);
#endif
    decode_add_scalar(bf16, in, done, len, scale, out);
}
