#!/usr/bin/env python3
"""All-reduce sweep: pydist's all_reduce beside raw MPI_Allreduce in C, per message size.

    python benchmarks/allreduce_sweep.py                     # 2 ranks, 4 B .. 64 MiB, 5 repeats
    python benchmarks/allreduce_sweep.py --ranks 4 --max-bytes 1048576
    python benchmarks/allreduce_sweep.py --quick             # 4 B, 4 KiB, 1 MiB, 2 repeats (smoke test)
    PYDIST_WAIT=mpi python benchmarks/allreduce_sweep.py     # pydist waits with plain MPI_Wait

Run it directly, not under mpiexec: it launches the jobs itself. It compiles allreduce_raw.c (the
baseline) into benchmarks/.build/, picks an iteration count per size from one short calibration run of
the baseline (so each size takes about --target-seconds), then runs the baseline and this file's
--worker mode (pydist) alternately, C, pydist, C, pydist ..., so that noise on this shared machine
falls on both. Each run is one `mpiexec -n R` job under a hard timeout. The table shows the median
over repeats per size; float32, SUM, in place, as a gradient all-reduce is.

Both sides measure the same way (allreduce_raw.c's header): warm-up calls, a barrier, N timed calls,
the slowest rank's elapsed time (an all-reduce with MAX) divided by N. Bandwidth follows nccl-tests:
algbw = bytes / time, busbw = algbw * 2(n-1)/n.

This is not the mpi4py / torch.distributed (gloo) comparison of DESIGN.md's Benchmarks section; it
answers only "what does pydist cost on top of MPI".
"""
import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOURCE = os.path.join(HERE, "allreduce_raw.c")
BINARY = os.path.join(HERE, ".build", "allreduce_raw")
MPIEXEC = shutil.which("mpiexec.mpich") or shutil.which("mpiexec")
MPICC = shutil.which("mpicc.mpich") or shutil.which("mpicc")

QUICK_SIZES = [4, 4 << 10, 1 << 20]
MIN_ITERS = 3          # even 64 MiB gets a few timed calls, so one hiccup is not the whole answer
MAX_ITERS = 1_000_000  # the smallest sizes, ~0.2 us apart
CALIBRATION_SECONDS = 0.02


# ---------------------------------------------------------------------------------------------------
# Worker: one rank of the pydist job. Same method as time_allreduce() in allreduce_raw.c.

def worker(plan):
    import numpy as np
    import pydist as dist

    dist.init_process_group(backend="mpi")
    rank, nranks = dist.get_rank(), dist.get_world_size()
    # One array for all sizes, written up front (page faults are not timed); zeros stay zeros under SUM.
    buf = np.zeros(max(b for b, _ in plan) // 4, dtype=np.float32)
    buf.fill(0)
    elapsed = np.zeros(1, dtype=np.float64)
    if rank == 0:
        wait = "MPI_Wait" if os.environ.get("PYDIST_WAIT", "").lower() == "mpi" else "poll"
        print(f"# pydist worker: ranks={nranks} dtype=float32 op=sum call=dist.all_reduce wait={wait}")
        print("# result <bytes> <iters> <us per call, slowest rank>", flush=True)
    for nbytes, iters in plan:
        view = buf[: nbytes // 4]
        for _ in range(iters // 10 + 2):
            dist.all_reduce(view)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(view)
        elapsed[0] = time.perf_counter() - start
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"result {nbytes} {iters} {elapsed[0] / iters * 1e6:.4f}", flush=True)
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------------
# Driver

def mpi_env(timeout):
    """The environment tests/run_mpi.py uses, so benchmark and tests run MPICH the same way."""
    env = dict(os.environ)
    env["MPIEXEC_TIMEOUT"] = str(int(timeout))  # hydra kills the job itself if it hangs
    env["UCX_ERROR_SIGNALS"] = ""
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize < 64 << 20:
            env["UCX_TLS"] = "^posix"  # UCX's shared-memory segments would not fit
    except OSError:
        env["UCX_TLS"] = "^posix"
    return env


def compile_baseline():
    os.makedirs(os.path.dirname(BINARY), exist_ok=True)
    cmd = [MPICC, "-O2", "-Wall", "-o", BINARY, SOURCE]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        sys.exit(f"allreduce_sweep: compiling the baseline failed:\n{' '.join(cmd)}\n"
                 f"{proc.stdout}{proc.stderr}")


def run_job(program, ranks, plan, timeout, raw_flags=()):
    """Run one mpiexec job over the plan [(bytes, iters)]. Returns {bytes: us per call}."""
    if program == "c":
        argv = [BINARY] + list(raw_flags) + [f"{b}:{i}" for b, i in plan]
    else:
        argv = [sys.executable, os.path.abspath(__file__), "--worker", ",".join(f"{b}:{i}" for b, i in plan)]
    cmd = [MPIEXEC, "-n", str(ranks)] + argv
    # Own session, so a timeout can kill mpiexec and every rank it started, not only mpiexec.
    proc = subprocess.Popen(cmd, cwd=ROOT, env=mpi_env(timeout), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout + 10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        sys.exit(f"allreduce_sweep: {' '.join(cmd)}\ndid not finish within {timeout + 10} s and was "
                 f"killed; its output:\n{output}")
    results = {}
    for line in output.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[0] == "result":
            results[int(fields[1])] = float(fields[3])
    if proc.returncode != 0 or len(results) != len(plan):
        sys.exit(f"allreduce_sweep: {' '.join(cmd)}\nexited with {proc.returncode} after "
                 f"{len(results)} of {len(plan)} sizes; its output:\n{output}")
    return results


def iters_for(seconds, seconds_per_call, most):
    return max(MIN_ITERS, min(most, round(seconds / seconds_per_call)))


def human(nbytes):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def print_table(sizes, c_us, py_us, ranks):
    bus = 2 * (ranks - 1) / ranks  # nccl-tests' all-reduce factor (0 at one rank)
    head = (f"{'size':>8} {'bytes':>10} | {'C us':>10} {'pydist us':>10} | {'C algbw':>8} {'py algbw':>8} | "
            f"{'C busbw':>8} {'py busbw':>8} | {'py-C us':>9} {'py/C bw':>7}")
    print(head)
    print(f"{'':>8} {'':>10} | {'':>10} {'':>10} | {'GB/s':>8} {'GB/s':>8} | {'GB/s':>8} {'GB/s':>8} |")
    print("-" * len(head))
    for b in sizes:
        c, p = c_us[b], py_us[b]
        c_alg, p_alg = b / (c * 1e3), b / (p * 1e3)  # bytes / us / 1e3 = GB/s
        print(f"{human(b):>8} {b:>10} | {c:>10.2f} {p:>10.2f} | {c_alg:>8.3f} {p_alg:>8.3f} | "
              f"{c_alg * bus:>8.3f} {p_alg * bus:>8.3f} | {p - c:>+9.2f} {c / p:>7.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2, help="world size (default 2)")
    ap.add_argument("--min-bytes", type=int, default=4, help="smallest message (default 4)")
    ap.add_argument("--max-bytes", type=int, default=64 << 20, help="largest message (default 64 MiB)")
    ap.add_argument("--sizes", type=int, nargs="+", help="message sizes in bytes, instead of the sweep")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each program, median shown (default 5)")
    ap.add_argument("--target-seconds", type=float, default=0.1,
                    help="timed seconds per size per run, which sets the iteration counts (default 0.1)")
    ap.add_argument("--raw-flags", default="",
                    help="options for allreduce_raw, e.g. '-i -t' to make it call MPI as pydist does")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per mpiexec job (default 120)")
    ap.add_argument("--quick", action="store_true", help="4 B, 4 KiB and 1 MiB, 2 repeats, shorter timing")
    ap.add_argument("--worker", metavar="PLAN", help=argparse.SUPPRESS)  # BYTES:ITERS,...; under mpiexec
    args = ap.parse_args()

    if args.worker:
        worker([tuple(int(x) for x in item.split(":")) for item in args.worker.split(",")])
        return
    if MPIEXEC is None or MPICC is None:
        sys.exit("allreduce_sweep: needs mpiexec.mpich and mpicc.mpich (Debian package mpich)")
    if args.quick:
        sizes, args.repeats, args.target_seconds = QUICK_SIZES, 2, 0.05
    elif args.sizes:
        sizes = sorted(set(args.sizes))
    else:
        sizes, b = [], args.min_bytes
        while b <= args.max_bytes:
            sizes.append(b)
            b *= 2
    bad = [b for b in sizes if b <= 0 or b % 4]
    if bad or args.ranks < 1 or args.repeats < 1:
        sys.exit(f"allreduce_sweep: sizes must be positive multiples of 4 bytes (got {bad}), "
                 f"--ranks and --repeats at least 1 (got {args.ranks}, {args.repeats})")

    started = time.monotonic()
    # Printed with the results: other processes on these 2 cores distort both sides (MPICH's
    # busy-polling Allreduce more than pydist's yielding wait), and this says whether there were any.
    load_before = os.getloadavg()[0]
    compile_baseline()
    # Calibrate once with the baseline and give both programs the same counts, so the two sides of a
    # row differ only in the library. Iterations for a 10x slower pydist take 10x longer; fine here.
    probe_plan = [(b, iters_for(CALIBRATION_SECONDS, 2e-6 + b / 1e9, 10_000)) for b in sizes]
    probe = run_job("c", args.ranks, probe_plan, args.timeout, args.raw_flags.split())
    # A larger message never takes less time, so a probe slowed by a passing hiccup is capped by the
    # next larger size's time; otherwise one bad probe leaves that size with a handful of iterations.
    for small, large in reversed(list(zip(sizes, sizes[1:]))):
        probe[small] = min(probe[small], probe[large])
    plan = [(b, iters_for(args.target_seconds, probe[b] * 1e-6, MAX_ITERS)) for b in sizes]

    c_runs, py_runs = [], []
    for rep in range(args.repeats):
        c_runs.append(run_job("c", args.ranks, plan, args.timeout, args.raw_flags.split()))
        py_runs.append(run_job("pydist", args.ranks, plan, args.timeout))
        print(f"# repeat {rep + 1}/{args.repeats} done ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    c_us = {b: statistics.median(r[b] for r in c_runs) for b in sizes}
    py_us = {b: statistics.median(r[b] for r in py_runs) for b in sizes}

    wait = "poll (default)"
    if os.environ.get("PYDIST_WAIT", "").lower() == "mpi":
        wait = "MPI_Wait (PYDIST_WAIT=mpi)"
    print(f"all_reduce float32 SUM in place, {args.ranks} ranks, median of {args.repeats} interleaved runs; "
          f"pydist wait: {wait}; raw C flags: '{args.raw_flags}'")
    print(f"1-min load average: {load_before:.2f} before the run, {os.getloadavg()[0]:.2f} after "
          f"(the run itself adds about {args.ranks}); {os.cpu_count()} CPUs")
    print(f"iterations per size: {', '.join(f'{human(b)}:{i}' for b, i in plan)}")
    print_table(sizes, c_us, py_us, args.ranks)
    if 4 in c_us:
        print(f"4 B: pydist costs {py_us[4] - c_us[4]:.2f} us more than raw C (goal <= 1 us)")
    large = [b for b in sizes if b >= 1 << 20]
    if large:
        ratio = min(c_us[b] / py_us[b] for b in large)
        print(f"sizes >= 1 MiB: min bandwidth ratio {ratio:.3f} (goal >= 0.95)")
    sys.stdout.flush()  # the table first, then the stderr footer, when both go to one terminal
    print(f"# total {time.monotonic() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
