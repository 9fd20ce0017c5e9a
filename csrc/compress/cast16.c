/*
 * cast16.c: fp16 and bf16, each value rounded to the nearest 16-bit one (ties to even, as NumPy and
 * torch round), summed by the caller in float32. A value past float16's range becomes its largest
 * finite value, not infinity: the error feedback then sends the rest later, where an infinity would
 * poison the sum and the residual for good. NaN stays NaN.
 */
#include "compress.h"

#include <math.h>

#include "algorithms/shm.h"

#define HALF_MAX 65504.0f

void cast16_encode(int bf16, float *x, long len, uint16_t *out) {
    for (long i = 0; i < len; i++) {
        float v = x[i];
        if (!bf16 && fabsf(v) > HALF_MAX && !isnan(v)) {
            v = v > 0 ? HALF_MAX : -HALF_MAX;
        }
        uint16_t h = bf16 ? pd_float_to_bf16(v) : pd_float_to_half(v);
        out[i] = h;
        x[i] -= bf16 ? pd_bf16_to_float(h) : pd_half_to_float(h);
    }
}

void cast16_decode_add(int bf16, const uint16_t *in, long len, float scale, float *out) {
    if (bf16) {
        for (long i = 0; i < len; i++) out[i] += scale * pd_bf16_to_float(in[i]);
    } else {
        for (long i = 0; i < len; i++) out[i] += scale * pd_half_to_float(in[i]);
    }
}
