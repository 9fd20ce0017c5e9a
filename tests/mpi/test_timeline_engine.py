"""The training engine on the timeline (issue 28): what the step loop (csrc/engine/train.c) and the
strategies (csrc/strategies/) record, read back from the Chrome trace each rank writes. At every world
size of tests/run_mpi.py (the server and slow-rank cases from 2 ranks):

- a worker's step is one "step" span (args: step) holding its phases in order, each entirely inside it:
  batch, forward, backward, gradient sync, update; as many of each as steps; the ranks' "gradient sync"
  of one step carry the same group and seq (= the step), so a report can pair them;
- every thread's spans nest: a child inside its parent, siblings never overlapping;
- the slow rank's injected delay is a "slow" span of about slow_ms, first in each of its steps;
- easgd and average record "averaging round" every period steps, rounds numbered 0, 1, ...;
- a pipeline stage records "micro-batch forward" / "micro-batch backward" for every micro-batch (args
  stage, micro), and "stage recv" where a neighbour sends to it;
- downpour workers record "server exchange" (args server), the server "serve" (args worker, staleness),
  one for each exchange; ps's servers serve every step;
- with recording off nothing is recorded;
- pydist.trace_report reads what the engine wrote: it pairs the ranks' gradient syncs, one exchange a
  step, and names the slow rank as the straggler.
The recorder is driven through _C's private functions (timeline_start / timeline_write).
"""
import json

import numpy as np
import pytest

import pydist as dist
from pydist import _C, trace_report
from pydist.engine import Trainer, mlp
from helpers import parallel_assert

STEPS, BATCH, N = 6, 8, 512
PHASES = ["batch", "forward", "backward", "gradient sync", "update"]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)   # the same on every rank: the ranks shard it
    return rng.random((N, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, N).astype(np.int32)


def record(tmp_path, run):
    """run() with the recorder on; this rank's events, each with its integer times (ns) added. Times
    count from rank 0's start (one clock for the ranks of a host)."""
    rank = dist.get_rank()
    path = tmp_path / f"trace{rank}.json"
    origin = np.array([_C.timeline_clock()], np.int64)
    dist.broadcast(origin, 0)
    _C.timeline_start(int(origin[0]), rank, 1 << 20)
    try:
        run()
    finally:
        kept, dropped = _C.timeline_write(str(path), f"rank {rank}", "")
    assert dropped == 0
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(events) <= kept
    for e in events:
        e["t0"] = round(e["ts"] * 1000)
        e["t1"] = e["t0"] + round(e["dur"] * 1000)
    return events


def nest(events):
    """Each span's parent (by identity, None at the top) and the problems: a span that sticks out of
    its parent, which is also how overlapping siblings show."""
    parent, problems = {}, []
    threads = {}
    for e in events:
        threads.setdefault((e["pid"], e["tid"]), []).append(e)
    for spans in threads.values():
        stack = []
        for e in sorted(spans, key=lambda e: (e["t0"], -e["t1"])):
            while stack and stack[-1]["t1"] <= e["t0"]:
                stack.pop()
            if stack and e["t1"] > stack[-1]["t1"]:
                problems.append(f"{e['name']} [{e['t0']}, {e['t1']}] overlaps {stack[-1]['name']} "
                                f"[{stack[-1]['t0']}, {stack[-1]['t1']}]")
            parent[id(e)] = stack[-1] if stack else None
            stack.append(e)
    return parent, problems


def children(events, parent, of):
    return sorted((e for e in events if parent[id(e)] is of), key=lambda e: e["t0"])


def steps(events):
    return sorted((e for e in events if e["cat"] == "step" and e["name"] == "step"), key=lambda e: e["t0"])


def check_steps(events, expect, first_step=0):
    """The problems with this rank's steps: each holds the phases `expect` as its children, in order."""
    parent, problems = nest(events)
    mine = steps(events)
    if [s["args"]["step"] for s in mine] != list(range(first_step, first_step + STEPS)):
        problems.append(f"steps {[s['args']['step'] for s in mine]}")
    for s in mine:
        names = [c["name"] for c in children(events, parent, s)]
        if names != expect:
            problems.append(f"step {s['args']['step']} holds {names}, not {expect}")
        for c in children(events, parent, s):
            if c["name"] == "gradient sync" and c["args"].get("seq") != s["args"]["step"]:
                problems.append(f"step {s['args']['step']}'s gradient sync has args {c['args']}")
    for name in expect:
        count = sum(e["name"] == name for e in events)
        if count != len(mine):
            problems.append(f"{count} {name} spans for {len(mine)} steps")
    return problems


def merged(tmp_path):
    """Every rank's trace (written by record), merged by pydist.trace_report on every rank."""
    rank = dist.get_rank()
    every = agree((tmp_path / f"trace{rank}.json").read_text())
    paths = []
    for r, text in enumerate(every):
        paths.append(tmp_path / f"all{r}.json")
        paths[-1].write_text(text)
    return trace_report.merge(paths)


def agree(value):
    """Every rank's value, gathered."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def test_allreduce_step_phases(tmp_path, data):
    x, y = data
    t = Trainer(mlp((32,)), batch_size=BATCH, seed=1)
    events = record(tmp_path, lambda: t.train_steps(x, y, epoch=0, first=0, last=STEPS))
    problems = check_steps(events, PHASES)
    syncs = [(e["args"]["group"], e["args"]["seq"]) for e in events if e["name"] == "gradient sync"]
    every = agree(syncs)
    if any(s != every[0] for s in every):
        problems.append(f"the ranks' gradient syncs differ: {every}")
    if dist.get_world_size() > 1 and syncs and syncs[0][0] == 0:
        problems.append("the gradient sync's group is 0")
    if dist.get_world_size() > 1:
        paired = [key for key in trace_report.collectives(merged(tmp_path)) if key[0] == "sync"]
        if sorted(key[2] for key in paired) != list(range(STEPS)):
            problems.append(f"the report pairs the gradient syncs {paired}")
    parallel_assert(not problems, "; ".join(problems[:5]))


def test_steps_go_on_numbering_across_calls(tmp_path, data):
    x, y = data
    t = Trainer(mlp((16,)), batch_size=BATCH, seed=1, strategy="ring")
    t.train_steps(x, y, epoch=0, first=0, last=3)
    events = record(tmp_path, lambda: t.train_steps(x, y, epoch=0, first=3, last=3 + STEPS))
    problems = check_steps(events, PHASES, first_step=3)
    parallel_assert(not problems, "; ".join(problems[:5]))


@pytest.mark.parametrize("strategy", ["central", "average", "easgd"])
def test_other_synchronous_strategies_nest(tmp_path, data, strategy):
    x, y = data
    options = {"period": 2} if strategy in ("average", "easgd") else {}
    t = Trainer(mlp((16,)), batch_size=BATCH, seed=1, strategy=strategy, **options)
    events = record(tmp_path, lambda: t.train_steps(x, y, epoch=0, first=0, last=STEPS))
    parent, problems = nest(events)
    mine = steps(events)
    if len(mine) != STEPS:
        problems.append(f"{len(mine)} steps")
    for s in mine:
        names = [c["name"] for c in children(events, parent, s)]
        if strategy == "central":
            expect = PHASES[:3] + (["gradient sync", "update", "weight sync"] if dist.get_rank() == 0 else
                                   ["gradient sync"])
            if dist.get_world_size() == 1:
                expect = PHASES[:3] + ["update"]
        else:
            expect = PHASES[:3] + ["update"] + (["averaging round"] if s["args"]["step"] % 2 == 1 else [])
        if names != expect:
            problems.append(f"step {s['args']['step']} holds {names}, not {expect}")
    rounds = [e["args"]["round"] for e in events if e["name"] == "averaging round"]
    if strategy != "central" and rounds != list(range(STEPS // 2)):
        problems.append(f"averaging rounds {rounds}")
    parallel_assert(not problems, "; ".join(problems[:5]))


@pytest.mark.world_size(min=2)
def test_slow_rank_records_its_delay(tmp_path, data):
    x, y = data
    t = Trainer(mlp((16,)), batch_size=BATCH, seed=1, slow_rank=1, slow_ms=5)
    events = record(tmp_path, lambda: t.train_steps(x, y, epoch=0, first=0, last=STEPS))
    slow = dist.get_rank() == 1
    problems = check_steps(events, (["slow"] if slow else []) + PHASES)
    ms = [e["dur"] / 1000 for e in events if e["name"] == "slow"]
    if slow and not all(5.0 <= d < 50.0 for d in ms):
        problems.append(f"slow spans of {ms} ms, not about 5")
    straggler = trace_report.stragglers(merged(tmp_path))
    if (straggler.unit, straggler.rank) != ("step", 1):
        problems.append(f"the report names {straggler.unit} straggler {straggler.rank}, not rank 1")
    parallel_assert(not problems, "; ".join(problems[:5]))


def test_pipeline_records_micro_batches(tmp_path, data):
    x, y = data
    R, M = dist.get_world_size(), 4
    t = Trainer(mlp((15, 12, 10)), batch_size=BATCH, seed=1, strategy="pipeline", stages=R, micro_batches=M)
    events = record(tmp_path, lambda: t.train_steps(x, y, epoch=0, first=0, last=STEPS))
    parent, problems = nest(events)
    p = dist.get_rank()   # one replica: rank p runs stage p
    mine = steps(events)
    if len(mine) != STEPS:
        problems.append(f"{len(mine)} steps")
    for s in mine:
        inside = [c for c in children(events, parent, s)]
        for kind in ("forward", "backward"):
            micro = [c["args"] for c in inside if c["name"] == f"micro-batch {kind}"]
            if micro != [{"stage": p, "micro": m} for m in range(M)]:
                problems.append(f"step {s['args']['step']}: micro-batch {kind} {micro}")
        recv = sum(c["name"] == "stage recv" for c in inside)
        if recv != M * ((p > 0) + (p < R - 1)):
            problems.append(f"step {s['args']['step']}: {recv} stage recv")
        sends = {c["args"]["micro"] for c in inside if c["name"] == "stage send" and c["args"]["stage"] == p}
        if sends != (set(range(M)) if R > 1 else set()):
            problems.append(f"step {s['args']['step']}: stage sends of micro-batches {sorted(sends)}")
        if [c["name"] for c in inside][-1] != "update":
            problems.append(f"step {s['args']['step']} does not end with its update")
    parallel_assert(not problems, "; ".join(problems[:5]))


@pytest.mark.world_size(min=2)
def test_downpour_exchanges_and_serves(tmp_path, data):
    x, y = data
    R = dist.get_world_size()
    t = Trainer(mlp((16,)), batch_size=BATCH, seed=1, strategy="downpour", servers=1, window=2)
    events = record(tmp_path, lambda: t.train_steps(x, y, epoch=0, first=0, last=STEPS))
    _, problems = nest(events)
    exchanges = [e["args"] for e in events if e["name"] == "server exchange"]
    serves = [e["args"] for e in events if e["name"] == "serve"]
    server = dist.get_rank() == R - 1
    if server:
        if steps(events) or exchanges:
            problems.append("the server recorded steps or exchanges")
        if not serves or any(not 0 <= a["worker"] < R - 1 or a["staleness"] < 0 for a in serves):
            problems.append(f"serves {serves}")
    elif not exchanges or any(a != {"server": R - 1} for a in exchanges) or serves:
        problems.append(f"exchanges {exchanges}, serves {serves}")
    counts = agree((len(steps(events)), len(exchanges), len(serves)))
    if sum(c[0] for c in counts) != STEPS * (R - 1):
        problems.append(f"steps per rank {[c[0] for c in counts]}, not {STEPS * (R - 1)} in all")
    if sum(c[1] for c in counts) != counts[-1][2]:
        problems.append(f"exchanges per rank {[c[1] for c in counts]}, served {counts[-1][2]}")
    parallel_assert(not problems, "; ".join(problems[:5]))


@pytest.mark.world_size(min=2)
def test_ps_servers_serve_every_step(tmp_path, data):
    x, y = data
    R = dist.get_world_size()
    t = Trainer(mlp((16,)), batch_size=BATCH, seed=1, strategy="ps", servers=1)
    events = record(tmp_path, lambda: t.train_steps(x, y, epoch=0, first=0, last=STEPS))
    parent, problems = nest(events)
    if dist.get_rank() == R - 1:
        served = sorted((e for e in events if e["name"] == "serve step"), key=lambda e: e["t0"])
        if [e["args"]["step"] for e in served] != list(range(STEPS)):
            problems.append(f"served steps {[e['args'] for e in served]}")
        for e in served:
            names = [c["name"] for c in children(events, parent, e)]
            if names != ["gradient sync", "update", "weight sync"]:
                problems.append(f"a served step holds {names}")
    else:
        problems += check_steps(events, PHASES[:4])   # the servers update
    parallel_assert(not problems, "; ".join(problems[:5]))


def test_nothing_recorded_when_off(tmp_path, data):
    x, y = data
    t = Trainer(mlp((16,)), batch_size=BATCH, seed=1)
    _C.timeline_start(_C.timeline_clock(), dist.get_rank(), 1 << 20)
    _C.timeline_write(str(tmp_path / "before.json"), "rank", "")   # stops recording
    t.train_steps(x, y, epoch=0, first=0, last=STEPS)
    kept, dropped = _C.timeline_write(str(tmp_path / "off.json"), "rank", "")
    events = [e for e in json.loads((tmp_path / "off.json").read_text())["traceEvents"] if e["ph"] != "M"]
    parallel_assert(kept == 0 and dropped == 0 and not events, f"recorded {kept} events while off: {events[:3]}")
