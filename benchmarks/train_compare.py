#!/usr/bin/env python3
"""LeNet-5 on Fashion-MNIST: pydist's native engine beside PyTorch DDP over gloo and over pydist's torch
backend (torch+pd: `import pydist.torch`, backend "pydist"), per world size.

    python benchmarks/train_compare.py                        # R = 1 2, 5 epochs each
    python benchmarks/train_compare.py --ranks 2 --epochs 10
    python benchmarks/train_compare.py --quick                # R = 1 2, 1 epoch (smoke test)

Run it directly, not under mpiexec: it launches the jobs itself, one `mpiexec -n R` job per program
and world size under a hard timeout, interleaved (pydist R=1, torch R=1, pydist R=2, ...) so that
noise on this shared machine falls on both. Both train the same model from the same seed on the same
data order and sharding (`python -m pydist.train` and benchmarks/torch_ddp_train.py) and write one JSON
line per epoch; the table is read from those files. Samples/s counts the training steps only.
Scaling efficiency = samples/s at R / (R x samples/s at R=1).

The arithmetic floor: one step's forward and backward is pydist.engine.step_flops(lenet5(), batch)
floating-point operations; the machine's single-core peak is the fastest of --peak-reps 2048 x 2048
float32 GEMMs through the engine's own BLAS on one thread (_C.sgemm_seconds), measured in this process
before and after the jobs. Each run's GFLOP/s per rank (samples/s / R x FLOPs per example) is printed
beside that peak, with the samples/s a rank would reach at the peak.
"""
import argparse
import json
import os
import sys
import tempfile

from mpi_jobs import MPIEXEC, ROOT, run

sys.path.insert(0, ROOT)
from pydist import _C  # noqa: E402  (the engine's BLAS, for the single-core peak; no MPI is started)
from pydist.engine import lenet5, step_flops  # noqa: E402
from pydist.profile import peak_gflops  # noqa: E402

TORCH_PEER = os.path.join(ROOT, "benchmarks", "torch_ddp_train.py")
PROGRAMS = ("pydist", "torch", "torch+pd")   # torch+pd: the same torch program, DDP over pydist
TARGET_ACCURACY = 0.89


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="world sizes (default 1 2)")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=64, help="per rank (default 64)")
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="1 epoch at R = 1 2 (smoke test)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per job (default 60 + 60 per epoch)")
    ap.add_argument("--peak-reps", type=int, default=10, help="2048 x 2048 GEMMs for the single-core peak (default 10)")
    args = ap.parse_args(argv)
    if args.quick:
        args.epochs, args.ranks = 1, [1, 2]
    if args.timeout is None:
        args.timeout = 60 + 60 * args.epochs
    return args


def run_job(program, ranks, args, metrics):
    """One training run; returns its per-epoch records, or exits with its output when it fails."""
    common = ["--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--lr", str(args.lr),
              "--momentum", str(args.momentum), "--seed", str(args.seed), "--metrics", metrics]
    if program == "pydist":
        argv = [sys.executable, "-m", "pydist.train", "--model", "lenet5", "--plot", "", "--no-progress"]
    else:
        argv = [sys.executable, TORCH_PEER] + (["--backend", "pydist"] if program == "torch+pd" else [])
    cmd = [MPIEXEC, "-n", str(ranks)] + argv + common
    returncode, output = run(cmd, args.timeout, "train_compare")
    records = []
    if os.path.exists(metrics):
        with open(metrics) as f:
            records = [json.loads(line) for line in f if line.strip()]
    if returncode != 0 or len(records) != args.epochs:
        sys.exit(f"train_compare: {' '.join(cmd)}\nexited with {returncode} after {len(records)} of "
                 f"{args.epochs} epochs; its output:\n{output}")
    return records


def load1():
    return os.getloadavg()[0]


def print_floor(results, args, peak):
    flops = step_flops(lenet5(), args.batch_size) / args.batch_size   # per example
    print(f"\narithmetic floor: LeNet-5 forward + backward {flops * args.batch_size / 1e6:.1f} MFLOP per step of "
          f"{args.batch_size} ({flops / 1e6:.2f} per example); single-core sgemm peak {peak:.1f} GFLOP/s "
          f"(2048 x 2048, 1 thread, OpenBLAS {_C.blas_core()} kernels, the best before and after the jobs): at most {peak * 1e9 / flops:.0f} "
          f"samples/s per rank")
    for (program, ranks), recs in results.items():
        per_rank = sum(r["samples_per_s"] for r in recs) / len(recs) / ranks
        gflops = per_rank * flops / 1e9
        print(f"  {program:<8} R={ranks}: {per_rank:.0f} samples/s per rank = {gflops:.1f} GFLOP/s, "
              f"{100 * gflops / peak:.0f}% of the peak")


def print_tables(results, args):
    print(f"\n{'program':<8} {'R':>2} {'mean samples/s':>15} {'last samples/s':>15} {'test acc':>9}  "
          f"per-epoch test accuracy")
    for (program, ranks), recs in results.items():
        mean = sum(r["samples_per_s"] for r in recs) / len(recs)
        per_epoch = " ".join(f"{r['test_accuracy']:.4f}" for r in recs)
        print(f"{program:<8} {ranks:>2} {mean:>15.0f} {recs[-1]['samples_per_s']:>15.0f} "
              f"{recs[-1]['test_accuracy']:>9.4f}  {per_epoch}")

    def mean_rate(program, ranks):
        recs = results[(program, ranks)]
        return sum(r["samples_per_s"] for r in recs) / len(recs)

    print("\nscaling efficiency (mean samples/s at R / (R x at R=1)):")
    for program in PROGRAMS:
        if 1 not in args.ranks:
            print(f"  {program}: needs R=1 in --ranks")
            continue
        base = mean_rate(program, 1)
        print(f"  {program}: " + ", ".join(f"R={r} {mean_rate(program, r) / (r * base):.2f}" for r in args.ranks))

    print("\npydist / torch samples/s: "
          + ", ".join(f"R={r} {mean_rate('pydist', r) / mean_rate('torch', r):.2f}x" for r in args.ranks))
    print("torch DDP over pydist / over gloo samples/s: "
          + ", ".join(f"R={r} {mean_rate('torch+pd', r) / mean_rate('torch', r):.2f}x" for r in args.ranks))

    print(f"\npydist reaches test accuracy >= {TARGET_ACCURACY} within {args.epochs} epoch(s):")
    for r in args.ranks:
        recs = results[("pydist", r)]
        hit = next((rec["epoch"] for rec in recs if rec["test_accuracy"] >= TARGET_ACCURACY), None)
        best = max(rec["test_accuracy"] for rec in recs)
        print(f"  R={r}: " + (f"yes, at epoch {hit}" if hit else f"no (best {best:.4f})"))


def main(argv=None):
    args = parse_args(argv)
    if MPIEXEC is None:
        sys.exit("train_compare: no mpiexec.mpich or mpiexec on PATH")
    print(f"LeNet-5, {args.epochs} epoch(s), batch {args.batch_size} per rank, lr {args.lr}, momentum "
          f"{args.momentum}, seed {args.seed}, R in {args.ranks}; load average (1 min) before: {load1():.2f}",
          flush=True)
    _C.set_blas_threads(1)
    peak = peak_gflops(reps=args.peak_reps)
    results = {}
    with tempfile.TemporaryDirectory(prefix="train_compare.") as tmp:
        for ranks in args.ranks:
            for program in PROGRAMS:  # interleaved, so drifting load falls on both
                metrics = os.path.join(tmp, f"{program}-{ranks}.jsonl")
                results[(program, ranks)] = recs = run_job(program, ranks, args, metrics)
                print(f"  {program} R={ranks}: {sum(r['epoch_s'] for r in recs):.1f} s training, "
                      f"test accuracy {recs[-1]['test_accuracy']:.4f}", flush=True)
    print_tables(results, args)
    print_floor(results, args, max(peak, peak_gflops(reps=args.peak_reps)))
    print(f"\nload average (1 min) after: {load1():.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
