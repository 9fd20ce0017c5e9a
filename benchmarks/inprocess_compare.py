#!/usr/bin/env python3
"""pydist beside mpi4py in ONE process: the same MPI, the same buffers, calls alternated, so that a VM's
swings from one job to the next (2-4x on some cells of collectives_sweep.py here) fall on both alike.

    mpiexec -n 2 python benchmarks/inprocess_compare.py                 # 64 KiB .. 4 MiB
    mpiexec -n 2 python benchmarks/inprocess_compare.py --sizes 65536   # one size

pydist initializes MPI; mpi4py then uses it (mpi4py.rc.initialize = False). mpi4py's blocking call is
raw MPI plus its binding's cost (about 0.3-0.5 us a call at 1 KiB in collectives_sweep.py). For each
collective and size: the fastest of --repeats rounds of each, as microseconds, and mpi4py/pydist
(> 1: pydist faster). float32; SIZE as in collectives_sweep.py (the whole buffer).
"""
import argparse
import time

import numpy as np

import pydist as dist


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[65536, 262144, 1 << 20, 4 << 20])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=0.02, help="timed seconds per round (default 0.02)")
    args = ap.parse_args()
    dist.init_process_group(backend="mpi")
    import mpi4py
    mpi4py.rc.initialize = mpi4py.rc.finalize = False
    from mpi4py import MPI
    comm, rank, size = MPI.COMM_WORLD, dist.get_rank(), dist.get_world_size()
    largest = max(args.sizes) // 4
    a, o = np.zeros(largest * size, np.float32), np.zeros(largest * size, np.float32)

    def bench(f, iters):
        for _ in range(iters // 10 + 2):
            f()
        comm.Barrier()
        t = time.perf_counter()
        for _ in range(iters):
            f()
        e = np.array([time.perf_counter() - t])
        comm.Allreduce(MPI.IN_PLACE, e, op=MPI.MAX)
        return e[0] / iters * 1e6

    if rank == 0:
        print(f"# {size} ranks, fastest of {args.repeats} alternated rounds, us per call; mpi4py/pydist > 1: pydist faster")
        print(f"{'collective':15s} {'size':>9s} {'pydist':>9s} {'mpi4py':>9s} {'ratio':>6s}")
    for n in sorted(args.sizes):
        k = n // 4
        x, y, chunk = a[:k], o[:k], k // size
        pairs = {
            "all_reduce": (lambda: dist.all_reduce(x), lambda: comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)),
            "all_gather": (lambda: dist.all_gather_into_tensor(y, x[:chunk]), lambda: comm.Allgather(x[:chunk], y)),
            "reduce_scatter": (lambda: dist.reduce_scatter_tensor(y[:chunk], x),
                               lambda: comm.Reduce_scatter_block(x, y[:chunk], op=MPI.SUM)),
            "broadcast": (lambda: dist.broadcast(x, 0), lambda: comm.Bcast(x, root=0)),
            "all_to_all": (lambda: dist.all_to_all_single(y, x), lambda: comm.Alltoall(x, y)),
        }
        iters = max(10, int(args.seconds / (n / 5e9 + 3e-6)))
        for name, (ours, theirs) in pairs.items():
            best_p = best_m = float("inf")
            for _ in range(args.repeats):
                best_p = min(best_p, bench(ours, iters))
                best_m = min(best_m, bench(theirs, iters))
            if rank == 0:
                print(f"{name:15s} {n:9d} {best_p:9.2f} {best_m:9.2f} {best_m / best_p:6.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
