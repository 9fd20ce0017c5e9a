#!/usr/bin/env python3
"""The training strategies side by side: LeNet-5 on Fashion-MNIST, every strategy at every number of workers.

    python benchmarks/strategies.py                              # 2 3 4 workers, 2 epochs, all ten strategies
    python benchmarks/strategies.py --straggler --window-sweep   # and with rank 1 sleeping 20 ms a step,
                                                                 # and downpour/adag at windows 1 5 10 25
    python benchmarks/strategies.py --workers 2 --slow-rank 1 --slow-ms 50 --strategies allreduce downpour
    python benchmarks/strategies.py --quick                      # 2 workers, a few steps each (smoke test)
    python benchmarks/strategies.py --straggler --window-sweep --replot   # again from the saved JSON

Run it directly, not under mpiexec: it launches one `mpiexec -n R` job of benchmarks/strategy_run.py
per (scenario, strategy, workers) under a hard timeout (oversubscribed when R exceeds the cores: the
ranks' waits yield). The comparison is per number of WORKERS W (the ranks that train): the
synchronous strategies run at R = W ranks; ps and the asynchronous strategies (downpour, adag,
aeasgd, dynsgd) have --servers ranks besides, so they run at R = W + servers (on a machine with
fewer cores than that, the servers' time is taken from the workers': the table shows R). Every job
trains from the same seed, on the same data order, with the same batch per worker (so the same
global batch at the same W), lr, momentum and epochs. The test accuracy is measured on the 10k test
images every --eval-every steps against training seconds (evaluation off the clock; what is
evaluated is the replica, the workers' average for average, the center for easgd and the
asynchronous strategies); "s to 0.85" is the clock at the first evaluation at or above 0.85, so its
resolution is --eval-every steps. Between two evaluations the synchronous strategies give every
worker the same steps; the asynchronous ones hand the batches out in blocks of a window, so a fast
worker takes more of them and a straggler holds no one back (their idle share: what is left, at most
one block of the straggler's at the end of each chunk).

Per (strategy, W) the table shows R, the final test accuracy, seconds to 0.85, samples/s, Tcomp and
Tsync per worker step (Tcomp includes a straggler's sleep), KiB sent per step per rank (mean over
ranks and the busiest rank) and messages per step per rank, over all epochs; for the asynchronous
strategies also the mean staleness of a push (the server's updates since that worker's last pull)
and the wait share (Tsync / (Tcomp + Tsync): the workers' step time spent exchanging with the
servers), and for every strategy the idle share: the workers' share of the clock spent, after their
steps between two evaluations, waiting for the slowest rank (a synchronous strategy waits inside
every step instead, in Tsync). strategies.png plots test accuracy against seconds, a panel per W and a line per strategy
(dashed: asynchronous); the straggler scenario goes to strategies_straggler.png.

--window-sweep trains --sweep-strategies (downpour and adag) at --sweep-workers (2 and 4) with every
window of --sweep-windows (1 5 10 25), prints final test accuracy and seconds to 0.85 per (strategy,
W, window) and plots final accuracy against window in strategies_window.png, a line per (strategy,
W). Downpour adds each worker's whole accumulated update to the center, adag divides it by the
window: at the same lr downpour's effective step grows with workers and window. A sweep run that is
also a comparison run (same strategy, W and window) is trained once. The JSON of every run stays in
--out.
"""
import argparse
import json
import math
import os
import sys

from mpi_jobs import MPIEXEC, ROOT, run

sys.path.insert(0, ROOT)
from pydist import _figures as figures  # noqa: E402  (sized for the docs' column)
from pydist.engine import ASYNC, DATA_PARALLEL, STRATEGIES  # noqa: E402  (the strategies and their options; no MPI)

WORKER = os.path.join(ROOT, "benchmarks", "strategy_run.py")
TARGET = 0.85
COLORS = {"allreduce": "tab:blue", "ring": "tab:cyan", "central": "tab:green", "ps": "tab:red",
          "average": "tab:orange", "easgd": "tab:purple", "downpour": "tab:brown", "adag": "tab:pink",
          "aeasgd": "tab:olive", "dynsgd": "tab:gray"}   # one colour per strategy in every panel
SERVED = ("ps",) + ASYNC   # the strategies with server ranks besides the workers
STRAGGLER = (1, 20)   # --straggler's default: rank 1 sleeps 20 ms per step


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 3, 4],
                    help="numbers of workers (default 2 3 4); R = workers, + servers for ps and asynchronous")
    ap.add_argument("--strategies", nargs="+", choices=DATA_PARALLEL, default=list(DATA_PARALLEL),
                    help="default: all but pipeline (benchmarks/pipeline.py)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64, help="per worker (default 64)")
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--servers", type=int, default=1, help="ps and the asynchronous strategies (default 1)")
    ap.add_argument("--period", type=int, default=4, help="average and easgd (default 4)")
    ap.add_argument("--beta", type=float, default=0.9, help="easgd and aeasgd (default 0.9)")
    ap.add_argument("--window", type=int, default=5, help="the asynchronous strategies (default 5)")
    ap.add_argument("--deterministic", action="store_true",
                    help="the asynchronous strategies serve the workers in a fixed round-robin (repeatable runs; "
                         "default: whichever worker's push arrives first)")
    ap.add_argument("--eval-every", type=int, default=100, help="steps between evaluations (default 100)")
    ap.add_argument("--slow-rank", type=int, default=None, help="the straggler scenario: this rank sleeps ...")
    ap.add_argument("--slow-ms", type=int, default=None, help="... this many ms per step")
    ap.add_argument("--straggler", action="store_true",
                    help=f"run both scenarios, normal and straggler (default rank {STRAGGLER[0]}, {STRAGGLER[1]} ms)")
    ap.add_argument("--window-sweep", action="store_true",
                    help="also train --sweep-strategies at --sweep-workers with every --sweep-windows (no straggler)")
    ap.add_argument("--sweep-strategies", nargs="+", choices=ASYNC, default=["downpour", "adag"],
                    help="default: downpour adag")
    ap.add_argument("--sweep-workers", type=int, nargs="+", default=[2, 4], help="default: 2 4")
    ap.add_argument("--sweep-windows", type=int, nargs="+", default=[1, 5, 10, 25], help="default: 1 5 10 25")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 2 workers, 1 epoch of 40 steps, 2k test images, --deterministic; a sweep "
                         "of windows 1 and 5")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "strategies"),
                    help="folder for the PNGs and each run's JSON (default results/strategies)")
    ap.add_argument("--replot", action="store_true",
                    help="train nothing: the tables and PNGs again from the JSON a previous run left in --out")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per job (default 60 + 120 per epoch)")
    args = ap.parse_args(argv)
    if (args.slow_rank is None) != (args.slow_ms is None) and not args.straggler:
        ap.error("--slow-rank and --slow-ms go together (or give --straggler)")
    if min(args.epochs, args.eval_every, args.batch_size, args.servers, args.period, args.window) < 1:
        ap.error("--epochs, --eval-every, --batch-size, --servers, --period and --window must be >= 1")
    if min(args.workers + args.sweep_workers + args.sweep_windows) < 1:
        ap.error("--workers, --sweep-workers and --sweep-windows must be >= 1")
    args.max_steps, args.test_subset = None, None
    if args.quick:
        args.workers, args.epochs, args.max_steps, args.eval_every, args.test_subset = [2], 1, 40, 20, 2000
        args.window_sweep, args.sweep_workers, args.sweep_windows = True, [2], sorted({1, args.window})
        args.deterministic = True   # the smoke test's accuracies are repeatable
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


def job_options(strategy, workers, slow_rank, slow_ms, args, window=None):
    """(ranks, worker options, note) for one job, or (None, None, reason) when it cannot run."""
    options = {k: getattr(args, k) for k in STRATEGIES[strategy] if k in ("servers", "period", "beta", "window")}
    if strategy in ASYNC and args.deterministic:
        options["deterministic"] = True
    if window is not None:
        options["window"] = window
    ranks = workers + args.servers if strategy in SERVED else workers
    if slow_rank is None:
        return ranks, options, ""
    if slow_rank >= ranks:
        return None, None, f"no rank {slow_rank} to slow at R={ranks}"
    note = ""
    if slow_rank >= workers:
        # A server never sleeps (the sleep is in the workers' step), so slow the last worker instead.
        note = f"rank {slow_rank} is a server; slowed worker rank {workers - 1} instead"
        slow_rank = workers - 1
    options.update(slow_rank=slow_rank, slow_ms=slow_ms)
    return ranks, options, note


def result_path(args, scenario, strategy, workers, options):
    window = f"-win{options['window']}{'-det' * options.get('deterministic', False)}" if "window" in options else ""
    return os.path.join(args.out, f"{scenario}-{strategy}-W{workers}{window}.json")


def run_job(strategy, ranks, options, args, path):
    """One training run; returns its JSON result, or exits with its output when it fails."""
    argv = [sys.executable, WORKER, "--strategy", strategy, "--epochs", str(args.epochs),
            "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--momentum", str(args.momentum),
            "--seed", str(args.seed), "--eval-every", str(args.eval_every), "--out", path]
    for name, value in options.items():
        argv += ["--" + name.replace("_", "-")] + ([] if value is True else [str(value)])   # True: a flag
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


def get_result(strategy, workers, ranks, options, args, path, trained, notes):
    """The run's result: trained now (once per invocation: the window sweep reuses the comparison's
    runs), or with --replot read from --out; None (with a note) when --replot finds none."""
    what = f"{strategy} W={workers}" + (f" window {options['window']}" if "window" in options else "")
    if path in trained:
        return trained[path]
    if not args.replot:
        trained[path] = run_job(strategy, ranks, options, args, path)
        return trained[path]
    if not os.path.exists(path):
        print(f"  no saved result for {what} ({path})", flush=True)
        notes.append(f"{what}: no saved result")
        return None
    with open(path) as f:
        trained[path] = result = json.load(f)
    if len(result["epochs"]) != args.epochs:
        notes.append(f"{what}: the saved run has {len(result['epochs'])} epoch(s), not {args.epochs}")
    return result


def seconds_to(result, target):
    """Training seconds at the first evaluation at or above `target`, or None."""
    return next((t for t, _, acc in result["curve"] if acc >= target), None)


def summary(result):
    """The table's figures over all epochs (every epoch has the same number of steps)."""
    epochs = result["epochs"]
    mean = lambda key: sum(e[key] for e in epochs) / len(epochs)  # noqa: E731
    samples = len(epochs) * result["steps_per_epoch"] * result["global_batch"]
    s = {"samples_per_s": samples / sum(e["seconds"] for e in epochs), "t_comp_ms": mean("t_comp_ms"),
         "t_sync_ms": mean("t_sync_ms"), "kib": mean("bytes_per_step") / 1024,
         "max_kib": mean("max_bytes_per_step") / 1024, "messages": mean("messages_per_step"),
         "staleness": None, "wait_share": None, "idle_share": None}
    if "idle_share" in epochs[0]:
        s["idle_share"] = mean("idle_share")
    if "staleness_mean" in epochs[0]:   # an asynchronous strategy
        s.update(staleness=mean("staleness_mean"), wait_share=mean("wait_share"))
    return s


def seconds_text(seconds):
    return "-" if seconds is None else f"{seconds:.1f}"


def print_table(scenario, results, notes, args):
    name, slow_rank, slow_ms = scenario
    what = "no straggler" if slow_rank is None else f"straggler: rank {slow_rank} sleeps {slow_ms} ms per step"
    print(f"\n{name} ({what}); {args.epochs} epoch(s), batch {args.batch_size} per worker, lr {args.lr}; "
          f"s to {TARGET} at the first evaluation reaching it (every {args.eval_every} steps); W workers, "
          f"R ranks (W + {args.servers} server(s) for {', '.join(SERVED)}); asynchronous window {args.window}; "
          f"stale: mean staleness of a push; wait: the workers' share of step time exchanging; idle: the "
          f"workers' share of the clock waiting for the slowest rank at the end of each {args.eval_every} steps")
    print(f"{'strategy':<10} {'W':>2} {'R':>2} {'global B':>8} {'test acc':>8} {'s to ' + str(TARGET):>9} "
          f"{'samples/s':>9} {'Tcomp ms':>8} {'Tsync ms':>8} {'KiB/step/rank':>13} {'max KiB':>8} {'msgs/step':>9} "
          f"{'stale':>6} {'wait %':>6} {'idle %':>6}")
    for (strategy, workers), result in sorted(results.items(), key=lambda kv: kv[0][1]):
        s = summary(result)
        stale = "-" if s["staleness"] is None else f"{s['staleness']:.2f}"
        wait = "-" if s["wait_share"] is None else f"{100 * s['wait_share']:.1f}"
        idle = "-" if s["idle_share"] is None else f"{100 * s['idle_share']:.1f}"
        print(f"{strategy:<10} {workers:>2} {result['world_size']:>2} {result['global_batch']:>8} "
              f"{result['final_test_accuracy']:>8.4f} {seconds_text(seconds_to(result, TARGET)):>9} "
              f"{s['samples_per_s']:>9.0f} {s['t_comp_ms']:>8.2f} {s['t_sync_ms']:>8.2f} {s['kib']:>13.1f} "
              f"{s['max_kib']:>8.1f} {s['messages']:>9.2f} {stale:>6} {wait:>6} {idle:>6}")
    for line in notes:
        print("  note: " + line)


def figure(scenario, results, workers):
    """Test accuracy against training seconds: a panel per number of workers, stacked to the docs'
    column, a line per strategy, one legend for all (a strategy's R is in the tables)."""
    from matplotlib.figure import Figure   # no pyplot: no global state, no GUI backend
    from matplotlib.lines import Line2D

    name, slow_rank, slow_ms = scenario
    fig = Figure(figsize=(figures.WIDTH_IN, 1.9 + 2.4 * len(workers)), layout="constrained")
    axes = fig.subplots(len(workers), 1, squeeze=False, sharey=True)[:, 0]
    # The y range of the learning after the first evaluation: every run starts from the same weights
    # (its step-0 point, at chance, lies below), and the strategies differ near the top.
    later = [acc for result in results.values() for _, _, acc in result["curve"][1:]] or [0.0, 1.0]
    bottom, top = max(0.0, math.floor((min(later) - 0.05) * 20) / 20), min(1.0, max(later) + 0.02)
    for ax, w in zip(axes, workers):
        for (strategy, W), result in results.items():
            if W == w:
                t, _, acc = zip(*result["curve"])
                ax.plot(t, acc, style(strategy), color=COLORS[strategy])
        ax.axhline(TARGET, color="grey", linestyle=":", linewidth=1)
        ax.set(ylim=(bottom, top), ylabel="test accuracy")
        ax.set_title(f"{w} worker{'s' * (w > 1)}", fontsize="medium")
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("training seconds (evaluation excluded)")
    shown = [strategy for strategy in DATA_PARALLEL if any(s == strategy for s, _ in results)]
    fig.legend(handles=[Line2D([], [], linestyle=style(s)[1:], marker=".", color=COLORS[s], label=s) for s in shown],
               loc="outside lower center", ncol=5, fontsize="small")
    straggler = "" if slow_rank is None else f"; rank {slow_rank} sleeps {slow_ms} ms per step"
    fig.suptitle("LeNet-5 / Fashion-MNIST: test accuracy against training time\n"
                 f"(dashed: asynchronous, R = W + servers{straggler})", fontsize="medium")
    return fig


def style(strategy):
    """The line of a strategy: dashed when asynchronous."""
    return ".--" if strategy in ASYNC else ".-"


def window_figure(results, args):
    """Final test accuracy against the window, a line per (strategy, workers)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(figures.WIDTH_IN, 4.2), layout="constrained")
    ax = fig.subplots()
    styles = ["o-", "s--", "^-.", "d:"]
    for i, workers in enumerate(args.sweep_workers):
        for strategy in args.sweep_strategies:
            points = [(win, r["final_test_accuracy"]) for (st, w, win), r in results.items()
                      if st == strategy and w == workers]
            if points:
                ax.plot(*zip(*sorted(points)), styles[i % len(styles)], color=COLORS[strategy],
                        label=f"{strategy}, {workers} workers")
    ax.set_xscale("log")
    ax.minorticks_off()   # the windows themselves are the ticks
    ax.set_xticks(sorted(args.sweep_windows), [str(w) for w in sorted(args.sweep_windows)])
    ax.set(xlabel="window (a worker's steps between exchanges)", ylabel="final test accuracy (the center)")
    ax.set_title(f"LeNet-5 / Fashion-MNIST, {args.epochs} epoch(s), lr {args.lr}, momentum {args.momentum}",
                 fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def window_sweep(args, trained):
    """The asynchronous strategies' window against final accuracy: table and strategies_window.png."""
    results, notes = {}, []
    for workers in args.sweep_workers:
        for strategy in args.sweep_strategies:
            for window in args.sweep_windows:
                ranks, options, _ = job_options(strategy, workers, None, None, args, window)
                path = result_path(args, "normal", strategy, workers, options)
                result = get_result(strategy, workers, ranks, options, args, path, trained, notes)
                if result is not None:
                    results[(strategy, workers, window)] = result
                    print(f"  window sweep {strategy} W={workers} window {window}: test accuracy "
                          f"{result['final_test_accuracy']:.4f}, {TARGET} at "
                          f"{seconds_text(seconds_to(result, TARGET))} s", flush=True)
    print(f"\nwindow sweep (no straggler); {args.epochs} epoch(s), batch {args.batch_size} per worker, lr {args.lr}, "
          f"momentum {args.momentum}; the same lr for every strategy, W and window")
    print(f"{'strategy':<10} {'W':>2} {'R':>2} {'window':>6} {'test acc':>8} {'s to ' + str(TARGET):>9} "
          f"{'samples/s':>9} {'stale':>6} {'wait %':>6}")
    for (strategy, workers, window), result in results.items():
        s = summary(result)
        print(f"{strategy:<10} {workers:>2} {result['world_size']:>2} {window:>6} "
              f"{result['final_test_accuracy']:>8.4f} {seconds_text(seconds_to(result, TARGET)):>9} "
              f"{s['samples_per_s']:>9.0f} {s['staleness']:>6.2f} {100 * s['wait_share']:>6.1f}")
    for line in notes:
        print("  note: " + line)
    if not results:
        return
    png = os.path.join(args.out, "strategies_window.png")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot: skipped (matplotlib is not installed)")
        return
    figures.save(window_figure(results, args), png)
    print(f"plot: {png}")


def load1():
    return os.getloadavg()[0]


def main(argv=None):
    args = parse_args(argv)
    if MPIEXEC is None:
        sys.exit("strategies: no mpiexec.mpich or mpiexec on PATH")
    os.makedirs(args.out, exist_ok=True)
    print(f"LeNet-5 / Fashion-MNIST, strategies {' '.join(args.strategies)}, workers {args.workers}, {args.epochs} "
          f"epoch(s), batch {args.batch_size} per worker, lr {args.lr}, momentum {args.momentum}, seed {args.seed}, "
          f"period {args.period}, (a)easgd beta {args.beta}, servers {args.servers} (ps, asynchronous), "
          f"window {args.window}{', deterministic' * args.deterministic} (asynchronous); {os.cpu_count()} cores; "
          f"load average (1 min) before: {load1():.2f}",
          flush=True)
    trained = {}   # path -> result, this invocation's runs
    for scenario in args.scenarios:
        name, slow_rank, slow_ms = scenario
        results, notes = {}, []
        for workers in args.workers:
            for strategy in args.strategies:
                ranks, options, note = job_options(strategy, workers, slow_rank, slow_ms, args)
                if options is None:
                    print(f"  skipped {strategy} W={workers}: {note}", flush=True)
                    notes.append(f"{strategy} W={workers} skipped: {note}")
                    continue
                if note:
                    notes.append(f"{strategy} W={workers}: {note}")
                path = result_path(args, name, strategy, workers, options)
                result = get_result(strategy, workers, ranks, options, args, path, trained, notes)
                if result is None:
                    continue
                results[(strategy, workers)] = result
                s = summary(result)
                stale = "" if s["staleness"] is None else (f", staleness {s['staleness']:.2f}, wait "
                                                           f"{100 * s['wait_share']:.1f}%")
                stale += "" if s["idle_share"] is None else f", idle {100 * s['idle_share']:.1f}%"
                print(f"  {name} {strategy} W={workers} R={result['world_size']}: {result['train_seconds']:.1f} s "
                      f"training, test accuracy {result['final_test_accuracy']:.4f}, {TARGET} at "
                      f"{seconds_text(seconds_to(result, TARGET))} s{stale}", flush=True)
        print_table(scenario, results, notes, args)
        png = os.path.join(args.out, "strategies.png" if name == "normal" else "strategies_straggler.png")
        if not results:
            print(f"plot: skipped (no {name} results)")
            continue
        try:
            figures.save(figure(scenario, results, args.workers), png)
            print(f"plot: {png}")
        except ImportError:
            print("plot: skipped (matplotlib is not installed)")
    if args.window_sweep:
        window_sweep(args, trained)
    print(f"\nload average (1 min) after: {load1():.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
