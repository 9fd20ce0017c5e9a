/*
 * pair_probe.c: at 2 ranks, MPICH's broadcast, all-gather and all-to-all against the same bytes moved as
 * one point-to-point exchange, which is what pydist does past its shared-memory slots
 * (csrc/paths/request.c pd_mpi_call_start_pair). SIZE is the whole buffer as collectives_raw.c counts it; the
 * buffers are 2 MiB-aligned and madvised for huge pages, as NumPy's large arrays are.
 *
 *     block   MPI_Bcast / MPI_Allgather / MPI_Alltoall
 *     nb      MPI_Ibcast / MPI_Iallgather / MPI_Ialltoall + MPI_Test in a loop
 *     pair    MPI_Isend + MPI_Irecv (broadcast), or MPI_Isendrecv of the peer's block with this rank's
 *             own block copied meanwhile (all-gather, all-to-all), + MPI_Test in a loop
 *
 *     mpicc.mpich -O2 -o benchmarks/.build/pair_probe benchmarks/pair_probe.c
 *     mpiexec.mpich -n 2 benchmarks/.build/pair_probe [SIZE ...]     # default 64 KiB .. 16 MiB
 *
 * Per size: 7 rounds, each timing every variant in turn (warm-up, barrier, N calls, the slowest rank's
 * time / N); the fastest round is printed with block/variant (> 1: the variant is faster). On the AMD
 * AMD EPYC of docs/performance.md: all-gather block 22.8 / 259 us, pair 9.4 / 34.8 us at 256 KiB / 1 MiB;
 * broadcast and all-to-all within 4% of their pair.
 */
#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static int rank;

static void wait_test(MPI_Request *r) {
    int done = 0;
    while (!done) {
        MPI_Test(r, &done, MPI_STATUS_IGNORE);
    }
}

static void bcast_block(char *in, char *out, long n) { (void)in; MPI_Bcast(out, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD); }
static void bcast_nb(char *in, char *out, long n) {
    (void)in;
    MPI_Request r;
    MPI_Ibcast(out, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD, &r);
    wait_test(&r);
}
static void bcast_pair(char *in, char *out, long n) {
    (void)in;
    MPI_Request r;
    if (rank == 0) {
        MPI_Isend(out, (int)n, MPI_BYTE, 1, 7, MPI_COMM_WORLD, &r);
    } else {
        MPI_Irecv(out, (int)n, MPI_BYTE, 0, 7, MPI_COMM_WORLD, &r);
    }
    wait_test(&r);
}
static void gather_block(char *in, char *out, long n) {
    MPI_Allgather(in, (int)(n / 2), MPI_BYTE, out, (int)(n / 2), MPI_BYTE, MPI_COMM_WORLD);
}
static void gather_nb(char *in, char *out, long n) {
    MPI_Request r;
    MPI_Iallgather(in, (int)(n / 2), MPI_BYTE, out, (int)(n / 2), MPI_BYTE, MPI_COMM_WORLD, &r);
    wait_test(&r);
}
static void gather_pair(char *in, char *out, long n) {
    MPI_Request r;
    long h = n / 2;
    int p = 1 - rank;
    MPI_Isendrecv(in, (int)h, MPI_BYTE, p, 7, out + p * h, (int)h, MPI_BYTE, p, 7, MPI_COMM_WORLD, &r);
    memcpy(out + rank * h, in, (size_t)h);
    wait_test(&r);
}
static void alltoall_block(char *in, char *out, long n) {
    MPI_Alltoall(in, (int)(n / 2), MPI_BYTE, out, (int)(n / 2), MPI_BYTE, MPI_COMM_WORLD);
}
static void alltoall_nb(char *in, char *out, long n) {
    MPI_Request r;
    MPI_Ialltoall(in, (int)(n / 2), MPI_BYTE, out, (int)(n / 2), MPI_BYTE, MPI_COMM_WORLD, &r);
    wait_test(&r);
}
static void alltoall_pair(char *in, char *out, long n) {
    MPI_Request r;
    long h = n / 2;
    int p = 1 - rank;
    MPI_Isendrecv(in + p * h, (int)h, MPI_BYTE, p, 7, out + p * h, (int)h, MPI_BYTE, p, 7, MPI_COMM_WORLD, &r);
    memcpy(out + rank * h, in + rank * h, (size_t)h);
    wait_test(&r);
}

typedef void (*Call)(char *in, char *out, long n);
static const struct {
    const char *name;
    Call call;
    int base;   // the variant its ratio is taken against (the blocking call)
} VARIANTS[] = {
    {"broadcast block", bcast_block, 0},     {"broadcast nb", bcast_nb, 0},       {"broadcast pair", bcast_pair, 0},
    {"all_gather block", gather_block, 3},   {"all_gather nb", gather_nb, 3},     {"all_gather pair", gather_pair, 3},
    {"all_to_all block", alltoall_block, 6}, {"all_to_all nb", alltoall_nb, 6},   {"all_to_all pair", alltoall_pair, 6},
};
#define NV ((int)(sizeof VARIANTS / sizeof VARIANTS[0]))

static double slowest(double t) {
    double m;
    MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

int main(int argc, char **argv) {
    int provided, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        if (rank == 0) fprintf(stderr, "pair_probe: run it at 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long sizes[32] = {65536, 262144, 1L << 20, 4L << 20, 16L << 20};
    int nsizes = 5;
    if (argc > 1) {
        nsizes = 0;
        for (int i = 1; i < argc && nsizes < 32; i++) {
            long s = atol(argv[i]);
            if (s <= 0 || s % 2 || s > (1L << 30)) {
                if (rank == 0) fprintf(stderr, "pair_probe: sizes must be even, positive and at most 1 GiB: '%s'\n", argv[i]);
                MPI_Abort(MPI_COMM_WORLD, 2);
            }
            sizes[nsizes++] = s;
        }
    }
    long most = 0;
    for (int i = 0; i < nsizes; i++) most = sizes[i] > most ? sizes[i] : most;
    size_t bytes = ((size_t)most + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    char *in = aligned_alloc(2u << 20, bytes), *out = aligned_alloc(2u << 20, bytes);
    if (in == NULL || out == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
    madvise(in, bytes, MADV_HUGEPAGE);
    madvise(out, bytes, MADV_HUGEPAGE);
    memset(in, 1, bytes);
    memset(out, 2, bytes);
    for (int s = 0; s < nsizes; s++) {
        long n = sizes[s];
        long iters = (long)(0.05 / ((double)n / 5e9 + 3e-6));
        iters = iters < 3 ? 3 : iters;
        double best[NV];
        for (int v = 0; v < NV; v++) best[v] = 1e30;
        for (int round = 0; round < 7; round++) {
            for (int v = 0; v < NV; v++) {
                for (long i = 0; i < iters / 10 + 2; i++) VARIANTS[v].call(in, out, n);
                MPI_Barrier(MPI_COMM_WORLD);
                double t = MPI_Wtime();
                for (long i = 0; i < iters; i++) VARIANTS[v].call(in, out, n);
                t = slowest(MPI_Wtime() - t) / (double)iters * 1e6;
                best[v] = t < best[v] ? t : best[v];
            }
        }
        for (int v = 0; v < NV && rank == 0; v++) {
            printf("%9ld %-18s %10.2f us  %6.3f\n", n, VARIANTS[v].name, best[v], best[VARIANTS[v].base] / best[v]);
        }
    }
    free(in);
    free(out);
    MPI_Finalize();
    return 0;
}
