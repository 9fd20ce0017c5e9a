#!/usr/bin/env python3
"""The path table's before and after in one job: each collective at each size by pydist's built-in
choice, by the table's (this machine's cached one, or PYDIST_TUNE's), and by mpi4py, in turn.

    python -m pydist.tune                                   # measure the table first
    mpiexec -n 2 python benchmarks/path_table.py            # every power of two, 8 B .. 64 MiB
    mpiexec -n 2 python benchmarks/path_table.py --quick    # three sizes, one repeat (a smoke test)

Separate jobs of the same program differ by up to 2x on a shared VM (its speed changes over minutes),
more than the paths differ; here the three take turns within each repeat of one job, so they meet the
same machine, and each goes first in turn. Each timing is a batch of back-to-back calls after a
barrier, as the slowest rank saw it (collectives_sweep.py's measure); the median of --repeats. The
input is each rank's own array, as the table counts it (all_gather: its block; the sweep counts the
output). Prints, per collective and size, the three times, table/built-in and table/mpi4py, and the
worst of each.
"""
import argparse
import os
import sys
import time

import numpy as np

import pydist as dist
from pydist import _path_table as pt, tune


def fmt(n):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def mpi4py_call(op, x, out, comm, MPI):
    """mpi4py's blocking call of `op` on the arrays pydist's call takes (tune.arrays_for)."""
    return {"all_reduce": lambda: comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM),
            "broadcast": lambda: comm.Bcast(x, root=0),
            "all_gather": lambda: comm.Allgather(x, out),
            "all_to_all": lambda: comm.Alltoall(x, out),
            "reduce_scatter": lambda: comm.Reduce_scatter_block(x, out, op=MPI.SUM)}[op]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", nargs="+", default=list(pt.OPS), choices=pt.OPS)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1 << k for k in range(3, 27)])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="8 B, 64 KiB and 1 MiB, one repeat")
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.repeats = [8, 64 << 10, 1 << 20], 1
    from mpi4py import MPI
    dist.init_process_group()
    comm = MPI.COMM_WORLD
    rank, ranks = dist.get_rank(), dist.get_world_size()
    table = dist._C.path_table()
    if not any(r[0] == ranks for r in table):
        if rank == 0:
            print(f"path_table: no rows for {ranks} ranks in the table in use (PYDIST_TUNE="
                  f"{os.environ.get('PYDIST_TUNE', 'unset')}); run `python -m pydist.tune` first", file=sys.stderr)
        dist.destroy_process_group()
        sys.exit(2)
    if rank == 0:
        print(f"path table against pydist's built-in choice and mpi4py, {ranks} ranks, median of {args.repeats}, "
              f"us; table/built and table/mpi4py < 1: the table is faster")
    worst = {"built": (0.0, ""), "mpi4py": (0.0, "")}
    for op in args.ops:
        if rank == 0:
            print(f"{op}\n{'input':>9} {'built-in':>10} {'table':>10} {'mpi4py':>10} {'table/built':>12} "
                  f"{'table/mpi4py':>13}")
        for nbytes in args.sizes:
            x, out = tune.arrays_for(op, nbytes, ranks, rank)
            ours, theirs = tune.call_of(op, x, out), mpi4py_call(op, x, out, comm, MPI)
            batch = max(2, min(64, (2 << 20) // nbytes))
            ways = {"built": (None, ours), "table": (table, ours), "mpi4py": (table, theirs)}
            times = {k: [] for k in ways}
            names = list(ways)
            for rep in range(-1, args.repeats):
                for name in names[rep % 3:] + names[:rep % 3]:   # each goes first in turn: no order bias
                    rows, call = ways[name]
                    dist._C.set_path_table(rows)
                    comm.Barrier()
                    t = time.perf_counter()
                    for _ in range(batch):
                        call()
                    dt = comm.allreduce((time.perf_counter() - t) / batch, op=MPI.MAX)
                    if rep >= 0:
                        times[name].append(dt * 1e6)
            dist._C.set_path_table(table)
            med = {k: float(np.median(v)) for k, v in times.items()}
            vs_built, vs_mpi4py = med["table"] / med["built"], med["table"] / med["mpi4py"]
            for key, ratio in (("built", vs_built), ("mpi4py", vs_mpi4py)):
                if ratio > worst[key][0]:
                    worst[key] = (ratio, f"{op} {fmt(nbytes)}")
            if rank == 0:
                print(f"{fmt(nbytes):>9} {med['built']:10.2f} {med['table']:10.2f} {med['mpi4py']:10.2f} "
                      f"{vs_built:12.3f} {vs_mpi4py:13.3f}", flush=True)
    if rank == 0:
        print(f"worst table/built-in: {worst['built'][0]:.3f} at {worst['built'][1]}; "
              f"worst table/mpi4py: {worst['mpi4py'][0]:.3f} at {worst['mpi4py'][1]}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
