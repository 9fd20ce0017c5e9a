"""The timeline as a user records and reads it (issue 28): PYDIST_TIMELINE=run.json on the main job
with a straggler (--slow-rank 1 --slow-ms 20) gives one valid Chrome trace with every rank and every
phase, and `python -m pydist.timeline summary` names rank 1; an asynchronous strategy's and a
pipeline's traces hold their own events; a stalled collective with PYDIST_STALL_WARN=1 names the rank
it waits for and what that rank is doing, and the job still ends normally."""
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from trace_format import validate
from unit_helpers import MPIEXEC, subprocess_env

ENV = subprocess_env(MPIEXEC_TIMEOUT="180")
TRAIN = [sys.executable, "-m", "pydist.train", "--model", "mlp", "--hidden", "64", "--epochs", "1",
         "--batch-size", "64", "--no-progress", "--metrics", "", "--plot", ""]
PHASES = ["step", "batch", "forward", "backward", "gradient sync", "update"]


def run_job(cwd, ranks, argv, **env):
    cmd = [MPIEXEC, "-n", str(ranks), *argv]
    proc = subprocess.run(cmd, cwd=cwd, env=dict(ENV, **env), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def recorded(cwd, ranks, argv, name="run.json"):
    """Run a job with PYDIST_TIMELINE; the merged trace, checked against the format's rules."""
    run_job(cwd, ranks, argv, PYDIST_TIMELINE=name)
    assert sorted(p.name for p in cwd.iterdir() if p.name.startswith("run")) == [name]   # parts merged away
    trace = json.loads((cwd / name).read_text())
    problems = validate(trace)
    assert problems == [], problems[:10]
    return trace


def spans(trace, pid=None, cat=None, name=None):
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and (pid is None or e["pid"] == pid)
            and (cat is None or e.get("cat") == cat) and (name is None or e["name"] == name)]


def test_the_main_job_with_a_straggler(tmp_path):
    trace = recorded(tmp_path, 3, [*TRAIN, "--slow-rank", "1", "--slow-ms", "20"])
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names) == [0, 1, 2] and all(names[r].startswith(f"rank {r} (") for r in names), names
    steps = 60000 // (3 * 64)
    for rank in range(3):
        for phase in PHASES:
            assert len(spans(trace, rank, name=phase)) == steps, (rank, phase)
        # evaluation and the end's reductions are pydist calls on the world group
        assert spans(trace, rank, cat="comm"), rank
    slow = spans(trace, 1, name="slow")
    assert len(slow) == steps and min(e["dur"] for e in slow) >= 20000
    assert spans(trace, 0, name="slow") == [] and spans(trace, 2, name="slow") == []
    # ranks 0 and 2 wait for rank 1 at (almost) every step's exchange: merge says so on their spans
    for rank in (0, 2):
        waits = sorted(e["args"]["wait_us"] for e in spans(trace, rank, name="gradient sync"))
        assert waits[len(waits) // 2] > 10000, (rank, waits[len(waits) // 2])
        lasts = [e["args"]["last_rank"] for e in spans(trace, rank, name="gradient sync")]
        assert lasts.count(1) > 0.9 * steps, rank
    summary = subprocess.run([sys.executable, "-m", "pydist.timeline", "summary", "run.json", "--png", "run.png"],
                             cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)
    assert summary.returncode == 0, summary.stderr
    assert re.search(r"straggler: rank 1\b", summary.stdout), summary.stdout
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_asynchronous_strategy_shows_its_exchanges(tmp_path):
    trace = recorded(tmp_path, 3, [*TRAIN, "--strategy", "downpour"])
    for worker in (0, 1):
        exchanges = spans(trace, worker, cat="strategy", name="server exchange")
        assert exchanges and all(e["args"]["server"] == 2 for e in exchanges), worker
    served = spans(trace, 2, cat="strategy", name="serve")
    assert len(served) == sum(len(spans(trace, w, name="server exchange")) for w in (0, 1))
    assert {e["args"]["worker"] for e in served} == {0, 1}
    assert all(e["args"]["staleness"] >= 0 for e in served) and max(e["args"]["staleness"] for e in served) > 0


def test_a_pipeline_shows_its_micro_batches(tmp_path):
    trace = recorded(tmp_path, 2, [*TRAIN, "--strategy", "pipeline", "--stages", "2", "--micro-batches", "4"])
    for stage in (0, 1):
        for name in ("micro-batch forward", "micro-batch backward"):
            micro = spans(trace, stage, name=name)
            assert micro and {e["args"]["stage"] for e in micro} == {stage}, (stage, name)
            assert {e["args"]["micro"] for e in micro} == {0, 1, 2, 3}, (stage, name)
    assert spans(trace, 0, name="stage send") and spans(trace, 1, name="stage recv")


@pytest.mark.parametrize("region", ["", "timeline"])
def test_a_stalled_collective_names_the_missing_rank(tmp_path, region):
    """With region="timeline" the barrier is the region's first collective: the timeline numbers the
    group's collectives from 1 again while rank 1's board still shows the start's own calls, whose
    numbers were higher (the inspector said "every rank has arrived" before board_seq)."""
    script = tmp_path / "stall.py"
    script.write_text(textwrap.dedent(f"""
        import contextlib
        import os
        import time
        import numpy as np
        import pydist as dist
        dist.init_process_group()
        x = np.ones(4, np.float32)
        dist.all_reduce(x)
        with dist.timeline("stall.json") if {region!r} else contextlib.nullcontext():
            if dist.get_rank() == 1:
                time.sleep(2.5)   # rank 1 computes while the others wait in the barrier
            dist.barrier()
        # one write (unbuffered print writes each piece, and hydra interleaves the ranks' pieces)
        os.write(1, f"rank {{dist.get_rank()}} passed the barrier\\n".encode())
    """))
    proc = run_job(tmp_path, 3, [sys.executable, str(script)], PYDIST_STALL_WARN="1")
    for rank in range(3):
        assert f"rank {rank} passed the barrier" in proc.stdout   # the warning did not end the wait
    # its last call: the all_reduce, or the timeline's start's broadcast of the clock offsets
    last = "broadcast" if region else "all_reduce"
    for rank in (0, 2):
        warning = re.search(rf"\[rank {rank}\] pydist: stall: barrier has waited ([\d.]+) s.*?\n((?:  .*\n)+)",
                            proc.stderr)
        assert warning, proc.stderr
        assert 1.0 <= float(warning.group(1)) < 2.5, proc.stderr
        missing = re.findall(r"  rank (\d+): (.*)", warning.group(2))
        assert [int(r) for r, _ in missing] == [1], proc.stderr   # not the other waiting rank
        assert f"not in a pydist call; its last call, {last}, returned" in missing[0][1], proc.stderr
    assert "every rank has arrived" not in proc.stderr
    assert "[rank 1] pydist: stall" not in proc.stderr   # it never waited
    assert proc.stderr.count("pydist: stall") == 2, proc.stderr   # once per waiting rank


def test_a_region_and_an_event_of_ones_own(tmp_path):
    script = tmp_path / "region.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import pydist as dist
        dist.init_process_group()
        x = np.ones(4, np.float32)
        dist.all_reduce(x)                       # before: not recorded
        with dist.timeline("region.json"):
            t0 = dist.timeline.clock()
            dist.all_reduce(x)
            dist.timeline.event("my phase", t0, dist.timeline.clock(), cat="user", epoch=3, note="hello")
        dist.all_reduce(x)                       # after: not recorded
    """))
    run_job(tmp_path, 2, [sys.executable, str(script)])
    trace = json.loads((tmp_path / "region.json").read_text())
    assert validate(trace) == []
    for rank in (0, 1):
        calls = spans(trace, rank, cat="comm")
        assert [(e["name"], e["args"]["seq"]) for e in calls] == [("all_reduce", 1)], calls
        mine = spans(trace, rank, cat="user", name="my phase")
        assert len(mine) == 1 and mine[0]["args"] == {"epoch": 3, "note": "hello"}
        assert mine[0]["ts"] <= calls[0]["ts"] and calls[0]["ts"] + calls[0]["dur"] <= mine[0]["ts"] + mine[0]["dur"]


@pytest.mark.parametrize("bad, message", [(["summary", "missing.json"], "missing.json"),
                                           (["merge", "-o", "x.json"], "")])
def test_the_command_line_says_what_is_wrong(tmp_path, bad, message):
    proc = subprocess.run([sys.executable, "-m", "pydist.timeline", *bad], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_an_event_of_ones_own_with_bad_arguments_raises(tmp_path):
    """In one process (a world of 1): what timeline.event refuses, it refuses with a Python exception,
    before anything is recorded; the region still writes a valid trace holding the good event."""
    import pydist as dist
    with dist.timeline(tmp_path / "args.json"):
        t = dist.timeline.clock()
        with pytest.raises(ValueError, match="at most 6"):
            dist.timeline.event("too many", t, t, **{f"a{i}": i for i in range(7)})
        with pytest.raises(TypeError, match="int or a str"):
            dist.timeline.event("float arg", t, t, x=1.5)
        with pytest.raises(UnicodeEncodeError):
            dist.timeline.event("bad \udc80 name", t, t)
        dist.timeline.event("good", t, dist.timeline.clock(), n=1)
    trace = json.loads((tmp_path / "args.json").read_text())
    assert validate(trace) == []
    assert [e["name"] for e in spans(trace, 0, cat="user")] == ["good"]


def test_a_rank_file_that_cannot_be_replaced_is_an_oserror(tmp_path):
    """A directory where this rank's file goes: the rename into place fails, an OSError names the file,
    and the temporary file the trace was written to is gone (issue 41)."""
    import pydist as dist
    (tmp_path / "run.rank0.json").mkdir()
    with pytest.raises(IsADirectoryError, match="run.rank0.json"):
        with dist.timeline(tmp_path / "run.json"):
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.rank0.json"]
