"""Property-based tests (hypothesis) over dtype x op x shape x root x group, against NumPy.

Every rank must draw the same examples, or ranks would call different collectives: hypothesis runs
derandomized (its examples depend only on the test), with no example database and no filters whose
outcome could differ between ranks.
"""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pydist as dist
from helpers import DTYPES, OPS, make_input, parallel_assert, reference, valid

SAME_ON_EVERY_RANK = settings(derandomize=True, database=None, deadline=None, max_examples=30,
                              suppress_health_check=list(HealthCheck))

shapes = st.lists(st.integers(0, 6), min_size=0, max_size=3).map(tuple)
seeds = st.integers(0, 10_000)


def _members(mask, size):
    """A non-empty subset of the ranks, from a bit mask drawn by hypothesis."""
    members = [r for r in range(size) if mask >> r & 1]
    return members or [0]


@SAME_ON_EVERY_RANK
@given(dtype=st.sampled_from(DTYPES), op=st.sampled_from(OPS), shape=shapes, seed=seeds,
       mask=st.integers(0, 15))
def test_all_reduce_on_any_subgroup_equals_numpy(dtype, op, shape, seed, mask):
    rank, size = dist.get_rank(), dist.get_world_size()
    members = _members(mask, size)
    g = dist.new_group(members)
    ok = True
    if rank in members and valid(op, dtype):
        x = make_input(seed, rank, shape, dtype, op)
        dist.all_reduce(x, op=op, group=g)
        ok = np.array_equal(x, reference(op, [make_input(seed, m, shape, dtype, op) for m in members]))
    dist.destroy_process_group(g)
    parallel_assert(ok, f"{op.name} {dtype} {shape} {members}")


@SAME_ON_EVERY_RANK
@given(dtype=st.sampled_from(["int32", "float64", "float16", "complex64"]),
       op=st.sampled_from([dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT]),
       n=st.integers(0, 9), seed=seeds)
def test_reduce_scatter_is_a_slice_of_all_reduce(dtype, op, n, seed):
    rank, size = dist.get_rank(), dist.get_world_size()
    if not valid(op, dtype):
        parallel_assert(True)
        return
    x = make_input(seed, rank, (n * size,), dtype, op)
    full = x.copy()
    dist.all_reduce(full, op=op)
    out = np.zeros(n, dtype)
    dist.reduce_scatter_tensor(out, x, op=op)
    parallel_assert(np.array_equal(out, full[rank * n:(rank + 1) * n]))


@SAME_ON_EVERY_RANK
@given(dtype=st.sampled_from(DTYPES), shape=shapes, seed=seeds)
def test_all_gather_is_the_concatenation(dtype, shape, seed):
    rank, size = dist.get_rank(), dist.get_world_size()
    x = make_input(seed, rank, shape, dtype)
    out = np.zeros((size,) + shape, dtype)
    dist.all_gather_into_tensor(out, x)
    parallel_assert(np.array_equal(out, np.stack([make_input(seed, r, shape, dtype) for r in range(size)])))


@SAME_ON_EVERY_RANK
@given(splits=st.lists(st.lists(st.integers(0, 4), min_size=4, max_size=4), min_size=4, max_size=4),
       cols=st.integers(1, 3), seed=seeds)
def test_all_to_all_single_twice_with_transposed_splits_is_the_identity(splits, cols, seed):
    """Rank r sends splits[r][j] rows to rank j; sending back with the transposed splits restores x."""
    rank, size = dist.get_rank(), dist.get_world_size()
    send = splits[rank][:size]
    recv = [splits[j][rank] for j in range(size)]
    x = make_input(seed, rank, (sum(send), cols), "float32")
    mid = np.zeros((sum(recv), cols), np.float32)
    dist.all_to_all_single(mid, x, output_split_sizes=recv, input_split_sizes=send)
    back = np.zeros_like(x)
    dist.all_to_all_single(back, mid, output_split_sizes=send, input_split_sizes=recv)
    parallel_assert(np.array_equal(back, x))


@SAME_ON_EVERY_RANK
@given(dtype=st.sampled_from(DTYPES), shape=shapes, seed=seeds, root=st.integers(0, 3))
def test_broadcast_from_any_root(dtype, shape, seed, root):
    rank, size = dist.get_rank(), dist.get_world_size()
    root %= size
    x = make_input(seed, rank, shape, dtype)
    dist.broadcast(x, src=root)
    parallel_assert(np.array_equal(x, make_input(seed, root, shape, dtype)))


@SAME_ON_EVERY_RANK
@given(dtype=st.sampled_from(["float16", "float32", "float64", "complex128"]), shape=shapes, seed=seeds)
def test_avg_is_sum_divided_by_size(dtype, shape, seed):
    rank, size = dist.get_rank(), dist.get_world_size()
    x = make_input(seed, rank, shape, dtype)
    s = x.copy()
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    dist.all_reduce(s, op=dist.ReduceOp.SUM)
    expected = np.empty_like(s)
    if s.dtype.kind == "c":
        expected.real, expected.imag = s.real / size, s.imag / size
    else:
        expected[...] = s / s.dtype.type(size)
    parallel_assert(np.array_equal(x, expected))
