/*
 * checkpoint.c: atomic, self-checking checkpoints (a temporary file, fsync, rename; a CRC32 inside).
 *
 * Layout: CheckpointHeader, then num_params float32 parameters, then num_params float32 momentum
 * values, then (version 3 on) state_ranks x state_bytes of the ranks' compression state, then the uint32
 * CRC32 of all those bytes; little-endian as in memory. Only rank 0 writes (every rank holds the same
 * weights; the ranks' compression states are gathered to it). Version 2 files (no state, a 56-byte
 * header) and version 3 files (no position in the epoch, a 104-byte header) still load.
 *
 * Why no DONE marker file (llm.c writes one after the checkpoint): the rename already makes the new
 * file appear whole or not at all, and a marker written after it would open a window (killed between
 * the rename and the marker) in which a complete checkpoint has no marker; a loader that required
 * the marker would refuse it, i.e. lose it. Instead the file proves itself: exact length and a CRC32
 * over every byte, so a truncated or damaged file is refused whatever lies beside it.
 */
#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "zlib_calls.h"

static int write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int read_all(int fd, void *buf, size_t len) {
    char *p = buf;
    while (len > 0) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

// CRC32 of `len` bytes continuing from `crc` (zlib's crc32 takes at most UINT_MAX bytes a call).
static uint32_t crc_update(uint32_t crc, const void *buf, size_t len) {
    const Bytef *p = buf;
    while (len > 0) {
        uInt n = len > (1u << 30) ? (1u << 30) : (uInt)len;
        crc = (uint32_t)crc32(crc, p, n);
        p += n;
        len -= n;
    }
    return crc;
}

static size_t header_bytes(const CheckpointHeader *h) {
    return h->version == 2 ? CHECKPOINT_V2_HEADER : h->version == 3 ? CHECKPOINT_V3_HEADER : sizeof *h;
}

static size_t state_total(const CheckpointHeader *h) {
    return h->version == 2 ? 0 : (size_t)(h->state_ranks * h->state_bytes);
}

// The CRC32 that ends the file: of the header, the parameters, the momentum and the state.
static uint32_t checkpoint_crc(const CheckpointHeader *h, const float *params, const float *momentum,
                               const void *state) {
    size_t bytes = (size_t)h->num_params * sizeof(float);
    uint32_t crc = crc_update(0, h, header_bytes(h));
    crc = crc_update(crc, params, bytes);
    crc = crc_update(crc, momentum, bytes);
    return crc_update(crc, state, state_total(h));
}

// fsync the folder holding `path`, so that the rename itself survives a crash.
static void sync_dir(const char *path) {
    char *copy = strdup(path);
    if (copy == NULL) {
        return;
    }
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(copy);
}

int checkpoint_save(const char *path, const CheckpointHeader *h, const float *params, const float *momentum,
                    const void *state, char *err, size_t errlen) {
    size_t len = strlen(path);
    char *tmp = malloc(len + 32);
    int fd = -1, rc = -1;
    if (tmp == NULL) {
        snprintf(err, errlen, "out of memory saving %s", path);
        goto out;
    }
    snprintf(tmp, len + 32, "%s.tmp.%ld", path, (long)getpid());
    uint32_t crc = checkpoint_crc(h, params, momentum, state);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    size_t bytes = (size_t)h->num_params * sizeof(float);
    if (fd < 0 || write_all(fd, h, header_bytes(h)) < 0 || write_all(fd, params, bytes) < 0 ||
        write_all(fd, momentum, bytes) < 0 || write_all(fd, state, state_total(h)) < 0 ||
        write_all(fd, &crc, sizeof crc) < 0 || fsync(fd) < 0) {
        snprintf(err, errlen, "cannot write checkpoint %s: %s", tmp, strerror(errno));
        goto out;
    }
    close(fd);
    fd = -1;
    if (rename(tmp, path) < 0) {
        snprintf(err, errlen, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        goto out;
    }
    sync_dir(path);
    rc = 0;
out:
    if (fd >= 0) {
        close(fd);
    }
    if (rc < 0 && tmp != NULL) {
        unlink(tmp);
    }
    free(tmp);
    return rc;
}

int checkpoint_load(const char *path, CheckpointHeader *h, float *params, float *momentum, void **state,
                    const CheckpointHeader *expect, char *err, size_t errlen) {
    *state = NULL;
    memset(h, 0, sizeof *h);
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open checkpoint %s: %s", path, strerror(errno));
        return -1;
    }
    int rc = -1;
    if (read_all(fd, h, CHECKPOINT_V2_HEADER) < 0) {
        snprintf(err, errlen, "%s is too short to be a pydist checkpoint", path);
    } else if (h->magic != CHECKPOINT_MAGIC) {
        snprintf(err, errlen, "%s is not a pydist checkpoint (magic 0x%08x, expected 0x%08x)", path, h->magic,
                 CHECKPOINT_MAGIC);
    } else if (h->version < 2 || h->version > CHECKPOINT_VERSION) {
        snprintf(err, errlen, "%s is a pydist checkpoint of format version %u; this pydist reads versions 2 to "
                 "%u (version 2 added a CRC32 of the contents): train again, or load it with the pydist that "
                 "wrote it", path, h->version, CHECKPOINT_VERSION);
    } else if (h->version >= 3 && read_all(fd, (char *)h + CHECKPOINT_V2_HEADER,
                                           header_bytes(h) - CHECKPOINT_V2_HEADER) < 0) {
        snprintf(err, errlen, "%s is too short to be a pydist checkpoint", path);
    } else if (h->state_bytes > ((uint64_t)1 << 40) || h->state_ranks > ((uint64_t)1 << 24) ||
               h->compression[sizeof h->compression - 1] != 0) {
        snprintf(err, errlen, "%s is damaged: its compression state's size is out of range", path);
    } else if (h->num_params != expect->num_params || h->model_hash != expect->model_hash) {
        snprintf(err, errlen, "%s was saved from a different model (%llu parameters, model hash %016llx; this "
                 "model has %llu, %016llx)", path, (unsigned long long)h->num_params,
                 (unsigned long long)h->model_hash, (unsigned long long)expect->num_params,
                 (unsigned long long)expect->model_hash);
    } else {
        size_t bytes = (size_t)h->num_params * sizeof(float), total = state_total(h);
        char extra;
        uint32_t stored, crc;
        *state = total > 0 ? malloc(total) : NULL;
        if (total > 0 && *state == NULL) {
            snprintf(err, errlen, "out of memory for %s's compression state (%zu bytes)", path, total);
        } else if (read_all(fd, params, bytes) < 0 || read_all(fd, momentum, bytes) < 0 ||
                   read_all(fd, *state, total) < 0 || read_all(fd, &stored, sizeof stored) < 0) {
            snprintf(err, errlen, "%s is truncated: fewer than %llu parameters and momentum values, their "
                     "compression state and their CRC32", path, (unsigned long long)h->num_params);
        } else if (read(fd, &extra, 1) != 0) {
            snprintf(err, errlen, "%s is longer than its header says: not a checkpoint of this model", path);
        } else if ((crc = checkpoint_crc(h, params, momentum, *state)) != stored) {
            snprintf(err, errlen, "%s is damaged: it ends in CRC32 %08x but its contents give %08x", path,
                     stored, crc);
        } else {
            rc = 0;
            if (h->version < 4) {   // saved at epoch ends or from a step count: the caller derives it
                h->sample = UINT64_MAX;
            }
        }
        if (rc < 0) {
            free(*state);
            *state = NULL;
        }
    }
    close(fd);
    return rc;
}
