#!/usr/bin/env python3
"""torch's modern stack over pydist and over gloo, in one job: a training step of FSDP2, DDP and tensor
parallelism on the same MLP (784-512-512-10, AdamW), the two backends interleaved round after round.

    python benchmarks/torch_stack.py                  # 2 and 4 ranks
    python benchmarks/torch_stack.py --ranks 2 --rounds 3

Run it directly: it starts its own `mpiexec -n R` jobs. Each round times --steps steps of each program
on each backend (the slowest rank's mean); the table holds the medians and pydist's time over gloo's
(the goal: at most 0.6x). torch computes with one thread per rank, so the ranks do not fight over cores.
  fsdp2   fully_shard on each Linear and on the root; the mesh over the default group or gloo's
  ddp     DistributedDataParallel, one process group or the other
  tp      ColwiseParallel / RowwiseParallel on the two hidden layers, the batch on every rank
"""
import argparse
import json
import os
import sys
import tempfile

from mpi_jobs import MPIEXEC, run

WORKER = r"""
import json, statistics, sys, time
import torch, torch.distributed as tdist, torch.nn as nn
import pydist.torch  # noqa: F401
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
torch.set_num_threads(1)
tdist.init_process_group(backend="pydist")
rank, size = tdist.get_rank(), tdist.get_world_size()
groups = {"pydist": tdist.group.WORLD, "gloo": tdist.new_group(backend="gloo")}
steps, rounds, batch = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))

def fsdp2(group):
    model, mesh = mlp(), DeviceMesh.from_group(group, "cpu")
    for layer in model[::2]:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)

def ddp(group):
    return nn.parallel.DistributedDataParallel(mlp(), process_group=group)

def tp(group):
    return parallelize_module(mlp(), DeviceMesh.from_group(group, "cpu"), {"0": ColwiseParallel(), "2": RowwiseParallel()})

g = torch.Generator().manual_seed(rank)
x, y = torch.randn(batch, 784, generator=g), torch.randint(0, 10, (batch,), generator=g)
setups = {}
for program in (fsdp2, ddp, tp):
    for backend, group in groups.items():
        model = program(group)
        setups[(program.__name__, backend)] = (model, torch.optim.AdamW(model.parameters(), lr=1e-3))

def step(model, optimizer):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()

times = {key: [] for key in setups}
for r in range(rounds + 1):   # round 0 warms up
    for key, (model, optimizer) in setups.items():
        tdist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            step(model, optimizer)
        mean = torch.tensor([(time.perf_counter() - start) / steps], dtype=torch.float64)
        tdist.all_reduce(mean, op=tdist.ReduceOp.MAX)
        if r:
            times[key].append(mean.item())
if rank == 0:
    with open(sys.argv[4], "w") as f:
        json.dump({f"{p} {b}": statistics.median(v) for (p, b), v in times.items()}, f)
tdist.destroy_process_group()
"""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=10, help="per timed loop")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64, help="per rank")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args(argv)
    if MPIEXEC is None:
        sys.exit("torch_stack: no mpiexec.mpich or mpiexec on PATH")
    rows = []
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="torch_stack.") as tmp:
        script = os.path.join(tmp, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        for ranks in args.ranks:
            out = os.path.join(tmp, f"out{ranks}.json")
            cmd = [MPIEXEC, "-n", str(ranks), sys.executable, script, str(args.steps), str(args.rounds),
                   str(args.batch), out]
            code, output = run(cmd, args.timeout, "torch_stack")
            if code != 0 or not os.path.exists(out):
                sys.exit(f"torch_stack: the job at {ranks} ranks failed ({code}):\n{output}")
            with open(out) as f:
                result = json.load(f)
            for program in ("fsdp2", "ddp", "tp"):
                rows.append((ranks, program, result[f"{program} pydist"], result[f"{program} gloo"]))
    print(f"a training step (MLP 784-512-512-10, batch {args.batch} per rank, AdamW), ms, median of {args.rounds} "
          f"interleaved rounds of {args.steps} steps; load average {load:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(f"{'ranks':>5} {'program':>8} | {'pydist':>8} {'gloo':>8} | {'pydist/gloo':>11}")
    for ranks, program, ours, theirs in rows:
        print(f"{ranks:>5} {program:>8} | {ours * 1e3:>8.2f} {theirs * 1e3:>8.2f} | {ours / theirs:>10.2f}x")
    print("goal: pydist/gloo <= 0.60x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
