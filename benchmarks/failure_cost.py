"""What a lost rank costs under python -m pydist.run: for the main job (LeNet-5) and the
communication-heavy MLP (1024 x 1024), with a synchronous (allreduce) and an asynchronous (downpour)
strategy, one run straight through and one whose rank 1 is SIGKILLed half-way through an epoch; the
launcher restarts it from the newest checkpoint (--checkpoint-every), or under --survive (downpour+survive)
the job carries on without the dead worker. Printed: wall seconds of each, the seconds the failure cost,
the steps recomputed, and the final test accuracy of each.

    python benchmarks/failure_cost.py [--ranks 3] [--epochs 2] [--every 50] [--only NAME ...]
                                      [--json results/failure_cost.json]
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from pydist.run import read_progress

CASES = [("lenet5", [], "allreduce"), ("lenet5", [], "downpour"), ("lenet5", [], "downpour+survive"),
         ("mlp", ["--hidden", "1024", "1024"], "allreduce"), ("mlp", ["--hidden", "1024", "1024"], "downpour"),
         ("mlp", ["--hidden", "1024", "1024"], "downpour+survive")]


def step_reached(folder):
    return read_progress(os.path.join(folder, "run")).get("step", 0)


def one(model, extra, case, args, kill_at):
    folder = tempfile.mkdtemp(prefix="pydist-failure-")
    strategy, survive = case.split("+")[0], ["--survive"] if case.endswith("+survive") else []
    train = ["-m", "pydist.train", "--model", model, *extra, "--strategy", strategy, "--epochs", str(args.epochs),
             "--checkpoint", "run.ckpt", "--resume-if-present", "--checkpoint-every", str(args.every), "--no-progress",
             "--metrics", "", "--plot", ""]
    cmd = [sys.executable, "-m", "pydist.run", "-n", str(args.ranks), *survive, "--run-dir", os.path.join(folder, "run"),
           "--", *train]
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if kill_at is not None:
        # under --survive, just after a checkpoint is written: a death in the checkpoint itself (a
        # collective over every rank) restarts the job instead
        reached = (lambda: read_progress(os.path.join(folder, "run")).get("checkpoint_step") or 0) if survive else (
            lambda: step_reached(folder))
        while reached() < kill_at and proc.poll() is None:
            time.sleep(0.02)
        with open(os.path.join(folder, "run", "attempt-0", "rank-1.pid")) as f:
            os.kill(int(f.read().split()[0]), signal.SIGKILL)
    out, _ = proc.communicate()
    seconds = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"{model} {strategy}: the launcher failed:\n{out}")
    summary = json.loads(re.findall(r"^summary (.*)$", out, re.M)[-1])
    lost = re.search(r"(\d+) step\(s\) lost", out)
    return {"seconds": seconds, "accuracy": summary["final_test_accuracy"], "lost": int(lost.group(1)) if lost else 0}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--every", type=int, default=50, help="--checkpoint-every (default 50)")
    ap.add_argument("--only", nargs="+", default=None, help="these strategies alone (e.g. downpour+survive)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; {args.ranks} ranks, {args.epochs} epochs, a checkpoint every "
          f"{args.every} steps; the failure: SIGKILL of rank 1 half-way through epoch 1", flush=True)
    print("| model | strategy | straight s | with a failure s | cost s | steps recomputed | accuracy straight | "
          "accuracy with the failure |\n|---|---|---|---|---|---|---|---|", flush=True)
    rows = []
    for model, extra, strategy in CASES:
        if args.only and strategy not in args.only:
            continue
        workers = args.ranks - 1 if strategy.startswith("downpour") else args.ranks
        half = 60000 // (workers * 64) // 2 + args.every // 2   # mid-way between two checkpoints
        straight = one(model, extra, strategy, args, None)
        failed = one(model, extra, strategy, args, half)
        rows.append({"model": model, "strategy": strategy, "straight": straight, "failed": failed})
        print(f"| {model}{' 1024x1024' if extra else ''} | {strategy} | {straight['seconds']:.1f} | "
              f"{failed['seconds']:.1f} | {failed['seconds'] - straight['seconds']:.1f} | {failed['lost']} | "
              f"{straight['accuracy']:.4f} | {failed['accuracy']:.4f} |", flush=True)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"load": os.getloadavg()[0], "args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
