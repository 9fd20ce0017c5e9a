"""python -m pydist.train as a user runs it: under mpiexec with 2 ranks, its metrics file, curves and
checkpoint; and one clear error for missing data."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, PYTHONPATH=ROOT, UCX_ERROR_SIGNALS="", MPIEXEC_TIMEOUT="120")


def run(args, cwd, ranks=2):
    cmd = ["mpiexec.mpich", "-n", str(ranks), sys.executable, "-m", "pydist.train"] + args
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

    # --resume with more epochs continues from epoch 2 and appends
    proc = run(["--model", "mlp", "--hidden", "64", "--epochs", "3", "--batch-size", "100",
                "--checkpoint", "mlp.ckpt", "--resume", "--metrics", "m.jsonl", "--plot", ""], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resumed from mlp.ckpt at epoch 2" in proc.stdout
    assert [json.loads(line)["epoch"] for line in (tmp_path / "m.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_missing_data_is_one_clear_error(tmp_path):
    proc = run(["--data", str(tmp_path / "nowhere"), "--epochs", "1"], tmp_path, ranks=1)
    assert proc.returncode != 0
    assert "dataset-fashion-mnist" in proc.stderr and "nowhere" in proc.stderr, proc.stderr
