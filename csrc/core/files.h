/*
 * files.h: making a file beside a name others can predict (run.rank3.json, run.ckpt) without ever writing
 * through a link planted there. Bottom layer: no MPI, no Python.
 */
#ifndef PYDIST_FILES_H
#define PYDIST_FILES_H

#include <stddef.h>

// Room past strlen(path) that pd_create_beside's name needs.
#define PD_BESIDE_EXTRA 32

// A new file next to `path`, named "<path>.<16 random hex digits>.tmp" in tmp (len >= strlen(path) +
// PD_BESIDE_EXTRA), opened O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC with mode 0666 less the
// umask: made by us, never a link's target. The caller renames it over `path` (which replaces a link
// there rather than following it) or unlinks it. The descriptor, or -1 with errno.
int pd_create_beside(const char *path, char *tmp, size_t len);

#endif
