/*
 * timeline.h: the per-rank event recorder behind PYDIST_TIMELINE (issue 28). Plain C, no Python, no
 * MPI: the engine (csrc/engine/, csrc/strategies/) and the communication paths record through it alike.
 *
 * An event is a span of time on the calling thread: [t0, t1] on CLOCK_MONOTONIC in nanoseconds, a
 * category and a name (static strings: only the pointers are kept), and up to PD_TL_MAX_ARGS
 * arguments (a static-string key with an integer or a static-string value). Each thread appends to its
 * own buffer (no lock, no Python); timeline.c writes every thread's events out as Chrome trace-event
 * JSON when recording stops. Off, recording costs the one branch in pd_tl_begin: callers write
 *
 *     int64_t t0 = pd_tl_begin();
 *     ... the work ...
 *     if (t0) pd_tl_span(t0, "compute", "forward", 1, PD_TL_INT("batch", B));
 *
 * Categories the report (pydist/trace_report.py) understands: "step" (a whole training step, the
 * parent of its phases), "compute" (batch, forward, backward, update, an injected delay), "sync" (the
 * engine's communication), "comm" (a pydist call), "strategy" (a strategy's own events), "torch".
 */
#ifndef PYDIST_TIMELINE_H
#define PYDIST_TIMELINE_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#define PD_TL_MAX_ARGS 6

// Thread-local variables that every call touches: the initial-exec model makes each access one load
// from the thread pointer instead of a call to __tls_get_addr (a shared object's default), which cost
// tens of ns per communication call. A few dozen bytes of the static TLS that glibc keeps for dlopen.
#define PD_THREAD_LOCAL _Thread_local __attribute__((tls_model("initial-exec")))

typedef struct {
    const char *key;        // static string
    const char *str;        // static string value, or NULL: the value is `value`
    long long value;
} PdTlArg;

#define PD_TL_INT(k, v) ((PdTlArg){(k), NULL, (long long)(v)})
#define PD_TL_STR(k, s) ((PdTlArg){(k), (s), 0})

// Recording is on (set by pd_tl_start, cleared by pd_tl_stop). Read relaxed (a plain load): a thread
// that sees it late records one event more or less, and the writer waits for appends under way.
extern atomic_int pd_tl_on;

static inline int pd_tl_recording(void) {
    return atomic_load_explicit(&pd_tl_on, memory_order_relaxed);
}

static inline int64_t pd_tl_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// The start of a span: the clock when recording, else 0 (so `if (t0)` guards the record).
static inline int64_t pd_tl_begin(void) {
    return __builtin_expect(pd_tl_recording(), 0) ? pd_tl_clock() : 0;
}

// Record the span [t0, now] on this thread with `nargs` PdTlArg arguments. t0 == 0: nothing.
void pd_tl_span(int64_t t0, const char *cat, const char *name, int nargs, ...);
// The same with an explicit end (t1 >= t0).
void pd_tl_span_to(int64_t t0, int64_t t1, const char *cat, const char *name, int nargs, ...);
// An asynchronous span (an async_op=True call from its start to its completion): it may overlap the
// thread's other spans, so it is written as a Chrome async pair ("b"/"e") with its own id.
void pd_tl_async(int64_t t0, int64_t t1, const char *cat, const char *name, int nargs, ...);
// A string that outlives the recording, for names known only at run time (a Python event's name):
// the same text gives the same pointer. NULL when out of memory.
const char *pd_tl_intern(const char *text);
// Name this thread in the trace (a static or interned string); the main thread is "main".
void pd_tl_thread_name(const char *name);

// What this rank is doing now, for the stall inspector (stall.c; a waiting rank reads it from the
// shared-memory board of its host): the engine calls it as a step's phases change. `what` is copied.
void pd_activity(const char *what, long long step);

// Start recording: `origin` is this rank's clock at the aligned time 0 (rank 0's start, translated into
// this rank's clock). Events already recorded and not written are dropped. 0, or -1 out of memory.
int pd_tl_start(int64_t origin, int rank, long max_events);
// Stop recording (no thread records after this returns any more events than it had begun).
void pd_tl_stop(void);
// Write what was recorded as one rank's Chrome trace ({"traceEvents": [...], "otherData": {...}}) to
// `path` (through a new file at an unguessable name, renamed over it: a link planted at `path` is
// replaced, never written through), the process named `label`; `extra_json` (a JSON object's members, without braces, or "") goes into otherData.pydist's
// entry for this rank. Then free the events. 0, or -1 with errno set.
int pd_tl_write(const char *path, const char *label, const char *extra_json);
// Events recorded and kept, and those dropped past max_events, since the start.
long pd_tl_count(void);
long pd_tl_dropped(void);

#endif  // PYDIST_TIMELINE_H
