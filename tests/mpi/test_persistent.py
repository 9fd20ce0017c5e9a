"""Small collectives through the group's cache of persistent requests (csrc/paths/persistent.c), against
NumPy references each rank computes on its own.

Messages up to PYDIST_PERSISTENT_BYTES (8 KiB by default) run as cached MPI persistent requests on
pydist's own staging buffers; larger ones as MPI's nonblocking calls. The cache is keyed by what every
rank passes identically, so these tests vary what must not matter (the array, its address, its shape,
async_op on one rank only, how many calls are outstanding, the order Works are waited in) and check
every result. Each test works on a fresh group, so that _C.persistent_stats sees only its own calls.
On one node such messages go through shared memory first (test_shm_small.py): these tests turn that
off, every rank alike, to reach the cache.
"""
import gc
import warnings

import numpy as np
import pytest

import pydist as dist
from helpers import make_input, max_diff, parallel_assert, reference, valid

THRESHOLD = 8192    # the default of PYDIST_PERSISTENT_BYTES
KEY_ENTRIES = 4     # requests per key (persistent.c)
MAX_KEYS, MAX_STAGING = 64, 1 << 20


@pytest.fixture(autouse=True)
def no_small_shm():
    old = dist._C.set_shm_small_bytes(0)
    yield
    dist._C.set_shm_small_bytes(old)


@pytest.fixture
def group():
    g = dist.new_group(list(range(dist.get_world_size())))
    yield g
    dist.destroy_process_group(g)


def stats(g):
    """(keys, requests, active requests, staging bytes) of the group's cache."""
    return dist._C.persistent_stats(g._handle)


def elements(nbytes, dtype):
    return nbytes // np.dtype(dtype).itemsize


# ---------------------------------------------------------------------------------------------------
# Every collective, on both sides of the threshold

SIZES_BYTES = [0, 8, 1000, THRESHOLD - 8, THRESHOLD, THRESHOLD + 8]
DTYPES = ["float32", "int64", "float16", "complex128", "uint8", "bool"]
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT, dist.ReduceOp.BXOR]


def cached(nbytes):
    return nbytes <= THRESHOLD


PAIRS = [(op, dtype) for op in OPS for dtype in DTYPES if valid(op, dtype)]   # the others raise: test_all_reduce.py


@pytest.mark.parametrize("op,dtype", PAIRS, ids=[f"{o.name}-{d}" for o, d in PAIRS])
def test_all_reduce_around_the_threshold(group, op, dtype):
    rank, size = dist.get_rank(), dist.get_world_size()
    for async_op in (False, True):
        for nbytes in SIZES_BYTES:
            n = elements(nbytes, dtype)
            x = make_input(n, rank, (n,), dtype, op)
            expected = reference(op, [make_input(n, r, (n,), dtype, op) for r in range(size)])
            w = dist.all_reduce(x, op=op, group=group, async_op=async_op)
            if async_op:
                assert w.wait() is True and w.is_completed() and w.result()[0] is x
            parallel_assert(np.array_equal(x, expected), f"{op.name} {dtype} {nbytes} B async={async_op}: "
                                                          f"maxdiff {max_diff(x, expected)}")
    keys = stats(group)[0]
    # one key per cached element count (0 counts too: the same on every rank), none for larger messages
    counts = {elements(b, dtype) for b in SIZES_BYTES if cached(elements(b, dtype) * np.dtype(dtype).itemsize)}
    parallel_assert(keys == len(counts), f"{keys} keys, want {len(counts)}")


@pytest.mark.parametrize("dtype", ["float32", "int16", "complex64"])
def test_broadcast_every_root(group, dtype):
    rank, size = dist.get_rank(), dist.get_world_size()
    for nbytes in SIZES_BYTES:
        n = elements(nbytes, dtype)
        for root in range(size):
            for async_op in (False, True):
                x = make_input(root, rank, (n,), dtype)
                if rank == root:
                    x.flags.writeable = False   # the root only reads
                w = dist.broadcast(x, root, group=group, async_op=async_op)
                if async_op:
                    w.wait()
                expected = make_input(root, root, (n,), dtype)
                parallel_assert(np.array_equal(x, expected), f"{dtype} {nbytes} B root {root}")


@pytest.mark.parametrize("op", [dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MIN], ids=lambda o: o.name)
def test_reduce_every_root(group, op):
    rank, size = dist.get_rank(), dist.get_world_size()
    for nbytes in (8, 4096, THRESHOLD, THRESHOLD + 8):
        n = elements(nbytes, "float64")
        for root in range(size):
            x = make_input(root, rank, (n,), "float64", op)
            mine = x.copy()
            dist.reduce(x, root, op=op, group=group)
            expected = reference(op, [make_input(root, r, (n,), "float64", op) for r in range(size)])
            ok = np.array_equal(x, expected) if rank == root else np.array_equal(x, mine)
            parallel_assert(ok, f"{op.name} {nbytes} B root {root}")


@pytest.mark.parametrize("dtype", ["float32", "uint8", "complex128"])
def test_all_gather_into_tensor(group, dtype):
    rank, size = dist.get_rank(), dist.get_world_size()
    item = np.dtype(dtype).itemsize
    for total in (0, 8 * size, 1024, THRESHOLD, THRESHOLD + 64 * size):
        n = total // (item * size)
        expected = np.concatenate([make_input(total, r, (n,), dtype) for r in range(size)])
        for in_place in (False, True):
            out = np.zeros(n * size, dtype)
            if in_place:   # torch's form: the input is this rank's slot of the output
                inp = out[rank * n:(rank + 1) * n]
                inp[...] = make_input(total, rank, (n,), dtype)
            else:
                inp = make_input(total, rank, (n,), dtype)
            w = dist.all_gather_into_tensor(out, inp, group=group, async_op=True)
            w.wait()
            parallel_assert(np.array_equal(out, expected), f"{dtype} {total} B in_place={in_place}")


RS_PAIRS = [(op, dtype) for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX)
            for dtype in ("float32", "int32", "float16") if valid(op, dtype)]


@pytest.mark.parametrize("op,dtype", RS_PAIRS, ids=[f"{o.name}-{d}" for o, d in RS_PAIRS])
def test_reduce_scatter(group, op, dtype):
    rank, size = dist.get_rank(), dist.get_world_size()
    item = np.dtype(dtype).itemsize
    for total in (0, 4 * size * item, 4096, THRESHOLD, THRESHOLD + 64 * size):
        n = total // (item * size)
        inputs = [make_input(total, r, (n * size,), dtype, op) for r in range(size)]
        expected = reference(op, inputs)[rank * n:(rank + 1) * n]
        out = np.zeros(n, dtype)
        dist.reduce_scatter_tensor(out, inputs[rank], op=op, group=group)
        parallel_assert(np.array_equal(out, expected), f"tensor form {total} B: maxdiff {max_diff(out, expected)}")
        out = np.zeros(n, dtype)   # the list form packs the list, then takes the same path
        dist.reduce_scatter(out, [inputs[rank][i * n:(i + 1) * n] for i in range(size)], op=op, group=group)
        parallel_assert(np.array_equal(out, expected), f"list form {total} B")


@pytest.mark.parametrize("dtype", ["float64", "int8"])
def test_all_to_all_single(group, dtype):
    rank, size = dist.get_rank(), dist.get_world_size()
    item = np.dtype(dtype).itemsize
    for total in (0, size * item, 4096, THRESHOLD, THRESHOLD + 64 * size):
        rows = total // (item * size)
        inputs = [make_input(total, r, (rows * size, 1), dtype) for r in range(size)]
        expected = np.concatenate([inputs[r][rank * rows:(rank + 1) * rows] for r in range(size)])
        for splits in (None, []):
            out = np.zeros((rows * size, 1), dtype)
            dist.all_to_all_single(out, inputs[rank], splits, splits, group=group)
            parallel_assert(np.array_equal(out, expected), f"{total} B splits={splits}")
    # MPI's nonblocking call, always, with split sizes or without (another rank's blocks may be uneven,
    # and its alltoallv would not match a cached alltoall).
    out = np.zeros((size, 1), dtype)
    dist.all_to_all_single(out, inputs[rank][:size], [1] * size, [1] * size, group=group)
    parallel_assert(stats(group)[0] == 0 and np.array_equal(out, np.array([[i[rank, 0]] for i in inputs])))


def test_barrier(group):
    for _ in range(2 * KEY_ENTRIES + 1):
        dist.barrier(group=group)
        assert dist.barrier(group=group, async_op=True).wait() is True
    parallel_assert(stats(group)[:3] == (1, KEY_ENTRIES, 0), f"{stats(group)}")


def test_every_collective_restarted_with_new_data(group):
    """Each cached request is started again and again (calls rotate over KEY_ENTRIES requests per key):
    every start must see its own new data. MPICH 4.0.2's recursive-doubling all-gather fails exactly
    this (the peers' blocks are not written from the second start on), so pydist asks for the ring."""
    rank, size = dist.get_rank(), dist.get_world_size()
    n = 3
    for call in range(3 * KEY_ENTRIES + 1):
        inputs = [make_input(call, r, (n * size,), "int32") for r in range(size)]
        mine = inputs[rank]
        x = mine[:n].copy()
        dist.all_reduce(x, group=group)
        ok = {"all_reduce": np.array_equal(x, sum(i[:n] for i in inputs))}
        x = mine[:n].copy()
        dist.broadcast(x, call % size, group=group)
        ok["broadcast"] = np.array_equal(x, inputs[call % size][:n])
        x = mine[:n].copy()
        dist.reduce(x, call % size, group=group)
        ok["reduce"] = np.array_equal(x, sum(i[:n] for i in inputs) if rank == call % size else mine[:n])
        out = np.full(n * size, -1, np.int32)
        dist.all_gather_into_tensor(out, mine[:n], group=group)
        ok["all_gather_into_tensor"] = np.array_equal(out, np.concatenate([i[:n] for i in inputs]))
        out = np.full(n, -1, np.int32)
        dist.reduce_scatter_tensor(out, mine, group=group)
        ok["reduce_scatter_tensor"] = np.array_equal(out, sum(inputs)[rank * n:(rank + 1) * n])
        out = np.full(n * size, -1, np.int32)
        dist.all_to_all_single(out, mine, group=group)
        ok["all_to_all_single"] = np.array_equal(out, np.concatenate([i[rank * n:(rank + 1) * n] for i in inputs]))
        parallel_assert(all(ok.values()), f"call {call}: wrong {[k for k, v in ok.items() if not v]}")
    # one key each (broadcast and reduce: one per root; all_to_all_single never): through the cache
    keys, requests, active, _ = stats(group)
    parallel_assert(keys == 3 + 2 * size and requests >= 4 * KEY_ENTRIES and active == 0, f"{stats(group)}")


# ---------------------------------------------------------------------------------------------------
# What must not matter: the array, its address, its shape

def test_same_array_reused(group):
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.zeros(100, np.int64)
    for i in range(3 * KEY_ENTRIES):
        x[...] = rank + i
        dist.all_reduce(x, group=group)
        parallel_assert(np.all(x == sum(r + i for r in range(size))), f"call {i}: {x[:3]}")
    parallel_assert(stats(group)[:3] == (1, KEY_ENTRIES, 0), f"{stats(group)}")


def test_other_arrays_and_shapes_at_one_key(group):
    """One key (count, dtype, op): arrays of other shapes and values, views, a torch-style 2-D array."""
    rank, size = dist.get_rank(), dist.get_world_size()
    base = np.arange(48, dtype=np.float32)
    shapes = [(24,), (4, 6), (2, 3, 4), (24, 1)]
    for i, shape in enumerate(shapes * 2):
        x = (base[i:i + 24] * (rank + 1)).reshape(shape)   # a view at another address each time
        dist.all_reduce(x, group=group)
        expected = (base[i:i + 24] * sum(range(1, size + 1))).reshape(shape)
        parallel_assert(x.shape == shape and np.array_equal(x, expected), f"{shape}")
    parallel_assert(stats(group)[0] == 1, f"{stats(group)}")


def test_array_freed_and_replaced_at_the_same_address(group):
    """A new array of another shape and size where a freed one was: it gets its own key (never the old
    one's count), and the result is right."""
    rank, size = dist.get_rank(), dist.get_world_size()
    reused = 0
    for i in range(20):
        a = np.full(1000 + i, rank + 1.0)
        addr = a.ctypes.data
        dist.all_reduce(a, group=group)
        ok_a = np.all(a == size * (size + 1) / 2)
        del a
        b = np.empty((10 + i % 3, 7), np.float64)   # NumPy's allocator hands back the freed block often
        reused += b.ctypes.data == addr
        b[...] = rank * 2.0
        dist.all_reduce(b, group=group)
        parallel_assert(ok_a and np.all(b == size * (size - 1)), f"round {i}")
    assert reused >= 0   # how often the address came back is NumPy's business; the results are ours


# ---------------------------------------------------------------------------------------------------
# The cache's bounds

def test_more_keys_than_the_cache_holds(group):
    rank, size = dist.get_rank(), dist.get_world_size()
    for rounds in range(2):
        for n in range(1, MAX_KEYS + 10):
            x = np.full(n, rank + n, np.int32)
            dist.all_reduce(x, group=group)
            parallel_assert(np.all(x == sum(r + n for r in range(size))), f"n={n}")
    keys, requests, active, staging = stats(group)
    parallel_assert(keys == MAX_KEYS and active == 0 and staging <= MAX_STAGING, f"{stats(group)}")


def test_staging_bound_evicts_large_keys(group):
    """Keys of 8 KiB messages (32 KiB of staging each): the 1 MiB of staging fills before 64 keys do."""
    rank, size = dist.get_rank(), dist.get_world_size()
    for n in range(40):
        count = elements(THRESHOLD, "float32") - n
        for _ in range(KEY_ENTRIES):
            x = make_input(n, rank, (count,), "float32")
            dist.all_reduce(x, group=group)
            expected = reference(dist.ReduceOp.SUM, [make_input(n, r, (count,), "float32") for r in range(size)])
            parallel_assert(np.array_equal(x, expected), f"n={n}")
    keys, requests, active, staging = stats(group)
    parallel_assert(staging <= MAX_STAGING and keys < 40 and active == 0, f"{stats(group)}")


# ---------------------------------------------------------------------------------------------------
# Async calls: what differs between ranks must not change which request a call uses

@pytest.mark.world_size(min=2)
def test_async_on_one_rank_blocking_on_another(group):
    """Rank 0 starts 3 x KEY_ENTRIES async all-reduces of one key and waits for none until the end
    (so each reuse of a request completes the call before it); the others call the same blocking."""
    rank, size = dist.get_rank(), dist.get_world_size()
    arrays = [np.full(5, rank + i, np.float64) for i in range(3 * KEY_ENTRIES)]
    works = [dist.all_reduce(a, group=group, async_op=rank == 0) for a in arrays]
    for i, a in enumerate(arrays):
        if rank == 0:
            assert works[i].wait() is True
        parallel_assert(np.all(a == sum(r + i for r in range(size))), f"call {i}: {a}")


def test_outstanding_works_waited_in_reverse(group):
    rank, size = dist.get_rank(), dist.get_world_size()
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
        arrays = [make_input(i, rank, (33,), "float64") for i in range(2 * KEY_ENTRIES + 1)]
        works = [dist.all_reduce(a, op=op, group=group, async_op=True) for a in arrays]
        for i in reversed(range(len(works))):
            assert works[i].wait() is True and works[i].is_success()
            expected = reference(op, [make_input(i, r, (33,), "float64") for r in range(size)])
            parallel_assert(np.array_equal(arrays[i], expected), f"{op.name} call {i}")
    parallel_assert(stats(group)[2] == 0, f"{stats(group)}")


def test_is_completed_polls_a_cached_work(group):
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.full(3, rank + 1, np.int64)
    w = dist.all_reduce(x, group=group, async_op=True)
    while not w.is_completed():
        pass
    parallel_assert(np.all(x == size * (size + 1) // 2) and w.is_success() and w.wait() is True)


def test_dropped_work_still_delivers(group):
    """A Work dropped before completion warns; its entry keeps the array and delivers the result when
    the request is next needed."""
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.full(6, rank + 1, np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)   # whether it completed before the drop is timing
        dist.all_reduce(x, group=group, async_op=True)
        gc.collect()
    for _ in range(KEY_ENTRIES):   # the last of these reuses the dropped call's request
        y = np.full(6, 2 * rank, np.int32)
        dist.all_reduce(y, group=group)
        parallel_assert(np.all(y == size * (size - 1)))
    parallel_assert(np.all(x == size * (size + 1) // 2) and stats(group)[2] == 0, f"{x} {stats(group)}")


# ---------------------------------------------------------------------------------------------------
# Groups, timeouts

def test_group_destroyed_and_recreated():
    rank, size = dist.get_rank(), dist.get_world_size()
    for round_ in range(3):
        g = dist.new_group(list(range(size)))
        x = np.full(4, rank + round_, np.float32)
        dist.all_reduce(x, group=g)
        pending = dist.all_reduce(np.full(4, 1.0, np.float32), group=g, async_op=True)
        held = pending.result()[0]
        dist.destroy_process_group(g)   # a pending Work keeps its request and staging
        assert pending.wait() is True
        parallel_assert(np.all(x == sum(r + round_ for r in range(size))) and np.all(held == size))
        with pytest.raises(ValueError, match="destroyed"):
            dist.all_reduce(x, group=g)


@pytest.mark.world_size(min=2)
def test_wait_timeout_on_a_cached_collective():
    """Rank 0 starts a cached all-reduce the others have not started: its short wait times out with
    DistTimeoutError (a caller's poll, which breaks nothing); it completes once they join."""
    rank, size = dist.get_rank(), dist.get_world_size()
    g = dist.new_group(list(range(size)))
    x = np.full(3, rank + 1, np.int64)
    if rank == 0:
        w = dist.all_reduce(x, group=g, async_op=True)
        with pytest.raises(dist.DistTimeoutError, match="all_reduce timed out"):
            w.wait(timeout=0.2)
        assert not w.is_completed()
    dist.barrier()
    if rank != 0:
        w = dist.all_reduce(x, group=g, async_op=True)
    assert w.wait() is True
    parallel_assert(np.all(x == size * (size + 1) // 2) and w.is_success(), f"{x}")
    dist.destroy_process_group(g)


@pytest.mark.world_size(min=2)
def test_second_thread_on_a_busy_group_is_refused(group):
    """While one thread waits in a cached collective on a group, another thread's collective on that
    group raises DistError (the ranks could not agree on their order) and sends nothing; the first
    call then completes normally."""
    import threading
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.full(4, rank + 1.0)
    if rank == 0:
        t = threading.Thread(target=dist.all_reduce, args=(x,), kwargs={"group": group})
        t.start()
        for _ in range(10000):   # until the first call is waiting (its request active)
            if stats(group)[2] == 1:
                break
            threading.Event().wait(0.001)
        with pytest.raises(dist.DistError, match="another thread of this process is inside all_reduce"):
            dist.all_reduce(np.zeros(4), group=group)
        dist.send(np.zeros(1), dst=1)   # now rank 1 may join the first call
        t.join(timeout=60)
        assert not t.is_alive()
    else:
        if rank == 1:
            dist.recv(np.zeros(1), src=0)
        dist.all_reduce(x, group=group)
    parallel_assert(np.all(x == size * (size + 1) / 2) and stats(group)[2] == 0, f"{x} {stats(group)}")
