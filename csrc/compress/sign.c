/*
 * sign.c: one bit per entry (1: negative) and, per chunk of SIGN_CHUNK entries, one float32 scale,
 * the chunk's mean magnitude, so that the decoded chunk keeps the input's L1 norm (EF-SignSGD,
 * Karimireddy et al. 2019; 1-bit SGD, Seide et al. 2014, with error feedback). Layout: the scales,
 * then the bits, little end first.
 */
#include "compress.h"

#include <math.h>
#include <string.h>

static long chunks(long len) {
    return (len + SIGN_CHUNK - 1) / SIGN_CHUNK;
}

size_t sign_bytes(long len) {
    return (size_t)chunks(len) * sizeof(float) + (size_t)(len + 7) / 8;
}

void sign_encode(float *x, long len, void *out) {
    float *scale = out;
    unsigned char *bits = (unsigned char *)out + (size_t)chunks(len) * sizeof(float);
    memset(bits, 0, (size_t)(len + 7) / 8);
    for (long c = 0; c < chunks(len); c++) {
        long lo = c * SIGN_CHUNK, hi = lo + SIGN_CHUNK < len ? lo + SIGN_CHUNK : len;
        double sum = 0.0;
        for (long i = lo; i < hi; i++) sum += fabs((double)x[i]);
        float s = (float)(sum / (double)(hi - lo));
        scale[c] = s;
        for (long i = lo; i < hi; i++) {
            int negative = signbit(x[i]) != 0;
            bits[i >> 3] |= (unsigned char)(negative << (i & 7));
            x[i] -= negative ? -s : s;
        }
    }
}

void sign_decode_add(const void *in, long len, float scale, float *out) {
    const float *s = in;
    const unsigned char *bits = (const unsigned char *)in + (size_t)chunks(len) * sizeof(float);
    for (long i = 0; i < len; i++) {
        float v = s[i / SIGN_CHUNK];
        out[i] += scale * ((bits[i >> 3] >> (i & 7)) & 1 ? -v : v);
    }
}
