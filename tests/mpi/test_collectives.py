"""reduce, gathers, scatter, reduce-scatter and all-to-all at every world size and every root,
against NumPy references each rank computes on its own (make_input rebuilds any rank's input)."""
import numpy as np
import pytest

import pydist as dist
from helpers import DTYPES, OPS, make_input, parallel_assert, reference, valid

SIZES = [0, 1, 7, 1000]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS, ids=[o.name for o in OPS])
def test_reduce_every_root(op, dtype):
    rank, size = dist.get_rank(), dist.get_world_size()
    ok = True
    for root in range(size):
        for n in (0, 1, 13):
            x = make_input(4, rank, (n,), dtype, op)
            if not valid(op, dtype):
                with pytest.raises(TypeError):
                    dist.reduce(x, dst=root, op=op)
                continue
            before = x.copy()
            dist.reduce(x, dst=root, op=op)
            if rank == root:
                ok &= np.array_equal(x, reference(op, [make_input(4, r, (n,), dtype, op) for r in range(size)]))
            else:
                ok &= np.array_equal(x, before)   # only read on other ranks
    parallel_assert(ok)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_all_gather_list_and_tensor(dtype, n):
    rank, size = dist.get_rank(), dist.get_world_size()
    x = make_input(5, rank, (n,), dtype)
    expected = [make_input(5, r, (n,), dtype) for r in range(size)]
    outs = [np.zeros(n, dtype) for _ in range(size)]
    dist.all_gather(outs, x)
    ok = all(np.array_equal(o, e) for o, e in zip(outs, expected))
    flat = np.zeros(n * size, dtype)
    dist.all_gather_into_tensor(flat, x)
    ok &= np.array_equal(flat, np.concatenate(expected))
    # torch's in-place form: the input is this rank's own slice of the output
    flat2 = np.zeros(n * size, dtype)
    flat2[rank * n:(rank + 1) * n] = x
    dist.all_gather_into_tensor(flat2, flat2[rank * n:(rank + 1) * n])
    ok &= np.array_equal(flat2, np.concatenate(expected))
    parallel_assert(ok)


@pytest.mark.parametrize("dtype", ["int32", "float64", "complex64", "bool"])
def test_gather_and_scatter_every_root(dtype):
    rank, size = dist.get_rank(), dist.get_world_size()
    ok = True
    for root in range(size):
        x = make_input(6, rank, (3, 5), dtype)
        gl = [np.zeros((3, 5), dtype) for _ in range(size)] if rank == root else None
        dist.gather(x, gl, dst=root)
        if rank == root:
            ok &= all(np.array_equal(g, make_input(6, r, (3, 5), dtype)) for r, g in enumerate(gl))
        sl = [make_input(7, root * 10 + r, (4,), dtype) for r in range(size)] if rank == root else None
        out = np.zeros(4, dtype)
        dist.scatter(out, sl, src=root)
        ok &= np.array_equal(out, make_input(7, root * 10 + rank, (4,), dtype))
    parallel_assert(ok)


def test_gather_scatter_list_on_the_wrong_rank():
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.zeros(2)
    if rank == 0:
        with pytest.raises(ValueError, match="gather_list"):
            dist.gather(x, None, dst=0)
        with pytest.raises(ValueError, match="scatter_list"):
            dist.scatter(x, None, src=0)
        with pytest.raises(ValueError, match="one array per rank"):
            dist.gather(x, [np.zeros(2)] * (size + 1), dst=0)
    elif rank == 1:
        with pytest.raises(ValueError, match="must be None"):
            dist.gather(x, [np.zeros(2)] * size, dst=0)
    parallel_assert(True)


@pytest.mark.parametrize("dtype", ["int64", "float32", "float16", "complex128"])
@pytest.mark.parametrize("op", [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.AVG], ids=lambda o: o.name)
@pytest.mark.parametrize("n", [0, 1, 7])
def test_reduce_scatter(dtype, op, n):
    rank, size = dist.get_rank(), dist.get_world_size()
    inputs = [make_input(8, r, (size * n,), dtype, op) for r in range(size)]
    if not valid(op, dtype):
        with pytest.raises(TypeError):
            dist.reduce_scatter_tensor(np.zeros(n, dtype), inputs[rank], op=op)
        return
    full = reference(op, inputs)
    out = np.zeros(n, dtype)
    dist.reduce_scatter_tensor(out, inputs[rank], op=op)
    ok = np.array_equal(out, full[rank * n:(rank + 1) * n])
    out2 = np.zeros(n, dtype)
    dist.reduce_scatter(out2, [inputs[rank][i * n:(i + 1) * n].copy() for i in range(size)], op=op)
    ok &= np.array_equal(out2, full[rank * n:(rank + 1) * n])
    parallel_assert(ok)


@pytest.mark.parametrize("dtype", ["uint8", "float64", "complex64"])
def test_all_to_all_single_equal_and_uneven(dtype):
    rank, size = dist.get_rank(), dist.get_world_size()
    # equal blocks of 2 rows x 3 columns
    x = make_input(9, rank, (2 * size, 3), dtype)
    out = np.zeros((2 * size, 3), dtype)
    dist.all_to_all_single(out, x)
    expected = np.concatenate([make_input(9, r, (2 * size, 3), dtype)[2 * rank:2 * rank + 2] for r in range(size)])
    ok = np.array_equal(out, expected)
    # uneven: rank r sends (r + j) % 3 rows to rank j
    splits = lambda r: [(r + j) % 3 for j in range(size)]  # noqa: E731
    x = make_input(10, rank, (sum(splits(rank)), 2), dtype)
    recv_splits = [splits(r)[rank] for r in range(size)]
    out = np.zeros((sum(recv_splits), 2), dtype)
    dist.all_to_all_single(out, x, output_split_sizes=recv_splits, input_split_sizes=splits(rank))
    parts = []
    for r in range(size):
        xr = make_input(10, r, (sum(splits(r)), 2), dtype)
        start = sum(splits(r)[:rank])
        parts.append(xr[start:start + splits(r)[rank]])
    ok &= np.array_equal(out, np.concatenate(parts))
    parallel_assert(ok)


def test_all_to_all_lists():
    rank, size = dist.get_rank(), dist.get_world_size()
    ins = [np.full(3, rank * 100 + j, np.int64) for j in range(size)]
    outs = [np.zeros(3, np.int64) for _ in range(size)]
    dist.all_to_all(outs, ins)
    parallel_assert(all(np.array_equal(outs[i], np.full(3, i * 100 + rank)) for i in range(size)))


def test_async_collectives_out_of_order():
    rank, size = dist.get_rank(), dist.get_world_size()
    g = [np.zeros(4) for _ in range(size)]
    w1 = dist.all_gather(g, np.full(4, float(rank)), async_op=True)
    r = np.full(3, rank + 1.0)
    w2 = dist.reduce(r, dst=0, async_op=True)
    o = np.zeros(2)
    w3 = dist.reduce_scatter_tensor(o, np.ones(2 * size), async_op=True)
    for w in (w3, w1, w2):
        assert w.wait() is True
    ok = all(np.array_equal(g[i], np.full(4, float(i))) for i in range(size))
    ok &= np.array_equal(o, np.full(2, float(size)))
    if rank == 0:
        ok &= np.array_equal(r, np.full(3, size * (size + 1) / 2))
    parallel_assert(ok)


@pytest.mark.parametrize("n", [1, 300, 20000])   # float32: the slots up to 64 KiB, MPI's path past them
def test_inputs_that_are_part_of_the_output(n):
    """A rank's own block comes straight from its input (not back out of its slot), so an input that is
    the output, or another block of it, must still give the plain result on every path."""
    rank, size = dist.get_rank(), dist.get_world_size()
    blocks = [make_input(9, r, (n,), "float32") for r in range(size)]
    wrong = []
    # all_gather_into_tensor from another rank's block of the output (holding this rank's data)
    flat = np.zeros(n * size, np.float32)
    other = (rank + 1) % size
    flat[other * n:(other + 1) * n] = blocks[rank]
    dist.all_gather_into_tensor(flat, flat[other * n:(other + 1) * n])
    if not np.array_equal(flat, np.concatenate(blocks)):
        wrong.append("all_gather_into_tensor from another block of the output")
    # all_to_all_single in place: row p of the input goes to rank p
    rows = lambda r: np.concatenate([make_input(10, r * size + p, (n,), "float32") for p in range(size)])
    a = rows(rank)
    dist.all_to_all_single(a, a)
    if not np.array_equal(a, np.concatenate([rows(r)[rank * n:(rank + 1) * n] for r in range(size)])):
        wrong.append("all_to_all_single in place")
    # reduce_scatter_tensor into this rank's own chunk of the input, and into another one
    for target in (rank, other):
        big = rows(rank)
        dist.reduce_scatter_tensor(big[target * n:(target + 1) * n], big)
        expected = np.sum([rows(r)[rank * n:(rank + 1) * n] for r in range(size)], axis=0, dtype=np.float32)
        if not np.array_equal(big[target * n:(target + 1) * n], expected):
            wrong.append(f"reduce_scatter_tensor into chunk {target}")
    # scatter whose root receives into its own entry of the list
    for root in range(size):
        sl = [make_input(11, root * 10 + r, (n,), "float32") for r in range(size)] if rank == root else None
        out = sl[rank] if rank == root else np.zeros(n, np.float32)
        dist.scatter(out, sl, src=root)
        if not np.array_equal(out, make_input(11, root * 10 + rank, (n,), "float32")):
            wrong.append(f"scatter from {root} into the root's own entry")
    parallel_assert(not wrong, "; ".join(wrong))


# Past the slots (64 KiB per rank), and a broadcast past 32 KiB: at 2 ranks one point-to-point exchange
# on the group's private communicator (request.c's pair path), elsewhere MPI's collective. Every form
# the pair path takes, blocking and async (several outstanding, waited out of order), from every root.
@pytest.mark.parametrize("nbytes", [40 << 10, 80 << 10, 1 << 20])
@pytest.mark.parametrize("dtype", ["uint8", "float64", "complex128"])
def test_past_the_slots_every_form(nbytes, dtype):
    rank, size = dist.get_rank(), dist.get_world_size()
    n = nbytes // np.dtype(dtype).itemsize
    seed = nbytes % 997
    wrong = []
    for root in range(size):
        for async_op in (False, True):
            x = make_input(seed, root, (n,), dtype) if rank == root else np.zeros(n, dtype)
            w = dist.broadcast(x, root, async_op=async_op)
            if async_op:
                w.wait()
            if not np.array_equal(x, make_input(seed, root, (n,), dtype)):
                wrong.append(f"broadcast from {root}, async_op={async_op}")
    mine = make_input(seed + 1, rank, (n,), dtype)
    every = [make_input(seed + 1, r, (n,), dtype) for r in range(size)]
    flat, outs = np.zeros(n * size, dtype), [np.zeros(n, dtype) for _ in range(size)]
    in_place = np.zeros(n * size, dtype)
    in_place[rank * n:(rank + 1) * n] = mine
    # all_to_all_single: even rows, then uneven (rank r sends r + p + 1 rows to p)
    rows = lambda r: make_input(seed + 2, r, (size, n // size), dtype)  # noqa: E731
    a2a = np.zeros((size, n // size), dtype)
    splits = lambda r: [r + p + 1 for p in range(size)]  # noqa: E731
    ragged = lambda r: make_input(seed + 3, r, (sum(splits(r)), 3), dtype)  # noqa: E731
    recv_splits = [splits(r)[rank] for r in range(size)]
    uneven = np.zeros((sum(recv_splits), 3), dtype)
    list_outs = [np.zeros(n // size, dtype) for _ in range(size)]
    works = [dist.all_gather_into_tensor(flat, mine, async_op=True),
             dist.all_gather(outs, mine, async_op=True),
             dist.all_gather_into_tensor(in_place, in_place[rank * n:(rank + 1) * n], async_op=True),
             dist.all_to_all_single(a2a, rows(rank), async_op=True),
             dist.all_to_all_single(uneven, ragged(rank), output_split_sizes=recv_splits,
                                    input_split_sizes=splits(rank), async_op=True),
             dist.all_to_all(list_outs, list(rows(rank)), async_op=True)]
    for w in reversed(works):
        w.wait()
    if not np.array_equal(flat, np.concatenate(every)):
        wrong.append("all_gather_into_tensor")
    if not all(np.array_equal(o, e) for o, e in zip(outs, every)):
        wrong.append("all_gather")
    if not np.array_equal(in_place, np.concatenate(every)):
        wrong.append("all_gather_into_tensor in place")
    if not np.array_equal(a2a, np.stack([rows(r)[rank] for r in range(size)])):
        wrong.append("all_to_all_single")
    expected = [ragged(r)[sum(splits(r)[:rank]):sum(splits(r)[:rank + 1])] for r in range(size)]
    if not np.array_equal(uneven, np.concatenate(expected)):
        wrong.append("all_to_all_single uneven")
    if not all(np.array_equal(list_outs[r], rows(r)[rank]) for r in range(size)):
        wrong.append("all_to_all lists")
    # the same blocking, once more each
    flat[:] = 0
    dist.all_gather_into_tensor(flat, mine)
    a2a[:] = 0
    dist.all_to_all_single(a2a, rows(rank))
    if not (np.array_equal(flat, np.concatenate(every)) and
            np.array_equal(a2a, np.stack([rows(r)[rank] for r in range(size)]))):
        wrong.append("blocking all_gather_into_tensor / all_to_all_single")
    parallel_assert(not wrong, f"rank {rank}: wrong results: {wrong}")
