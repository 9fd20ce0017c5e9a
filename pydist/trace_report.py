"""Reading pydist timelines: merge the ranks' files into one Chrome trace, say where each rank's time
went and which rank the others waited for, and draw it.

Each rank writes its own trace (csrc/observe/timeline.c, started by pydist/timeline.py); this module is what
reads them. A library, with the command line of ``python -m pydist.timeline`` (and of this module)::

    python -m pydist.trace_report merge run.rank0.json run.rank1.json run.rank2.json -o run.json
    python -m pydist.trace_report summary run.json --png run.png
    python -m pydist.trace_report png run.json run.png

    >>> from pydist import trace_report
    >>> merged = trace_report.merge(["run.rank0.json", "run.rank1.json"], "run.json")
    >>> print(trace_report.summary(merged))
    >>> trace_report.stragglers(merged).rank
    1

The format (one rank's file and the merged one alike)::

    {"traceEvents": [...], "displayTimeUnit": "ms",
     "otherData": {"pydist": {"version": 1, "ranks": {"0": {"events": N, "dropped": D, "host": ...,
                                                            "groups": {"<gid>": [world ranks]}}}}}}

pid is the rank, tid an OS thread; ts and dur are microseconds on a clock aligned across ranks. A
blocking call is an "X" span; an async_op=True call a "b"/"e" pair, which may overlap anything. Spans
on one thread nest. A collective carries args "group" and "seq": the same (group, seq) on several ranks
is one exchange they all took part in, which is how merge() finds who waited for whom.

Whatever reads a trace here checks it first (check(), one pass): a file that is not this format is a
ValueError naming the file and what is wrong, and the code after the check trusts the structure.

Not here: recording (csrc/observe/timeline.c), starting and stopping it (pydist/timeline.py), and the Trace
Event Format's own rules, nesting included, as a checker for the tests (tests/unit/trace_format.py).
Standard library and NumPy only; matplotlib, for the PNG, is imported when one is drawn.
"""
import argparse
import collections
import errno
import json
import math
import os
import stat
import sys
from dataclasses import dataclass, field

import numpy as np

from . import _files, _figures as figures

VERSION = 1              # otherData.pydist.version this module reads and writes
SLACK_US = 0.001         # 1 ns: times are written to the nanosecond, so sums may round by that much
MIN_WAIT_US = 1.0        # a shorter wait is noted on the span's args but gets no "wait" event of its own
WAIT_CAT, WAIT_NAME = "wait", "waiting for rank "   # the events merge() adds (and takes off again)

# Where a category's time goes in the summary. Anything else (a user's category included) is "other".
KIND = {"compute": "compute", "comm": "communication", "sync": "communication", "torch": "communication",
        "strategy": "communication", WAIT_CAT: "waiting"}
KINDS = ("compute", "communication", "waiting", "other")


# ---------------------------------------------------------------------------------------------------
# Reading and writing

def load(path):
    """The trace in `path` as a dict, checked (check()) so that everything here can trust its shape.
    OSError when it cannot be read (a directory, a FIFO: not a regular file); ValueError naming the file
    and what is wrong when it is not strict JSON or not a trace as pydist writes them.

    >>> load("run.json")["otherData"]["pydist"]["ranks"].keys()
    dict_keys(['0', '1', '2'])
    """
    source = os.fsdecode(path)
    # O_NONBLOCK: opening a FIFO would wait for a writer; a regular file ignores it
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), source)
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file", source)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        text = f.read()
    try:
        trace = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as e:   # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{source}: not JSON: {e}") from None
    except RecursionError:
        raise ValueError(f"{source}: not JSON this reader takes: nested too deeply") from None
    return check(trace, source)


def _refuse_constant(name):
    # NaN and Infinity are Python's extension of JSON; other readers (Perfetto's) refuse them
    raise ValueError(f"{name} is not a JSON number")


def write(trace, path):
    """Write `trace` compactly, one event a line (as the ranks write theirs), through a temporary file,
    so `path` holds the whole trace or what it held before."""
    head = {k: v for k, v in trace.items() if k != "traceEvents"}
    with _files.replacing(path) as f:
        f.write('{"traceEvents":[\n')
        f.write(",\n".join(_compact(e) for e in trace["traceEvents"]))
        f.write("\n]")
        for key, value in head.items():
            f.write(f",{_compact(key)}:{_compact(value)}")
        f.write("}\n")


def _compact(value):
    return json.dumps(value, separators=(",", ":"), allow_nan=False)



# ---------------------------------------------------------------------------------------------------
# Checking: what load() promises the rest of this module

MAX_US = 1e16            # |ts| and dur in us: any int64 count of ns fits; larger is no clock's
MAX_RANK = 2**31 - 1     # MPI ranks are C ints
MAX_INT = 2**53          # ids, counts, numbers: exact where JSON readers hold numbers as doubles
MAX_GID = 2**48 - 1      # calls.c's group ids
MAX_DEPTH = 32           # nesting of free-form values (args, others' otherData): json's writer recurses
PHASES = {"M": ({"ph", "pid", "tid", "name", "args"}, set()),          # phase: (required, optional) keys
          "X": ({"ph", "pid", "tid", "ts", "dur", "cat", "name"}, {"args"}),
          "b": ({"ph", "id", "pid", "tid", "ts", "cat", "name"}, {"args"}),
          "e": ({"ph", "id", "pid", "tid", "ts", "cat", "name"}, {"args"})}
ALLOWED = {ph: required | optional for ph, (required, optional) in PHASES.items()}
METADATA = {"process_name": "name", "thread_name": "name", "process_sort_index": "sort_index",
            "thread_sort_index": "sort_index"}


class _Bad(Exception):
    """One thing wrong, said from where it is in the trace."""


def _is_int(x, lo=0, hi=MAX_INT):
    return type(x) is int and lo <= x <= hi   # (a bool is no int here)


def _is_time(x, lo=-MAX_US):
    return type(x) in (int, float) and lo <= x <= MAX_US   # NaN compares false


def _is_text(x):
    # text that prints and writes as UTF-8 (JSON's "\ud800" escapes give lone surrogates)
    if type(x) is not str:
        return False
    if x.isascii():
        return True
    try:
        x.encode()
        return True
    except UnicodeEncodeError:
        return False


def _fail(where, rule, got):
    shown = repr(got)
    raise _Bad(f"{where} must be {rule}; got {shown if len(shown) <= 60 else shown[:57] + '...'}")


def _need(ok, where, rule, got):
    if not ok:
        _fail(where, rule, got)


def _keys(obj, where, required, optional=frozenset()):
    """`obj` is an object with every required key and none outside required | optional."""
    _need(type(obj) is dict, where, "an object", obj)
    missing = required - obj.keys()
    if missing:
        raise _Bad(f"{where} has no {min(missing)!r}")
    extra = obj.keys() - required - optional
    if extra:
        raise _Bad(f"{where} has an unexpected key {min(map(str, extra))!r}")


def _decimal(key, where, hi):
    """A key that names a number (a rank, a group id) by its decimal digits."""
    _need(type(key) is str and key.isascii() and key.isdigit() and str(int(key)) == key and int(key) <= hi,
          f"{where}'s keys", f"ints from 0 to {hi} in decimal", key)


def _plain(value, where):
    """Free-form JSON (args, others' otherData): text, finite numbers, true, false, null, and lists and
    objects of them at most MAX_DEPTH deep, so that write() can give it back as it was."""
    stack, seen = [(value, 0)], set()
    while stack:
        v, depth = stack.pop()
        kind = type(v)
        if kind is dict or kind is list:
            _need(depth < MAX_DEPTH and id(v) not in seen, where, f"JSON at most {MAX_DEPTH} deep", "deeper")
            seen.add(id(v))
            if kind is dict:
                for k in v:
                    _need(_is_text(k), where, "an object with text keys", k)
            stack.extend((x, depth + 1) for x in (v.values() if kind is dict else v))
        elif kind is float:
            _need(math.isfinite(v), where, "finite numbers", v)
        else:
            _need(v is None or kind is bool or kind is int or _is_text(v), where, "JSON", v)


# The args this module reads, by category: (check, rule). last_rank must also be a rank the trace lists.
COLLECTIVE_ARGS = {"group": (lambda x: _is_int(x, 0, MAX_GID), "a group id (an int >= 0)"),
                   "seq": (_is_int, "an int >= 0"),
                   "wait_us": (lambda x: _is_time(x, 0), "a number of us >= 0"),
                   "last_rank": (lambda x: _is_int(x, 0, MAX_RANK), "a rank")}
TYPED_ARGS = {"comm": COLLECTIVE_ARGS, "sync": COLLECTIVE_ARGS,
              "step": {"step": (lambda x: _is_int(x, -MAX_INT), "an int")}}


def _check_pydist(data):
    """otherData.pydist: {"version", "ranks": {rank: {...}}, ["waits"]}; returns the ranks it lists."""
    _keys(data, "otherData.pydist", {"version", "ranks"}, {"waits"})
    if type(data["version"]) is not int or data["version"] != VERSION:
        raise _Bad(f"format version {data['version']!r}; this pydist reads version {VERSION}")
    _need(type(data["ranks"]) is dict, "otherData.pydist.ranks", "an object", data["ranks"])
    for key, info in data["ranks"].items():
        where = f"otherData.pydist.ranks[{key!r}]"
        _decimal(key, "otherData.pydist.ranks", MAX_RANK)
        _keys(info, where, {"events", "dropped"}, {"host", "pid", "groups"})
        for name in ("events", "dropped", "pid"):
            if name in info:
                _need(_is_int(info[name]), f"{where}.{name}", "an int >= 0", info[name])
        _need(_is_text(info.get("host", "")), f"{where}.host", "text", info.get("host"))
        groups = info.get("groups", {})
        _need(type(groups) is dict, f"{where}.groups", "an object", groups)
        for gid, members in groups.items():
            _decimal(gid, f"{where}.groups", MAX_GID)
            _need(type(members) is list and all(_is_int(m, 0, MAX_RANK) for m in members),
                  f"{where}.groups[{gid!r}]", "a list of ranks", members)
    if "waits" in data:
        _keys(data["waits"], "otherData.pydist.waits", {"collectives", "events"})
        for name, n in data["waits"].items():
            _need(_is_int(n), f"otherData.pydist.waits.{name}", "an int >= 0", n)
    return {int(key) for key in data["ranks"]}


def _check_event(e, ranks):
    """One event as pydist writes it (PHASES), from one of `ranks` (None: any rank). Runs once per event:
    the words for what is wrong are put together only when something is."""
    if type(e) is not dict:
        _fail("it", "an object", e)
    ph = e.get("ph")
    if type(ph) is not str or ph not in PHASES:
        _fail("ph", f"one of {', '.join(PHASES)}", ph)
    if not (e.keys() >= PHASES[ph][0] and e.keys() <= ALLOWED[ph]):
        _keys(e, "it", *PHASES[ph])
    pid, tid, name = e["pid"], e["tid"], e["name"]
    if not (_is_int(pid, 0, MAX_RANK) and (ranks is None or pid in ranks)):
        _fail("pid", "a rank" + (" that otherData.pydist.ranks lists" if ranks is not None else ""), pid)
    if not _is_int(tid):
        _fail("tid", "a thread id (an int >= 0)", tid)
    if not _is_text(name):
        _fail("name", "text", name)
    args = e.get("args", {})
    if ph == "M":
        key = METADATA.get(name)
        if key is None:
            _fail("name", f"one of {', '.join(METADATA)}", name)
        _keys(args, "args", {key})
        if not (_is_text(args[key]) if key == "name" else _is_int(args[key], -MAX_INT)):
            _fail(f"args.{key}", "text" if key == "name" else "an int", args[key])
        return
    if not _is_time(e["ts"]):
        _fail("ts", f"a number of us from -{MAX_US:g} to {MAX_US:g}", e["ts"])
    if ph == "X" and not _is_time(e["dur"], 0):
        _fail("dur", f"a number of us from 0 to {MAX_US:g}", e["dur"])
    if ph != "X" and not _is_text(e["id"]):
        _fail("id", "text", e["id"])
    cat = e["cat"]
    if not _is_text(cat):
        _fail("cat", "text", cat)
    if type(args) is not dict:
        _fail("args", "an object", args)
    for value in args.values():   # the usual args (ints and ASCII text) quickly; anything else in full
        if type(value) is not int and not (type(value) is str and value.isascii()):
            _plain(args, "args")
            break
    typed = TYPED_ARGS.get(cat)
    if typed is not None:
        for key, (ok, rule) in typed.items():
            if key in args and not ok(args[key]):
                _fail(f"args.{key}", rule, args[key])
        if ranks is not None and "last_rank" in args and args["last_rank"] not in ranks:
            _fail("args.last_rank", "a rank that otherData.pydist.ranks lists", args["last_rank"])


def _describe(e):
    """An event in a few words, for a message: its ph and name when it has them."""
    if type(e) is not dict:
        return type(e).__name__
    return " ".join(repr(e[k])[:40] for k in ("ph", "name") if k in e) or "no ph or name"


def check(trace, source="trace"):
    """`trace` itself when it has the shape pydist writes (one rank's file or a merged one: the module's
    docstring), else ValueError naming `source` and the first thing wrong. Every field this module reads
    has its type and range (times finite and within MAX_US, durations >= 0, ranks among those
    otherData.pydist lists); free-form values (args, others' otherData) are plain JSON. A trace without
    otherData.pydist is read as pydist's events of ranks it does not list."""
    try:
        _keys(trace, "the trace", {"traceEvents"}, {"displayTimeUnit", "otherData"})
        _need(type(trace["traceEvents"]) is list, "traceEvents", "a list", trace["traceEvents"])
        unit = trace.get("displayTimeUnit", "ms")
        _need(unit in ("ms", "ns"), "displayTimeUnit", '"ms" or "ns"', unit)
        other = trace.get("otherData", {})
        _need(type(other) is dict, "otherData", "an object", other)
        ranks = None
        for key, value in other.items():
            if key == "pydist":
                ranks = _check_pydist(value)
            else:
                _plain(value, f"otherData[{key!r}]")
        for i, e in enumerate(trace["traceEvents"]):
            try:
                _check_event(e, ranks)
            except _Bad as bad:
                raise _Bad(f"event {i} ({_describe(e)}): {bad}") from None
    except _Bad as e:
        raise ValueError(f"{source}: {e}") from None
    return trace


# From here on a trace is one that check() passed: its fields are there, with their types.

def _pydist(trace):
    """otherData.pydist, or {} for a trace that is not one of ours."""
    return trace.get("otherData", {}).get("pydist", {})


def _ranks(trace):
    """Every rank a trace holds: those of otherData and those of its events."""
    ranks = {int(key) for key in _pydist(trace).get("ranks", {})}
    ranks.update(e["pid"] for e in trace["traceEvents"])
    return ranks


def _groups(trace):
    """{gid: set of world ranks} from every rank's otherData (the ranks agree: a gid hashes its members)."""
    return {int(gid): set(members) for info in _pydist(trace).get("ranks", {}).values()
            for gid, members in info.get("groups", {}).items()}


# ---------------------------------------------------------------------------------------------------
# Merging, and who waited for whom

def merge(paths, out_path=None):
    """Merge per-rank traces (or merged ones) into one, annotate every collective with each rank's wait
    for the last to arrive (annotate_waits), write it to `out_path` (unless None) and return it.

    ValueError when a file is not a pydist timeline of format VERSION (load()), or two hold the same rank.
    Merging a merged file again gives the same trace: its wait annotations are taken off and made afresh.

    >>> merged = merge(["run.rank0.json", "run.rank1.json"], "run.json")
    >>> [e["args"]["wait_us"] for e in merged["traceEvents"] if e.get("name") == "gradient sync"][:2]
    [20001.5, 0.0]
    """
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ValueError("merge(): no files to merge")
    events, ranks, others, owner = [], {}, {}, {}
    for path in paths:
        trace = load(path)
        data = _pydist(trace)
        if "version" not in data:   # (load() has checked that it is VERSION)
            raise ValueError(f"merge(): {path} is not a pydist timeline (no otherData.pydist.version)")
        for rank in _ranks(trace):
            if rank in owner:
                raise ValueError(f"merge(): rank {rank} is in both {owner[rank]} and {path}")
            owner[rank] = path
        events.extend(trace["traceEvents"])
        ranks.update(data.get("ranks", {}))
        for key, value in trace.get("otherData", {}).items():   # anyone else's otherData: the first wins
            if key != "pydist":
                others.setdefault(key, value)
    pydist = {"version": VERSION, "ranks": dict(sorted(ranks.items(), key=lambda kv: int(kv[0])))}
    merged = {"traceEvents": events, "displayTimeUnit": "ms",
              "otherData": {"pydist": pydist, **others}}
    annotate_waits(merged)
    merged["traceEvents"].sort(key=_event_order)
    if out_path is not None:
        write(merged, out_path)
    return merged


def _event_order(e):
    """Metadata first, then by rank, thread and start; at one start the longer first, so that a parent
    comes before its children (and a wait, as long as its collective, after it)."""
    if e["ph"] == "M":
        return (0, e["pid"], e["tid"], 0, 0, False)
    return (1, e["pid"], e["tid"], e["ts"], -e.get("dur", 0), e["cat"] == WAIT_CAT)


def _strip_waits(events):
    """`events` without a previous merge's annotations (in place for the spans' args)."""
    out = []
    for e in events:
        if e["ph"] == "X" and e["cat"] == WAIT_CAT and e["name"].startswith(WAIT_NAME):
            continue
        if _collective_key(e):   # (the only spans merge annotates: a user's own args are left alone)
            e["args"].pop("wait_us", None)
            e["args"].pop("last_rank", None)
        out.append(e)
    return out


def _collective_key(e):
    """(cat, group, seq) for a collective's span, None for anything else. A pydist call ("comm") numbers
    its group's collectives from 1 and gives point-to-point calls seq 0; the engine ("sync") numbers
    its exchanges from 0 (the step)."""
    if e.get("cat") not in ("comm", "sync"):
        return None
    args = e.get("args", {})
    group, seq = args.get("group"), args.get("seq")   # (ints >= 0 where there: check())
    if group is None or seq is None or (seq == 0 and e["cat"] == "comm"):
        return None
    return (e["cat"], group, seq)


def collectives(trace):
    """Every collective exchange the trace holds whole: {(cat, group, seq, n): {rank: its span}}.

    A rank's span is its "X" event, or for an async_op=True call its "b" event (it counts for who came
    last, but gets no annotation). n numbers repeats of one (cat, group, seq) on a rank (a second
    recording numbers from 1 again). An exchange is left out when a member of its group (otherData's
    groups) has no span for it, its events dropped or its file not merged: who came last is then
    unknown. A group the trace does not list needs two ranks.
    """
    groups = _groups(trace)
    seen = collections.Counter()
    found = collections.defaultdict(dict)
    candidates = [e for e in trace["traceEvents"] if e["ph"] in ("X", "b")]
    for e in sorted(candidates, key=lambda e: e["ts"]):
        key = _collective_key(e)
        if key is None:
            continue
        rank = e.get("pid")
        n = seen[rank, key]
        seen[rank, key] += 1
        found[(*key, n)][rank] = e
    whole = {}
    for key, by_rank in found.items():
        members = groups.get(key[1])
        if len(by_rank) >= 2 and (members is None or members <= by_rank.keys()):
            whole[key] = by_rank
    return whole


def _last_arrival(by_rank):
    # ties go to the higher rank (either way the other waits 0)
    return max(by_rank.items(), key=lambda kv: (kv[1]["ts"], kv[0]))


def annotate_waits(trace):
    """Note on every collective span (in place) how long its rank waited for the last one to arrive.

    Each rank's blocking span gets args "wait_us" (the last rank's start minus its own, at most its
    duration, to the nanosecond) and "last_rank"; the last rank gets wait_us 0. A wait of 1 us or more
    also gets its own span inside the collective's, cat "wait", named "waiting for rank K", so the
    trace viewers show it. Annotations already there are taken off first. Returns the number of
    collectives paired; otherData.pydist["waits"] records it and the wait events added.

    >>> annotate_waits(trace)   # ranks 0 and 2 waited for rank 1 at each step's gradient sync
    120
    """
    trace["traceEvents"] = _strip_waits(trace["traceEvents"])
    whole = collectives(trace)
    added = []
    for (cat, group, seq, _), by_rank in whole.items():
        last_rank, last = _last_arrival(by_rank)
        for rank, e in by_rank.items():
            if e["ph"] != "X":
                continue
            wait = 0.0 if rank == last_rank else round(max(0.0, min(last["ts"] - e["ts"], e["dur"])), 3)
            args = e.setdefault("args", {})
            args["wait_us"] = wait
            args["last_rank"] = last_rank
            if wait >= MIN_WAIT_US:
                added.append({"ph": "X", "pid": e["pid"], "tid": e.get("tid"), "ts": e["ts"], "dur": wait,
                              "cat": WAIT_CAT, "name": f"{WAIT_NAME}{last_rank}",
                              "args": {"group": group, "seq": seq}})
    trace["traceEvents"].extend(added)
    trace.setdefault("otherData", {}).setdefault("pydist", {})["waits"] = {"collectives": len(whole),
                                                                           "events": len(added)}
    return len(whole)


def is_annotated(trace):
    """Whether merge() (annotate_waits) has been through this trace."""
    return "waits" in _pydist(trace)


def _annotated(trace):
    """The trace with its wait annotations: itself when it has them, else an annotated copy (the copy
    shares every event but the collectives' spans, so the caller's trace is left as it was)."""
    if is_annotated(trace):
        return trace
    events = [dict(e, args=dict(e.get("args") or {})) if _collective_key(e) else e for e in trace["traceEvents"]]
    copy = {**trace, "traceEvents": events, "otherData": {**(trace.get("otherData") or {})}}
    copy["otherData"]["pydist"] = dict(_pydist(trace))
    annotate_waits(copy)
    return copy


# ---------------------------------------------------------------------------------------------------
# Where the time went

@dataclass
class Span:
    """A blocking ("X") event as the report sees it: its own time (its duration less its children's),
    how deep it lies, and the step it belongs to."""
    event: dict
    self_us: float
    depth: int          # ancestors that are not steps
    step: dict | None   # the "step" span it lies in (itself for a step)


def spans(trace):
    """Every well-formed "X" event of `trace` as a Span, thread by thread in start order.

    Spans on a thread nest; a span that overlaps its neighbour only partly (a user's own event may) is
    taken as a child for the part that overlaps.
    """
    threads = collections.defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            threads[e.get("pid"), e.get("tid")].append(e)
    out = []
    for events in threads.values():
        events.sort(key=lambda e: (e["ts"], -e["dur"], e.get("cat") == WAIT_CAT))
        stack = []   # [span, end, children's time]

        def close():
            span, _, children = stack.pop()
            span.self_us = max(0.0, span.event["dur"] - children)

        for e in events:
            end = e["ts"] + e["dur"]
            while stack and stack[-1][1] <= e["ts"] + SLACK_US:
                close()
            parent = stack[-1] if stack else None
            if parent is not None:
                parent[2] += min(end, parent[1]) - e["ts"]
            is_step = e.get("cat") == "step"
            depth = 0 if parent is None else parent[0].depth + (parent[0].event.get("cat") != "step")
            step = e if is_step else (parent[0].step if parent else None)
            span = Span(e, 0.0, depth, step)
            out.append(span)
            stack.append([span, end, 0.0])
        while stack:
            close()
    return out


def _extent(trace):
    """(first start, last end) of every timed event, in us; (0, 0) for none."""
    times = []
    for e in trace["traceEvents"]:
        if e["ph"] != "M":
            times.append(e["ts"])
            times.append(e["ts"] + e.get("dur", 0))
    return (min(times), max(times)) if times else (0.0, 0.0)


def time_use(trace):
    """{rank: {kind: seconds}} for the kinds compute, communication, waiting and other, summed over the
    rank's threads (so a rank with busy threads beside its main one may exceed the run's length).

    Each moment of a thread counts once, for its innermost span: a "slow" delay inside "forward" is
    compute once, and a step's own time (between its phases) is "other". Communication is comm, sync,
    torch and strategy spans, less the waiting in them; waiting is the sum of the collectives' wait_us
    (found now, the same way merge() does, if the trace has no annotations). Async spans are not
    counted: they overlap the thread's other work.

    >>> time_use(merged)[0]
    {'compute': 0.16, 'communication': 0.0115, 'waiting': 0.205, 'other': 0.0}
    """
    return _time_use(_annotated(check(trace)))


def _time_use(trace):
    use = collections.defaultdict(lambda: dict.fromkeys(KINDS, 0.0))
    for span in spans(trace):
        e = span.event
        kind = KIND.get(e["cat"], "other")
        # a wait event's time goes back to its collective, and the collective's wait_us to waiting: exact
        # also for the waits under MIN_WAIT_US, which have no event
        use[e["pid"]]["communication" if kind == "waiting" else kind] += span.self_us
        wait = e.get("args", {}).get("wait_us") if _collective_key(e) else None
        if wait is not None:
            use[e["pid"]]["waiting"] += wait
            use[e["pid"]]["communication"] -= wait
    return {rank: {kind: max(0.0, us) / 1e6 for kind, us in kinds.items()} for rank, kinds in sorted(use.items())}


# ---------------------------------------------------------------------------------------------------
# Stragglers

@dataclass
class Stragglers:
    """Which rank the others waited for.

    unit: "step" when the trace has training steps on several ranks (a step's slowest rank is the one
    whose compute inside it took longest, by its compute less the median of the others'), else
    "collective" (a collective's last rank to arrive, by its start less the first one's), or "" when
    there is nothing to compare.
    items: per step (step, slowest rank, by_ms); per collective ((cat, group, seq, name), last rank,
    late_ms); in time order.
    rank: the rank slowest most often (None without items); share: of the items it was slowest in;
    by_ms: the median of its margins there; clear: whether it is a straggler rather than chance (slowest
    in over half of the items, and in at least 1.5 times its fair share).
    compute_ms: per step {rank: compute ms} (empty per collective).
    """
    unit: str = ""
    items: list = field(default_factory=list)
    rank: int | None = None
    share: float = 0.0
    by_ms: float = 0.0
    clear: bool = False
    compute_ms: dict = field(default_factory=dict)


def _step_compute(all_spans):
    """{step number: {rank: compute us inside that step}} (a rank's repeats of a step add up)."""
    per_step = collections.defaultdict(lambda: collections.defaultdict(float))
    for span in all_spans:
        e = span.event
        if e["cat"] == "step" and "step" in e.get("args", {}):   # (an int: check())
            per_step[e["args"]["step"]][e["pid"]] += 0.0   # a step with no compute counts as 0
        elif e["cat"] == "compute" and span.step is not None and "step" in span.step.get("args", {}):
            per_step[span.step["args"]["step"]][e["pid"]] += span.self_us
    return per_step


def stragglers(trace):
    """Which rank was slowest, step by step (or collective by collective without steps).

    >>> s = stragglers(merged)
    >>> s.unit, s.rank, round(s.share, 2), round(s.by_ms, 1), s.items[0]
    ('step', 1, 1.0, 19.8, (1, 1, 19.75))
    """
    return _stragglers(check(trace))


def _stragglers(trace):
    per_step = _step_compute(spans(trace))
    shared = {n: ranks for n, ranks in per_step.items() if len(ranks) >= 2}
    out = Stragglers()
    if shared and any(us > 0 for ranks in shared.values() for us in ranks.values()):
        out.unit = "step"
        for number in sorted(shared):
            ranks = shared[number]
            slowest = max(ranks, key=lambda r: (ranks[r], r))
            others = [us for r, us in ranks.items() if r != slowest]
            out.items.append((number, slowest, round((ranks[slowest] - float(np.median(others))) / 1000, 3)))
            out.compute_ms[number] = {r: us / 1000 for r, us in sorted(ranks.items())}
    else:
        whole = collectives(trace)
        if whole:
            out.unit = "collective"
        order = sorted(whole.items(), key=lambda kv: min(e["ts"] for e in kv[1].values()))
        for (cat, group, seq, _), by_rank in order:
            last_rank, last = _last_arrival(by_rank)
            first = min(e["ts"] for e in by_rank.values())
            late_ms = round((last["ts"] - first) / 1000, 3)
            out.items.append(((cat, group, seq, last.get("name", "")), last_rank, late_ms))
    if not out.items:
        return out
    counts = collections.Counter(rank for _, rank, _ in out.items)
    margins = collections.defaultdict(list)
    for _, rank, by in out.items:
        margins[rank].append(by)
    out.rank = max(counts, key=lambda r: (counts[r], float(np.median(margins[r]))))
    out.share = counts[out.rank] / len(out.items)
    out.by_ms = float(np.median(margins[out.rank]))
    if out.unit == "step":
        ranks = {r for per_rank in out.compute_ms.values() for r in per_rank}
    else:
        ranks = {r for by_rank in whole.values() for r in by_rank}
    out.clear = out.share > 0.5 and out.share >= 1.5 / max(2, len(ranks))
    return out


# ---------------------------------------------------------------------------------------------------
# The summary

def summary(trace, worst=10):
    """A short report: per rank its seconds (and share of the run) in compute, communication, waiting and
    other; the `worst` steps (or collectives) where one rank held the others up most; and a last line
    naming the straggler.

    >>> print(summary(merged))
    ...
    straggler: rank 1, slowest in 100% of 10 steps, by 19.8 ms per step (median)
    """
    trace = _annotated(check(trace))
    first, last = _extent(trace)
    run_s = (last - first) / 1e6
    use = _time_use(trace)
    info = _pydist(trace).get("ranks", {})
    hosts = _process_names(trace)
    threads = {(e.get("pid"), e.get("tid")) for e in trace["traceEvents"] if e.get("ph") in ("X", "b")}
    paired = _pydist(trace).get("waits", {}).get("collectives", 0)
    lines = [f"timeline: {len(use)} rank(s), {len(threads)} thread(s), {run_s:.3f} s "
             f"({first / 1000:.1f} to {last / 1000:.1f} ms), {paired} collective(s) paired"]
    lines.append(f"{'rank':>4}  {'host':<12}" + "".join(f"{kind:>18}" for kind in KINDS))
    for rank, kinds in use.items():
        host = (info.get(str(rank)) or {}).get("host") or hosts.get(rank, "")
        cells = "".join(f"{s:>10.3f} s {100 * s / run_s if run_s > 0 else 0:>4.0f}%" for s in kinds.values())
        lines.append(f"{rank:>4}  {host[:12]:<12}{cells}")
    for rank, data in info.items():
        if data["dropped"]:
            lines.append(f"rank {rank} dropped {data['dropped']} events past max_events: its timeline ends early")
    lines.extend(_straggler_lines(_stragglers(trace), worst))
    return "\n".join(lines)


def _process_names(trace):
    return {e.get("pid"): (e.get("args") or {}).get("name", "") for e in trace["traceEvents"]
            if e.get("ph") == "M" and e.get("name") == "process_name"}


def _straggler_lines(found, worst):
    if not found.items:
        return ["straggler: none found (no step or collective on several ranks)"]
    n, unit = len(found.items), found.unit
    worst_items = sorted(found.items, key=lambda item: -item[2])[:worst]
    if unit == "step":
        lines = [f"steps on several ranks: {n}; the {len(worst_items)} where the slowest rank was furthest behind:",
                 f"{'step':>8}  {'slowest':>7}  {'by ms':>8}  {'its compute ms':>14}  {'median of the others':>20}"]
        for step, rank, by in worst_items:
            ranks = found.compute_ms[step]
            others = float(np.median([ms for r, ms in ranks.items() if r != rank]))
            lines.append(f"{step:>8}  {rank:>7}  {by:>8.2f}  {ranks[rank]:>14.2f}  {others:>20.2f}")
        what = f"slowest in {found.share:.0%} of {n} steps, by {found.by_ms:.1f} ms per step (median)"
    else:
        lines = [f"no steps; collectives on several ranks: {n}; the {len(worst_items)} whose last rank came latest:",
                 f"{'collective':<28}  {'group':>15}  {'seq':>6}  {'last':>4}  {'late ms':>8}"]
        for (cat, group, seq, name), rank, late in worst_items:
            lines.append(f"{(cat + ' ' + name)[:28]:<28}  {group:>15}  {seq:>6}  {rank:>4}  {late:>8.2f}")
        what = (f"last to arrive in {found.share:.0%} of {n} collectives, by {found.by_ms:.1f} ms per "
                f"collective (median)")
    if found.clear:
        lines.append(f"straggler: rank {found.rank}, {what}")
    else:
        lines.append(f"straggler: none clear (rank {found.rank} {what})")
    return lines


# ---------------------------------------------------------------------------------------------------
# The picture

COLOURS = {"compute": "#4C72B0", "comm": "#DD8452", "sync": "#55A868", "strategy": "#8172B3",
           "torch": "#937860", "other": "#8C8C8C", WAIT_CAT: "#C44E52"}
MAX_BARS = 3000          # past this many spans, draw a window of the run (bars under a pixel tell nothing)
ROW_PX, MARGIN_PX = 140, 200   # a row: its step label (STEP_PT) above the bars (0.6 of it)
LEGEND_LINE_PX = 48             # a line of the legend (LABEL_PT), when its entries need more than one
WIDTH_PX, LEFT_PX, RIGHT_PX = 1600, 230, 50   # the picture, the room for the rows' labels and for half the last tick label
# Text sizes (points at 100 dpi) for a 1600 px picture that a page shows at its column's width
# (figures.COLUMN_PX, 736 px): 0.64 px there per point, so an 18 pt name reads as an 11.5 px one
NAME_PT, STEP_PT, LABEL_PT, TITLE_PT = 18, 18, 20, 24
CHAR_PX = 0.6 * NAME_PT * 100 / 72   # the mean width of a name's character, for "does it fit in its bar"


def _window(all_spans, first, last, max_seconds):
    """(start us, end us, what it shows or None for the whole run) of the part of the run to draw."""
    if max_seconds is not None:
        if first + max_seconds * 1e6 < last:
            return first, first + max_seconds * 1e6, f"the first {max_seconds:g} s"
        return first, last, None
    steps = collections.defaultdict(list)
    for span in all_spans:
        e = span.event
        if e["cat"] == "step" and "step" in e.get("args", {}):
            steps[e["args"]["step"]].append(e)
    numbers = sorted(steps)
    if len(numbers) > 8:
        # the 3rd to the 8th step: past the first steps' warm-up, and few enough to read
        a, b = numbers[2], numbers[7]
        return (min(e["ts"] for e in steps[a]), max(e["ts"] + e["dur"] for e in steps[b]),
                f"steps {a}-{b} of {len(numbers)}")
    if len(all_spans) > MAX_BARS:
        starts = sorted(span.event["ts"] for span in all_spans)
        return first, starts[MAX_BARS], f"the first {MAX_BARS} spans"
    return first, last, None


def _legend(fig, ax, handles):
    """The legend above the axes, in as many columns as fit the picture's width; returns its lines."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not handles:
        return 0
    renderer = FigureCanvasAgg(fig).get_renderer()
    for ncol in range(len(handles), 0, -1):
        legend = ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.01), ncol=ncol, frameon=False,
                           fontsize=LABEL_PT)
        if legend.get_window_extent(renderer).width <= WIDTH_PX - LEFT_PX - RIGHT_PX:
            break
    return -(-len(handles) // ncol)


def _rows(trace):
    """[(pid, tid, label)] of every thread with spans, rank by rank, its main thread first."""
    names, order = {}, {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[e.get("pid"), e.get("tid")] = (e.get("args") or {}).get("name", "")
        elif e.get("ph") == "M" and e.get("name") == "thread_sort_index":
            order[e.get("pid"), e.get("tid")] = (e.get("args") or {}).get("sort_index", 0)
    threads = {(e.get("pid"), e.get("tid")) for e in trace["traceEvents"] if e.get("ph") in ("X", "b")}
    rows = []
    for pid, tid in sorted(threads, key=lambda t: (t[0], order.get(t, 0), t[1])):
        name = names.get((pid, tid), f"thread {tid}")
        rows.append((pid, tid, f"rank {pid}" if name == "main" else f"rank {pid} {name}"))
    return rows


def draw_png(trace, out_png, max_seconds=None):
    """Draw the trace as a Gantt chart into `out_png`: a row per rank and thread, a bar per span coloured
    by its category (a child over its parent, a little thinner), waits red and hatched, steps as
    outlines behind their phases, async calls as a strip under their row; time in ms.

    A long run is drawn in part (said in the title): its first `max_seconds`, or by default the 3rd to
    8th step when there are more than 8, or the first MAX_BARS spans. 1600 x (200 + 140 per row) px.
    Returns {"rows": [labels], "window_ms": (start, end), "bars": spans drawn, "shows": what part}.
    ImportError without matplotlib.

    >>> draw_png(merged, "run.png")["shows"]
    'steps 3-8 of 120'
    """
    if max_seconds is not None and not (_is_time(max_seconds) and max_seconds > 0):
        raise ValueError(f"draw_png(): `max_seconds` must be a number > 0; got {max_seconds!r}")
    from matplotlib.figure import Figure   # no pyplot: no global state, no GUI backend
    from matplotlib.patches import Patch, Rectangle

    trace = _annotated(check(trace))
    all_spans = spans(trace)
    first, last = _extent(trace)
    start, end, shows = _window(all_spans, first, last, max_seconds)
    rows = _rows(trace)
    row_of = {(pid, tid): i for i, (pid, tid, _) in enumerate(rows)}

    height_px = MARGIN_PX + ROW_PX * max(1, len(rows))
    fig = Figure(figsize=(WIDTH_PX / 100, height_px / 100), dpi=100)
    # fixed margins in pixels, so that the title, legend and labels fit however many rows there are
    fig.subplots_adjust(left=LEFT_PX / WIDTH_PX, right=1 - RIGHT_PX / WIDTH_PX, top=1 - 110 / height_px,
                        bottom=80 / height_px)
    ax = fig.add_subplot()

    bars = collections.defaultdict(list)   # (category, row, depth) -> [(x, width)], drawn together
    steps_drawn, names, used = [], [], set()
    px_per_us = (WIDTH_PX - LEFT_PX - RIGHT_PX) / max(end - start, 1e-9)
    for span in all_spans:
        e = span.event
        x0, x1 = max(e["ts"], start), min(e["ts"] + e["dur"], end)
        if x1 <= x0:
            continue
        row = row_of[e.get("pid"), e.get("tid")]
        if e.get("cat") == "step":
            steps_drawn.append((row, x0, x1, (e.get("args") or {}).get("step") if e["ts"] >= start else None))
            continue
        cat = e.get("cat") if e.get("cat") in COLOURS else "other"
        bars[cat, row, span.depth].append((x0 / 1000, (x1 - x0) / 1000))
        used.add(cat)
        # the name, where it fits and no child covers most of the bar (and its own name)
        fits = (x1 - x0) * px_per_us > CHAR_PX * len(e.get("name", "")) + 10 and span.self_us >= 0.5 * e["dur"]
        if cat != WAIT_CAT and fits:
            names.append(((x0 + x1) / 2000, row, span.depth, e.get("name", "")))
    n_bars = sum(len(xs) for xs in bars.values())
    for row, x0, x1, number in steps_drawn:
        ax.add_patch(Rectangle((x0 / 1000, row - 0.46), (x1 - x0) / 1000, 0.92, fill=False, edgecolor="#333333",
                               linewidth=0.8, zorder=1))
        label = f" step {number}"
        fits = (x1 - x0) * px_per_us > CHAR_PX * STEP_PT / NAME_PT * len(label)   # not cut by the window's end
        if len(steps_drawn) <= 12 * len(rows) and number is not None and fits:   # in the outline, above the phases
            ax.text(x0 / 1000, row - 0.44, label, fontsize=STEP_PT, va="top", ha="left", clip_on=True)
    for (cat, row, depth), xs in sorted(bars.items(), key=lambda kv: kv[0][2]):   # children over parents
        h = max(0.2, 0.6 - 0.12 * depth)
        wait = cat == WAIT_CAT
        # neighbours of one category (batch, forward, backward) show apart by a thin white edge, a child by a
        # dark one (a delay inside forward), unless the bars are too many for edges to leave any colour
        edge = "#800000" if wait else ("#222222" if depth else "white")
        width = 0.5 if wait or depth or n_bars < 1500 else 0
        ax.broken_barh(xs, (row - h / 2, h), facecolors=COLOURS[cat], edgecolor=edge, hatch="////" if wait else None,
                       linewidth=width, zorder=2 + depth)
    if len(names) <= 400:
        for x, row, depth, name in names:
            ax.text(x, row, name, fontsize=NAME_PT, color="white", ha="center", va="center", clip_on=True,
                    zorder=3 + depth, parse_math=False)   # a name is text, never TeX ("$" is no formula)
    pairs = [p for p in _async_spans(trace) if (p[0], p[1]) in row_of and min(p[4], end) > max(p[3], start)]
    for pid, tid, cat, t0, t1 in pairs:   # a thin strip at the bottom of the row: they overlap anything
        x0, x1 = max(t0, start), min(t1, end)
        ax.broken_barh([(x0 / 1000, (x1 - x0) / 1000)], (row_of[pid, tid] + 0.36, 0.08),
                       facecolors=COLOURS.get(cat, COLOURS["other"]), alpha=0.7, zorder=20)

    ax.set_xlim(start / 1000, end / 1000 if end > start else start / 1000 + 1)
    ax.set_ylim(len(rows) - 0.5, -0.5)   # rank 0 at the top
    ax.set_yticks(range(len(rows)), [label for _, _, label in rows], parse_math=False)
    ax.set_xlabel("time (ms)", fontsize=LABEL_PT)
    ax.tick_params(labelsize=LABEL_PT)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    handles = [Patch(facecolor=COLOURS[c], label=c) for c in COLOURS if c in used and c != WAIT_CAT]
    if WAIT_CAT in used:
        handles.append(Patch(facecolor=COLOURS[WAIT_CAT], edgecolor="#800000", hatch="////", label="waiting"))
    if steps_drawn:
        handles.append(Patch(fill=False, edgecolor="#333333", label="step"))
    if pairs:
        handles.append(Patch(facecolor=COLOURS["comm"], alpha=0.7, label="async call (strip under the row)"))
    legend_lines = _legend(fig, ax, handles)
    if legend_lines > 1:   # the picture grows by the legend's extra lines, above the rows
        height_px += LEGEND_LINE_PX * (legend_lines - 1)
        fig.set_size_inches(WIDTH_PX / 100, height_px / 100)
        fig.subplots_adjust(top=1 - (110 + LEGEND_LINE_PX * (legend_lines - 1)) / height_px, bottom=80 / height_px)
    ranks = len({pid for pid, _, _ in rows})
    title = f"pydist timeline: {ranks} rank(s), {(last - first) / 1e6:.3f} s"
    if shows:
        title += f"; showing {shows} ({start / 1000:.1f}-{end / 1000:.1f} ms)"
    fig.suptitle(title, x=0.5, y=1 - 15 / height_px, va="top", fontsize=TITLE_PT)
    figures.save(fig, os.fspath(out_png), dpi=100)
    return {"rows": [label for _, _, label in rows], "window_ms": (start / 1000, end / 1000),
            "bars": n_bars + len(steps_drawn),
            "shows": shows}


def _async_spans(trace):
    """[(pid, tid, cat, start us, end us)] of the async calls, each "b" with its "e" (same cat and id)."""
    begun, out = {}, []
    for e in trace["traceEvents"]:
        if e["ph"] not in ("b", "e"):
            continue
        key = (e.get("cat"), e.get("id"))
        if e["ph"] == "b":
            begun[key] = e
        elif key in begun:
            b = begun.pop(key)
            out.append((b.get("pid"), b.get("tid"), b.get("cat"), b["ts"], e["ts"]))
    return out


# ---------------------------------------------------------------------------------------------------
# The command line

def _prog():
    # python -m pydist.timeline passes its arguments on to main(): name the command the user typed
    name = os.path.splitext(os.path.basename(sys.argv[0] or ""))[0]
    return f"python -m pydist.{name}" if name in ("timeline", "trace_report") else "python -m pydist.trace_report"


def _error_line(e):
    """An exception as the one line the command line prints: the file and what is wrong with it."""
    if isinstance(e, ImportError):
        return "the PNG needs matplotlib (pip install matplotlib)"
    if isinstance(e, OSError) and e.filename is not None:
        text = f"{os.fsdecode(e.filename) if isinstance(e.filename, (str, bytes)) else e.filename}: {e.strerror or e}"
    else:
        text = str(e)
    return text.replace("\n", "\\n")


def _seconds(text):
    """--max-seconds: a finite number of seconds > 0."""
    value = float(text)
    if not 0 < value < math.inf:
        raise ValueError(text)
    return value


def _draw(trace, out_png, max_seconds):
    shown = draw_png(trace, out_png, max_seconds)
    print(f"wrote {out_png}" + (f" (showing {shown['shows']})" if shown["shows"] else ""))


def main(argv=None):
    """merge PARTS... -o OUT | summary FILE [--png OUT.png] | png FILE OUT.png; returns the exit status:
    0, or 2 with one line `<prog>: error: <file>: <what is wrong>` when a file cannot be read or written
    or is not a pydist trace (argparse's usage errors exit 2 as well)."""
    prog = _prog()
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    commands = ap.add_subparsers(dest="command", required=True)
    cmd = commands.add_parser("merge", help="merge the ranks' files into one trace, with who waited for whom")
    cmd.add_argument("parts", nargs="+", help="the ranks' files (run.rank0.json ...), or merged ones")
    cmd.add_argument("-o", "--output", required=True, help="the merged trace to write")
    cmd = commands.add_parser("summary", help="where each rank's time went, and the straggler")
    cmd.add_argument("trace", help="a merged trace (or one rank's)")
    cmd.add_argument("--png", default=None, help="also draw the timeline into this PNG")
    cmd.add_argument("--max-seconds", type=_seconds, default=None, help="draw only the run's first S seconds")
    cmd = commands.add_parser("png", help="draw the timeline as a Gantt chart")
    cmd.add_argument("trace")
    cmd.add_argument("png")
    cmd.add_argument("--max-seconds", type=_seconds, default=None, help="draw only the run's first S seconds")
    args = ap.parse_args(argv)

    try:
        if args.command == "merge":
            merged = merge(args.parts, args.output)
            waits = _pydist(merged)["waits"]
            print(f"merged {len(args.parts)} file(s), ranks {sorted(_ranks(merged))}, into {args.output}: "
                  f"{len(merged['traceEvents'])} events, {waits['collectives']} collective(s) paired")
            return 0
        trace = load(args.trace)
        if args.command == "summary":
            print(summary(trace))
        if args.png is not None:   # summary's --png, or png's own
            _draw(trace, args.png, args.max_seconds)
    except (OSError, ValueError, ImportError) as e:
        print(f"{prog}: error: {_error_line(e)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
