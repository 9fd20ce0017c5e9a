/*
 * checkpoint.c: atomic checkpoints (llm.c's DONE file plus a rename).
 *
 * Layout: CheckpointHeader, then num_params float32 parameters, then num_params float32 momentum
 * values, little-endian as in memory. Only rank 0 writes (every rank holds the same weights).
 */
#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
                    char *err, size_t errlen) {
    size_t len = strlen(path);
    char *tmp = malloc(len + 32), *done = malloc(len + 8);
    int fd = -1, rc = -1;
    if (tmp == NULL || done == NULL) {
        snprintf(err, errlen, "out of memory saving %s", path);
        goto out;
    }
    snprintf(tmp, len + 32, "%s.tmp.%ld", path, (long)getpid());
    snprintf(done, len + 8, "%s.done", path);
    unlink(done);   // the marker says "path is complete": not true while we replace it
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    size_t bytes = (size_t)h->num_params * sizeof(float);
    if (fd < 0 || write_all(fd, h, sizeof *h) < 0 || write_all(fd, params, bytes) < 0 ||
        write_all(fd, momentum, bytes) < 0 || fsync(fd) < 0) {
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
    int dfd = open(done, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (dfd < 0) {
        snprintf(err, errlen, "cannot write %s: %s", done, strerror(errno));
        goto out;
    }
    fsync(dfd);
    close(dfd);
    sync_dir(done);
    rc = 0;
out:
    if (fd >= 0) {
        close(fd);
    }
    if (rc < 0 && tmp != NULL) {
        unlink(tmp);
    }
    free(tmp);
    free(done);
    return rc;
}

int checkpoint_load(const char *path, CheckpointHeader *h, float *params, float *momentum,
                    const CheckpointHeader *expect, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open checkpoint %s: %s", path, strerror(errno));
        return -1;
    }
    int rc = -1;
    if (read_all(fd, h, sizeof *h) < 0) {
        snprintf(err, errlen, "%s is too short to be a pydist checkpoint", path);
    } else if (h->magic != CHECKPOINT_MAGIC || h->version != CHECKPOINT_VERSION) {
        snprintf(err, errlen, "%s is not a pydist checkpoint of version %u (magic 0x%08x, version %u)", path,
                 CHECKPOINT_VERSION, h->magic, h->version);
    } else if (h->num_params != expect->num_params || h->model_hash != expect->model_hash) {
        snprintf(err, errlen, "%s was saved from a different model (%llu parameters, model hash %016llx; this "
                 "model has %llu, %016llx)", path, (unsigned long long)h->num_params,
                 (unsigned long long)h->model_hash, (unsigned long long)expect->num_params,
                 (unsigned long long)expect->model_hash);
    } else {
        size_t bytes = (size_t)h->num_params * sizeof(float);
        char extra;
        if (read_all(fd, params, bytes) < 0 || read_all(fd, momentum, bytes) < 0) {
            snprintf(err, errlen, "%s is truncated: fewer than %llu parameters and momentum values", path,
                     (unsigned long long)h->num_params);
        } else if (read(fd, &extra, 1) != 0) {
            snprintf(err, errlen, "%s is longer than its header says: not a checkpoint of this model", path);
        } else {
            rc = 0;
        }
    }
    close(fd);
    return rc;
}
