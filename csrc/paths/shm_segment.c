/*
 * shm_segment.c: making a segment of shared memory over the ranks of one node, so that nothing is ever
 * left behind, however the job ends. What lives in a segment, and when one is made, is
 * shared_memory.c's business; this file only makes and maps it.
 *
 * Rank 0 makes the memory with memfd_create: a file with no name, freed by the kernel when the last
 * process that holds it (open or mapped) is gone, so a job killed at any moment, even half-way
 * through this set-up, leaves nothing in /dev/shm. The other ranks open it through rank 0's
 * /proc/<pid>/fd/<fd> (same node, same user: what UCX's posix transport does too), and check that
 * they found the very file rank 0 made (its device and inode), not an unrelated one of a process that
 * happens to have that pid in another pid namespace.
 *
 * Where that cannot work (no memfd_create; /proc hidden or another user's, on any rank) the ranks
 * fall back, all alike, to a named POSIX segment (shm_open), which rank 0 unlinks as soon as every
 * rank has opened it. A job killed inside that window leaves /dev/shm/pydist-<ns>-<pid>-<n>, <ns> the
 * inode of the maker's pid namespace: containers that share /dev/shm but not their pids never make
 * the same name. The first segment a process makes sweeps away every such name of ours from its own
 * pid namespace whose pid no longer exists; a name from another namespace (or of the older
 * pydist-<pid>-<n> form) is never removed, as nothing here can prove its maker dead.
 *
 * Collective calls, all through the caller's interruptible wait: one broadcast (what rank 0 made) and
 * one all-reduce (every rank's outcome), and the same again when the named fallback is needed.
 *
 * Test knobs (tests/unit/test_shm_endings.py): PYDIST_TEST_SEGMENT_PAUSE=<n>:<seconds> pauses this
 * process inside its n-th segment's set-up (0: the session segment at init), once it has mapped it
 * and before the ranks confirm it (where a named segment still has its name), and says so on stderr;
 * PYDIST_TEST_SEGMENT_FALLBACK=memfd acts as if memfd_create were missing, =proc as if /proc were
 * hidden from the other ranks.
 */
#include "paths/shm_segment.h"

#include "core/errors.h"
#include "core/glibc_floor.h"
#include "shm_segment.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

// A rank's outcome: the minimum over the ranks decides for all.
enum { FAILED = 0, RETRY_NAMED = 1, MAPPED = 2 };
enum { KIND_MEMFD = 1, KIND_NAMED = 2 };

// What rank 0 tells the others (everything before `outcome`). On the heap: a broadcast given up may
// still write it later.
typedef struct {
    int kind;
    int err;                          // rank 0's errno making it (0: made)
    int pid, fd;                      // memfd: where the others open it
    unsigned long long dev, ino;      // memfd: the file they must find there
    char name[64];                    // named
    unsigned long long bytes, stage;
    int outcome, all;                 // this rank's, and the minimum over the ranks (not broadcast)
} Msg;

static unsigned segments_made = 0;    // this process's calls (the pause knob counts them)
static unsigned names_made = 0;       // named segments rank 0 made (their names' suffix)

static int test_fallback(const char *which) {
    const char *v = getenv("PYDIST_TEST_SEGMENT_FALLBACK");
    return v != NULL && strcmp(v, which) == 0;
}

// ---------------------------------------------------------------------------------------------------
// The named fallback's leftovers

// This process's pid namespace: the inode of /proc/self/ns/pid, unique on the machine while it exists.
// 0 where /proc does not say (named segments then carry 0, and the sweep removes none).
static unsigned long long pid_namespace(void) {
    struct stat st;
    return pd_fstatat(AT_FDCWD, "/proc/self/ns/pid", &st, 0) == 0 ? (unsigned long long)st.st_ino : 0;
}

// Unlink /dev/shm/pydist-<ns>-<pid>-<n> of ours, from this pid namespace, whose process is gone (a job
// killed inside a named set-up). A live pid keeps its name: that job may be setting it up right now.
static void sweep_leftovers(void) {
    unsigned long long ours = pid_namespace();
    DIR *dir = ours != 0 ? opendir("/dev/shm") : NULL;
    if (dir == NULL) {
        return;
    }
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        int pid, used = 0;
        unsigned n;
        unsigned long long ns;
        struct stat st;
        if (sscanf(e->d_name, "pydist-%llu-%d-%u%n", &ns, &pid, &n, &used) != 3 || e->d_name[used] != 0 ||
            pid <= 0 || ns != ours) {
            continue;   // not ours, or another namespace's pid, whose process kill() cannot see
        }
        if (pd_fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_uid != geteuid()) {
            continue;
        }
        if (kill(pid, 0) == 0 || errno != ESRCH) {
            continue;   // alive (EPERM: alive, someone else's)
        }
        char name[sizeof e->d_name + 1];
        snprintf(name, sizeof name, "/%s", e->d_name);
        pd_shm_unlink(name);
    }
    closedir(dir);
}

// ---------------------------------------------------------------------------------------------------
// One attempt

// Rank 0: make the memory (a memfd unless `named`) of m->bytes; fills m (kind, err, where); returns
// the fd or -1. A named segment's name is in m->name from the moment it exists.
static int create(Msg *m, int named, int commit) {
    int fd = -1;
    m->pid = (int)getpid();
#ifdef MFD_CLOEXEC
    if (!named && !test_fallback("memfd")) {
        fd = memfd_create("pydist", MFD_CLOEXEC);
    }
#endif
    if (fd >= 0) {
        m->kind = KIND_MEMFD;
    } else {
        m->kind = KIND_NAMED;
        snprintf(m->name, sizeof m->name, "/pydist-%llu-%d-%u", pid_namespace(), m->pid, names_made++);
        fd = pd_shm_open(m->name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0) {
            m->name[0] = 0;   // not ours: nothing to unlink
        }
    }
    struct stat st;
    errno = 0;
    if (fd < 0 || pd_fstat(fd, &st) != 0 || ftruncate(fd, (off_t)m->bytes) != 0 ||
        (commit && (errno = posix_fallocate(fd, 0, (off_t)m->bytes)) != 0)) {
        m->err = errno ? errno : EIO;
        return fd;
    }
    m->fd = fd;
    m->dev = (unsigned long long)st.st_dev;
    m->ino = (unsigned long long)st.st_ino;
    return fd;
}

// The other ranks: open what rank 0 made. -1 with *outcome set when it cannot be opened.
static int open_made(const Msg *m, int *outcome) {
    if (m->kind == KIND_NAMED) {
        int fd = pd_shm_open(m->name, O_RDWR, 0600);
        *outcome = fd < 0 ? FAILED : MAPPED;
        return fd;
    }
    char path[64];
    struct stat st;
    snprintf(path, sizeof path, "/proc/%d/fd/%d", m->pid, m->fd);
    int fd = test_fallback("proc") ? -1 : open(path, O_RDWR | O_CLOEXEC);
    if (fd >= 0 && (pd_fstat(fd, &st) != 0 || (unsigned long long)st.st_dev != m->dev ||
                    (unsigned long long)st.st_ino != m->ino)) {
        close(fd);   // not rank 0's file: /proc shows another pid namespace's process
        fd = -1;
    }
    *outcome = fd < 0 ? RETRY_NAMED : MAPPED;
    return fd;
}

// PYDIST_TEST_SEGMENT_PAUSE: sleep here (the GIL released) if this is the segment it names.
static void test_pause(unsigned index, int rank, int kind) {
    const char *v = getenv("PYDIST_TEST_SEGMENT_PAUSE");
    unsigned n;
    double seconds;
    if (v == NULL || sscanf(v, "%u:%lf", &n, &seconds) != 2 || n != index || seconds <= 0) {
        return;
    }
    fprintf(stderr, "pydist-test: paused in segment set-up %u (rank %d, pid %d, %s)\n", index, rank,
            (int)getpid(), kind == KIND_MEMFD ? "memfd" : "named");
    fflush(stderr);
    Py_BEGIN_ALLOW_THREADS
    struct timespec left = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
    Py_END_ALLOW_THREADS
}

// One attempt (a memfd unless `named`). Returns 1 made, 0 not made, 2 retry with a named segment (the
// same on every rank), -1 a wait failed.
static int attempt(MPI_Comm comm, int rank, int named, size_t *bytes, int commit, long group, const char *what,
                   double timeout, size_t *stage, char **base, int *fd, char *why, size_t whylen,
                   PdSegmentWait wait, unsigned index, int *paused) {
    Msg *m = PyMem_RawCalloc(1, sizeof(Msg));
    MPI_Request req = MPI_REQUEST_NULL;
    char name[sizeof m->name] = {0};   // rank 0's name, to unlink (m may be lost to a failed wait)
    int rc, result = -1;
    *fd = -1;
    *base = NULL;
    if (m == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (rank == 0) {
        m->bytes = *bytes;
        m->stage = stage ? *stage : 0;
        *fd = create(m, named, commit);
        memcpy(name, m->name, sizeof name);
    }
    if ((rc = MPI_Ibcast(m, (int)offsetof(Msg, outcome), MPI_BYTE, 0, comm, &req)) != MPI_SUCCESS) {
        pd_raise_mpi(rc, "MPI_Ibcast");
        goto done;
    }
    if (wait(&req, group, what, timeout) < 0) {
        m = NULL;   // MPI may still write it
        goto done;
    }
    *bytes = (size_t)m->bytes;
    if (stage) {
        *stage = (size_t)m->stage;
    }
    m->outcome = MAPPED;
    if (m->err) {
        snprintf(why, whylen, "making a %zu-byte shared-memory segment failed: %s", *bytes, strerror(m->err));
        m->outcome = FAILED;
    } else if (rank != 0) {
        *fd = open_made(m, &m->outcome);
        if (m->outcome == FAILED) {
            snprintf(why, whylen, "opening the shared segment %s failed on a rank: %s", m->name, strerror(errno));
        }
    }
    if (m->outcome == MAPPED) {
        void *p = mmap(NULL, *bytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
        if (p == MAP_FAILED) {
            snprintf(why, whylen, "mapping the shared segment failed on a rank: %s", strerror(errno));
            m->outcome = FAILED;
        } else {
            *base = p;
            if (!*paused) {
                *paused = 1;
                test_pause(index, rank, m->kind);
            }
        }
    }
    if ((rc = MPI_Iallreduce(&m->outcome, &m->all, 1, MPI_INT, MPI_MIN, comm, &req)) != MPI_SUCCESS) {
        pd_raise_mpi(rc, "MPI_Iallreduce");
        goto done;
    }
    if (wait(&req, group, what, timeout) < 0) {
        m = NULL;   // MPI may still write it
        goto done;
    }
    if (m->all == MAPPED) {
        result = 1;
    } else if (m->all == RETRY_NAMED) {
        result = 2;
    } else {
        if (why[0] == 0) {
            snprintf(why, whylen, "making the shared segment failed on another rank");
        }
        result = 0;
    }
done:
    if (name[0]) {
        pd_shm_unlink(name);   // every rank has opened it (or failed to, or given up): nobody may find it any more
    }
    if (result != 1) {
        if (*base) munmap(*base, *bytes);
        if (*fd >= 0) close(*fd);
        *base = NULL;
        *fd = -1;
    }
    PyMem_RawFree(m);
    return result;
}

// ---------------------------------------------------------------------------------------------------

int pd_shm_segment_make(MPI_Comm comm, int rank, size_t *bytes, int commit, long group, const char *what,
                        double timeout, size_t *stage, char **base, int *fd, char *why, size_t whylen,
                        PdSegmentWait wait) {
    static int swept = 0;
    unsigned index = segments_made++;
    int paused = 0;
    if (rank == 0 && !swept) {
        swept = 1;
        sweep_leftovers();   // once per process: its first segment is the session's, at init
    }
    int made = attempt(comm, rank, 0, bytes, commit, group, what, timeout, stage, base, fd, why, whylen, wait,
                       index, &paused);
    if (made == 2) {   // some rank could not open rank 0's memfd: all take the named path
        made = attempt(comm, rank, 1, bytes, commit, group, what, timeout, stage, base, fd, why, whylen, wait,
                       index, &paused);
    }
    return made;
}
