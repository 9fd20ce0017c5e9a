/*
 * persistent.c: small collectives as MPI persistent requests, cached per process group.
 *
 * Why: MPICH builds a schedule for every nonblocking collective (MPI_Iallreduce and friends), and for
 * a small message that schedule is most of the call (2 ranks, 4 B all-reduce: MPI_Iallreduce + our
 * MPI_Test loop 2.0-3.1 us; MPI_Allreduce_init once, then MPI_Start + the same loop 0.9-1.4 us). A
 * persistent request builds it once. We keep pydist's own wait (wait.c: timeouts, Ctrl-C, departed
 * ranks, yielding to oversubscribed peers), so blocking MPI calls are still never used.
 *
 * Two facts of MPICH 4.0.2 shape the cache (measured: /work/notes/persistent_init_probe.c, pip2.c):
 *   1. every MPI_<coll>_init consumes a collective tag of its communicator: an init made on one rank
 *      only makes the next collective of that communicator hang;
 *   2. a persistent request started on one rank does not match a nonblocking call on another.
 * So whether a call is persistent, and every init, must be the same on every rank. The cache is
 * therefore keyed by what every rank passes identically (kind, count, datatype, op, root; one cache
 * per group), never by the array's address, and the request works on pydist-owned staging buffers:
 * the user's data is copied in, the request started, waited for, and the result copied out. Every
 * rank makes the same sequence of collective calls on a group, so lookups, inits and evictions (LRU
 * over keys, bounded in keys and staging bytes) happen identically everywhere.
 *
 * A key has up to KEY_ENTRIES requests, made lazily in order; the n-th call with that key uses entry
 * n % KEY_ENTRIES on every rank (async_op, and so busy-ness, may differ between ranks; the entry
 * choice must not). If that entry is still busy with an earlier call of this rank (an async Work not
 * yet waited, or a blocking wait that was given up), an async call never waits for it: it joins the
 * entry's queue of deferred calls, and the path's progress (every pydist wait) starts each once the
 * one before it has completed, in order. Deferring a start is safe because MPICH matches a persistent
 * request's starts by the request (its tag is taken at init), not by their order among the
 * communicator's other collectives; tests/mpi/test_semantics.py mixes the two. A blocking call
 * completes the earlier ones first (it may wait), then starts.
 *
 * Lifetime: an entry is freed when it is neither in a cache nor active. An active entry belongs to
 * its Work (which finishes it: copy out, then let go), to a thread waiting on it, or to nobody (a wait
 * given up, a Work dropped unwaited): such an orphan stays in its cache until it is needed again, and
 * when its key is evicted or its group destroyed it is parked (wait.c) with a capsule that finishes
 * and frees it once MPI has completed it. MPI never writes into freed staging.
 *
 * The messages this takes (PYDIST_PERSISTENT_BYTES, default 8 KiB; 0 turns it off) are decided per
 * call from the message size, which is the same on every rank; larger ones keep the nonblocking path.
 * Above about 8 KiB the two staging copies cost more than the schedule saved (2 ranks, the five
 * collectives of benchmarks/collectives_sweep.py at 64 KiB: 0.30-0.86x mpi4py's time with a 64 KiB
 * bound, 0.62-1.47x with 8 KiB, two alternating runs each).
 */
#include "paths/persistent.h"

#include "core/errors.h"
#include "core/settings.h"
#include "groups/group.h"
#include "observe/calls.h"
#include "progress/op.h"
#include "progress/wait.h"
#include "progress/work.h"


// Requests per key: async calls of one key may overlap this deep before the oldest must complete.
#define KEY_ENTRIES 4
// Bounds of one group's cache; the least recently used key goes first.
#define MAX_KEYS 64
#define MAX_STAGING_BYTES ((size_t)1 << 20)

#define DEFAULT_PERSIST_BYTES 8192
Py_ssize_t pd_persist_bytes = DEFAULT_PERSIST_BYTES;

struct PdPersistEntry {
    MPI_Request req;        // the persistent request: inactive between calls
    char *send, *recv;      // staging (one allocation); send == recv for in-place kinds, NULL for barrier
    size_t staging_bytes;
    int in_cache;           // a key of a cache holds it
    int active;             // started, not yet finished
    int waiting;            // a thread tests `req` with the GIL released (blocking call or reclaim)
    int pinned;             // a call is reclaiming it (entry_reclaim): that call decides its fate
    PdWorkObject *work;     // borrowed: the async Work of the active call; NULL: none
    struct Deferred *deferred, *deferred_last;   // async calls waiting for this entry, oldest first
    struct PdPersistEntry *next_busy;            // on the list of entries with deferred calls
    // The active call's completion: copy recv into dst (dst_bytes), divide by avg_divisor (AVG). dst is
    // NULL when nothing is copied (a blocking wait given up: the caller has moved on).
    char *dst;
    size_t dst_bytes;
    int avg_divisor;
    const PdDtype *avg_dtype;
    MPI_Count avg_count;
    PyObject *keep;         // owns dst when no Work does (a dropped Work's arrays)
};

// An async call that found its entry busy: started by the path's progress once the calls before it
// have completed. It holds a reference to its Work (whose `keep` owns its arrays).
typedef struct Deferred {
    PdPersistCall call;
    PdWorkObject *work;
    struct Deferred *next;
} Deferred;

// The entries with deferred calls (the path's progress walks them).
static PdPersistEntry *busy_entries = NULL;

typedef struct Key {
    PdPersistKey k;
    unsigned long calls;                  // calls made with this key: the next one's entry is calls % K
    PdPersistEntry *entries[KEY_ENTRIES];
    struct Key *prev, *next;              // most recently used first
} Key;

typedef struct {
    Key *head, *tail;
    int keys;
    size_t bytes;   // staging of every entry made
} Cache;

static Cache caches[PD_MAX_GROUPS];

// ---------------------------------------------------------------------------------------------------
// Entries

static void entry_free(PdPersistEntry *e) {
    int fin = 1;
    MPI_Finalized(&fin);
    if (!fin && e->req != MPI_REQUEST_NULL) {
        MPI_Request_free(&e->req);   // inactive here: MPI is done with the staging
    }
    PyMem_RawFree(e->send);
    PyMem_RawFree(e);
}

// The active call has completed in MPI: deliver its result, release its Work, free the entry if no
// cache holds it. GIL held.
static void entry_finish(PdPersistEntry *e) {
    if (e->dst != NULL && e->dst_bytes > 0) {
        memcpy(e->dst, e->recv, e->dst_bytes);
        if (e->avg_divisor > 0) {
            pd_divide_inplace(e->dst, e->avg_count, e->avg_dtype, e->avg_divisor);
        }
    }
    PdWorkObject *w = e->work;
    e->work = NULL;
    e->active = 0;
    e->dst = NULL;
    e->avg_divisor = 0;
    Py_CLEAR(e->keep);
    if (w != NULL) {
        w->pending = NULL;
        w->state = NULL;
        pd_work_finish(w);
    }
    if (!e->in_cache && !e->waiting && !e->pinned && e->deferred == NULL) {
        entry_free(e);
    }
}

static void parked_entry_done(PyObject *capsule) {
    PdPersistEntry *e = PyCapsule_GetPointer(capsule, "pydist.persistent_entry");
    if (e == NULL) {
        PyErr_Clear();
        return;
    }
    int fin = 1;
    MPI_Finalized(&fin);
    if (fin) {
        e->dst = NULL;   // nothing can be trusted after MPI_Finalize: just free
    }
    entry_finish(e);     // parked only once out of every cache: frees it
}

// An active entry nobody will finish leaves its cache: park its request with a capsule that finishes
// and frees it once MPI has completed it (pd_parked_drain, at destroy and exit). GIL held.
static void entry_park(PdPersistEntry *e) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *capsule = PyCapsule_New(e, "pydist.persistent_entry", parked_entry_done);
    if (capsule == NULL) {
        PyErr_Clear();   // out of memory: leak the entry on purpose, MPI may still write into it
    }
    pd_park(e->req, capsule, 0);
    PyErr_Restore(type, value, tb);
}

// Its key is going (eviction, group destroyed).
static void entry_leave_cache(PdPersistEntry *e) {
    e->in_cache = 0;
    if (e->pinned || e->deferred != NULL) {
        return;   // the call reclaiming it, or the progress starting its deferred calls, frees it
    }
    if (!e->active) {
        entry_free(e);
    } else if (e->work == NULL && !e->waiting) {
        entry_park(e);
    }   // else its Work or its waiting thread finishes it, and frees it then
}

// ---------------------------------------------------------------------------------------------------
// Keys

static size_t staging_bytes(const PdPersistKey *k, size_t *send, size_t *recv) {
    size_t n = (size_t)k->count * k->extent;
    *send = *recv = 0;
    switch (k->kind) {
    case PD_PERSIST_BARRIER: break;
    case PD_PERSIST_BCAST: case PD_PERSIST_ALLREDUCE: case PD_PERSIST_REDUCE: *send = n; break;   // in place
    case PD_PERSIST_ALLGATHER: *send = n; *recv = n * (size_t)k->size; break;
    case PD_PERSIST_REDUCE_SCATTER: *send = n * (size_t)k->size; *recv = n; break;
    }
    return *send + *recv;
}

static int key_equal(const PdPersistKey *a, const PdPersistKey *b) {
    return a->kind == b->kind && a->count == b->count && a->type == b->type && a->op == b->op &&
           a->root == b->root && a->extent == b->extent;
}

static void key_unlink(Cache *c, Key *key) {
    *(key->prev ? &key->prev->next : &c->head) = key->next;
    *(key->next ? &key->next->prev : &c->tail) = key->prev;
    key->prev = key->next = NULL;
}

static void key_push_front(Cache *c, Key *key) {
    key->next = c->head;
    key->prev = NULL;
    *(c->head ? &c->head->prev : &c->tail) = key;
    c->head = key;
}

static void key_drop(Cache *c, Key *key) {
    key_unlink(c, key);
    for (int i = 0; i < KEY_ENTRIES; i++) {
        if (key->entries[i] != NULL) {
            c->bytes -= key->entries[i]->staging_bytes;
            entry_leave_cache(key->entries[i]);
        }
    }
    c->keys--;
    PyMem_RawFree(key);
}

// Make room for `bytes` more staging (and a key, if adding_key) by evicting least recently used keys
// other than `keep`. The same decisions on every rank: they depend only on the call sequence.
static void make_room(Cache *c, size_t bytes, int adding_key, Key *keep) {
    while (c->tail != NULL && (c->keys + adding_key > MAX_KEYS || c->bytes + bytes > MAX_STAGING_BYTES)) {
        Key *victim = c->tail;
        if (victim == keep) {
            if (victim->prev == NULL) break;   // only the key in use is left: a soft bound
            victim = victim->prev;
        }
        key_drop(c, victim);
    }
}

// A new request for `key` in this group: staging, then MPI's init (which every rank makes here).
static PdPersistEntry *entry_new(const PdPersistKey *k, MPI_Comm comm) {
    size_t send, recv;
    size_t total = staging_bytes(k, &send, &recv);
    PdPersistEntry *e = PyMem_RawCalloc(1, sizeof *e);
    char *staging = total > 0 ? PyMem_RawMalloc(total) : NULL;
    if (e == NULL || (total > 0 && staging == NULL)) {
        PyMem_RawFree(e);
        PyMem_RawFree(staging);
        PyErr_NoMemory();
        return NULL;
    }
    e->send = staging;
    e->recv = recv > 0 ? staging + send : staging;
    e->staging_bytes = total;
    e->req = MPI_REQUEST_NULL;
    int n = (int)k->count, rc = MPI_SUCCESS;
    const char *call = "";
    switch (k->kind) {
    case PD_PERSIST_BARRIER:
        call = "MPI_Barrier_init";
        rc = MPI_Barrier_init(comm, MPI_INFO_NULL, &e->req);
        break;
    case PD_PERSIST_BCAST:
        call = "MPI_Bcast_init";
        rc = MPI_Bcast_init(e->send, n, k->type, k->root, comm, MPI_INFO_NULL, &e->req);
        break;
    case PD_PERSIST_ALLREDUCE:
        call = "MPI_Allreduce_init";
        rc = MPI_Allreduce_init(MPI_IN_PLACE, e->send, n, k->type, k->op, comm, MPI_INFO_NULL, &e->req);
        break;
    case PD_PERSIST_REDUCE:
        call = "MPI_Reduce_init";
        rc = k->root == k->rank
           ? MPI_Reduce_init(MPI_IN_PLACE, e->send, n, k->type, k->op, k->root, comm, MPI_INFO_NULL, &e->req)
           : MPI_Reduce_init(e->send, NULL, n, k->type, k->op, k->root, comm, MPI_INFO_NULL, &e->req);
        break;
    case PD_PERSIST_ALLGATHER:
        call = "MPI_Allgather_init";
        rc = MPI_Allgather_init(e->send, n, k->type, e->recv, n, k->type, comm, MPI_INFO_NULL, &e->req);
        break;
    case PD_PERSIST_REDUCE_SCATTER:
        call = "MPI_Reduce_scatter_block_init";
        rc = MPI_Reduce_scatter_block_init(e->send, e->recv, n, k->type, k->op, comm, MPI_INFO_NULL, &e->req);
        break;
    }
    if (rc != MPI_SUCCESS) {
        PyMem_RawFree(staging);
        PyMem_RawFree(e);
        pd_raise_mpi(rc, call);
        return NULL;
    }
    e->in_cache = 1;
    return e;
}

// ---------------------------------------------------------------------------------------------------
// Waiting

// Another thread tests this entry's request (a blocking call, or its Work's wait()).
static int other_thread_tests(const void *p) {
    const PdPersistEntry *e = p;
    return e->active && (e->waiting || (e->work != NULL && e->work->waiting));
}

// Complete the earlier call still active on `e` (this rank started it; every rank has): wait for it
// the pydist way, then deliver its result to its own array and Work.
static int entry_reclaim(PdPersistEntry *e, const PdOp *op) {
    int rc = 0;
    e->pinned++;   // whatever other threads do meanwhile (another wait finishing it, the group
                   // destroyed), the entry stays allocated until this call is done with it
    while (e->active && e->in_cache && rc == 0) {
        if (e->waiting || (e->work != NULL && e->work->waiting)) {
            rc = pd_yield_while(other_thread_tests, e, pd_group_timeout(op->group), op->what,
                                "another thread was waiting for its cached request");
            continue;
        }
        PdWorkObject *w = (PdWorkObject *)Py_XNewRef(e->work);
        MPI_Request req = e->req;
        e->waiting = 1;
        if (w != NULL) {
            w->waiting = 1;   // its wait() in another thread polls until we are done
        }
        rc = pd_op_wait(&req, MPI_STATUS_IGNORE, op, pd_group_timeout(op->group), 1);
        e->waiting = 0;
        if (w != NULL) {
            w->waiting = 0;
        }
        if (rc == 0) {
            entry_finish(e);   // pinned: never freed here
        }
        Py_XDECREF(w);
    }
    e->pinned--;
    if (!e->in_cache) {
        // Another thread destroyed the group meanwhile: this call cannot go on with the entry.
        if (!e->active) {
            entry_free(e);
        } else if (e->work == NULL && !e->waiting) {
            entry_park(e);
        }   // else its Work (or the thread waiting on it) finishes and frees it
        if (rc == 0) {
            PyErr_Format(PyExc_ValueError, "%s(): `group` was destroyed while this call waited", op->what);
        }
        return -1;
    }
    return rc;   // -1: still active, still its owner's
}

// ---------------------------------------------------------------------------------------------------
// A call

// This call's entry: the key found or made (evicting as needed), entry calls % K made if new. It may
// still be busy with earlier calls of this rank.
static PdPersistEntry *acquire(Cache *c, const PdPersistKey *k, MPI_Comm comm) {
    Key *key = c->head;
    while (key != NULL && !key_equal(&key->k, k)) {
        key = key->next;
    }
    if (key == NULL) {
        make_room(c, 0, 1, NULL);
        if ((key = PyMem_RawCalloc(1, sizeof *key)) == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        key->k = *k;
        c->keys++;
        key_push_front(c, key);
    } else if (key != c->head) {
        key_unlink(c, key);
        key_push_front(c, key);
    }
    int slot = (int)(key->calls % KEY_ENTRIES);
    PdPersistEntry *e = key->entries[slot];
    if (e == NULL) {
        size_t send, recv;
        size_t bytes = staging_bytes(k, &send, &recv);
        make_room(c, bytes, 0, key);
        if ((e = entry_new(k, comm)) == NULL) {
            return NULL;
        }
        key->entries[slot] = e;
        c->bytes += bytes;
    }
    key->calls++;   // counted once this rank's init (if any) is made, as every rank's is
    return e;
}

// Start `call` on the idle entry e; `w` (borrowed, may be NULL: a blocking call) owns its completion.
// 0, or -1 raised (nothing started).
static int entry_start(PdPersistEntry *e, const PdPersistCall *call, PdWorkObject *w) {
    if (call->src != NULL && call->src_bytes > 0) {
        memcpy(e->send, call->src, call->src_bytes);
    }
    int rc = MPI_Start(&e->req);
    if (rc != MPI_SUCCESS) {
        return pd_raise_mpi_int(rc, "MPI_Start");
    }
    e->active = 1;
    e->dst = call->dst;
    e->dst_bytes = call->dst_bytes;
    e->avg_divisor = call->avg_divisor;
    e->avg_dtype = call->avg_dtype;
    e->avg_count = call->avg_count;
    e->work = w;
    if (w != NULL) {
        w->req = e->req;   // a copy of the handle, for the record; the entry's is the one tested
    }
    return 0;
}

static void busy_unlist(PdPersistEntry *e) {
    for (PdPersistEntry **p = &busy_entries; *p != NULL; p = &(*p)->next_busy) {
        if (*p == e) {
            *p = e->next_busy;
            e->next_busy = NULL;
            return;
        }
    }
}

// The entry is idle: start its oldest deferred call. A start MPI refuses fails that call's Work (the
// other ranks' starts then wait for their timeout, as a failed MPI_Start would make them anyway).
static void deferred_start_next(PdPersistEntry *e) {
    Deferred *d = e->deferred;
    if (d == NULL || e->active) {
        return;
    }
    e->deferred = d->next;
    if (e->deferred == NULL) {
        e->deferred_last = NULL;
        busy_unlist(e);
    }
    PdWorkObject *w = d->work;
    if (entry_start(e, &d->call, w) < 0) {
        w->pending = NULL;
        w->state = NULL;
        pd_work_fail(w);
        PyErr_Clear();
    }
    Py_DECREF(w);   // the queue's reference: the entry holds a borrowed one while active, as for any Work
    PyMem_RawFree(d);
}

// The path's progress: every entry with deferred calls whose active call MPI has completed finishes
// it and starts the next one. GIL held, never raises.
static void persist_progress(void) {
    if (busy_entries == NULL) {
        return;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    for (PdPersistEntry *e = busy_entries, *next; e != NULL; e = next) {
        next = e->next_busy;
        if (e->active) {
            int done = 0;
            if (e->waiting || e->pinned || (e->work != NULL && e->work->waiting) ||
                MPI_Test(&e->req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) {
                continue;   // another thread tests it, or not yet (an MPI error: its wait reports it)
            }
            e->pinned++;   // not freed by finishing it: its deferred calls still need it
            entry_finish(e);
            e->pinned--;
        }
        deferred_start_next(e);
    }
    PyErr_Restore(type, value, tb);
}

// A blocking call, or a Work's wait for a deferred call: complete the entry's active call and start
// the deferred ones before `until` (NULL: all of them), waiting for each in turn. 0, or -1 raised.
static int entry_drain(PdPersistEntry *e, const PdOp *op, PdWorkObject *until) {
    for (;;) {
        if (until != NULL && e->work == until) {
            return 0;   // started already (by the progress, meanwhile)
        }
        if (e->active) {
            e->pinned++;
            int rc = entry_reclaim(e, op);
            e->pinned--;
            if (rc < 0) {
                return -1;
            }
            continue;
        }
        if (e->deferred == NULL || e->deferred->work == until) {
            return 0;
        }
        deferred_start_next(e);
    }
}

static const PdPending persist_pending;

PyObject *pd_persist_run(const PdOp *op, MPI_Comm comm, const PdPersistKey *k, const PdPersistCall *call,
                         PyObject *keep, PyObject *list) {
    pd_call_path = "persistent";
    Cache *c = &caches[op->group];
    PdPersistEntry *e = acquire(c, k, comm);
    if (e == NULL) {
        return NULL;
    }
    if (list != NULL && e->active) {   // async: a finished earlier call is finished now, without waiting
        int done = 0;
        if (!e->waiting && !e->pinned && (e->work == NULL || !e->work->waiting) &&
            MPI_Test(&e->req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
            e->pinned++;
            entry_finish(e);
            e->pinned--;
        }
    }
    PdWorkObject *w = NULL;
    if (list != NULL) {   // the Work first: once started or queued, the call must have an owner
        if ((w = pd_work_make(&persist_pending, e, op, keep, list)) == NULL) {
            return NULL;
        }
        if (e->active || e->deferred != NULL) {
            // Busy with earlier calls of this rank: queued, never waited for (the progress starts it).
            Deferred *d = PyMem_RawMalloc(sizeof *d);
            if (d == NULL) {
                w->pending = NULL;
                Py_DECREF(w);
                return PyErr_NoMemory();
            }
            *d = (Deferred){*call, (PdWorkObject *)Py_NewRef(w), NULL};
            if (e->deferred == NULL) {
                e->deferred = d;
                e->next_busy = busy_entries;
                busy_entries = e;
            } else {
                e->deferred_last->next = d;
            }
            e->deferred_last = d;
            return (PyObject *)w;
        }
        if (entry_start(e, call, w) < 0) {
            w->pending = NULL;
            Py_DECREF(w);
            return NULL;
        }
        return (PyObject *)w;
    }
    if ((e->active || e->deferred != NULL) && entry_drain(e, op, NULL) < 0) {
        return NULL;
    }
    if (!e->in_cache) {   // its group was destroyed while this call waited (another thread)
        if (!e->active && e->deferred == NULL && !e->pinned && !e->waiting) entry_free(e);
        return PyErr_Format(PyExc_ValueError, "%s(): `group` was destroyed while this call waited", op->what);
    }
    if (entry_start(e, call, NULL) < 0) {
        return NULL;
    }
    MPI_Request req = e->req;
    e->waiting = 1;
    int rc = pd_op_wait(&req, MPI_STATUS_IGNORE, op, pd_group_timeout(op->group), 1);
    e->waiting = 0;
    if (rc < 0) {
        // Given up (timeout, Ctrl-C, a departed rank): MPI may still complete it into the staging,
        // which the entry owns; the caller's array is never written after this call returns.
        e->dst = NULL;
        if (!e->in_cache && e->deferred == NULL) {
            entry_park(e);   // its group was destroyed meanwhile (another thread): nobody else will finish it
        }
        return NULL;
    }
    entry_finish(e);
    Py_RETURN_NONE;
}

// ---------------------------------------------------------------------------------------------------
// The pending operation of an async call (its Work's): active on its entry, or deferred behind it

static int persist_test(PdWorkObject *w) {
    persist_progress();
    PdPersistEntry *e = w->state;
    if (w->pending == NULL || e->work != w) {
        return w->pending == NULL;   // over, or still deferred
    }
    int done = 0;
    int rc = MPI_Test(&e->req, &done, &w->status);
    if (rc != MPI_SUCCESS) {
        pd_raise_mpi(rc, w->op.what);
        e->work = NULL;   // the entry stays active, its request MPI's to finish; nobody owns it now
        w->pending = NULL;
        w->state = NULL;
        pd_work_fail(w);
        PyErr_Clear();
        return 1;
    }
    if (done) {
        entry_finish(e);   // over: w->pending cleared
    }
    return done;
}

static int persist_wait(PdWorkObject *w, double timeout, int timeout_breaks) {
    PdPersistEntry *e = w->state;
    if (e->work != w) {   // deferred: the calls before it complete first (the entry is not freed meanwhile)
        if (entry_drain(e, &w->op, w) < 0) {
            return -1;
        }
        if (e->work != w) {
            deferred_start_next(e);   // ours, now at the head of an idle entry
        }
        if (w->pending == NULL) {
            return 0;   // its start failed (recorded)
        }
    }
    MPI_Request req = e->req;
    if (pd_op_wait(&req, &w->status, &w->op, timeout, timeout_breaks) < 0) {
        return -1;   // a persistent handle is never nulled: it stays pending, and the Work usable
    }
    entry_finish(e);
    return 0;
}

// Dropped while active (a deferred call's Work is held by its queue until started): the entry keeps
// the arrays and finishes the call later, when it is next needed, evicted or its group destroyed.
static void persist_abandon(PdWorkObject *w) {
    PdPersistEntry *e = w->state;
    w->state = NULL;
    if (e->work != w) {
        return;   // deferred: its queue holds a reference, so only a failed start gets here
    }
    int done = 0, fin = 1;
    MPI_Finalized(&fin);
    if (!fin && MPI_Test(&e->req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
        e->work = w;   // deliver now, as if waited
        entry_finish(e);
        return;
    }
    if (!fin) {
        pd_work_warn_dropped(w);
    }
    e->work = NULL;
    e->keep = w->keep;
    w->keep = NULL;
    if (fin) {
        e->dst = NULL;     // MPI has ended: nothing will complete; let go of it
        if (!e->in_cache) {
            entry_finish(e);
        }
    } else if (!e->in_cache && !e->waiting && e->deferred == NULL) {
        entry_park(e);
    }
}

static const PdPending persist_pending = {persist_test, persist_wait, persist_abandon};

// ---------------------------------------------------------------------------------------------------
// Groups

// The group's communicators are going (destroy, exit): its deferred calls can never start (their Works
// fail), and its cache is freed; what is still active is finished by its Work, or parked.
static void persist_group_release(long group, unsigned generation) {
    (void)generation;
    Cache *c = &caches[group];
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    for (Key *key = c->head; key != NULL; key = key->next) {
        for (int i = 0; i < KEY_ENTRIES; i++) {
            PdPersistEntry *e = key->entries[i];
            while (e != NULL && e->deferred != NULL) {
                Deferred *d = e->deferred;
                e->deferred = d->next;
                PyErr_Format(pd_DistError, "%s was abandoned: its process group was destroyed before it started",
                             d->work->op.what);
                d->work->pending = NULL;
                d->work->state = NULL;
                pd_work_fail(d->work);
                PyErr_Clear();
                Py_DECREF(d->work);
                PyMem_RawFree(d);
            }
            if (e != NULL) {
                e->deferred_last = NULL;
                busy_unlist(e);
            }
        }
    }
    PyErr_Restore(type, value, tb);
    while (c->head != NULL) {
        key_drop(c, c->head);
    }
    c->bytes = 0;
    c->keys = 0;
}

// MPICH 4.0.2's persistent all-gather with recursive doubling (its automatic choice at 2 and 4 ranks)
// leaves the peers' blocks unwritten from the second start on; these algorithms were checked right on
// every start (2-4 ranks). The session asks for sched_ring unless the user chose: any other choice, or MPI
// started by someone else without it, keeps all-gathers on the nonblocking path.
static const char *const ALLGATHER_RESTARTABLE[] = {"sched_ring", "sched_brucks", "tsp_ring", "tsp_brucks",
                                                    "tsp_recexch_doubling", "tsp_recexch_halving"};
int pd_persist_allgather_ok = 0;

void pd_persist_read_env(void) {
    const char *algorithm = getenv("MPIR_CVAR_IALLGATHER_INTRA_ALGORITHM");
    pd_persist_allgather_ok = 0;
    for (size_t i = 0; algorithm != NULL && i < sizeof ALLGATHER_RESTARTABLE / sizeof *ALLGATHER_RESTARTABLE; i++) {
        pd_persist_allgather_ok |= strcmp(algorithm, ALLGATHER_RESTARTABLE[i]) == 0;
    }
    // Unset: the default, not the last session's value (a session started with it 0 must not leave
    // the next one without the cache).
    size_t n = pd_env_bytes("PYDIST_PERSISTENT_BYTES", DEFAULT_PERSIST_BYTES);
    pd_persist_bytes = n > INT_MAX ? INT_MAX : (Py_ssize_t)n;
    // Only MPICH's own persistent collectives are known right when restarted. Intel MPI 2021.16's give
    // the peers' old or unwritten data from the second start on (all_gather, all_reduce: 3 of
    // tests/mpi/test_persistent.py's tests, and tests/threads_stress.py, which found it), so on any other
    // library every call takes the nonblocking path.
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
    int len = 0;
    if (MPI_Get_library_version(version, &len) != MPI_SUCCESS || strncmp(version, "MPICH Version:", 14) != 0) {
        pd_persist_bytes = 0;
        pd_persist_allgather_ok = 0;
    }
}

// _C.persistent_stats(group) -> (keys, entries, active entries, staging bytes), for tests.
PyObject *pd_persistent_stats(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long group;
    if (pd_check_nargs(nargs, 1, "persistent_stats") < 0 ||
        pd_arg_long(args[0], "persistent_stats", "group", &group) < 0) {
        return NULL;
    }
    if (group < 0 || group >= PD_MAX_GROUPS) {
        return PyErr_Format(PyExc_ValueError, "persistent_stats(): `group` must be in [0, %d); got %ld",
                            PD_MAX_GROUPS, group);
    }
    Cache *c = &caches[group];
    long entries = 0, active = 0;
    for (Key *key = c->head; key != NULL; key = key->next) {
        for (int i = 0; i < KEY_ENTRIES; i++) {
            entries += key->entries[i] != NULL;
            active += key->entries[i] != NULL && key->entries[i]->active;
        }
    }
    return Py_BuildValue("(illn)", c->keys, entries, active, (Py_ssize_t)c->bytes);
}

const PdPath pd_persistent_path = {"persistent", persist_progress, NULL, persist_group_release};
