#!/usr/bin/env python3
"""One measuring run of benchmarks/pipeline.py: a model trained with strategy "pipeline" at one
(stages, micro-batches, schedule), under `mpiexec -n R` (R = stages x replicas).

    mpiexec -n 2 python benchmarks/pipeline_run.py --model mlp --stages 2 --micro-batches 4 --schedule 1f1b

It trains --warmup steps (the slots are allocated and the caches warm), then --steps measured steps in
one call, and rank 0 prints one JSON line: the run's settings, the stage boundaries, the slowest
rank's wall time of the measured steps and the samples/s it gives, and per rank (in rank order) its
pipeline measurements over the measured steps only (Trainer.pipeline_report() is cumulative, so
the difference around them): busy, idle (waiting for a neighbour: the bubble), sync (the replicas'
all-reduce) and step ms per step, the activation slots (peak_slots x slot_bytes is the most
activation memory the stage held at once) and the last step's timeline (kind 0 forward, 1 backward,
2 all-reduce + update; CLOCK_MONOTONIC seconds, one clock for every process on the host).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pydist as dist  # noqa: E402  (after the path: the checkout's pydist, not an installed one)
from pydist.engine import SCHEDULES, Trainer, lenet5, load_fashion_mnist, mlp  # noqa: E402

MODELS = ("lenet5", "mlp")
DELTAS = ("steps", "busy_s", "idle_s", "sync_s", "step_s")   # the cumulative stats


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=MODELS, required=True)
    ap.add_argument("--hidden", type=int, nargs="+", default=[1024] * 8, help="the MLP's widths (default 8 x 1024)")
    ap.add_argument("--stages", type=int, required=True)
    ap.add_argument("--micro-batches", type=int, required=True)
    ap.add_argument("--schedule", choices=SCHEDULES, required=True)
    ap.add_argument("--batch-size", type=int, default=64, help="per replica (default 64)")
    ap.add_argument("--warmup", type=int, default=3, help="steps before the measured ones (default 3)")
    ap.add_argument("--steps", type=int, default=20, help="measured steps (default 20)")
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.warmup < 1 or args.steps < 1:
        ap.error("--warmup and --steps must be >= 1 (the first step allocates the slots)")
    return args


def main(argv=None):
    args = parse_args(argv)
    dist.init_process_group(backend="mpi")
    (images, labels), _ = load_fashion_mnist()
    model = lenet5() if args.model == "lenet5" else mlp(hidden=tuple(args.hidden))
    trainer = Trainer(model, lr=args.lr, momentum=args.momentum, batch_size=args.batch_size, seed=args.seed,
                      strategy="pipeline", stages=args.stages, micro_batches=args.micro_batches,
                      schedule=args.schedule)
    if args.warmup + args.steps > trainer.steps_per_epoch(len(labels)):
        raise SystemExit(f"pipeline_run: {args.warmup + args.steps} steps are more than an epoch's")
    trainer.train_steps(images, labels, 0, 0, args.warmup)
    before = trainer.pipeline_report()
    dist.barrier()   # every rank starts the measured steps together
    started = time.perf_counter()
    trainer.train_steps(images, labels, 0, args.warmup, args.warmup + args.steps)
    seconds = np.array([time.perf_counter() - started])
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)   # the steps are done when the slowest rank's are
    after = trainer.pipeline_report()
    if dist.get_rank() == 0:
        ranks = []
        for b, a in zip(before, after):
            steps = a["steps"] - b["steps"]
            r = {k: v for k, v in a.items() if k not in DELTAS}
            r.update({k[:-2] + "_ms": (a[k] - b[k]) / steps * 1e3 for k in DELTAS[1:]}, steps=steps)
            ranks.append(r)
        replicas = trainer.world // trainer.stages
        result = {"model": args.model, "model_name": model.name, "layers": len(model.layers),
                  "stages": trainer.stages, "replicas": replicas, "world_size": trainer.world,
                  "micro_batches": args.micro_batches, "schedule": args.schedule,
                  "batch_per_replica": args.batch_size, "split": list(trainer.split), "warmup": args.warmup,
                  "steps": args.steps, "seconds": float(seconds[0]),
                  "samples_per_s": args.steps * replicas * args.batch_size / float(seconds[0]),
                  "cpu_count": os.cpu_count(), "ranks": ranks}
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
