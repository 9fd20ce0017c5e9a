#!/usr/bin/env python3
"""The training strategies side by side: LeNet-5 on Fashion-MNIST, every strategy at every world size.

    python benchmarks/strategies.py                              # R = 2 3 4, 2 epochs, all six strategies
    python benchmarks/strategies.py --straggler                  # and again with rank 1 sleeping 20 ms a step
    python benchmarks/strategies.py --ranks 2 --slow-rank 1 --slow-ms 50 --strategies allreduce average
    python benchmarks/strategies.py --quick                      # R = 2, a few steps each (smoke test)
    python benchmarks/strategies.py --straggler --replot         # tables and plots again from the saved JSON

Run it directly, not under mpiexec: it launches one `mpiexec -n R` job of benchmarks/strategy_run.py
per (scenario, R, strategy) under a hard timeout (oversubscribed when R exceeds the cores: the ranks'
waits yield). Every job trains from the same seed, on the same data order, with the same batch per
worker, lr, momentum and epochs; ps has R - servers workers, so its global batch (and samples per
step) is smaller: the table shows workers and global batch. The test accuracy is measured on the 10k
test images every --eval-every steps against training seconds (evaluation off the clock); "s to 0.85"
is the clock at the first evaluation at or above 0.85, so its resolution is --eval-every steps.

Per (strategy, R) the table shows the final test accuracy, seconds to 0.85, samples/s, Tcomp and Tsync
per worker step (Tcomp includes a straggler's sleep), KiB sent per step per rank (mean over ranks and
the busiest rank) and messages per step per rank, over all epochs. strategies.png plots test accuracy
against seconds, a panel per R and a line per strategy; the straggler scenario goes to
strategies_straggler.png. The JSON of every run stays in --out.
"""
import argparse
import json
import math
import os
import sys

from mpi_jobs import MPIEXEC, ROOT, run

sys.path.insert(0, ROOT)
from pydist.engine import STRATEGIES  # noqa: E402  (the table of strategies and their options; no MPI)

WORKER = os.path.join(ROOT, "benchmarks", "strategy_run.py")
TARGET = 0.85
COLORS = {"allreduce": "tab:blue", "ring": "tab:cyan", "central": "tab:green", "ps": "tab:red",
          "average": "tab:orange", "easgd": "tab:purple"}   # one colour per strategy in every panel
STRAGGLER = (1, 20)   # --straggler's default: rank 1 sleeps 20 ms per step


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 4], help="world sizes (default 2 3 4)")
    ap.add_argument("--strategies", nargs="+", choices=tuple(STRATEGIES), default=list(STRATEGIES),
                    help="default: all")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64, help="per worker (default 64)")
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--servers", type=int, default=1, help="ps (default 1)")
    ap.add_argument("--period", type=int, default=4, help="average and easgd (default 4)")
    ap.add_argument("--beta", type=float, default=0.9, help="easgd (default 0.9)")
    ap.add_argument("--eval-every", type=int, default=100, help="steps between evaluations (default 100)")
    ap.add_argument("--slow-rank", type=int, default=None, help="the straggler scenario: this rank sleeps ...")
    ap.add_argument("--slow-ms", type=int, default=None, help="... this many ms per step")
    ap.add_argument("--straggler", action="store_true",
                    help=f"run both scenarios, normal and straggler (default rank {STRAGGLER[0]}, {STRAGGLER[1]} ms)")
    ap.add_argument("--quick", action="store_true", help="smoke test: R = 2, 1 epoch of 40 steps, 2k test images")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "strategies"),
                    help="folder for the PNGs and each run's JSON (default results/strategies)")
    ap.add_argument("--replot", action="store_true",
                    help="train nothing: the tables and PNGs again from the JSON a previous run left in --out")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per job (default 60 + 120 per epoch)")
    args = ap.parse_args(argv)
    if (args.slow_rank is None) != (args.slow_ms is None) and not args.straggler:
        ap.error("--slow-rank and --slow-ms go together (or give --straggler)")
    if args.epochs < 1 or args.eval_every < 1 or args.batch_size < 1 or args.servers < 1 or args.period < 1:
        ap.error("--epochs, --eval-every, --batch-size, --servers and --period must be >= 1")
    if min(args.ranks) < 1:
        ap.error("--ranks must be >= 1")
    args.max_steps, args.test_subset = None, None
    if args.quick:
        args.ranks, args.epochs, args.max_steps, args.eval_every, args.test_subset = [2], 1, 40, 20, 2000
    if args.timeout is None:
        args.timeout = 60 + 120 * args.epochs
    slowed = (args.slow_rank if args.slow_rank is not None else STRAGGLER[0],
              args.slow_ms if args.slow_ms is not None else STRAGGLER[1])
    args.scenarios = []
    if args.straggler or args.slow_rank is None:
        args.scenarios.append(("normal", None, None))
    if args.straggler or args.slow_rank is not None:
        args.scenarios.append(("straggler", *slowed))
    return args


def job_options(strategy, ranks, slow_rank, slow_ms, args):
    """(worker options, note) for one job, or (None, reason) when it cannot run."""
    options = {k: getattr(args, k) for k in STRATEGIES[strategy] if k in ("servers", "period", "beta")}
    if strategy == "ps" and ranks - args.servers < 1:
        return None, f"ps needs at least one worker beside {args.servers} server(s)"
    if slow_rank is None:
        return options, ""
    if slow_rank >= ranks:
        return None, f"no rank {slow_rank} to slow at R={ranks}"
    note = ""
    if strategy == "ps" and slow_rank >= ranks - args.servers:
        # A server never sleeps (the sleep is in the workers' step), so slow the last worker instead.
        note = f"rank {slow_rank} is a ps server; slowed worker rank {ranks - args.servers - 1} instead"
        slow_rank = ranks - args.servers - 1
    options.update(slow_rank=slow_rank, slow_ms=slow_ms)
    return options, note


def run_job(strategy, ranks, options, args, path):
    """One training run; returns its JSON result, or exits with its output when it fails."""
    argv = [sys.executable, WORKER, "--strategy", strategy, "--epochs", str(args.epochs),
            "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--momentum", str(args.momentum),
            "--seed", str(args.seed), "--eval-every", str(args.eval_every), "--out", path]
    for name, value in options.items():
        argv += ["--" + name.replace("_", "-"), str(value)]
    if args.max_steps:
        argv += ["--max-steps", str(args.max_steps)]
    if args.test_subset:
        argv += ["--test-subset", str(args.test_subset)]
    if os.path.exists(path):
        os.remove(path)   # never read a previous run's result
    cmd = [MPIEXEC, "-n", str(ranks)] + argv
    returncode, output = run(cmd, args.timeout, "strategies")
    if returncode != 0 or not os.path.exists(path):
        sys.exit(f"strategies: {' '.join(cmd)}\nexited with {returncode} and wrote no result; its output:\n{output}")
    with open(path) as f:
        return json.load(f)


def seconds_to(result, target):
    """Training seconds at the first evaluation at or above `target`, or None."""
    return next((t for t, _, acc in result["curve"] if acc >= target), None)


def summary(result):
    """The table's figures over all epochs (every epoch has the same number of steps)."""
    epochs = result["epochs"]
    mean = lambda key: sum(e[key] for e in epochs) / len(epochs)  # noqa: E731
    samples = len(epochs) * result["steps_per_epoch"] * result["global_batch"]
    return {"samples_per_s": samples / sum(e["seconds"] for e in epochs), "t_comp_ms": mean("t_comp_ms"),
            "t_sync_ms": mean("t_sync_ms"), "kib": mean("bytes_per_step") / 1024,
            "max_kib": mean("max_bytes_per_step") / 1024, "messages": mean("messages_per_step")}


def print_table(scenario, results, notes, args):
    name, slow_rank, slow_ms = scenario
    what = "no straggler" if slow_rank is None else f"straggler: rank {slow_rank} sleeps {slow_ms} ms per step"
    print(f"\n{name} ({what}); {args.epochs} epoch(s), batch {args.batch_size} per worker; "
          f"s to {TARGET} at the first evaluation reaching it (every {args.eval_every} steps)")
    print(f"{'strategy':<10} {'R':>2} {'workers':>7} {'global B':>8} {'test acc':>8} {'s to ' + str(TARGET):>9} "
          f"{'samples/s':>9} {'Tcomp ms':>8} {'Tsync ms':>8} {'KiB/step/rank':>13} {'max KiB':>8} {'msgs/step':>9}")
    for (strategy, ranks), result in results.items():
        s, hit = summary(result), seconds_to(result, TARGET)
        print(f"{strategy:<10} {ranks:>2} {result['workers']:>7} {result['global_batch']:>8} "
              f"{result['final_test_accuracy']:>8.4f} {'-' if hit is None else f'{hit:.1f}':>9} "
              f"{s['samples_per_s']:>9.0f} {s['t_comp_ms']:>8.2f} {s['t_sync_ms']:>8.2f} {s['kib']:>13.1f} "
              f"{s['max_kib']:>8.1f} {s['messages']:>9.2f}")
    for line in notes:
        print("  note: " + line)


def figure(scenario, results, ranks):
    """Test accuracy against training seconds: a panel per R, a line per strategy."""
    from matplotlib.figure import Figure   # no pyplot: no global state, no GUI backend

    name, slow_rank, slow_ms = scenario
    fig = Figure(figsize=(max(6.5, 5 * len(ranks)), 4.6))
    axes = fig.subplots(1, len(ranks), squeeze=False, sharey=True)[0]
    # The y range of the learning after the first evaluation: every run starts from the same weights
    # (its step-0 point, at chance, lies below), and the strategies differ near the top.
    later = [acc for result in results.values() for _, _, acc in result["curve"][1:]] or [0.0, 1.0]
    bottom, top = max(0.0, math.floor((min(later) - 0.05) * 20) / 20), min(1.0, max(later) + 0.02)
    for ax, r in zip(axes, ranks):
        for (strategy, R), result in results.items():
            if R == r:
                t, _, acc = zip(*result["curve"])
                n = result["workers"]
                ax.plot(t, acc, ".-", color=COLORS[strategy], label=f"{strategy} ({n} worker{'s' * (n > 1)})")
        ax.axhline(TARGET, color="grey", linestyle=":", linewidth=1)
        ax.set(title=f"R = {r}", xlabel="training seconds (evaluation excluded)", ylim=(bottom, top))
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize="small")
    axes[0].set_ylabel("test accuracy")
    fig.suptitle("LeNet-5 / Fashion-MNIST: test accuracy against training time" + ("" if slow_rank is None else
                 f"\nstraggler: rank {slow_rank} sleeps {slow_ms} ms per step"))
    fig.tight_layout()
    return fig


def load1():
    return os.getloadavg()[0]


def main(argv=None):
    args = parse_args(argv)
    if MPIEXEC is None:
        sys.exit("strategies: no mpiexec.mpich or mpiexec on PATH")
    os.makedirs(args.out, exist_ok=True)
    print(f"LeNet-5 / Fashion-MNIST, strategies {' '.join(args.strategies)}, R in {args.ranks}, {args.epochs} "
          f"epoch(s), batch {args.batch_size} per worker, lr {args.lr}, momentum {args.momentum}, seed {args.seed}, "
          f"period {args.period}, easgd beta {args.beta}, ps servers {args.servers}; {os.cpu_count()} cores; "
          f"load average (1 min) before: {load1():.2f}", flush=True)
    for scenario in args.scenarios:
        name, slow_rank, slow_ms = scenario
        results, notes = {}, []
        for ranks in args.ranks:
            for strategy in args.strategies:
                options, note = job_options(strategy, ranks, slow_rank, slow_ms, args)
                if options is None:
                    print(f"  skipped {strategy} R={ranks}: {note}", flush=True)
                    notes.append(f"{strategy} R={ranks} skipped: {note}")
                    continue
                if note:
                    notes.append(f"{strategy} R={ranks}: {note}")
                path = os.path.join(args.out, f"{name}-{strategy}-R{ranks}.json")
                if args.replot:
                    if not os.path.exists(path):
                        print(f"  no saved result for {name} {strategy} R={ranks} ({path})", flush=True)
                        notes.append(f"{strategy} R={ranks}: no saved result")
                        continue
                    with open(path) as f:
                        results[(strategy, ranks)] = result = json.load(f)
                    if len(result["epochs"]) != args.epochs:
                        notes.append(f"{strategy} R={ranks}: the saved run has {len(result['epochs'])} epoch(s), "
                                     f"not {args.epochs}")
                else:
                    results[(strategy, ranks)] = result = run_job(strategy, ranks, options, args, path)
                hit = seconds_to(result, TARGET)
                print(f"  {name} {strategy} R={ranks}: {result['train_seconds']:.1f} s training, test accuracy "
                      f"{result['final_test_accuracy']:.4f}, {TARGET} at "
                      f"{'-' if hit is None else f'{hit:.1f} s'}", flush=True)
        print_table(scenario, results, notes, args)
        png = os.path.join(args.out, "strategies.png" if name == "normal" else "strategies_straggler.png")
        try:
            figure(scenario, results, args.ranks).savefig(png, dpi=90)
            print(f"plot: {png}")
        except ImportError:
            print("plot: skipped (matplotlib is not installed)")
    print(f"\nload average (1 min) after: {load1():.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
