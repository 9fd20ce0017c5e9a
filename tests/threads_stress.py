"""Many threads, one process (issue 45, part 2): 8 threads issue collectives on 4 groups at once, and
point-to-point calls on any group, checked against NumPy.

MPI_THREAD_MULTIPLE lets threads call MPI at once; what MPI leaves to the program is the order of a
group's collectives, which must be the same on every rank. So the program is one schedule, drawn from
a seed alike on every rank: call i is made by thread t_i on group g_i. Each group's collectives are
issued in schedule order (a turn per group: a thread waits for its call's turn, makes the call, passes
the turn on once the call returns); calls on different groups, and point-to-point calls (a tag of
their own each), run at the same time in whichever threads get there. Every call's kind, size, dtype,
path (the small collectives' shared-memory slots or the persistent cache, pydist's shm all-reduce,
its ring, MPI's call) and async_op are drawn too. Every rank rebuilds every member's input from the
seed and checks each result against NumPy: bitwise, since the inputs are small integers.

The same run records a timeline: rank 0 checks that every rank's calls are all in it (each thread
appends to its own buffer) and that the calls took each path they should.

    mpiexec -n 3 python tests/threads_stress.py --calls 50000 --seed 7      # a soak
    mpiexec -n 2 python tests/threads_stress.py --slots off                  # the persistent cache

make test runs a bounded set at 2 and 3 ranks (tests/mpi/test_threads.py).
"""
import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import traceback

import numpy as np

import pydist as dist

THREADS, GROUPS = 8, 4
DTYPES = (np.float32, np.float64, np.int32, np.int64)
# Elements per rank (a block): the slots' sizes, the persistent cache's (up to 8 KiB), and past the
# slots' 64 KiB (MPI's calls, pydist's shm all-reduce and its ring).
COUNTS = (1, 3, 64, 700, 2048, 20000, 70000)
KINDS = ("all_reduce", "all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "barrier", "p2p",
         "p2p")
ALGORITHMS = (None, None, "ring", "shm", "mpi")
TURN_SECONDS = 300.0   # a hang guard: no turn takes this long unless a peer is gone
ECHO = False           # print each error as it happens (the script does; the tests read the summary)


def group_members(world):
    """The 4 groups' world ranks: the whole world, and three that overlap it (one of a 2-rank world is
    also the whole world, on communicators of its own)."""
    ranks = list(range(world))
    return [ranks, ranks[:2], ranks[-2:], ranks[1:] if world > 2 else ranks]


class Call:
    __slots__ = ("index", "thread", "group", "kind", "count", "dtype", "async_op", "algorithm", "op", "root")


def schedule(seed, calls, world):
    """The program every rank draws alike: a list of Calls in one global order."""
    rng = random.Random(seed)
    out = []
    for i in range(calls):
        c = Call()
        c.index, c.thread, c.group = i, rng.randrange(THREADS), rng.randrange(GROUPS)
        c.kind, c.count, c.dtype = rng.choice(KINDS), rng.choice(COUNTS), rng.choice(DTYPES)
        c.async_op = rng.random() < 0.3
        c.algorithm = rng.choice(ALGORITHMS) if c.kind == "all_reduce" else None
        c.op = rng.choice(("sum", "max")) if c.kind == "all_reduce" and c.algorithm is None else "sum"
        c.root = rng.randrange(len(group_members(world)[c.group]))   # a group rank
        out.append(c)
    return out


def block(seed, call, world_rank, count=None):
    """World rank `world_rank`'s input to `call`: small integers, so any order of sums is exact."""
    rng = np.random.default_rng([seed, call.index, world_rank])
    return rng.integers(-9, 10, count or call.count).astype(call.dtype)


def expected(seed, call, members, me):
    """What group rank `me` of `members` must hold after `call`, from every member's input."""
    k = call.count
    if call.kind == "all_reduce":
        ins = np.stack([block(seed, call, w) for w in members])
        return (ins.sum(axis=0) if call.op == "sum" else ins.max(axis=0)).astype(call.dtype)
    if call.kind == "broadcast":
        return block(seed, call, members[call.root])
    if call.kind == "all_gather":
        return np.concatenate([block(seed, call, w) for w in members])
    n = len(members)
    if call.kind == "reduce_scatter":
        total = np.stack([block(seed, call, w, k * n) for w in members]).sum(axis=0).astype(call.dtype)
        return total[me * k:(me + 1) * k]
    if call.kind == "all_to_all":
        return np.concatenate([block(seed, call, w, k * n)[me * k:(me + 1) * k] for w in members])
    if call.kind == "p2p":
        return block(seed, call, members[(me - 1) % n])
    return None   # barrier


def issue(seed, call, group, members, me, world_rank):
    """Make `call` on this rank: returns (the Work or None, the arrays to check, what they must hold),
    the arrays being those MPI writes into."""
    k, n = call.count, len(members)
    want = expected(seed, call, members, me)
    if call.kind == "all_reduce":
        if call.algorithm == "shm":   # from pydist's allocator: reduced in place in the shared segment
            x = dist.empty(k, np.dtype(call.dtype).name, group=group)
            x[...] = block(seed, call, world_rank)
        else:
            x = block(seed, call, world_rank)
        op = dist.ReduceOp.SUM if call.op == "sum" else dist.ReduceOp.MAX
        return dist.all_reduce(x, op, group, call.async_op, algorithm=call.algorithm), [x], [want]
    if call.kind == "broadcast":
        x = block(seed, call, world_rank) if me == call.root else np.zeros(k, call.dtype)
        return dist.broadcast(x, members[call.root], group, call.async_op), [x], [want]
    if call.kind == "all_gather":
        out = np.zeros(k * n, call.dtype)
        return dist.all_gather_into_tensor(out, block(seed, call, world_rank), group, call.async_op), [out], [want]
    if call.kind == "reduce_scatter":
        out = np.zeros(k, call.dtype)
        work = dist.reduce_scatter_tensor(out, block(seed, call, world_rank, k * n), group=group,
                                          async_op=call.async_op)
        return work, [out], [want]
    if call.kind == "all_to_all":
        out = np.zeros(k * n, call.dtype)
        work = dist.all_to_all_single(out, block(seed, call, world_rank, k * n), group=group, async_op=call.async_op)
        return work, [out], [want]
    if call.kind == "barrier":
        return dist.barrier(group, call.async_op), [], []
    # p2p: to the next group rank, from the previous, on a tag of this call's own
    out = np.zeros(k, call.dtype)
    tag = call.index % 32768
    recv = dist.irecv(out, members[(me - 1) % n], group, tag)
    send = dist.isend(block(seed, call, world_rank), members[(me + 1) % n], group, tag)
    return (send, recv), [out], [want]


class Turns:
    """Each group's collectives, one at a time, in schedule order."""

    def __init__(self, order):
        self.order = order                 # group -> the indices of its collectives, in order
        self.next = {g: 0 for g in order}  # group -> position of the call whose turn it is
        self.cond = threading.Condition()
        self.failed = False                # a thread failed: the others stop at their next turn

    def wait(self, g, index):
        with self.cond:
            if not self.cond.wait_for(lambda: self.failed or self.order[g][self.next[g]] == index, TURN_SECONDS):
                raise TimeoutError(f"call {index} on group {g} waited {TURN_SECONDS:g} s for its turn")
            if self.failed:
                raise RuntimeError("stopped: another thread failed")

    def fail(self):
        with self.cond:
            self.failed = True
            self.cond.notify_all()

    def done(self, g):
        with self.cond:
            self.next[g] += 1
            self.cond.notify_all()


def run(seed=1, calls=4000, slots=True, record=None):
    """The stress on this rank, in an initialised world of 2 or more ranks. Returns a summary dict;
    raises AssertionError on every rank if any rank saw a wrong result or an error.
    record: a folder every rank shares, to record the timeline into (None: no timeline)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    members = group_members(world)
    groups = [dist.new_group(m) for m in members]
    program = schedule(seed, calls, world)
    mine = [c for c in program if rank in members[c.group]]
    order = {g: [c.index for c in mine if c.group == g and c.kind != "p2p"] for g in range(GROUPS)}
    for g in order:
        order[g].append(-1)   # (past the end: nobody's turn)
    turns = Turns(order)
    errors, checked = [], [0] * THREADS
    old_small = None if slots else dist._C.set_shm_small_bytes(0)

    def error(message):
        errors.append(message)
        if ECHO:   # a soak's failure, as it happens (the summary at the end is the first five)
            print(message, file=sys.stderr, flush=True)

    def check(c, arrays, wants, t):
        for got, want in zip(arrays, wants):
            if not np.array_equal(got, want):
                error(f"rank {rank} call {c.index} ({c.kind} {c.count} x {np.dtype(c.dtype).name} "
                              f"algorithm={c.algorithm} async={c.async_op} group {c.group}, thread {t}): "
                              f"got {got[:6]} want {want[:6]}")
        checked[t] += 1

    def thread(t):
        pending = []   # (call, work(s), arrays, wants), async calls not yet waited for
        rng = random.Random(seed * 1000 + t)   # when to wait: this rank's own choice, it need not agree
        try:
            for c in (c for c in mine if c.thread == t):
                g, me = groups[c.group], members[c.group].index(rank)
                if c.kind != "p2p":
                    turns.wait(c.group, c.index)
                try:
                    work, arrays, wants = issue(seed, c, g, members[c.group], me, rank)
                finally:
                    if c.kind != "p2p":
                        turns.done(c.group)
                if c.kind == "p2p" or c.async_op:
                    pending.append((c, work, arrays, wants))
                else:
                    check(c, arrays, wants, t)
                while pending and (len(pending) > 3 or rng.random() < 0.4):
                    pc, pw, pa, pwant = pending.pop(rng.randrange(len(pending)))
                    for w in pw if isinstance(pw, tuple) else (pw,):
                        w.wait(timeout=TURN_SECONDS)
                    check(pc, pa, pwant, t)
            for pc, pw, pa, pwant in pending:
                for w in pw if isinstance(pw, tuple) else (pw,):
                    w.wait(timeout=TURN_SECONDS)
                check(pc, pa, pwant, t)
        except BaseException:
            if not turns.failed:
                error(f"rank {rank} thread {t}: {traceback.format_exc()}")
            turns.fail()

    start = time.perf_counter()
    where = None
    if record is not None:
        where = os.path.join(record, f"stress-{seed}-{int(slots)}.json")
        recording = dist.timeline(where)
        recording.__enter__()
    try:
        threads = [threading.Thread(target=thread, args=(t,), name=f"stress {t}") for t in range(THREADS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        if record is not None:
            recording.__exit__(None, None, None)
        if old_small is not None:
            dist._C.set_shm_small_bytes(old_small)
    seconds = time.perf_counter() - start

    # Every rank fails together, with every rank's first errors.
    found = [errors[:5]]
    gathered = [None] * world
    dist.all_gather_object(gathered, found[0])
    bad = [e for es in gathered for e in es]
    if bad:
        raise AssertionError("\n".join(bad))
    summary = {"ranks": world, "calls": len(program), "mine": len(mine), "checked": sum(checked),
               "seconds": round(seconds, 2), "slots": slots}
    if sum(checked) != len(mine):
        raise AssertionError(f"rank {rank}: {sum(checked)} calls checked of {len(mine)}")
    if where is not None and rank == 0:
        summary["paths"] = check_timeline(where, program, members)
    for g in groups:
        dist.destroy_process_group(g)
    return summary


def check_timeline(path, program, members):
    """Rank 0, on the merged trace: each rank's comm calls are all there, and the paths they took.
    Returns {path: calls} over every rank."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    paths = {}
    for r in range(len(members[0])):
        comm = [e for e in events if e["pid"] == r and e.get("cat") == "comm" and e["ph"] in "Xb"]
        # a p2p call is two calls (irecv, isend)
        want = sum(2 if c.kind == "p2p" else 1 for c in program if r in members[c.group])
        if len(comm) != want:
            raise AssertionError(f"timeline: rank {r} has {len(comm)} calls recorded, made {want}")
        for e in comm:
            paths[e["args"]["path"]] = paths.get(e["args"]["path"], 0) + 1
    return paths


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=4000, help="calls in the schedule (default 4000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1, help="schedules, seeds seed, seed+1, ...")
    parser.add_argument("--slots", choices=("on", "off", "both"), default="both",
                        help="the small collectives' shared-memory slots (off: the persistent cache)")
    parser.add_argument("--timeline", action="store_true", help="record each round and check the trace")
    args = parser.parse_args()
    global ECHO
    ECHO = True
    dist.init_process_group(timeout=TURN_SECONDS)
    if dist.get_world_size() < 2:
        sys.exit("threads_stress.py: run it under mpiexec with 2 or more ranks")
    record = None
    if args.timeline:
        box = [tempfile.mkdtemp(prefix="pydist-stress-") if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, 0)
        record = box[0]
    try:
        for r in range(args.rounds):
            for slots in ((True, False) if args.slots == "both" else (args.slots == "on",)):
                summary = run(args.seed + r, args.calls, slots, record)
                if dist.get_rank() == 0:
                    print(json.dumps(summary), flush=True)
    finally:
        dist.barrier()
        if record is not None and dist.get_rank() == 0:
            shutil.rmtree(record, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
