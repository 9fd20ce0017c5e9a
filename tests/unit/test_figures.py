"""The docs' pictures are legible at the column's width: pydist.figures measures what a figure draws, and
every benchmark's figure, drawn from made-up results of the shape its runs save, has no text under
figures.MIN_PAGE_PX on the page, none cut off at the edge and none drawn over other text."""
import os
import random
import sys
import types

import pytest

pytest.importorskip("matplotlib")
from matplotlib.figure import Figure  # noqa: E402

from pydist import _figures as figures  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def column_figure(height=3.0):
    fig = Figure(figsize=(figures.WIDTH_IN, height), layout="constrained")
    ax = fig.subplots()
    ax.plot([1, 2, 3], [3, 1, 2], label="a line")
    ax.set(title="a title", xlabel="x", ylabel="y")
    ax.legend()
    return fig


def test_a_plain_column_figure_has_no_problems():
    assert figures.problems(column_figure()) == []


def test_small_text_is_found_with_its_size_on_the_page():
    fig = column_figure()
    fig.axes[0].tick_params(labelsize=6)   # 6 pt: 8.3 px at the column
    found = figures.problems(fig)
    assert found and all(line.endswith("px on the page (at least 11)") for line in found), found
    assert "'2.00': 8.3 px on the page (at least 11)" in found, found


def test_a_wide_picture_is_shrunk_to_the_column():
    """The same 10 pt text in a picture twice as wide: half the size on the page."""
    fig = Figure(figsize=(2 * figures.WIDTH_IN, 3))
    fig.text(0.5, 0.5, "ten points", fontsize=10)
    assert figures.problems(fig) == ["'ten points': 6.9 px on the page (at least 11)"]


def test_text_past_the_edge_is_cut_off():
    fig = column_figure()
    fig.text(0.98, 0.5, "a label that runs off the right edge")
    assert figures.problems(fig) == ["'a label that runs off the right edge': cut off at the picture's edge"]


def test_save_records_the_smallest_text_for_the_page(tmp_path):
    fig = column_figure()
    fig.axes[0].tick_params(labelsize=9)
    figures.save(fig, tmp_path / "a.png")
    # 9 pt at 200 dpi is 25 px in the PNG, 2 x the column's width: 12.5 px on the page
    assert figures.page_px(tmp_path / "a.png") == pytest.approx(9 / 72 * 200 / 2, abs=0.05)
    assert figures.recorded_problems(tmp_path / "a.png") == []
    fig.savefig(tmp_path / "b.png")
    assert figures.page_px(tmp_path / "b.png") is None   # not saved by save(): nothing recorded
    assert figures.recorded_problems(tmp_path / "b.png") is None


def test_text_over_other_text_is_found_and_recorded(tmp_path):
    fig = column_figure()
    fig.text(0.5, 0.5, "one label")
    fig.text(0.52, 0.5, "another label")
    expected = ["'one label' and 'another label': drawn over each other"]
    assert figures.problems(fig) == expected
    assert figures.save(fig, tmp_path / "a.png") == expected
    assert figures.recorded_problems(tmp_path / "a.png") == expected


def test_a_log_axis_spanning_less_than_a_decade_labels_minor_ticks_over_each_other():
    """What the check is for: matplotlib's default labels on a log axis from 0.2 to 0.9 s."""
    fig = Figure(figsize=(figures.WIDTH_IN / 2, 3), layout="constrained")
    ax = fig.subplots()
    ax.plot([0.2, 0.9], [1, 2])
    ax.set_xscale("log")
    assert any(line.endswith("drawn over each other") for line in figures.problems(fig))


# ---------------------------------------------------------------------------------------------------
# Each benchmark's figure, from made-up results

def curve(rng, points=9):
    return [(0.0, 0, 0.1)] + [(i * 1.7, i * 100, 0.7 + 0.02 * i + rng.random() * 0.01) for i in range(1, points)]


def test_strategies_figures():
    import strategies
    rng = random.Random(0)
    results = {(s, w): {"curve": curve(rng), "world_size": w + 1} for w in (2, 3, 4) for s in strategies.DATA_PARALLEL}
    for scenario in (("normal", None, None), ("straggler", 1, 20)):
        assert figures.problems(strategies.figure(scenario, results, [2, 3, 4])) == []
    args = types.SimpleNamespace(sweep_workers=[2, 4], sweep_strategies=["downpour", "adag"],
                                 sweep_windows=[1, 5, 10, 25], epochs=2, lr=0.02, momentum=0.9)
    sweep = {(s, w, win): {"final_test_accuracy": 0.86 - win / 100} for s in args.sweep_strategies
             for w in args.sweep_workers for win in args.sweep_windows}
    assert figures.problems(strategies.window_figure(sweep, args)) == []


def pipeline_run(P, M, model="mlp"):
    """A run of P stages and M micro-batches: every stage's forwards, backwards and update."""
    ranks, fwd, bwd = [], 0.004, 0.008
    for p in range(P):
        trace, t = [], p * fwd
        for m in range(M):
            trace.append((0, m, t, t + fwd))
            t += fwd
        t += (P - 1 - p) * 2 * bwd
        for m in range(M):
            trace.append((1, m, t, t + bwd))
            t += bwd
        trace.append((2, -1, t, t + 0.01))
        ranks.append({"replica": 0, "stage": p, "trace": trace, "peak_slots": M, "busy_ms": 10.0, "idle_ms": 5.0})
    return {"stages": P, "micro_batches": M, "model": model, "ranks": ranks}


def test_pipeline_figures():
    import pipeline
    args = types.SimpleNamespace(models=["lenet5", "mlp"], schedules=["gpipe", "1f1b"], stages=[2, 4],
                                 micro_batches=[1, 2, 4, 8], hidden=[1024] * 8, batch_size=64)
    title = "mlp-1024x8: the last measured step, P = 2 stages, M = 4 micro-batches of 16, oversubscribed (4 ranks on 2 cores)"
    runs = [(s, pipeline_run(2, 4)) for s in args.schedules]
    assert figures.problems(pipeline.timeline_figure(runs, title)) == []
    results = {(mo, P, s, M): pipeline_run(P, M, mo) for mo in args.models for P in args.stages
               for s in args.schedules for M in args.micro_batches}
    assert figures.problems(pipeline.bubble_figure(results, args)) == []


def test_compression_cluster_figure():
    import compression_cluster
    args = types.SimpleNamespace(hosts=[2, 3], rates=["1gbit", "100mbit"], models=["mlp", "lenet5"],
                                 strategies=["allreduce", "downpour"], target=0.85,
                                 compressors=["none", "fp16", "bf16", "topk:0.01", "sign", "powersgd:4"])
    rng = random.Random(1)
    rows = [{"hosts": h, "rate": rate, "model": m, "strategy": s, "compression": c,
             "points": [(t, a) for t, _, a in curve(rng)]}
            for h in args.hosts for rate in args.rates for m in args.models for s in args.strategies
            for c in args.compressors if not (h == 2 and s == "downpour")]
    assert figures.problems(compression_cluster.figure(args, rows)) == []
    for r in rows:   # every panel's time axis within one decade, as LeNet-5's at 1 Gbit/s was
        r["points"] = [(0.2 + t / 30, a) for t, a in r["points"]]
    assert figures.problems(compression_cluster.figure(args, rows)) == []


def test_cluster_model_figure():
    import cluster_model
    rates = ["100mbit", "300mbit", "1gbit", "3gbit", "10gbit"]
    batches = [16, 32, 64, 128, 256]
    measured = {rate: [0.2 * (i + 1) for i in range(len(batches))] for rate in rates}
    fig = cluster_model.figure(batches, [0.002 * b / 16 for b in batches], rates, (0.17e-3, 0.92, 6.3e9),
                               246824, 2, measured)
    assert figures.problems(fig) == []
