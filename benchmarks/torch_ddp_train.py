#!/usr/bin/env python3
"""The PyTorch peer of `python -m pydist.train`: the same LeNet-5, data, order, sharding and SGD, trained
with torch.nn.parallel.DistributedDataParallel over gloo.

    mpiexec.mpich -n 2 python benchmarks/torch_ddp_train.py --epochs 5 --metrics torch.jsonl
    mpiexec.mpich -n 1 python benchmarks/torch_ddp_train.py --epochs 1 --max-steps 50   # smoke run

mpiexec only starts the processes; rank and world size come from MPICH's PMI_RANK / PMI_SIZE, and
torch.distributed rendezvous over env:// on 127.0.0.1:--port. Like pydist: --batch-size is per rank,
rank r of R takes perm[(s*R + r)*B : (s*R + r + 1)*B] at step s of an epoch whose order is
pydist._C.epoch_permutation(n, seed, epoch), gradients are averaged across ranks, one thread per rank.
Rank 0 appends one JSON line per epoch to --metrics (pydist's keys, less t_comp_ms / t_sync_ms) and
prints `summary {json}` at the end. benchmarks/train_compare.py runs it beside pydist.
"""
import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere
from pydist import _C  # noqa: E402  (no MPI_Init: only the permutation and the IDX loader are used)
from pydist.engine import load_fashion_mnist  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=64, help="per rank (default 64)")
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0, help="initial weights and data order (default 0)")
    ap.add_argument("--data", default=None, help="folder of the IDX files (default pydist's)")
    ap.add_argument("--metrics", default="", help="JSON-lines file of per-epoch metrics ('' for none)")
    ap.add_argument("--port", type=int, default=29511, help="rendezvous port on 127.0.0.1 (default 29511)")
    ap.add_argument("--backend", choices=("gloo", "pydist"), default="gloo",
                    help="torch.distributed backend: gloo, or pydist's (import pydist.torch; default gloo)")
    ap.add_argument("--max-steps", type=int, default=None, help="stop each epoch after this many steps")
    return ap.parse_args(argv)


def lenet5():
    """pydist.engine.lenet5() as torch modules (61,706 parameters)."""
    return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))


def sum_across_ranks(values):
    t = torch.tensor(values, dtype=torch.float64)
    tdist.all_reduce(t)
    return t.tolist()


@torch.no_grad()
def evaluate(model, images, labels, rank, world, batch=500):
    """Mean loss and accuracy on the whole set, each rank scoring its own slice (as pydist does)."""
    n = len(labels)
    lo, hi = n * rank // world, n * (rank + 1) // world
    loss_sum = correct = 0.0
    for at in range(lo, hi, batch):
        x, y = images[at:min(hi, at + batch)], labels[at:min(hi, at + batch)]
        out = model(x)
        loss_sum += F.cross_entropy(out, y, reduction="sum").item()
        correct += (out.argmax(1) == y).sum().item()
    loss_sum, correct = sum_across_ranks([loss_sum, correct])
    return loss_sum / n, correct / n


def main(argv=None):
    args = parse_args(argv)
    rank, world = int(os.environ.get("PMI_RANK", 0)), int(os.environ.get("PMI_SIZE", 1))
    torch.set_num_threads(1)  # the ranks are the parallelism, as pydist's one BLAS thread per rank
    if args.backend == "pydist":
        import pydist.torch  # noqa: F401  (registers the backend; MPI gives rank, size and the store)
        tdist.init_process_group("pydist", timeout=datetime.timedelta(seconds=120))
    else:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(args.port)
        tdist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                                 timeout=datetime.timedelta(seconds=120))

    torch.manual_seed(args.seed)
    # DDP at every world size, R = 1 included, so both columns pay the same wrapper.
    model = nn.parallel.DistributedDataParallel(lenet5())
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    (train_x, train_y), (test_x, test_y) = load_fashion_mnist(args.data)
    n, B = len(train_y), args.batch_size
    images = torch.from_numpy(train_x).reshape(n, 1, 28, 28)
    labels = torch.from_numpy(train_y).long()
    test_images = torch.from_numpy(test_x).reshape(len(test_y), 1, 28, 28)
    test_labels = torch.from_numpy(test_y).long()
    steps = n // (world * B)
    if args.max_steps is not None:
        steps = min(steps, args.max_steps)
    if rank == 0 and args.metrics and os.path.exists(args.metrics):
        os.remove(args.metrics)

    history, started = [], time.perf_counter()
    for epoch in range(args.epochs):
        perm = torch.from_numpy(_C.epoch_permutation(n, args.seed, epoch)).long()
        model.train()
        loss_sum = correct = 0.0
        t0 = time.perf_counter()
        for s in range(steps):
            idx = perm[(s * world + rank) * B:(s * world + rank + 1) * B]
            x, y = images[idx], labels[idx]
            opt.zero_grad(set_to_none=True)
            out = model(x)
            loss = F.cross_entropy(out, y)
            loss.backward()  # DDP all-reduces and averages the gradients here
            opt.step()
            loss_sum += loss.item()
            correct += (out.argmax(1) == y).sum().item()
        seconds = time.perf_counter() - t0
        loss_sum, correct = sum_across_ranks([loss_sum, correct])
        model.eval()
        test_loss, test_acc = evaluate(model, test_images, test_labels, rank, world)
        record = {"epoch": epoch + 1, "step": (epoch + 1) * steps, "world_size": world, "batch_per_rank": B,
                  "train_loss": loss_sum / max(steps * world, 1),
                  "train_accuracy": correct / max(steps * world * B, 1),
                  "samples_per_s": steps * world * B / seconds, "epoch_s": seconds,
                  "test_loss": test_loss, "test_accuracy": test_acc}
        history.append(record)
        if rank == 0 and args.metrics:
            with open(args.metrics, "a") as f:
                f.write(json.dumps(record) + "\n")

    if rank == 0 and history:
        summary = {"final_test_accuracy": history[-1]["test_accuracy"], "seconds": time.perf_counter() - started,
                   "mean_samples_per_s": sum(r["samples_per_s"] for r in history) / len(history)}
        print("summary " + json.dumps(summary), flush=True)
    tdist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
