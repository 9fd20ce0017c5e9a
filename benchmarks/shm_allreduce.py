#!/usr/bin/env python3
"""The shared-memory all-reduce beside MPICH's, with the machine's memcpy bandwidth, in one run.

    python benchmarks/shm_allreduce.py                  # 2 ranks, 4 KiB .. 64 MiB, 5 repeats
    python benchmarks/shm_allreduce.py --ranks 4 --repeats 3
    python benchmarks/shm_allreduce.py --quick          # 2 ranks, 3 sizes, 1 repeat (smoke test)

Run it directly: it starts its own `mpiexec -n R` job. Per size (float32 SUM, in place):
    mpi        all_reduce(x, algorithm="mpi") on an ordinary NumPy array (MPICH's MPI_Iallreduce)
    shm        all_reduce(x, algorithm="shm") on an ordinary array (copied through the staging buffers)
    shm-alloc  all_reduce(x, algorithm="shm") on dist.empty arrays (zero-copy: reduced in place)
    memcpy     np.copyto of the same size on every rank at once (the physical ceiling: an all-reduce
               must at least read and write its buffer)
The programs run interleaved, repeat after repeat, so that noise on a shared machine falls on all of
them; each cell is the median over repeats of (slowest rank's elapsed time / calls). Bandwidths follow
nccl-tests: algbw = SIZE / time, busbw = algbw * 2(R-1)/R; memcpy is bytes copied per second per rank.
The last lines say from which size up shm beats MPI at every larger size (the automatic crossover).
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
PROGRAMS = ("mpi", "shm", "shm-alloc", "memcpy")


def worker(sizes, repeats, target):
    import numpy as np
    import pydist as dist
    dist.init_process_group(backend="mpi")
    rank, R = dist.get_rank(), dist.get_world_size()
    largest = max(sizes) // 4
    plain, alloc = np.zeros(largest, np.float32), dist.zeros(largest, np.float32)
    src, dst = np.zeros(largest, np.float32), np.zeros(largest, np.float32)
    elapsed = np.zeros(1)

    def calls(program, n):
        if program == "mpi":
            x = plain[:n]
            return lambda: dist.all_reduce(x, algorithm="mpi")
        if program == "shm":
            x = plain[:n]
            return lambda: dist.all_reduce(x, algorithm="shm")
        if program == "shm-alloc":
            x = alloc[:n]
            return lambda: dist.all_reduce(x, algorithm="shm")
        s, d = src[:n], dst[:n]
        return lambda: np.copyto(d, s)

    def timed(call, iters):
        for _ in range(2):
            call()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            call()
        elapsed[0] = time.perf_counter() - start
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, algorithm="mpi")
        return elapsed[0] / iters

    iters = {}
    for b in sizes:   # calibrate: each cell about `target` seconds
        for p in PROGRAMS:
            t = timed(calls(p, b // 4), 3)
            iters[(p, b)] = max(3, min(100_000, int(target / max(t, 1e-7))))
    dist.all_reduce(np.zeros(1), algorithm="mpi")
    times = {k: [] for k in iters}
    for _ in range(repeats):
        for b in sizes:
            for p in PROGRAMS:
                times[(p, b)].append(timed(calls(p, b // 4), iters[(p, b)]))
    # correctness of what was timed: ranks' zeros stay zeros; one real check per program
    for p in ("mpi", "shm", "shm-alloc"):
        x = (alloc if p == "shm-alloc" else plain)[:1000]
        x[:] = rank + 1
        dist.all_reduce(x, algorithm="shm" if p != "mpi" else "mpi")
        assert np.all(x == R * (R + 1) // 2), (p, x[:4])
    if rank == 0:
        for (p, b), ts in times.items():
            print(f"result {p} {b} {statistics.median(ts) * 1e6:.3f}", flush=True)
    dist.destroy_process_group()


def human(n):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--min-bytes", type=int, default=4 << 10)
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--factor", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--target-seconds", type=float, default=0.03)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        sizes, args.repeats, args.target_seconds = [64 << 10, 1 << 20, 4 << 20], 1, 0.01
    else:
        sizes, b = [], args.min_bytes
        while b <= args.max_bytes:
            sizes.append(b)
            b *= args.factor
    if args.worker:
        worker([int(s) for s in args.worker.split(",")], args.repeats, args.target_seconds)
        return
    from mpi_jobs import MPIEXEC, run
    env_heap = max(sizes) + (16 << 20)
    os.environ.setdefault("PYDIST_SHM_BYTES", str(env_heap))   # room for the largest dist.empty array
    cmd = [MPIEXEC, "-n", str(args.ranks), sys.executable, os.path.abspath(__file__), "--worker",
           ",".join(map(str, sizes)), "--repeats", str(args.repeats), "--target-seconds", str(args.target_seconds)]
    load = os.getloadavg()
    rc, output = run(cmd, args.timeout, "shm_allreduce")
    res = {}
    for line in output.splitlines():
        f = line.split()
        if len(f) == 4 and f[0] == "result":
            res[(f[1], int(f[2]))] = float(f[3])
    if rc != 0 or len(res) != len(sizes) * len(PROGRAMS):
        sys.exit(f"shm_allreduce: the job failed (exit {rc}); its output:\n{output}")
    R, factor = args.ranks, 2 * (args.ranks - 1) / args.ranks
    print(f"all_reduce float32 SUM, {R} ranks, median of {args.repeats}; load average before {load[0]:.2f} "
          f"{load[1]:.2f} {load[2]:.2f}, after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    head = (f"{'size':>8} | {'mpi us':>9} {'shm us':>9} {'alloc us':>9} | {'mpi bus':>8} {'shm bus':>8} "
            f"{'alloc bus':>9} {'memcpy':>8} | {'shm/mpi':>7} {'alloc/mpi':>9}")
    print(head + "\n" + "-" * len(head) + "   (bus: busbw GB/s; memcpy: GB/s per rank; x/mpi: busbw ratio)")
    for b in sizes:
        t = {p: res[(p, b)] for p in PROGRAMS}
        bus = {p: b / (t[p] * 1e3) * factor for p in PROGRAMS[:3]}
        print(f"{human(b):>8} | {t['mpi']:>9.1f} {t['shm']:>9.1f} {t['shm-alloc']:>9.1f} | {bus['mpi']:>8.2f} "
              f"{bus['shm']:>8.2f} {bus['shm-alloc']:>9.2f} {b / (t['memcpy'] * 1e3):>8.2f} | "
              f"{t['mpi'] / t['shm']:>7.2f} {t['mpi'] / t['shm-alloc']:>9.2f}")
    for p in ("shm", "shm-alloc"):
        start = next((b for b in sizes if all(res[(p, c)] <= res[("mpi", c)] for c in sizes if c >= b)), None)
        big = [b for b in sizes if b >= 1 << 20]
        worst = min((res[("mpi", b)] / res[(p, b)] for b in big), default=float("nan"))
        print(f"{p}: at least as fast as MPI from {human(start) if start else 'no size'} up; "
              f"min speed-up over MPI at >= 1 MiB: {worst:.2f}x")


if __name__ == "__main__":
    main()
