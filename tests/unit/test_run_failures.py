"""The elastic launcher's failure handling (issue 41): never a hang, a verdict from this launch's records
only, run folders that exist on every host and go away after a clean finish, and a resume that reads the
checkpoint once. Each test here failed before its fix (the issue's review found each case at 2 ranks)."""
import errno
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

from pydist import run
from unit_helpers import launch_run, subprocess_env

ENV = subprocess_env(MPIEXEC_TIMEOUT="240")
BOUND = 180   # a hang guard: each job here ends in well under a minute on a quiet machine


def script(tmp_path, body, name="job.py"):
    """A rank's program: `body` after MPI is up (rank, world, dist, np and os in scope)."""
    path = tmp_path / name
    path.write_text("import os, signal, sys, time\nimport numpy as np\nimport pydist as dist\n"
                    "dist.init_process_group()\nrank, world = dist.get_rank(), dist.get_world_size()\n" +
                    textwrap.dedent(body))
    return str(path)


def launch(args, tmp_path, program, env=ENV):
    proc = launch_run(args, tmp_path, program, env)
    try:
        out, _ = proc.communicate(timeout=BOUND)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"the launcher did not end within {BOUND} s (a hang):\n{out}")
    return proc.returncode, out


# --- hangs: under --survive, a rank that dies outside any collective --------------------------------------

def test_survive_a_rank_dead_after_the_last_collective_leaves_no_survivor_waiting(tmp_path):
    # Before: the survivors waited forever in the exit barrier (no deadline, and no record read there).
    job = script(tmp_path, """
        x = np.ones(8)
        dist.all_reduce(x)
        if rank == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.5)
        print(f"rank {rank} done", flush=True)
    """)
    began = time.monotonic()
    rc, out = launch(["-n", "3", "--survive", "--max-restarts", "0"], tmp_path, [job])
    # no training went on without it (no Trainer said so): a failure of the job, which ends at once
    assert rc == 128 + 9, out
    assert re.search(r"rank 2 \(host \S+, pid \d+\) was killed by signal 9 \(SIGKILL\)", out), out
    assert "training did not go on without rank 2" in out and "carried on without it" not in out, out
    assert "rank 0 done" in out and "rank 1 done" in out, out
    assert "rank 2 ended without reaching exit" in out, out   # why the survivors skipped MPI_Finalize
    assert time.monotonic() - began < 60, out


def test_survive_a_rank_dead_between_two_collectives_fails_the_next_one_and_ends(tmp_path):
    job = script(tmp_path, """
        x = np.ones(8)
        dist.all_reduce(x)
        if rank == 1:
            os._exit(7)
        time.sleep(0.5)
        dist.all_reduce(x)   # needs rank 1: a departure error, then an exit that must not wait for it
    """)
    rc, out = launch(["-n", "2", "--survive", "--max-restarts", "0"], tmp_path, [job])
    assert rc == 7, out
    assert re.search(r"rank 1 \(host \S+, pid \d+\) exited with status 7", out), out
    assert "giving up after 0 restart(s)" in out, out


def test_survive_rank_0_failing_outside_training_fails_the_job(tmp_path):
    # Before: "aborting the job (MPI_Abort)", then "the job carried on without it", and exit status 0.
    job = script(tmp_path, """
        from pydist.engine import Trainer, mlp
        rng = np.random.default_rng(0)
        x = rng.random((1536, 1, 28, 28), dtype=np.float32)
        y = rng.integers(0, 10, 1536).astype(np.int32)
        t = Trainer(mlp(hidden=(16,)), batch_size=16, strategy="dynsgd")
        t.fit(x, y, epochs=1, progress=False)
        if rank == 0:
            raise RuntimeError("the report could not be written")
        print(f"rank {rank} done", flush=True)
    """)
    rc, out = launch(["-n", "3", "--survive", "--max-restarts", "0"], tmp_path, [job])
    assert rc == 1, out
    assert "[rank0]: RuntimeError: the report could not be written" in out, out
    assert "ending this rank alone" in out and "aborting the job" not in out, out
    assert re.search(r"rank 0 \(host \S+, pid \d+\) exited with status 1: RuntimeError: the report could not be "
                     r"written", out), out
    assert "training did not go on without rank 0" in out and "giving up after 0 restart(s)" in out, out
    assert "carried on without it" not in out and "finished" not in out.replace("unfinished", ""), out


# --- wrong verdicts --------------------------------------------------------------------------------------

TWO_FITS = """
    from pydist.engine import Trainer, mlp
    rng = np.random.default_rng(0)
    x = rng.random((4096, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, 4096).astype(np.int32)
    trainer = Trainer(mlp(hidden=(32,)), batch_size=16)
    trainer.fit(x, y, epochs=1, progress=False)
    if rank == 1:   # lost in the second fit()
        import threading
        threading.Timer(0.3, lambda: os._exit(3)).start()
    trainer.fit(x, y, epochs=400, progress=False)
"""


def test_a_rank_lost_in_a_second_fit_is_a_failure_not_a_finish(tmp_path):
    # Before: the first fit()'s "finished" report was never cleared: "finished", status 0, no restart.
    rc, out = launch(["-n", "2", "--survive", "--max-restarts", "0"], tmp_path, [script(tmp_path, TWO_FITS)])
    assert rc == 3, out
    assert re.search(r"rank 1 \(host \S+, pid \d+\) exited with status 3", out), out
    assert "finished" not in out.replace("unfinished", ""), out


def mpiexec_that_fails_after(tmp_path):
    """A launcher that runs the job with the real mpiexec and then exits 1 whatever the job did: what hydra
    does under --survive when a rank's PMI connection closes (no MPI_Finalize there) after it was reaped."""
    from pydist import _libraries
    wrapper = tmp_path / "mpiexec-then-1"
    wrapper.write_text(f'#!/bin/sh\n{_libraries.mpiexec()} "$@"\nexit 1\n')
    wrapper.chmod(0o755)
    return str(wrapper)


@pytest.mark.parametrize("survive", [False, True])
def test_every_rank_ending_cleanly_is_a_finish_whatever_mpiexec_says(tmp_path, survive):
    # Before: "mpiexec exited with status 1 and no rank recorded why", a restart of finished work (0 steps
    # lost), and with no restarts left, exit status 1 (2 runs in 388 of the fault-injection soak).
    job = script(tmp_path, """
        x = np.full(4, rank + 1.0)
        dist.all_reduce(x)
        print(f"rank {rank} sum {x[0]:g}", flush=True)
    """)
    args = ["-n", "2", "--max-restarts", "1", "--mpiexec", mpiexec_that_fails_after(tmp_path)]
    rc, out = launch(args + (["--survive"] if survive else []), tmp_path, [job])
    assert rc == 0, out
    assert "rank 0 sum 3" in out and "rank 1 sum 3" in out, out
    assert "every rank ended with status 0 and mpiexec exited with status 1 all the same" in out, out
    assert ("without MPI_Finalize" in out) is survive, out
    assert "finished: 2 rank(s), 0 restart(s)" in out and "restart 1" not in out, out
    assert "no rank recorded why" not in out, out


def test_mpiexec_failing_before_every_rank_recorded_its_end_is_still_a_failure(tmp_path):
    # The finish above needs every rank's record: one rank's clean end alone says nothing of the other's.
    job = script(tmp_path, """
        if rank == 1:
            os.kill(os.getppid(), 9)   # its watcher: no record of rank 1's end is written
            time.sleep(30)
    """)
    rc, out = launch(["-n", "2", "--max-restarts", "0", "--mpiexec", mpiexec_that_fails_after(tmp_path)],
                     tmp_path, [job])
    assert rc != 0, out
    assert "finished" not in out.replace("unfinished", ""), out


def test_a_reused_run_dir_does_not_feed_the_last_launch_records_to_this_one(tmp_path):
    failing = script(tmp_path, "dist.barrier()\nif rank == 1:\n    sys.exit(5)\n", "failing.py")
    rc, out = launch(["-n", "2", "--max-restarts", "0"], tmp_path, [failing])
    assert rc == 5 and "kept in" in out, out
    assert (tmp_path / "run" / "attempt-0" / "rank-1.json").exists()
    # Before: this healthy job read rank 1's old record: under --survive its ranks were told rank 1 had
    # exited, and the launcher blamed it.
    healthy = script(tmp_path, """
        x = np.ones(4)
        for _ in range(20):
            dist.all_reduce(x)
            time.sleep(0.05)
        print(f"rank {rank} sum {x[0]:.0f}", flush=True)
    """, "healthy.py")
    rc, out = launch(["-n", "2", "--survive", "--max-restarts", "0"], tmp_path, [healthy])
    assert rc == 0, out
    assert re.search(r"finished: 2 rank\(s\), 0 restart\(s\)", out), out
    assert "rank 1 sum 1048576" in out and "exited" not in out, out
    assert not (tmp_path / "run" / "attempt-0").exists()   # a clean finish clears the records


def test_a_run_dir_in_use_by_a_live_launcher_is_refused(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    run.write_json(str(folder / run.LAUNCHER_MARK), {"host": os.uname().nodename, "pid": os.getpid()})
    rc, out = launch(["-n", "1"], tmp_path, [script(tmp_path, "pass\n")])
    assert rc != 0 and f"in use by the launcher with pid {os.getpid()}" in out, out


# --- run folders --------------------------------------------------------------------------------------------

def test_the_temporary_run_folder_goes_after_success_and_stays_named_after_a_failure(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(ENV, TMPDIR=str(tmp))
    cmd = [sys.executable, "-m", "pydist.run", "-n", "2", "--max-restarts", "0", "--"]
    ok = subprocess.run([*cmd, script(tmp_path, "dist.barrier()\n")], env=env, capture_output=True, text=True,
                        timeout=BOUND)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert list(tmp.iterdir()) == []   # before: a pydist-run-* folder after every launch
    bad = subprocess.run([*cmd, script(tmp_path, "dist.barrier()\nsys.exit(rank * 4)\n", "bad.py")], env=env,
                         capture_output=True, text=True, timeout=BOUND)
    assert bad.returncode == 4, bad.stdout + bad.stderr
    kept = re.search(r"the ranks' records are kept in (\S+)", bad.stdout)
    assert kept and os.path.isdir(kept.group(1)) and os.path.dirname(kept.group(1)) == str(tmp), bad.stdout
    assert run.read_record(os.path.join(kept.group(1), "attempt-0"), 1)["status"] == 4


def test_a_watcher_on_a_host_without_the_run_folder_makes_it_and_cleans_up(tmp_path):
    # A host of --hosts that does not share the launcher's /tmp: before, its watcher crashed at once.
    attempt = tmp_path / "elsewhere" / "attempt-0"
    cmd = [sys.executable, "-m", "pydist.run", "--watch", str(attempt), "--"]
    ok = subprocess.run([*cmd, sys.executable, "-c", "print('ran')"], env=ENV, capture_output=True, text=True,
                        timeout=60)
    assert ok.returncode == 0 and ok.stdout == "ran\n", ok.stdout + ok.stderr
    assert not (tmp_path / "elsewhere").exists()   # nobody else reads this host's records after a success
    bad = subprocess.run([*cmd, sys.executable, "-c", "raise SystemExit(6)"], env=ENV, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 6 and f"rank 0's record is kept in {os.uname().nodename}:{attempt}" in bad.stderr
    assert run.read_record(str(attempt), 0)["status"] == 6


# --- several hosts: resume reads the checkpoint once --------------------------------------------------------

def test_resume_where_only_rank_0_has_the_checkpoint(tmp_path):
    from pydist import _libraries
    train = [sys.executable, "-m", "pydist.train", "--model", "mlp", "--hidden", "16", "--batch-size", "128",
             "--checkpoint", "run.ckpt", "--resume-if-present", "--no-progress", "--metrics", "", "--plot", ""]
    a, b = tmp_path / "host-a", tmp_path / "host-b"   # each rank's own disk: the relative path differs
    a.mkdir()
    b.mkdir()
    first = subprocess.run([*train, "--epochs", "1"], cwd=a, env=ENV, capture_output=True, text=True, timeout=BOUND)
    assert first.returncode == 0 and (a / "run.ckpt").exists(), first.stdout + first.stderr
    mpiexec = _libraries.mpiexec()
    both = subprocess.run([mpiexec, "-n", "1", "-wdir", str(a), *train, "--epochs", "2", ":",
                           "-n", "1", "-wdir", str(b), *train, "--epochs", "2"],
                          env=ENV, capture_output=True, text=True, timeout=BOUND)
    # Before: rank 1 found no file and started from scratch while rank 0 resumed: mismatched collectives.
    assert both.returncode == 0, both.stdout + both.stderr
    assert "resumed from run.ckpt at epoch 1" in both.stdout, both.stdout
    assert (a / "run.ckpt").exists() and not (b / "run.ckpt").exists()


# --- files: what the launcher writes never follows a planted link ------------------------------------------

def test_reports_and_records_never_write_through_a_planted_link(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / run.PROGRESS).symlink_to(victim)
    for name in (f".{run.PROGRESS}.{os.getpid()}", f"{run.PROGRESS}.{os.getpid()}"):   # old temporary names
        (tmp_path / name).symlink_to(victim)
    monkeypatch.setenv("PYDIST_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("PYDIST_RESTART", "0")
    run.report(step=3)
    assert victim.read_text() == "precious"
    assert not os.path.islink(tmp_path / run.PROGRESS) and run.read_progress(str(tmp_path))["step"] == 3


@pytest.mark.parametrize("text", ["", "{", "[]", '{"step": "7"}', '{"step": -1}', '{"step": true}',
                                  '{"step": 1e400}', '{"step": NaN}', '{"checkpoint_step": 4}', "x" * 100])
def test_a_malformed_progress_report_is_no_report(tmp_path, text):
    (tmp_path / run.PROGRESS).write_text(text)
    assert "step" not in run.read_progress(str(tmp_path))
    assert "checkpoint_step" not in run.read_progress(str(tmp_path))


def test_metrics_and_curves_never_write_through_a_planted_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "metrics.jsonl").symlink_to(victim)
    (tmp_path / "curves.png").symlink_to(victim)
    from pydist.train import plot
    assert plot([{"epoch": 1, "train_loss": 1.0, "train_accuracy": 0.5}], str(tmp_path / "curves.png"))
    assert victim.read_text() == "precious" and not os.path.islink(tmp_path / "curves.png")
    from pydist.engine import Trainer, mlp
    import numpy as np
    trainer = Trainer(mlp(hidden=(8,)), batch_size=16)
    x, y = np.zeros((32, 784), np.float32), np.zeros(32, np.int32)
    with pytest.raises(OSError) as err:   # ELOOP: the name is a link
        trainer.fit(x, y, epochs=1, metrics=str(tmp_path / "metrics.jsonl"), progress=False)
    assert err.value.errno == errno.ELOOP and victim.read_text() == "precious"


# --- a rank that never arrives -------------------------------------------------------------------------------

def test_survive_a_rank_that_never_arrives_is_ended_once_it_is_alone(tmp_path):
    # Before: the others timed out and left; hydra (-disable-auto-cleanup) waited for the stuck rank for ever.
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent("""
        import time
        import numpy as np
        import pydist as dist
        dist.init_process_group(timeout=3)
        x = np.ones(4)
        dist.all_reduce(x)
        if dist.get_rank() == 1:
            time.sleep(1000)   # never arrives at the next collective
        dist.all_reduce(x)
    """))
    rc, out = launch(["-n", "3", "--survive", "--max-restarts", "0"], tmp_path, [str(job)])
    assert "rank(s) 1 still running" in out and "ending the attempt" in out, out
    assert re.search(r"rank 1 \(host \S+, pid \d+\) never arrived \(it was still running after every other rank "
                     r"had ended\): the launcher ended it", out), out
    assert rc == 137, out


def test_a_rank_that_never_reaches_init_ends_the_attempt_at_the_timeout(tmp_path):
    # Before: MPI_Init waited for it with no deadline: every launch hung.
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent("""
        import os, time
        import pydist as dist
        if os.environ["PMI_RANK"] == "1":
            time.sleep(1000)
        dist.init_process_group(timeout=4)
    """))
    rc, out = launch(["-n", "2", "--max-restarts", "0"], tmp_path, [str(job)])
    assert re.search(r"rank\(s\) 1 never began init_process_group, \d+ s after the first rank did \(its timeout 4 s\)",
                     out), out
    assert re.search(r"rank 1 \(host \S+, pid \d+\) never arrived \(it never began init_process_group\): the "
                     r"launcher ended it", out) and rc == 137, out
