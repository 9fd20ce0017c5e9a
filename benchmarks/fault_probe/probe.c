/* fault_probe: what can surviving MPICH ranks do after one rank dies?
 *
 * usage: mpiexec -disable-auto-cleanup -n N ./probe <exit|kill|none> [steps]
 *   The last rank (N-1) dies with _exit(1) or raise(SIGKILL) at an agreed
 *   wall-clock time T_die (all ranks on one host share CLOCK_REALTIME).
 *   steps (default "bsacf", letters run in this order as given):
 *     b  survivors pre-post MPI_Irecv from the dying rank BEFORE it dies;
 *        the request is polled in every later wait loop and up to T_die+5 s
 *     a  ping-pong between ranks 0 and 1 after the death:
 *        1000 x 8 B round trips, then 4 x 1 MiB round trips (Isend/Irecv/Test)
 *     s  after the death: MPI_Isend 8 B and 1 MiB to the dead rank and a
 *        freshly posted MPI_Irecv from it, each Test-looped for 5 s
 *     x  MPIX_Comm_failure_ack + MPIX_Comm_failure_get_acked on WORLD
 *     c  MPI_Comm_create_group(WORLD, all-but-dead) then Iallreduce + Ibarrier
 *     f  MPI_Finalize (timed; a watchdog reports a hang)
 * Every line: "[wall +s since T0 | d=+s since T_die] rN TAG ...".
 * Every wait is a MPI_Test loop with a deadline; the blocking calls
 * (Comm_create_group, Finalize) are guarded by a watchdog thread that prints
 * "TIMEOUT after N s in <step>" and _exit(3)s.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int rank = -1, size = -1, dead = -1;
static double T0 = 0, T_die = 1e300;
static FILE *logf = NULL;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void say(const char *fmt, ...) {
    char buf[1024];
    double t = now();
    int n;
    if (T_die < 1e299)
        n = snprintf(buf, sizeof buf, "[%8.3f | d=%+8.3f] r%d ", t - T0, t - T_die, rank);
    else
        n = snprintf(buf, sizeof buf, "[%8.3f | d=     n/a] r%d ", T0 > 0 ? t - T0 : 0.0, rank);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, sizeof buf - n, fmt, ap);
    va_end(ap);
    fprintf(stdout, "%s\n", buf);
    fflush(stdout);
    if (logf) { fprintf(logf, "%s\n", buf); fflush(logf); }
}

static const char *errstr(int code) {
    static char s[MPI_MAX_ERROR_STRING + 64];
    char e[MPI_MAX_ERROR_STRING];
    int len = 0, cls = -1;
    e[0] = 0;
    MPI_Error_string(code, e, &len);
    MPI_Error_class(code, &cls);
    for (char *p = e; *p; p++) if (*p == '\n') *p = ' ';
    snprintf(s, sizeof s, "code=%d class=%d \"%s\"", code, cls, e);
    return s;
}

/* ---------- signals (question e) ---------- */
static volatile sig_atomic_t got_sig[65];
static void on_sig(int sig) {
    char m[160];
    double t = now();
    int n = snprintf(m, sizeof m, "[%8.3f | d=%+8.3f] r%d SIGNAL received: %d (%s)\n",
                     t - T0, T_die < 1e299 ? t - T_die : 0.0, rank, sig, strsignal(sig));
    if (n > 0) { (void)!write(1, m, n); if (logf) (void)!write(fileno(logf), m, n); }
    if (sig < 65) got_sig[sig]++;
    if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT) {
        /* log, then die the default way (so timeout/mpiexec can still stop us) */
        signal(sig, SIG_DFL);
        raise(sig);
    }
}
static void install_sig(void) {
    int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGPIPE, SIGQUIT, SIGCONT, SIGALRM};
    const char *nosig = getenv("PROBE_NOSIG"); /* "1": leave SIGUSR1/SIGUSR2/SIGPIPE at default */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sig;
    sa.sa_flags = SA_RESTART;
    for (unsigned i = 0; i < sizeof sigs / sizeof *sigs; i++) {
        if (nosig && *nosig == '1' && (sigs[i] == SIGUSR1 || sigs[i] == SIGUSR2 || sigs[i] == SIGPIPE)) continue;
        sigaction(sigs[i], &sa, NULL);
    }
}

/* ---------- watchdog for blocking calls ---------- */
static volatile double wd_deadline = 0;
static volatile const char *wd_step = "";
static volatile double wd_start = 0;
static void *watchdog(void *arg) {
    (void)arg;
    for (;;) {
        usleep(50000);
        double d = wd_deadline;
        if (d > 0 && now() > d) {
            say("TIMEOUT after %.1f s in %s (blocking call never returned) -> _exit(3)",
                now() - wd_start, (const char *)wd_step);
            _exit(3);
        }
    }
    return NULL;
}
static void wd_arm(const char *step, double secs) { wd_step = step; wd_start = now(); wd_deadline = now() + secs; }
static void wd_disarm(void) { wd_deadline = 0; }

/* ---------- pending requests involving the dead rank ---------- */
#define MAXP 8
static struct { MPI_Request req; const char *name; int done; } pend[MAXP];
static int npend = 0;

static void poll_pending(void) {
    for (int i = 0; i < npend; i++) {
        if (pend[i].done) continue;
        int flag = 0;
        MPI_Status st;
        memset(&st, 0, sizeof st);
        int rc = MPI_Test(&pend[i].req, &flag, &st);
        if (rc != MPI_SUCCESS) {
            pend[i].done = 1;
            say("B_ERR  %s completed with ERROR %s (status.MPI_ERROR=%d)", pend[i].name, errstr(rc), st.MPI_ERROR);
        } else if (flag) {
            pend[i].done = 1;
            say("B_DONE %s completed WITHOUT error (status.MPI_ERROR=%d src=%d)", pend[i].name, st.MPI_ERROR, st.MPI_SOURCE);
        }
    }
}
static void add_pending(MPI_Request r, const char *name) {
    pend[npend].req = r; pend[npend].name = name; pend[npend].done = 0; npend++;
}

static void gentle(void) { struct timespec ts = {0, 20000}; nanosleep(&ts, NULL); }

/* Test-loop one request; returns 0 ok, 1 error, 2 timeout */
static int wait_req(MPI_Request *r, double timeout, const char *what, int quiet) {
    double dl = now() + timeout, t0 = now();
    for (;;) {
        int flag = 0;
        MPI_Status st;
        int rc = MPI_Test(r, &flag, &st);
        poll_pending();
        if (rc != MPI_SUCCESS) {
            say("%s: ERROR after %.3f s: %s", what, now() - t0, errstr(rc));
            return 1;
        }
        if (flag) {
            if (!quiet) say("%s: completed OK after %.3f s", what, now() - t0);
            return 0;
        }
        if (now() > dl) {
            say("%s: TIMEOUT after %.1f s (request still pending)", what, timeout);
            return 2;
        }
        gentle();
    }
}

static void sleep_until(double t) {
    while (now() < t) { poll_pending(); usleep(1000); }
}

/* ---------- phase 0: everyone talks to everyone ---------- */
static int all_pairs(int bytes, int tag) {
    char *sb = malloc((size_t)bytes * size), *rb = malloc((size_t)bytes * size);
    MPI_Request rq[2 * 64];
    int n = 0, bad = 0;
    memset(sb, rank, (size_t)bytes * size);
    for (int p = 0; p < size; p++) {
        if (p == rank) continue;
        MPI_Irecv(rb + (size_t)p * bytes, bytes, MPI_BYTE, p, tag, MPI_COMM_WORLD, &rq[n++]);
        MPI_Isend(sb + (size_t)p * bytes, bytes, MPI_BYTE, p, tag, MPI_COMM_WORLD, &rq[n++]);
    }
    for (int i = 0; i < n; i++) {
        char w[64];
        snprintf(w, sizeof w, "pre-death all-pairs %dB req%d", bytes, i);
        if (wait_req(&rq[i], 10, w, 1)) bad++;
    }
    for (int p = 0; p < size; p++)
        if (p != rank && rb[(size_t)p * bytes] != (char)p) bad++;
    free(sb); free(rb);
    return bad;
}

/* ---------- step a: ping-pong 0 <-> 1 ---------- */
static void step_a(void) {
    if (rank > 1 || rank == dead) return;
    int peer = 1 - rank;
    say("A_START ping-pong r0<->r1: 1000 x 8 B, then 4 x 1 MiB");
    double t0 = now();
    char small[8] = {0};
    int ok = 0, res = 0;
    for (int i = 0; i < 1000 && res == 0; i++) {
        MPI_Request r;
        char w[64];
        snprintf(w, sizeof w, "A small iter %d", i);
        if (rank == 0) {
            MPI_Isend(small, 8, MPI_BYTE, peer, 100, MPI_COMM_WORLD, &r);
            if ((res = wait_req(&r, 3, w, 1))) break;
            MPI_Irecv(small, 8, MPI_BYTE, peer, 101, MPI_COMM_WORLD, &r);
            if ((res = wait_req(&r, 3, w, 1))) break;
        } else {
            MPI_Irecv(small, 8, MPI_BYTE, peer, 100, MPI_COMM_WORLD, &r);
            if ((res = wait_req(&r, 3, w, 1))) break;
            MPI_Isend(small, 8, MPI_BYTE, peer, 101, MPI_COMM_WORLD, &r);
            if ((res = wait_req(&r, 3, w, 1))) break;
        }
        ok++;
    }
    say("A_SMALL %s: %d/1000 round trips in %.3f s", ok == 1000 ? "OK" : (res == 2 ? "TIMEOUT" : "ERROR"), ok, now() - t0);
    const int MB = 1 << 20;
    char *big = malloc(MB);
    memset(big, rank, MB);
    int okb = 0;
    t0 = now();
    for (int i = 0; i < 4 && res == 0; i++) {
        MPI_Request r[2];
        char w[64];
        snprintf(w, sizeof w, "A 1MiB iter %d", i);
        /* both directions at once */
        char *rb = malloc(MB);
        MPI_Irecv(rb, MB, MPI_BYTE, peer, 102, MPI_COMM_WORLD, &r[0]);
        MPI_Isend(big, MB, MPI_BYTE, peer, 102, MPI_COMM_WORLD, &r[1]);
        res = wait_req(&r[0], 3, w, 1);
        if (!res) res = wait_req(&r[1], 3, w, 1);
        if (!res && rb[MB - 1] != (char)peer) { say("A 1MiB iter %d: DATA MISMATCH", i); res = 1; }
        free(rb);
        if (!res) okb++;
    }
    say("A_BIG %s: %d/4 x 1 MiB exchanges in %.3f s", okb == 4 ? "OK" : (res == 2 ? "TIMEOUT" : "ERROR"), okb, now() - t0);
    free(big);
}

/* ---------- step s: send to / fresh recv from the dead rank ---------- */
static void step_s(void) {
    if (rank == dead) return;
    static char sm[8], rsm[8];
    char *big = calloc(1, 1 << 20);
    MPI_Request r;
    say("S_START ops addressed to the dead rank %d (each Test-looped 3 s)", dead);
    MPI_Isend(sm, 8, MPI_BYTE, dead, 200, MPI_COMM_WORLD, &r);
    wait_req(&r, 3, "S Isend 8 B to dead", 0);
    MPI_Isend(big, 1 << 20, MPI_BYTE, dead, 201, MPI_COMM_WORLD, &r);
    wait_req(&r, 3, "S Isend 1 MiB to dead", 0);
    MPI_Irecv(rsm, 8, MPI_BYTE, dead, 202, MPI_COMM_WORLD, &r);
    wait_req(&r, 3, "S Irecv posted after death from dead", 0);
    /* do not free big: an incomplete send may still reference it */
}

/* ---------- step x: ULFM-style query ---------- */
static void step_x(void) {
    if (rank == dead) return;
    wd_arm("MPIX_Comm_failure_ack/get_acked", 5);
    int rc = MPIX_Comm_failure_ack(MPI_COMM_WORLD);
    say("X MPIX_Comm_failure_ack -> %s", rc == MPI_SUCCESS ? "MPI_SUCCESS" : errstr(rc));
    MPI_Group g = MPI_GROUP_NULL;
    rc = MPIX_Comm_failure_get_acked(MPI_COMM_WORLD, &g);
    int gs = -1;
    if (rc == MPI_SUCCESS && g != MPI_GROUP_NULL) MPI_Group_size(g, &gs);
    say("X MPIX_Comm_failure_get_acked -> %s, failed-group size %d",
        rc == MPI_SUCCESS ? "MPI_SUCCESS" : errstr(rc), gs);
    wd_disarm();
}

/* ---------- step c: communicator without the dead rank ---------- */
static void step_c(void) {
    if (rank == dead) return;
    MPI_Group wg, sg;
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    int ex[1] = {dead};
    MPI_Group_excl(wg, 1, ex, &sg);
    MPI_Comm nc = MPI_COMM_NULL;
    say("C_START MPI_Comm_create_group(WORLD, group without r%d) [blocking; watchdog 6 s]", dead);
    double t0 = now();
    wd_arm("MPI_Comm_create_group", 6);
    int rc = MPI_Comm_create_group(MPI_COMM_WORLD, sg, 77, &nc);
    wd_disarm();
    if (rc != MPI_SUCCESS || nc == MPI_COMM_NULL) {
        say("C_CREATE ERROR after %.3f s: %s", now() - t0, rc == MPI_SUCCESS ? "returned MPI_COMM_NULL" : errstr(rc));
        return;
    }
    int nr, ns;
    MPI_Comm_rank(nc, &nr);
    MPI_Comm_size(nc, &ns);
    say("C_CREATE OK after %.3f s: new comm rank %d of %d", now() - t0, nr, ns);
    MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
    int in = rank + 1, out = -1;
    MPI_Request r;
    rc = MPI_Iallreduce(&in, &out, 1, MPI_INT, MPI_SUM, nc, &r);
    if (rc != MPI_SUCCESS) say("C_ALLREDUCE start ERROR %s", errstr(rc));
    else if (wait_req(&r, 3, "C_ALLREDUCE", 0) == 0) {
        int expect = 0;
        for (int p = 0; p < size; p++) if (p != dead) expect += p + 1;
        say("C_ALLREDUCE result %d (expected %d) %s", out, expect, out == expect ? "OK" : "WRONG");
    }
    rc = MPI_Ibarrier(nc, &r);
    if (rc != MPI_SUCCESS) say("C_BARRIER start ERROR %s", errstr(rc));
    else wait_req(&r, 3, "C_BARRIER", 0);
    /* blocking versions too, under the watchdog */
    wd_arm("blocking MPI_Allreduce on new comm", 3);
    rc = MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_SUM, nc);
    wd_disarm();
    say("C_ALLREDUCE_BLOCKING rc=%s result %d", rc == MPI_SUCCESS ? "MPI_SUCCESS" : errstr(rc), out);
    wd_arm("blocking MPI_Barrier on new comm", 3);
    rc = MPI_Barrier(nc);
    wd_disarm();
    say("C_BARRIER_BLOCKING rc=%s", rc == MPI_SUCCESS ? "MPI_SUCCESS" : errstr(rc));
    /* keep nc alive (freeing is collective-ish; not needed) */
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "exit";
    const char *steps = argc > 2 ? argv[2] : "bsacf";
    setvbuf(stdout, NULL, _IOLBF, 0);
    install_sig();
    pthread_t th;
    pthread_create(&th, NULL, watchdog, NULL);

    wd_arm("MPI_Init", 15);
    MPI_Init(&argc, &argv);
    wd_disarm();
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    dead = size - 1;
    const char *ld = getenv("PROBE_LOGDIR");
    if (ld) {
        char fn[512];
        snprintf(fn, sizeof fn, "%s/rank%d.log", ld, rank);
        logf = fopen(fn, "w");
    }

    /* common time base */
    double tb = now();
    MPI_Bcast(&tb, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    T0 = tb;
    char ver[MPI_MAX_LIBRARY_VERSION_STRING];
    int vl;
    MPI_Get_library_version(ver, &vl);
    char *nl = strchr(ver, '\n');
    if (nl) *nl = 0;
    say("INIT rank %d of %d pid %d mode=%s steps=%s lib=\"%s\"", rank, size, (int)getpid(), mode, steps, ver);
    if (size < 3) say("WARNING size < 3: wrong mpiexec for this libmpi?");
    {
        struct sigaction old;
        const char *d[3] = {"SIG_DFL (terminate)", "SIG_IGN", "a handler"};
        for (int sg = SIGUSR1; sg <= SIGUSR2; sg += SIGUSR2 - SIGUSR1) {
            sigaction(sg, NULL, &old);
            int k = old.sa_handler == SIG_DFL ? 0 : old.sa_handler == SIG_IGN ? 1 : 2;
            if (rank == 0)
                say("SIGDISP after MPI_Init: %s -> %s%s", sg == SIGUSR1 ? "SIGUSR1" : "SIGUSR2", d[k],
                    k == 2 ? (old.sa_handler == on_sig ? " (the probe's logger)" : " (NOT the probe's: installed by MPI)") : "");
        }
    }

    /* pre-death: all pairs, small and 1 MiB, so every connection exists */
    int bad = all_pairs(8, 1) + all_pairs(1 << 20, 2);
    say("PRE all-pairs exchange (8 B and 1 MiB with every rank): %s", bad ? "FAILED" : "OK");
    double td = now() + 0.5;
    MPI_Bcast(&td, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Request br;
    MPI_Ibarrier(MPI_COMM_WORLD, &br);
    wait_req(&br, 10, "PRE barrier", 1);
    T_die = td;
    say("PRE done; rank %d will die at d=0 (%s)", dead, mode);

    static char prebuf[8];
    if (rank != dead && strchr(steps, 'b')) {
        MPI_Request r;
        int rc = MPI_Irecv(prebuf, 8, MPI_BYTE, dead, 300, MPI_COMM_WORLD, &r);
        say("B_POST MPI_Irecv from r%d posted before its death: rc=%d", dead, rc);
        add_pending(r, "B pre-posted Irecv from dead");
    }

    if (rank == dead) {
        sleep_until(T_die);
        if (!strcmp(mode, "exit")) { say("DYING now via _exit(1)"); _exit(1); }
        if (!strcmp(mode, "kill")) { say("DYING now via raise(SIGKILL)"); raise(SIGKILL); }
        say("mode none: control run, not dying");
        /* 'none' = control run: stay alive, join finalize */
        if (strchr(steps, 'f')) {
            double t0 = now();
            MPI_Finalize();
            say("F_FINALIZE returned after %.3f s (control, not dying)", now() - t0);
        }
        return 0;
    }

    sleep_until(T_die + 0.3); /* the death has happened */
    say("SURVIVOR alive after the death; running steps %s", steps);
    for (const char *p = steps; *p; p++) {
        switch (*p) {
        case 'a': step_a(); break;
        case 's': step_s(); break;
        case 'x': step_x(); break;
        case 'c': step_c(); break;
        case 'b':
            break;
        case 'f':
            /* let the pre-posted recv run its 5 s window first */
            if (npend) {
                sleep_until(T_die + 5.0);
                for (int i = 0; i < npend; i++)
                    if (!pend[i].done) say("B_TIMEOUT %s: nothing after 5 s (TIMEOUT after 5.0 s)", pend[i].name);
            }
            {
                int sigs = 0;
                for (int i = 0; i < 65; i++) sigs += got_sig[i];
                say("E_SIGNALS survivor received %d signal(s) so far", sigs);
                say("F_FINALIZE calling MPI_Finalize [watchdog 10 s]");
                double t0 = now();
                wd_arm("MPI_Finalize", 10);
                int rc = MPI_Finalize();
                wd_disarm();
                say("F_FINALIZE returned %s after %.3f s", rc == MPI_SUCCESS ? "MPI_SUCCESS" : "error", now() - t0);
            }
            break;
        }
    }
    if (npend && !strchr(steps, 'f')) {
        sleep_until(T_die + 5.0);
        for (int i = 0; i < npend; i++)
            if (!pend[i].done) say("B_TIMEOUT %s: nothing after 5 s", pend[i].name);
    }
    say("EXIT survivor returning 0 from main");
    return 0;
}
