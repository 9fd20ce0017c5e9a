#!/usr/bin/env python3
"""Start-up: how long `import pydist` + `init_process_group()` takes, beside mpi4py and torch.

    python benchmarks/startup.py                 # 2 ranks, 7 rounds, torch's import included
    python benchmarks/startup.py --rounds 3 --no-torch

Run it directly, not under mpiexec: each round launches one 2-rank job per program, in turn (numpy,
pydist, mpi4py, torch, numpy, pydist, ...), so that noise on a shared machine falls on all of them.
Every rank times its own phases with time.perf_counter() from the first line of the worker:

    numpy    import numpy                                     (every NumPy program pays it)
    pydist   import pydist, then dist.init_process_group()    (pydist imports numpy itself)
    mpi4py   from mpi4py import MPI                           (MPI_Init happens at that import)
    torch    import torch                                      (import only; no process group)

The table shows, per program, the median over rounds of the slower rank's time per phase and in
all. `job` is the whole mpiexec job's wall time minus the numpy job's, the launcher and the
interpreter's own start-up excluded. Python's bytecode for pydist is compiled first (as `pip install`
does), so no round pays for compiling it.
"""
import sys
import time

T0 = time.perf_counter()


def worker(program):
    """One rank: the phases of `program`, as `phase=<ms>` fields on one line."""
    phases = []

    def mark(name):
        phases.append((name, (time.perf_counter() - T0) * 1e3))

    import numpy  # noqa: F401
    mark("numpy")
    if program == "pydist":
        import pydist as dist
        mark("import")
        dist.init_process_group(backend="mpi")
        mark("init")
        rank = dist.get_rank()
        dist.destroy_process_group()
    elif program == "mpi4py":
        from mpi4py import MPI
        mark("import+init")
        rank = MPI.COMM_WORLD.Get_rank()
    elif program == "torch":
        import torch  # noqa: F401
        mark("import")
        rank = int(__import__("os").environ.get("PMI_RANK", "0"))
    else:
        rank = int(__import__("os").environ.get("PMI_RANK", "0"))
    last, fields = 0.0, []
    for name, at in phases:
        fields.append(f"{name}={at - last:.2f}")
        last = at
    print(f"rank {rank} total={last:.2f} " + " ".join(fields), flush=True)


if len(sys.argv) == 3 and sys.argv[1] == "--worker":
    worker(sys.argv[2])
    sys.exit(0)

import argparse  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402

from mpi_jobs import MPIEXEC, ROOT, mpi_env  # noqa: E402

PROGRAMS = ("numpy", "pydist", "mpi4py", "torch")


def run_round(program, ranks, timeout):
    """One job; returns (wall seconds of the whole job, {phase: ms of the slower rank}, total ms)."""
    cmd = [MPIEXEC, "-n", str(ranks), sys.executable, os.path.abspath(__file__), "--worker", program]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=mpi_env(timeout), capture_output=True, text=True, timeout=timeout + 10)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{program} job failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    phases, total = {}, 0.0
    # two ranks' lines may arrive glued together through the launcher: match each rank's fields
    for match in re.finditer(r"rank \d+ ((?:[a-z+]+=[0-9.]+ ?)+)", proc.stdout):
        fields = dict(f.split("=") for f in match.group(1).split())
        total = max(total, float(fields.pop("total")))
        for name, ms in fields.items():
            phases[name] = max(phases.get(name, 0.0), float(ms))
    return wall, phases, total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2, help="ranks per job (default 2)")
    ap.add_argument("--rounds", type=int, default=7, help="jobs per program, median shown (default 7)")
    ap.add_argument("--no-torch", action="store_true", help="leave torch out (its import takes seconds)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per job (default 120)")
    args = ap.parse_args()
    programs = [p for p in PROGRAMS if not (p == "torch" and args.no_torch)]
    if "mpi4py" in programs:
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            programs.remove("mpi4py")
            print("# mpi4py is not installed: left out (scripts/setup.sh --test installs it)")
    if "torch" in programs:
        try:
            import importlib.util
            if importlib.util.find_spec("torch") is None:
                raise ImportError
        except ImportError:
            programs.remove("torch")
            print("# torch is not installed: left out")
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(ROOT, "pydist")], check=True,
                   env={**os.environ, "PYTHONDONTWRITEBYTECODE": ""})
    load_before = os.getloadavg()[0]
    results = {p: [] for p in programs}
    for _ in range(args.rounds):
        for program in programs:
            results[program].append(run_round(program, args.ranks, args.timeout))
    load_after = os.getloadavg()[0]

    base_wall = statistics.median(w for w, _, _ in results["numpy"])
    print(f"\nstart-up, {args.ranks} ranks, median of {args.rounds} rounds (ms; each phase the slower rank's)")
    print(f"{'program':>8} | {'numpy':>7} {'import':>7} {'init':>7} | {'total':>7} {'w/o numpy':>9} | {'job - numpy job':>15}")
    print("-" * 75)
    for program in programs:
        runs = results[program]
        med = lambda name: statistics.median(p.get(name, 0.0) for _, p, _ in runs)  # noqa: E731
        total = statistics.median(t for _, _, t in runs)
        numpy_ms = med("numpy")
        imp = med("import+init") if program == "mpi4py" else med("import")
        init = med("init")
        job = (statistics.median(w for w, _, _ in runs) - base_wall) * 1e3
        without = statistics.median(t - p.get("numpy", 0.0) for _, p, t in runs)
        print(f"{program:>8} | {numpy_ms:7.1f} {imp:7.1f} {init:7.1f} | {total:7.1f} {without:9.1f} | "
              f"{'' if program == 'numpy' else f'{job:+15.1f}'}")
    print("(mpi4py's MPI_Init happens at its import: its whole cost is under import)")
    if "pydist" in programs:
        total = statistics.median(t for _, _, t in results["pydist"])
        print(f"\npydist import + init_process_group: {total:.0f} ms with numpy's import, "
              f"{statistics.median(t - p['numpy'] for _, p, t in results['pydist']):.0f} ms after it "
              f"(goal <= 250 ms)")
    print(f"1-min load average: {load_before:.2f} before, {load_after:.2f} after")


if __name__ == "__main__":
    main()
