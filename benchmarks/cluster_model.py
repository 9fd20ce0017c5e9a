#!/usr/bin/env python3
"""The Tcomp/Tsync trade-off across simulated hosts, measured against the classic model.

    sudo python benchmarks/cluster_model.py                     # 2 hosts, 100 Mbit/s .. 10 Gbit/s
    sudo python benchmarks/cluster_model.py --rates 100mbit 1gbit --batches 16 64
    python benchmarks/cluster_model.py --replot                 # the picture again from cluster.json

Run it directly as root (not under mpiexec): it brings up a cluster of --hosts network-namespace hosts
with scripts/cluster.sh, one rank per host, re-shapes the link to each --rates value in turn, runs
benchmarks/cluster_run.py across the hosts at each rate and once alone (one rank, no network), then
takes the cluster down again.

The model. An epoch of N examples takes N/B x Tcomp(B) on one rank and N/(R B) x (Tcomp(B) + Tsync) on
R ranks with B examples per rank per step, so R ranks are S = R Tcomp / (Tcomp + Tsync) times faster,
and pay off when Tsync < (R - 1) Tcomp. Tsync for an all-reduce of n bytes is alpha-beta's
alpha + 2 (R - 1) / R x n / beta (the bandwidth term of a ring or reduce-scatter + all-gather: what
each rank must send, m), here with two per-byte terms, whichever is slower (they overlap, as the
stages of a pipeline do): m / host, what the hosts' own stack (TCP through the kernel, copies, the
reduction) costs, which caps a fast link, and (m - bucket) / (eta x the link's rate), the wire. `tc`'s token bucket (scripts/cluster.sh: 2 ms of traffic, at least 64 KiB)
lets its depth through at once when it is full (Tsync is timed after 10 ms idle; in training the
compute refills it), so only the bytes past it wait for the rate. On a real link the bucket is 0 and
this is the classic alpha + m / beta with beta the slower of the link and the hosts. One alpha, eta
and host are fitted to every measured Tsync (least squares on relative error), and each point's
prediction is printed beside it. The speed-up curves use Tcomp(B) measured alone and Tsync predicted for LeNet-5's gradient; the
measured points are R x (step time alone) / (step time on R hosts) at the same B.

Output (--out-dir, default results/cluster): cluster.json (every figure) and cluster.png (speed-up
over one rank against batch size per rank, one colour per link rate: the model's curves for R = hosts
(solid) and for twice as many hosts (dotted), the measured points as markers).
"""
import argparse
import json
import os
import re
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "scripts", "cluster.sh")
RUN = os.path.join(ROOT, "benchmarks", "cluster_run.py")
sys.path.insert(0, ROOT)
from pydist import _figures as figures  # noqa: E402  (sized for the docs' column)


def rate_bits(rate):
    """'100mbit' -> 1e8 bits/s (tc's units)."""
    m = re.fullmatch(r"([0-9.]+)\s*([kmg]?)bit", rate.lower())
    if not m:
        raise SystemExit(f"cluster_model.py: a rate is like 100mbit, 1gbit or 10gbit; got {rate!r}")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def cluster(*args, check=True):
    proc = subprocess.run([CLUSTER, *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"scripts/cluster.sh {' '.join(args)} failed ({proc.returncode}):\n"
                         f"{proc.stdout}{proc.stderr}")
    return proc


def job(out, ranks, args, timeout):
    cmd = [sys.executable, RUN, "--out", out, *args]
    if ranks > 1:
        cmd = [CLUSTER, "run", "-n", str(ranks), "--ppn", "1", "--timeout", str(timeout), "--", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout + 60)
    if proc.returncode != 0:
        raise SystemExit(f"job failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    with open(out) as f:
        return json.load(f)


def bucket(r):
    """Bytes scripts/cluster.sh's token bucket lets through at once: 2 ms of traffic, at least 64 KiB."""
    return max(r / 8 * 0.002, 65536)


def parts(n, r, ranks, credit=None):
    """(wire bits per bit/s, host bits) for n bytes at link rate r: the bytes each rank sends past what
    the bucket (full, or `credit`) lets through at once wait for the link's rate; every byte it sends
    goes through the hosts' own stack."""
    sent = 2 * (ranks - 1) / ranks * n
    credit = bucket(r) if credit is None else credit
    return max(0.0, sent - credit) * 8 / r, sent * 8


def fit(points, ranks):
    """(alpha s, eta, host bits/s): the least relative error over (bytes, link bits/s, seconds), on a grid
    of eta and host with alpha in closed form for each."""
    t = np.array([s for _, _, s in points])
    wire, host_bits = np.array([parts(n, r, ranks) for n, r, _ in points]).T
    best = None
    for eta in np.linspace(0.3, 1.5, 121):
        for host in np.geomspace(0.5e9, 50e9, 161):
            g = np.maximum(wire / eta, host_bits / host)
            alpha = max(0.0, float(np.sum((1 - g / t) / t) / np.sum(1 / t ** 2)))
            err = float(np.sum(((alpha + g) / t - 1) ** 2))
            if best is None or err < best[0]:
                best = (err, alpha, float(eta), float(host))
    return best[1:]


def predict(model, n, r, ranks, credit=None):
    alpha, eta, host = model
    wire, host_bits = parts(n, r, ranks, credit)
    return alpha + max(wire / eta, host_bits / host)


def step_sync(model, n, r, ranks, tcomp):
    """Tsync in a training step: the bucket refills during the step's compute."""
    return predict(model, n, r, ranks, credit=min(bucket(r), r / 8 * tcomp))


def figure(batches, tcomp1, rates, model, grad, ranks, measured):
    """Speed-up over one rank against B: the model's curves for R = ranks (solid) and 2 ranks (dotted)
    and the measured points, a colour per link rate."""
    import matplotlib
    from matplotlib.figure import Figure   # no pyplot: no global state, no GUI backend
    from matplotlib.lines import Line2D

    fig = Figure(figsize=(figures.WIDTH_IN, 6.2), layout="constrained")
    ax = fig.subplots()
    fine = np.geomspace(batches[0], batches[-1], 60)
    t_fine = np.exp(np.interp(np.log(fine), np.log(batches), np.log(tcomp1)))
    colours = {rate: matplotlib.colormaps["viridis"](i / max(len(rates) - 1, 1)) for i, rate in enumerate(rates)}
    for rate in rates:
        color = colours[rate]
        r = rate_bits(rate)
        for many, style in ((ranks, "-"), (2 * ranks, ":")):
            s = [many * t / (t + step_sync(model, grad, r, many, t)) for t in t_fine]
            ax.plot(fine, s, style, color=color)
        ax.plot(batches, measured[rate], "o", color=color)
    ax.axhline(1, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.minorticks_off()
    ax.set_xticks(batches, [str(b) for b in batches])   # the batches measured
    ax.set_xlabel("batch size per rank B")
    ax.set_ylabel("speed-up over one rank")
    ax.grid(alpha=0.3)
    alpha, eta, host = model
    ax.set_title(f"LeNet-5 data parallel across simulated hosts: S = R Tcomp / (Tcomp + Tsync)\n"
                 f"Tsync = {alpha * 1e3:.2f} ms + max((m - bucket) / ({eta:.2f} x link rate), "
                 f"m / {host / 1e9:.1f} Gbit/s)\nm = 2(R-1)/R x {grad / 1024:.0f} KiB", fontsize="small")
    # a colour per rate, then what each line style is
    keys = [Line2D([], [], color=colours[rate], lw=4, label=rate) for rate in rates]
    keys += [Line2D([], [], linestyle="-", color="black", label=f"model, R={ranks}"),
             Line2D([], [], linestyle=":", color="black", label=f"model, R={2 * ranks}"),
             Line2D([], [], linestyle="", marker="o", color="black", label=f"measured, R={ranks}")]
    fig.legend(handles=keys, loc="outside lower center", ncol=4, fontsize="small")
    return fig


def replot(out_dir):
    """cluster.png again from cluster.json."""
    with open(os.path.join(out_dir, "cluster.json")) as f:
        saved = json.load(f)
    batches = [int(b) for b in saved["tcomp1_s"]]
    tcomp1 = [saved["tcomp1_s"][str(b)] for b in batches]
    model = (saved["alpha_s"], saved["eta"], saved["host_bits_per_s"])
    png = os.path.join(out_dir, "cluster.png")
    figures.save(figure(batches, tcomp1, list(saved["speedup_measured"]), model, saved["grad_bytes"],
                        saved["hosts"], saved["speedup_measured"]), png)
    print(f"wrote {png}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=2, help="simulated hosts, one rank each (default 2)")
    ap.add_argument("--rates", nargs="+", default=["100mbit", "300mbit", "1gbit", "3gbit", "10gbit"])
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    ap.add_argument("--sizes", type=int, nargs="+", default=[246824, 524288, 1048576, 2097152, 4194304])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--reps", type=int, default=21, help="timed all-reduces per size (the median is kept)")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "results", "cluster"))
    ap.add_argument("--timeout", type=int, default=300, help="per job, seconds")
    ap.add_argument("--replot", action="store_true", help="only the picture again, from --out-dir's cluster.json")
    args = ap.parse_args(argv)
    if args.replot:
        return replot(args.out_dir)
    for r in args.rates:
        rate_bits(r)
    os.makedirs(args.out_dir, exist_ok=True)
    common = ["--batches", *map(str, args.batches), "--steps", str(args.steps), "--sizes", *map(str, args.sizes),
              "--reps", str(args.reps)]
    alone = job(os.path.join(args.out_dir, "alone.json"), 1, common, args.timeout)
    tcomp1 = [s["step_s"] for s in alone["steps"]]
    grad = alone["grad_bytes"]
    runs = {}
    cluster("down", check=False)
    cluster("up", str(args.hosts))
    try:
        for rate in args.rates:
            cluster("rate", rate)
            runs[rate] = job(os.path.join(args.out_dir, f"r{args.hosts}_{rate}.json"), args.hosts, common,
                             args.timeout)
            print(f"{rate}: done", flush=True)
    finally:
        cluster("down", check=False)
    named = [(rate, t["bytes"], t["seconds"]) for rate, run in runs.items() for t in run["tsync"]]
    points = [(n, rate_bits(rate), s) for rate, n, s in named]
    model = fit(points, args.hosts)
    alpha, eta, host = model
    print(f"\nTsync = alpha + max((m - bucket) / (eta x rate), m / host), m = 2(R-1)/R x n, R = {args.hosts}: alpha "
          f"{alpha * 1e3:.3f} ms, eta {eta:.3f}, host {host / 1e9:.2f} Gbit/s (fitted to {len(points)} points)")
    print(f"{'rate':>8} {'bytes':>9} {'measured ms':>12} {'model ms':>9} {'error':>7}")
    worst = 0.0
    table = []
    for (rate, n, s), (_, r, _) in zip(named, points):
        p = predict(model, n, r, args.hosts)
        err = (p - s) / s
        worst = max(worst, abs(err))
        table.append({"rate": rate, "bytes": n, "measured_s": s, "model_s": p, "error": err})
        print(f"{rate:>8} {n:>9} {s * 1e3:>12.3f} {p * 1e3:>9.3f} {err * 100:>+6.1f}%")
    print(f"largest |error|: {worst * 100:.1f}% (goal: within 20%)")
    measured = {}
    print(f"\nspeed-up over one rank at R = {args.hosts} (measured / model), by batch size per rank:")
    print(f"{'rate':>8} " + " ".join(f"{'B=' + str(b):>13}" for b in args.batches) + "   pays off from (model)")
    for rate, run in runs.items():
        steps = [s["step_s"] for s in run["steps"]]
        measured[rate] = [args.hosts * t1 / t for t1, t in zip(tcomp1, steps)]
        syncs = [step_sync(model, grad, rate_bits(rate), args.hosts, t1) for t1 in tcomp1]
        modelled = [args.hosts * t1 / (t1 + ts) for t1, ts in zip(tcomp1, syncs)]
        pays = [b for b, t1, ts in zip(args.batches, tcomp1, syncs) if ts < (args.hosts - 1) * t1]
        print(f"{rate:>8} " + " ".join(f"{m:>6.2f}/{p:<6.2f}" for m, p in zip(measured[rate], modelled)) +
              f"   {('B >= ' + str(pays[0])) if pays else 'beyond B=' + str(args.batches[-1])}")
    png = os.path.join(args.out_dir, "cluster.png")
    figures.save(figure(args.batches, tcomp1, list(runs), model, grad, args.hosts, measured), png)
    with open(os.path.join(args.out_dir, "cluster.json"), "w") as f:
        json.dump({"hosts": args.hosts, "alpha_s": alpha, "eta": eta, "host_bits_per_s": host, "grad_bytes": grad,
                   "tsync": table,
                   "tcomp1_s": dict(zip(map(str, args.batches), tcomp1)), "speedup_measured": measured,
                   "runs": runs}, f, indent=1)
    print(f"\nwrote {png} and cluster.json")


if __name__ == "__main__":
    main()
