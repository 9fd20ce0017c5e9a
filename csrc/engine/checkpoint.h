/*
 * checkpoint.h: saving and loading the training state so that a finished checkpoint is never lost
 * or half-written, and a damaged one is never loaded. Plain C, no Python.h.
 */
#ifndef PYDIST_ENGINE_CHECKPOINT_H
#define PYDIST_ENGINE_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#define CHECKPOINT_MAGIC 0x50444350u   // "PDCP"
#define CHECKPOINT_VERSION 5u   // 2 added the CRC32 trailer, 3 the ranks' compression state, 4 the position in
                                // the epoch's order and the layout, 5 the model's and strategy's names; 1 is refused

typedef struct {
    uint32_t magic, version;
    uint64_t num_params;    // floats in each of params and momentum
    uint64_t step;          // optimizer steps taken
    uint64_t epoch;         // epochs completed
    uint64_t seed;          // data order seed
    uint64_t model_hash;    // hash of the model description, so a checkpoint cannot load into another model
    uint64_t momentum_started;  // SGD momentum buffer initialised (PyTorch: buf = grad on the first step)
    // version 3: every rank's compression state (compress.h: its error-feedback residual, powersgd's
    // warm start), state_ranks blocks of state_bytes after the momentum; 0 ranks: none
    uint64_t state_ranks, state_bytes;
    char compression[32];   // the compressor that state belongs to, as the command line spells it
    // version 4: where the epoch's global sample order stopped (examples of it consumed), so a run resumes
    // with its next unseen example at any world size; and the layout that saved it, for the record
    uint64_t sample, world, global_batch;
    // version 5: the model and the strategy that saved it, by name (printable, then zeros; "" unknown), so
    // that a load into another model or strategy is refused naming both
    char model[48];
    char strategy[16];
} CheckpointHeader;       // 192 bytes (version 2: the first 56, 3: 104, 4: 128), no padding: every byte is in
                          // the CRC32

#define CHECKPOINT_V2_HEADER 56
#define CHECKPOINT_V3_HEADER 104
#define CHECKPOINT_V4_HEADER 128

// Write header + params + momentum + CRC32 to `path` atomically: a temporary file in the same folder
// (a random name created with O_EXCL | O_NOFOLLOW, so a planted symlink is never followed), fsync, rename
// over `path`, fsync the folder. A crash at any point leaves either the previous complete checkpoint or
// the new one under `path`, never a damaged file; a failed write (a full disk) removes the temporary
// and returns -1 with err, and errno its cause. The file vouches for itself (magic, version, sizes,
// model hash, and a CRC32 of everything before it), so there is no separate "done" marker to lose or
// to trust.
int checkpoint_save(const char *path, const CheckpointHeader *h, const float *params, const float *momentum,
                    const void *state, char *err, size_t errlen);

// Read a checkpoint written by checkpoint_save (version 2 to 5; before 4, h->sample is UINT64_MAX:
// unknown; before 5, h->model and h->strategy are "") into caller-allocated buffers of h->num_params floats, and the compression state into *state
// (malloc'd, the caller frees it; NULL when the file has none). `path` must be a regular file; the
// header read must match `expect` in magic, num_params and model_hash, and in strategy where both name
// one, hold every field in the range
// save writes (step, epoch, position <= INT64_MAX, a printable compressor name), the file must be
// exactly as long as its header says (checked before anything is allocated), and its CRC32 must match;
// otherwise -1 with `err` saying why (the buffers may then hold part of the file: the caller keeps its
// own state until 0 comes back).
int checkpoint_load(const char *path, CheckpointHeader *h, float *params, float *momentum, void **state,
                    const CheckpointHeader *expect, char *err, size_t errlen);

#endif  // PYDIST_ENGINE_CHECKPOINT_H
