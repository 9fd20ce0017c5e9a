#!/usr/bin/env python3
"""One training run of benchmarks/strategies.py: LeNet-5 on Fashion-MNIST with one strategy, under
`mpiexec -n R`, with the test accuracy measured every --eval-every steps against training time.

    mpiexec -n 2 python benchmarks/strategy_run.py --strategy easgd --epochs 2 --out run.json

The clock counts training only: each chunk of steps is timed on every rank and the chunk's time is
the slowest rank's (the chunk is done when every rank is), then evaluation runs off the clock (it
is collective, so the ranks start the next chunk together). Rank 0 writes one JSON object to --out:
the options, the curve [(training seconds, steps, test accuracy)], one record per epoch with the
totals of Trainer.fit (samples/s, Tcomp and Tsync per worker step, bytes and messages per step per
rank), idle_share (the workers' share of the clock spent waiting, after their steps of a chunk, for
the slowest rank to finish its own: near 0 where every step synchronizes; for the asynchronous
strategies, which hand the batches out in blocks, at most one block of the slowest worker's at the
end of each chunk) and the final test accuracy.
For an asynchronous strategy (the center evaluated) each epoch also has, as Trainer.fit computes
them, staleness_mean and staleness_max (a push's staleness: the server's updates since that
worker's last pull), pushes_per_worker (per server) and wait_share (the workers' share of their step
time spent exchanging with the servers).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pydist as dist  # noqa: E402  (after the path: the checkout's pydist, not an installed one)
from pydist.engine import ASYNC, DATA_PARALLEL, Trainer, lenet5, load_fashion_mnist  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategy", choices=DATA_PARALLEL, required=True,
                    help="any but pipeline (benchmarks/pipeline_run.py measures it)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64, help="per worker (default 64)")
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--servers", type=int, default=None, help="ps and the asynchronous strategies (default 1)")
    ap.add_argument("--period", type=int, default=None, help="average, easgd (default 4)")
    ap.add_argument("--beta", type=float, default=None, help="easgd, aeasgd (default 0.9)")
    ap.add_argument("--window", type=int, default=None, help="the asynchronous strategies (default 5)")
    ap.add_argument("--deterministic", action="store_true", default=None,
                    help="the asynchronous strategies: serve the workers in a fixed round-robin")
    ap.add_argument("--slow-rank", type=int, default=None)
    ap.add_argument("--slow-ms", type=int, default=None)
    ap.add_argument("--eval-every", type=int, default=100, help="steps between evaluations (default 100)")
    ap.add_argument("--max-steps", type=int, default=None, help="at most this many steps per epoch (smoke runs)")
    ap.add_argument("--test-subset", type=int, default=None, help="evaluate on the first N test examples")
    ap.add_argument("--out", required=True, help="JSON file rank 0 writes")
    args = ap.parse_args(argv)
    if args.epochs < 1 or args.eval_every < 1 or (args.max_steps is not None and args.max_steps < 1):
        ap.error("--epochs, --eval-every and --max-steps must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    dist.init_process_group(backend="mpi")
    rank = dist.get_rank()
    (images, labels), (test_x, test_y) = load_fashion_mnist()
    if args.test_subset:
        test_x, test_y = test_x[:args.test_subset], test_y[:args.test_subset]
    options = {k: getattr(args, k) for k in ("servers", "period", "beta", "window", "deterministic", "slow_rank",
                                             "slow_ms") if getattr(args, k) is not None}
    trainer = Trainer(lenet5(), lr=args.lr, momentum=args.momentum, batch_size=args.batch_size, seed=args.seed,
                      strategy=args.strategy, **options)
    world, workers = trainer.world, trainer.workers
    steps = trainer.steps_per_epoch(len(labels))
    if args.max_steps:
        steps = min(steps, args.max_steps)

    def slowest(seconds):
        t = np.array([seconds])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t[0])

    def point(clock, done):
        return [clock, done, trainer.evaluate(test_x, test_y)["accuracy"]]

    curve, epochs, clock, done = [point(0.0, 0)], [], 0.0, 0
    for epoch in range(args.epochs):
        # loss_sum, correct, steps, t_comp, t_sync, bytes_sent, messages, pushes, staleness_sum,
        # staleness_max, exchanges (this rank; Engine.train_steps)
        totals = np.zeros(11)
        epoch_seconds, idle, at = 0.0, 0.0, 0
        while at < steps:
            end = min(steps, at + args.eval_every)
            started = time.perf_counter()
            out = np.asarray(trainer.train_steps(images, labels, epoch, at, end), dtype=np.float64)
            totals += out
            totals[9] = max(totals[9] - out[9], out[9])   # a maximum, not a sum
            own = time.perf_counter() - started
            chunk = slowest(own)
            idle += chunk - own   # waiting for the slowest rank to finish the chunk's steps
            epoch_seconds += chunk
            clock += chunk
            done += end - at
            at = end
            curve.append(point(clock, done))
        if trainer.is_server:
            totals[3:5], idle = 0, 0.0   # Tcomp/Tsync/idle are the workers'
        summed, most = np.append(totals, idle), totals[[5, 9]].copy()   # the busiest rank's bytes, the stalest push
        dist.all_reduce(summed)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        loss_sum, correct, worker_steps, t_comp, t_sync, sent, messages, pushes, stale_sum, _, _, idle = summed
        record = {
            "epoch": epoch + 1, "seconds": epoch_seconds,
            "train_loss": loss_sum / max(worker_steps, 1),
            "samples_per_s": steps * workers * args.batch_size / epoch_seconds,
            "t_comp_ms": t_comp / max(worker_steps, 1) * 1e3, "t_sync_ms": t_sync / max(worker_steps, 1) * 1e3,
            "bytes_per_step": sent / world / steps, "max_bytes_per_step": float(most[0]) / steps,
            "messages_per_step": messages / world / steps,
            "idle_share": idle / (workers * epoch_seconds),
            "test_accuracy": curve[-1][2],
        }
        if args.strategy in ASYNC:   # as Trainer.fit
            record.update(staleness_mean=stale_sum / max(pushes, 1), staleness_max=int(most[1]),
                          pushes_per_worker=pushes / (world - workers) / workers,
                          wait_share=t_sync / max(t_comp + t_sync, 1e-12))
        epochs.append(record)
    if rank == 0:
        result = {"strategy": args.strategy, "world_size": world, "workers": workers,
                  "batch_per_worker": args.batch_size, "global_batch": workers * args.batch_size,
                  "options": trainer.options, "slow_rank": args.slow_rank, "slow_ms": args.slow_ms,
                  "lr": args.lr, "momentum": args.momentum, "seed": args.seed, "steps_per_epoch": steps,
                  "test_examples": len(test_y), "curve": curve, "epochs": epochs,
                  "final_test_accuracy": curve[-1][2], "train_seconds": clock}
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, args.out)   # never a half-written file for the driver to read
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
