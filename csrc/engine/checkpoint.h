/*
 * checkpoint.h: saving and loading the training state so that a finished checkpoint is never lost
 * or half-written. Plain C, no Python.h.
 */
#ifndef PYDIST_ENGINE_CHECKPOINT_H
#define PYDIST_ENGINE_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#define CHECKPOINT_MAGIC 0x50444350u   // "PDCP"
#define CHECKPOINT_VERSION 1u

typedef struct {
    uint32_t magic, version;
    uint64_t num_params;    // floats in each of params and momentum
    uint64_t step;          // optimizer steps taken
    uint64_t epoch;         // epochs completed
    uint64_t seed;          // data order seed
    uint64_t model_hash;    // hash of the model description, so a checkpoint cannot load into another model
    uint64_t momentum_started;  // SGD momentum buffer initialised (PyTorch: buf = grad on the first step)
} CheckpointHeader;

// Write header + params + momentum to `path` atomically: a temporary file in the same folder, fsync,
// rename over `path`, fsync the folder, then a `path`.done marker. A crash at any point leaves
// either the previous complete checkpoint or the new one, never a damaged file under `path`.
int checkpoint_save(const char *path, const CheckpointHeader *h, const float *params, const float *momentum,
                    char *err, size_t errlen);

// Read a checkpoint written by checkpoint_save into caller-allocated buffers of h->num_params floats.
// The header read must match `expect` in magic, version, num_params and model_hash.
int checkpoint_load(const char *path, CheckpointHeader *h, float *params, float *momentum,
                    const CheckpointHeader *expect, char *err, size_t errlen);

#endif  // PYDIST_ENGINE_CHECKPOINT_H
