/*
 * timeline.c: the event buffers of timeline.h and their Chrome trace-event writer. Plain C.
 *
 * Every thread that records gets its own buffer, a list of fixed-size chunks, on its first event; the
 * buffers are linked into one list (under a mutex, once per thread) and never freed, so a thread's
 * pointer to its own stays valid across recordings. Appending takes no lock: the writer sets pd_tl_on
 * to 0 and then waits for each buffer's `busy` flag to clear, and an append re-checks pd_tl_on after
 * setting `busy`, so no append runs while the writer reads (both are sequentially consistent).
 *
 * This file is not the place for what the events mean: pydist/timeline.py starts and stops recording
 * and aligns the ranks' clocks; pydist/trace_report.py merges the ranks' files and reads them.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "observe/timeline.h"

#include "core/files.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define CHUNK_EVENTS 2048

typedef struct {
    int64_t t0, t1;
    const char *cat, *name;
    char ph;                 // 'X' a span on the thread, 'b' an async span (written as a b/e pair)
    int nargs;
    PdTlArg args[PD_TL_MAX_ARGS];
} Event;

typedef struct Chunk {
    struct Chunk *next;
    int used;
    Event events[CHUNK_EVENTS];
} Chunk;

typedef struct ThreadBuf {
    struct ThreadBuf *next;
    atomic_int busy;         // an append is under way
    long tid;
    const char *name;
    Chunk *head, *tail;                    // NULL: nothing recorded since the last write
} ThreadBuf;

atomic_int pd_tl_on = 0;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static ThreadBuf *buffers = NULL;          // every thread's, newest first
static PD_THREAD_LOCAL ThreadBuf *mine = NULL;
static int64_t origin_ns = 0;
static int my_rank = 0;
static long max_events = 0;
static atomic_long kept, dropped;

typedef struct Interned {
    struct Interned *next;
    char text[];
} Interned;
static Interned *interned = NULL;

// ---------------------------------------------------------------------------------------------------
// Recording

static ThreadBuf *my_buffer(void) {
    if (mine != NULL) {
        return mine;
    }
    ThreadBuf *b = calloc(1, sizeof *b);
    if (b == NULL) {
        return NULL;
    }
    b->tid = (long)syscall(SYS_gettid);
    b->name = b->tid == (long)getpid() ? "main" : NULL;
    pthread_mutex_lock(&lock);
    b->next = buffers;
    buffers = b;
    pthread_mutex_unlock(&lock);
    mine = b;
    return b;
}

// A free slot at the end of this thread's buffer (the caller holds b->busy), or NULL: dropped.
static Event *slot(ThreadBuf *b) {
    if (atomic_fetch_add(&kept, 1) >= max_events) {
        atomic_fetch_sub(&kept, 1);
        atomic_fetch_add(&dropped, 1);
        return NULL;
    }
    if (b->tail == NULL || b->tail->used == CHUNK_EVENTS) {
        Chunk *c = malloc(sizeof *c);
        if (c == NULL) {
            atomic_fetch_sub(&kept, 1);
            atomic_fetch_add(&dropped, 1);
            return NULL;
        }
        c->next = NULL;
        c->used = 0;
        if (b->tail != NULL) {
            b->tail->next = c;
        } else {
            b->head = c;
        }
        b->tail = c;
    }
    return &b->tail->events[b->tail->used++];
}

static void record(char ph, int64_t t0, int64_t t1, const char *cat, const char *name, int nargs, va_list ap) {
    ThreadBuf *b = my_buffer();
    if (b == NULL) {
        atomic_fetch_add(&dropped, 1);
        return;
    }
    atomic_store(&b->busy, 1);
    if (atomic_load(&pd_tl_on)) {   // (sequentially consistent with the writer's store and busy wait)
        Event *e = slot(b);
        if (e != NULL) {
            e->t0 = t0;
            e->t1 = t1 >= t0 ? t1 : t0;
            e->cat = cat;
            e->name = name;
            e->ph = ph;
            e->nargs = nargs < PD_TL_MAX_ARGS ? (nargs > 0 ? nargs : 0) : PD_TL_MAX_ARGS;
            for (int i = 0; i < e->nargs; i++) {
                e->args[i] = va_arg(ap, PdTlArg);
            }
        }
    }
    atomic_store(&b->busy, 0);
}

void pd_tl_span(int64_t t0, const char *cat, const char *name, int nargs, ...) {
    if (t0 == 0) {
        return;
    }
    int64_t t1 = pd_tl_clock();
    va_list ap;
    va_start(ap, nargs);
    record('X', t0, t1, cat, name, nargs, ap);
    va_end(ap);
}

void pd_tl_span_to(int64_t t0, int64_t t1, const char *cat, const char *name, int nargs, ...) {
    if (t0 == 0) {
        return;
    }
    va_list ap;
    va_start(ap, nargs);
    record('X', t0, t1, cat, name, nargs, ap);
    va_end(ap);
}

void pd_tl_async(int64_t t0, int64_t t1, const char *cat, const char *name, int nargs, ...) {
    if (t0 == 0) {
        return;
    }
    va_list ap;
    va_start(ap, nargs);
    record('b', t0, t1, cat, name, nargs, ap);
    va_end(ap);
}

const char *pd_tl_intern(const char *text) {
    pthread_mutex_lock(&lock);
    for (Interned *i = interned; i != NULL; i = i->next) {
        if (strcmp(i->text, text) == 0) {
            pthread_mutex_unlock(&lock);
            return i->text;
        }
    }
    size_t n = strlen(text) + 1;
    Interned *i = malloc(sizeof *i + n);
    if (i != NULL) {
        memcpy(i->text, text, n);
        i->next = interned;
        interned = i;
    }
    pthread_mutex_unlock(&lock);
    return i != NULL ? i->text : NULL;
}

void pd_tl_thread_name(const char *name) {
    ThreadBuf *b = my_buffer();
    if (b != NULL) {
        b->name = name;
    }
}

// ---------------------------------------------------------------------------------------------------
// Start, stop, write

static void free_events(void) {
    for (ThreadBuf *b = buffers; b != NULL; b = b->next) {
        while (atomic_load(&b->busy)) {
        }
        for (Chunk *c = b->head, *next; c != NULL; c = next) {
            next = c->next;
            free(c);
        }
        b->head = b->tail = NULL;
    }
    atomic_store(&kept, 0);
}

int pd_tl_start(int64_t origin, int rank, long max) {
    pd_tl_stop();
    pthread_mutex_lock(&lock);
    free_events();
    pthread_mutex_unlock(&lock);
    origin_ns = origin;
    my_rank = rank;
    max_events = max > 0 ? max : 1;
    atomic_store(&dropped, 0);
    atomic_store(&pd_tl_on, 1);
    return 0;
}

void pd_tl_stop(void) {
    atomic_store(&pd_tl_on, 0);
    pthread_mutex_lock(&lock);
    for (ThreadBuf *b = buffers; b != NULL; b = b->next) {
        while (atomic_load(&b->busy)) {   // an append that saw recording on finishes first
        }
    }
    pthread_mutex_unlock(&lock);
}

long pd_tl_count(void) {
    return atomic_load(&kept);
}

long pd_tl_dropped(void) {
    return atomic_load(&dropped);
}

// A JSON string (static names are plain; interned ones came from Python and may hold anything).
static void put_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            fputc('\\', f);
            fputc(*p, f);
        } else if (*p < 0x20) {
            fprintf(f, "\\u%04x", *p);
        } else {
            fputc(*p, f);
        }
    }
    fputc('"', f);
}

// Microseconds from the aligned origin, to the nanosecond.
static void put_us(FILE *f, int64_t ns) {
    long long rel = (long long)ns;
    const char *sign = rel < 0 ? "-" : "";
    if (rel < 0) rel = -rel;
    fprintf(f, "%s%lld.%03lld", sign, rel / 1000, rel % 1000);
}

static void put_args(FILE *f, const Event *e) {
    fputs(",\"args\":{", f);
    for (int i = 0; i < e->nargs; i++) {
        if (i) fputc(',', f);
        put_string(f, e->args[i].key);
        fputc(':', f);
        if (e->args[i].str != NULL) {
            put_string(f, e->args[i].str);
        } else {
            fprintf(f, "%lld", e->args[i].value);
        }
    }
    fputc('}', f);
}

// One trace event: {"ph", ["id",] "pid", "tid", "ts", ["dur",] "cat", "name", "args"}. id < 0: none;
// dur < 0: none; args: the event's own, or {} (an async span's end).
static void put_record(FILE *f, char ph, long long id, long tid, int64_t ts, int64_t dur, const Event *e, int args) {
    fprintf(f, ",\n{\"ph\":\"%c\",", ph);
    if (id >= 0) {
        fprintf(f, "\"id\":\"0x%llx\",", id);
    }
    fprintf(f, "\"pid\":%d,\"tid\":%ld,\"ts\":", my_rank, tid);
    put_us(f, ts);
    if (dur >= 0) {
        fputs(",\"dur\":", f);
        put_us(f, dur);
    }
    fputs(",\"cat\":", f);
    put_string(f, e->cat);
    fputs(",\"name\":", f);
    put_string(f, e->name);
    if (args) {
        put_args(f, e);
    } else {
        fputs(",\"args\":{}", f);
    }
    fputc('}', f);
}

// A span; an async one as a b/e pair whose id is unique in the job (the rank in the high 32 bits).
static void put_event(FILE *f, const Event *e, long tid, long long *async_ids) {
    if (e->ph == 'X') {
        put_record(f, 'X', -1, tid, e->t0 - origin_ns, e->t1 - e->t0, e, 1);
    } else {
        long long id = ((long long)my_rank << 32) | (*async_ids)++;
        put_record(f, 'b', id, tid, e->t0 - origin_ns, -1, e, 1);
        put_record(f, 'e', id, tid, e->t1 - origin_ns, -1, e, 0);
    }
}

// The trace's file: a fresh one beside `path` (pd_create_beside), renamed over it at the end, since
// `path` is predictable (run.rank3.json). Sets *tmp (free it); NULL with errno set.
static FILE *create_temp(const char *path, char **tmp) {
    size_t len = strlen(path) + PD_BESIDE_EXTRA;
    if ((*tmp = malloc(len)) == NULL) {
        return NULL;
    }
    int fd = pd_create_beside(path, *tmp, len);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (f == NULL) {
        int saved = errno;
        if (fd >= 0) {
            close(fd);
            unlink(*tmp);
        }
        free(*tmp);
        *tmp = NULL;
        errno = saved;
    }
    return f;
}

int pd_tl_write(const char *path, const char *label, const char *extra_json) {
    pd_tl_stop();
    char *tmp = NULL;
    FILE *f = create_temp(path, &tmp);
    if (f == NULL) {
        return -1;
    }
    pthread_mutex_lock(&lock);
    long long async_ids = 0;
    fputs("{\"traceEvents\":[", f);
    fprintf(f, "\n{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":", my_rank);
    put_string(f, label);
    fprintf(f, "}},\n{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":%d}}",
            my_rank, my_rank);
    for (ThreadBuf *b = buffers; b != NULL; b = b->next) {
        if (b->head == NULL) {
            continue;
        }
        char fallback[32];
        snprintf(fallback, sizeof fallback, "thread %ld", b->tid);
        fprintf(f, ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%ld,\"name\":\"thread_name\",\"args\":{\"name\":", my_rank,
                b->tid);
        put_string(f, b->name != NULL ? b->name : fallback);
        fprintf(f, "}},\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%ld,\"name\":\"thread_sort_index\",\"args\":"
                   "{\"sort_index\":%d}}", my_rank, b->tid, b->tid == (long)getpid() ? 0 : 1);
        for (Chunk *c = b->head; c != NULL; c = c->next) {
            for (int i = 0; i < c->used; i++) {
                put_event(f, &c->events[i], b->tid, &async_ids);
            }
        }
    }
    fprintf(f, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"pydist\":{\"version\":1,\"ranks\":{\"%d\":"
               "{\"events\":%ld,\"dropped\":%ld%s%s}}}}}\n", my_rank, atomic_load(&kept), atomic_load(&dropped),
            extra_json != NULL && extra_json[0] ? "," : "", extra_json != NULL ? extra_json : "");
    free_events();
    pthread_mutex_unlock(&lock);
    int failed = ferror(f);
    int rc = fclose(f) != 0 || failed ? -1 : rename(tmp, path);
    if (rc < 0) {
        int saved = errno;   // (a failed write leaves errno set; unlink must not change it)
        unlink(tmp);
        errno = saved;
    }
    free(tmp);
    return rc;
}
