"""python -m pydist.train as a user runs it: under mpiexec with 2 ranks, its metrics file, curves and
checkpoint; its progress bar (tqdm) and its curves (matplotlib); and one clear error for missing data."""
import json
import os
import re
import subprocess
import sys

import numpy as np
from matplotlib.colors import to_hex

from pydist.engine import Trainer, mlp
from pydist.train import SERIES, figure, read_metrics
from unit_helpers import MPIEXEC, fit_resumed_at_step_7

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, PYTHONPATH=ROOT, UCX_ERROR_SIGNALS="", MPIEXEC_TIMEOUT="120")


def run(args, cwd, ranks=2):
    cmd = [MPIEXEC, "-n", str(ranks), sys.executable, "-m", "pydist.train"] + args
    return subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=150)


def test_two_ranks_train_and_report(tmp_path):
    proc = run(["--model", "mlp", "--hidden", "64", "--epochs", "2", "--batch-size", "100",
                "--checkpoint", "mlp.ckpt", "--metrics", "m.jsonl", "--plot", "curves.png"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2]                      # rank 0 alone writes
    for r in records:
        assert r["world_size"] == 2 and r["batch_per_rank"] == 100
        assert r["samples_per_s"] > 0 and r["t_comp_ms"] > 0 and r["t_sync_ms"] >= 0
    assert records[1]["train_loss"] < records[0]["train_loss"]
    assert records[1]["test_accuracy"] > 0.8                             # an MLP on Fashion-MNIST
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "mlp.ckpt.done").exists()                   # the checkpoint vouches for itself
    assert proc.stdout.count("epoch 2: train loss") == 1, proc.stdout   # one line, from rank 0
    # The progress bar (tqdm, on stderr) shows real losses only: never a frame with loss=nan.
    assert "loss=" in proc.stderr and "nan" not in proc.stderr, proc.stderr

    # --resume with more epochs continues from epoch 2 and appends
    proc = run(["--model", "mlp", "--hidden", "64", "--epochs", "3", "--batch-size", "100",
                "--checkpoint", "mlp.ckpt", "--resume", "--metrics", "m.jsonl", "--plot", ""], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resumed from mlp.ckpt at epoch 2" in proc.stdout
    assert "nan" not in proc.stderr, proc.stderr
    assert [json.loads(line)["epoch"] for line in (tmp_path / "m.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_a_checkpoint_is_never_lost_without_being_told(tmp_path):
    """--resume of a mistyped path is an error (it used to start afresh and, at its first checkpoint,
    write over nothing the user meant); a fresh run refuses to replace an existing checkpoint unless
    --overwrite says so; --resume-if-present starts afresh without one and resumes with one. Each refusal
    comes before anything is written, one message from rank 0, exit status 2 (a usage error)."""
    base = ["--model", "mlp", "--hidden", "16", "--batch-size", "500", "--metrics", "", "--plot", "", "--no-progress"]
    proc = run(base + ["--epochs", "1", "--checkpoint", "typo.ckpt", "--resume"], tmp_path)
    assert proc.returncode == 2 and not (tmp_path / "typo.ckpt").exists(), proc.stdout + proc.stderr
    assert proc.stderr.count("error: --resume: there is no checkpoint at typo.ckpt (on rank 0)") == 1, proc.stderr
    proc = run(base + ["--epochs", "1", "--checkpoint", "run.ckpt", "--resume-if-present"], tmp_path)
    assert proc.returncode == 0 and "resumed" not in proc.stdout, proc.stdout + proc.stderr
    written = (tmp_path / "run.ckpt").read_bytes()
    proc = run(base + ["--epochs", "1", "--checkpoint", "run.ckpt"], tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("error: run.ckpt exists (on rank 0): --resume continues from it, --overwrite") == 1
    assert (tmp_path / "run.ckpt").read_bytes() == written   # untouched
    proc = run(base + ["--epochs", "2", "--checkpoint", "run.ckpt", "--resume-if-present"], tmp_path)
    assert proc.returncode == 0 and "resumed from run.ckpt at epoch 1" in proc.stdout, proc.stdout + proc.stderr
    proc = run(base + ["--epochs", "1", "--checkpoint", "run.ckpt", "--overwrite"], tmp_path)
    assert proc.returncode == 0 and "resumed" not in proc.stdout, proc.stdout + proc.stderr
    proc = run(base + ["--epochs", "1", "--checkpoint", "run.ckpt", "--overwrite", "--resume"], tmp_path, ranks=1)
    assert proc.returncode == 2 and "exclude each other" in proc.stderr, proc.stderr
    # a checkpoint of another strategy or model: one message naming both, exit status 2, the file kept
    written = (tmp_path / "run.ckpt").read_bytes()
    for other, said in ((["--strategy", "ring"], "saved by strategy allreduce (model mlp-16); this trainer's "
                                                  "strategy is ring (model mlp-16)"),
                        (["--hidden", "17"], "saved from a different model (model mlp-16, ")):
        proc = run(base + ["--epochs", "2", "--checkpoint", "run.ckpt", "--resume"] + other, tmp_path)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.count("python -m pydist.train: error: cannot resume: ") == 1, proc.stderr
        assert said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert (tmp_path / "run.ckpt").read_bytes() == written


def test_a_misspelt_compression_is_a_usage_error(tmp_path):
    """--compression is checked with the other arguments, by the compressor's own parser: a usage error
    (exit status 2) naming what exists, not a traceback from inside the Trainer."""
    for spec, said in (("fp8", "unknown compression 'fp8' (none, fp16, bf16, topk:R, sign, powersgd:K)"),
                       ("topk:2", "compression 'topk:R' needs 0 < R <= 1")):
        proc = run(["--compression", spec, "--epochs", "1"], tmp_path)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"python -m pydist.train: error: --compression: {said}" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr


def test_missing_data_is_one_clear_error(tmp_path):
    """No data folder, or a file that is not IDX: one line from rank 0 (not a traceback per rank), exit
    status 2 on every rank (a retry cannot help)."""
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "train-images-idx3-ubyte").write_bytes(b"\0\0")
    for folder, said in (("nowhere", "no data folder {}: install Debian's dataset-fashion-mnist"),
                         ("bad", "{}/train-images-idx3-ubyte is too short for an IDX header")):
        proc = run(["--data", str(tmp_path / folder), "--epochs", "1"], tmp_path)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        line = f"python -m pydist.train: error: {said.format(tmp_path / folder)}"
        assert proc.stderr.count(line) == 1 and "Traceback" not in proc.stderr, proc.stderr
    # rank 1 alone lacks it (a relative --data from another folder, as on a host without the data set):
    # every rank leaves alike before training, rather than rank 0 waiting in its first collective
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "data").symlink_to("/usr/share/datasets/fashion-mnist")
    train = [sys.executable, "-m", "pydist.train", "--data", "data", "--epochs", "1"]
    proc = subprocess.run([MPIEXEC, "-n", "1", "-wdir", str(tmp_path / "a"), *train, ":", "-n", "1", "-wdir",
                           str(tmp_path / "b"), *train], env=ENV, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("python -m pydist.train: error: no data folder data: install") == 1, proc.stderr
    assert proc.stderr.rstrip().endswith("MNIST (on rank 1)") and "Traceback" not in proc.stderr, proc.stderr


def frames(err):
    """tqdm's frames in what it wrote: each starts with a carriage return; blank ones clear the line."""
    return [f.strip() for f in err.split("\r") if f.strip()]


def test_progress_bar_starts_at_a_resumed_step_and_shows_only_real_losses(capsys):
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((640, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, 640).astype(np.int32)
    fit_resumed_at_step_7(Trainer(mlp((32,)), batch_size=32, seed=1), x, y)
    err = capsys.readouterr().err
    assert "nan" not in err, err
    shown = frames(err)
    # The first frame is drawn before any step has run: at the resumed step, with no loss yet.
    assert shown[0].startswith("epoch 2/2:") and "7/20" in shown[0] and "loss=" not in shown[0], shown
    # Then a frame per chunk of 3 steps, each with the loss of the steps just run.
    assert [re.search(r"(\d+)/20", f).group(1) for f in shown[1:]] == ["10", "13", "16", "19", "20"], shown
    assert all(re.search(r"loss=\d+\.\d{4}", f) for f in shown[1:]), shown


def history(epochs, test=True):
    rows = [{"epoch": e, "train_loss": 1 / e, "train_accuracy": 1 - 0.3 / e} for e in range(1, epochs + 1)]
    if test:
        for r in rows:
            r.update(test_loss=1.1 / r["epoch"], test_accuracy=1 - 0.35 / r["epoch"])
    return rows


def visible_xticks(ax):
    lo, hi = ax.get_xlim()
    return [t for t in ax.get_xticks() if lo <= t <= hi]


def test_curves_keep_one_colour_per_series_and_whole_epoch_ticks():
    for epochs in (1, 2, 3, 5, 12, 40):
        fig = figure(history(epochs))
        assert len(fig.axes) == 2
        for ax in fig.axes:
            colours = {line.get_label(): to_hex(line.get_color()) for line in ax.get_lines()}
            assert colours == {name: to_hex(c) for name, c in SERIES.items()}, (epochs, ax.get_title(), colours)
            ticks = visible_xticks(ax)
            assert ticks and all(float(t).is_integer() for t in ticks), (epochs, ticks)
            if epochs <= 5:                                  # few epochs: a tick at each, no other
                assert ticks == list(range(1, epochs + 1)), (epochs, ticks)
            lo, hi = ax.get_xlim()
            assert lo < 1 and hi > epochs, (epochs, ax.get_xlim())   # every point in view
    train_only = figure(history(3, test=False))
    for ax in train_only.axes:
        assert [(line.get_label(), to_hex(line.get_color())) for line in ax.get_lines()] == \
            [("train", to_hex(SERIES["train"]))]


def test_read_metrics_gives_one_record_per_epoch_in_order(tmp_path):
    rows = history(3)
    again = dict(rows[1], train_loss=0.123)            # epoch 2 written again (a resume from epoch 1)
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows + [again]))
    got = read_metrics(tmp_path / "m.jsonl")
    assert [r["epoch"] for r in got] == [1, 2, 3] and got[1]["train_loss"] == 0.123
