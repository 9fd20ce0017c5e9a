/*
 * data.h: the data set (IDX files such as MNIST's and Fashion-MNIST's), and how ranks share it.
 * Plain C, no Python.h.
 */
#ifndef PYDIST_ENGINE_DATA_H
#define PYDIST_ENGINE_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int n;             // number of examples
    int rows, cols;    // image size (28 x 28 for MNIST-like sets)
    float *images;     // (n, rows*cols): pixel / 255, then (x - DATA_MEAN) / DATA_STD
    int32_t *labels;   // (n,)
    int num_classes;   // 1 + the largest label
} Dataset;

// Fashion-MNIST's training-set pixel mean and standard deviation (of pixel / 255).
#define DATA_MEAN 0.2860f
#define DATA_STD 0.3530f

// Load an images file and a labels file in IDX format, gzip-compressed or raw (zlib reads both).
// Returns 0, or -1 with a one-line message in err naming the file and what to do.
int dataset_load_idx(Dataset *ds, const char *images_path, const char *labels_path, char *err, size_t errlen);
void dataset_free(Dataset *ds);

// The order of examples for one epoch: a permutation of [0, n) that depends only on (seed, epoch),
// so every rank computes the same one without communicating.
void epoch_permutation(int *perm, int n, uint64_t seed, int epoch);

// Copy examples perm[start .. start+B) into x (B, rows*cols) and y (B,); either may be NULL (a
// pipeline's first stage needs only the images, its last only the labels).
void batch_gather(float *x, int32_t *y, const Dataset *ds, const int *perm, int start, int B);

// Rank r of R with per-rank batch B takes, at step s, perm[s*R*B + r*B .. + B): the ranks' shards
// are disjoint and equal, and together they are exactly the batch of R*B that one process would
// take at step s. That is what makes R ranks x batch B equal 1 rank x batch R*B.
static inline int shard_start(int step, int rank, int world, int batch) {
    return (step * world + rank) * batch;
}

// Steps per epoch: whole global batches only (the remainder is dropped, as DataLoader(drop_last)).
static inline int steps_per_epoch(int n, int world, int batch) {
    return n / (world * batch);
}

#endif  // PYDIST_ENGINE_DATA_H
