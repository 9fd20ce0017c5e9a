/*
 * glibc_floor.h: the four libc calls whose glibc symbols are newer than manylinux_2_28's glibc (2.28,
 * RHEL/Rocky 8), made without those symbols, so that a wheel built on any glibc loads there
 * (`make wheel` checks it with auditwheel show).
 *
 * fstat and fstatat became exported functions in glibc 2.33 (before, the headers inlined them to
 * __fxstat): on x86-64 they are the system calls themselves, whose struct stat there is glibc's;
 * elsewhere the kernel's struct may differ from glibc's, so they are libc's own calls. shm_open and
 * shm_unlink moved from librt into libc as GLIBC_2.34: glibc's own shm_open is open() under /dev/shm
 * with O_NOFOLLOW | O_CLOEXEC, and that is what these do.
 *
 * glibc 2.34 moved libpthread into libc and gave pthread_create, pthread_join and
 * pthread_condattr_setclock a new version (GLIBC_2.34); a file that calls them includes this header,
 * which binds them to the versions every glibc has (libc keeps them for programs built before).
 *
 * glibc 2.38+ with _GNU_SOURCE (Python.h defines it) or C23 (GCC 15's default) renames sscanf and
 * strtol to __isoc23_* (GLIBC_2.38), which differ only in taking a "0b" prefix; a file that calls them
 * includes this header, which binds them back to the old symbols every glibc has. (A file that calls
 * them without it fails the wheel's check: scripts/build_wheels.sh.)
 */
#ifndef PYDIST_CORE_GLIBC_FLOOR_H
#define PYDIST_CORE_GLIBC_FLOOR_H

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

// (the kernel's struct stat is glibc's on x86-64 Linux alone: only there are the system calls used)
#if defined(__linux__) && defined(__x86_64__) && defined(SYS_fstat) && defined(SYS_newfstatat)
#define PD_RAW_STAT 1
#else
#define PD_RAW_STAT 0
#endif

static inline int pd_fstat(int fd, struct stat *st) {
#if PD_RAW_STAT
    return (int)syscall(SYS_fstat, fd, st);
#else
    return fstat(fd, st);
#endif
}

static inline int pd_fstatat(int dirfd, const char *path, struct stat *st, int flags) {
#if PD_RAW_STAT
    return (int)syscall(SYS_newfstatat, dirfd, path, st, flags);
#else
    return fstatat(dirfd, path, st, flags);
#endif
}

// name is "/<something>" with no other slash, as shm_open requires
static inline int pd_shm_name_path(const char *name, char *path, size_t len) {
    if (name[0] != '/' || name[1] == 0 || strchr(name + 1, '/') != NULL ||
        (size_t)snprintf(path, len, "/dev/shm%s", name) >= len) {
        errno = EINVAL;
        return -1;
    }
    return 0;
}

static inline int pd_shm_open(const char *name, int flags, mode_t mode) {
    char path[288];
    if (pd_shm_name_path(name, path, sizeof path) != 0) {
        return -1;
    }
    return open(path, flags | O_NOFOLLOW | O_CLOEXEC, mode);
}

static inline int pd_shm_unlink(const char *name) {
    char path[288];
    if (pd_shm_name_path(name, path, sizeof path) != 0) {
        return -1;
    }
    return unlink(path);
}

#if defined(__GLIBC__) && defined(__x86_64__) && defined(PD_GLIBC_FLOOR_THREADS)
__asm__(".symver pthread_create, pthread_create@GLIBC_2.2.5");
__asm__(".symver pthread_join, pthread_join@GLIBC_2.2.5");
__asm__(".symver pthread_condattr_setclock, pthread_condattr_setclock@GLIBC_2.3.3");
#endif

#if defined(__GLIBC__) && defined(__x86_64__) && (__GLIBC_USE(C2X_STRTOL) || __GLIBC_USE(C23_STRTOL))
__asm__(".symver __isoc23_sscanf, sscanf@GLIBC_2.2.5");
__asm__(".symver __isoc23_strtol, strtol@GLIBC_2.2.5");
#endif

#endif
