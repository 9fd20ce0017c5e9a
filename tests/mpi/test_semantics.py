"""What every path promises (issue 25, DESIGN.md "Semantics every path keeps"), each defect the review
found turned into a test, run on the paths a call can take: the automatic choice, the small
collectives off (_C.set_shm_small_bytes(0): persistent requests and MPI's), shared memory off
(PYDIST_SHM_BYTES=0 at init) and the persistent cache off (PYDIST_PERSISTENT_BYTES=0 at init).

- async_op=True returns without waiting for any other rank: a program that completes with MPI's
  nonblocking collectives completes here, a group's first call and a large all-reduce included;
- any number of async small collectives may be outstanding (the small path had 4 slots);
- calls that do not match across a path's threshold raise ValueError on every rank, and the group
  stays usable;
- Ctrl-C in a group's first collective leaves the group usable on every rank.
"""
import _thread
import contextlib
import os
import threading

import numpy as np
import pytest

import pydist as dist
from pydist import _C
from helpers import parallel_assert

TIMEOUT_S = 60.0


@contextlib.contextmanager
def path(name):
    """Run the body with the session set up for one path (every rank alike)."""
    env = {"shm off": "PYDIST_SHM_BYTES", "persistent off": "PYDIST_PERSISTENT_BYTES"}.get(name)
    old_small = None
    if env is not None:
        dist.destroy_process_group()
        os.environ[env] = "0"
        dist.init_process_group(backend="mpi", timeout=TIMEOUT_S)
    elif name == "small off":
        old_small = _C.set_shm_small_bytes(0)
    try:
        yield
    finally:
        if old_small is not None:
            _C.set_shm_small_bytes(old_small)
        if env is not None:
            del os.environ[env]
            dist.destroy_process_group()
            dist.init_process_group(backend="mpi", timeout=TIMEOUT_S)


PATHS = ["automatic", "small off", "shm off", "persistent off"]
DEEP = 9   # outstanding async calls of one key: past the small path's 4 slots and the cache's 4 entries


def send_between(arrays, group, k_async):
    """Rank 0: k async all-reduces, then a send to rank 1, then the waits; rank 1: the receive first,
    then the same all-reduces blocking; the others: blocking. Valid with MPI's nonblocking calls."""
    rank, size = dist.get_rank(), dist.get_world_size()
    token = np.zeros(3, np.int32)
    if rank == 0:
        works = [dist.all_reduce(a, group=group, async_op=True) for a in arrays[:k_async]]
        dist.send(token + 7, 1)
        for a in arrays[k_async:]:
            dist.all_reduce(a, group=group)
        for w in reversed(works):   # in any order
            w.wait()
    elif rank == 1:
        dist.recv(token, 0)
        for a in arrays:
            dist.all_reduce(a, group=group)
    else:
        for a in arrays:
            dist.all_reduce(a, group=group)
    return rank != 1 or np.all(token == 7)


@pytest.mark.world_size(min=2)
@pytest.mark.parametrize("name", PATHS)
@pytest.mark.parametrize("n", [2, 20_000, 300_000])
def test_async_never_waits_for_the_peers(name, n):
    """The review's item 2: rank 0's async all_reduce, then its send, then its wait; rank 1 receives
    first. It timed out on a group's first call, for 64 KiB-32 MiB, and (item 3) at 5 outstanding."""
    rank, size = dist.get_rank(), dist.get_world_size()
    with path(name):
        group = dist.new_group(list(range(size)))   # its first call, too
        for k in (1, DEEP if n == 2 else 3):
            arrays = [np.full(n, 1.0 + rank + 10 * i, np.float32) for i in range(k)]
            ok = send_between(arrays, group, k)
            want = [sum(1.0 + r + 10 * i for r in range(size)) for i in range(k)]
            ok &= all(np.all(a == w) for a, w in zip(arrays, want))
            parallel_assert(ok, f"{name} n={n} k={k}: {[a[0] for a in arrays]} want {want}")
        dist.destroy_process_group(group)


@pytest.mark.world_size(min=2)
@pytest.mark.parametrize("name", ["automatic", "persistent off"])
def test_async_first_call_of_every_kind_never_waits(name):
    """The group's first call of each collective, async on rank 0 while rank 1 first waits for a
    message from rank 0: the channel and the private communicator are made with the group."""
    rank, size = dist.get_rank(), dist.get_world_size()
    calls = {
        "barrier": lambda g, a: dist.barrier(group=g, async_op=a),
        "broadcast": lambda g, a: dist.broadcast(np.full(5, rank, np.int64), 0, group=g, async_op=a),
        "all_reduce ring": lambda g, a: dist.all_reduce(np.ones(9), group=g, async_op=a, algorithm="ring"),
        "all_gather_into_tensor": lambda g, a: dist.all_gather_into_tensor(np.zeros(3 * size), np.ones(3),
                                                                           group=g, async_op=a),
    }
    with path(name):
        problems = []
        for what, call in calls.items():
            group = dist.new_group(list(range(size)))
            token = np.zeros(1)
            if rank == 0:
                w = call(group, True)
                dist.send(token, 1)
                w.wait()
            else:
                if rank == 1:
                    dist.recv(token, 0)
                call(group, False)
            dist.destroy_process_group(group)
        parallel_assert(not problems, f"{problems}")


@pytest.mark.world_size(min=2)
@pytest.mark.parametrize("counts", [(16384, 16383), (16383, 16384), (16384, 16400)])
def test_mismatch_across_the_small_bound_raises_everywhere(counts):
    """The review's item 8: 16384 float32 on rank 0 (past the small bound) and 16383 elsewhere (the small
    collectives) waited forever; now every rank raises ValueError and the group still works."""
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.ones(counts[0] if rank == 0 else counts[1], np.float32)
    with pytest.raises(ValueError, match="do not match"):
        dist.all_reduce(x)
    ok = np.all(x == 1)   # nothing was written
    y = np.full(20_000, rank + 1.0)
    dist.all_reduce(y)
    z = np.full(3, rank + 1.0)
    dist.all_reduce(z)
    total = size * (size + 1) / 2
    parallel_assert(ok and np.all(y == total) and np.all(z == total), f"{y[0]} {z[0]}")


@pytest.mark.world_size(min=2)
@pytest.mark.parametrize("n", [2, 20_000])
def test_ctrl_c_in_a_groups_first_collective_leaves_it_usable(n):
    """The review's item 4: Ctrl-C on rank 0 while it waits for the others in a new group's first
    collective. The group stays usable on every rank (the interrupted call completes later, in order)
    and nobody waits forever."""
    rank, size = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(size)))
    x = np.full(n, rank + 1.0)
    interrupted = False
    if rank == 0:
        timer = threading.Timer(0.3, _thread.interrupt_main)
        timer.start()
        try:
            dist.all_reduce(x, group=group)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            timer.cancel()
        dist.send(np.zeros(1), 1)   # only now do the others join
    elif rank == 1:
        dist.recv(np.zeros(1), 0)
        dist.all_reduce(x, group=group)
    else:
        dist.all_reduce(x, group=group)
    dist.barrier(group=group)   # on rank 0 this completes the interrupted call first
    y = np.full(n, rank + 1.0)
    dist.all_reduce(y, group=group)
    total = size * (size + 1) / 2
    ok = np.all(y == total) and np.all(x == total) and (interrupted or rank != 0)
    dist.destroy_process_group(group)
    parallel_assert(ok, f"interrupted={interrupted} x={x[0]} y={y[0]}")


@pytest.mark.world_size(min=2)
@pytest.mark.parametrize("name", PATHS)
def test_deferred_small_calls_and_a_large_one_in_between(name):
    """Rank 0 queues more async small all-reduces of one key than a path has slots or cached requests
    (their starts deferred until earlier ones complete), then a large async all-reduce that starts at
    once, then a send; rank 1 receives first, then makes the same calls blocking. The deferred starts
    must still match the peers' calls (MPICH matches a persistent request's starts by the request)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    with path(name):
        small = [np.full(3, rank + 1.0 + i) for i in range(DEEP)]
        large = np.full(100_000, rank + 1.0)
        token = np.zeros(1)
        if rank == 0:
            works = [dist.all_reduce(a, async_op=True) for a in small]
            works.append(dist.all_reduce(large, async_op=True))
            dist.send(token, 1)
            for w in works[::-1]:
                w.wait()
        else:
            if rank == 1:
                dist.recv(token, 0)
            for a in small:
                dist.all_reduce(a)
            dist.all_reduce(large)
        total = size * (size + 1) / 2
        ok = np.all(large == total) and all(np.all(a == total + size * i) for i, a in enumerate(small))
        parallel_assert(ok, f"{name}: {[a[0] for a in small]} {large[0]}")


@pytest.mark.world_size(min=2)
@pytest.mark.parametrize("nbytes", [8, 4096])
def test_small_broadcast_root_does_not_wait_and_hears_of_a_mismatch_later(nbytes):
    """A small broadcast's root returns without waiting for its peers (MPI_Bcast's may), so a peer
    that is late does not hold it up; when a peer's call did not match, the peer raises ValueError at
    once and the root at its next call on the group, naming the broadcast (issue 25)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.full(nbytes // 8, rank + 1.0)
    token = np.zeros(1)
    if rank == 0:
        dist.broadcast(x, 0)       # returns although rank 1 has not called it yet
        dist.send(token, 1)
    elif rank == 1:
        dist.recv(token, 0)
        dist.broadcast(x, 0)
    else:
        dist.broadcast(x, 0)
    ok = np.all(x == 1.0)
    # Now a mismatch: the last rank broadcasts one element more. The root raises exactly once: at the
    # broadcast when the peers had already called it, else at one of its next calls (by the time it
    # reuses the slot at the latest); the others at the broadcast.
    y = np.zeros(nbytes // 8 + (rank == size - 1))
    errors = []
    try:
        dist.broadcast(y, 0)
    except ValueError as e:
        errors.append(str(e))
    for _ in range(8):
        try:
            dist.barrier()
        except ValueError as e:
            errors.append(str(e))
    ok &= len(errors) == 1 and "do not match" in errors[0]
    z = np.full(3, rank + 1.0)
    dist.all_reduce(z)
    parallel_assert(ok and np.all(z == size * (size + 1) / 2), f"{x[:2]} {z}")


KINDS = ["broadcast", "reduce", "all_gather_into_tensor", "all_gather", "gather", "scatter",
         "reduce_scatter_tensor", "reduce_scatter", "all_to_all_single", "all_to_all"]
LARGE, SMALL = 10_000, 100   # float64 elements per rank's block: past the small bound (64 KiB), and under


def block(r, j, n):
    """Rank r's block for rank j (or its only one, j = 0): values nobody else has."""
    return np.arange(n, dtype=np.float64) + 1000.0 * r + 10.0 * j


def collective(kind, n, async_op=False):
    """Collective `kind` with blocks of n float64 on this rank: (what it wrote, NumPy's answer)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    mine = [block(rank, j, n) for j in range(size)]
    sent_to_me = [block(r, rank, n) for r in range(size)]

    def run(call, result, expect):
        w = call(async_op)
        if async_op:
            w.wait()
        return np.concatenate(result) if isinstance(result, list) else result, expect

    if kind == "broadcast":
        x = block(rank, 0, n)
        return run(lambda a: dist.broadcast(x, 0, async_op=a), x, block(0, 0, n))
    if kind == "reduce":
        x = block(rank, 0, n)
        want = sum(block(r, 0, n) for r in range(size)) if rank == 0 else block(rank, 0, n)
        return run(lambda a: dist.reduce(x, 0, async_op=a), x, want)
    if kind == "all_gather_into_tensor":
        out = np.zeros(n * size)
        return run(lambda a: dist.all_gather_into_tensor(out, mine[0], async_op=a), out,
                   np.concatenate([block(r, 0, n) for r in range(size)]))
    if kind == "all_gather":
        outs = [np.zeros(n) for _ in range(size)]
        return run(lambda a: dist.all_gather(outs, mine[0], async_op=a), outs,
                   np.concatenate([block(r, 0, n) for r in range(size)]))
    if kind == "gather":
        outs = [np.zeros(n) for _ in range(size)] if rank == 0 else None
        want = np.concatenate([block(r, 0, n) for r in range(size)]) if rank == 0 else np.zeros(0)
        return run(lambda a: dist.gather(mine[0], outs, 0, async_op=a), outs or np.zeros(0), want)
    if kind == "scatter":
        out = np.zeros(n)
        return run(lambda a: dist.scatter(out, mine if rank == 0 else None, 0, async_op=a), out, block(0, rank, n))
    if kind == "reduce_scatter_tensor":
        out = np.zeros(n)
        return run(lambda a: dist.reduce_scatter_tensor(out, np.concatenate(mine), async_op=a), out,
                   sum(sent_to_me))
    if kind == "reduce_scatter":
        out = np.zeros(n)
        return run(lambda a: dist.reduce_scatter(out, mine, async_op=a), out, sum(sent_to_me))
    if kind == "all_to_all_single":
        out = np.zeros(n * size)
        return run(lambda a: dist.all_to_all_single(out, np.concatenate(mine), async_op=a), out,
                   np.concatenate(sent_to_me))
    outs = [np.zeros(n) for _ in range(size)]
    return run(lambda a: dist.all_to_all(outs, mine, async_op=a), outs, np.concatenate(sent_to_me))


@pytest.mark.world_size(min=2)
@pytest.mark.parametrize("kind", KINDS)
def test_every_collective_past_the_small_bound_matches_numpy(kind):
    """Past the small bound a call's header goes through the slots and its data through MPI on the
    group's private communicator: the results are NumPy's, blocking and async, beside small calls."""
    problems = []
    for n, async_op in [(LARGE, False), (LARGE, True), (SMALL, True), (LARGE, False)]:
        got, want = collective(kind, n, async_op)
        if not np.array_equal(got, want):
            problems.append((n, async_op))
    parallel_assert(not problems, f"{kind}: {problems}")


def errors_from(call, later=8):
    """ValueErrors of `call` and of the barriers after it (a small broadcast's root hears later)."""
    errors = []
    try:
        call()
    except ValueError as e:
        errors.append(str(e))
    for _ in range(later):
        try:
            dist.barrier()
        except ValueError as e:
            errors.append(str(e))
    return errors


@pytest.mark.world_size(min=2)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rank0", ["large", "small"])
def test_mismatch_of_every_collective_across_the_small_bound_raises_everywhere(kind, rank0):
    """Rank 0 past the small bound and the others under it (or the other way round): every rank
    raises ValueError once (a small broadcast's root at a later call), and the group stays usable."""
    rank = dist.get_rank()
    n = LARGE if (rank == 0) == (rank0 == "large") else SMALL
    errors = errors_from(lambda: collective(kind, n))
    ok = len(errors) == 1 and "do not match" in errors[0]
    results = [collective(kind, m) for m in (LARGE, SMALL)]
    ok &= all(np.array_equal(got, want) for got, want in results)
    parallel_assert(ok, f"{kind}: {errors}")


@pytest.mark.world_size(min=2)
@pytest.mark.parametrize("kind", ["gather", "all_gather", "scatter", "all_to_all"])
def test_different_collectives_raise_everywhere(kind):
    """Rank 0 in a list-form collective (which the slots never carry) while the others all-reduce a
    small array: MPI would hang; every rank raises ValueError, and the group stays usable."""
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.full(4, rank + 1.0)
    errors = errors_from(lambda: collective(kind, 4) if rank == 0 else dist.all_reduce(x))
    ok = len(errors) == 1 and "do not match" in errors[0] and np.all(x == rank + 1.0)
    dist.all_reduce(x)
    got, want = collective(kind, 4)
    parallel_assert(ok and np.all(x == size * (size + 1) / 2) and np.array_equal(got, want), f"{errors}")


def uneven_splits(k):
    """all_to_all_single's split sizes: rank 0 sends and receives k rows everywhere (no split sizes
    given); ranks i, j >= 1 exchange k + (i + j) % 3 rows (uneven)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    rows = [k if 0 in (rank, j) else k + (rank + j) % 3 for j in range(size)]
    return rows   # symmetric: what rank sends j is what j receives from rank


@pytest.mark.world_size(min=2)
@pytest.mark.parametrize("name", ["automatic", "small off"])
def test_all_to_all_single_uneven_beside_no_split_sizes(name):
    """A rank without split sizes beside ranks with uneven ones is a valid alltoallv: it completes with
    NumPy's answer on every path and size, although the slots carry equal blocks that are small (the
    ranks all take MPI's alltoallv then); the list form beside the single one too."""
    rank, size = dist.get_rank(), dist.get_world_size()
    with path(name):
        problems = []
        for k in (LARGE, SMALL, 0):
            rows = uneven_splits(k)
            src = np.concatenate([block(rank, j, rows[j]) for j in range(size)])
            out = np.zeros(sum(rows))
            want = np.concatenate([block(r, rank, rows[r]) for r in range(size)])
            splits = None if rank == 0 else rows
            dist.all_to_all_single(out, src, splits, splits)
            if not np.array_equal(out, want):
                problems.append((k, out[:3], want[:3]))
        for k in (LARGE, SMALL):
            mine = [block(rank, j, k) for j in range(size)]
            want = np.concatenate([block(r, rank, k) for r in range(size)])
            if rank == 0:
                outs = [np.zeros(k) for _ in range(size)]
                dist.all_to_all(outs, mine)
                got = np.concatenate(outs)
            else:
                got = np.zeros(k * size)
                dist.all_to_all_single(got, np.concatenate(mine))
            if not np.array_equal(got, want):
                problems.append(("list", k))
        x = np.full(3, rank + 1.0)
        dist.all_reduce(x)
        parallel_assert(not problems and np.all(x == size * (size + 1) / 2), f"{problems}")
