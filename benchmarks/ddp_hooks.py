#!/usr/bin/env python3
"""DDP with pydist's compression hooks beside torch's own hooks, over pydist and over gloo, in one run:
an MLP (784 -> 1024 -> 1024 -> 10 by default, 1.9 M parameters, 7.2 MiB of gradients) on Fashion-MNIST.

    mpiexec.mpich -n 2 python benchmarks/ddp_hooks.py                  # every configuration, 30 steps each
    mpiexec.mpich -n 2 python benchmarks/ddp_hooks.py --steps 60 --batch-size 32

Each configuration trains the same model from the same start on the same batches for --steps steps (the
first --warmup not timed), interleaved over --repeats rounds so that noise falls on all of them; rank 0
prints the median milliseconds per step, the bytes a step's gradients take on the wire by the hook's
payload (what the compressor sends, per rank), and the training loss over the timed steps. Configurations:
    none/pydist, none/gloo             DDP's own all-reduce
    torch-fp16/pydist, torch-fp16/gloo  torch's fp16_compress_hook (sums in 16 bits)
    torch-powersgd4/pydist             torch's powerSGD_hook, rank 4 (compressing from step 2). Not over
                                       gloo: there it deadlocks (torch 2.13, CPU): its callbacks wait
                                       for a second all-reduce on gloo's two threads, which they occupy
    pydist-fp16, -bf16, -topk0.01, -sign, -powersgd4   pydist.torch.hooks over the pydist group
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere
import pydist.torch  # noqa: E402  (registers the backend, fills in RANK/WORLD_SIZE from MPI)
from pydist.torch import hooks  # noqa: E402
from pydist.engine import load_fashion_mnist  # noqa: E402


def model(hidden):
    torch.manual_seed(0)
    layers, width = [], 784
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return nn.Sequential(*layers, nn.Linear(width, 10))


def configurations(gloo):
    psgd = lambda group: powerSGD_hook.PowerSGDState(process_group=group, matrix_approximation_rank=4,
                                                    start_powerSGD_iter=2)
    return {
        "none/pydist": (None, None, None),
        "none/gloo": (gloo, None, None),
        "torch-fp16/pydist": (None, default_hooks.fp16_compress_hook, lambda: None),
        "torch-fp16/gloo": (gloo, default_hooks.fp16_compress_hook, lambda: gloo),
        "torch-powersgd4/pydist": (None, powerSGD_hook.powerSGD_hook, lambda: psgd(None)),
        "pydist-fp16": (None, hooks.fp16, lambda: None),
        "pydist-bf16": (None, hooks.bf16, lambda: None),
        "pydist-topk0.01": (None, lambda: hooks.topk(0.01), lambda: None),
        "pydist-sign": (None, hooks.sign, lambda: None),
        "pydist-powersgd4": (None, lambda: hooks.powersgd(4), lambda: None),
    }


def payload_bytes(name, n, matrices, rank):
    """What one rank's gradients take per step by the hook's own payload (bytes)."""
    if "fp16" in name or "bf16" in name:
        return 2 * n
    if "topk" in name:
        return 8 * int(np.ceil(0.01 * n))
    if "sign" in name:
        return n // 8 + 4 * -(-n // 256)
    if "powersgd" in name:
        inside = sum(r * c for r, c in matrices)
        return 4 * (n - inside + sum((r + c) * rank for r, c in matrices))
    return 4 * n


def run(name, setup, x, y, args):
    group, make_hook, make_state = setup
    m = model(args.hidden)
    ddp = nn.parallel.DistributedDataParallel(m, process_group=group)
    if make_hook is not None:
        hook = make_hook if name.startswith("torch") else make_hook()
        ddp.register_comm_hook(make_state(), hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    R, r, B = tdist.get_world_size(), tdist.get_rank(), args.batch_size
    times, losses = [], []
    for step in range(args.steps):
        lo = ((step * R + r) * B) % (len(y) - B)
        xb, yb = x[lo:lo + B], y[lo:lo + B]
        tdist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(ddp(xb), yb)
        loss.backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
    return statistics.median(times) * 1e3, float(np.mean(losses))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, nargs="+", default=[1024, 1024])
    ap.add_argument("--batch-size", type=int, default=32, help="per rank (default 32)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--only", nargs="*", default=None, help="configurations to run (default all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tdist.init_process_group(backend="pydist")
    gloo = tdist.new_group(backend="gloo")
    (images, labels), _ = load_fashion_mnist()
    x = torch.from_numpy(np.ascontiguousarray(images[:20000].reshape(20000, -1), np.float32))
    y = torch.from_numpy(labels[:20000].astype(np.int64))
    configs = {k: v for k, v in configurations(gloo).items() if args.only is None or k in args.only}
    results = {k: [] for k in configs}
    for _ in range(args.repeats):
        for name, setup in configs.items():
            results[name].append(run(name, setup, x, y, args))
    m = model(args.hidden)
    n = sum(p.numel() for p in m.parameters())
    matrices = [tuple(p.shape) for p in m.parameters() if p.dim() == 2]
    if tdist.get_rank() == 0:
        load = os.getloadavg()[0]
        print(f"DDP, {tdist.get_world_size()} ranks, MLP {args.hidden} ({n:,} parameters), batch {args.batch_size} "
              f"a rank, median of {args.repeats} x {args.steps - args.warmup} steps; 1-min load {load:.2f}")
        print(f"{'configuration':<24} {'ms/step':>8} {'vs none/gloo':>12} {'payload MiB':>12} {'loss':>7}")
        base = statistics.median(t for t, _ in results.get("none/gloo", [(float('nan'), 0)]))
        for name, rows in results.items():
            ms = statistics.median(t for t, _ in rows)
            loss = statistics.median(l for _, l in rows)
            mib = payload_bytes(name, n, matrices, 4) / 2**20
            print(f"{name:<24} {ms:8.2f} {base / ms:12.2f} {mib:12.3f} {loss:7.3f}")
        print("summary " + json.dumps({k: statistics.median(t for t, _ in v) for k, v in results.items()}))
    tdist.destroy_process_group()


if __name__ == "__main__":
    main()
