/*
 * allreduce_raw.c: the raw-MPI baseline for benchmarks/allreduce_sweep.py. It times
 * MPI_Allreduce(MPI_IN_PLACE, float32, MPI_SUM) on MPI_COMM_WORLD, with nothing of pydist in the way,
 * so the sweep can say what pydist costs on top of MPI. It is not a benchmark suite of its own (no
 * other collectives, dtypes or ops).
 *
 *     mpicc.mpich -O2 -o benchmarks/.build/allreduce_raw benchmarks/allreduce_raw.c
 *     mpiexec.mpich -n 2 benchmarks/.build/allreduce_raw                 # 4 B .. 64 MiB, powers of 2
 *     mpiexec.mpich -n 2 benchmarks/.build/allreduce_raw 4 4096:5000     # BYTES[:ITERS] ...
 *
 * Options (for explaining a gap to pydist, which differs from the plain baseline in exactly these):
 *     -t   MPI_Init_thread(MPI_THREAD_MULTIPLE), as pydist initializes MPI
 *     -i   MPI_Iallreduce + MPI_Wait, as pydist issues its blocking all_reduce
 *     -n   no transparent huge pages for the buffer (see alloc_buffer)
 *
 * Method (allreduce_sweep.py's pydist worker does exactly the same, so the two are comparable):
 * per size, iters/10 + 2 untimed warm-up calls, a barrier, then iters timed calls; each rank's elapsed
 * time is reduced with MPI_MAX, and the slowest rank's time / iters is the time per call.
 *
 * Output, from rank 0 only; '#' lines are comments, and each size gives one line
 *     result <bytes> <iters> <microseconds per call>
 *
 * Errors: MPI_COMM_WORLD keeps MPI_ERRORS_ARE_FATAL, so a failing MPI call ends the whole job, which
 * is what a benchmark wants; bad arguments are found identically on every rank and MPI_Abort the job.
 */
#include <mpi.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define DEFAULT_MIN_BYTES 4L
#define DEFAULT_MAX_BYTES (64L << 20)
#define MAX_SIZES 64
// NumPy's threshold for asking for huge pages (numpy/_core/src/multiarray/alloc.c).
#define HUGEPAGE_MIN_BYTES (4L << 20)
#define HUGEPAGE_BYTES (2L << 20)

// ---------------------------------------------------------------------------------------------------
// Arguments

// Iterations when the caller gives none: enough for ~0.2 s under a deliberately pessimistic model
// (5 us + 1 GB/s). It must be a pure function of the size: every rank has to run the same count, or
// the job deadlocks.
static long default_iters(long bytes) {
    double seconds = 5e-6 + (double)bytes / 1e9;
    long iters = (long)(0.2 / seconds);
    return iters < 3 ? 3 : (iters > 100000 ? 100000 : iters);
}

static void usage_abort(int rank, const char *msg, const char *arg) {
    if (rank == 0) {
        fprintf(stderr, "allreduce_raw: %s: '%s'\nusage: allreduce_raw [-t] [-i] [-n] [BYTES[:ITERS] ...]\n",
                msg, arg);
    }
    MPI_Abort(MPI_COMM_WORLD, 2);
}

// "BYTES" or "BYTES:ITERS". BYTES must be a positive multiple of 4 (float32) whose element count
// fits MPI_Allreduce's int count.
static void parse_size(int rank, const char *arg, long *bytes, long *iters) {
    char *end = NULL;
    *bytes = strtol(arg, &end, 10);
    if (end == arg || *bytes <= 0 || *bytes % 4 != 0 || *bytes / 4 > INT_MAX) {
        usage_abort(rank, "BYTES must be a positive multiple of 4, at most 4*INT_MAX", arg);
    }
    *iters = default_iters(*bytes);
    if (*end == ':') {
        const char *s = end + 1;
        *iters = strtol(s, &end, 10);
        if (end == s || *iters <= 0) {
            usage_abort(rank, "ITERS must be a positive integer", arg);
        }
    }
    if (*end != '\0') {
        usage_abort(rank, "cannot parse size", arg);
    }
}

// ---------------------------------------------------------------------------------------------------
// The measurement

// The buffer gets the pages a NumPy array of the same size gets. NumPy asks for transparent huge pages
// (madvise MADV_HUGEPAGE) on every allocation of 4 MiB or more, and with THP in "madvise" mode (the
// default here) plain malloc gets 4 KiB pages; UCX's shared-memory copies of large messages run
// measurably faster from huge pages, so without this the baseline loses to pydist for a reason that
// has nothing to do with either. Zeroed here so page faults are not timed.
static float *alloc_buffer(long bytes, int huge_pages) {
    size_t size = (size_t)bytes;
    void *buf = NULL;
    if (huge_pages && bytes >= HUGEPAGE_MIN_BYTES) {
        size = (size + HUGEPAGE_BYTES - 1) / HUGEPAGE_BYTES * HUGEPAGE_BYTES;
        if (posix_memalign(&buf, HUGEPAGE_BYTES, size) != 0) {
            return NULL;
        }
        madvise(buf, size, MADV_HUGEPAGE);  // a hint: failure only means small pages
    } else {
        buf = malloc(size);
        if (buf == NULL) {
            return NULL;
        }
    }
    memset(buf, 0, size);
    return buf;
}

static void allreduce(float *buf, int count, int nonblocking) {
    if (nonblocking) {
        MPI_Request req;
        MPI_Iallreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
    } else {
        MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
}

// Seconds per call, as the slowest rank saw it (the same on every rank).
static double time_allreduce(float *buf, long bytes, long iters, int nonblocking) {
    int count = (int)(bytes / 4);
    for (long i = 0; i < iters / 10 + 2; i++) {
        allreduce(buf, count, nonblocking);
    }
    // Start together, so no rank's time includes waiting for a late peer to arrive.
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    for (long i = 0; i < iters; i++) {
        allreduce(buf, count, nonblocking);
    }
    double elapsed = MPI_Wtime() - start;
    MPI_Allreduce(MPI_IN_PLACE, &elapsed, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return elapsed / (double)iters;
}

// ---------------------------------------------------------------------------------------------------

int main(int argc, char **argv) {
    int thread_multiple = 0, nonblocking = 0, huge_pages = 1, first = 1;
    for (; first < argc && argv[first][0] == '-'; first++) {
        if (strcmp(argv[first], "-t") == 0) {
            thread_multiple = 1;
        } else if (strcmp(argv[first], "-i") == 0) {
            nonblocking = 1;
        } else if (strcmp(argv[first], "-n") == 0) {
            huge_pages = 0;
        } else {
            break;  // reported as a bad size below, once MPI can abort the job
        }
    }

    int provided = MPI_THREAD_SINGLE, rank, nranks;
    if (thread_multiple) {
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    } else {
        MPI_Init(&argc, &argv);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    long bytes[MAX_SIZES], iters[MAX_SIZES];
    int nsizes = 0;
    if (first == argc) {
        for (long b = DEFAULT_MIN_BYTES; b <= DEFAULT_MAX_BYTES; b *= 2) {
            bytes[nsizes] = b;
            iters[nsizes] = default_iters(b);
            nsizes++;
        }
    }
    for (int a = first; a < argc; a++) {
        if (nsizes == MAX_SIZES) {
            usage_abort(rank, "too many sizes", argv[a]);
        }
        parse_size(rank, argv[a], &bytes[nsizes], &iters[nsizes]);
        nsizes++;
    }

    // One buffer for all sizes, as the pydist worker uses views of one array. Zeros stay zeros under
    // SUM: no overflow to inf, no denormals.
    long max_bytes = 0;
    for (int s = 0; s < nsizes; s++) {
        max_bytes = bytes[s] > max_bytes ? bytes[s] : max_bytes;
    }
    float *buf = alloc_buffer(max_bytes, huge_pages);  // [max_bytes / 4]
    if (buf == NULL) {
        fprintf(stderr, "allreduce_raw: rank %d: cannot allocate %ld bytes\n", rank, max_bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    if (rank == 0) {
        printf("# allreduce_raw: ranks=%d dtype=float32 op=sum call=%s init=%s huge_pages=%s\n", nranks,
               nonblocking ? "MPI_Iallreduce+MPI_Wait" : "MPI_Allreduce",
               thread_multiple ? (provided == MPI_THREAD_MULTIPLE ? "MPI_THREAD_MULTIPLE" : "thread<MULTIPLE")
                               : "MPI_Init",
               huge_pages && max_bytes >= HUGEPAGE_MIN_BYTES ? "madvise" : "no");
        printf("# result <bytes> <iters> <us per call, slowest rank>\n");
        fflush(stdout);
    }
    for (int s = 0; s < nsizes; s++) {
        double seconds = time_allreduce(buf, bytes[s], iters[s], nonblocking);
        if (rank == 0) {
            printf("result %ld %ld %.4f\n", bytes[s], iters[s], seconds * 1e6);
            fflush(stdout);  // a driver that times out still gets the sizes that finished
        }
    }

    free(buf);
    MPI_Finalize();
    return 0;
}
