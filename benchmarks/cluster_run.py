#!/usr/bin/env python3
"""One job of benchmarks/cluster_model.py, under `mpiexec` (across simulated hosts, or alone): Tsync,
the all-reduce of a gradient-sized float32 array, and the training engine's step time at several
batch sizes per rank. Rank 0 writes one JSON object to --out.

    scripts/cluster.sh run -n 2 -- python benchmarks/cluster_run.py --out r2.json
    python benchmarks/cluster_run.py --out r1.json        # one rank: Tcomp alone

Tsync: the median over --reps timed calls of `pydist.all_reduce` (MPI's: across hosts the shared-memory
paths do not apply) of n bytes, after a warm-up call, each call started together (a barrier before it,
after 10 ms idle: scripts/cluster.sh's token bucket full, as after a training step's compute) and
timed as the slowest rank's. Step time: LeNet-5 on Fashion-MNIST with the allreduce strategy,
--steps steps after --warmup steps, the slowest rank's wall time per step, and the engine's own split
of it (t_comp: forward and backward; t_sync: the gradient all-reduce, as Trainer.fit reports them).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pydist as dist  # noqa: E402  (after the path: the checkout's pydist, not an installed one)
from pydist.engine import Trainer, lenet5, load_fashion_mnist  # noqa: E402


def slowest(*seconds):
    """The slowest rank's value of each (one all-reduce for all of them)."""
    t = np.array(seconds, dtype=np.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def time_all_reduce(nbytes, reps):
    x = np.ones(nbytes // 4, np.float32)
    dist.all_reduce(x, algorithm="mpi")
    times = []
    for _ in range(reps):
        time.sleep(0.01)   # the link's token bucket full again, as after a training step's compute
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(x, algorithm="mpi")
        times.append(slowest(time.perf_counter() - start)[0])
    return float(np.median(times))


def time_steps(images, labels, batch, warmup, steps):
    trainer = Trainer(lenet5(), batch_size=batch, seed=0)
    trainer.train_steps(images, labels, 0, 0, warmup)
    dist.barrier()
    start = time.perf_counter()
    out = trainer.train_steps(images, labels, 0, warmup, warmup + steps)
    wall, comp, sync = slowest(time.perf_counter() - start, out[3], out[4])
    return {"batch": batch, "step_s": wall / steps, "t_comp_s": comp / steps, "t_sync_s": sync / steps,
            "grad_bytes": int(trainer.params.nbytes)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", type=int, nargs="*", default=[246824, 524288, 1048576, 2097152, 4194304],
                    help="all-reduce sizes in bytes (default: LeNet-5's gradient, 241 KiB, to 4 MiB)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--batches", type=int, nargs="*", default=[16, 32, 64, 128, 256])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--data", default=None)
    args = ap.parse_args(argv)
    dist.init_process_group()
    (images, labels), _ = load_fashion_mnist(args.data)
    result = {"world_size": dist.get_world_size(), "tsync": [], "steps": []}
    if dist.get_world_size() > 1:
        result["tsync"] = [{"bytes": n, "seconds": time_all_reduce(n, args.reps)} for n in args.sizes]
    result["steps"] = [time_steps(images, labels, b, args.warmup, args.steps) for b in args.batches]
    result["grad_bytes"] = result["steps"][0]["grad_bytes"]
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
