/*
 * checkpoint.c: atomic, self-checking checkpoints (a temporary file, fsync, rename; a CRC32 inside).
 *
 * Layout: CheckpointHeader, then num_params float32 parameters, then num_params float32 momentum
 * values, then (version 3 on) state_ranks x state_bytes of the ranks' compression state, then the uint32
 * CRC32 of all those bytes; little-endian as in memory. Only rank 0 writes (every rank holds the same
 * weights; the ranks' compression states are gathered to it). Version 2 files (no state, a 56-byte
 * header), version 3 files (no position in the epoch, a 104-byte header) and version 4 files (no model
 * or strategy name, a 128-byte header) still load.
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
#include <sys/stat.h>
#include <unistd.h>
#include "core/files.h"
#include "core/glibc_floor.h"
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
    return h->version == 2 ? CHECKPOINT_V2_HEADER : h->version == 3 ? CHECKPOINT_V3_HEADER
           : h->version == 4 ? CHECKPOINT_V4_HEADER : sizeof *h;
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
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(copy);
}

int checkpoint_save(const char *path, const CheckpointHeader *h, const float *params, const float *momentum,
                    const void *state, char *err, size_t errlen) {
    const size_t len = strlen(path) + PD_BESIDE_EXTRA;
    char *tmp = malloc(len);
    int fd = -1, made = 0, rc = -1, cause = 0;
    if (tmp == NULL) {
        cause = ENOMEM;
        snprintf(err, errlen, "out of memory saving %s", path);
        goto out;
    }
    uint32_t crc = checkpoint_crc(h, params, momentum, state);
    size_t bytes = (size_t)h->num_params * sizeof(float);
    // a fresh file beside it, renamed over it: a link planted at a predictable name is never written through
    if ((fd = pd_create_beside(path, tmp, len)) < 0) {
        cause = errno;
        snprintf(err, errlen, "cannot create a temporary file beside checkpoint %s: %s", path, strerror(cause));
        goto out;
    }
    made = 1;
    if (write_all(fd, h, header_bytes(h)) < 0 || write_all(fd, params, bytes) < 0 ||
        write_all(fd, momentum, bytes) < 0 || write_all(fd, state, state_total(h)) < 0 ||
        write_all(fd, &crc, sizeof crc) < 0 || fsync(fd) < 0) {
        cause = errno;
        snprintf(err, errlen, "cannot write checkpoint %s (its temporary %s is removed; the file there before is "
                 "as it was): %s", path, tmp, strerror(cause));
        goto out;
    }
    int closed = close(fd);   // (where writes are deferred, close can be the first to report a full disk)
    fd = -1;
    if (closed < 0 || rename(tmp, path) < 0) {
        cause = errno;
        snprintf(err, errlen, "cannot %s %s to %s: %s", closed < 0 ? "close" : "rename", tmp, path, strerror(cause));
        goto out;
    }
    sync_dir(path);
    rc = 0;
out:
    if (fd >= 0) {
        close(fd);
    }
    if (rc < 0 && made) {   // ours alone (O_EXCL made it), whatever failed after
        unlink(tmp);
    }
    free(tmp);
    errno = cause;   // for the caller's OSError
    return rc;
}

// A name field as save() writes it: printable characters, then zeros to the end (at least one).
static int name_ok(const char *name, size_t size) {
    size_t len = strnlen(name, size);
    int ok = len < size;
    for (size_t i = 0; ok && i < size; i++) {
        ok = i < len ? name[i] >= 0x20 && name[i] < 0x7f : name[i] == 0;
    }
    return ok;
}

// "model NAME " when the name is known, for the messages below.
static const char *named(const char *what, const char *name, char *buf, size_t len) {
    if (name[0] == '\0') {
        return "";
    }
    snprintf(buf, len, "%s %s, ", what, name);
    return buf;
}

// What the header says, checked before anything is allocated or read on its word: the model's and the
// strategy's, every field in the range save() writes, and the file exactly as long as the header makes
// it (so a crafted count is never an allocation). -1 with err.
static int header_check(const char *path, const CheckpointHeader *h, const CheckpointHeader *expect,
                        uint64_t file_bytes, char *err, size_t errlen) {
    int names_ok = name_ok(h->compression, sizeof h->compression) &&
                   (h->version < 5 || (name_ok(h->model, sizeof h->model) && name_ok(h->strategy, sizeof h->strategy)));
    char saved[80], ours[80];
    uint64_t state, want;
    if (!names_ok) {
        snprintf(err, errlen, "%s is damaged: its compressor, model or strategy name is not printable text", path);
    } else if (h->num_params != expect->num_params || h->model_hash != expect->model_hash) {
        snprintf(err, errlen, "%s was saved from a different model (%s%llu parameters, model hash %016llx); this "
                 "is %s%llu parameters, model hash %016llx", path, named("model", h->model, saved, sizeof saved),
                 (unsigned long long)h->num_params, (unsigned long long)h->model_hash,
                 named("model", expect->model, ours, sizeof ours), (unsigned long long)expect->num_params,
                 (unsigned long long)expect->model_hash);
    } else if (h->strategy[0] != '\0' && expect->strategy[0] != '\0' && strcmp(h->strategy, expect->strategy) != 0) {
        // each strategy keeps its own state in the file (the servers' weights, the average, the center)
        snprintf(err, errlen, "%s was saved by strategy %s (model %s); this trainer's strategy is %s (model %s): "
                 "resume it with strategy %s (Trainer.load(path, strict=False) takes its weights into another)", path, h->strategy,
                 h->model[0] ? h->model : "?", expect->strategy, expect->model[0] ? expect->model : "?", h->strategy);
    } else if ((h->state_ranks == 0) != (h->state_bytes == 0) ||
               __builtin_mul_overflow(h->state_ranks, h->state_bytes, &state) ||
               __builtin_add_overflow(state, header_bytes(h) + 2 * h->num_params * sizeof(float) + sizeof(uint32_t),
                                      &want)) {
        snprintf(err, errlen, "%s is damaged: its compression state's size or name is out of range (%llu ranks "
                 "of %llu bytes)", path, (unsigned long long)h->state_ranks, (unsigned long long)h->state_bytes);
    } else if (h->step > INT64_MAX || h->epoch > INT64_MAX || h->momentum_started > 1 ||
               (h->version >= 4 && h->sample != UINT64_MAX &&   // (UINT64_MAX: saved with the position unknown)
                (h->sample > INT64_MAX || h->world - 1 >= INT64_MAX || h->global_batch - 1 >= INT64_MAX))) {
        snprintf(err, errlen, "%s is damaged: its step, epoch, momentum flag or position is out of range", path);
    } else if (file_bytes < want) {
        snprintf(err, errlen, "%s is truncated: %llu bytes, where its header makes it %llu (the parameters and "
                 "momentum values, their compression state and their CRC32)", path, (unsigned long long)file_bytes,
                 (unsigned long long)want);
    } else if (file_bytes > want) {
        snprintf(err, errlen, "%s is longer than its header says (%llu bytes, not %llu): not a checkpoint of this "
                 "model", path, (unsigned long long)file_bytes, (unsigned long long)want);
    } else {
        return 0;
    }
    return -1;
}

int checkpoint_load(const char *path, CheckpointHeader *h, float *params, float *momentum, void **state,
                    const CheckpointHeader *expect, char *err, size_t errlen) {
    *state = NULL;
    memset(h, 0, sizeof *h);
    // O_NONBLOCK: a FIFO at `path` would block the open itself until a writer came
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open checkpoint %s: %s", path, strerror(errno));
        return -1;
    }
    int rc = -1;
    struct stat st;
    if (pd_fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s is not a regular file, so not a pydist checkpoint", path);
    } else if (read_all(fd, h, CHECKPOINT_V2_HEADER) < 0) {
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
    } else if (header_check(path, h, expect, (uint64_t)st.st_size, err, errlen) == 0) {
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
