/*
 * calls.c: a communication call as the timeline (timeline.h) and the stall inspector (stall.c) see it,
 * and the _C functions that start, stop and write the timeline (pydist/timeline.py drives them).
 *
 * Each _C communication function brackets its work with pd_call_begin/pd_call_end. A collective is
 * numbered among its group's collectives: every member numbers it alike (MPI matches collectives by
 * order), so the report can pair the ranks' spans of one collective and tell who arrived last. A group
 * is known in the trace by an id that is the same on every member: a hash of its world ranks and of its
 * ordinal among the groups of those same members this process has made (the session tells us as each is
 * made; every member makes them in the same order, as their creation is collective). Handles would not
 * do: a rank that made a group it is not in, or made one members-only, numbers its slots differently.
 */
#include "observe/calls.h"

#include "core/errors.h"
#include "groups/group.h"
#include "observe/stall.h"

#include <stdint.h>
#include <string.h>

PD_THREAD_LOCAL const char *pd_call_path = NULL;
PD_THREAD_LOCAL int pd_validate_only = 0;
int (*pd_call_defer)(PyObject *ret, const PdCall *c, long long bytes, const char *path) = NULL;

typedef struct {
    unsigned generation;   // the group slot's generation the entry is for
    int known;
    uint64_t gid;
    unsigned long seq;     // collectives numbered so far, since the group was made
    unsigned long base;    // seq when the timeline last started: the trace numbers from there
} GroupCalls;

static GroupCalls per_group[PD_MAX_GROUPS];
static PyObject *group_members = NULL;   // {gid: [world ranks]} of the groups calls were made on

// The trace's ids stay below 2**48 so that JSON readers that hold numbers as doubles read them exactly.
#define GID_MASK ((1ULL << 48) - 1)

// How many groups of each set of members this process has made (a member-set hash -> count): a
// group's ordinal among those of its members, the same on every member.
typedef struct {
    uint64_t members;
    unsigned long made;
} MemberSet;
static MemberSet *member_sets = NULL;
static int n_member_sets = 0, cap_member_sets = 0;

// The nth group (from 0) made with this member-set hash; -1: out of memory.
static long member_set_ordinal(uint64_t members) {
    for (int i = 0; i < n_member_sets; i++) {
        if (member_sets[i].members == members) {
            return (long)member_sets[i].made++;
        }
    }
    if (n_member_sets == cap_member_sets) {
        int cap = cap_member_sets ? 2 * cap_member_sets : 16;
        MemberSet *grown = PyMem_RawRealloc(member_sets, sizeof *grown * (size_t)cap);
        if (grown == NULL) {
            return -1;
        }
        member_sets = grown;
        cap_member_sets = cap;
    }
    member_sets[n_member_sets++] = (MemberSet){members, 1};
    return 0;
}

// Set g's id from the group's world ranks and `salt`, and list its members for timeline_groups().
static void identify(GroupCalls *g, long group, unsigned generation, int made) {
    int size = pd_group_size(group);
    uint64_t h = 1469598103934665603ULL;   // FNV-1a over the world ranks
    PyObject *members = PyList_New(size > 0 ? size : 0);
    for (int r = 0; r < size; r++) {
        int w = pd_group_to_global(group, r);
        h = (h ^ (uint64_t)(uint32_t)w) * 1099511628211ULL;
        if (members != NULL) {
            PyList_SET_ITEM(members, r, PyLong_FromLong(w));
        }
    }
    // made: the group's ordinal among those of its members (every member makes them in one order);
    // otherwise (a group this file was not told of) its handle, alike where ranks make groups alike
    long salt = made ? member_set_ordinal(h) : group + 1000000;
    h = (h ^ (uint64_t)salt) * 1099511628211ULL;
    g->gid = (h ^ (h >> 48)) & GID_MASK;
    g->seq = g->base = 0;
    g->generation = generation;
    g->known = 1;
    if (group_members == NULL) {
        group_members = PyDict_New();
    }
    PyObject *key = PyLong_FromUnsignedLongLong(g->gid);
    if (group_members != NULL && key != NULL && members != NULL) {
        PyDict_SetItem(group_members, key, members);
    }
    PyErr_Clear();   // bookkeeping for the trace only: never an error of the call
    Py_XDECREF(key);
    Py_XDECREF(members);
}

void pd_call_group_made(long group) {
    if (group >= 0 && group < PD_MAX_GROUPS) {
        identify(&per_group[group], group, pd_group_generation(group), 1);
    }
}

static GroupCalls *entry(long group) {
    if (group < 0 || group >= PD_MAX_GROUPS) {
        return NULL;
    }
    GroupCalls *g = &per_group[group];
    unsigned generation = pd_group_generation(group);
    if (!g->known || g->generation != generation) {
        identify(g, group, generation, 0);
    }
    return g;
}

uint64_t pd_call_group_id(long group) {
    GroupCalls *g = entry(group);
    return g != NULL ? g->gid : 0;
}

void pd_call_begin(PdCall *c, const char *name, long group, int collective, int peer) {
    c->name = name;
    c->group = group;
    c->peer = peer;
    c->skip = pd_validate_only;
    c->seq = c->board_seq = 0;
    c->gid = 0;
    pd_call_path = NULL;
    if (c->skip) {
        c->t0 = 0;
        return;
    }
    GroupCalls *g = entry(group);
    if (g != NULL) {
        c->gid = g->gid;
        if (collective) {
            c->board_seq = ++g->seq;
            c->seq = c->board_seq - g->base;
        }
    }
    pd_stall_note_call(c->name, c->gid, c->board_seq, c->peer);
    c->t0 = pd_tl_begin();
}

const char pd_call_refused[] = "refused";

void pd_call_end(PdCall *c, PyObject *ret, long long bytes) {
    if (c->skip) {
        return;
    }
    pd_stall_note_return();
    if (pd_call_path == pd_call_refused) {
        // Nothing took a number since (the GIL is held from pd_call_begin to the refusal).
        GroupCalls *g = entry(c->group);
        if (g != NULL && c->board_seq != 0 && g->seq == c->board_seq) {
            g->seq--;
        }
        return;
    }
    if (c->t0 == 0 || ret == NULL) {
        return;   // a failed call is not a span: its error says what happened
    }
    const char *path = pd_call_path != NULL ? pd_call_path : "MPI";
    if (pd_call_defer != NULL && pd_call_defer(ret, c, bytes, path)) {
        return;   // recorded when it completes (work.c)
    }
    pd_tl_span(c->t0, "comm", c->name, 5, PD_TL_INT("group", c->gid), PD_TL_INT("seq", c->seq),
               PD_TL_INT("bytes", bytes), PD_TL_STR("path", path), PD_TL_INT("peer", c->peer));
}

// ---------------------------------------------------------------------------------------------------
// _C.timeline_*: pydist/timeline.py's controls

// _C.last_call_path() -> str | None: the path that carried this thread's last call, as the timeline names
// it (python -m pydist.tune asks which path pydist's built-in choice took).
PyObject *pd_last_call_path(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (pd_call_path == NULL || pd_call_path == pd_call_refused) {
        Py_RETURN_NONE;
    }
    return PyUnicode_FromString(pd_call_path);
}

// _C.timeline_clock() -> int: this rank's CLOCK_MONOTONIC in nanoseconds.
PyObject *pd_timeline_clock(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyLong_FromLongLong(pd_tl_clock());
}

// _C.timeline_start(origin_ns, rank, max_events) -> None: record from now on, with times relative to
// `origin_ns` (this rank's clock at the aligned time 0). The trace also numbers collectives from 1 again,
// so that every rank starting a region at the same point of its program numbers alike; the stall
// board's numbers go on (a late rank's board still shows a call from before the start).
PyObject *pd_timeline_start(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long origin, rank, max_events;
    if (pd_check_nargs(nargs, 3, "timeline_start") < 0 || pd_arg_long(args[0], "timeline_start", "origin", &origin) < 0 ||
        pd_arg_long(args[1], "timeline_start", "rank", &rank) < 0 ||
        pd_arg_long(args[2], "timeline_start", "max_events", &max_events) < 0) {
        return NULL;
    }
    if (max_events <= 0) {
        PyErr_Format(PyExc_ValueError, "timeline: `max_events` must be positive; got %ld", max_events);
        return NULL;
    }
    for (int g = 0; g < PD_MAX_GROUPS; g++) {
        per_group[g].base = per_group[g].seq;
    }
    if (pd_tl_start((int64_t)origin, (int)rank, max_events) < 0) {
        return PyErr_NoMemory();
    }
    Py_RETURN_NONE;
}

// _C.timeline_write(path, label, extra_json) -> (events, dropped): stop recording and write this
// rank's trace (timeline.h's pd_tl_write). OSError when the file cannot be written.
PyObject *pd_timeline_write(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (pd_check_nargs(nargs, 3, "timeline_write") < 0) {
        return NULL;
    }
    PyObject *path = NULL;
    if (!PyUnicode_FSConverter(args[0], &path)) {
        return NULL;
    }
    const char *label = PyUnicode_Check(args[1]) ? PyUnicode_AsUTF8(args[1]) : NULL;
    const char *extra = PyUnicode_Check(args[2]) ? PyUnicode_AsUTF8(args[2]) : NULL;
    if (label == NULL || extra == NULL) {
        Py_DECREF(path);
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "timeline_write(): `label` and `extra_json` must be str");
        }
        return NULL;
    }
    long events = pd_tl_count(), dropped = pd_tl_dropped();
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pd_tl_write(PyBytes_AS_STRING(path), label, extra);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, args[0]);
        Py_DECREF(path);
        return NULL;
    }
    Py_DECREF(path);
    return Py_BuildValue("(ll)", events, dropped);
}

// A Python str, interned for the process's life (timeline.h keeps only pointers); NULL with an exception
// (not str, not encodable as UTF-8, out of memory).
static const char *intern(PyObject *obj, const char *what) {
    if (!PyUnicode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "timeline: %s must be str; got %.100s", what, Py_TYPE(obj)->tp_name);
        return NULL;
    }
    const char *text = PyUnicode_AsUTF8(obj);
    if (text == NULL) {
        return NULL;
    }
    const char *kept = pd_tl_intern(text);
    if (kept == NULL) {
        PyErr_NoMemory();
    }
    return kept;
}

// _C.timeline_event(cat, name, t0, t1, args) -> None: a span recorded from Python (the torch backend's
// backward pass, a user's region): args is a dict of str -> int or str, at most PD_TL_MAX_ARGS. The
// strings are interned (kept for the process's life): give names from a small set.
PyObject *pd_timeline_event(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (pd_check_nargs(nargs, 5, "timeline_event") < 0) {
        return NULL;
    }
    if (!pd_tl_recording()) {
        Py_RETURN_NONE;
    }
    if (!PyDict_Check(args[4]) || PyDict_GET_SIZE(args[4]) > PD_TL_MAX_ARGS) {
        PyErr_Format(PyExc_ValueError, "timeline: an event's `args` must be a dict of at most %d items",
                     PD_TL_MAX_ARGS);
        return NULL;
    }
    long long t0 = PyLong_AsLongLong(args[2]), t1 = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    PdTlArg a[PD_TL_MAX_ARGS] = {{0}};
    int n = 0;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(args[4], &pos, &key, &value)) {
        const char *k = intern(key, "an arg's name");
        if (k == NULL) {
            return NULL;
        }
        if (PyUnicode_Check(value)) {
            const char *v = intern(value, "an arg's value");
            if (v == NULL) {
                return NULL;
            }
            a[n++] = PD_TL_STR(k, v);
        } else {
            long long v = PyLong_AsLongLong(value);
            if (v == -1 && PyErr_Occurred()) {
                PyErr_Format(PyExc_TypeError, "timeline: arg %s must be an int or a str", k);
                return NULL;
            }
            a[n++] = PD_TL_INT(k, v);
        }
    }
    const char *cat = intern(args[0], "`cat`"), *name = cat != NULL ? intern(args[1], "`name`") : NULL;
    if (name == NULL) {
        return NULL;
    }
    pd_tl_span_to(t0 > 0 ? t0 : 1, t1, cat, name, n, a[0], a[1], a[2], a[3], a[4], a[5]);
    Py_RETURN_NONE;
}

// _C.timeline_groups() -> {gid: [world ranks]}: the groups calls were made on (a copy).
PyObject *pd_timeline_groups(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return group_members != NULL ? PyDict_Copy(group_members) : PyDict_New();
}

// _C.timeline_thread_name(name) -> None: how this thread is named in the trace.
PyObject *pd_timeline_thread_name(PyObject *self, PyObject *name) {
    (void)self;
    const char *n = intern(name, "a thread's name");
    if (n == NULL) {
        return NULL;
    }
    pd_tl_thread_name(n);
    Py_RETURN_NONE;
}
