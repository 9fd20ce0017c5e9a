/*
 * wait_probe.c: where a pydist collective's time goes at 64 KiB .. a few MiB, in plain C.
 * It times each collective, float32 on MPI_COMM_WORLD, completed by each way of waiting pydist could
 * use, so that MPI's blocking call, MPI's nonblocking call + MPI_Wait and our poll loop can be told
 * apart:
 *
 *     block    MPI_<op> (what benchmarks/collectives_raw.c times)
 *     wait     MPI_I<op> + MPI_Wait
 *     test     MPI_I<op> + MPI_Test in a tight loop
 *     clock    MPI_I<op> + MPI_Test, MPI_Wtime after every test
 *     poll     MPI_I<op> + pydist's loop (csrc/progress/wait.c): MPI_Test, sched_yield after 64 tests,
 *              MPI_Wtime every 32 tests, slices of 2 ms
 *     yield    MPI_I<op> + MPI_Test and sched_yield after every test
 *     persist  MPI_<op>_init once, then MPI_Start + MPI_Wait (a persistent request on the same buffers)
 *
 * Collectives as collectives_raw.c (SIZE the whole buffer, R ranks, chunk SIZE/R), plus the calls
 * pydist makes where they differ: all_to_allv, all_to_all as MPI_Ialltoallv_c on bytes
 * (all_to_all_single); all_reduce_u and reduce_scatt_u, float32 SUM as pydist's user op (MPI's sum with
 * a canonical NaN, csrc/core/dtypes.c); every call in its large-count _c form.
 *
 *     mpicc.mpich -O3 -o benchmarks/.build/wait_probe benchmarks/wait_probe.c
 *     mpiexec.mpich -n 2 benchmarks/.build/wait_probe [-r REPEATS] [-t SECONDS] SIZE ...
 *
 * pydist sets MPIR_CVAR_IREDUCE_SCATTER_BLOCK_INTRA_ALGORITHM=sched_pairwise and
 * MPIR_CVAR_IALLGATHER_INTRA_ALGORITHM=sched_ring before MPI_Init (csrc/groups/group.c); pass them with -genv
 * to see the I-calls as pydist gets them.
 *
 * Method: per (collective, size), an iteration count that takes about -t seconds (default 0.05) with
 * the blocking call; then -r rounds (default 5), each timing every strategy in turn (warm-up, barrier,
 * N calls, the slowest rank's time / N), so that noise on a shared machine falls on all of them.
 * Printed: the median per strategy, in microseconds, and each strategy's time over the blocking call's.
 */
#include <mpi.h>

#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MAX_SIZES 32
#define MAX_ROUNDS 64
#define HUGEPAGE_MIN_BYTES (4L << 20)   // NumPy's threshold for asking for huge pages (collectives_raw.c)
#define HUGEPAGE_BYTES (2L << 20)

enum op { ALL_REDUCE, ALL_REDUCE_USER, ALL_GATHER, REDUCE_SCATTER, REDUCE_SCATTER_USER, BROADCAST, ALL_TO_ALL,
          ALL_TO_ALLV, NUM_OPS };
static const char *OP_NAMES[NUM_OPS] = {"all_reduce", "all_reduce_u", "all_gather", "reduce_scatter",
                                        "reduce_scatt_u", "broadcast", "all_to_all", "all_to_allv"};

enum strategy { BLOCK, WAIT, TEST, CLOCK, POLL, YIELD, PERSIST, NUM_STRATEGIES };
static const char *STRATEGY_NAMES[NUM_STRATEGIES] = {"block", "wait", "test", "clock", "poll", "yield", "persist"};

static int nranks;
static MPI_Op f32_sum_op;   // pydist's float32 SUM (csrc/core/dtypes.c): MPI's, with a canonical NaN
static MPI_Count *counts;   // [nranks] all_to_allv's byte counts and displacements
static MPI_Aint *displs;

// ---------------------------------------------------------------------------------------------------
// The calls

static void f32_sum(void *in, void *inout, MPI_Count *len, MPI_Datatype *dt) {
    (void)dt;
    const float *a_ = in;
    float *b_ = inout;
    const uint32_t bits = 0x7fc00000u;
    float nan;
    memcpy(&nan, &bits, sizeof nan);
    for (MPI_Count i = 0; i < *len; i++) {
        float c = a_[i] + b_[i];
        b_[i] = c == c ? c : nan;
    }
}

static void start(enum op op, float *in, float *out, MPI_Count count, MPI_Request *req) {
    MPI_Comm comm = MPI_COMM_WORLD;
    MPI_Count chunk = count / nranks;
    switch (op) {
    case ALL_REDUCE: MPI_Iallreduce_c(MPI_IN_PLACE, in, count, MPI_FLOAT, MPI_SUM, comm, req); break;
    case ALL_REDUCE_USER: MPI_Iallreduce_c(MPI_IN_PLACE, in, count, MPI_FLOAT, f32_sum_op, comm, req); break;
    case ALL_GATHER: MPI_Iallgather_c(in, chunk, MPI_FLOAT, out, chunk, MPI_FLOAT, comm, req); break;
    case REDUCE_SCATTER: MPI_Ireduce_scatter_block_c(in, out, chunk, MPI_FLOAT, MPI_SUM, comm, req); break;
    case REDUCE_SCATTER_USER:
        MPI_Ireduce_scatter_block_c(in, out, chunk, MPI_FLOAT, f32_sum_op, comm, req);
        break;
    case BROADCAST: MPI_Ibcast_c(in, count, MPI_FLOAT, 0, comm, req); break;
    case ALL_TO_ALL: MPI_Ialltoall_c(in, chunk, MPI_FLOAT, out, chunk, MPI_FLOAT, comm, req); break;
    case ALL_TO_ALLV:
        MPI_Ialltoallv_c(in, counts, displs, MPI_BYTE, out, counts, displs, MPI_BYTE, comm, req);
        break;
    default: break;
    }
}

static void blocking(enum op op, float *in, float *out, MPI_Count count) {
    MPI_Comm comm = MPI_COMM_WORLD;
    MPI_Count chunk = count / nranks;
    switch (op) {
    case ALL_REDUCE: MPI_Allreduce_c(MPI_IN_PLACE, in, count, MPI_FLOAT, MPI_SUM, comm); break;
    case ALL_REDUCE_USER: MPI_Allreduce_c(MPI_IN_PLACE, in, count, MPI_FLOAT, f32_sum_op, comm); break;
    case ALL_GATHER: MPI_Allgather_c(in, chunk, MPI_FLOAT, out, chunk, MPI_FLOAT, comm); break;
    case REDUCE_SCATTER: MPI_Reduce_scatter_block_c(in, out, chunk, MPI_FLOAT, MPI_SUM, comm); break;
    case REDUCE_SCATTER_USER: MPI_Reduce_scatter_block_c(in, out, chunk, MPI_FLOAT, f32_sum_op, comm); break;
    case BROADCAST: MPI_Bcast_c(in, count, MPI_FLOAT, 0, comm); break;
    case ALL_TO_ALL: MPI_Alltoall_c(in, chunk, MPI_FLOAT, out, chunk, MPI_FLOAT, comm); break;
    case ALL_TO_ALLV: MPI_Alltoallv_c(in, counts, displs, MPI_BYTE, out, counts, displs, MPI_BYTE, comm); break;
    default: break;
    }
}

// The ways of completing a started request.
static void complete(enum strategy s, MPI_Request *req) {
    int done = 0;
    switch (s) {
    case WAIT:
        MPI_Wait(req, MPI_STATUS_IGNORE);
        break;
    case TEST:
        while (!done) MPI_Test(req, &done, MPI_STATUS_IGNORE);
        break;
    case CLOCK:
        for (double t = 0; !done; t += MPI_Wtime()) MPI_Test(req, &done, MPI_STATUS_IGNORE);
        break;
    case POLL:   // csrc/progress/wait.c's test_for_a_slice, slice after slice (the GIL part left out)
        while (!done) {
            double slice_end = MPI_Wtime() + 0.002;
            for (long tests = 1; !done; tests++) {
                MPI_Test(req, &done, MPI_STATUS_IGNORE);
                if (tests > 64) sched_yield();
                if ((tests & 31) == 0 && MPI_Wtime() > slice_end) break;
            }
        }
        break;
    case YIELD:
        for (;;) {
            MPI_Test(req, &done, MPI_STATUS_IGNORE);
            if (done) break;
            sched_yield();
        }
        break;
    default:
        break;
    }
}

static void persistent_init(enum op op, float *in, float *out, MPI_Count count, MPI_Request *req) {
    MPI_Comm comm = MPI_COMM_WORLD;
    MPI_Count chunk = count / nranks;
    switch (op) {
    case ALL_REDUCE: MPI_Allreduce_init_c(MPI_IN_PLACE, in, count, MPI_FLOAT, MPI_SUM, comm, MPI_INFO_NULL, req); break;
    case ALL_REDUCE_USER:
        MPI_Allreduce_init_c(MPI_IN_PLACE, in, count, MPI_FLOAT, f32_sum_op, comm, MPI_INFO_NULL, req);
        break;
    case ALL_GATHER: MPI_Allgather_init_c(in, chunk, MPI_FLOAT, out, chunk, MPI_FLOAT, comm, MPI_INFO_NULL, req); break;
    case REDUCE_SCATTER:
        MPI_Reduce_scatter_block_init_c(in, out, chunk, MPI_FLOAT, MPI_SUM, comm, MPI_INFO_NULL, req);
        break;
    case REDUCE_SCATTER_USER:
        MPI_Reduce_scatter_block_init_c(in, out, chunk, MPI_FLOAT, f32_sum_op, comm, MPI_INFO_NULL, req);
        break;
    case BROADCAST: MPI_Bcast_init_c(in, count, MPI_FLOAT, 0, comm, MPI_INFO_NULL, req); break;
    case ALL_TO_ALL: MPI_Alltoall_init_c(in, chunk, MPI_FLOAT, out, chunk, MPI_FLOAT, comm, MPI_INFO_NULL, req); break;
    case ALL_TO_ALLV:
        MPI_Alltoallv_init_c(in, counts, displs, MPI_BYTE, out, counts, displs, MPI_BYTE, comm, MPI_INFO_NULL, req);
        break;
    default: break;
    }
}

static MPI_Request persistent = MPI_REQUEST_NULL;   // PERSIST's request, made per (collective, size)

static void one(enum strategy s, enum op op, float *in, float *out, MPI_Count count) {
    if (s == BLOCK) {
        blocking(op, in, out, count);
        return;
    }
    if (s == PERSIST) {
        MPI_Start(&persistent);
        MPI_Wait(&persistent, MPI_STATUS_IGNORE);
        return;
    }
    MPI_Request req;
    start(op, in, out, count, &req);
    complete(s, &req);
}

// Seconds per call, the slowest rank's.
static double time_calls(enum strategy s, enum op op, float *in, float *out, MPI_Count count, long iters) {
    for (long i = 0; i < iters / 10 + 2; i++) one(s, op, in, out, count);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (long i = 0; i < iters; i++) one(s, op, in, out, count);
    double elapsed = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &elapsed, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return elapsed / (double)iters;
}

// ---------------------------------------------------------------------------------------------------

static float *alloc_buffer(long bytes) {
    void *buf = NULL;
    size_t size = (size_t)bytes;
    if (bytes >= HUGEPAGE_MIN_BYTES) {
        size = (size + HUGEPAGE_BYTES - 1) / HUGEPAGE_BYTES * HUGEPAGE_BYTES;
        if (posix_memalign(&buf, HUGEPAGE_BYTES, size) != 0) return NULL;
        madvise(buf, size, MADV_HUGEPAGE);
    } else if ((buf = malloc(size)) == NULL) {
        return NULL;
    }
    memset(buf, 0, size);
    return buf;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int rounds = 5, first = 1, provided, rank;
    double target = 0.05;
    long sizes[MAX_SIZES];
    int nsizes = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);   // as pydist initializes MPI
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    MPI_Op_create_c(f32_sum, 1, &f32_sum_op);
    for (; first < argc; first++) {
        if (strcmp(argv[first], "-r") == 0 && first + 1 < argc) {
            rounds = atoi(argv[++first]);
        } else if (strcmp(argv[first], "-t") == 0 && first + 1 < argc) {
            target = atof(argv[++first]);
        } else if (nsizes < MAX_SIZES && atol(argv[first]) > 0) {
            sizes[nsizes++] = atol(argv[first]) / (4L * nranks) * (4L * nranks);
        } else {
            if (rank == 0) fprintf(stderr, "usage: wait_probe [-r ROUNDS] [-t SECONDS] SIZE ...\n");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (nsizes == 0 || rounds < 1 || rounds > MAX_ROUNDS) {
        if (rank == 0) fprintf(stderr, "usage: wait_probe [-r ROUNDS 1..%d] [-t SECONDS] SIZE ...\n", MAX_ROUNDS);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long max_bytes = 0;
    for (int i = 0; i < nsizes; i++) max_bytes = sizes[i] > max_bytes ? sizes[i] : max_bytes;
    float *in = alloc_buffer(max_bytes), *out = alloc_buffer(max_bytes);   // [max_bytes / 4] each
    counts = malloc(sizeof *counts * (size_t)nranks);
    displs = malloc(sizeof *displs * (size_t)nranks);
    if (in == NULL || out == NULL || counts == NULL || displs == NULL) {
        fprintf(stderr, "wait_probe: rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0) {
        const char *rs = getenv("MPIR_CVAR_IREDUCE_SCATTER_BLOCK_INTRA_ALGORITHM");
        const char *ag = getenv("MPIR_CVAR_IALLGATHER_INTRA_ALGORITHM");
        printf("# wait_probe: %d ranks, float32, median of %d rounds, us per call (x: over block); "
               "ireduce_scatter_block=%s iallgather=%s\n", nranks, rounds, rs ? rs : "auto", ag ? ag : "auto");
        printf("%-14s %9s", "collective", "size");
        for (int s = 0; s < NUM_STRATEGIES; s++) printf(" %9s", STRATEGY_NAMES[s]);
        for (int s = 1; s < NUM_STRATEGIES; s++) printf(" %6s", STRATEGY_NAMES[s]);
        printf("\n");
        fflush(stdout);
    }
    for (int z = 0; z < nsizes; z++) {
        MPI_Count count = sizes[z] / 4;
        for (int p = 0; p < nranks; p++) {
            counts[p] = sizes[z] / nranks;
            displs[p] = (MPI_Aint)p * (MPI_Aint)counts[p];
        }
        for (int op = 0; op < NUM_OPS; op++) {
            // iterations from one short blocking probe, the same on every rank
            double t = time_calls(BLOCK, op, in, out, count, 3);
            long iters = (long)(target / (t > 1e-7 ? t : 1e-7));
            iters = iters < 3 ? 3 : iters > 100000 ? 100000 : iters;
            double times[NUM_STRATEGIES][MAX_ROUNDS];
            persistent_init(op, in, out, count, &persistent);
            for (int r = 0; r < rounds; r++) {
                for (int s = 0; s < NUM_STRATEGIES; s++) {
                    times[s][r] = time_calls(s, op, in, out, count, iters);
                }
            }
            MPI_Request_free(&persistent);
            if (rank == 0) {
                double med[NUM_STRATEGIES];
                for (int s = 0; s < NUM_STRATEGIES; s++) {
                    qsort(times[s], (size_t)rounds, sizeof(double), by_value);
                    med[s] = times[s][rounds / 2] * 1e6;
                }
                printf("%-14s %9ld", OP_NAMES[op], sizes[z]);
                for (int s = 0; s < NUM_STRATEGIES; s++) printf(" %9.2f", med[s]);
                for (int s = 1; s < NUM_STRATEGIES; s++) printf(" %6.2f", med[s] / med[BLOCK]);
                printf("\n");
                fflush(stdout);
            }
        }
    }
    free(in);
    free(out);
    free(counts);
    free(displs);
    MPI_Op_free(&f32_sum_op);
    MPI_Finalize();
    return 0;
}
