#!/usr/bin/env python3
"""What the timeline costs the main job (LeNet-5 on Fashion-MNIST, `make train`'s settings): training
samples/s with PYDIST_TIMELINE on and off, and, with --baseline, the same job on another build of
pydist (the commit before the timeline) to show that off costs nothing.

    python benchmarks/timeline_overhead.py                          # on vs off, 3 rounds of 1 epoch
    python benchmarks/timeline_overhead.py --baseline /tmp/pd-before --rounds 5

--baseline DIR: a checkout whose pydist/_C is built in place (git worktree add DIR REV, then
`python setup.py build_ext --inplace` there with this venv's python). The jobs are interleaved round by
round (before, off, on, before, off, on ...) so that noise on a shared machine falls on every variant;
samples/s counts the training steps only (the engine's own timing, from --metrics), not start-up,
evaluation or writing the trace. Prints each round and the median ratios.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from mpi_jobs import MPIEXEC, ROOT, mpi_env


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", default=None, help="a checkout of pydist built in place, for 'before'")
    return ap.parse_args(argv)


def one_run(variant, args, root, workdir):
    """samples/s of one training run of `variant` ('before', 'off' or 'on')."""
    metrics = os.path.join(workdir, f"{variant}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    env = mpi_env(120 + 120 * args.epochs)
    env["PYTHONPATH"] = root
    env.pop("PYDIST_TIMELINE", None)
    if variant == "on":
        env["PYDIST_TIMELINE"] = os.path.join(workdir, "run.json")
    cmd = [MPIEXEC, "-n", str(args.ranks), sys.executable, "-m", "pydist.train", "--model", "lenet5", "--epochs",
           str(args.epochs), "--no-progress", "--metrics", metrics, "--plot", ""]
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{variant}: the job failed:\n{proc.stdout}{proc.stderr}")
    records = [json.loads(line) for line in open(metrics)]
    return sum(r["samples_per_s"] for r in records) / len(records)


def main(argv=None):
    args = parse_args(argv)
    variants = (["before"] if args.baseline else []) + ["off", "on"]
    roots = {"before": os.path.abspath(args.baseline) if args.baseline else None, "off": ROOT, "on": ROOT}
    results = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as workdir:
        for r in range(args.rounds):
            for v in variants:
                results[v].append(one_run(v, args, roots[v], workdir))
            print(f"round {r + 1}: " + "  ".join(f"{v} {results[v][-1]:8.0f} samples/s" for v in variants),
                  flush=True)
        trace_mb = os.path.getsize(os.path.join(workdir, "run.json")) / 1e6
    median = {v: statistics.median(results[v]) for v in variants}
    print(f"\nLeNet-5, {args.ranks} ranks, {args.epochs} epoch(s), median of {args.rounds} rounds (samples/s):")
    for v in variants:
        print(f"  {v:7s} {median[v]:8.0f}")
    print(f"  timeline on / off: {median['on'] / median['off']:.3f} (samples/s: below 1 is a cost); "
          f"the trace: {trace_mb:.1f} MB")
    if args.baseline:
        print(f"  off / before:      {median['off'] / median['before']:.3f}")
    # the same ratio round by round: paired, so slow phases of the machine cancel
    paired = [on / off for on, off in zip(results["on"], results["off"])]
    print(f"  on / off per round: {' '.join(f'{p:.3f}' for p in paired)}")


if __name__ == "__main__":
    main()
