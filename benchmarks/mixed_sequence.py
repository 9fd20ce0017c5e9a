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
from collectives_sweep import OPS, mpi4py_calls, pydist_calls   # the same five calls the sweep times

GOAL = 1.10


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
        import mpi4py  # noqa: F401  (mpi4py_calls imports MPI)
        libraries = ("pydist", "mpi4py")
    except ImportError:
        libraries = ("pydist",)
    worst = {}   # measured library -> (ratio, what)
    for nbytes in args.sizes:
        unit = 4 * ranks
        nbytes = max(unit, nbytes // unit * unit)
        x, y = np.ones(nbytes // 4, np.float32), np.zeros(nbytes // 4, np.float32)
        chunk = x.size // ranks
        calls = {"pydist": pydist_calls(x, y, chunk)}
        if "mpi4py" in libraries:
            calls["mpi4py"] = mpi4py_calls(x, y, chunk)
        # pydist's calls after pydist's and mpi4py's; mpi4py's (the reference) after its own
        befores = {"pydist": [(lib, b) for lib in libraries for b in OPS], "mpi4py": [("mpi4py", b) for b in OPS]}
        iters = max(5, min(20000, int(args.seconds / (2e-6 + nbytes / 2e9))))
        cells = {}
        for _ in range(args.repeats):
            for lib in libraries:
                for a in OPS:
                    cells.setdefault((lib, a, None), []).append(timed(calls[lib][a], lambda: None, iters))
                    for before in befores[lib]:
                        cells.setdefault((lib, a, before), []).append(
                            timed(calls[lib][a], calls[before[0]][before[1]], iters))
        med = {k: statistics.median(v) for k, v in cells.items()}
        for lib in libraries:
            for a in OPS:
                alone = med[(lib, a, None)]
                for before in befores[lib]:
                    ratio = med[(lib, a, before)] / alone
                    if ratio > worst.get(lib, (0.0,))[0]:
                        worst[lib] = (ratio, f"{a} of {nbytes} B after {before[0]}'s {before[1]}: "
                                             f"{med[(lib, a, before)] * 1e6:.2f} us against {alone * 1e6:.2f} alone")
        if rank == 0:
            print(f"\n{nbytes} B, {ranks} ranks: pydist's call after another, over the same call alone "
                  f"(alone in us; median of {args.repeats}, {iters} calls each)")
            print(f"{'call':<15} {'alone us':>9} | " + " ".join(f"{b[:10]:>10}" for _, b in befores["pydist"]))
            print(f"{'':<15} {'':>9} | " + " ".join(f"{lib:>10}" for lib, _ in befores["pydist"]))
            for a in OPS:
                alone = med[("pydist", a, None)]
                print(f"{a:<15} {alone * 1e6:>9.2f} | " +
                      " ".join(f"{med[('pydist', a, before)] / alone:>10.2f}" for before in befores["pydist"]))
    if rank == 0:
        print(f"\nworst cell: {worst['pydist'][0]:.2f}x, {worst['pydist'][1]} (issue 46's goal: <= {GOAL:.2f}x)")
        if "mpi4py" in worst:
            print(f"reference, mpi4py alone: {worst['mpi4py'][0]:.2f}x, mpi4py's {worst['mpi4py'][1]}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
