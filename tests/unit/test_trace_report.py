"""pydist/trace_report.py on traces built here, whose answers are known exactly (issue 28): three ranks,
ten training steps, rank 1 with a 20 ms "slow" delay inside each step's forward. merge() pairs each
collective across the ranks and notes that ranks 0 and 2 waited for rank 1; summary() and stragglers()
name rank 1; draw_png() draws it; the command line says what is wrong with a bad file; and the format
checker the timeline tests rely on (trace_format.validate) catches broken traces.

The synthetic run, in ms (S = a step's start; every rank starts each step at the same time):

    rank 0:  batch 2 | forward 5   | backward 8 | gradient sync (waits 20)   | update 1
    rank 1:  batch 2 | forward 25 (slow 20 inside) | backward 8 | sync 1    | update 1
    rank 2:  batch 2 | forward 5.5 | backward 8 | gradient sync (waits 19.5) | update 1
             S       S+2                    S+15 (S+15.5, S+35)          S+36        S+37

Before the steps a broadcast that rank 2 joins 3 ms late, an async all_reduce, and a send/recv; after
them a barrier that rank 0 joins first and rank 2 last; rank 2 also has a "server" thread.
"""
import json
import os
import subprocess
import sys

import pytest

from pydist import _figures as figures, _files, trace_report
from trace_format import validate
from unit_helpers import subprocess_env

RANKS, STEPS = 3, 10
WORLD = 0xABCDEF       # the world group's id in the trace (otherData lists its members)
ENGINE = 7             # the engine's group: not in otherData, so any two ranks pair
STEP0, STEP_US = 10_000.0, 38_000.0
FORWARD_US = {0: 5000.0, 1: 25000.0, 2: 5500.0, 3: 5000.0}   # (rank 3: a file that is not merged)
COMPUTE_MS = {r: 2 + FORWARD_US[r] / 1000 + 8 + 1 for r in range(RANKS)}   # per step: 16, 36, 16.5
BY_MS = COMPUTE_MS[1] - (COMPUTE_MS[0] + COMPUTE_MS[2]) / 2                # 19.75
SYNC_END = 36_000.0    # from the step's start
BARRIER_AT = STEP0 + STEPS * STEP_US + 1000


def step_start(k):
    return STEP0 + (k - 1) * STEP_US


def span(rank, tid, ts, dur, cat, name, **args):
    return {"ph": "X", "pid": rank, "tid": tid, "ts": ts, "dur": dur, "cat": cat, "name": name, "args": args}


def comm(rank, name, ts, end, seq, peer=-1, tid=None):
    return span(rank, 100 + rank if tid is None else tid, ts, end - ts, "comm", name, group=WORLD, seq=seq,
                 bytes=400, path="small shm", peer=peer)


def rank_trace(rank):
    """Rank `rank`'s file as csrc/observe/timeline.c writes it."""
    main = 100 + rank
    events = [{"ph": "M", "pid": rank, "tid": 0, "name": "process_name", "args": {"name": f"rank {rank} (vm)"}},
              {"ph": "M", "pid": rank, "tid": 0, "name": "process_sort_index", "args": {"sort_index": rank}},
              {"ph": "M", "pid": rank, "tid": main, "name": "thread_name", "args": {"name": "main"}},
              {"ph": "M", "pid": rank, "tid": main, "name": "thread_sort_index", "args": {"sort_index": 0}}]
    events.append(comm(rank, "broadcast", 3000.0 if rank == 2 else 0.0, 3500.0, seq=1))
    async_id = f"0x{rank}00000000"
    events += [{"ph": "b", "id": async_id, "pid": rank, "tid": main, "ts": 4000.0 + 100 * rank, "cat": "comm",
                "name": "all_reduce", "args": {"group": WORLD, "seq": 2, "bytes": 4096, "path": "shm", "peer": -1}},
               {"ph": "e", "id": async_id, "pid": rank, "tid": main, "ts": 5000.0, "cat": "comm",
                "name": "all_reduce", "args": {}}]
    if rank == 0:
        events.append(comm(0, "send", 6000.0, 6500.0, seq=0, peer=1))
    if rank == 1:
        events.append(comm(1, "recv", 5800.0, 6600.0, seq=0, peer=0))
    for k in range(1, STEPS + 1):
        s = step_start(k)
        forward_end = s + 2000 + FORWARD_US[rank]
        computed = forward_end + 8000
        events += [span(rank, main, s, 37_000.0, "step", "step", step=k),
                   span(rank, main, s, 2000.0, "compute", "batch"),
                   span(rank, main, s + 2000, FORWARD_US[rank], "compute", "forward", batch=64),
                   span(rank, main, forward_end, 8000.0, "compute", "backward"),
                   span(rank, main, computed, s + SYNC_END - computed, "sync", "gradient sync", group=ENGINE,
                        seq=k - 1, bytes=4096),   # the engine numbers its exchanges from 0
                   span(rank, main, s + SYNC_END, 1000.0, "compute", "update")]
        if rank == 1:   # the straggler's injected delay, nested in its forward
            events.append(span(rank, main, forward_end - 20_000, 20_000.0, "compute", "slow"))
    events.append(comm(rank, "barrier", BARRIER_AT + 1000 * rank, BARRIER_AT + 2500, seq=3))
    if rank == 2:
        events += [{"ph": "M", "pid": 2, "tid": 999, "name": "thread_name", "args": {"name": "server"}},
                   {"ph": "M", "pid": 2, "tid": 999, "name": "thread_sort_index", "args": {"sort_index": 1}}]
        events += [span(2, 999, 50_000.0 + i * STEP_US, 3000.0, "strategy", "serve", worker=0, staleness=1)
                   for i in range(3)]
    info = {"events": len(events), "dropped": 0, "host": "vm", "pid": 4000 + rank, "groups": {str(WORLD): [0, 1, 2]}}
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"pydist": {"version": 1, "ranks": {str(rank): info}}}}


@pytest.fixture
def parts(tmp_path):
    paths = []
    for rank in range(RANKS):
        path = tmp_path / f"run.rank{rank}.json"
        path.write_text(json.dumps(rank_trace(rank)))
        paths.append(path)
    return paths


@pytest.fixture
def merged(parts, tmp_path):
    return trace_report.merge(parts, tmp_path / "run.json")


def find(trace, pid=None, cat=None, name=None, ph="X"):
    return [e for e in trace["traceEvents"] if e["ph"] == ph and (pid is None or e["pid"] == pid)
            and (cat is None or e.get("cat") == cat) and (name is None or e["name"] == name)]


def unannotated(parts):
    """The ranks' events in one trace, as merge() would make it but without the waits."""
    traces = [json.loads(p.read_text()) for p in parts]
    ranks = {k: v for t in traces for k, v in t["otherData"]["pydist"]["ranks"].items()}
    return {"traceEvents": [e for t in traces for e in t["traceEvents"]],
            "otherData": {"pydist": {"version": 1, "ranks": ranks}}}


# ---------------------------------------------------------------------------------------------------
# merge

def test_the_parts_follow_the_format(parts):
    for path in parts:
        assert validate(path) == []


def test_merge_notes_who_waited_for_whom(merged, tmp_path):
    assert sorted(merged["otherData"]["pydist"]["ranks"]) == ["0", "1", "2"]
    assert merged["otherData"]["pydist"]["waits"] == {"collectives": 13, "events": 24}
    syncs = {r: find(merged, r, name="gradient sync") for r in range(RANKS)}
    assert [len(s) for s in syncs.values()] == [STEPS] * RANKS
    assert {e["args"]["wait_us"] for e in syncs[0]} == {20000.0}
    assert {e["args"]["wait_us"] for e in syncs[2]} == {19500.0}
    assert {e["args"]["wait_us"] for e in syncs[1]} == {0.0}
    assert {e["args"]["last_rank"] for r in range(RANKS) for e in syncs[r]} == {1}
    # the broadcast and the barrier waited for rank 2; the point-to-point calls and async pairs are not collectives
    assert [(e["args"]["wait_us"], e["args"]["last_rank"]) for e in find(merged, name="broadcast")] == \
        [(3000.0, 2), (3000.0, 2), (0.0, 2)]
    assert [e["args"]["wait_us"] for e in find(merged, name="barrier")] == [2000.0, 1000.0, 0.0]
    for e in find(merged, name="send") + find(merged, name="recv") + find(merged, ph="b") + find(merged, ph="e"):
        assert "wait_us" not in e["args"] and "last_rank" not in e["args"], e


def test_each_wait_is_a_span_inside_its_collective(merged):
    waits = find(merged, cat="wait")
    assert [len(find(merged, r, cat="wait")) for r in range(RANKS)] == [12, 2, 10]
    for wait in waits:
        parent = [e for e in find(merged, wait["pid"]) if e["cat"] in ("comm", "sync") and e["ts"] == wait["ts"]
                  and e["tid"] == wait["tid"]]
        assert len(parent) == 1, wait
        assert wait["dur"] == parent[0]["args"]["wait_us"] <= parent[0]["dur"]
        assert wait["name"] == f"waiting for rank {parent[0]['args']['last_rank']}"
    # the parent comes first in the file, as viewers nest them in file order at one start
    events = merged["traceEvents"]
    for wait in waits:
        at = events.index(wait)
        assert events[at - 1]["ts"] == wait["ts"] and events[at - 1]["cat"] in ("comm", "sync")


def test_the_merged_file_is_compact_and_valid(merged, tmp_path):
    text = (tmp_path / "run.json").read_text()
    assert json.loads(text) == merged
    assert '": ' not in text and ', "' not in text
    assert validate(tmp_path / "run.json") == []
    order = [e["ph"] for e in merged["traceEvents"]]
    assert order[:order.count("M")] == ["M"] * order.count("M")   # metadata first


def test_merge_refuses_a_rank_twice_and_other_versions(parts, merged, tmp_path):
    with pytest.raises(ValueError, match=r"rank 0 is in both .*rank0.json and .*rank0.json"):
        trace_report.merge([parts[0], parts[0]], None)
    with pytest.raises(ValueError, match="rank 1 is in both"):
        trace_report.merge([tmp_path / "run.json", parts[1]], None)
    newer = rank_trace(3)
    newer["otherData"]["pydist"]["version"] = 2
    (tmp_path / "v2.json").write_text(json.dumps(newer))
    with pytest.raises(ValueError, match="version 2"):
        trace_report.merge([parts[0], tmp_path / "v2.json"], None)
    (tmp_path / "plain.json").write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(ValueError, match="not a pydist timeline"):
        trace_report.merge([tmp_path / "plain.json"], None)


def test_merging_a_merged_file_again_changes_nothing(merged, tmp_path):
    again = trace_report.merge([tmp_path / "run.json"], tmp_path / "again.json")
    assert again == merged
    assert (tmp_path / "again.json").read_text() == (tmp_path / "run.json").read_text()


def test_merge_leaves_a_users_own_args_alone(tmp_path):
    """Only collectives get (and lose again) wait_us and last_rank: a user's event may have args of
    those names, which merge keeps and the summary does not count as waiting."""
    mine = span(0, 100, 3600.0, 100.0, "user", "my phase", wait_us=5, last_rank="me")
    path = tmp_path / "run.rank0.json"
    path.write_text(json.dumps(broken(lambda t: t["traceEvents"].append(mine))))
    merged = trace_report.merge([path], None)
    assert find(merged, cat="user")[0]["args"] == {"wait_us": 5, "last_rank": "me"}
    assert trace_report.time_use(merged)[0]["waiting"] == 0


def test_a_collective_missing_a_member_is_not_annotated(parts):
    two = trace_report.merge(parts[:2], None)
    # rank 2's file is not there: the world's collectives cannot say who came last...
    for name in ("broadcast", "barrier"):
        assert all("wait_us" not in e["args"] for e in find(two, name=name)), name
    # ...but the engine's group is not listed in otherData, and two ranks pair
    assert {e["args"]["wait_us"] for e in find(two, 0, name="gradient sync")} == {20000.0}



def test_write_never_writes_through_a_link_at_its_temporary_name(merged, tmp_path, monkeypatch):
    """Links planted where write() makes its temporary file (the name it will draw, and one to a file
    that does not exist yet): it takes another name, and what they point at is left alone (issue 41)."""
    victim = tmp_path / "victim"
    victim.write_text("someone else's file\n")
    (tmp_path / "out.json.planted.tmp").symlink_to(victim)
    (tmp_path / "out.json.dangling.tmp").symlink_to(tmp_path / "never-made")
    drawn = iter(["planted", "dangling", "fresh"])
    monkeypatch.setattr(_files.secrets, "token_hex", lambda n: next(drawn))
    trace_report.write(merged, tmp_path / "out.json")
    assert victim.read_text() == "someone else's file\n" and not (tmp_path / "never-made").exists()
    assert json.loads((tmp_path / "out.json").read_text()) == merged
    assert not (tmp_path / "out.json.fresh.tmp").exists()


def test_write_replaces_a_link_at_its_path_and_cleans_up_on_failure(merged, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("someone else's file\n")
    (tmp_path / "out.json").symlink_to(victim)
    trace_report.write(merged, tmp_path / "out.json")
    assert victim.read_text() == "someone else's file\n" and not (tmp_path / "out.json").is_symlink()
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(IsADirectoryError):
        trace_report.write(merged, tmp_path / "dir.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.json", "out.json", "run.json", "run.rank0.json",
                                                          "run.rank1.json", "run.rank2.json", "victim"]

# ---------------------------------------------------------------------------------------------------
# summary and stragglers

def test_time_use_counts_each_moment_once(merged, parts):
    use = trace_report.time_use(merged)
    assert sorted(use) == [0, 1, 2]
    # the slow delay lies inside forward: counted once (0.56 s if twice)
    assert [round(use[r]["compute"], 6) for r in range(RANKS)] == [0.16, 0.36, 0.165]
    assert [round(use[r]["waiting"], 6) for r in range(RANKS)] == [0.205, 0.004, 0.195]
    # collectives' time less their waits, point-to-point calls, and rank 2's serve spans
    assert [round(use[r]["communication"], 6) for r in range(RANKS)] == [0.0115, 0.0118, 0.02]
    assert all(round(use[r]["other"], 6) == 0 for r in range(RANKS))   # the phases fill every step
    # a trace without annotations gets the same waits, found on the fly, and is left as it was
    raw = unannotated(parts)
    before = json.dumps(raw)
    assert trace_report.time_use(raw) == use
    assert json.dumps(raw) == before


def test_stragglers_names_rank_1_step_by_step(merged):
    found = trace_report.stragglers(merged)
    assert found.unit == "step"
    assert found.items == [(k, 1, BY_MS) for k in range(1, STEPS + 1)]
    assert (found.rank, found.share, found.by_ms, found.clear) == (1, 1.0, BY_MS, True)
    assert found.compute_ms[3] == pytest.approx({0: 16.0, 1: 36.0, 2: 16.5})


def test_stragglers_without_steps_goes_by_collectives(merged):
    no_steps = {**merged, "traceEvents": [e for e in merged["traceEvents"] if e.get("cat") != "step"]}
    found = trace_report.stragglers(no_steps)
    assert found.unit == "collective"
    assert [rank for _, rank, _ in found.items] == [2, 2] + [1] * STEPS + [2]   # in time order
    assert found.items[0] == (("comm", WORLD, 1, "broadcast"), 2, 3.0)
    assert found.items[2] == (("sync", ENGINE, 0, "gradient sync"), 1, 20.0)   # 35 - 15 ms
    assert (found.rank, found.by_ms, found.clear) == (1, 20.0, True)
    assert found.share == pytest.approx(10 / 13)


def test_no_clear_straggler_when_the_slowest_changes(merged):
    # no delay, and at step k rank k % 3 is 1 ms slower than the others: each is slowest a third of the time
    events = [e for e in merged["traceEvents"] if e.get("name") != "slow"]
    for e in events:
        if e.get("name") == "forward":
            e["dur"] = 5000.0
        if e.get("name") == "batch":
            k = int((e["ts"] - STEP0) // STEP_US) + 1
            e["dur"] = 2000.0 if e["pid"] == k % 3 else 1000.0
    trace = {**merged, "traceEvents": events}
    found = trace_report.stragglers(trace)
    assert found.unit == "step" and {rank for _, rank, _ in found.items} == {0, 1, 2}
    assert {by for _, _, by in found.items} == {1.0}
    assert found.share == 0.4 and not found.clear
    assert trace_report.summary(trace).splitlines()[-1] == \
        "straggler: none clear (rank 1 slowest in 40% of 10 steps, by 1.0 ms per step (median))"


def test_summary_says_where_the_time_went_and_names_rank_1(merged):
    text = trace_report.summary(merged)
    lines = text.splitlines()
    assert len(lines) <= 30, text
    assert lines[-1] == "straggler: rank 1, slowest in 100% of 10 steps, by 19.8 ms per step (median)"
    row = next(line for line in lines if line.split()[:2] == ["1", "vm"])
    assert row.split()[2:4] == ["0.360", "s"], row          # rank 1's compute
    row = next(line for line in lines if line.split()[:2] == ["0", "vm"])
    assert row.split()[8:10] == ["0.205", "s"], row         # rank 0's waiting
    assert "13 collective(s) paired" in lines[0]


def test_summary_of_one_ranks_file_has_nothing_to_compare(parts):
    text = trace_report.summary(trace_report.load(parts[0]))
    assert text.splitlines()[-1] == "straggler: none found (no step or collective on several ranks)"
    assert trace_report.time_use(trace_report.load(parts[0]))[0]["waiting"] == 0


# ---------------------------------------------------------------------------------------------------
# draw_png

def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_draw_png_shows_steps_3_to_8(merged, tmp_path):
    out = tmp_path / "run.png"
    drawn = trace_report.draw_png(merged, out)
    assert drawn["rows"] == ["rank 0", "rank 1", "rank 2", "rank 2 server"]
    assert png_size(out) == (1600, 200 + 140 * 4)
    assert figures.page_px(out) >= figures.MIN_PAGE_PX   # its smallest text, at the docs' column
    assert figures.recorded_problems(out) == []   # none cut off or drawn over other text
    assert out.stat().st_size > 20_000   # bars, labels and a legend, not an empty frame
    assert drawn["shows"] == "steps 3-8 of 10"
    assert drawn["window_ms"] == (step_start(3) / 1000, (step_start(8) + 37_000) / 1000)


def test_draw_png_first_seconds(merged, tmp_path):
    drawn = trace_report.draw_png(merged, tmp_path / "start.png", max_seconds=0.05)
    assert drawn["window_ms"] == (0.0, 50.0) and drawn["shows"] == "the first 0.05 s"
    # the broadcast and its wait, the async call's strip not counted, the first step's phases
    assert 5 < drawn["bars"] < 40, drawn
    assert png_size(tmp_path / "start.png")[0] == 1600


def test_a_step_that_begins_at_the_windows_end_is_not_labelled_in_part(merged, tmp_path):
    """A window ending 0.5 ms into step 3: its outline shows, its label (which would be cut to "st" by the
    window's edge) does not, and steps 1 and 2 keep theirs."""
    out = tmp_path / "cut.png"
    trace_report.draw_png(merged, out, max_seconds=(step_start(3) + 500) / 1e6)
    assert figures.recorded_problems(out) == []


# ---------------------------------------------------------------------------------------------------
# The command line

def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "pydist.trace_report", *map(str, args)], cwd=cwd,
                          env=subprocess_env(), capture_output=True, text=True, timeout=120)


def test_the_command_line(parts, tmp_path):
    proc = cli("merge", *parts, "-o", "cli.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "13 collective(s) paired" in proc.stdout
    proc = cli("summary", "cli.json", "--png", "cli.png", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "straggler: rank 1, slowest in 100% of 10 steps" in proc.stdout
    assert png_size(tmp_path / "cli.png") == (1600, 200 + 140 * 4)
    proc = cli("png", "cli.json", "only.png", "--max-seconds", "0.1", cwd=tmp_path)
    assert proc.returncode == 0 and "the first 0.1 s" in proc.stdout, proc.stderr
    # the first 0.1 s holds async calls too: a legend of 7 entries, in two lines
    assert png_size(tmp_path / "only.png") == (1600, 200 + 140 * 4 + trace_report.LEGEND_LINE_PX)
    assert figures.recorded_problems(tmp_path / "cli.png") == figures.recorded_problems(tmp_path / "only.png") == []


@pytest.mark.parametrize("command", ["pydist.trace_report", "pydist.timeline"])
@pytest.mark.parametrize("args, message", [
    (["summary", "missing.json"], "missing.json: No such file or directory"),
    (["summary", "bad.json"], "bad.json: not JSON"),
    (["summary", "nan.json"], "NaN is not a JSON number"),
    (["summary", "."], ".: Is a directory"),
    (["summary", "wrong.json", "--png", "x.png"], "wrong.json: event 3 ('X' 'parent'): dur must be a number of us"),
    (["png", "wrong.json", "x.png"], "wrong.json: event 3 ('X' 'parent'): dur must be a number of us"),
    (["merge", "missing.json", "-o", "x.json"], "missing.json: No such file or directory"),
    (["merge", "wrong.json", "-o", "x.json"], "wrong.json: event 3 ('X' 'parent'): dur must be a number of us"),
])
def test_the_command_line_says_what_is_wrong_in_one_line(tmp_path, command, args, message):
    (tmp_path / "bad.json").write_text('{"traceEvents": [')
    (tmp_path / "nan.json").write_text('{"traceEvents": [{"ph": "X", "ts": NaN}]}')
    (tmp_path / "wrong.json").write_text(json.dumps(broken(lambda t: t["traceEvents"][3].update(dur=-1))))
    proc = subprocess.run([sys.executable, "-m", command, *args], cwd=tmp_path, env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.startswith(f"python -m {command}: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert message in proc.stderr, proc.stderr
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "x.png").exists()


def test_a_usage_error_is_argparses(tmp_path):
    proc = cli("merge", "-o", "x.json", cwd=tmp_path)
    assert proc.returncode == 2 and "the following arguments are required: parts" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------------------------------
# Malformed traces: a ValueError that names the file and what is wrong (issue 41)

def broken(change):
    """A small valid trace of one rank (a thread, a step, a collective, an async call), changed."""
    trace = {"traceEvents": [
        {"ph": "M", "pid": 0, "tid": 0, "name": "process_name", "args": {"name": "rank 0 (vm)"}},
        {"ph": "M", "pid": 0, "tid": 1, "name": "thread_name", "args": {"name": "main"}},
        span(0, 1, 0.0, 10.0, "step", "step", step=1),
        span(0, 1, 0.0, 10.0, "compute", "parent"),
        comm(0, "all_reduce", 10.0, 12.0, seq=1, tid=1),
        {"ph": "b", "id": "0x1", "pid": 0, "tid": 1, "ts": 12.0, "cat": "comm", "name": "all_reduce",
         "args": {"group": WORLD, "seq": 2}},
        {"ph": "e", "id": "0x1", "pid": 0, "tid": 1, "ts": 13.0, "cat": "comm", "name": "all_reduce", "args": {}}],
        "displayTimeUnit": "ms",
        "otherData": {"pydist": {"version": 1, "ranks": {"0": {"events": 5, "dropped": 0, "host": "vm", "pid": 1,
                                                                "groups": {str(WORLD): [0]}}}}}}
    change(trace)
    return trace


def event(i):
    return lambda t: t["traceEvents"][i]


def setter(where, **values):
    return lambda t: where(t).update(values)


def popper(where, key):
    return lambda t: where(t).pop(key)


RANK0 = lambda t: t["otherData"]["pydist"]["ranks"]["0"]   # noqa: E731
BROKEN = {
    "negative duration": (setter(event(3), dur=-1), r"event 3 \('X' 'parent'\): dur must be a number of us from 0"),
    "duration past any clock": (setter(event(3), dur=1e300), "dur must be a number of us from 0 to 1e[+]16"),
    "huge time": (setter(event(3), ts=-10**30), "ts must be a number of us"),
    "time as text": (setter(event(4), ts="10"), "ts must be a number"),
    "time true": (setter(event(3), ts=True), "ts must be a number"),
    "no duration": (popper(event(3), "dur"), "event 3 .*: it has no 'dur'"),
    "no pid": (popper(event(0), "pid"), "it has no 'pid'"),
    "a rank not listed": (setter(event(4), pid=3), "pid must be a rank that otherData.pydist.ranks lists; got 3"),
    "a negative rank": (setter(event(4), pid=-1), "pid must be a rank"),
    "a rank as text": (setter(event(4), pid="0"), "pid must be a rank"),
    "a float thread": (setter(event(4), tid=1.5), "tid must be a thread id"),
    "a name not text": (setter(event(3), name=["parent"]), "name must be text"),
    "a lone surrogate": (setter(event(3), name="\ud800"), "name must be text"),
    "a category not text": (setter(event(3), cat=None), "cat must be text"),
    "args not an object": (setter(event(3), args=[1]), "args must be an object"),
    "args nested deeply": (setter(event(3), args={"a": json.loads("[" * 40 + "]" * 40)}), "args must be JSON at most"),
    "a seq as text": (lambda t: event(4)(t)["args"].update(seq="1"), "args.seq must be an int >= 0"),
    "a negative group": (lambda t: event(4)(t)["args"].update(group=-5), "args.group must be a group id"),
    "a step as text": (lambda t: event(2)(t)["args"].update(step="1"), "args.step must be an int"),
    "a wait below 0": (lambda t: event(4)(t)["args"].update(wait_us=-1.0), "args.wait_us must be"),
    "a last rank not listed": (lambda t: event(4)(t)["args"].update(last_rank=9), "args.last_rank must be a rank"),
    "an unknown phase": (setter(event(3), ph="B"), "ph must be one of M, X, b, e"),
    "a phase not text": (setter(event(3), ph=1), "ph must be one of"),
    "an unexpected field": (setter(event(3), colour="red"), "it has an unexpected key 'colour'"),
    "an async event without id": (popper(event(5), "id"), "event 5 .*: it has no 'id'"),
    "an event not an object": (lambda t: t["traceEvents"].append([0, 1]), "event 7 \\(list\\): it must be an object"),
    "unknown metadata": (setter(event(1), name="thread_colour"), "name must be one of process_name"),
    "metadata without its arg": (setter(event(1), args={}), "args has no 'name'"),
    "a sort index as text": (setter(event(1), name="thread_sort_index", args={"sort_index": "0"}),
                             "args.sort_index must be an int"),
    "traceEvents an object": (lambda t: t.update(traceEvents={}), "traceEvents must be a list"),
    "no traceEvents": (lambda t: t.pop("traceEvents"), "the trace has no 'traceEvents'"),
    "a time unit": (lambda t: t.update(displayTimeUnit="s"), "displayTimeUnit must be"),
    "otherData a list": (lambda t: t.update(otherData=[]), "otherData must be an object"),
    "another version": (lambda t: t["otherData"]["pydist"].update(version=2), "format version 2; this pydist reads"),
    "a version as text": (lambda t: t["otherData"]["pydist"].update(version="1"), "format version '1'"),
    "no ranks": (lambda t: t["otherData"]["pydist"].pop("ranks"), "otherData.pydist has no 'ranks'"),
    "a rank key not a number": (lambda t: t["otherData"]["pydist"]["ranks"].update(x=RANK0(t)),
                                "otherData.pydist.ranks's keys must be ints"),
    "a rank key past MPI's": (lambda t: t["otherData"]["pydist"]["ranks"].update({str(2**31): RANK0(t)}),
                              "otherData.pydist.ranks's keys must be ints"),
    "negative events": (lambda t: RANK0(t).update(events=-1), r"ranks\['0'\].events must be an int >= 0"),
    "dropped as a float": (lambda t: RANK0(t).update(dropped=1.0), "dropped must be an int"),
    "a host not text": (lambda t: RANK0(t).update(host=7), "host must be text"),
    "group members not ranks": (lambda t: RANK0(t).update(groups={str(WORLD): ["a"]}), "must be a list of ranks"),
    "a group id as a word": (lambda t: RANK0(t).update(groups={"world": [0]}), "groups's keys must be ints"),
    "waits without events": (lambda t: t["otherData"]["pydist"].update(waits={"collectives": 1}),
                             "otherData.pydist.waits has no 'events'"),
    "someone's otherData with inf": (lambda t: t["otherData"].update(theirs={"x": float("inf")}),
                                     r"otherData\['theirs'\] must be finite numbers"),
}


@pytest.mark.parametrize("name", BROKEN)
def test_a_malformed_trace_is_a_valueerror_naming_the_file(tmp_path, name):
    change, message = BROKEN[name]
    trace = broken(change)
    path = tmp_path / "run.rank0.json"
    path.write_text(json.dumps(trace))   # (inf as Infinity: load refuses that first, json's extension)
    with pytest.raises(ValueError, match=f"^{path}: "):
        trace_report.load(path)
    with pytest.raises(ValueError, match=f"^{path}: "):
        trace_report.merge([path], tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists()
    # a trace handed over as a dict is checked as well
    for read in (trace_report.summary, trace_report.time_use, trace_report.stragglers,
                 lambda t: trace_report.draw_png(t, tmp_path / "out.png")):
        with pytest.raises(ValueError, match=f"^trace: .*{message}"):
            read(trace)
    assert not (tmp_path / "out.png").exists()


def test_the_unchanged_small_trace_is_read(tmp_path):
    """(So that each case above fails for its own change.)"""
    trace = broken(lambda t: None)
    path = tmp_path / "run.rank0.json"
    path.write_text(json.dumps(trace))
    assert trace_report.load(path) == trace
    assert "1 rank(s)" in trace_report.summary(trace)
    assert trace_report.merge([path])["otherData"]["pydist"]["ranks"] == trace["otherData"]["pydist"]["ranks"]


GOOD_TEXT = json.dumps(broken(lambda t: None))


@pytest.mark.parametrize("text, message", [
    (b"", "not JSON: Expecting value"),
    (GOOD_TEXT[:len(GOOD_TEXT) // 2].encode(), "not JSON"),
    (GOOD_TEXT.replace('"dur": 10.0', '"dur": NaN', 1).encode(), "NaN is not a JSON number"),
    (GOOD_TEXT.replace('"dur": 10.0', '"dur": 1e999', 1).encode(), "dur must be a number of us from 0 to .*; got inf"),
    (GOOD_TEXT.replace('"ts": 10.0', '"ts": ' + "9" * 5000, 1).encode(), "not JSON: Exceeds the limit"),
    (b'{"traceEvents": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    (b"\xff\xfe\x00{", "not JSON"),
    (b"[]", "the trace must be an object; got \\[\\]"),
    (b"null", "the trace must be an object; got None"),
])
def test_a_file_that_is_not_a_trace_is_a_valueerror(tmp_path, text, message):
    path = tmp_path / "run.json"
    path.write_bytes(text)
    with pytest.raises(ValueError, match=f"^{path}: .*{message}"):
        trace_report.load(path)
    with pytest.raises(ValueError, match=f"^{path}: .*{message}"):
        trace_report.merge([path], None)


def test_what_is_no_file_is_an_oserror(tmp_path):
    with pytest.raises(IsADirectoryError, match=str(tmp_path)):
        trace_report.load(tmp_path)
    os.mkfifo(tmp_path / "fifo")   # (opened without waiting for a writer that never comes)
    with pytest.raises(OSError, match="not a regular file"):
        trace_report.load(tmp_path / "fifo")
    with pytest.raises(FileNotFoundError):
        trace_report.merge([tmp_path / "missing.json"], None)


def test_draw_png_takes_names_as_text_and_refuses_bad_windows(merged, tmp_path):
    """A "$" in a name is no TeX formula (matplotlib raised ParseException's ValueError on "$\\frac{")."""
    for e in merged["traceEvents"]:
        if e.get("name") == "forward":
            e["name"] = "$\\frac{"
    trace_report.draw_png(merged, tmp_path / "tex.png")
    for bad in (0, -1.0, float("nan"), "1"):
        with pytest.raises(ValueError, match="max_seconds"):
            trace_report.draw_png(merged, tmp_path / "x.png", max_seconds=bad)


# ---------------------------------------------------------------------------------------------------
# The format checker

def good_thread():
    return [{"ph": "M", "pid": 0, "tid": 1, "name": "thread_name", "args": {"name": "main"}},
            {"ph": "X", "pid": 0, "tid": 1, "ts": 0.0, "dur": 10.0, "name": "parent"},
            {"ph": "X", "pid": 0, "tid": 1, "ts": 2.0, "dur": 8.0005, "name": "child"},   # ends 0.5 ns late
            {"ph": "B", "pid": 0, "tid": 1, "ts": 20.0, "name": "outer"},
            {"ph": "B", "pid": 0, "tid": 1, "ts": 21.0, "name": "inner"},
            {"ph": "E", "pid": 0, "tid": 1, "ts": 22.0},
            {"ph": "E", "pid": 0, "tid": 1, "ts": 23.0, "name": "outer"},
            {"ph": "b", "pid": 0, "tid": 1, "ts": 5.0, "cat": "comm", "id": "0x1", "name": "all_reduce"},
            {"ph": "e", "pid": 0, "tid": 1, "ts": 50.0, "cat": "comm", "id": "0x1", "name": "all_reduce"}]


@pytest.mark.parametrize("change, problem", [
    (lambda ev: ev.pop(6), "a B never closed by an E"),
    (lambda ev: ev.pop(3), "an E with no open B"),
    (lambda ev: ev[6].update(name="other"), "closes event 3, a B named 'outer'"),
    (lambda ev: ev[2].update(dur=9.0), "overlaps event 1 (parent, 0.0-10.0) partly"),
    (lambda ev: ev[1].pop("dur"), "dur must be a finite number >= 0; got None"),
    (lambda ev: ev[1].update(dur=-1), "dur must be a finite number >= 0; got -1"),
    (lambda ev: ev[1].update(ts=float("inf")), "ts must be a finite number"),
    (lambda ev: ev[1].pop("tid"), "no tid"),
    (lambda ev: ev[1].pop("name"), "name must be a string"),
    (lambda ev: ev[0].update(args={"title": "main"}), "args.name must be a str"),
    (lambda ev: ev[0].update(name="thread_colour"), "metadata must be one of"),
    (lambda ev: ev.pop(8), "an async b never ended by an e"),
    (lambda ev: ev[8].update(id="0x2"), "an async e with no open b"),
    (lambda ev: ev[1].update(ph="Z"), "ph must be one of"),
])
def test_validate_catches_broken_traces(change, problem):
    events = good_thread()
    assert validate({"traceEvents": events}) == []
    change(events)
    problems = validate({"traceEvents": events})
    assert any(problem in p for p in problems), problems


def test_validate_reads_files_strictly(tmp_path):
    (tmp_path / "nan.json").write_text('{"traceEvents": [{"ph": "X", "pid": 0, "tid": 0, "name": "a", '
                                       '"ts": 0, "dur": NaN}]}')
    assert validate(tmp_path / "nan.json") == [
        "the file does not load with the standard json module: NaN is not a JSON number"]
    assert validate({"traceEvents": {}}) == ["traceEvents is not a list"]
