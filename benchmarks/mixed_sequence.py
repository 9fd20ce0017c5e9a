#!/usr/bin/env python3
"""Cliffs in sequences: what a pydist collective costs right after another call, against what it costs
alone. Whatever state one call leaves for the next (a cache, a slot, a page, a path's mode) must not
cost the next call more than a little (the goal: at most 10%).

    mpiexec -n 2 python benchmarks/mixed_sequence.py
    mpiexec -n 2 python benchmarks/mixed_sequence.py --sizes 8 1048576 --repeats 5

For each size (float32, SIZE the whole buffer as collectives_sweep.py counts it) and each collective A
of the five: A after B, for every collective B, as pydist's call and as mpi4py's blocking call (a loop
of B then A; only A is timed), over A alone (a loop of A) timed right before it. Each time is the mean
of A per call on the slowest rank. Each repeat takes the B's in another order; a cell is the median of
its repeats' ratios, so that a machine whose speed drifts from one second to the next moves both
halves of a ratio together (the same call after itself then reads 1.00 within a few percent). The
worst cell is printed last. mpi4py is optional (the columns after mpi4py's calls are left out without
it).

Two references say how much of a cell is the sequence's own cost:
- the `copy` column: A after a NumPy copy between two other arrays of A's footprint, no communication.
  A loop of A alone keeps A's buffers (and a path's shared segment) in the core's cache; any other
  call between evicts some of them. What A pays after the copy, it pays for the cache alone.
- mpi4py: the same measure of mpi4py's own calls, A after mpi4py's B over A alone, a library that keeps
  no state of its own between calls; and pydist's A after B against mpi4py's A after mpi4py's B, in time.
"""
import argparse
import statistics
import time

import numpy as np

import pydist as dist
from collectives_sweep import OPS, mpi4py_calls, pydist_calls   # the same five calls the sweep times

GOAL = 1.10
COPY = ("local", "copy")   # the cache reference: a copy of A's footprint between two unrelated arrays


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
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=0.01, help="timed seconds per cell (sets the iterations)")
    args = ap.parse_args()
    dist.init_process_group(backend="mpi")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    try:
        import mpi4py  # noqa: F401  (mpi4py_calls imports MPI)
        libraries = ("pydist", "mpi4py")
    except ImportError:
        libraries = ("pydist",)
    worst = {}   # what -> (ratio, description)

    def note(key, ratio, text):
        if ratio > worst.get(key, (0.0,))[0]:
            worst[key] = (ratio, text)

    for nbytes in args.sizes:
        unit = 4 * ranks
        nbytes = max(unit, nbytes // unit * unit)
        x, y = np.ones(nbytes // 4, np.float32), np.zeros(nbytes // 4, np.float32)
        other_in, other_out = np.ones_like(x), np.zeros_like(y)
        chunk = x.size // ranks
        calls = {"pydist": pydist_calls(x, y, chunk), "local": {"copy": lambda: np.copyto(other_out, other_in)}}
        if "mpi4py" in libraries:
            calls["mpi4py"] = mpi4py_calls(x, y, chunk)
        # pydist's calls after pydist's and mpi4py's; mpi4py's (the reference) after its own
        befores = {"pydist": [(lib, b) for lib in libraries for b in OPS] + [COPY],
                   "mpi4py": [("mpi4py", b) for b in OPS] + [COPY]}
        iters = max(5, min(20000, int(args.seconds / (2e-6 + nbytes / 2e9))))
        ratios, alone, after = {}, {}, {}
        for repeat in range(args.repeats):
            for lib in libraries:
                for a in OPS:
                    order = befores[lib][repeat % len(befores[lib]):] + befores[lib][:repeat % len(befores[lib])]
                    for before in order:
                        t_alone = timed(calls[lib][a], lambda: None, iters)
                        t_after = timed(calls[lib][a], calls[before[0]][before[1]], iters)
                        alone.setdefault((lib, a), []).append(t_alone)
                        after.setdefault((lib, a, before), []).append(t_after)
                        ratios.setdefault((lib, a, before), []).append(t_after / t_alone)
        cell = {k: statistics.median(v) for k, v in ratios.items()}
        for lib in libraries:
            for a in OPS:
                for before in befores[lib]:
                    if before == COPY:
                        continue
                    text = (f"{a} of {nbytes} B after {before[0]}'s {before[1]}: "
                            f"{statistics.median(after[(lib, a, before)]) * 1e6:.2f} us")
                    note(lib, cell[(lib, a, before)], text)
                    if lib == "pydist":
                        note("beyond the cache", cell[(lib, a, before)] / cell[(lib, a, COPY)], text)
                    if lib == "pydist" and before[0] == "pydist" and "mpi4py" in libraries:
                        theirs = statistics.median(after[("mpi4py", a, ("mpi4py", before[1]))])
                        note("against mpi4py", statistics.median(after[(lib, a, before)]) / theirs,
                             text + f", mpi4py's after its own {theirs * 1e6:.2f} us")
        if rank == 0:
            print(f"\n{nbytes} B, {ranks} ranks: pydist's call after another, over the same call alone "
                  f"(alone in us; median of {args.repeats} repeats, {iters} calls each)")
            print(f"{'call':<15} {'alone us':>9} | " + " ".join(f"{b[:10]:>10}" for _, b in befores["pydist"]))
            print(f"{'':<15} {'':>9} | " + " ".join(f"{lib:>10}" for lib, _ in befores["pydist"]))
            for a in OPS:
                print(f"{a:<15} {statistics.median(alone[('pydist', a)]) * 1e6:>9.2f} | " +
                      " ".join(f"{cell[('pydist', a, before)]:>10.2f}" for before in befores["pydist"]))
    if rank == 0:
        print(f"\nworst cell: {worst['pydist'][0]:.2f}x, {worst['pydist'][1]} (goal: <= {GOAL:.2f}x)")
        print(f"beyond the cache (over the same call after a copy): {worst['beyond the cache'][0]:.2f}x, "
              f"{worst['beyond the cache'][1]}")
        if "mpi4py" in worst:
            print(f"reference, mpi4py alone: {worst['mpi4py'][0]:.2f}x, mpi4py's {worst['mpi4py'][1]}")
            print(f"against mpi4py in the same place: {worst['against mpi4py'][0]:.2f}x, {worst['against mpi4py'][1]}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
