/*
 * pool2_body.h: pool2.c's kernels, included once per instruction set: NAME(f) names that build's f,
 * TARGET is its target attribute, PV its lanes per vector and EVEN, ODD, LOW, HIGH its shuffle masks
 * (as brace lists), all undefined again at the end. GCC lowers a vector comparison by the instruction set of the function it is written
 * in, so helpers shared between the builds (compiled for baseline x86-64) would compare lane by lane
 * even inside an AVX-512 function: everything here is written once per build.
 */
typedef float NAME(vf) __attribute__((vector_size(PV * sizeof(float))));
typedef int32_t NAME(vi) __attribute__((vector_size(PV * sizeof(int32_t))));
#define vec NAME(vf)
#define ivec NAME(vi)
#define VL PV
#define vload(p) NAME(load)(p)
#define iload(p) NAME(iload)(p)

TARGET static inline vec NAME(load)(const float *p) {
    vec v;
    memcpy(&v, p, sizeof v);
    return v;
}

TARGET static inline ivec NAME(iload)(const int32_t *p) {
    ivec v;
    memcpy(&v, p, sizeof v);
    return v;
}

// A candidate into the running maximum: larger, or a NaN (unless top is one already).
#define TAKE(cand, off)                                                                                      \
    do {                                                                                                     \
        ivec take = ~((cand) <= top) & (top == top);                                                         \
        top = (vec)SELECT(take, (ivec)(cand), (ivec)top);                                                    \
        best = SELECT(take, (ivec){0} + (off), best);                                                        \
    } while (0)

TARGET static void NAME(forward)(const float *x, float *y, int32_t *argmax, int planes, int h, int w, int relu) {
    int oh = h / 2, ow = w / 2;
    const float *x_end = x + (long)planes * h * w;
    const float *y_end = y + (long)planes * oh * ow;
    for (long p = 0; p < planes; p++) {
        for (int oi = 0; oi < oh; oi++) {
            const float *r0 = x + (p * h + 2 * oi) * w, *r1 = r0 + w;
            float *out = y + (p * oh + oi) * ow;
            int32_t *arg = argmax + (p * oh + oi) * ow;
            int at0 = 2 * oi * w, oj = 0;
            for (; oj < ow && r1 + 2 * oj + 2 * VL <= x_end && out + oj + VL <= y_end; oj += VL) {
                vec a0 = vload(r0 + 2 * oj), a1 = vload(r0 + 2 * oj + VL);
                vec b0 = vload(r1 + 2 * oj), b1 = vload(r1 + 2 * oj + VL);
                vec top = __builtin_shuffle(a0, a1, (ivec)EVEN);   // the candidates in raster order
                ivec best = {0};
                TAKE(__builtin_shuffle(a0, a1, (ivec)ODD), 1);
                TAKE(__builtin_shuffle(b0, b1, (ivec)EVEN), w);
                TAKE(__builtin_shuffle(b0, b1, (ivec)ODD), w + 1);
                if (relu) top = (vec)((ivec)top & ~(top <= 0.0f));   // +0 for <= 0; NaN stays
                memcpy(out + oj, &top, sizeof top);
                ivec at = (ivec){0} + (at0 + 2 * oj) + (ivec)EVEN + best;
                memcpy(arg + oj, &at, sizeof at);
            }
            for (; oj < ow; oj++) pool_one(r0, r1, out, arg, oj, w, at0, relu);
        }
    }
}

TARGET static void NAME(backward)(const float *dy, const float *y, const int32_t *argmax, float *dx, int planes, int h,
                          int w) {
    int oh = h / 2, ow = w / 2;
    const float *dy_end = dy + (long)planes * oh * ow;
    const float *dx_end = dx + (long)planes * h * w;
    for (long p = 0; p < planes; p++) {
        for (int oi = 0; oi < oh; oi++) {
            long o = (p * oh + oi) * ow;
            float *dr0 = dx + (p * h + 2 * oi) * w, *dr1 = dr0 + w;
            int at0 = 2 * oi * w, vectors = 0;   // the outputs [0, vectors) go in vectors
            while (vectors < ow && dy + o + vectors + VL <= dy_end && dr1 + 2 * vectors + 2 * VL <= dx_end) {
                vectors += VL;
            }
            // r0's vectors before r1's: a last vector's overhang past r0's end lands in r1, which is then
            // written over (r1's own lands in the next rows, written later)
            for (int r = 0; r < 2; r++) {
                float *dr = r == 0 ? dr0 : dr1;
                for (int oj = 0; oj < vectors; oj += VL) {
                    vec g = vload(dy + o + oj);
                    if (y != NULL) g = (vec)((ivec)g & (vload(y + o + oj) > 0.0f));
                    // the argmax within its window: 0, 1, w or w + 1
                    ivec at = iload(argmax + o + oj) - ((ivec){0} + (at0 + 2 * oj) + (ivec)EVEN);
                    vec left = (vec)((ivec)g & (at == r * w)), right = (vec)((ivec)g & (at == r * w + 1));
                    vec lo = __builtin_shuffle(left, right, (ivec)LOW);
                    vec hi = __builtin_shuffle(left, right, (ivec)HIGH);
                    memcpy(dr + 2 * oj, &lo, sizeof(vec));
                    memcpy(dr + 2 * oj + VL, &hi, sizeof(vec));
                }
            }
            int oj = vectors;
            for (; oj < ow; oj++) {
                float g = y == NULL || y[o + oj] > 0.0f ? dy[o + oj] : 0.0f;
                unpool_one(g, argmax[o + oj] - at0 - 2 * oj, dr0, dr1, oj, w);
            }
        }
    }
}

#undef TAKE
#undef vec
#undef ivec
#undef VL
#undef vload
#undef iload
#undef NAME
#undef TARGET
#undef PV
#undef EVEN
#undef ODD
#undef LOW
#undef HIGH
