"""Asynchronous training that carries on without a dead worker (issue 27, part 3), as a user runs it:
python -m pydist.run --survive. A worker SIGKILLed mid-chunk, or one that raises, ends nothing: its
server notices within 2 s, its unfinished block is trained by the others (every batch of the chunk
once), the job finishes at fewer ranks with exit status 0 and a checkpoint of the smaller world. A
server's death, or a rank's in a synchronous strategy, is restarted from the checkpoint instead."""
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from pydist.run import read_progress
from unit_helpers import launch_run, subprocess_env

ENV = subprocess_env(MPIEXEC_TIMEOUT="240")
# A chunk of --checkpoint-every steps must outlast the time the test takes to see a checkpoint and kill
# (a death between chunks is restarted, not survived): 200 steps of this MLP at 3 workers take about
# 0.55 s on a quiet machine, 50 steps of a 64-wide one only 40 ms, which a busy CI machine overran.
HIDDEN, EVERY = 256, 200
TRAIN = ["-m", "pydist.train", "--model", "mlp", "--hidden", str(HIDDEN), "--epochs", "1", "--batch-size", "32",
         "--checkpoint", "run.ckpt", "--resume-if-present",
         "--checkpoint-every", str(EVERY), "--no-progress", "--metrics", "",
         "--plot", ""]


def launch(args, cwd, program):
    return launch_run(args, cwd, program, ENV)


def kill_mid_chunk(cwd, proc, rank):
    """SIGKILL world rank `rank` as soon as the first checkpoint (step EVERY) is written: the next chunk
    of training has begun. (A rank that dies between chunks, in an evaluation or a
    checkpoint, ends the job and is restarted: README "When a rank dies".)"""
    deadline = time.monotonic() + 120
    while (read_progress(cwd / "run").get("checkpoint_step") or 0) < EVERY and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.01)
    pid = int((cwd / "run" / "attempt-0" / f"rank-{rank}.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)


def saved_layout(path):
    """(world size, global batch, step) the checkpoint was written at, read back by a Trainer."""
    code = textwrap.dedent(f"""
        from pydist.engine import Trainer, mlp
        t = Trainer(mlp(hidden=({HIDDEN},)), batch_size=32)
        t.load({str(path)!r}, strict=False)   # (an asynchronous strategy saved it: its weights)
        print(t.resumed_from["world_size"], t.resumed_from["global_batch"], t.step)
    """)
    out = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return tuple(int(v) for v in out.stdout.split())


def check_carried_on(out, dead_rank):
    assert re.search(rf"rank {dead_rank} \(host \S+, pid \d+\) was killed by signal 9 \(SIGKILL\).*the job carried "
                     rf"on without it", out), out
    noticed = re.search(rf"worker rank {dead_rank} died; its server noticed, ([\d.]+) s after it ended", out)
    assert noticed and float(noticed.group(1)) < 2.0, out
    trained = re.search(r"(\d+) of the chunk's (\d+) batches were trained", out)
    assert trained and trained.group(1) == trained.group(2), out   # the dead worker's block redone
    assert re.search(r"finished: 3 of 4 rank\(s\) to the end, 0 restart\(s\)", out), out


@pytest.mark.parametrize("strategy, dead", [("downpour", 1), ("aeasgd", 0)])
def test_a_worker_killed_mid_chunk_ends_nothing(tmp_path, strategy, dead):
    proc = launch(["-n", "4", "--survive", "--max-restarts", "0"], tmp_path, [*TRAIN, "--strategy", strategy])
    kill_mid_chunk(tmp_path, proc, dead)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    check_carried_on(out, dead)
    went_on = re.search(r"training goes on with 2 workers \(ranks [\d, ]+\) from example (\d+) of epoch 1", out)
    assert went_on, out
    sample = int(went_on.group(1))   # where the chunk the kill fell in ended, at 3 workers x 32
    world, batch, step = saved_layout(tmp_path / "run.ckpt")
    # the rest of the epoch's 60000 examples at 2 workers x 32
    assert sample % 96 == 0 and (world, batch) == (3, 64) and step == sample // 96 + (60000 - sample) // 64, out
    summary = re.search(r'"final_test_accuracy": ([\d.]+)', out)
    # trained, not reset: chance is 0.1; one epoch of downpour at 3 workers ends anywhere in 0.45-0.85
    # uninterrupted (asynchronous, with momentum), aeasgd near 0.85
    assert summary and float(summary.group(1)) > 0.3, out


def test_a_worker_that_raises_ends_nothing(tmp_path):
    script = tmp_path / "raises.py"
    script.write_text(textwrap.dedent("""
        import pydist as dist
        from pydist.engine import Trainer, mlp, load_fashion_mnist
        dist.init_process_group()
        (x, y), test = load_fashion_mnist()
        t = Trainer(mlp(hidden=(64,)), batch_size=32, strategy="dynsgd", servers=2)
        def on_epoch(record):
            if dist.get_rank() == 1 and record["epoch"] == 1:
                raise RuntimeError("worker 1 gives up")
        t.fit(x[:12000], y[:12000], epochs=2, on_epoch=on_epoch, progress=False)
        if t.rank == 0:
            print("workers at the end:", t.workers, "history:", [r["world_size"] for r in t.history])
    """))
    proc = launch(["-n", "5", "--survive", "--max-restarts", "0"], tmp_path, [str(script)])
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    assert "RuntimeError: worker 1 gives up" in out, out
    assert re.search(r"rank 1 \(host \S+, pid \d+\) exited with status 1.*the job carried on without it", out), out
    assert "workers at the end: 2 history: [5, 4]" in out, out


@pytest.mark.parametrize("strategy, ranks, dead", [("adag", 4, 3), ("allreduce", 3, 1)])
def test_a_dead_server_or_a_synchronous_rank_is_restarted_from_the_checkpoint(tmp_path, strategy, ranks, dead):
    """What --survive cannot carry on without: adag's server (rank 3), any rank of allreduce."""
    proc = launch(["-n", str(ranks), "--survive", "--max-restarts", "1"], tmp_path, [*TRAIN, "--strategy", strategy])
    kill_mid_chunk(tmp_path, proc, dead)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    assert re.search(rf"rank {dead} \(host \S+, pid \d+\) was killed by signal 9 \(SIGKILL\)", out), out
    assert "restart 1 of at most 1, from" in out and f"finished: {ranks} rank(s), 1 restart(s)" in out, out
    assert saved_layout(tmp_path / "run.ckpt")[:2] == (ranks, 96)   # 3 workers x 32 either way


def test_survive_is_for_the_asynchronous_strategies():
    from pydist.engine import Trainer, mlp
    with pytest.raises(ValueError, match="asynchronous strategies"):
        Trainer(mlp(hidden=(8,)), strategy="allreduce", survive=True)
