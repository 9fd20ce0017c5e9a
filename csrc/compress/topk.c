/*
 * topk.c: the k entries largest in magnitude, as (index, value) pairs in index order. Ties at the
 * threshold go to the lower index, and NaN counts as the largest magnitude (it is sent, not hidden in
 * the residual), so the choice is the same wherever it is made.
 */
#include "encodings.h"

#include <math.h>
#include <stdio.h>

long topk_count(double ratio, long len) {
    if (len <= 0) {
        return 0;
    }
    long k = (long)ceil(ratio * (double)len - 1e-9);
    return k < 1 ? 1 : k > len ? len : k;
}

static float magnitude(float v) {
    return isnan(v) ? INFINITY : fabsf(v);
}

// The k-th largest of a[0..n) (1-based k), reordering a: quickselect with a median-of-three pivot.
static float kth_largest(float *a, long n, long k) {
    long lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        long mid = lo + (hi - lo) / 2;
        float x = a[lo], y = a[mid], z = a[hi];
        float pivot = x > y ? (y > z ? y : (x > z ? z : x)) : (x > z ? x : (y > z ? z : y));
        long i = lo, j = hi;
        while (i <= j) {
            while (a[i] > pivot) i++;
            while (a[j] < pivot) j--;
            if (i <= j) {
                float t = a[i];
                a[i] = a[j];
                a[j] = t;
                i++;
                j--;
            }
        }
        if (want <= j) {
            hi = j;
        } else if (want >= i) {
            lo = i;
        } else {
            return a[want];
        }
    }
    return a[want];
}

void topk_encode(float *x, long len, long k, float *mag, int32_t *index, float *value) {
    for (long i = 0; i < len; i++) mag[i] = magnitude(x[i]);
    float threshold = k > 0 ? kth_largest(mag, len, k) : INFINITY;
    long above = 0;
    for (long i = 0; i < len; i++) above += magnitude(x[i]) > threshold;
    long ties = k - above, taken = 0;   // entries at the threshold to take, lowest indices first
    for (long i = 0; i < len; i++) {
        float m = magnitude(x[i]);
        int take = m > threshold || (m == threshold && ties > 0);
        if (m == threshold && take) {
            ties--;
        }
        if (take) {   // sent whole: nothing of it stays in the residual
            index[taken] = (int32_t)i;
            value[taken] = x[i];
            x[i] = 0.0f;
            taken++;
        }
    }
}

// encode writes the indices in increasing order inside [0, len): checked as one pass of compares without
// an early exit (the compiler vectorises it), so a valid payload costs a read of its indices; only a bad
// one is searched again, for the message. Increasing also rules out an entry added twice.
int topk_check(const int32_t *index, long k, long len, char *err, size_t errlen) {
    if (k <= 0) {
        return 0;
    }
    int bad = index[0] < 0 || index[k - 1] >= len;
    for (long i = 1; i < k; i++) bad |= index[i] <= index[i - 1];
    if (!bad) {
        return 0;
    }
    for (long i = 0; i < k; i++) {
        if (index[i] < 0 || index[i] >= len) {
            snprintf(err, errlen, "topk pair %ld has index %d, outside [0, %ld)", i, (int)index[i], len);
            return -1;
        }
        if (i > 0 && index[i] <= index[i - 1]) {
            snprintf(err, errlen, "topk pair %ld has index %d after %d: the indices must increase", i, (int)index[i],
                     (int)index[i - 1]);
            return -1;
        }
    }
    return -1;   // (not reached: bad says one of them fails)
}

void topk_decode_add(const int32_t *index, const float *value, long k, float scale, float *out) {
    for (long i = 0; i < k; i++) out[index[i]] += scale * value[i];
}
