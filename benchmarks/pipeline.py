#!/usr/bin/env python3
"""Pipeline parallelism measured: GPipe against 1F1B, on LeNet-5 and on a deep MLP (8 x 1024), at
P stages and M micro-batches per step.

    python benchmarks/pipeline.py                  # P 2 4, M 1 2 4 8, both schedules, both models
    python benchmarks/pipeline.py --stages 2 --micro-batches 4 8 --models mlp
    python benchmarks/pipeline.py --quick          # P 2, M 1 2, a few steps, a small MLP (smoke test)
    python benchmarks/pipeline.py --replot         # the tables and PNGs again from the saved JSON

Run it directly, not under mpiexec: it launches one `mpiexec -n P` job of benchmarks/pipeline_run.py
per (model, P, schedule, M) under a hard timeout (one replica per stage: R = P ranks; when R exceeds
the cores the job is oversubscribed, which the tables say: the waiting ranks yield, but stages that
compute at the same time share a core, so their busy times stretch). Every job trains from the same
seed with the same batch per replica (--batch-size, divided into M micro-batches of batch / M), the
stage boundaries balanced by FLOPs (pydist.engine.balanced_split), and measures --steps steps after
--warmup.

Per stage the table shows its layers [first, last], busy ms per step (its forwards, backwards and
update), idle ms per step (waiting for a neighbour's activations or gradients: the bubble), the
bubble fraction idle / (busy + idle) beside the theory for equal stages (P - 1) / (M + P - 1), the
most micro-batches whose activations the stage held at once (GPipe: all M; 1F1B: min(P - p, M) on
stage p) and that memory (peak slots x one micro-batch's activations on that stage, KiB), and the
run's samples/s (the slowest rank's wall time of the measured steps). The batch is fixed, so a
micro-batch is batch / M: GPipe's peak is the whole batch's activations at every M (its slots grow
with M), 1F1B's is min(P - p, M) / M of it, falling as M grows.

pipeline_timeline.png draws the last measured step of one run per schedule (--timeline P M, on the
MLP if it ran): a row per stage, forward and backward blocks labelled with their micro-batch, the
update (all-reduce + SGD) in a third colour, in ms from the step's first event on any rank.
pipeline_bubble.png plots each run's bubble (the mean over its stages) against M, a panel per P,
with the theory's curve. The JSON of every run stays in --out.
"""
import argparse
import json
import os
import sys

from mpi_jobs import MPIEXEC, ROOT, run

sys.path.insert(0, ROOT)
from pydist import _figures as figures  # noqa: E402  (sized for the docs' column)
from pydist.engine import SCHEDULES  # noqa: E402  (the schedules' names; no MPI)

WORKER = os.path.join(ROOT, "benchmarks", "pipeline_run.py")
MODELS = ("lenet5", "mlp")
KIND = {0: ("forward", "tab:blue"), 1: ("backward", "tab:orange"), 2: ("all-reduce + update", "tab:green")}
SCHEDULE_COLOR = {"gpipe": "tab:red", "1f1b": "tab:blue"}
MODEL_MARKER = {"lenet5": "o", "mlp": "s"}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS), help="default: lenet5 mlp")
    ap.add_argument("--hidden", type=int, nargs="+", default=[1024] * 8, help="the MLP's widths (default 8 x 1024)")
    ap.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES), help="default: gpipe 1f1b")
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 4], help="P, the pipeline's stages (default 2 4)")
    ap.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4, 8],
                    help="M per step (default 1 2 4 8); each must divide --batch-size")
    ap.add_argument("--batch-size", type=int, default=64, help="per replica (default 64)")
    ap.add_argument("--warmup", type=int, default=3, help="steps before the measured ones (default 3)")
    ap.add_argument("--steps", type=int, default=40, help="measured steps per run (default 40)")
    ap.add_argument("--timeline", type=int, nargs=2, default=[2, 4], metavar=("P", "M"),
                    help="the run whose last step pipeline_timeline.png draws (default P 2, M 4)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: P 2, M 1 2, 1 + 3 steps, an MLP of 4 x 256, the timeline at M 2")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "pipeline"),
                    help="folder for the PNGs and each run's JSON (default results/pipeline)")
    ap.add_argument("--replot", action="store_true",
                    help="train nothing: the tables and PNGs again from the JSON a previous run left in --out")
    ap.add_argument("--timeout", type=float, default=180, help="seconds per job (default 180)")
    args = ap.parse_args(argv)
    if args.quick:
        args.stages, args.micro_batches, args.warmup, args.steps = [2], [1, 2], 1, 3
        args.hidden, args.timeline = [256] * 4, [2, 2]
    if min(args.stages + args.micro_batches + args.hidden + [args.batch_size, args.warmup, args.steps]) < 1:
        ap.error("--stages, --micro-batches, --hidden, --batch-size, --warmup and --steps must be >= 1")
    bad = [m for m in args.micro_batches if args.batch_size % m]
    if bad:
        ap.error(f"--micro-batches must divide the batch of {args.batch_size} (--batch-size); got {bad}")
    args.stages, args.micro_batches = sorted(set(args.stages)), sorted(set(args.micro_batches))
    return args


def model_tag(model, args):
    if model == "lenet5":
        return "lenet5"
    h = args.hidden
    return f"mlp-{h[0]}x{len(h)}" if len(set(h)) == 1 else "mlp-" + "-".join(map(str, h))


def model_layers(model, args):
    return 12 if model == "lenet5" else 2 * len(args.hidden) + 2   # lenet5(); mlp(): Flatten, (Linear, ReLU)s, Linear


def result_path(args, model, P, schedule, M):
    return os.path.join(args.out, f"{model_tag(model, args)}-P{P}-{schedule}-M{M}-B{args.batch_size}.json")


def run_job(model, P, schedule, M, args):
    """One measuring run; returns its JSON result, or exits with its output when it fails."""
    cmd = [MPIEXEC, "-n", str(P), sys.executable, WORKER, "--model", model, "--stages", str(P),
           "--micro-batches", str(M), "--schedule", schedule, "--batch-size", str(args.batch_size),
           "--warmup", str(args.warmup), "--steps", str(args.steps)]
    if model == "mlp":
        cmd += ["--hidden"] + [str(h) for h in args.hidden]
    returncode, output = run(cmd, args.timeout, "pipeline")
    lines = [line for line in output.splitlines() if line.startswith("{")]
    if returncode != 0 or not lines:
        sys.exit(f"pipeline: {' '.join(cmd)}\nexited with {returncode} and printed no result; its output:\n{output}")
    return json.loads(lines[-1])


def get_result(model, P, schedule, M, args, notes):
    """The run's result: measured now and saved in --out, or with --replot read from there (None,
    with a note, when there is none)."""
    path = result_path(args, model, P, schedule, M)
    if args.replot:
        if not os.path.exists(path):
            notes.append(f"{model_tag(model, args)} P={P} {schedule} M={M}: no saved result ({path})")
            return None
        with open(path) as f:
            return json.load(f)
    result = run_job(model, P, schedule, M, args)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, path)   # never a half-written file for --replot to read
    return result


def theory(P, M):
    """GPipe's and 1F1B's bubble for P equal stages and M micro-batches (the same for both)."""
    return (P - 1) / (M + P - 1)


def bubble(rank):
    return rank["idle_ms"] / max(rank["busy_ms"] + rank["idle_ms"], 1e-12)


def mean_bubble(result):
    return sum(bubble(r) for r in result["ranks"]) / len(result["ranks"])


def oversubscribed(ranks):
    return ranks > (os.cpu_count() or 1)


def print_table(model, P, results, args):
    """A row per (schedule, M, stage) of one model at P stages."""
    any_result = next(iter(results.values()))
    R = any_result["world_size"]
    crowded = (f"; OVERSUBSCRIBED: {R} ranks on {os.cpu_count()} cores (stages computing at once share a core: "
               f"busy times stretch)") if oversubscribed(R) else f"; {R} ranks on {os.cpu_count()} cores"
    print(f"\n{model_tag(model, args)}, P={P} stages x {any_result['replicas']} replica(s) = R={R}{crowded}; "
          f"split {any_result['split']}; batch {args.batch_size} per replica, {args.steps} steps measured after "
          f"{args.warmup}")
    print(f"{'model':<12} {'P':>2} {'schedule':<8} {'M':>2} {'stage':>5} {'layers':>7} {'busy ms':>8} {'idle ms':>8} "
          f"{'bubble %':>8} {'theory %':>8} {'peak slots':>10} {'peak KiB':>9} {'samples/s':>9}")
    for (schedule, M), result in sorted(results.items(), key=lambda kv: (SCHEDULES.index(kv[0][0]), kv[0][1])):
        for r in result["ranks"]:
            if r["replica"] != 0:
                continue   # one replica's stages (the replicas run the same schedule)
            layers = f"{r['first_layer']}-{r['last_layer'] - 1}"
            print(f"{model_tag(model, args):<12} {P:>2} {schedule:<8} {M:>2} {r['stage']:>5} {layers:>7} "
                  f"{r['busy_ms']:>8.2f} {r['idle_ms']:>8.2f} {100 * bubble(r):>8.1f} {100 * theory(P, M):>8.1f} "
                  f"{r['peak_slots']:>10} {r['peak_slots'] * r['slot_bytes'] / 1024:>9.0f} "
                  f"{result['samples_per_s']:>9.0f}")


def timeline_figure(runs, title):
    """One panel per schedule: a row per stage, its forward and backward blocks (labelled with the
    micro-batch where the label fits) and its update, in ms from the step's first event on any rank."""
    import textwrap

    from matplotlib.figure import Figure   # no pyplot: no global state, no GUI backend
    from matplotlib.patches import Patch

    fig = Figure(figsize=(figures.WIDTH_IN, 1.5 + 0.9 * sum(r["stages"] + 1 for _, r in runs)), layout="constrained")
    axes = fig.subplots(len(runs), 1, squeeze=False, sharex=True)[:, 0]
    span_ms = max((max(ev[3] for r in result["ranks"] for ev in r["trace"]) -
                   min(ev[2] for r in result["ranks"] for ev in r["trace"])) * 1e3 for _, result in runs)
    label_ms = span_ms * 0.3 / (figures.WIDTH_IN - 1.2)   # a 2-digit label at 8 pt: about 0.3 in of the axes
    for ax, (schedule, result) in zip(axes, runs):
        ranks = [r for r in result["ranks"] if r["replica"] == 0]
        t0 = min(ev[2] for r in ranks for ev in r["trace"])
        for r in ranks:
            y = r["stage"]
            for kind, micro, start, end in r["trace"]:
                left, width = (start - t0) * 1e3, (end - start) * 1e3
                ax.barh(y, width, left=left, height=0.7, color=KIND[kind][1], edgecolor="black", linewidth=0.5)
                if kind != 2 and width >= label_ms:
                    ax.text(left + width / 2, y, str(micro), ha="center", va="center", fontsize=figures.MIN_PT)
        step_ms = (max(ev[3] for r in ranks for ev in r["trace"]) - t0) * 1e3
        P, M = result["stages"], result["micro_batches"]
        ax.set_yticks(range(P), [f"stage {p}" for p in range(P)])
        ax.set_ylim(P - 0.5, -0.5)   # stage 0 on top
        ax.set_title(f"{schedule}: a step of {step_ms:.1f} ms, bubble {100 * mean_bubble(result):.0f}% measured, "
                     f"{100 * theory(P, M):.0f}% in theory\npeak slots per stage "
                     f"{[r['peak_slots'] for r in ranks]}", fontsize="medium")
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("ms from the step's first event (any stage)")
    fig.legend(handles=[Patch(facecolor=c, edgecolor="black", label=name) for name, c in KIND.values()],
               loc="outside lower center", fontsize="small", ncol=3)   # below the panels: never over a block
    fig.suptitle(textwrap.fill(title, 80), fontsize="medium")
    return fig


def bubble_figure(results, args):
    """Each run's bubble (the mean over its stages) against M, a panel per P, with the theory."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(figures.WIDTH_IN, 4.6), layout="constrained")
    axes = fig.subplots(1, len(args.stages), squeeze=False, sharey=True)[0]
    fine = [1 + i * (max(args.micro_batches) - 1) / 100 for i in range(101)]
    for ax, P in zip(axes, args.stages):
        ax.plot(fine, [theory(P, m) for m in fine], "-", color="black", linewidth=1,
                label="theory (P - 1) / (M + P - 1)")
        for model in args.models:
            for schedule in args.schedules:
                points = sorted((M, mean_bubble(r)) for (mo, p, s, M), r in results.items()
                                if (mo, p, s) == (model, P, schedule))
                if points:
                    ax.plot(*zip(*points), MODEL_MARKER[model] + ("--" if model == "lenet5" else "-"),
                            color=SCHEDULE_COLOR[schedule], label=f"{schedule}, {model_tag(model, args)}")
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
        ax.set_xticks(args.micro_batches, [str(m) for m in args.micro_batches])
        crowded = f"\noversubscribed: {P} ranks, {os.cpu_count()} cores" if oversubscribed(P) else ""
        ax.set(xlabel="M, micro-batches per step", ylim=(0, 1))
        ax.set_title(f"P = {P} stages{crowded}", fontsize="medium")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("bubble: idle / (busy + idle)")
    fig.legend(handles=axes[0].get_lines(), loc="outside lower center", fontsize="small", ncol=2)
    fig.suptitle(f"Pipeline bubble against micro-batches (batch {args.batch_size} per replica)", fontsize="medium")
    return fig


def draw(results, args):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot: skipped (matplotlib is not installed)")
        return
    P, M = args.timeline
    model = "mlp" if "mlp" in args.models else args.models[0]
    runs = [(s, results[(model, P, s, M)]) for s in args.schedules if (model, P, s, M) in results]
    if runs:
        png = os.path.join(args.out, "pipeline_timeline.png")
        crowded = f", oversubscribed ({P} ranks on {os.cpu_count()} cores)" if oversubscribed(P) else ""
        title = (f"{model_tag(model, args)}: the last measured step, P = {P} stages, M = {M} micro-batches of "
                 f"{args.batch_size // M}{crowded}")
        figures.save(timeline_figure(runs, title), png)
        print(f"plot: {png}")
    else:
        print(f"plot: no timeline (no {model_tag(model, args)} run at P={P}, M={M}; see --timeline)")
    if results:
        png = os.path.join(args.out, "pipeline_bubble.png")
        figures.save(bubble_figure(results, args), png)
        print(f"plot: {png}")


def main(argv=None):
    args = parse_args(argv)
    if MPIEXEC is None and not args.replot:
        sys.exit("pipeline: no mpiexec.mpich or mpiexec on PATH")
    os.makedirs(args.out, exist_ok=True)
    cores = os.cpu_count()
    print(f"pipeline: models {' '.join(model_tag(m, args) for m in args.models)}, schedules "
          f"{' '.join(args.schedules)}, P {args.stages}, M {args.micro_batches}, batch {args.batch_size} per replica, "
          f"{args.warmup} + {args.steps} steps per run; os.cpu_count() = {cores}"
          + "".join(f"; P={P} is oversubscribed ({P} ranks > {cores} cores)" for P in args.stages
                    if oversubscribed(P)) + f"; load average (1 min) before: {os.getloadavg()[0]:.2f}", flush=True)
    results, notes = {}, []
    for model in args.models:
        for P in args.stages:
            if P > model_layers(model, args):
                notes.append(f"{model_tag(model, args)} P={P} skipped: the model has only "
                             f"{model_layers(model, args)} layers (each stage needs one)")
                print("  " + notes[-1], flush=True)
                continue
            for schedule in args.schedules:
                for M in args.micro_batches:
                    result = get_result(model, P, schedule, M, args, notes)
                    if result is None:
                        continue
                    results[(model, P, schedule, M)] = result
                    if not args.replot:
                        print(f"  {model_tag(model, args)} P={P} {schedule} M={M}: {result['samples_per_s']:.0f} "
                              f"samples/s, bubble {100 * mean_bubble(result):.1f}% (theory "
                              f"{100 * theory(P, M):.1f}%)", flush=True)
    for model in args.models:
        for P in args.stages:
            section = {(s, M): r for (mo, p, s, M), r in results.items() if (mo, p) == (model, P)}
            if section:
                print_table(model, P, section, args)
    for line in notes:
        print("  note: " + line)
    print()
    draw(results, args)
    print(f"\nload average (1 min) after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
