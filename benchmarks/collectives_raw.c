/*
 * collectives_raw.c: the raw-MPI baseline for benchmarks/collectives_sweep.py. It times one
 * collective at a time on MPI_COMM_WORLD, float32, with nothing of pydist in the way, so the sweep can
 * say what pydist (and mpi4py) cost on top of MPI:
 *
 *     all_reduce      MPI_Allreduce(MPI_IN_PLACE, SUM)      buffer: SIZE bytes
 *     all_gather      MPI_Allgather                         SIZE/R bytes in, SIZE bytes out
 *     reduce_scatter  MPI_Reduce_scatter_block(SUM)         SIZE bytes in, SIZE/R bytes out
 *     broadcast       MPI_Bcast(root 0)                     buffer: SIZE bytes
 *     all_to_all      MPI_Alltoall                          SIZE bytes in, SIZE bytes out
 *
 * SIZE is the whole buffer, as nccl-tests counts it; the driver passes sizes that R*4 divides.
 *
 *     mpicc.mpich -O2 -o benchmarks/.build/collectives_raw benchmarks/collectives_raw.c
 *     mpiexec.mpich -n 2 benchmarks/.build/collectives_raw all_reduce:4:1000 all_gather:4096:500
 *
 * Options (for explaining a gap to pydist, which differs from the plain baseline in exactly these):
 *     -t   MPI_Init_thread(MPI_THREAD_MULTIPLE), as pydist initializes MPI
 *     -i   the nonblocking call + MPI_Wait, as pydist issues its blocking calls
 *     -n   no transparent huge pages for the buffers (see alloc_buffer)
 *     -c   the large-count MPI_*_c calls (with -i), as pydist calls them
 *     -o   two buffers of each item's own size per item (as a program's arrays of that size), where the
 *          default is views of two buffers of the largest size (nccl-tests' layout): on Open MPI a
 *          64 KiB block moves in one copy (CMA) from a huge page and page by page from the heap
 *
 * Method (collectives_sweep.py's pydist and mpi4py workers do exactly the same): per item,
 * iters/10 + 2 untimed warm-up calls, a barrier, then iters timed calls; each rank's elapsed time is
 * reduced with MPI_MAX, and the slowest rank's time / iters is the time per call.
 *
 * Output, from rank 0 only; '#' lines are comments, and each item gives one line
 *     result <op> <bytes> <iters> <microseconds per call>
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

#define MAX_ITEMS 256
// NumPy's threshold for asking for huge pages (numpy/_core/src/multiarray/alloc.c).
#define HUGEPAGE_MIN_BYTES (4L << 20)
#define HUGEPAGE_BYTES (2L << 20)

enum op { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, ALL_TO_ALL, NUM_OPS };
static const char *OP_NAMES[NUM_OPS] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                        "all_to_all"};

struct item {
    enum op op;
    long bytes;  // the whole buffer (SIZE above)
    long iters;
};

// ---------------------------------------------------------------------------------------------------
// Arguments

static void usage_abort(int rank, const char *msg, const char *arg) {
    if (rank == 0) {
        fprintf(stderr, "collectives_raw: %s: '%s'\nusage: collectives_raw [-t] [-i] [-n] [-c] OP:BYTES:ITERS ...\n"
                        "OP: all_reduce all_gather reduce_scatter broadcast all_to_all\n", msg, arg);
    }
    MPI_Abort(MPI_COMM_WORLD, 2);
}

// "OP:BYTES:ITERS". BYTES must be a positive multiple of 4*nranks whose element count fits an int.
static void parse_item(int rank, int nranks, const char *arg, struct item *it) {
    const char *colon = strchr(arg, ':');
    int op = NUM_OPS;
    for (int o = 0; colon != NULL && o < NUM_OPS; o++) {
        if (strlen(OP_NAMES[o]) == (size_t)(colon - arg) && strncmp(arg, OP_NAMES[o], colon - arg) == 0) {
            op = o;
        }
    }
    if (op == NUM_OPS) {
        usage_abort(rank, "unknown collective", arg);
    }
    char *end = NULL;
    it->op = (enum op)op;
    it->bytes = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end != ':' || it->bytes <= 0 || it->bytes % (4L * nranks) != 0 ||
        it->bytes / 4 > INT_MAX) {
        usage_abort(rank, "BYTES must be a positive multiple of 4*ranks, at most 4*INT_MAX", arg);
    }
    const char *s = end + 1;
    it->iters = strtol(s, &end, 10);
    if (end == s || *end != '\0' || it->iters <= 0) {
        usage_abort(rank, "ITERS must be a positive integer", arg);
    }
}

// ---------------------------------------------------------------------------------------------------
// The measurement

// The buffers get the pages a NumPy array of the same size gets. NumPy asks for transparent huge pages
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
        buf = malloc(size > 0 ? size : 1);
        if (buf == NULL) {
            return NULL;
        }
    }
    memset(buf, 0, size);
    return buf;
}

// One call of the collective. `in` and `out` hold `count` floats (the whole buffer); the chunked
// collectives use count/nranks of one of them, as the table at the top says.
static int large_count;  // -c

static void collective(enum op op, float *in, float *out, int count, int nranks, int nonblocking) {
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_Comm comm = MPI_COMM_WORLD;
    int chunk = count / nranks;
#if MPI_VERSION >= 4   // (Open MPI before 6 has no large-count calls: -c runs the int ones there)
    if (nonblocking && large_count) {
        switch (op) {
        case ALL_REDUCE: MPI_Iallreduce_c(MPI_IN_PLACE, in, count, MPI_FLOAT, MPI_SUM, comm, &req); break;
        case ALL_GATHER: MPI_Iallgather_c(in, chunk, MPI_FLOAT, out, chunk, MPI_FLOAT, comm, &req); break;
        case REDUCE_SCATTER: MPI_Ireduce_scatter_block_c(in, out, chunk, MPI_FLOAT, MPI_SUM, comm, &req); break;
        case BROADCAST: MPI_Ibcast_c(in, count, MPI_FLOAT, 0, comm, &req); break;
        case ALL_TO_ALL: MPI_Ialltoall_c(in, chunk, MPI_FLOAT, out, chunk, MPI_FLOAT, comm, &req); break;
        default: break;
        }
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        return;
    }
#endif
    switch (op) {
    case ALL_REDUCE:
        if (nonblocking) MPI_Iallreduce(MPI_IN_PLACE, in, count, MPI_FLOAT, MPI_SUM, comm, &req);
        else MPI_Allreduce(MPI_IN_PLACE, in, count, MPI_FLOAT, MPI_SUM, comm);
        break;
    case ALL_GATHER:
        if (nonblocking) MPI_Iallgather(in, chunk, MPI_FLOAT, out, chunk, MPI_FLOAT, comm, &req);
        else MPI_Allgather(in, chunk, MPI_FLOAT, out, chunk, MPI_FLOAT, comm);
        break;
    case REDUCE_SCATTER:
        if (nonblocking) MPI_Ireduce_scatter_block(in, out, chunk, MPI_FLOAT, MPI_SUM, comm, &req);
        else MPI_Reduce_scatter_block(in, out, chunk, MPI_FLOAT, MPI_SUM, comm);
        break;
    case BROADCAST:
        if (nonblocking) MPI_Ibcast(in, count, MPI_FLOAT, 0, comm, &req);
        else MPI_Bcast(in, count, MPI_FLOAT, 0, comm);
        break;
    case ALL_TO_ALL:
        if (nonblocking) MPI_Ialltoall(in, chunk, MPI_FLOAT, out, chunk, MPI_FLOAT, comm, &req);
        else MPI_Alltoall(in, chunk, MPI_FLOAT, out, chunk, MPI_FLOAT, comm);
        break;
    default:
        break;
    }
    if (nonblocking) {
        MPI_Wait(&req, MPI_STATUS_IGNORE);
    }
}

// Seconds per call, as the slowest rank saw it (the same on every rank).
static double time_item(const struct item *it, float *in, float *out, int nranks, int nonblocking) {
    int count = (int)(it->bytes / 4);
    for (long i = 0; i < it->iters / 10 + 2; i++) {
        collective(it->op, in, out, count, nranks, nonblocking);
    }
    // Start together, so no rank's time includes waiting for a late peer to arrive.
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    for (long i = 0; i < it->iters; i++) {
        collective(it->op, in, out, count, nranks, nonblocking);
    }
    double elapsed = MPI_Wtime() - start;
    MPI_Allreduce(MPI_IN_PLACE, &elapsed, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return elapsed / (double)it->iters;
}

// ---------------------------------------------------------------------------------------------------

int main(int argc, char **argv) {
    int thread_multiple = 0, nonblocking = 0, huge_pages = 1, own_buffers = 0, first = 1;
    for (; first < argc && argv[first][0] == '-'; first++) {
        if (strcmp(argv[first], "-t") == 0) {
            thread_multiple = 1;
        } else if (strcmp(argv[first], "-i") == 0) {
            nonblocking = 1;
        } else if (strcmp(argv[first], "-n") == 0) {
            huge_pages = 0;
        } else if (strcmp(argv[first], "-c") == 0) {
            large_count = 1;
        } else if (strcmp(argv[first], "-o") == 0) {
            own_buffers = 1;
        } else {
            break;  // reported as a bad item below, once MPI can abort the job
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

    static struct item items[MAX_ITEMS];
    int nitems = 0;
    if (first == argc) {
        usage_abort(rank, "no items", "");
    }
    for (int a = first; a < argc; a++) {
        if (nitems == MAX_ITEMS) {
            usage_abort(rank, "too many items", argv[a]);
        }
        parse_item(rank, nranks, argv[a], &items[nitems++]);
    }

    // Two buffers for all items, as the workers use views of two arrays. Zeros stay zeros under SUM:
    // no overflow to inf, no denormals.
    long max_bytes = 0;
    for (int s = 0; s < nitems; s++) {
        max_bytes = items[s].bytes > max_bytes ? items[s].bytes : max_bytes;
    }
    float *in = own_buffers ? NULL : alloc_buffer(max_bytes, huge_pages);   // [max_bytes / 4]
    float *out = own_buffers ? NULL : alloc_buffer(max_bytes, huge_pages);  // [max_bytes / 4]
    if (!own_buffers && (in == NULL || out == NULL)) {
        fprintf(stderr, "collectives_raw: rank %d: cannot allocate 2 x %ld bytes\n", rank, max_bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    if (rank == 0) {
        printf("# collectives_raw: ranks=%d dtype=float32 call=%s init=%s huge_pages=%s arrays=%s\n", nranks,
               nonblocking ? (large_count ? "MPI_I<op>_c+MPI_Wait" : "MPI_I<op>+MPI_Wait") : "MPI_<op>",
               thread_multiple ? (provided == MPI_THREAD_MULTIPLE ? "MPI_THREAD_MULTIPLE" : "thread<MULTIPLE")
                               : "MPI_Init",
               huge_pages && max_bytes >= HUGEPAGE_MIN_BYTES ? "madvise" : "no", own_buffers ? "own" : "shared");
        printf("# result <op> <bytes> <iters> <us per call, slowest rank>\n");
        // which MPI library ran (the driver checks that every program of a run used the same one)
        char version[MPI_MAX_LIBRARY_VERSION_STRING];
        int length = 0;
        MPI_Get_library_version(version, &length);
        printf("# library %s\n", strtok(version, "\n") ? version : "?");
        fflush(stdout);
    }
    for (int s = 0; s < nitems; s++) {
        float *item_in = in, *item_out = out;
        if (own_buffers && ((item_in = alloc_buffer(items[s].bytes, huge_pages)) == NULL ||
                            (item_out = alloc_buffer(items[s].bytes, huge_pages)) == NULL)) {
            fprintf(stderr, "collectives_raw: rank %d: cannot allocate 2 x %ld bytes\n", rank, items[s].bytes);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        double seconds = time_item(&items[s], item_in, item_out, nranks, nonblocking);
        if (own_buffers) {
            free(item_in);
            free(item_out);
        }
        if (rank == 0) {
            printf("result %s %ld %ld %.4f\n", OP_NAMES[items[s].op], items[s].bytes, items[s].iters,
                   seconds * 1e6);
            fflush(stdout);  // a driver that times out still gets the items that finished
        }
    }

    free(in);
    free(out);
    MPI_Finalize();
    return 0;
}
