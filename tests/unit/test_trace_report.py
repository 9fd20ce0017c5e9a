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
import subprocess
import sys

import pytest

from pydist import trace_report
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
    """Rank `rank`'s file as csrc/timeline.c writes it."""
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
    monkeypatch.setattr(trace_report.secrets, "token_hex", lambda n: next(drawn))
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
    assert png_size(out) == (1600, 200 + 100 * 4)
    assert out.stat().st_size > 20_000   # bars, labels and a legend, not an empty frame
    assert drawn["shows"] == "steps 3-8 of 10"
    assert drawn["window_ms"] == (step_start(3) / 1000, (step_start(8) + 37_000) / 1000)


def test_draw_png_first_seconds(merged, tmp_path):
    drawn = trace_report.draw_png(merged, tmp_path / "start.png", max_seconds=0.05)
    assert drawn["window_ms"] == (0.0, 50.0) and drawn["shows"] == "the first 0.05 s"
    # the broadcast and its wait, the async call's strip not counted, the first step's phases
    assert 5 < drawn["bars"] < 40, drawn
    assert png_size(tmp_path / "start.png")[0] == 1600


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
    assert png_size(tmp_path / "cli.png") == (1600, 600)
    proc = cli("png", "cli.json", "only.png", "--max-seconds", "0.1", cwd=tmp_path)
    assert proc.returncode == 0 and "the first 0.1 s" in proc.stdout, proc.stderr
    assert png_size(tmp_path / "only.png") == (1600, 600)


@pytest.mark.parametrize("args, message", [
    (["summary", "missing.json"], "missing.json: No such file or directory"),
    (["summary", "bad.json"], "bad.json: not JSON"),
    (["summary", "nan.json"], "NaN is not a JSON number"),
    (["merge", "missing.json", "-o", "x.json"], "missing.json: No such file or directory"),
    (["merge", "-o", "x.json"], "the following arguments are required: parts"),
])
def test_the_command_line_says_what_is_wrong(tmp_path, args, message):
    (tmp_path / "bad.json").write_text('{"traceEvents": [')
    (tmp_path / "nan.json").write_text('{"traceEvents": [{"ph": "X", "ts": NaN}]}')
    proc = cli(*args, cwd=tmp_path)
    assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "x.json").exists()


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
