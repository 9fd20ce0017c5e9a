#!/usr/bin/env python3
"""What floating MIN/MAX by pydist's own rule (csrc/core/minmax.h) costs, against another build.

    python benchmarks/minmax_cost.py --before /path/to/other/checkout      # that build's pydist beside this one
    python benchmarks/minmax_cost.py --before DIR --modes mpi --rounds 6   # MPI's user op alone

Two jobs per build, run alternately build after build so that noise on a shared machine falls on both
(each cell: the median over repeats of the slowest rank's time per call):
  mpi   PYDIST_SHM_BYTES=0, all_reduce(x, op, algorithm="mpi") on float32 at 4 B, 64 KiB, 16 MiB: MPI's
        collective with pydist's user op (this build) or MPI's built-in MPI_MIN (a build before it);
        SUM (built-in in both) is the control
  shm   the shared-memory kernels: all_reduce(algorithm="shm") on dist.empty arrays (zero-copy: the
        reduction in place, the kernel's own speed) and on ordinary ones (through the staging
        buffers), float16/float32/float64 MIN at 64 KiB, 1 MiB, 16 MiB, and the small path (automatic,
        4 KiB), SUM as the control
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
ROOT = os.path.dirname(HERE)

from shm_allreduce import human  # noqa: E402  (sizes as the other benchmarks print them)


def cases(mode):
    if mode == "mpi":
        return [("mpi", "float32", op, b) for op in ("MIN", "SUM") for b in (4, 64 << 10, 16 << 20)]
    out = []
    for dtype in ("float16", "float32", "float64"):
        for op in ("MIN", "SUM"):
            out.append(("small", dtype, op, 4 << 10))
            for where in ("shm-alloc", "shm"):
                out += [(where, dtype, op, b) for b in (64 << 10, 1 << 20, 16 << 20)]
    return out


def worker(mode, pydist_dir, repeats, target):
    sys.path.insert(0, pydist_dir)
    import numpy as np
    import pydist as dist
    dist.init_process_group(backend="mpi")
    assert os.path.dirname(os.path.dirname(os.path.abspath(dist._C.__file__))) == os.path.abspath(pydist_dir)
    elapsed = np.zeros(1)

    def call(where, dtype, op, nbytes):
        n = max(1, nbytes // np.dtype(dtype).itemsize)
        x = dist.zeros(n, dtype) if where == "shm-alloc" else np.zeros(n, dtype)
        algorithm = {"mpi": "mpi", "shm": "shm", "shm-alloc": "shm", "small": None}[where]
        rop = getattr(dist.ReduceOp, op)
        return lambda: dist.all_reduce(x, op=rop, algorithm=algorithm)

    def timed(f, iters):
        for _ in range(2):
            f()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            f()
        elapsed[0] = time.perf_counter() - start
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, algorithm="mpi")
        return elapsed[0] / iters

    calls = {c: call(*c) for c in cases(mode)}
    iters = {c: max(3, min(200_000, int(target / max(timed(f, 3), 1e-7)))) for c, f in calls.items()}
    times = {c: [] for c in calls}
    for _ in range(repeats):
        for c, f in calls.items():
            times[c].append(timed(f, iters[c]))
    if dist.get_rank() == 0:
        for c, ts in times.items():
            print("result", *c, f"{statistics.median(ts) * 1e6:.3f}", flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", help="a checkout with a built pydist to compare with (required)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="jobs per build and mode, alternating builds")
    ap.add_argument("--target-seconds", type=float, default=0.02)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--modes", default="mpi,shm", help="which jobs: mpi, shm or both (default)")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], args.worker[1], args.repeats, args.target_seconds)
        return
    if not args.before:
        ap.error("--before is required")
    from mpi_jobs import MPIEXEC, run
    builds = {"before": os.path.abspath(args.before), "after": ROOT}
    load = os.getloadavg()
    res = {}   # (build, case) -> [us per round]
    modes = args.modes.split(",")
    for mode in modes:
        for _ in range(args.rounds):
            for build, where in builds.items():
                if mode == "mpi":
                    os.environ["PYDIST_SHM_BYTES"] = "0"   # no session segment: MPI's path alone
                else:
                    os.environ.pop("PYDIST_SHM_BYTES", None)   # the default region holds every array
                cmd = [MPIEXEC, "-n", str(args.ranks), sys.executable, os.path.abspath(__file__), "--worker", mode,
                       where, "--repeats", str(args.repeats), "--target-seconds", str(args.target_seconds)]
                rc, output = run(cmd, args.timeout, "minmax_cost")
                if rc != 0:
                    sys.exit(f"minmax_cost: the job failed (exit {rc}); its output:\n{output}")
                for line in output.splitlines():
                    f = line.split()
                    if len(f) == 6 and f[0] == "result":
                        res.setdefault((build, (f[1], f[2], f[3], int(f[4]))), []).append(float(f[5]))
    print(f"all_reduce, {args.ranks} ranks, us per call (median of {args.repeats} repeats, best of {args.rounds} "
          f"jobs); load average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, after "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    head = f"{'path':>9} {'dtype':>8} {'op':>4} {'size':>7} | {'before':>9} {'after':>9} {'after/before':>12}"
    print(head + "\n" + "-" * len(head))
    for mode in modes:
        for c in cases(mode):
            b, a = min(res[("before", c)]), min(res[("after", c)])
            print(f"{c[0]:>9} {c[1]:>8} {c[2]:>4} {human(c[3]):>7} | {b:>9.2f} {a:>9.2f} {a / b:>12.2f}")


if __name__ == "__main__":
    main()
