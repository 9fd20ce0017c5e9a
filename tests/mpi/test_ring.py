"""all_reduce(algorithm="ring"), our own ring, at every world size: every dtype x op of the C table,
sizes that do not divide by the group (0, 1, n < R, n % R != 0, a large prime-ish n), bitwise equal
to MPI's all-reduce on integer-valued inputs, bitwise the same on every rank, within a rounding bound
of a float64 NumPy reference on random floats; sub-groups, async rings waited in any order, and a
ring interleaved with the user's own point-to-point messages on the same group."""
import numpy as np
import pytest

import pydist as dist
from helpers import DTYPES, OPS, make_input, max_diff, parallel_assert, reference, valid

RING = {"algorithm": "ring"}


def sizes():
    size = dist.get_world_size()
    return sorted({0, 1, max(size - 1, 0), size + 1, 3 * size + 2, 1000})


def all_gather_bytes(x, group=None):
    """Every rank's copy of x, as raw bytes per rank: bitwise comparison, NaNs and signed zeros too."""
    raw = np.ascontiguousarray(x).view(np.uint8).reshape(-1)
    out = np.zeros(raw.size * dist.get_world_size(group), np.uint8)
    dist.all_gather_into_tensor(out, raw, group=group)
    return out.reshape(dist.get_world_size(group), raw.size)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ring_every_op_and_dtype_matches_mpi_bitwise(dtype):
    """Integer-valued inputs: every result is exact, so the ring must equal MPI's result and NumPy's
    reference bit for bit, for every op the table accepts, and refuse the others as MPI's path does."""
    rank, size = dist.get_rank(), dist.get_world_size()
    wrong = []
    for op in OPS:
        for n in sizes():
            x = make_input(7, rank, (n,), dtype, op)
            if not valid(op, dtype):
                with pytest.raises(TypeError, match="not defined for dtype"):
                    dist.all_reduce(x, op=op, **RING)
                continue
            y = x.copy()
            dist.all_reduce(x, op=op, **RING)
            dist.all_reduce(y, op=op, algorithm="mpi")
            expected = reference(op, [make_input(7, r, (n,), dtype, op) for r in range(size)])
            # Bit for bit, but for the sign of a zero: complex products reach a zero through ac - bd
            # in whatever order each algorithm reduces, and -0 == +0 is the same value.
            xs, ys = (x.view(x.real.dtype), y.view(y.real.dtype)) if x.dtype.kind == "c" else (x, y)
            nonzero = xs != 0
            same = (x.dtype == expected.dtype and np.array_equal(x, expected) and np.array_equal(x, y)
                    and xs[nonzero].tobytes() == ys[nonzero].tobytes())
            if not same:
                wrong.append(f"{op.name} {dtype} n={n}: ring {x[:8]} mpi {y[:8]} expected {expected[:8]}")
    parallel_assert(not wrong, "; ".join(wrong[:3]))   # once per dtype: keeps the file quick at 4 ranks


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "complex64"])
def test_ring_random_floats_within_rounding_and_identical_on_every_rank(dtype):
    rank, size = dist.get_rank(), dist.get_world_size()
    n = 100_003
    rng = lambda r: np.random.default_rng(500 + r)  # noqa: E731
    inputs = [rng(r).standard_normal(n).astype(dtype) for r in range(size)]
    if np.dtype(dtype).kind == "c":
        inputs = [a + 1j * rng(r + 50).standard_normal(n).astype(dtype) for r, a in enumerate(inputs)]
    x = inputs[rank].copy()
    dist.all_reduce(x, **RING)
    expected = np.add.reduce(np.stack(inputs).astype(np.complex128 if x.dtype.kind == "c" else np.float64), axis=0)
    # R - 1 roundings of partial sums bounded by sum |x_r|, plus the final one
    eps = float(np.finfo(x.real.dtype).eps)
    bound = size * eps * np.add.reduce(np.abs(np.stack(inputs)).astype(np.float64), axis=0) + 1e-30
    err = np.abs(x.astype(expected.dtype) - expected)
    parallel_assert(bool(np.all(err <= bound)), f"{dtype}: max err/bound {float(np.max(err / bound)):.3g}")
    copies = all_gather_bytes(x)
    parallel_assert(bool((copies == copies[0]).all()), f"{dtype}: ranks differ")


def test_ring_avg_and_shapes_in_place():
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.full((3, 4, 5), float(rank + 1))
    ptr = x.ctypes.data
    dist.all_reduce(x, op=dist.ReduceOp.AVG, **RING)
    parallel_assert(x.shape == (3, 4, 5) and x.ctypes.data == ptr and np.all(x == (size + 1) / 2), f"{x.flat[0]}")


def test_ring_async_two_in_flight_any_wait_order():
    """Two rings started in the same order everywhere; even ranks wait for the second first, odd
    ranks for the first: each rank's wait must keep moving the ring it is not waiting for."""
    rank, size = dist.get_rank(), dist.get_world_size()
    n = 4 * size + 3
    a, b = make_input(1, rank, (n,), "int64"), make_input(2, rank, (n,), "float64")
    wa = dist.all_reduce(a, **RING, async_op=True)
    wb = dist.all_reduce(b, op=dist.ReduceOp.MAX, **RING, async_op=True)
    order = [wb, wa] if rank % 2 == 0 else [wa, wb]
    for w in order:
        assert w.wait() is True
    ea = reference(dist.ReduceOp.SUM, [make_input(1, r, (n,), "int64") for r in range(size)])
    eb = reference(dist.ReduceOp.MAX, [make_input(2, r, (n,), "float64") for r in range(size)])
    ok = np.array_equal(a, ea) and np.array_equal(b, eb) and wa.is_completed() and wb.is_success()
    ok &= wa.result()[0] is a and wb.exception() is None
    parallel_assert(ok, f"{a[:4]} vs {ea[:4]}; {b[:4]} vs {eb[:4]}")


def test_ring_async_reverse_order_and_is_completed_polling():
    rank, size = dist.get_rank(), dist.get_world_size()
    arrays = [make_input(k, rank, (k * 5 + 1,), "int32") for k in range(4)]
    works = [dist.all_reduce(x, op=dist.ReduceOp.AVG if False else dist.ReduceOp.SUM, async_op=True, **RING)
             for x in arrays]
    while not works[-1].is_completed():   # polling alone moves every ring along
        pass
    for w in reversed(works):
        assert w.wait(timeout=30) is True
    ok = all(np.array_equal(arrays[k], reference(dist.ReduceOp.SUM, [make_input(k, r, (k * 5 + 1,), "int32")
                                                                       for r in range(size)])) for k in range(4))
    parallel_assert(ok)


def test_ring_dropped_work_still_completes():
    """A Work dropped before completion keeps its array and still completes (its ring is on the list of
    rings in flight); the next blocking call's waits move it along."""
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.full(2 * size + 1, rank + 1, np.int64)
    dist.all_reduce(x, async_op=True, **RING)   # the Work is dropped at once
    y = np.ones(3, np.int64)
    dist.all_reduce(y, **RING)
    dist.barrier()
    total = size * (size + 1) // 2
    for _ in range(1000):   # any pydist call moves it; the ranks decide together when all are done
        done = np.array([np.all(x == total)], np.int32)   # every segment: they finish a step apart
        dist.all_reduce(done, op=dist.ReduceOp.MIN)
        if done[0]:
            break
    parallel_assert(np.all(x == size * (size + 1) // 2) and np.all(y == size), f"{x} {y}")


def test_ring_does_not_mix_with_user_point_to_point():
    """The user's isend/irecv on the same group, tag 0, posted before and completed after a ring: the
    ring talks on its own communicator, so neither takes the other's messages."""
    rank, size = dist.get_rank(), dist.get_world_size()
    if size < 2:
        x = np.arange(5, dtype=np.int64)
        dist.all_reduce(x, **RING)
        parallel_assert(np.array_equal(x, np.arange(5)))
        return
    right, left = (rank + 1) % size, (rank - 1) % size
    n = 2 * size + 1
    got = np.zeros(n, np.int64)
    recv = dist.irecv(got, src=left)
    send = dist.isend(np.full(n, 1000 + rank, np.int64), dst=right)
    x = make_input(3, rank, (n,), "int64")
    dist.all_reduce(x, **RING)
    send.wait()
    recv.wait()
    expected = reference(dist.ReduceOp.SUM, [make_input(3, r, (n,), "int64") for r in range(size)])
    parallel_assert(np.array_equal(x, expected) and np.all(got == 1000 + left), f"{x} {got}")


@pytest.mark.world_size(min=3)
def test_ring_on_sub_groups():
    rank, size = dist.get_rank(), dist.get_world_size()
    g = dist.new_group([0, 2])
    x = np.full(5, rank + 1, np.int32)
    if rank in (0, 2):
        assert dist.all_reduce(x, group=g, **RING) is None
        w = dist.all_reduce(x, group=g, async_op=True, **RING)
        w.wait()
        ok = np.all(x == 2 * (1 + 3))   # (1 + 3), then doubled by the second ring
    else:
        with pytest.warns(UserWarning, match="does not belong"):
            outside = dist.all_reduce(x, group=g, **RING)
        ok = outside is None and np.all(x == rank + 1)
    dist.destroy_process_group(g)
    parallel_assert(bool(ok), f"{x}")


def test_ring_on_a_group_of_everyone_then_destroyed():
    """A sub-group of all ranks gets its own private communicator, freed with the group."""
    rank, size = dist.get_rank(), dist.get_world_size()
    before = dist._C.live_groups()
    g = dist.new_group(list(range(size)))
    x = np.full(size + 2, rank, np.int64)
    dist.all_reduce(x, group=g, **RING)
    during = dist._C.live_groups()
    dist.destroy_process_group(g)
    ok = np.all(x == size * (size - 1) // 2) and during == before + 2 and dist._C.live_groups() == before
    parallel_assert(ok, f"communicators {before} -> {during} -> {dist._C.live_groups()}")


def test_ring_bad_algorithm_values():
    x = np.zeros(3)
    with pytest.raises(ValueError, match=r"all_reduce\(\): `algorithm` must be None, \"mpi\", \"ring\" or \"shm\"; got 'Ring'"):
        dist.all_reduce(x, algorithm="Ring")
    with pytest.raises(TypeError, match=r"all_reduce\(\): `algorithm` must be .*; got int"):
        dist.all_reduce(x, algorithm=1)
    with pytest.raises(TypeError):
        dist.all_reduce(x, dist.ReduceOp.SUM, None, False, "ring")   # keyword-only
    with pytest.raises(TypeError, match="not defined for dtype"):
        dist.all_reduce(np.zeros(3), op=dist.ReduceOp.BXOR, algorithm="ring")


@pytest.mark.world_size(min=2)
def test_ring_wait_timeout_leaves_it_pending_and_resumable():
    """Rank 0 starts a ring the others have not started yet: its short wait times out (a caller's poll,
    which breaks nothing), the ring stays pending, and it completes once the others join."""
    rank, size = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(np.zeros(1), **RING)   # the world's private communicator exists on every rank
    x = np.full(3, rank + 1, np.int64)
    if rank == 0:
        w = dist.all_reduce(x, async_op=True, **RING)
        # (MPI's all-reduce carries it where the library has no MPI_Isendrecv: Open MPI 4.1)
        ring = r" \(ring\)" if dist._C.mpi_info()["isendrecv"] else ""
        with pytest.raises(dist.DistTimeoutError, match=rf"all_reduce{ring} timed out"):
            w.wait(timeout=0.2)
        assert not w.is_completed()
    dist.barrier()
    if rank != 0:
        w = dist.all_reduce(x, async_op=True, **RING)
    assert w.wait() is True
    parallel_assert(np.all(x == size * (size + 1) // 2) and w.is_success(), f"{x}")
