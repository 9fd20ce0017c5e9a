#!/usr/bin/env python3
"""Cliffs in sequences: what a pydist collective costs right after another call, against what it costs
alone. Whatever state one call leaves for the next (a cache, a slot, a page, a path's mode) must not
cost the next call more than a little (issue 46: at most 10%).

    mpiexec -n 2 python benchmarks/mixed_sequence.py
    mpiexec -n 2 python benchmarks/mixed_sequence.py --sizes 8 1048576 --repeats 5

For each size (float32, SIZE the whole buffer as collectives_sweep.py counts it) and each collective A
of the five: A alone, a loop of A; then A after B, for every collective B, as pydist's call and as
mpi4py's blocking call (a loop of B then A; only A is timed). Each cell is the mean time of A per call
on the slowest rank, its median over --repeats; the table shows each cell over A alone, and the worst
cell is printed last. mpi4py is optional (the rows after mpi4py's calls are left out without it).

A call timed right after a different one also pays for what that one left: the peer still finishing
it (the skew it leaves between the ranks) and caches holding other lines. So the same measure of
mpi4py's own calls, A after mpi4py's B over A alone, is printed beside as the reference: what a
sequence costs an MPI library that keeps no state of its own between calls.
"""
import argparse
import statistics
import time

import numpy as np

import pydist as dist

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
GOAL = 1.10


def pydist_calls(x, y, chunk):
    return {"all_reduce": lambda: dist.all_reduce(x),
            "all_gather": lambda: dist.all_gather_into_tensor(y, x[:chunk]),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(y[:chunk], x),
            "broadcast": lambda: dist.broadcast(x, 0),
            "all_to_all": lambda: dist.all_to_all_single(y, x)}


def mpi4py_calls(comm, x, y, chunk):
    from mpi4py import MPI
    return {"all_reduce": lambda: comm.Allreduce(MPI.IN_PLACE, x),
            "all_gather": lambda: comm.Allgather(x[:chunk], y),
            "reduce_scatter": lambda: comm.Reduce_scatter_block(x, y[:chunk]),
            "broadcast": lambda: comm.Bcast(x, root=0),
            "all_to_all": lambda: comm.Alltoall(x, y)}


def timed(call, before, iters):
    """Mean seconds of `call` per iteration of (before(), call()), on the slowest rank."""
    for _ in range(3):
        before()
        call()
    dist.barrier()
    spent = 0.0
    for _ in range(iters):
        before()
        t = time.perf_counter()
        call()
        spent += time.perf_counter() - t
    out = np.array([spent / iters])
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return float(out[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 4096, 262144, 1 << 20, 2 << 20])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=0.02, help="timed seconds per cell (sets the iterations)")
    args = ap.parse_args()
    dist.init_process_group(backend="mpi")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    try:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    except ImportError:
        comm = None
    worst, reference = (0.0, ""), (0.0, "")
    for nbytes in args.sizes:
        unit = 4 * ranks
        nbytes = max(unit, nbytes // unit * unit)
        x, y = np.ones(nbytes // 4, np.float32), np.zeros(nbytes // 4, np.float32)
        chunk = x.size // ranks
        ours = pydist_calls(x, y, chunk)
        kinds = {"pydist": ours}
        if comm is not None:
            kinds["mpi4py"] = mpi4py_calls(comm, x, y, chunk)
        iters = max(5, min(20000, int(args.seconds / (2e-6 + nbytes / 2e9))))
        cells = {}
        for _ in range(args.repeats):
            for a in OPS:
                cells.setdefault((a, "alone"), []).append(timed(ours[a], lambda: None, iters))
                for kind, calls in kinds.items():
                    for b in OPS:
                        cells.setdefault((a, f"{kind} {b}"), []).append(timed(ours[a], calls[b], iters))
            if comm is not None:   # the reference: mpi4py's call after mpi4py's
                theirs = kinds["mpi4py"]
                for a in OPS:
                    cells.setdefault((a, "mpi4py alone"), []).append(timed(theirs[a], lambda: None, iters))
                    for b in OPS:
                        cells.setdefault((a, f"mpi4py after {b}"), []).append(timed(theirs[a], theirs[b], iters))
        med = {k: statistics.median(v) for k, v in cells.items()}
        if rank == 0:
            befores = [f"{kind} {b}" for kind in kinds for b in OPS]
            print(f"\n{nbytes} B, {ranks} ranks: pydist's call after another, over the same call alone "
                  f"(alone in us; median of {args.repeats}, {iters} calls each)")
            print(f"{'call':<15} {'alone us':>9} | " + " ".join(f"{b.split()[1][:10]:>10}" for b in befores))
            print(f"{'':<15} {'':>9} | " + " ".join(f"{b.split()[0]:>10}" for b in befores))
            for a in OPS:
                alone = med[(a, "alone")]
                ratios = [med[(a, b)] / alone for b in befores]
                print(f"{a:<15} {alone * 1e6:>9.2f} | " + " ".join(f"{r:>10.2f}" for r in ratios))
                for b, r in zip(befores, ratios):
                    if r > worst[0]:
                        worst = (r, f"{a} of {nbytes} B after {b}: {med[(a, b)] * 1e6:.2f} us against "
                                    f"{alone * 1e6:.2f} alone")
                for b in OPS if comm is not None else ():
                    theirs_alone, after = med[(a, "mpi4py alone")], med[(a, f"mpi4py after {b}")]
                    if after / theirs_alone > reference[0]:
                        reference = (after / theirs_alone, f"mpi4py's {a} of {nbytes} B after its {b}: "
                                     f"{after * 1e6:.2f} us against {theirs_alone * 1e6:.2f} alone")
    if rank == 0:
        print(f"\nworst cell: {worst[0]:.2f}x, {worst[1]} (issue 46's goal: <= {GOAL:.2f}x)")
        if reference[1]:
            print(f"reference, mpi4py alone: {reference[0]:.2f}x, {reference[1]}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
