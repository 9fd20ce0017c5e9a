"""all_reduce at every world size: every dtype x op of the C table, sizes from 0 to several MiB,
blocking and async, against NumPy references each rank computes on its own."""
import zlib

import numpy as np
import pytest

import pydist as dist
from helpers import DTYPES, OPS, make_input, max_diff, parallel_assert, reference, valid

SIZES = [0, 1, 7, 1000]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS, ids=[o.name for o in OPS])
def test_every_op_and_dtype(op, dtype):
    rank, size = dist.get_rank(), dist.get_world_size()
    for n in SIZES:
        x = make_input(1, rank, (n,), dtype, op)
        if not valid(op, dtype):
            with pytest.raises(TypeError, match="not defined for dtype"):
                dist.all_reduce(x, op=op)
            continue
        expected = reference(op, [make_input(1, r, (n,), dtype, op) for r in range(size)])
        dist.all_reduce(x, op=op)
        parallel_assert(x.dtype == expected.dtype and np.array_equal(x, expected),
                        f"{op.name} {dtype} n={n}: maxdiff {max_diff(x, expected)}")


@pytest.mark.parametrize("dtype", ["float32", "int64", "float16"])
def test_multi_mib(dtype):
    """Several MiB, random non-integer floats: summation order differs from NumPy's, so floats get a
    tolerance scaled to the dtype; integers must match exactly."""
    rank, size = dist.get_rank(), dist.get_world_size()
    n = (3 << 20) // np.dtype(dtype).itemsize + 5   # ~3 MiB, not a multiple of anything nice
    rng = lambda r: np.random.default_rng(100 + r)  # noqa: E731
    if dtype == "int64":
        inputs = [rng(r).integers(-1000, 1000, n).astype(dtype) for r in range(size)]
    else:
        inputs = [rng(r).standard_normal(n).astype(dtype) for r in range(size)]
    x = inputs[rank].copy()
    dist.all_reduce(x)
    expected = np.add.reduce(np.stack(inputs).astype(np.float64), axis=0)
    tol = {"float16": 2e-2, "float32": 1e-5, "int64": 0}[dtype]
    diff = max_diff(x, expected.astype(x.dtype))
    parallel_assert(diff <= tol * max(1.0, float(np.abs(expected).max())), f"{dtype}: maxdiff {diff}")


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_past_the_slots_every_op_and_dtype_with_nan(async_op):
    """Just past the small collectives' bound, where the header goes through the slots and the data by
    our ring (2 ranks, blocking) or MPI's all-reduce: NumPy's answer, and with a NaN, -0.0 and +0.0 in
    every float input the same bits on every rank."""
    rank, size = dist.get_rank(), dist.get_world_size()
    wrong, digests = [], []
    for dtype in DTYPES:
        n = dist._C.shm_info()["small_bytes"] // np.dtype(dtype).itemsize + 3
        for op in OPS:
            if not valid(op, dtype):
                continue
            inputs = [make_input(11, r, (n,), dtype, op) for r in range(size)]
            if np.dtype(dtype).kind in "fc":
                for r, x in enumerate(inputs):   # rank r: NaN at r, -0.0 at n - 1 - r, +0.0 at the middle
                    x[r], x[n - 1 - r], x[n // 2] = np.nan, -0.0, 0.0
            expected = reference(op, inputs)
            x = inputs[rank].copy()
            w = dist.all_reduce(x, op=op, async_op=async_op)
            if async_op:
                w.wait()
            if not np.array_equal(x, expected, equal_nan=True):
                wrong.append((dtype, op.name))
            digests.append(zlib.crc32(x.tobytes()))
    mine = np.array(digests, np.int64)
    every = [np.zeros_like(mine) for _ in range(size)]
    dist.all_gather(every, mine)
    alike = all(np.array_equal(d, every[0]) for d in every)
    parallel_assert(not wrong and alike, f"{wrong[:6]} alike={alike}")


def test_shapes_are_preserved_and_in_place():
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.full((3, 4, 5), rank + 1, dtype=np.float64)
    ptr = x.ctypes.data
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    parallel_assert(x.shape == (3, 4, 5) and x.ctypes.data == ptr and np.all(x == size))


@pytest.mark.parametrize("op", [dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX], ids=lambda o: o.name)
def test_async_many_outstanding(op):
    rank, size = dist.get_rank(), dist.get_world_size()
    arrays = [make_input(k, rank, (k * 11,), "float64") for k in range(8)]
    works = [dist.all_reduce(a, op=op, async_op=True) for a in arrays]
    ok = True
    for k in reversed(range(8)):    # complete in the opposite order
        assert works[k].wait() is True
        assert works[k].is_completed()
        expected = reference(op, [make_input(k, r, (k * 11,), "float64") for r in range(size)])
        ok &= np.array_equal(arrays[k], expected)
        ok &= works[k].result()[0] is arrays[k]
    parallel_assert(ok)


def test_legacy_reduce_op_alias():
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.array([rank + 1.0])
    with pytest.warns(FutureWarning):
        op = dist.reduce_op.SUM
    dist.all_reduce(x, op=op)
    parallel_assert(x[0] == size * (size + 1) / 2)


def test_torch_tensor_in_place():
    import torch  # a test-time peer (make test installs it), never a dependency of pydist
    rank, size = dist.get_rank(), dist.get_world_size()
    t = torch.full((4,), float(rank))
    dist.all_reduce(t)
    parallel_assert(bool((t == sum(range(size))).all()), str(t))


@pytest.mark.parametrize("small_bytes", [65536, 0], ids=["shm", "mpi"])
def test_ml_dtypes_bfloat16_arrays(small_bytes):
    """bfloat16 as a NumPy dtype (ml_dtypes, JAX's): reduced with bfloat16's rounding at every pairwise
    step. The small collectives in shared memory step in rank order, so the result is bitwise the
    rank-order reference; MPI may order the steps otherwise: within their rounding, and bitwise the
    same on every rank."""
    import ml_dtypes  # a test-time peer (make test installs it), never a dependency of pydist
    bf16 = ml_dtypes.bfloat16
    rank, size = dist.get_rank(), dist.get_world_size()
    old = dist._C.set_shm_small_bytes(small_bytes)
    try:
        every = [np.random.default_rng(40 + r).standard_normal(999).astype(bf16) for r in range(size)]
        wrong = []
        for op, step in [(dist.ReduceOp.SUM, np.add), (dist.ReduceOp.PRODUCT, np.multiply),
                         (dist.ReduceOp.MIN, np.minimum), (dist.ReduceOp.MAX, np.maximum),
                         (dist.ReduceOp.AVG, np.add)]:
            x = every[rank].copy()
            dist.all_reduce(x, op=op)
            want = every[0]
            for other in every[1:]:
                want = step(want, other)   # bfloat16 in and out: rounded at each step
            if op == dist.ReduceOp.AVG:
                want = (want.astype(np.float32) / size).astype(bf16)
            words = np.zeros((size, x.size), np.int16)
            dist.all_gather_into_tensor(words, x.view(np.int16))
            same = bool((words == words[0]).all())
            close = np.allclose(x.astype(np.float32), want.astype(np.float32), rtol=size * 2 ** -7,
                                atol=size * 2 ** -7)
            exact = np.array_equal(x.view(np.int16), want.view(np.int16))
            if x.dtype != bf16 or not same or not close or (small_bytes and not exact):
                wrong.append((op.name, same, close, exact))
    finally:
        dist._C.set_shm_small_bytes(old)
    parallel_assert(not wrong, f"{wrong}")
