"""The path table (issue 46; csrc/paths/tuned.c, pydist/_path_table.py): a table that forces each path a
collective has carries it at each size, names it on the timeline, and gives NumPy's answer on every rank;
a rank whose call sits on the other side of a row still raises ValueError with every other; the rows
are checked. Every test leaves the session without a table, as the others run. Any world size (the
table only acts on a group of 2 or more within one node)."""
import numpy as np
import pytest

import pydist as dist
from helpers import make_input, parallel_assert
from test_timeline_calls import calls, check_on_root, record

from pydist import _path_table as pt

# (input bytes per rank) a small call, one just under the slots' 64 KiB, and one past them with an
# odd number of elements per block
SIZES = (8, 48 << 10, (256 << 10) + 12)
NAMES = {"pair": "shm header + pair", "mpi": "shm header + MPI", "ring": "shm header + ring", "shm": "shm",
         "slots": "small shm"}
if not dist._C.mpi_info()["isendrecv"]:   # Open MPI 4.1: its MPI carries the pair exchange's and the ring's calls
    NAMES.update(pair=NAMES["mpi"], ring=NAMES["mpi"])


def force(op, path, size):
    dist._C.set_path_table([(size, pt.OPS.index(op), pt.PATHS.index(path) + 1, 1 << 62)])


def one_node():
    info = dist._C.shm_info()
    size = dist.get_world_size()
    return size > 1 and bool(info["segment"]) and info["node_size"] == size and info["small_bytes"] > 0


def run(op, nbytes, seed):
    """op's call on this rank's input of about nbytes; returns (result, NumPy's result)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    n = max(size, nbytes // 4 // size * size)
    inputs = [make_input(seed, r, (n,), "float32") for r in range(size)]
    x = inputs[rank].copy()
    if op == "all_reduce":
        dist.all_reduce(x)
        return x, np.sum(inputs, axis=0, dtype=np.float32)
    if op == "broadcast":
        dist.broadcast(x, 0)
        return x, inputs[0]
    if op == "all_gather":
        out = np.empty(n * size, np.float32)
        dist.all_gather_into_tensor(out, x)
        return out, np.concatenate(inputs)
    if op == "all_to_all":
        out = np.empty(n, np.float32)
        dist.all_to_all_single(out, x)
        block = n // size
        return out, np.concatenate([inputs[r][rank * block:(rank + 1) * block] for r in range(size)])
    out = np.empty(n // size, np.float32)
    dist.reduce_scatter_tensor(out, x)
    block = n // size
    return out, np.sum(inputs, axis=0, dtype=np.float32)[rank * block:(rank + 1) * block]


def cases():
    size = dist.get_world_size()
    slots = dist._C.shm_info()["small_bytes"]
    return [(op, path, nbytes) for op in pt.OPS for path in pt.paths_of(op, max(size, 2))
            for nbytes in SIZES if path != "slots" or nbytes <= slots]


def test_each_forced_path_carries_each_collective_at_each_size():
    size = dist.get_world_size()
    todo = cases()
    wrong, said = [], []

    def body():
        for i, (op, path, nbytes) in enumerate(todo):
            force(op, path, max(size, 2))   # (a world of 1 has no group the table acts on)
            try:
                got, want = run(op, nbytes, seed=i)
                said.append(dist._C.last_call_path())
            finally:
                dist._C.set_path_table(None)
            if not np.array_equal(got, want):
                wrong.append((op, path, nbytes))

    events = record(body)
    parallel_assert(not wrong, f"results differ from NumPy's: {wrong}")
    tabled = one_node()
    # _C.last_call_path() names what the timeline names (python -m pydist.tune asks it)
    parallel_assert(not tabled or said == [NAMES[path] for _, path, _ in todo], f"{list(zip(todo, said))}")

    def check(ev):
        for r in range(size):
            got = [c["path"] for c in calls(ev, r)]
            if tabled:
                want = [NAMES[path] for _, path, _ in todo]
                assert got == want, f"rank {r}: {list(zip(todo, got))}"
            else:   # a table acts only within one node, on 2 ranks or more: MPI's own paths
                assert not set(got) & set(NAMES.values()) - {"shm"}, got
    check_on_root(events, check)


def test_the_ring_reduce_scatter_only_reads_its_input_and_takes_torchs_forms():
    # AVG (the Work divides), the output as this rank's own chunk of the input (sent from a copy), and an
    # async call on one rank while the others block (every rank then takes MPI's path)
    rank, size = dist.get_rank(), dist.get_world_size()
    block = 70001
    inputs = [make_input(7, r, (block * size,), "float32") for r in range(size)]
    want = np.sum(inputs, axis=0, dtype=np.float32)[rank * block:(rank + 1) * block]
    force("reduce_scatter", "ring", max(size, 2))
    try:
        x, out = inputs[rank].copy(), np.empty(block, np.float32)
        dist.reduce_scatter_tensor(out, x, op=dist.ReduceOp.AVG)
        avg_path = dist._C.last_call_path()
        y = inputs[rank].copy()
        dist.reduce_scatter_tensor(y[rank * block:(rank + 1) * block], y)
        z = np.empty(block, np.float32)
        work = dist.reduce_scatter_tensor(z, inputs[rank], async_op=rank == 0)
        if rank == 0:
            work.wait()
        mixed_path = dist._C.last_call_path()
    finally:
        dist._C.set_path_table(None)
    parallel_assert(np.array_equal(x, inputs[rank]), "the ring wrote into its input")
    parallel_assert(np.array_equal(out, want / np.float32(size)), f"AVG: {out[:3]} against {want[:3] / size}")
    parallel_assert(np.array_equal(y[rank * block:(rank + 1) * block], want), "in place")
    parallel_assert(np.array_equal(z, want), "one rank async")
    if one_node():
        parallel_assert(avg_path == NAMES["ring"], avg_path)
        parallel_assert(mixed_path == NAMES["mpi"] or rank == 0, mixed_path)   # (rank 0's Work names its own)


@pytest.mark.world_size(min=2)
def test_a_call_across_a_row_still_raises_on_every_rank_then_works():
    rank, size = dist.get_rank(), dist.get_world_size()
    op = pt.OPS.index("all_reduce")
    dist._C.set_path_table([(size, op, pt.PATHS.index("ring") + 1, 64 << 10),
                            (size, op, pt.PATHS.index("shm") + 1, 1 << 62)])
    if not one_node():
        # ranks on several nodes (or a launcher whose ranks MPI places on nodes of their own): the table
        # does not act; a mismatch there is MPI's, so every rank makes the same call, by MPI's path
        try:
            y = np.ones(32 << 10, np.float32)
            dist.all_reduce(y)
            path = dist._C.last_call_path()
        finally:
            dist._C.set_path_table(None)
        parallel_assert(np.all(y == size) and path in ("MPI", "persistent"), f"{path} {y[:2]}")
        return
    try:
        x = np.ones((16 << 10) + (rank == size - 1) * (16 << 10), np.float32)   # 64 KiB; the last rank 128
        with pytest.raises(ValueError, match="do not match"):
            dist.all_reduce(x)
        untouched = bool(np.all(x == 1))
        y = np.ones(32 << 10, np.float32)   # 128 KiB on every rank: shm
        dist.all_reduce(y)
    finally:
        dist._C.set_path_table(None)
    parallel_assert(untouched and np.all(y == size), f"{x[:2]} {y[:2]}")


def test_rows_are_checked():
    ok = [(2, 0, 1, 1024), (2, 0, 4, 1 << 40), (3, 1, 3, 8)]
    dist._C.set_path_table(ok)
    try:
        assert dist._C.path_table() == ok
        for rows, error, match in [
            (5, TypeError, "sequence"),
            ([[2, 0, 1, 8]], TypeError, "tuple"),
            ([(2, 0, 1.0, 8)], TypeError, "ints"),
            ([(1, 0, 1, 8)], ValueError, "out of range"),
            ([(2, 5, 1, 8)], ValueError, "out of range"),
            ([(2, 0, 1, 0)], ValueError, "out of range"),
            ([(2, 0, 1, -1)], ValueError, "out of range"),
            ([(2, 0, 1, 1 << 70)], ValueError, "out of range"),
            ([(3, 1, 2, 8)], ValueError, "does not have"),       # the pair exchange is for 2 ranks
            ([(2, 4, 5, 8)], ValueError, "does not have"),       # reduce_scatter has no shm
            ([(2, 0, 9, 8)], ValueError, "does not have"),
            ([(2, 0, 1, 64), (2, 0, 3, 64)], ValueError, "increasing"),
            ([(3, 0, 1, 64), (2, 0, 3, 128)], ValueError, "increasing"),
            ([(2, 0, 1, 8)] * 3000, ValueError, "too many"),
        ]:
            with pytest.raises(error, match=match):
                dist._C.set_path_table(rows)
            assert dist._C.path_table() == ok, rows   # a refused table leaves the one in use
    finally:
        dist._C.set_path_table(None)
    assert dist._C.path_table() == []


def test_the_forcing_tables_name_a_path_each_collective_has():
    for spec, want in [("mpi", {op: "mpi" for op in pt.OPS}),
                       ("ring,pair", {"all_reduce": "ring", "broadcast": "pair", "all_gather": "pair",
                                      "all_to_all": "pair", "reduce_scatter": "ring"}),
                       ("shm", {"all_reduce": "shm"})]:
        table = pt.forcing(spec)
        pt.check(table)
        assert {op: rows[0][1] for op, rows in table["tables"]["2"].items()} == want, spec
        assert "pair" not in str(table["tables"]["3"]), spec
    for bad in ("", "fast", "ring,,mpi"):
        with pytest.raises(ValueError, match="paths are"):
            pt.forcing(bad)
