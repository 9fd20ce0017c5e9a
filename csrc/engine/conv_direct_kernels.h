/*
 * conv_direct_kernels.h: conv_direct.c's kernels, compiled once per instruction-set level by
 * conv_direct_sse2.c, conv_direct_avx2.c and conv_direct_avx512.c, which set the level's target and:
 *   VL            floats per vector (4, 8, 16)
 *   REGS          vector registers (16 xmm, 16 ymm, 32 zmm): every tile below is sized so that its
 *                 accumulators, the operands it loads and a broadcast fit, with no spills
 *   CONV_KERNELS  the name of the level's table of entry points (conv_direct.h)
 * One source for every level: the loops are the same, only the vector width and the tile sizes change.
 * Every sum is taken in a fixed order for a level, so results are bitwise repeatable on it; between
 * levels they differ in the last bits (vector width, FMA).
 */
#include "conv_direct.h"

#include <string.h>

#pragma GCC diagnostic ignored "-Wpsabi"   // vectors passed between inlined helpers: no ABI crosses here

// Multiply-adds contract into FMA instructions where the target has them (-std=c11 turns contraction
// off): one rounding instead of two, and half the instructions.
#pragma GCC optimize("fp-contract=fast")

// -O3's predictive commoning carries a loop's loads over to its next iteration in registers: in dW by
// channels that is K - 1 broadcast inputs on top of the accumulators, which 16 registers cannot hold
// (AVX2 and SSE2 spilled accumulators to the stack for them). With 32 the carried values are scalars
// beside the accumulators, as they have always been in the AVX-512 build.
#if REGS < 32
#pragma GCC optimize("no-predictive-commoning")
#endif

typedef float vec __attribute__((vector_size(VL * sizeof(float))));

// The most accumulators a forward tile keeps: with 16 registers, 12 leave room for the tile's input
// vectors and the broadcast weight (AVX2's 16 ymm at 6 channels x 2 vectors: 12 + 2 + 1).
#define TILE_ACC (REGS >= 32 ? 16 : 12)

#define INLINE static inline __attribute__((always_inline))

INLINE vec vload(const float *p) {
    vec v;
    memcpy(&v, p, sizeof v);
    return v;
}

// The short copies below (rows of 10 to 32 floats) cost more as calls to memcpy than the copying
// itself; GCC would turn these loops back into such calls (its loop distribution), hence the pragma.
#pragma GCC optimize("no-tree-loop-distribute-patterns")

// dst[0, n) = the first n lanes of *v (n <= VL)
INLINE void store_lanes(float *dst, const vec *v, int n) {
    if (n == VL) {
        memcpy(dst, v, sizeof *v);
        return;
    }
    float lanes[VL];
    memcpy(lanes, v, sizeof lanes);
    for (int l = 0; l < n; l++) dst[l] = lanes[l];
}

// dst[0, n) = src[0, n), a vector at a time
INLINE void copy_floats(float *restrict dst, const float *restrict src, long n) {
    long i = 0;
    for (; i + VL <= n; i += VL) memcpy(dst + i, src + i, sizeof(vec));
    for (; i < n; i++) dst[i] = src[i];
}

INLINE void zero_floats(float *dst, long n) {
    for (long i = 0; i < n; i++) dst[i] = 0.0f;
}

static long round_up(long n, long to) {
    return (n + to - 1) / to * to;
}

// ---------------------------------------------------------------------------------------------------
// Shapes: a stride-1 convolution of in_c planes (in_h, in_w), zero-padded by pad, into out_c planes.

typedef struct {
    int in_c, in_h, in_w, out_c, out_h, out_w, k, pad;
} Dims;

// Output vectors per tile along a row: 1 or 2.
static int tile_vectors(int out_w) {
    return out_w <= VL ? 1 : 2;
}

// A padded input row: room for every tile's loads, out_w rounded up to whole vectors plus k - 1
// (at least in_w + 2 pad, as out_w = in_w + 2 pad - k + 1).
static long padded_width(const Dims *d) {
    return round_up(d->out_w, VL) + d->k - 1;
}

static long padded_floats(const Dims *d, int B) {
    return (long)B * d->in_c * (d->in_h + 2L * d->pad) * padded_width(d);
}

// Output channels per tile: 4, 6, 8, 12 or 16, at most TILE_ACC accumulators (channels x vectors);
// the smallest that holds out_c, so that LeNet's 6 channels waste no multiply-adds.
static int channel_block(const Dims *d) {
    static const int blocks[] = {4, 6, 8, 12, 16};
    int most = TILE_ACC / tile_vectors(d->out_w);
    for (int i = 0; i < 5 && blocks[i] <= most; i++) {
        if (d->out_c <= blocks[i]) return blocks[i];
    }
    return most;
}

static long packed_floats(const Dims *d) {
    return round_up(d->out_c, channel_block(d)) * (long)d->in_c * d->k * d->k;
}

// x (B, in_c, in_h, in_w) into xp (B, in_c, in_h + 2 pad, padded_width), zeros around.
static void pad_input(const Dims *d, const float *x, float *xp, int B) {
    long pw = padded_width(d), ph = d->in_h + 2L * d->pad;
    for (long p = 0; p < (long)B * d->in_c; p++) {
        float *plane = xp + p * ph * pw;
        const float *src = x + p * d->in_h * d->in_w;
        memset(plane, 0, sizeof(float) * (size_t)(d->pad * pw));
        for (int i = 0; i < d->in_h; i++) {
            float *row = plane + (d->pad + i) * pw;
            zero_floats(row, d->pad);
            copy_floats(row + d->pad, src + (long)i * d->in_w, d->in_w);
            zero_floats(row + d->pad + d->in_w, pw - d->pad - d->in_w);
        }
        memset(plane + (d->pad + d->in_h) * pw, 0, sizeof(float) * (size_t)(d->pad * pw));
    }
}

// wp (blocks, in_c, k, k, ocb) from W (out_c, in_c, k, k), or from W flipped in both kernel axes with
// the channel axes swapped (W is then (in_c, out_c, k, k) of the forward convolution: dx's kernel).
// Channels past out_c are zero.
static void pack_weights(const Dims *d, const float *W, float *wp, int flipped) {
    int ocb = channel_block(d), k = d->k, kk = k * k;
    long blocks = round_up(d->out_c, ocb) / ocb;
    for (long blk = 0; blk < blocks; blk++) {
        for (int c = 0; c < d->in_c; c++) {
            for (int t = 0; t < kk; t++) {
                float *dst = wp + ((blk * d->in_c + c) * kk + t) * ocb;
                for (int o = 0; o < ocb; o++) {
                    long oc = blk * ocb + o;
                    float v = 0.0f;
                    if (oc < d->out_c) {
                        v = flipped ? W[((long)c * d->out_c + oc) * kk + (kk - 1 - t)]
                                    : W[(oc * d->in_c + c) * kk + t];
                    }
                    dst[o] = v;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// The forward tile: OCB channels x J vectors of output, from the padded input rows at x (channel planes
// `plane` floats apart, rows pw apart) and the block's packed weights w. Vector j reads its input at
// x + j * xstep and writes its first n[j] lanes at dst[o] + j * ystep: J = 2 is either two vectors of a
// row (xstep = ystep = VL) or the same VL columns of two rows, which keeps 2 x OCB multiply-adds in
// flight where one row of a block of 6 or 8 channels would wait on the FMA latency. Registers: OCB x J
// accumulators, J inputs and the broadcast weight (TILE_ACC).

INLINE void tile(const float *x, long plane, long pw, int in_c, int k, const float *w, const float *bias,
                 float *const *dst, long xstep, long ystep, const int *n, const int OCB, const int J) {
    vec acc[TILE_ACC][2];
    for (int o = 0; o < OCB; o++) {
        for (int j = 0; j < J; j++) acc[o][j] = (vec){0} + bias[o];
    }
    for (int c = 0; c < in_c; c++) {
        for (int ki = 0; ki < k; ki++) {
            const float *row = x + c * plane + ki * pw;
            for (int kj = 0; kj < k; kj++, w += OCB) {
                vec in[2];
                for (int j = 0; j < J; j++) in[j] = vload(row + kj + j * xstep);
                for (int o = 0; o < OCB; o++) {
                    for (int j = 0; j < J; j++) acc[o][j] += w[o] * in[j];
                }
            }
        }
    }
    for (int o = 0; o < OCB; o++) {
        if (dst[o] == NULL) continue;
        for (int j = 0; j < J; j++) {
            if (n[j] > 0) store_lanes(dst[o] + j * ystep, &acc[o][j], n[j]);
        }
    }
}

// One tile of ocb channels and `vectors` vectors, the block sizes spelled out so each is compiled with
// its accumulators in registers (only those channel_block can pick: at most TILE_ACC accumulators).
INLINE void run_tile(const float *x, long plane, long pw, int in_c, int k, const float *w, const float *b,
                     float *const *dst, long xstep, long ystep, const int *n, int ocb, int vectors) {
    switch (ocb * 4 + vectors) {
    case 4 * 4 + 2: tile(x, plane, pw, in_c, k, w, b, dst, xstep, ystep, n, 4, 2); break;
    case 4 * 4 + 1: tile(x, plane, pw, in_c, k, w, b, dst, xstep, ystep, n, 4, 1); break;
    case 6 * 4 + 2: tile(x, plane, pw, in_c, k, w, b, dst, xstep, ystep, n, 6, 2); break;
    case 6 * 4 + 1: tile(x, plane, pw, in_c, k, w, b, dst, xstep, ystep, n, 6, 1); break;
    case 8 * 4 + 1: tile(x, plane, pw, in_c, k, w, b, dst, xstep, ystep, n, 8, 1); break;
#if TILE_ACC >= 16
    case 8 * 4 + 2: tile(x, plane, pw, in_c, k, w, b, dst, xstep, ystep, n, 8, 2); break;
    case 12 * 4 + 1: tile(x, plane, pw, in_c, k, w, b, dst, xstep, ystep, n, 12, 1); break;
    default: tile(x, plane, pw, in_c, k, w, b, dst, xstep, ystep, n, 16, 1); break;
#else
    default: tile(x, plane, pw, in_c, k, w, b, dst, xstep, ystep, n, 12, 1); break;
#endif
    }
}

// y (B, out_c, out_h, out_w) = bias + the convolution of xp (pad_input's) with wp (pack_weights').
static void forward_tiles(const Dims *d, const float *xp, const float *wp, const float *bias, float *y, int B) {
    int ocb = channel_block(d), J = tile_vectors(d->out_w);
    int row_pairs = J == 1 && 2 * ocb <= TILE_ACC;   // rows of one vector, few channels: two rows a tile
    long pw = padded_width(d), plane = (d->in_h + 2L * d->pad) * pw, ohw = (long)d->out_h * d->out_w;
    long wblock = (long)d->in_c * d->k * d->k * ocb;
    for (int n = 0; n < B; n++) {
        const float *xn = xp + (long)n * d->in_c * plane;
        for (int o0 = 0; o0 < d->out_c; o0 += ocb) {
            float b[16];
            for (int o = 0; o < ocb; o++) b[o] = bias != NULL && o0 + o < d->out_c ? bias[o0 + o] : 0.0f;
            const float *w = wp + (o0 / ocb) * wblock;
            for (int oi = 0; oi < d->out_h; oi += row_pairs ? 2 : 1) {
                for (int s0 = 0; s0 < d->out_w; s0 += J * VL) {
                    float *dst[16];
                    for (int o = 0; o < ocb; o++) {
                        dst[o] = o0 + o < d->out_c ? y + ((long)n * d->out_c + o0 + o) * ohw + (long)oi * d->out_w + s0
                                                   : NULL;
                    }
                    const float *x = xn + oi * pw + s0;
                    int cols = d->out_w - s0;
                    if (row_pairs) {
                        int n2[2] = {cols, cols}, rows = oi + 1 < d->out_h ? 2 : 1;
                        run_tile(x, plane, pw, d->in_c, d->k, w, b, dst, pw, d->out_w, n2, ocb, rows);
                    } else {   // J vectors along the row; a last strip of VL columns or fewer takes one
                        int n2[2] = {cols < VL ? cols : VL, cols - VL < VL ? cols - VL : VL};
                        int vectors = cols <= VL ? 1 : J;
                        run_tile(x, plane, pw, d->in_c, d->k, w, b, dst, VL, VL, n2, ocb, vectors);
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// The weights' gradient: dW[o][c][ki][kj] = sum over n, oi, oj of dy[n][o][oi][oj] xp[n][c][oi + ki][oj + kj].
// dyp is dy with each row zero-padded to whole vectors and out_c to whole blocks of OB channels.

INLINE void dw_block(const Dims *d, const float *xp, const float *dyp, long dyrow, float *dW, int o0, int c, int ki,
                     int j, int B, int accumulate, const int OB, const int K) {
    long pw = padded_width(d), ph = d->in_h + 2L * d->pad, oc_r = round_up(d->out_c, OB);
    vec acc[4][7];
    for (int o = 0; o < OB; o++) {
        for (int kj = 0; kj < K; kj++) acc[o][kj] = (vec){0};
    }
    for (int n = 0; n < B; n++) {
        const float *x = xp + (((long)n * d->in_c + c) * ph + ki) * pw + j * VL;
        const float *g = dyp + ((long)n * oc_r + o0) * d->out_h * dyrow + j * VL;
        for (int oi = 0; oi < d->out_h; oi++, x += pw, g += dyrow) {
            vec grad[4];   // the OB gradients, then one input vector at a time for each kernel column
            for (int o = 0; o < OB; o++) grad[o] = vload(g + (long)o * d->out_h * dyrow);
            for (int kj = 0; kj < K; kj++) {
                vec in = vload(x + kj);
                for (int o = 0; o < OB; o++) acc[o][kj] += grad[o] * in;
            }
        }
    }
    for (int o = 0; o < OB && o0 + o < d->out_c; o++) {
        for (int kj = 0; kj < K; kj++) {
            float lanes[VL], sum = 0.0f;
            memcpy(lanes, &acc[o][kj], sizeof lanes);
            for (int l = 0; l < VL; l++) sum += lanes[l];
            float *at = dW + (((long)(o0 + o) * d->in_c + c) * K + ki) * K + kj;
            *at = accumulate || j > 0 ? *at + sum : sum;
        }
    }
}

// Channels per dW block: the accumulators (OB x K vectors), the OB gradients and an input must fit the
// registers (with 16: K = 5 takes 2 x 5 + 2 + 1). A constant expression, so each case below is compiled
// with its accumulators in registers.
#define DW_OB(k) (REGS >= 32 ? ((k) <= 3 ? 4 : (k) <= 5 ? 3 : 2) : ((k) <= 2 ? 4 : (k) <= 3 ? 3 : (k) <= 6 ? 2 : 1))

// Examples per pass of the dW kernels: each pass reads its examples' input and gradient once per
// (channel block, input channel, kernel row), so they should stay in the core's cache (LeNet's first
// convolution at batch 256 took twice as long per example as at 64 without this).
#define DW_CHUNK_BYTES (512L * 1024)

static int dw_chunk(long floats_per_example) {
    long n = DW_CHUNK_BYTES / (long)sizeof(float) / (floats_per_example > 0 ? floats_per_example : 1);
    return n < 1 ? 1 : n > 1 << 20 ? 1 << 20 : (int)n;
}

static void weight_grad_part(const Dims *d, const float *xp, const float *dyp, float *dW, int B, int accumulate,
                                 int ob, int J, long dyrow) {
    for (int o0 = 0; o0 < d->out_c; o0 += ob) {
        for (int c = 0; c < d->in_c; c++) {
            for (int ki = 0; ki < d->k; ki++) {
                for (int j = 0; j < J; j++) {
                    switch (d->k) {
                    case 1: dw_block(d, xp, dyp, dyrow, dW, o0, c, ki, j, B, accumulate, DW_OB(1), 1); break;
                    case 2: dw_block(d, xp, dyp, dyrow, dW, o0, c, ki, j, B, accumulate, DW_OB(2), 2); break;
                    case 3: dw_block(d, xp, dyp, dyrow, dW, o0, c, ki, j, B, accumulate, DW_OB(3), 3); break;
                    case 4: dw_block(d, xp, dyp, dyrow, dW, o0, c, ki, j, B, accumulate, DW_OB(4), 4); break;
                    case 5: dw_block(d, xp, dyp, dyrow, dW, o0, c, ki, j, B, accumulate, DW_OB(5), 5); break;
                    case 6: dw_block(d, xp, dyp, dyrow, dW, o0, c, ki, j, B, accumulate, DW_OB(6), 6); break;
                    default: dw_block(d, xp, dyp, dyrow, dW, o0, c, ki, j, B, accumulate, DW_OB(7), 7); break;
                    }
                }
            }
        }
    }
}

static void weight_grad(const Dims *d, const float *xp, const float *dyp, float *dW, int B, int accumulate) {
    int ob = DW_OB(d->k), J = (int)(round_up(d->out_w, VL) / VL);
    long dyrow = (long)J * VL, xs = (long)d->in_c * (d->in_h + 2L * d->pad) * padded_width(d);
    long gs = round_up(d->out_c, ob) * d->out_h * dyrow;
    int chunk = dw_chunk(xs + gs);
    for (int n0 = 0; n0 < B; n0 += chunk) {
        int nb = B - n0 < chunk ? B - n0 : chunk;
        weight_grad_part(d, xp + n0 * xs, dyp + n0 * gs, dW, nb, accumulate || n0 > 0, ob, J, dyrow);
    }
}

// The same sums with output channels in vectors: dyt (B, out_h, out_w, out_c rounded up to DW_CV vectors)
// holds dy channels-last, and one input channel's taps are accumulators, each a broadcast of one input
// value times the pixel's gradient vectors per pixel. For 16 channels or more this fills every lane
// and loads nothing across a cache line; the kernel above wastes the lanes past out_w (6 of 16 in
// LeNet's second convolution at 16 lanes) and loads each input row at K offsets.
// A pass takes DW_CV channel vectors and KR kernel rows: with 32 registers all K x K taps of one
// vector (25 accumulators at K = 5); with 16, one kernel row of two vectors (10, + 2 gradients + 1).
#define DW_CV (REGS >= 32 ? 1 : 2)
#define DW_KR(k) (REGS >= 32 ? (k) : 1)

INLINE void dw_channels(const Dims *d, const float *xp, const float *dyt, float *dW, int o0, int c, int ki0, int B,
                        int accumulate, const int K, const int KR) {
    long pw = padded_width(d), ph = d->in_h + 2L * d->pad, ocr = round_up(d->out_c, DW_CV * VL);
    vec acc[5][5][DW_CV];
    for (int r = 0; r < KR; r++) {
        for (int kj = 0; kj < K; kj++) {
            for (int v = 0; v < DW_CV; v++) acc[r][kj][v] = (vec){0};
        }
    }
    for (int n = 0; n < B; n++) {
        for (int oi = 0; oi < d->out_h; oi++) {
            const float *x = xp + (((long)n * d->in_c + c) * ph + oi + ki0) * pw;
            const float *g = dyt + ((long)n * d->out_h + oi) * d->out_w * ocr + o0;
            for (int oj = 0; oj < d->out_w; oj++) {
                vec grad[DW_CV];
                for (int v = 0; v < DW_CV; v++) grad[v] = vload(g + oj * ocr + v * VL);
                for (int r = 0; r < KR; r++) {
                    for (int kj = 0; kj < K; kj++) {
                        float in = x[r * pw + oj + kj];
                        for (int v = 0; v < DW_CV; v++) acc[r][kj][v] += in * grad[v];
                    }
                }
            }
        }
    }
    for (int r = 0; r < KR; r++) {
        for (int kj = 0; kj < K; kj++) {
            float lanes[DW_CV * VL];
            memcpy(lanes, &acc[r][kj], sizeof lanes);
            for (int o = 0; o < DW_CV * VL && o0 + o < d->out_c; o++) {
                float *at = dW + (((long)(o0 + o) * d->in_c + c) * K + ki0 + r) * K + kj;
                *at = accumulate ? *at + lanes[o] : lanes[o];
            }
        }
    }
}

static int by_channels(const Dims *d) {
    return d->out_c >= 12 && d->k <= 5;
}

static void weight_grad_by_channels_part(const Dims *d, const float *xp, const float *dyt, float *dW, int B,
                                         int accumulate) {
    for (int o0 = 0; o0 < d->out_c; o0 += DW_CV * VL) {
        for (int c = 0; c < d->in_c; c++) {
            for (int ki0 = 0; ki0 < d->k; ki0 += DW_KR(d->k)) {
                switch (d->k) {
                case 1: dw_channels(d, xp, dyt, dW, o0, c, ki0, B, accumulate, 1, DW_KR(1)); break;
                case 2: dw_channels(d, xp, dyt, dW, o0, c, ki0, B, accumulate, 2, DW_KR(2)); break;
                case 3: dw_channels(d, xp, dyt, dW, o0, c, ki0, B, accumulate, 3, DW_KR(3)); break;
                case 4: dw_channels(d, xp, dyt, dW, o0, c, ki0, B, accumulate, 4, DW_KR(4)); break;
                default: dw_channels(d, xp, dyt, dW, o0, c, ki0, B, accumulate, 5, DW_KR(5)); break;
                }
            }
        }
    }
}

static void weight_grad_by_channels(const Dims *d, const float *xp, const float *dyt, float *dW, int B,
                                    int accumulate) {
    long xs = (long)d->in_c * (d->in_h + 2L * d->pad) * padded_width(d);
    long gs = (long)d->out_h * d->out_w * round_up(d->out_c, DW_CV * VL);
    int chunk = dw_chunk(xs + gs);
    for (int n0 = 0; n0 < B; n0 += chunk) {
        int nb = B - n0 < chunk ? B - n0 : chunk;
        weight_grad_by_channels_part(d, xp + n0 * xs, dyt + n0 * gs, dW, nb, accumulate || n0 > 0);
    }
}

// dy (B, out_c, out_h, out_w) channels-last into dyt (B, out_h, out_w, out_c rounded up to DW_CV vectors,
// zeros there).
static void channels_last(const Dims *d, const float *dy, float *dyt, int B) {
    long ocr = round_up(d->out_c, DW_CV * VL), ohw = (long)d->out_h * d->out_w;
    for (long n = 0; n < B; n++) {
        float *dst = dyt + n * ohw * ocr;
        const float *src = dy + n * d->out_c * ohw;
        for (long p = 0; p < ohw; p++) {
            for (long o = 0; o < d->out_c; o++) dst[p * ocr + o] = src[o * ohw + p];
            for (long o = d->out_c; o < ocr; o++) dst[p * ocr + o] = 0.0f;
        }
    }
}

// dy (B, out_c, out_h, out_w) into dyp (B, out_c rounded up to blocks of ob, out_h, rows of `row` floats),
// zeros after each row's out_w and in the extra channels.
static void pad_rows(const Dims *d, const float *dy, float *dyp, long row, int ob, int B) {
    long oc_r = round_up(d->out_c, ob);
    for (long n = 0; n < B; n++) {
        for (long o = 0; o < oc_r; o++) {
            float *dst = dyp + (n * oc_r + o) * d->out_h * row;
            if (o >= d->out_c) {
                memset(dst, 0, sizeof(float) * (size_t)(d->out_h * row));
                continue;
            }
            const float *src = dy + (n * d->out_c + o) * d->out_h * d->out_w;
            for (int i = 0; i < d->out_h; i++) {
                copy_floats(dst + i * row, src + (long)i * d->out_w, d->out_w);
                zero_floats(dst + i * row + d->out_w, row - d->out_w);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// The level's entry points (conv_direct.h's table)

static Dims dims_of(const ConvShape *s) {
    return (Dims){s->in_c, s->in_h, s->in_w, s->out_c, s->out_h, s->out_w, s->k, s->pad};
}

// dx's convolution: dy (out_c planes) padded by k - 1 - pad, into in_c planes of the input's size.
static Dims dims_of_dx(const ConvShape *s) {
    return (Dims){s->out_c, s->out_h, s->out_w, s->in_c, s->in_h, s->in_w, s->k, s->k - 1 - s->pad};
}

static long cols_floats(const ConvShape *s, int B) {
    Dims d = dims_of(s);
    return padded_floats(&d, B) + packed_floats(&d);
}

static long tmp_floats(const ConvShape *s, int B) {
    Dims t = dims_of_dx(s);
    long dw = (long)B * round_up(s->out_c, DW_OB(s->k)) * s->out_h * round_up(s->out_w, VL);
    long dwc = (long)B * s->out_h * s->out_w * round_up(s->out_c, DW_CV * VL);
    dw = dwc > dw ? dwc : dw;
    long dx = padded_floats(&t, B) + packed_floats(&t);
    return dw > dx ? dw : dx;
}

static void forward(const ConvShape *s, const float *x, const float *W, const float *b, float *y, float *cols, int B) {
    Dims d = dims_of(s);
    float *wp = cols + padded_floats(&d, B);
    pad_input(&d, x, cols, B);
    pack_weights(&d, W, wp, 0);
    forward_tiles(&d, cols, wp, b, y, B);
}

// The bias' gradient: per example in float (VL lanes, then across them), over examples in double.
static void bias_grad(const ConvShape *s, const float *dy, float *db, int B, int accumulate) {
    long ohw = (long)s->out_h * s->out_w;
    for (int oc = 0; oc < s->out_c; oc++) {
        double sum = 0.0;
        for (int n = 0; n < B; n++) {
            const float *plane = dy + ((long)n * s->out_c + oc) * ohw;
            vec part = {0};
            long i = 0;
            for (; i + VL <= ohw; i += VL) part += vload(plane + i);
            float lanes[VL], total = 0.0f;
            memcpy(lanes, &part, sizeof lanes);
            for (int l = 0; l < VL; l++) total += lanes[l];
            for (; i < ohw; i++) total += plane[i];
            sum += total;
        }
        db[oc] = accumulate ? db[oc] + (float)sum : (float)sum;
    }
}

static void backward(const ConvShape *s, const float *cols, const float *W, const float *dy, float *dW, float *db,
                     float *dx, float *tmp, int B, int accumulate) {
    Dims d = dims_of(s);
    int ob = DW_OB(s->k);
    long row = round_up(s->out_w, VL);
    bias_grad(s, dy, db, B, accumulate);
    if (by_channels(&d)) {
        channels_last(&d, dy, tmp, B);
        weight_grad_by_channels(&d, cols, tmp, dW, B, accumulate);
    } else {
        pad_rows(&d, dy, tmp, row, ob, B);
        weight_grad(&d, cols, tmp, dW, B, accumulate);
    }
    if (dx != NULL) {   // tmp is done with: it takes dy padded for dx's convolution
        Dims t = dims_of_dx(s);
        float *wp = tmp + padded_floats(&t, B);
        pad_input(&t, dy, tmp, B);
        pack_weights(&t, W, wp, 1);
        forward_tiles(&t, tmp, wp, NULL, dx, B);
    }
}

const ConvKernels CONV_KERNELS = {cols_floats, tmp_floats, forward, backward, bias_grad};
