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
