#!/usr/bin/env python3
"""One training run of benchmarks/compression_cluster.py, under `mpiexec` (across simulated hosts, or on
this machine): test accuracy against training wall-clock seconds, for one strategy and compressor.
Rank 0 writes one JSON object to --out.

    scripts/cluster.sh run -n 2 -- python benchmarks/compression_run.py --model mlp --compression powersgd:4 \\
        --epochs 2 --out run.json

The run trains --epochs epochs (or stops at the first evaluation past --max-train-s seconds of training,
or at the first to reach --stop-at accuracy), in chunks of --eval-every steps (a tenth of an epoch); after each chunk every rank stops, the test set is scored (the weights
that count: the replica, or the center of an asynchronous strategy) and the chunk's training time, the
slowest rank's, is added to the clock. Evaluation is not on the clock: it is the same for every
compressor, and a real run would evaluate less often. Each point: step, epochs, seconds, test accuracy,
and the bytes a rank sent per step so far (the engine's own count: the compressed payloads).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pydist as dist  # noqa: E402  (after the path: the checkout's pydist, not an installed one)
from pydist.engine import Trainer, lenet5, load_fashion_mnist, mlp  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", choices=["lenet5", "mlp"], default="mlp")
    ap.add_argument("--hidden", type=int, nargs="+", default=[1024, 1024])
    ap.add_argument("--strategy", default="allreduce")
    ap.add_argument("--servers", type=int, default=None)
    ap.add_argument("--window", type=int, default=None)
    ap.add_argument("--compression", default="none")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--epochs", type=float, default=2.0, help="may be a fraction (default 2)")
    ap.add_argument("--eval-every", type=int, default=0, help="steps between evaluations (default: a tenth of an epoch)")
    ap.add_argument("--max-train-s", type=float, default=float("inf"),
                    help="stop at the first evaluation past this much training time")
    ap.add_argument("--stop-at", type=float, default=None,
                    help="stop at the first evaluation with at least this test accuracy")
    ap.add_argument("--data", default=None)
    args = ap.parse_args(argv)
    dist.init_process_group()
    (images, labels), test = load_fashion_mnist(args.data)
    model = lenet5() if args.model == "lenet5" else mlp(tuple(args.hidden))
    extra = {k: v for k, v in (("servers", args.servers), ("window", args.window)) if v is not None}
    trainer = Trainer(model, lr=args.lr, batch_size=args.batch_size, strategy=args.strategy,
                      compression=None if args.compression == "none" else args.compression, **extra)
    per_epoch = trainer.steps_per_epoch(len(labels))
    total = int(round(args.epochs * per_epoch))
    every = args.eval_every or max(1, round(per_epoch / 10))
    clock, sent, done, points = 0.0, 0.0, 0, []
    ev = trainer.evaluate(*test)
    points.append({"step": 0, "epochs": 0.0, "seconds": 0.0, "test_accuracy": ev["accuracy"],
                   "test_loss": ev["loss"], "bytes_per_step": 0.0})
    while done < total and clock <= args.max_train_s:
        epoch, first = divmod(done, per_epoch)
        last = min(per_epoch, first + every, first + total - done)
        dist.barrier()
        start = time.perf_counter()
        out = trainer.train_steps(images, labels, epoch, first, last)
        took = np.array([time.perf_counter() - start, out[5]], dtype=np.float64)
        dist.all_reduce(took[:1], op=dist.ReduceOp.MAX)   # the slowest rank's time is the chunk's
        dist.all_reduce(took[1:], op=dist.ReduceOp.SUM)
        clock += float(took[0])
        sent += float(took[1]) / trainer.world
        done += last - first
        ev = trainer.evaluate(*test)
        points.append({"step": done, "epochs": done / per_epoch, "seconds": clock, "test_accuracy": ev["accuracy"],
                       "test_loss": ev["loss"], "bytes_per_step": sent / done})
        if args.stop_at is not None and ev["accuracy"] >= args.stop_at:
            break
        if dist.get_rank() == 0:
            print(f"step {done:5d}  {clock:8.1f} s  accuracy {ev['accuracy']:.4f}  "
                  f"{sent / done / 2**20:.3f} MiB/step", flush=True)
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"world_size": trainer.world, "workers": trainer.workers, "model": args.model,
                       "hidden": args.hidden if args.model == "mlp" else None, "strategy": args.strategy,
                       "compression": trainer.compression, "batch_size": args.batch_size, "lr": args.lr,
                       "steps_per_epoch": per_epoch, "grad_bytes": int(trainer.params.nbytes),
                       "finished": done >= total, "points": points}, f)


if __name__ == "__main__":
    main()
