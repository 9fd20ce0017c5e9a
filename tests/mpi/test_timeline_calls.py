"""Every communication call on the timeline (issue 28; csrc/ops/collectives.c, csrc/ops/p2p.c and the paths):
one "comm" span per call per rank, with its name, the bytes of this rank's buffers, the path that
carried it and its group's id; a group's collectives numbered 1, 2, ... alike on every rank; an
async_op=True call as a b/e pair from its start to its completion; a point-to-point call with its peer.
A call that fails its checks, or a PYDIST_DEBUG=DETAIL checks-only pass, is no span and takes no number.

Each test records a region (``with dist.timeline(path)``, every rank alike) into a directory every rank
shares, and rank 0 checks the merged trace for every rank. Any world size."""
import json
import os
import shutil
import tempfile

import numpy as np
import pytest

import pydist as dist
from helpers import parallel_assert

PATHS = {"small shm", "shm", "shm header + MPI", "shm header + ring", "shm header + pair", "ring", "persistent",
         "MPI"}
SMALL, LARGE = 1, 1 << 16   # float32 elements per block: 4 B, and 256 KiB (past the slots' 64 KiB)


def record(body):
    """Run body() on every rank inside a timeline region; rank 0 gets the merged trace's events (the
    others None)."""
    where = [tempfile.mkdtemp(prefix="pydist-timeline-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(where, 0)
    try:
        with dist.timeline(os.path.join(where[0], "run.json")) as path:
            body()
        if dist.get_rank() == 0:
            with open(path) as f:
                return json.load(f)["traceEvents"]
        return None
    finally:
        if dist.get_rank() == 0:
            shutil.rmtree(where[0], ignore_errors=True)


def check_on_root(events, check):
    """check(events) on rank 0, failing every rank together with rank 0's message."""
    message = ""
    if dist.get_rank() == 0:
        try:
            check(events)
        except AssertionError as e:
            message = str(e) or "assertion failed"
    parallel_assert(not message, message)


def calls(events, rank):
    """Rank `rank`'s comm calls in the order they started: X spans and b events (each with its e's ts
    as "end"), as dicts with the name, ph, ts, end and args."""
    ends = {e["id"]: e["ts"] for e in events if e["ph"] == "e" and e["pid"] == rank and e.get("cat") == "comm"}
    out = []
    for e in events:
        if e["pid"] != rank or e.get("cat") != "comm" or e["ph"] not in "Xb":
            continue
        end = e["ts"] + e["dur"] if e["ph"] == "X" else ends.get(e["id"])
        out.append({"name": e["name"], "ph": e["ph"], "ts": e["ts"], "end": end, **e["args"]})
    return sorted(out, key=lambda c: c["ts"])


def expect_equal(got, want, what):
    assert got == want, f"{what}: got {got}, want {want}"


# ---------------------------------------------------------------------------------------------------
# Every collective, blocking and async, at a size the small paths take and one they do not

def program(rank, size, m, async_op):
    """The collectives of one test, as (name, bytes rank `rank` counts, run); run() makes the call and
    returns its Work (async) or None. m: float32 elements per block."""
    b = 4 * m
    f = np.float32
    root = size - 1

    def block():
        return np.full(m, rank + 1, f)

    def blocks():
        return [np.full(m, rank + 1, f) for _ in range(size)]

    on_root = size * b if rank == root else b
    return [
        ("barrier", 0, lambda: dist.barrier(async_op=async_op)),
        ("broadcast", b, lambda: dist.broadcast(block(), root, async_op=async_op)),
        ("all_reduce", b, lambda: dist.all_reduce(block(), async_op=async_op)),
        ("reduce", b, lambda: dist.reduce(block(), root, async_op=async_op)),
        ("all_gather", size * b, lambda: dist.all_gather(blocks(), block(), async_op=async_op)),
        ("all_gather_into_tensor", size * b,
         lambda: dist.all_gather_into_tensor(np.zeros(size * m, f), block(), async_op=async_op)),
        ("gather", on_root,
         lambda: dist.gather(block(), blocks() if rank == root else None, root, async_op=async_op)),
        ("scatter", on_root,
         lambda: dist.scatter(block(), blocks() if rank == root else None, root, async_op=async_op)),
        ("reduce_scatter", size * b, lambda: dist.reduce_scatter(block(), blocks(), async_op=async_op)),
        ("reduce_scatter_tensor", size * b,
         lambda: dist.reduce_scatter_tensor(block(), np.ones(size * m, f), async_op=async_op)),
        ("all_to_all", size * b, lambda: dist.all_to_all(blocks(), blocks(), async_op=async_op)),
        ("all_to_all_single", size * b,
         lambda: dist.all_to_all_single(np.zeros(size * m, f), np.ones(size * m, f), async_op=async_op)),
    ]


def check_collectives(events, size, expected, async_op):
    """expected[r]: rank r's (name, bytes) in call order, numbered 1, 2, ... on the world group."""
    per_rank = [calls(events, r) for r in range(size)]
    for r in range(size):
        got = per_rank[r]
        expect_equal([(c["name"], c["bytes"]) for c in got], expected[r], f"rank {r}'s calls (name, bytes)")
        expect_equal([c["seq"] for c in got], list(range(1, len(got) + 1)), f"rank {r}'s numbers")
        for c in got:
            assert c["path"] in PATHS, f"rank {r}: {c['name']} #{c['seq']} names an unknown path {c['path']!r}"
            assert c["peer"] == -1 and c["end"] is not None and c["end"] >= c["ts"], (r, c)
            if not async_op:
                assert c["ph"] == "X", f"rank {r}: blocking {c['name']} #{c['seq']} is {c['ph']}, not a span"
            elif c["path"] in ("MPI", "persistent", "shm header + MPI", "shm header + ring", "shm header + pair"):
                # these return a pending Work: the span ends when it completes (a call through the slots
                # may be complete on return, and is then a span like a blocking one)
                assert c["ph"] == "b" and c.get("failed") == 0, f"rank {r}: async {c['name']} #{c['seq']}: {c}"
    for i in range(len(expected[0])):
        one = [per_rank[r][i] for r in range(size)]
        expect_equal(len({c["group"] for c in one}), 1, f"{one[0]['name']} #{i + 1}: group ids across ranks")
        expect_equal(len({c["path"] for c in one}), 1, f"{one[0]['name']} #{i + 1}: paths across ranks")
    expect_equal(len({c["group"] for c in per_rank[0]}), 1, "rank 0's group ids (one group)")


@pytest.mark.parametrize("m", [SMALL, LARGE], ids=["4B", "256KiB"])
@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_every_collective_is_one_numbered_span_per_rank(m, async_op):
    rank, size = dist.get_rank(), dist.get_world_size()

    def body():
        works = [run() for _, _, run in program(rank, size, m, async_op)]
        for w in works:
            if async_op:
                w.wait()
            else:
                assert w is None

    events = record(body)
    expected = [[(name, nbytes) for name, nbytes, _ in program(r, size, m, async_op)] for r in range(size)]
    check_on_root(events, lambda ev: check_collectives(ev, size, expected, async_op))


def test_async_calls_span_from_start_to_completion_waited_in_reverse():
    """Several async calls outstanding, waited last first: each is a b/e pair (or, done on return, a
    span) that starts at its call, in call order, and ends once pydist has seen it complete."""
    rank, size = dist.get_rank(), dist.get_world_size()
    arrays = [np.ones(LARGE, np.float32) for _ in range(4)]

    def body():
        works = [dist.all_reduce(a, async_op=True, algorithm=alg) for a, alg in zip(arrays, [None, "mpi", "ring", None])]
        for w in reversed(works):
            w.wait()

    events = record(body)

    def check(ev):
        for r in range(size):
            got = calls(ev, r)
            expect_equal([c["seq"] for c in got], [1, 2, 3, 4], f"rank {r}'s numbers in start order")
            expect_equal(got[1]["path"], "MPI", f"rank {r}: algorithm=\"mpi\"'s path")
            # (MPI's all-reduce where the library has no MPI_Isendrecv for the ring: Open MPI 4.1)
            expect_equal(got[2]["path"], "ring" if dist._C.mpi_info()["isendrecv"] else "MPI",
                         f"rank {r}: algorithm=\"ring\"'s path")
            for c in got:
                assert c["bytes"] == 4 * LARGE and c["end"] >= c["ts"], (r, c)
            assert got[1]["ph"] == "b", (r, got[1])
            if size > 1:   # a ring of one rank has nothing to send: done on return
                assert got[2]["ph"] == "b", (r, got[2])
    check_on_root(events, check)


# ---------------------------------------------------------------------------------------------------
# Each path names itself

def all_reduce_paths(size, one_node):
    """(name the test gives it, run, the path expected) for the all-reduces whose path is known."""
    x = np.ones(SMALL, np.float32)
    y = np.ones(LARGE, np.float32)
    z = dist.empty(LARGE)   # in the shared-memory segment: the shm all-reduce in place

    def small_off(run):
        def call():
            old = dist._C.set_shm_small_bytes(0)
            try:
                run()
            finally:
                dist._C.set_shm_small_bytes(old)
        return call

    several = size > 1 and one_node
    # past the slots: the header through them, the data copied through shm when the ranks' waits yield
    # (more ranks than cores), else by our ring when 2 ranks block in it, else by MPI's all-reduce
    crowded = not dist._C.mpi_info()["wait_spin"]
    pair = dist._C.mpi_info()["isendrecv"]   # the ring and the pair exchange need MPI_Isendrecv (not Open MPI 4.1)
    large = (("shm" if crowded else "shm header + ring" if size == 2 and pair else "shm header + MPI")
             if several else "MPI")
    # a broadcast, all-gather or all-to-all past the slots: at 2 ranks one point-to-point exchange
    moved = ("shm header + pair" if size == 2 and pair else "shm header + MPI") if several else "MPI"
    out = np.zeros(LARGE * size, np.float32)
    medium = np.ones(12 << 10, np.float32)   # 48 KiB: in the slots, but a 2-rank broadcast's pair path
    # small calls the slots do not carry: the persistent cache where it runs (MPICH), else MPI's calls
    cached = "persistent" if dist._C.mpi_info()["library_version"].startswith("MPICH Version:") else "MPI"
    return [
        ("large broadcast", lambda: dist.broadcast(y, 0), moved),
        ("large broadcast async", lambda: dist.broadcast(y, 0, async_op=True).wait(), moved),
        ("48 KiB broadcast", lambda: dist.broadcast(medium, 0),
         moved if size == 2 else "small shm" if several else "MPI"),
        ("large all_gather", lambda: dist.all_gather_into_tensor(out, y), moved),
        ("large all_to_all", lambda: dist.all_to_all_single(out, np.ones(LARGE * size, np.float32)), moved),
        ("small", lambda: dist.all_reduce(x), "small shm" if several else cached),
        ("small, slots off", small_off(lambda: dist.all_reduce(x)), cached),
        ("ring", lambda: dist.all_reduce(y, algorithm="ring"), "ring" if pair else "MPI"),
        ("mpi", lambda: dist.all_reduce(y, algorithm="mpi"), "MPI"),
        ("shm", lambda: dist.all_reduce(y, algorithm="shm"), "shm" if one_node else "MPI"),
        ("in the segment", lambda: dist.all_reduce(z), "shm" if several else "MPI"),
        ("large", lambda: dist.all_reduce(y), large),
        ("large async", lambda: dist.all_reduce(y, async_op=True).wait(), "shm header + MPI" if several else "MPI"),
    ]


def test_each_path_names_itself():
    size = dist.get_world_size()
    info = dist._C.shm_info()
    one_node = info["segment"] and info["node_size"] == size
    cases = all_reduce_paths(size, one_node)

    def body():
        for _, run, _ in cases:
            run()

    events = record(body)

    def check(ev):
        for r in range(size):
            got = [c["path"] for c in calls(ev, r)]
            expect_equal(got, [path for _, _, path in cases], f"rank {r}'s paths for {[n for n, _, _ in cases]}")
    check_on_root(events, check)


# ---------------------------------------------------------------------------------------------------
# Groups, point to point, and what is not a call

def test_each_group_numbers_its_own_collectives():
    rank, size = dist.get_rank(), dist.get_world_size()
    g = dist.new_group(list(range(size)))
    x = np.ones(SMALL, np.float32)
    try:
        def body():
            dist.all_reduce(x)
            dist.all_reduce(x, group=g)
            dist.broadcast(x, 0, group=g)
            dist.all_reduce(x)
        events = record(body)
    finally:
        dist.destroy_process_group(g)

    def check(ev):
        for r in range(size):
            got = [(c["name"], c["seq"], c["group"]) for c in calls(ev, r)]
            world, sub = got[0][2], got[1][2]
            assert world != sub, f"rank {r}: the world and the new group share the id {world}"
            expect_equal(got, [("all_reduce", 1, world), ("all_reduce", 1, sub), ("broadcast", 2, sub),
                               ("all_reduce", 2, world)], f"rank {r}'s (name, number, group)")
            if r > 0:
                expect_equal(got, [(c["name"], c["seq"], c["group"]) for c in calls(ev, 0)], f"rank {r} vs rank 0")
    check_on_root(events, check)


@pytest.mark.world_size(min=2)
def test_point_to_point_calls_carry_their_peer():
    """Ranks 0 and 1 exchange: blocking send/recv (one receive from anyone), then isend/irecv."""
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.zeros(5, np.int64)

    def body():
        if rank == 0:
            dist.send(x, 1)
            dist.recv(x, None)        # from anyone: the span names the sender
            works = [dist.isend(x, 1, tag=3), dist.irecv(x, 1, tag=4)]
        elif rank == 1:
            dist.recv(x, 0)
            dist.send(x, 0)
            works = [dist.irecv(x, 0, tag=3), dist.isend(x, 0, tag=4)]
        else:
            works = []
        for w in works:
            w.wait()

    events = record(body)

    def check(ev):
        want = {0: [("send", 1, "X"), ("recv", 1, "X"), ("isend", 1, "b"), ("irecv", 1, "b")],
                1: [("recv", 0, "X"), ("send", 0, "X"), ("irecv", 0, "b"), ("isend", 0, "b")]}
        for r in range(size):
            got = calls(ev, r)
            expect_equal([(c["name"], c["peer"], c["ph"]) for c in got], want.get(r, []), f"rank {r}'s calls")
            for c in got:
                assert c["seq"] == 0 and c["bytes"] == 40 and c["path"] == "MPI" and c["end"] >= c["ts"], (r, c)
        expect_equal(calls(ev, 0)[0]["group"], calls(ev, 1)[0]["group"], "the world's id on ranks 0 and 1")
    check_on_root(events, check)


def test_failed_checks_and_checks_only_passes_are_not_calls():
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.ones(3, np.float32)

    def body():
        with pytest.raises(TypeError):
            dist.all_reduce(x, op=dist.ReduceOp.BXOR)   # BXOR on float: refused before anything is sent
        with pytest.raises(ValueError):
            dist.all_gather_into_tensor(np.zeros(3 * size + 1, np.float32), x)
        old = dist._C.set_validate_only(True)   # PYDIST_DEBUG=DETAIL's first pass
        try:
            dist._C.all_reduce(x, int(dist.ReduceOp.SUM), 0, False)
            dist._C.barrier(0, False)
        finally:
            dist._C.set_validate_only(old)
        dist.all_reduce(x)

    events = record(body)

    def check(ev):
        for r in range(size):
            expect_equal([(c["name"], c["seq"]) for c in calls(ev, r)], [("all_reduce", 1)], f"rank {r}'s calls")
    check_on_root(events, check)
