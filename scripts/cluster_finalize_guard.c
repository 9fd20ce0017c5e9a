/*
 * cluster_finalize_guard.c: preloaded into the ranks of `scripts/cluster.sh run`. MPI_Finalize here
 * calls the real one (PMPI_Finalize) and, if it has not returned after PYDIST_CLUSTER_FINALIZE_GUARD
 * seconds (default 5), says so on stderr and ends the process with status 0.
 *
 * Why: with UCX over TCP (every job across hosts), MPICH 4.0.2 + UCX 1.13 hang in MPI_Finalize in
 * one job in four to six at 2 ranks (one in three at 3), on one machine (UCX_TLS=tcp) as across
 * namespaces: one rank loops in ucp_worker_progress waiting for its endpoint close
 * (ucp_disconnect_nb, flush) to complete while the peer it needs has finished its own close and
 * sits in the PMI barrier, progressing nothing (openucx/ucx#8738, "TCP
 * transport hangs during cleanup"). No UCX or MPICH variable we tried avoids it (UCX_TLS=tcp,
 * tcp,self, tcp,self,sm, all; UCX_TCP_PUT_ENABLE=n, UCX_TCP_CONN_NB=y, UCX_ADAPTIVE_PROGRESS=n,
 * UCX_PROTO_ENABLE=y). When it happens every operation of the job has completed: pydist's exit
 * barrier (csrc/groups/liveness.c) precedes MPI_Finalize, so what is lost by leaving is only the
 * disconnect. The rank in the PMI barrier meets its own guard and leaves too, and the job ends 0.
 * The cost: a rank that called sys.exit(N) and then hung here exits 0.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double seconds = 5.0;

static void *watch(void *unused) {
    (void)unused;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
    fprintf(stderr, "cluster finalize guard: MPI_Finalize did not return within %g s (UCX over TCP, "
                    "openucx/ucx#8738); every operation had completed; exiting 0\n", seconds);
    _exit(0);
    return NULL;
}

int MPI_Finalize(void) {
    const char *env = getenv("PYDIST_CLUSTER_FINALIZE_GUARD");
    if (env != NULL && *env != '\0') {
        seconds = atof(env);
    }
    // libmpich may have been loaded RTLD_LOCAL (by a Python extension): look it up by name.
    void *lib = dlopen("libmpich.so.12", RTLD_NOLOAD | RTLD_LAZY);
    int (*real)(void) = (int (*)(void))dlsym(lib != NULL ? lib : RTLD_DEFAULT, "PMPI_Finalize");
    if (real == NULL) {
        fprintf(stderr, "cluster finalize guard: PMPI_Finalize not found\n");
        return 1;
    }
    pthread_t thread;
    if (seconds > 0 && pthread_create(&thread, NULL, watch, NULL) == 0) {
        pthread_detach(thread);
    }
    return real();
}
