#!/usr/bin/env python3
"""What the torch backend adds to a call: all_reduce through torch.distributed on the "pydist" group,
beside pydist's own call on the same memory and torch.distributed on a gloo group, in one job.

    python benchmarks/torch_backend_overhead.py                 # 2 ranks; 4 B, 1 MiB, 16 MiB
    python benchmarks/torch_backend_overhead.py --ranks 2 --sizes 4 65536

Run it directly: it starts its own `mpiexec -n R` job. Per size, float32 SUM in place, interleaved
round after round (median of --rounds, each the slowest rank's mean over a timed loop):
    pydist      pydist.all_reduce(tensor.numpy())           pydist's own Python call
    torch+pd    torch.distributed.all_reduce(tensor)        through pydist.torch's ProcessGroup
    gloo        torch.distributed.all_reduce(tensor, group=gloo)
The backend's overhead is torch+pd - pydist.
"""
import argparse
import json
import os
import sys
import tempfile

from mpi_jobs import MPIEXEC, run

WORKER = r"""
import json, statistics, sys, time
import numpy as np, torch, torch.distributed as tdist
import pydist as pd, pydist.torch
torch.set_num_threads(1)
tdist.init_process_group(backend="pydist")
gloo = tdist.new_group(backend="gloo")
sizes, rounds, target = json.loads(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
programs = {
    "pydist": lambda t, a: pd.all_reduce(a),
    "torch+pd": lambda t, a: tdist.all_reduce(t),
    "gloo": lambda t, a: tdist.all_reduce(t, group=gloo),
}
results = {}
for nbytes in sizes:
    t = torch.ones(max(nbytes // 4, 1))
    a = t.numpy()
    iters = {}
    for name, call in programs.items():   # calibrate: about `target` seconds per timed loop
        for _ in range(3):
            call(t, a)
        start = time.perf_counter()
        call(t, a)
        once = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        tdist.all_reduce(once, op=tdist.ReduceOp.MAX)
        iters[name] = max(3, min(20000, int(target / max(once.item(), 1e-7))))
    times = {name: [] for name in programs}
    for _ in range(rounds):
        for name, call in programs.items():
            tdist.barrier()
            start = time.perf_counter()
            for _ in range(iters[name]):
                call(t, a)
            mean = torch.tensor([(time.perf_counter() - start) / iters[name]], dtype=torch.float64)
            tdist.all_reduce(mean, op=tdist.ReduceOp.MAX)
            times[name].append(mean.item())
    results[nbytes] = {name: statistics.median(v) for name, v in times.items()}
if tdist.get_rank() == 0:
    with open(sys.argv[4], "w") as f:
        json.dump(results, f)
tdist.destroy_process_group()
"""


def human(n):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 1 << 20, 16 << 20], help="bytes")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--target-seconds", type=float, default=0.2, help="per timed loop")
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args(argv)
    if MPIEXEC is None:
        sys.exit("torch_backend_overhead: no mpiexec.mpich or mpiexec on PATH")
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="torch_overhead.") as tmp:
        script, out = os.path.join(tmp, "worker.py"), os.path.join(tmp, "out.json")
        with open(script, "w") as f:
            f.write(WORKER)
        cmd = [MPIEXEC, "-n", str(args.ranks), sys.executable, script, json.dumps(args.sizes), str(args.rounds),
               str(args.target_seconds), out]
        code, output = run(cmd, args.timeout, "torch_backend_overhead")
        if code != 0 or not os.path.exists(out):
            sys.exit(f"torch_backend_overhead: the job failed ({code}):\n{output}")
        with open(out) as f:
            results = json.load(f)
    print(f"all_reduce float32 SUM, {args.ranks} ranks, median of {args.rounds} interleaved rounds, us per call; "
          f"load average {load:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(f"{'size':>8} | {'pydist':>10} {'torch+pd':>10} {'gloo':>10} | {'overhead':>9} {'gloo/torch+pd':>13}")
    for nbytes, row in results.items():
        us = {k: v * 1e6 for k, v in row.items()}
        print(f"{human(int(nbytes)):>8} | {us['pydist']:>10.2f} {us['torch+pd']:>10.2f} {us['gloo']:>10.2f} | "
              f"{us['torch+pd'] - us['pydist']:>+9.2f} {us['gloo'] / us['torch+pd']:>13.2f}")
    print("overhead = torch+pd - pydist: what the torch backend adds to pydist's own call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
