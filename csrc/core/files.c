/*
 * files.c: see files.h.
 */
#include "core/files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

int pd_create_beside(const char *path, char *tmp, size_t len) {
    for (unsigned attempt = 0; attempt < 100; attempt++) {
        uint64_t r;
        if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) {   // (no entropy: still a name no one makes now)
            r = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL) ^ (attempt * 0x9e3779b97f4a7c15ull);
        }
        snprintf(tmp, len, "%s.%016llx.tmp", path, (unsigned long long)r);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd >= 0 || errno != EEXIST) {
            return fd;   // EEXIST: someone else's file, or a planted link: another name
        }
    }
    return -1;   // (errno: EEXIST)
}
