"""all_reduce(algorithm="shm"), our shared-memory all-reduce, at every world size: every dtype x op of
the C table against an independent NumPy reference, sizes 0, 1, odd, not divisible by R and larger
than the staging buffers (a group made with a tiny PYDIST_SHM_STAGE), dist.empty/zeros arrays
(reduced in place: zero-copy) and mixed ones, sub-groups and groups of one, AVG, the automatic
choice, async_op, a mismatched call (a ValueError on every rank), a rank that never joins
(DistTimeoutError) and arrays that outlive the process group."""
import os
import time

import numpy as np
import pytest

import pydist as dist
from helpers import DTYPES, OPS, make_input, parallel_assert, reference, valid

SHM = {"algorithm": "shm"}
TEST_TIMEOUT_S = float(os.environ.get("PYDIST_TEST_TIMEOUT", "60"))


def sizes():
    size = dist.get_world_size()
    return sorted({0, 1, max(size - 1, 0), size + 1, 3 * size + 2, 1001})


def info():
    return dist._C.shm_info()


def small_stage_group():
    """A group of every rank whose staging buffers hold 64 bytes: 1001 elements take many rounds."""
    old = os.environ.get("PYDIST_SHM_STAGE")
    os.environ["PYDIST_SHM_STAGE"] = "64"
    try:
        g = dist.new_group(list(range(dist.get_world_size())))
        dist.all_reduce(np.zeros(1), group=g, **SHM)   # the channel is made now, with the small stage
    finally:
        if old is None:
            del os.environ["PYDIST_SHM_STAGE"]
        else:
            os.environ["PYDIST_SHM_STAGE"] = old
    return g


def check_every_op(dtype, group, in_segment):
    rank, size = dist.get_rank(), dist.get_world_size()
    wrong = []
    for op in OPS:
        for n in sizes():
            x = make_input(11, rank, (n,), dtype, op)
            if in_segment:
                y = dist.empty(n, dtype)
                y[...] = x
                x = y
            if not valid(op, dtype):
                with pytest.raises(TypeError, match="not defined for dtype"):
                    dist.all_reduce(x, op=op, group=group, **SHM)
                continue
            dist.all_reduce(x, op=op, group=group, **SHM)
            expected = reference(op, [make_input(11, r, (n,), dtype, op) for r in range(size)])
            if not (x.dtype == expected.dtype and np.array_equal(x, expected)):
                wrong.append(f"{op.name} {dtype} n={n}: got {x[:6]} expected {expected[:6]}")
    return wrong


@pytest.mark.parametrize("dtype", DTYPES)
def test_shm_every_op_and_dtype_ordinary_arrays(dtype):
    """Copied through the staging buffers: exact on integer-valued inputs, for every op the table
    accepts; the others refused as MPI's path refuses them."""
    before = info()["calls_copied"]
    wrong = check_every_op(dtype, None, in_segment=False)
    parallel_assert(not wrong and info()["calls_copied"] > before, "; ".join(wrong[:3]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_shm_every_op_and_dtype_in_place_on_dist_empty(dtype):
    """dist.empty arrays on every rank: reduced straight in the arrays (zero-copy)."""
    before = info()["calls_in_place"]
    wrong = check_every_op(dtype, None, in_segment=True)
    parallel_assert(not wrong and info()["calls_in_place"] > before, "; ".join(wrong[:3]))


@pytest.mark.parametrize("dtype", ["int64", "float16", "float32", "complex128", "bool"])
def test_shm_larger_than_the_staging_buffers(dtype):
    """A group with 64-byte staging buffers: 1001 elements go through many double-buffered rounds."""
    g = small_stage_group()
    try:
        wrong = check_every_op(dtype, g, in_segment=False)
    finally:
        dist.destroy_process_group(g)
    parallel_assert(not wrong, "; ".join(wrong[:3]))


def test_shm_random_floats_identical_on_every_rank_and_within_rounding():
    rank, size = dist.get_rank(), dist.get_world_size()
    n = 300_007   # larger than the default staging buffer (1 MiB) in float32: two rounds
    inputs = [np.random.default_rng(900 + r).standard_normal(n).astype(np.float32) for r in range(size)]
    for in_segment in (False, True):
        x = dist.empty(n) if in_segment else np.empty(n, np.float32)
        x[:] = inputs[rank]
        dist.all_reduce(x, **SHM)
        exact = np.add.reduce(np.stack(inputs).astype(np.float64), axis=0)
        bound = size * np.finfo(np.float32).eps * np.add.reduce(np.abs(np.stack(inputs)).astype(np.float64), axis=0)
        ok = bool(np.all(np.abs(x - exact) <= bound + 1e-30))
        # every rank the same bits: each element was reduced once, by its slice's owner, in rank order
        seq = np.add.reduce(np.stack(inputs), axis=0, dtype=np.float32)   # the same order, left to right
        parallel_assert(ok and np.array_equal(x, seq), f"in_segment={in_segment}")


def test_shm_mixed_one_rank_in_segment():
    """Rank 0 passes a dist.zeros array, the others ordinary ones: every rank sees the published headers
    and takes the copying path alike."""
    rank, size = dist.get_rank(), dist.get_world_size()
    n = 4 * size + 3
    x = make_input(5, rank, (n,), "int32")
    if rank == 0:
        y = dist.zeros(n, np.int32)
        y[:] = x
        x = y
    before = info()
    dist.all_reduce(x, **SHM)
    after = info()
    expected = reference(dist.ReduceOp.SUM, [make_input(5, r, (n,), "int32") for r in range(size)])
    went = (after["calls_copied"] - before["calls_copied"], after["calls_in_place"] - before["calls_in_place"])
    want = (1, 0) if size > 1 else (0, 1)   # alone, rank 0's array is every rank's
    parallel_assert(np.array_equal(x, expected) and went == want, f"{x} {went}")


def test_shm_avg_shapes_and_views_in_place():
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.full((3, 4, 5), float(rank + 1))
    ptr = x.ctypes.data
    dist.all_reduce(x, op=dist.ReduceOp.AVG, **SHM)
    z = dist.zeros((6, 7), np.complex64)
    z[:] = rank + 1 + 1j
    view = z[2:5]   # a view inside the segment: still in place
    dist.all_reduce(view, op=dist.ReduceOp.AVG, **SHM)
    ok = x.shape == (3, 4, 5) and x.ctypes.data == ptr and np.all(x == (size + 1) / 2)
    ok &= bool(np.all(z[2:5] == (size + 1) / 2 + 1j) and np.all(z[:2] == rank + 1 + 1j))
    parallel_assert(ok, f"{x.flat[0]} {z[:, 0]}")


def test_shm_automatic_choice_by_size_and_place():
    """algorithm=None: in place through shm past SHM_AUTO_BYTES (the small collectives' bound: up to
    it, they take the call) when every rank's array is in the segment; MPI's for ordinary arrays (every
    rank sees the published headers and leaves to MPI alike: copying through the staging buffers is
    slower than MPICH), unless the ranks' waits yield (more ranks than cores), where copying through
    shm is faster than MPICH's all-reduce and every rank copies alike."""
    rank, size = dist.get_rank(), dist.get_world_size()
    n = dist._C.SHM_AUTO_BYTES // 4 + 1
    big, small = dist.zeros(n), dist.zeros(n - 1)
    plain = np.full(n, rank + 1, np.float32)
    big[:], small[:] = rank + 1, rank + 1
    mixed = dist.zeros(n) if rank == 0 else np.zeros(n, np.float32)
    mixed[:] = rank + 1
    keys = ("calls_copied", "calls_in_place", "calls_declined")
    seen = [tuple(info()[k] for k in keys)]
    for x in (small, big, plain, mixed):
        dist.all_reduce(x)
        seen.append(tuple(info()[k] for k in keys))
    steps = [tuple(b - a for a, b in zip(seen[i], seen[i + 1])) for i in range(4)]
    ordinary = (1, 0, 0) if not dist._C.mpi_info()["wait_spin"] else (0, 0, 1)   # copied, or left to MPI
    want = [(0, 0, 0), (0, 1, 0), ordinary, ordinary] if size > 1 else [(0, 0, 0)] * 4   # alone: MPI's no-op
    total = size * (size + 1) / 2
    ok = steps == want and all(np.all(x == total) for x in (small, big, plain, mixed))
    parallel_assert(ok, f"{steps}")


def test_shm_automatic_choice_copies_large_ordinary_arrays():
    """From SHM_AUTO_COPY_BYTES up an ordinary array goes through the staging buffers too (the copy
    path is ahead of MPICH there); just below it, MPI's, unless the ranks' waits yield (more ranks than
    cores: copied from SHM_AUTO_BYTES up)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    n = dist._C.SHM_AUTO_COPY_BYTES // 4
    x = np.full(n, rank + 1, np.float32)
    below = np.full(n - 1, rank + 1, np.float32)
    before = info()["calls_copied"]
    dist.all_reduce(x)
    middle = info()["calls_copied"]
    dist.all_reduce(below)
    after = info()["calls_copied"]
    total = size * (size + 1) / 2
    want = (1, int(not dist._C.mpi_info()["wait_spin"])) if size > 1 else (0, 0)
    ok = (middle - before, after - middle) == want and x[0] == total and x[-1] == total and np.all(below == total)
    parallel_assert(bool(ok), f"{(middle - before, after - middle)} {x[:2]}")


def test_shm_async_returns_a_work_without_waiting():
    """async_op=True never waits for the peers (issue 25): its header is posted, its data moves once every
    rank has called it (through MPI's nonblocking all-reduce, since this rank cannot wait in shm)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.full(7, rank + 1, np.int64)
    w = dist.all_reduce(x, async_op=True, **SHM)
    ok = w.wait() is True and np.all(x == size * (size + 1) // 2)
    ok &= w.is_completed() and w.result()[0] is x and w.exception() is None
    parallel_assert(ok, f"{x}")


def test_shm_mismatched_count_raises_on_every_rank_then_works():
    rank, size = dist.get_rank(), dist.get_world_size()
    if size == 1:
        x = np.ones(3)
        dist.all_reduce(x, **SHM)
        parallel_assert(np.all(x == 1))
        return
    x = np.ones(10 + (rank == size - 1), np.float32)
    with pytest.raises(ValueError, match=r"all_reduce: the ranks' calls do not match.*"
                                         r"group rank 0: all_reduce \(a large one\) of 10 float32, SUM.*"
                                         r"11 float32, SUM") as info_:
        dist.all_reduce(x, **SHM)
    assert np.all(x == 1)   # nothing was written
    y = np.ones(5, np.float32)
    with pytest.raises(ValueError, match="do not match"):
        dist.all_reduce(y, op=dist.ReduceOp.MAX if rank == 0 else dist.ReduceOp.SUM, **SHM)
    dist.all_reduce(y, **SHM)   # the channel is still in step
    parallel_assert(np.all(y == size) and "group rank 1" in str(info_.value), f"{y}")


@pytest.mark.world_size(min=3)
def test_shm_on_a_sub_group():
    rank = dist.get_rank()
    g = dist.new_group([0, 2])
    x = dist.zeros(5, np.int32) if rank == 2 else np.zeros(5, np.int32)
    x[:] = rank + 1
    if rank in (0, 2):
        assert dist.all_reduce(x, group=g, **SHM) is None
        ok = np.all(x == 1 + 3)
    else:
        with pytest.warns(UserWarning, match="does not belong"):
            outside = dist.all_reduce(x, group=g, **SHM)
        ok = outside is None and np.all(x == rank + 1)
    dist.destroy_process_group(g)
    parallel_assert(bool(ok), f"{x}")


def test_shm_groups_of_one():
    rank, size = dist.get_rank(), dist.get_world_size()
    groups = [dist.new_group([r]) for r in range(size)]
    mine = groups[rank]
    x = np.arange(5, dtype=np.float64) + rank
    dist.all_reduce(x, group=mine, **SHM)
    z = dist.zeros(4)
    z[:] = 3
    dist.all_reduce(z, op=dist.ReduceOp.AVG, group=mine, **SHM)
    for g in groups:
        dist.destroy_process_group(g)
    parallel_assert(np.array_equal(x, np.arange(5) + rank) and np.all(z == 3), f"{x} {z}")


def test_shm_dist_empty_blocks_are_returned_and_reused():
    before = info()["heap_used"]
    arrays = [dist.empty(1000 + k, np.float64) for k in range(10)]
    during = info()["heap_used"]
    addresses = {a.ctypes.data for a in arrays}
    del arrays
    after = info()["heap_used"]
    again = dist.empty(1000, np.float64)
    ok = during > before and after == before and again.ctypes.data in addresses and len(addresses) == 10
    parallel_assert(ok, f"{before} {during} {after}")


def test_shm_array_outlives_the_process_group():
    """An array from dist.zeros stays valid memory after destroy_process_group (the mapping is kept
    while it lives); the next session treats it as an ordinary array, and all_reduce still works."""
    rank, size = dist.get_rank(), dist.get_world_size()
    x = dist.zeros(1000, np.int64)
    x[:] = rank + 1
    dist.destroy_process_group()
    x += 1   # writes into the old mapping: must not crash
    dist.init_process_group(backend="mpi", timeout=TEST_TIMEOUT_S)
    before = info()
    dist.all_reduce(x, **SHM)
    after = info()
    fresh = dist.zeros(1000, np.int64)
    fresh[:] = 1
    dist.all_reduce(fresh, **SHM)
    ok = np.all(x == size * (size + 1) // 2 + size) and np.all(fresh == size)
    ok &= after["calls_copied"] == before["calls_copied"] + 1
    parallel_assert(bool(ok), f"{x[:3]} {fresh[:3]}")


@pytest.mark.world_size(min=2)
def test_shm_rank_that_never_joins_times_out():
    """Rank 0 calls a shm all-reduce the others never join: DistTimeoutError within the session's
    timeout (the spin on the shared counters checks the deadline), and the group is then broken."""
    rank = dist.get_rank()
    dist.destroy_process_group()
    dist.init_process_group(backend="mpi", timeout=2.0)
    try:
        dist.all_reduce(np.zeros(3), **SHM)   # the channel exists on every rank
        ok, msg = True, ""
        if rank == 0:
            start = time.monotonic()
            try:
                dist.all_reduce(np.zeros(3), **SHM)
                ok, msg = False, "no timeout"
            except dist.DistTimeoutError as e:
                waited = time.monotonic() - start
                ok, msg = 1.9 <= waited < 10 and "all_reduce timed out" in str(e), f"{waited:.2f} s: {e}"
            with pytest.raises(dist.DistError, match="broken"):
                dist.all_reduce(np.zeros(3))
        results = np.array([ok], np.int32)
    finally:
        dist.destroy_process_group()
        dist.init_process_group(backend="mpi", timeout=TEST_TIMEOUT_S)
    parallel_assert(bool(results[0]), msg)


def test_shm_bad_algorithm_value_lists_shm():
    with pytest.raises(ValueError, match=r"`algorithm` must be None, \"mpi\", \"ring\" or \"shm\"; got 'SHM'"):
        dist.all_reduce(np.zeros(3), algorithm="SHM")
    with pytest.raises(TypeError, match="not defined for dtype"):
        dist.all_reduce(np.zeros(3), op=dist.ReduceOp.BXOR, **SHM)


@pytest.mark.world_size(min=2)
def test_engine_allreduce_reduces_its_gradients_in_place():
    """The engine's gradient buffer lives in the segment, and the allreduce strategy's all-reduce of it
    (LeNet-5: 61,706 floats, above the automatic crossover) runs in place through shared memory; the
    weights stay the same on every rank (test_engine_dp.py proves them equal to one rank's run)."""
    from pydist.engine import Trainer, lenet5, load_fashion_mnist
    _, (x, y) = load_fashion_mnist()
    before = info()
    trainer = Trainer(lenet5(), batch_size=8, seed=3, lr=0.05, momentum=0.9)
    grows = info()["heap_used"] - before["heap_used"] >= 4 * trainer.params.size
    trainer.train_steps(x, y, epoch=0, first=0, last=4)
    after = info()
    mine = trainer.params.copy()
    dist.broadcast(mine, 0)
    ok = grows and after["calls_in_place"] >= before["calls_in_place"] + 4 and np.array_equal(mine, trainer.params)
    parallel_assert(bool(ok), f"heap {before['heap_used']} -> {after['heap_used']}, in place "
                              f"{before['calls_in_place']} -> {after['calls_in_place']}")


def test_shm_channel_takes_rank_0s_staging_size():
    """Ranks whose PYDIST_SHM_STAGE differs still lay the channel out alike (rank 0's size wins) and
    all-reduce through it: every rank's copied-path count goes up by one and the sum is right."""
    rank, size = dist.get_rank(), dist.get_world_size()
    old = os.environ.get("PYDIST_SHM_STAGE")
    os.environ["PYDIST_SHM_STAGE"] = str(64 * (rank + 1))
    try:
        g = dist.new_group(list(range(size)))
        before = info()["calls_copied"]
        x = make_input(5, rank, (1001,), "float64")
        dist.all_reduce(x, group=g, **SHM)
        copied = info()["calls_copied"] - before
    finally:
        if old is None:
            del os.environ["PYDIST_SHM_STAGE"]
        else:
            os.environ["PYDIST_SHM_STAGE"] = old
    expected = reference(dist.ReduceOp.SUM, [make_input(5, r, (1001,), "float64") for r in range(size)])
    want_copied = 1 if size > 1 else copied   # alone: whatever path a group of one takes
    ok = copied == want_copied and np.allclose(x, expected)
    dist.destroy_process_group(g)
    parallel_assert(ok, f"copied={copied}")
