#!/usr/bin/env python3
"""LeNet-5 on Fashion-MNIST: pydist's native engine beside PyTorch DDP over gloo and over pydist's torch
backend (torch+pd: `import pydist.torch`, backend "pydist"), per world size and, with --simd, per x86-64
instruction-set level.

    python benchmarks/train_compare.py                        # R = 1 2, 5 epochs each
    python benchmarks/train_compare.py --ranks 2 --epochs 10
    python benchmarks/train_compare.py --quick                # R = 1 2, 1 epoch (smoke test)
    python benchmarks/train_compare.py --simd sse2 avx2 avx512 --ranks 1 2 --epochs 1

Run it directly, not under mpiexec: it launches the jobs itself, one `mpiexec -n R` job per level,
program and world size under a hard timeout, interleaved (at R=1: sse2 pydist, sse2 torch, sse2 torch+pd,
avx2 pydist, ...; then R=2) so that noise on this shared machine falls on all of them. All train the
same model from the same seed on the same data order and sharding (`python -m pydist.train` and
benchmarks/torch_ddp_train.py, torch on one thread per rank) and write one JSON line per epoch; the
table is read from those files. Samples/s counts the training steps only. "/ torch" is samples/s over
torch DDP over gloo's at the same level and R. Scaling efficiency = samples/s at R / (R x at R=1).

--simd caps every program of a level's jobs to that instruction set: pydist's engine with PYDIST_SIMD
and OpenBLAS's kernels with OPENBLAS_CORETYPE (sse2: Prescott, avx2: Haswell, avx512: SkylakeX), torch
with ATEN_CPU_CAPABILITY (default, avx2, avx512) and ONEDNN_MAX_CPU_ISA (SSE41, AVX2, AVX512_CORE).
A level this CPU lacks (/proc/cpuinfo: avx2 needs avx2 and fma; avx512 needs avx512f, avx512dq,
avx512bw and avx512vl) is refused before anything runs. Without --simd nothing is capped: one level,
"native". The header names the CPU model, its flags and which kernels torch's ATen runs at each level.

The arithmetic floor: one step's forward and backward is pydist.engine.step_flops(lenet5(), batch)
floating-point operations; each level's single-core peak is the fastest of --peak-reps 2048 x 2048
float32 GEMMs through the engine's own BLAS on one thread (pydist.profile.peak_gflops), measured in a
fresh process with that level's variables (OpenBLAS picks its kernels when it is loaded), before and
after the jobs. Each run's GFLOP/s per rank (samples/s / R x FLOPs per example) is printed beside its
level's peak, and the samples/s a rank would reach at each peak.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from mpi_jobs import MPIEXEC, ROOT, run

sys.path.insert(0, ROOT)
from pydist.engine import lenet5, step_flops  # noqa: E402

TORCH_PEER = os.path.join(ROOT, "benchmarks", "torch_ddp_train.py")
PROGRAMS = ("pydist", "torch", "torch+pd")   # torch+pd: the same torch program, DDP over pydist
TARGET_ACCURACY = 0.89
# level: (the /proc/cpuinfo flags it needs, the variables that cap every program of its jobs to it)
LEVELS = {
    "sse2": ({"sse2"}, {"PYDIST_SIMD": "sse2", "OPENBLAS_CORETYPE": "Prescott",
                        "ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}),
    "avx2": ({"avx2", "fma"}, {"PYDIST_SIMD": "avx2", "OPENBLAS_CORETYPE": "Haswell",
                               "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}),
    "avx512": ({"avx512f", "avx512dq", "avx512bw", "avx512vl"},
               {"PYDIST_SIMD": "avx512", "OPENBLAS_CORETYPE": "SkylakeX",
                "ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}),
    "native": (set(), {}),   # no --simd: nothing capped
}
SHOWN_FLAGS = ("sse2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl")


def cpu(cpuinfo="/proc/cpuinfo"):
    """(model name, set of flags) of this machine's first CPU."""
    model, flags = "unknown", set()
    with open(cpuinfo) as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    return model, flags


def parse_args(argv=None, cpuinfo="/proc/cpuinfo"):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="world sizes (default 1 2)")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=64, help="per rank (default 64)")
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--simd", nargs="+", choices=("sse2", "avx2", "avx512"), default=["native"], metavar="LEVEL",
                    help="instruction-set levels to cap every program to, each in turn: sse2 avx2 avx512 "
                         "(default: none capped, one level 'native')")
    ap.add_argument("--quick", action="store_true", help="1 epoch at R = 1 2 (smoke test)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per job (default 60 + 60 per epoch)")
    ap.add_argument("--peak-reps", type=int, default=10, help="2048 x 2048 GEMMs for the single-core peak (default 10)")
    args = ap.parse_args(argv)
    args.simd = list(dict.fromkeys(args.simd))   # each level once, in the order given
    flags = cpu(cpuinfo)[1]
    for level in args.simd:
        if not LEVELS[level][0] <= flags:
            ap.error(f"--simd {level}: this CPU lacks {' '.join(sorted(LEVELS[level][0] - flags))} "
                     f"(/proc/cpuinfo), so {level} code cannot run here")
    if args.quick:
        args.epochs, args.ranks = 1, [1, 2]
    if args.timeout is None:
        args.timeout = 60 + 60 * args.epochs
    return args


def in_fresh_python(code, level):
    """What `code` prints, run in a new interpreter under `level`'s variables with one BLAS thread."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", **LEVELS[level][1])
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    if proc.returncode != 0:
        sys.exit(f"train_compare: python -c {code!r} at level {level} failed:\n{proc.stdout}{proc.stderr}")
    return proc.stdout.split()


def peak(level, reps):
    """(GFLOP/s, OpenBLAS kernel family): the single-core sgemm peak through the engine's BLAS at `level`."""
    gflops, core = in_fresh_python("from pydist import _C; from pydist.profile import peak_gflops; "
                                   f"_C.set_blas_threads(1); print(peak_gflops(reps={reps}), _C.blas_core())", level)
    return float(gflops), core


def torch_capability(level):
    """The kernels torch's ATen dispatches to at `level` (DEFAULT, AVX2, AVX512)."""
    return in_fresh_python("import torch; print(torch.backends.cpu.get_cpu_capability())", level)[0]


def run_job(program, ranks, level, args, metrics):
    """One training run; returns its per-epoch records, or exits with its output when it fails."""
    common = ["--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--lr", str(args.lr),
              "--momentum", str(args.momentum), "--seed", str(args.seed), "--metrics", metrics]
    if program == "pydist":
        argv = [sys.executable, "-m", "pydist.train", "--model", "lenet5", "--plot", "", "--no-progress"]
    else:
        argv = [sys.executable, TORCH_PEER] + (["--backend", "pydist"] if program == "torch+pd" else [])
    cmd = [MPIEXEC, "-n", str(ranks)] + argv + common
    returncode, output = run(cmd, args.timeout, "train_compare", env=LEVELS[level][1])
    records = []
    if os.path.exists(metrics):
        with open(metrics) as f:
            records = [json.loads(line) for line in f if line.strip()]
    if returncode != 0 or len(records) != args.epochs:
        caps = " ".join(f"{k}={v}" for k, v in LEVELS[level][1].items())
        sys.exit(f"train_compare: {caps} {' '.join(cmd)}\nexited with {returncode} after {len(records)} of "
                 f"{args.epochs} epochs; its output:\n{output}")
    return records


def load1():
    return os.getloadavg()[0]


def print_header(args, flops):
    model, flags = cpu()
    print(f"LeNet-5, {args.epochs} epoch(s), batch {args.batch_size} per rank, lr {args.lr}, momentum "
          f"{args.momentum}, seed {args.seed}, R in {args.ranks}; load average (1 min) before: {load1():.2f}")
    lacks = " ".join(f for f in SHOWN_FLAGS if f not in flags)
    print(f"CPU: {model}, {os.cpu_count()} cores; flags: {' '.join(f for f in SHOWN_FLAGS if f in flags)}"
          + (f"; lacks {lacks}" if lacks else ""))
    print(f"arithmetic floor: LeNet-5 forward + backward {flops * args.batch_size / 1e6:.1f} MFLOP per step of "
          f"{args.batch_size} ({flops / 1e6:.2f} per example)")
    print("levels (every program of a level's jobs runs under its variables):")
    for level in args.simd:
        caps = " ".join(f"{k}={v}" for k, v in LEVELS[level][1].items()) or "nothing capped"
        print(f"  {level:<7} {caps}; torch's ATen runs {torch_capability(level)}", flush=True)


def print_table(results, peaks, args, flops):
    def rate(level, program, ranks):
        recs = results[(level, program, ranks)]
        return sum(r["samples_per_s"] for r in recs) / len(recs)

    print(f"\n{'level':<7} {'program':<8} {'R':>2} {'samples/s':>10} {'/ torch':>8} {'GFLOP/s/rank':>13} "
          f"{'% of peak':>10} {'test acc':>9}  per-epoch test accuracy")
    for (level, program, ranks), recs in results.items():
        mean = rate(level, program, ranks)
        gflops = mean / ranks * flops / 1e9
        per_epoch = " ".join(f"{r['test_accuracy']:.4f}" for r in recs)
        print(f"{level:<7} {program:<8} {ranks:>2} {mean:>10.0f} {mean / rate(level, 'torch', ranks):>7.2f}x "
              f"{gflops:>13.2f} {100 * gflops / peaks[level][0]:>9.0f}% {recs[-1]['test_accuracy']:>9.4f}  {per_epoch}")

    print(f"\nsingle-core sgemm peak (2048 x 2048, 1 thread, the engine's OpenBLAS, the best of {args.peak_reps} "
          "before and after the jobs):")
    for level in args.simd:
        gflops, core = peaks[level]
        print(f"  {level:<7} {gflops:.1f} GFLOP/s (OpenBLAS {core} kernels): at most {gflops * 1e9 / flops:.0f} "
              "samples/s per rank")

    print("\nscaling efficiency (samples/s at R / (R x at R=1)):")
    for level in args.simd:
        for program in PROGRAMS:
            if 1 not in args.ranks:
                print(f"  {level} {program}: needs R=1 in --ranks")
                continue
            base = rate(level, program, 1)
            print(f"  {level} {program}: "
                  + ", ".join(f"R={r} {rate(level, program, r) / (r * base):.2f}" for r in args.ranks))

    print(f"\npydist reaches test accuracy >= {TARGET_ACCURACY} within {args.epochs} epoch(s):")
    for level in args.simd:
        for r in args.ranks:
            recs = results[(level, "pydist", r)]
            hit = next((rec["epoch"] for rec in recs if rec["test_accuracy"] >= TARGET_ACCURACY), None)
            best = max(rec["test_accuracy"] for rec in recs)
            print(f"  {level} R={r}: " + (f"yes, at epoch {hit}" if hit else f"no (best {best:.4f})"))


def main(argv=None):
    args = parse_args(argv)
    if MPIEXEC is None:
        sys.exit("train_compare: no mpiexec.mpich or mpiexec on PATH")
    flops = step_flops(lenet5(), args.batch_size) / args.batch_size   # per example
    print_header(args, flops)
    peaks = {level: peak(level, args.peak_reps) for level in args.simd}
    results = {}
    with tempfile.TemporaryDirectory(prefix="train_compare.") as tmp:
        for ranks in args.ranks:
            for level in args.simd:
                for program in PROGRAMS:  # interleaved, so drifting load falls on all of them
                    metrics = os.path.join(tmp, f"{level}-{program}-{ranks}.jsonl")
                    results[(level, program, ranks)] = recs = run_job(program, ranks, level, args, metrics)
                    print(f"  {level} {program} R={ranks}: {sum(r['epoch_s'] for r in recs):.1f} s training, "
                          f"test accuracy {recs[-1]['test_accuracy']:.4f}", flush=True)
    for level in args.simd:
        peaks[level] = max(peaks[level], peak(level, args.peak_reps))
    print_table(results, peaks, args, flops)
    print(f"\nload average (1 min) after: {load1():.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
