#!/usr/bin/env python3
"""Compression across simulated hosts: seconds to a test accuracy, and the final accuracy, for every
compressor beside none, with a synchronous and an asynchronous strategy, at each link rate.

    sudo python benchmarks/compression_cluster.py                  # the whole grid (about 80 minutes)
    sudo python benchmarks/compression_cluster.py --hosts 2 --models mlp --rates 100mbit
    python benchmarks/compression_cluster.py --report              # table and picture from saved runs

Run it directly as root (not under mpiexec): for each --hosts count it brings up that many network-
namespace hosts with scripts/cluster.sh, one rank each, shapes the links to each --rates value in turn
(fastest first) and runs benchmarks/compression_run.py for every model x strategy x compressor, then
takes the cluster down. Each run's JSON is kept in --out-dir and a run already there is not repeated,
so an interrupted grid goes on where it stopped.

What a synchronous run computes does not depend on the link: the same sums in the same order, whatever
the rate. So at the fastest rate each synchronous run trains all its epochs, and at the slower rates it
stops at the first evaluation that reaches --target (the seconds to the target are what the slow link
changes); its final accuracy is the fast run's, and the report checks that both runs' accuracies agree
bit for bit at every evaluation they share. Asynchronous runs depend on timing and train all their
epochs at every rate, or, with --max-train-s, the same training time below the fastest rate.

Output: one JSON per run, compression.json (the table) and compression.png (test accuracy against
training seconds, a panel per link rate, a line per compressor) in --out-dir (default
results/compression).
"""
import argparse
import json
import os
import subprocess
import sys

from cluster_model import CLUSTER, cluster, rate_bits  # noqa: E402  (the same cluster.sh, the same rate units)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from pydist import _figures as figures  # noqa: E402  (sized for the docs' column)

RUN = os.path.join(ROOT, "benchmarks", "compression_run.py")
SYNC = ("allreduce", "ring", "central", "ps", "average", "easgd")


def name(hosts, rate, model, strategy, compression):
    return f"h{hosts}_{rate}_{model}_{strategy}_{compression.replace(':', '')}.json"


def run(out, hosts, model, strategy, compression, epochs, stop_at, eval_every, max_train_s, timeout):
    args = [sys.executable, RUN, "--out", out, "--model", model, "--strategy", strategy,
            "--compression", compression, "--epochs", str(epochs), "--eval-every", str(eval_every)]
    if max_train_s is not None:
        args += ["--max-train-s", str(max_train_s)]
    if stop_at is not None:
        args += ["--stop-at", str(stop_at)]
    cmd = [CLUSTER, "run", "-n", str(hosts), "--ppn", "1", "--timeout", str(timeout), "--", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout + 60)
    if proc.returncode != 0 and os.path.exists(out):   # the run is whole; its ending was not (see below)
        print(f"  mpiexec exited {proc.returncode} after rank 0 wrote {out} (cluster.sh's finalize guard ending "
              f"a rank whose MPI_Finalize hung, hydra then losing its PMI barrier):\n{proc.stderr[-500:]}", flush=True)
    elif proc.returncode != 0 or not os.path.exists(out):
        print(f"  FAILED ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}", flush=True)
        return None
    with open(out) as f:
        return json.load(f)


def first_reaching(points, target):
    for p in points:
        if p["test_accuracy"] >= target:
            return p
    return None


def report(args):
    rows, mismatches = [], []
    for hosts in args.hosts:
        for model in args.models:
            for strategy in args.strategies:
                if strategy not in SYNC and hosts < 3:
                    continue   # one server and one worker: no data parallelism to speak of
                full = {}
                for rate in sorted(args.rates, key=rate_bits, reverse=True):
                    for comp in args.compressors:
                        path = os.path.join(args.out_dir, name(hosts, rate, model, strategy, comp))
                        if not os.path.exists(path):
                            continue
                        with open(path) as f:
                            r = json.load(f)
                        pts = r["points"]
                        final, from_run, tail = pts[-1], rate, pts[-args.last:]
                        if not r["finished"] and comp in full and strategy in SYNC:
                            ref = full[comp]
                            for a, b in zip(pts, ref["points"]):
                                if a["step"] == b["step"] and a["test_accuracy"] != b["test_accuracy"]:
                                    mismatches.append((hosts, rate, model, strategy, comp, a["step"]))
                            final, from_run, tail = ref["points"][-1], ref["rate"], ref["points"][-args.last:]
                        elif r["finished"]:
                            full[comp] = dict(r, rate=rate)
                        hit = first_reaching(pts, args.target)
                        trained = [p for p in pts if p["step"] > 0]
                        rows.append({
                            "hosts": hosts, "rate": rate, "model": model, "strategy": strategy, "compression": comp,
                            "s_per_step": trained[-1]["seconds"] / trained[-1]["step"] if trained else None,
                            "mib_per_step": trained[-1]["bytes_per_step"] / 2**20 if trained else None,
                            "seconds_to_target": hit["seconds"] if hit else None,
                            "epochs_to_target": hit["epochs"] if hit else None,
                            "final_accuracy": final["test_accuracy"], "final_epochs": final["epochs"],
                            "last_mean_accuracy": sum(p["test_accuracy"] for p in tail) / len(tail),
                            "final_from": from_run, "points": [(p["seconds"], p["test_accuracy"]) for p in pts]})
    print(f"seconds to {args.target} test accuracy, and the accuracy after the same epochs (one rank per host; "
          f"'x' = speed-up over none to the target)")
    print(f"{'hosts':>5} {'rate':>8} {'model':>6} {'strategy':>9} {'compression':>11} {'ms/step':>8} {'MiB/step':>9} "
          f"{'s to ' + str(args.target):>9} {'epochs':>6} {'x':>6} {'final':>7} {'epochs':>6} {'last ' + str(args.last):>7}")
    for r in rows:
        base = next((b for b in rows if b["compression"] == "none" and
                     all(b[k] == r[k] for k in ("hosts", "rate", "model", "strategy"))), None)
        speed = (base["seconds_to_target"] / r["seconds_to_target"]
                 if base and base["seconds_to_target"] and r["seconds_to_target"] else None)
        r["speedup_to_target"] = speed
        fmt = lambda v, f: format(v, f) if v is not None else "-".rjust(int(f.split(".")[0]))   # noqa: E731
        mark = "" if r["final_from"] == r["rate"] else "*"
        print(f"{r['hosts']:>5} {r['rate']:>8} {r['model']:>6} {r['strategy']:>9} {r['compression']:>11} "
              f"{fmt(r['s_per_step'] and r['s_per_step'] * 1e3, '8.1f')} {fmt(r['mib_per_step'], '9.3f')} "
              f"{fmt(r['seconds_to_target'], '9.1f')} {fmt(r['epochs_to_target'], '6.2f')} {fmt(speed, '6.1f')} "
              f"{r['final_accuracy']:>6.4f}{mark:1} {r['final_epochs']:>6.2f} {r['last_mean_accuracy']:>7.4f}")
    print(f"last {args.last}: the mean test accuracy of the last {args.last} evaluations (the last half epoch: "
          f"an asynchronous run's accuracy moves by points from one evaluation to the next)")
    print("* the run stopped at the target; its final accuracy is the fastest link's run of the same job "
          "(the same numbers: a synchronous run does not depend on the link)")
    if mismatches:
        print(f"WARNING: {len(mismatches)} evaluations differ between link rates: {mismatches[:5]}")
    else:
        print("check: every evaluation a stopped run shares with its full run is bitwise the same")
    with open(os.path.join(args.out_dir, "compression.json"), "w") as f:
        json.dump({"target": args.target, "rows": rows, "mismatches": mismatches}, f)
    plot(args, rows)


def plot(args, rows):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("no matplotlib: no picture")
        return
    png = os.path.join(args.out_dir, "compression.png")
    figures.save(figure(args, rows), png)
    print(f"wrote {png}")


def figure(args, rows):
    """Test accuracy against training seconds: a row of panels per (hosts, model, strategy), a panel per
    link rate, a line per compressor, one legend for all."""
    import matplotlib
    from matplotlib.figure import Figure   # no pyplot: no global state, no GUI backend
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    rates = sorted(args.rates, key=rate_bits)
    panels = [(h, m, s) for h in args.hosts for m in args.models for s in args.strategies
              if any(r["hosts"] == h and r["model"] == m and r["strategy"] == s for r in rows)]
    fig = Figure(figsize=(figures.WIDTH_IN, 0.9 + 2.5 * len(panels)), layout="constrained")
    axes = fig.subplots(len(panels), len(rates), squeeze=False, sharey=True)
    colors = {c: matplotlib.colormaps["tab10"](i) for i, c in enumerate(args.compressors)}
    for i, (h, m, s) in enumerate(panels):
        for j, rate in enumerate(rates):
            ax = axes[i][j]
            for r in rows:
                if (r["hosts"], r["model"], r["strategy"], r["rate"]) != (h, m, s, rate):
                    continue
                xs, ys = zip(*[(t, a) for t, a in r["points"] if t > 0])
                ax.plot(xs, ys, "-", color=colors[r["compression"]], lw=1.4)
            ax.axhline(args.target, color="grey", lw=0.7, ls=":")
            ax.set_xscale("log")
            # plain numbers at 1, 2, 5 of each decade: a panel spanning less than a decade would
            # otherwise label every minor tick in powers of ten, one over another
            ax.xaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_ylim(0.6, 0.92)
            ax.set_title(f"{'LeNet-5' if m == 'lenet5' else 'MLP 1024-1024'}, {s}, {h} hosts, {rate}",
                         fontsize="small")
            ax.grid(alpha=0.3)
        axes[i][0].set_ylabel("test accuracy")
    for ax in axes[-1]:
        ax.set_xlabel("training seconds (log)")
    shown = [c for c in args.compressors if any(r["compression"] == c for r in rows)]
    fig.legend(handles=[Line2D([], [], color=colors[c], lw=1.4, label=c) for c in shown],
               loc="outside lower center", ncol=len(shown), fontsize="small")
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--rates", nargs="+", default=["1gbit", "100mbit"])
    ap.add_argument("--models", nargs="+", choices=["mlp", "lenet5"], default=["mlp", "lenet5"])
    ap.add_argument("--strategies", nargs="+", default=["allreduce", "downpour"],
                    help="an asynchronous one runs at 3 hosts and more: one server, the rest workers")
    ap.add_argument("--compressors", nargs="+", default=["none", "fp16", "bf16", "topk:0.01", "sign", "powersgd:4"])
    ap.add_argument("--epochs", nargs=2, type=float, default=[2, 3], metavar=("MLP", "LENET5"))
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--last", type=int, default=5, help="the report's mean over the last evaluations (default 5)")
    ap.add_argument("--eval-every", type=int, default=0, help="steps between evaluations (default: a tenth of an epoch)")
    ap.add_argument("--max-train-s", type=float, default=None,
                    help="asynchronous runs below the fastest rate: stop at the first evaluation past this many "
                         "training seconds (all compressors get the same time; the report says how far each got)")
    ap.add_argument("--timeout", type=int, default=1800, help="per run, seconds")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "results", "compression"))
    ap.add_argument("--report", action="store_true", help="only the table and the picture, from saved runs")
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    if not args.report:
        fastest = max(args.rates, key=rate_bits)
        for hosts in args.hosts:
            cluster("down", check=False)
            cluster("up", str(hosts))
            try:
                for rate in sorted(args.rates, key=rate_bits, reverse=True):
                    cluster("rate", rate)
                    for model in args.models:
                        for strategy in args.strategies:
                            if strategy not in SYNC and hosts < 3:
                                continue
                            for comp in args.compressors:
                                out = os.path.join(args.out_dir, name(hosts, rate, model, strategy, comp))
                                if os.path.exists(out):
                                    continue
                                stop = args.target if strategy in SYNC and rate != fastest else None
                                epochs = args.epochs[0] if model == "mlp" else args.epochs[1]
                                print(f"{hosts} hosts, {rate}, {model}, {strategy}, {comp} ...", flush=True)
                                cap = args.max_train_s if strategy not in SYNC and rate != fastest else None
                                r = run(out, hosts, model, strategy, comp, epochs, stop, args.eval_every, cap,
                                        args.timeout)
                                if r:
                                    p = r["points"][-1]
                                    print(f"  {p['seconds']:.1f} s, {p['epochs']:.2f} epochs, accuracy "
                                          f"{p['test_accuracy']:.4f}", flush=True)
            finally:
                cluster("down", check=False)
    report(args)


if __name__ == "__main__":
    main()
