#!/usr/bin/env python3
"""One pydist build on each MPI library of MPICH's ABI: the all-reduce at 8 B and 1 MiB beside that
library's own raw-C figure (benchmarks/collectives_raw.c on the same library), 2 ranks.

    python benchmarks/mpi_libraries.py                    # the build's, .mpi-mpich5's and .mpi-impi's
    python benchmarks/mpi_libraries.py --libs /opt/intel/mpi/lib/libmpi.so.12 --repeats 5

Each library runs collectives_sweep.py with PYDIST_LIBMPI set (so pydist, and the C program through
library links, run on it, under its own mpiexec; benchmarks/mpi_jobs.py). scripts/test_libraries.sh
installs the two PyPI ones: `mpich` (MPICH 5) under .mpi-mpich5, `impi-rt` (Intel MPI) under .mpi-impi.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SIZES = (8, 1 << 20)


def default_libraries():
    from pydist import _build_config
    libs = [_build_config.LIBMPI] if getattr(_build_config, "LIBMPI", None) else []
    return libs + [p for p in (os.path.join(ROOT, f".mpi-{n}", "lib", "libmpi.so.12") for n in ("mpich5", "impi"))
                   if os.path.isfile(p)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--libs", nargs="+", help="libmpi.so.12 files (default: the build's and the two from PyPI)")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each program per library (median shown)")
    args = ap.parse_args()
    libs = args.libs or default_libraries()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "figures.jsonl")
        for lib in libs:
            cmd = [sys.executable, os.path.join(HERE, "collectives_sweep.py"), "--ranks", "2", "--ops", "all_reduce",
                   "--sizes", *map(str, SIZES), "--programs", "c", "pydist", "--repeats", str(args.repeats),
                   "--json", out]
            proc = subprocess.run(cmd, env=dict(os.environ, PYDIST_LIBMPI=lib), capture_output=True, text=True,
                                  timeout=900)
            if proc.returncode != 0:
                sys.exit(f"mpi_libraries: {lib}: collectives_sweep failed:\n{proc.stdout}{proc.stderr}")
            print(f"# {lib}: done", file=sys.stderr, flush=True)
        with open(out) as f:
            rows = [json.loads(line) for line in f]
    fig = {(r["library"], r["program"], r["bytes"]): r["us"] for r in rows}
    print(f"all_reduce, 2 ranks, float32, median of {args.repeats} interleaved runs (us per call; pydist/C: time ratio)")
    print(f"{'library':<45} | {'8 B C':>7} {'pydist':>7} {'ratio':>6} | {'1 MiB C':>8} {'pydist':>8} {'ratio':>6}")
    for library in dict.fromkeys(r["library"] for r in rows):
        cells = []
        for b in SIZES:
            c, py = fig[(library, "c", b)], fig[(library, "pydist", b)]
            # the ratio in 3 significant digits: one noisy C run (1603 us at 8 B under load) must not print 0.00
            cells.append(f"{c:>7.2f} {py:>7.2f} {py / c:>6.3g}" if b < 1024 else f"{c:>8.1f} {py:>8.1f} {py / c:>6.3g}")
        print(f"{library[:45]:<45} | " + " | ".join(cells))


if __name__ == "__main__":
    main()
