"""The Trace Event Format's rules, as a checker for the tests (not part of pydist): every timeline pydist
writes, one rank's or merged, must pass it, so that chrome://tracing and Perfetto read it as we meant.

    >>> from trace_format import validate
    >>> validate({"traceEvents": [{"ph": "X", "pid": 0, "tid": 1, "name": "a", "ts": 0, "dur": -1}]})
    ['event 0 (X a): dur must be a finite number >= 0; got -1']

The rules are those of Google's "Trace Event Format" document, as the viewers apply them, plus one of
ours: "X" spans on one thread nest (a child lies inside its parent), to 1 ns.
"""
import json
import math
import os

# Every phase the format defines (duration, complete, instant, counter, async, flow, sample, object,
# metadata, memory dump, mark, clock sync, context)
PHASES = set("BEXiIbneSTpstfPCNODMVvRc()")
METADATA_ARGS = {"process_name": ("name", str), "thread_name": ("name", str),
                 "process_sort_index": ("sort_index", int), "thread_sort_index": ("sort_index", int)}
NEEDS_TID = set("BEXbne")   # process-wide metadata and global instants may leave tid out
SLACK_US = 0.001            # 1 ns: the ranks write times to the nanosecond
MAX_PROBLEMS = 200          # a broken trace is usually broken the same way many times


def validate(trace):
    """The problems of `trace` (a dict as json.load gives it, or the path of a file), in words; [] when
    it follows the rules."""
    problems = []
    if isinstance(trace, (str, bytes, os.PathLike)):
        try:
            with open(trace, "rb") as f:
                trace = json.loads(f.read(), parse_constant=_not_json)
        except (OSError, ValueError) as e:
            return [f"the file does not load with the standard json module: {e}"]
    else:
        try:   # what the dict would be as a file, read back strictly
            json.loads(json.dumps(trace, allow_nan=False))
        except (TypeError, ValueError) as e:
            problems.append(f"the trace is not standard JSON: {e}")
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace   # the object or the array form
    if not isinstance(events, list):
        return problems + ["traceEvents is not a list"]

    def problem(i, e, text):
        if len(problems) < MAX_PROBLEMS:
            what = f"{e.get('ph')} {e.get('name')}" if isinstance(e, dict) else type(e).__name__
            problems.append(f"event {i} ({what}): {text}")

    good = []
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            problem(i, e, "not an object")
            continue
        ph = e.get("ph")
        if ph not in PHASES:
            problem(i, e, f"ph must be one of the format's phases; got {ph!r}")
            continue
        ok = True
        if "pid" not in e:
            problem(i, e, "no pid")
            ok = False
        if "tid" not in e and (ph in NEEDS_TID or (ph == "M" and str(e.get("name")).startswith("thread_"))):
            problem(i, e, "no tid")
            ok = False
        if not isinstance(e.get("name"), str) and ph != "E":   # an "E" may leave its name out
            problem(i, e, f"name must be a string; got {e.get('name')!r}")
            ok = False
        if ph != "M" and not _finite(e.get("ts")):
            problem(i, e, f"ts must be a finite number; got {e.get('ts')!r}")
            ok = False
        if ph == "X" and not (_finite(e.get("dur")) and e["dur"] >= 0):
            problem(i, e, f"dur must be a finite number >= 0; got {e.get('dur')!r}")
            ok = False
        if ph in "bne" and "id" not in e:
            problem(i, e, "an async event needs an id")
            ok = False
        if ph == "M":
            ok = _check_metadata(i, e, problem) and ok
        if "args" in e and not isinstance(e["args"], dict):
            problem(i, e, "args must be an object")
        if ok:
            good.append((i, e))
    _check_durations(good, problem)
    _check_async(good, problem)
    _check_nesting(good, problem)
    if len(problems) >= MAX_PROBLEMS:
        problems.append(f"... stopped at {MAX_PROBLEMS} problems")
    return problems


def _not_json(name):
    raise ValueError(f"{name} is not a JSON number")


def _finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_metadata(i, e, problem):
    rule = METADATA_ARGS.get(e.get("name"))
    if rule is None:
        problem(i, e, f"metadata must be one of {sorted(METADATA_ARGS)}")
        return False
    key, kind = rule
    value = e.get("args", {}).get(key) if isinstance(e.get("args"), dict) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        problem(i, e, f"args.{key} must be a {kind.__name__}; got {value!r}")
        return False
    return True


def _by_time(pairs):
    # the viewers order events by ts; at one ts, the order of the file
    return sorted(pairs, key=lambda pair: pair[1]["ts"])


def _check_durations(good, problem):
    """"B"/"E" pairs per thread, in stack order, an "E" closing the newest open "B" of the same name."""
    stacks = {}
    for i, e in _by_time([p for p in good if p[1]["ph"] in "BE"]):
        stack = stacks.setdefault((e["pid"], e["tid"]), [])
        if e["ph"] == "B":
            stack.append((i, e))
        elif not stack:
            problem(i, e, "an E with no open B on its thread")
        else:
            j, b = stack.pop()
            if "name" in e and e["name"] != b["name"]:
                problem(i, e, f"this E closes event {j}, a B named {b['name']!r}")
    for stack in stacks.values():
        for j, b in stack:
            problem(j, b, "a B never closed by an E")


def _check_async(good, problem):
    """"b"/"e" pairs per (cat, id): each "e" ends an open "b", and every "b" ends."""
    open_ = {}
    for i, e in _by_time([p for p in good if p[1]["ph"] in "be"]):
        stack = open_.setdefault((e.get("cat"), e["id"]), [])
        if e["ph"] == "b":
            stack.append((i, e))
        elif not stack:
            problem(i, e, f"an async e with no open b of cat {e.get('cat')!r}, id {e['id']!r}")
        else:
            stack.pop()
    for stack in open_.values():
        for j, b in stack:
            problem(j, b, "an async b never ended by an e")


def _check_nesting(good, problem):
    """"X" spans on one thread nest: each lies wholly inside any span it starts in."""
    threads = {}
    for i, e in good:
        if e["ph"] == "X":
            threads.setdefault((e["pid"], e["tid"]), []).append((i, e))
    for spans in threads.values():
        spans.sort(key=lambda pair: (pair[1]["ts"], -pair[1]["dur"]))
        stack = []   # (index, event, end)
        for i, e in spans:
            end = e["ts"] + e["dur"]
            while stack and stack[-1][2] <= e["ts"] + SLACK_US:
                stack.pop()
            if stack and end > stack[-1][2] + SLACK_US:
                j, parent, parent_end = stack[-1]
                problem(i, e, f"overlaps event {j} ({parent.get('name')}, {parent['ts']}-{parent_end}) "
                              f"partly: {e['ts']}-{end} on pid {e['pid']} tid {e['tid']}")
                continue
            stack.append((i, e, end))
