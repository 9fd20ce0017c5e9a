"""Small collectives in shared memory (csrc/paths/algorithms/shm_small.c), which every collective of a group
within one node takes up to _C.shm_info()["small_bytes"] per rank: each collective against an
independent NumPy reference on both sides of the bound, every dtype x op of all_reduce, the counter
that says the path was taken (and that 0 turns it off), async calls more than the slots in flight and
waited out of order, an async call that a point-to-point message overtakes (no deadlock, as with MPI's
nonblocking collectives), a wait's own timeout leaving the call pending, a mismatch (a ValueError on
every rank, the channel still in step), and a group destroyed under a pending call."""
import time

import numpy as np
import pytest

import pydist as dist
from helpers import DTYPES, OPS, make_input, parallel_assert, reference, valid


def small_calls():
    return dist._C.shm_info()["calls_small"]


def bound():
    return dist._C.shm_info()["small_bytes"]


@pytest.fixture(autouse=True)
def small_on():
    old = dist._C.set_shm_small_bytes(64 * 1024)
    yield
    dist._C.set_shm_small_bytes(old)


def taken(before, calls):
    """Whether `calls` calls went through the small path (a group of one never does: MPI's no-op)."""
    return small_calls() - before == (calls if dist.get_world_size() > 1 else 0)


def test_small_all_reduce_every_dtype_and_op():
    rank, size = dist.get_rank(), dist.get_world_size()
    wrong, before, calls = [], small_calls(), 0
    for dtype in DTYPES:
        for op in OPS:
            if not valid(op, dtype):
                continue
            for n in (0, 1, 7, 1001):
                x = make_input(5, rank, (n,), dtype, op)
                dist.all_reduce(x, op=op)
                calls += 1
                expected = reference(op, [make_input(5, r, (n,), dtype, op) for r in range(size)])
                if not (x.dtype == expected.dtype and np.array_equal(x, expected, equal_nan=True)):
                    wrong.append((dtype, str(op), n))
    parallel_assert(not wrong and taken(before, calls), f"{wrong[:5]} {small_calls() - before} of {calls}")


@pytest.mark.parametrize("nbytes_per_rank", [8, 4096, 64 * 1024, 64 * 1024 + 8])
def test_small_collectives_against_numpy(nbytes_per_rank):
    """Every collective, up to the bound (the small path) and just above it (MPI's): the same results."""
    rank, size = dist.get_rank(), dist.get_world_size()
    n = nbytes_per_rank // 8
    inputs = [np.arange(n, dtype=np.float64) * (r + 1) + r for r in range(size)]
    before = small_calls()
    problems = []

    x = inputs[rank].copy()
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    problems += [] if np.array_equal(x, np.maximum.reduce(inputs)) else ["all_reduce"]

    b = inputs[rank].copy()
    dist.broadcast(b, size - 1)
    problems += [] if np.array_equal(b, inputs[size - 1]) else ["broadcast"]

    r = inputs[rank].copy()
    dist.reduce(r, 0, op=dist.ReduceOp.SUM)
    want = sum(inputs) if rank == 0 else inputs[rank]
    problems += [] if np.allclose(r, want, rtol=0, atol=0) else ["reduce"]

    out = np.empty(n * size)
    dist.all_gather_into_tensor(out, inputs[rank])
    problems += [] if np.array_equal(out, np.concatenate(inputs)) else ["all_gather_into_tensor"]

    m = max(n // size, 1)   # reduce-scatter and all-to-all send size blocks of m elements per rank
    blocks = [np.arange(m * size, dtype=np.float64) * (p + 2) for p in range(size)]
    rs = np.empty(m)
    dist.reduce_scatter_tensor(rs, blocks[rank], op=dist.ReduceOp.SUM)
    problems += [] if np.array_equal(rs, sum(blocks)[rank * m:(rank + 1) * m]) else ["reduce_scatter_tensor"]

    a2a = np.empty(m * size)
    dist.all_to_all_single(a2a, blocks[rank])
    want = np.concatenate([blocks[p][rank * m:(rank + 1) * m] for p in range(size)])
    problems += [] if np.array_equal(a2a, want) else ["all_to_all_single"]

    dist.barrier()
    # Reduce-scatter and all-to-all contribute m x size elements, the others n; the barrier nothing.
    # A 2-rank broadcast past pair_broadcast_bytes goes as one MPI message instead.
    bcast_small = n * 8 <= bound() and (size != 2 or n * 8 <= dist._C.shm_info()["pair_broadcast_bytes"])
    small = [n * 8 <= bound(), bcast_small, n * 8 <= bound(), n * 8 <= bound()] + [m * size * 8 <= bound()] * 2 + [True]
    parallel_assert(not problems and taken(before, sum(small)), f"{problems} {small_calls() - before} {small}")


def test_zero_turns_the_small_path_off():
    rank, size = dist.get_rank(), dist.get_world_size()
    dist._C.set_shm_small_bytes(0)
    before = small_calls()
    x = np.full(3, rank + 1.0)
    dist.all_reduce(x)
    dist.barrier()
    parallel_assert(small_calls() == before and np.all(x == size * (size + 1) / 2), f"{x}")


def test_async_calls_beyond_the_slots_waited_in_reverse():
    rank, size = dist.get_rank(), dist.get_world_size()
    arrays = [np.full(5, float(k * 10 + rank)) for k in range(11)]   # more than SMALL_SLOTS in flight
    works = [dist.all_reduce(a, async_op=True) for a in arrays]
    waited = [w.wait() for w in reversed(works)]
    ok = all(waited) and all(w.is_completed() and w.is_success() for w in works)
    ok &= all(np.all(a == sum(k * 10 + r for r in range(size))) for k, a in enumerate(arrays))
    ok &= all(w.result()[0] is a for w, a in zip(works, arrays))
    parallel_assert(bool(ok), f"{[a[0] for a in arrays]}")


def test_async_call_completes_by_polling():
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.full(4, rank + 1, np.int32)
    w = dist.all_reduce(x, async_op=True)
    deadline = time.monotonic() + 30
    while not w.is_completed() and time.monotonic() < deadline:
        time.sleep(0.001)
    parallel_assert(w.is_completed() and np.all(x == size * (size + 1) // 2), f"{x} {w}")


@pytest.mark.world_size(min=2)
def test_async_call_overtaken_by_a_message():
    """Rank 0 starts an async all-reduce, then sends; rank 1 receives first, then joins the all-reduce.
    Legal with MPI's nonblocking collectives, so it must not deadlock here either."""
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.full(3, rank + 1.0)
    msg = np.zeros(2)
    if rank == 0:
        w = dist.all_reduce(x, async_op=True)
        dist.send(np.array([7.0, 8.0]), 1)
        w.wait()
    elif rank == 1:
        dist.recv(msg, 0)
        dist.all_reduce(x)
    else:
        dist.all_reduce(x)
    ok = np.all(x == size * (size + 1) / 2) and (rank != 1 or np.array_equal(msg, [7.0, 8.0]))
    parallel_assert(bool(ok), f"{x} {msg}")


@pytest.mark.world_size(min=2)
def test_wait_timeout_leaves_the_call_pending():
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.full(2, rank + 1.0)
    timed_out = True
    if rank == 0:
        w = dist.all_reduce(x, async_op=True)
        try:
            w.wait(timeout=0.05)   # the others join only after 0.5 s
            timed_out = False
        except dist.DistTimeoutError:
            pass
        pending = not w.is_completed() or not timed_out
        w.wait()
    else:
        time.sleep(0.5)
        dist.all_reduce(x)
        pending = True
    dist.barrier()
    parallel_assert(timed_out and pending and np.all(x == size * (size + 1) / 2), f"{x}")


@pytest.mark.world_size(min=2)
def test_mismatch_raises_on_every_rank_then_works():
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.ones(10 + (rank == size - 1), np.float32)
    with pytest.raises(ValueError, match=r"all_reduce: the ranks' calls do not match.*"
                                         r"group rank 0: all_reduce of 10 float32, SUM.*11 float32") as raised:
        dist.all_reduce(x)
    nothing_written = np.all(x == 1)
    b = np.zeros(3)
    # Roots differ: every rank is a root in its own eyes, and a root does not wait for its peers (as
    # MPI_Bcast's may not), so each finds the mismatch at its next call on the group, which goes ahead.
    # A rank whose peers had already called raises at the broadcast itself, a root that did not wait at
    # the barrier: every rank exactly once.
    errors = []
    for call in (lambda: dist.broadcast(b, 0 if rank == 0 else 1), dist.barrier):
        try:
            call()
        except ValueError as e:
            errors.append(str(e))
    assert len(errors) == 1 and "do not match" in errors[0], errors
    y = np.ones(5, np.float32)
    w = dist.all_reduce(y, op=dist.ReduceOp.MAX if rank == 0 else dist.ReduceOp.SUM, async_op=True)
    with pytest.raises(ValueError, match="do not match"):
        w.wait()
    dist.all_reduce(y)   # the channel is still in step
    parallel_assert(nothing_written and np.all(y == size) and "group rank 1" in str(raised.value), f"{y}")


@pytest.mark.world_size(min=2)
def test_group_destroyed_under_a_pending_call():
    rank = dist.get_rank()
    g = dist.new_group(list(range(dist.get_world_size())))
    dist.barrier(group=g)   # the channel is made (collectively)
    w = dist.all_reduce(np.ones(3), group=g, async_op=True) if rank == 0 else None
    dist.barrier()
    dist.destroy_process_group(g)
    if rank == 0:
        with pytest.raises(dist.DistError, match="abandoned"):
            w.wait()
    dist.barrier()
    parallel_assert(True)
