/*
 * data.c: our own loader for IDX files (the format of MNIST and Fashion-MNIST), and the shared
 * epoch order from which every rank takes its disjoint shard.
 *
 * IDX: a big-endian header (magic 0x00000803 for images with dims n, rows, cols; 0x00000801 for
 * labels with dim n) followed by unsigned bytes. Files may be gzip-compressed (Debian's
 * dataset-fashion-mnist ships .gz) or raw: zlib's gzread reads both. Every failure returns -1 with
 * a message naming the file and the fix; nothing here exits.
 */
#include "data.h"
#include "rng.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "zlib_calls.h"

// ---------------------------------------------------------------------------------------------------
// Reading

static int read_exact(gzFile f, void *buf, size_t len) {
    unsigned char *p = buf;
    while (len > 0) {
        unsigned chunk = len > (1u << 30) ? (1u << 30) : (unsigned)len;
        int got = gzread(f, p, chunk);
        if (got <= 0) {
            return -1;
        }
        p += got;
        len -= (size_t)got;
    }
    return 0;
}

static uint32_t be32(const unsigned char *b) {
    return ((uint32_t)b[0] << 24) | ((uint32_t)b[1] << 16) | ((uint32_t)b[2] << 8) | b[3];
}

#define FAIL(...)                              \
    do {                                       \
        snprintf(err, errlen, __VA_ARGS__);    \
        goto error;                            \
    } while (0)

static const char *FIX = "install Debian's dataset-fashion-mnist or point --data at a folder with the four "
                         "IDX files (train-images-idx3-ubyte[.gz], ...)";

// Read an IDX file with the given magic and number of dimensions. *data (malloc) holds the bytes.
static int read_idx(const char *path, uint32_t magic, int ndims, uint32_t *dims, unsigned char **data,
                    char *err, size_t errlen) {
    unsigned char header[16];
    *data = NULL;
    gzFile f = gzopen(path, "rb");
    if (f == NULL) {
        FAIL("cannot open %s: %s (%s)", path, strerror(errno), FIX);
    }
    if (read_exact(f, header, 4 + 4 * (size_t)ndims) < 0) {
        FAIL("%s is too short for an IDX header: the file is truncated or not IDX (%s)", path, FIX);
    }
    if (be32(header) != magic) {
        FAIL("%s is not an IDX %s file (magic 0x%08x, expected 0x%08x); the file is corrupt or is another "
             "kind of file (%s)", path, ndims == 1 ? "labels" : "images", be32(header), magic, FIX);
    }
    size_t total = 1;
    for (int i = 0; i < ndims; i++) {
        dims[i] = be32(header + 4 + 4 * i);
        if (dims[i] == 0 || dims[i] > (1u << 28)) {
            FAIL("%s has an implausible dimension %u in its header: the file is corrupt (%s)", path, dims[i], FIX);
        }
        total *= dims[i];
        if (total > ((size_t)1 << 34)) {  // also keeps the product from overflowing size_t
            FAIL("%s claims more than 16 GiB of data in its header: the file is corrupt (%s)", path, FIX);
        }
    }
    *data = malloc(total);
    if (*data == NULL) {
        FAIL("out of memory reading %s (%zu bytes)", path, total);
    }
    if (read_exact(f, *data, total) < 0) {
        FAIL("%s ends before its %zu data bytes: the file is truncated (%s)", path, total, FIX);
    }
    gzclose(f);
    return 0;
error:
    if (f != NULL) {
        gzclose(f);
    }
    free(*data);
    *data = NULL;
    return -1;
}

int dataset_load_idx(Dataset *ds, const char *images_path, const char *labels_path, char *err, size_t errlen) {
    uint32_t idims[3], ldims[1];
    unsigned char *pixels = NULL, *labels = NULL;
    memset(ds, 0, sizeof *ds);
    if (read_idx(images_path, 0x00000803u, 3, idims, &pixels, err, errlen) < 0 ||
        read_idx(labels_path, 0x00000801u, 1, ldims, &labels, err, errlen) < 0) {
        goto error;
    }
    if (idims[0] != ldims[0]) {
        FAIL("%s has %u images but %s has %u labels: the files do not belong together", images_path, idims[0],
             labels_path, ldims[0]);
    }
    ds->n = (int)idims[0];
    ds->rows = (int)idims[1];
    ds->cols = (int)idims[2];
    size_t pix = (size_t)ds->n * ds->rows * ds->cols;
    ds->images = malloc(pix * sizeof(float));
    ds->labels = malloc((size_t)ds->n * sizeof(int32_t));
    if (ds->images == NULL || ds->labels == NULL) {
        FAIL("out of memory for %d images", ds->n);
    }
    for (size_t i = 0; i < pix; i++) {
        ds->images[i] = ((float)pixels[i] / 255.0f - DATA_MEAN) / DATA_STD;
    }
    for (int i = 0; i < ds->n; i++) {
        ds->labels[i] = labels[i];
        if (labels[i] + 1 > ds->num_classes) {
            ds->num_classes = labels[i] + 1;
        }
    }
    free(pixels);
    free(labels);
    return 0;
error:
    free(pixels);
    free(labels);
    dataset_free(ds);
    return -1;
}

void dataset_free(Dataset *ds) {
    free(ds->images);
    free(ds->labels);
    ds->images = NULL;
    ds->labels = NULL;
    ds->n = 0;
}

// ---------------------------------------------------------------------------------------------------
// Order and shards

void epoch_permutation(int *perm, int n, uint64_t seed, int epoch) {
    uint64_t state = seed * 0x100000001B3ull + (uint64_t)epoch;
    for (int i = 0; i < n; i++) {
        perm[i] = i;
    }
    for (int i = n - 1; i > 0; i--) {   // Fisher-Yates
        int j = (int)(splitmix64(&state) % (uint64_t)(i + 1));
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

void batch_gather(float *x, int32_t *y, const Dataset *ds, const int *perm, int start, int B) {
    size_t dim = (size_t)ds->rows * ds->cols;
    for (int b = 0; b < B; b++) {
        int idx = perm[start + b];
        if (x) memcpy(x + (size_t)b * dim, ds->images + (size_t)idx * dim, dim * sizeof(float));
        if (y) y[b] = ds->labels[idx];
    }
}
