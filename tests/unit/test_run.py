"""python -m pydist.run, the elastic launcher, as a user runs it (issue 27, part 2): a rank SIGKILLed in
the middle of an epoch costs at most --checkpoint-every steps and the run ends with the weights of an
uninterrupted run, bit for bit; a rank that keeps failing is left out and the job goes on at fewer
ranks, down to --min-ranks; the failed rank's exit status comes through when the launcher gives up;
Ctrl-C ends every rank and says in one line what it kept."""
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

TRAIN = ["-m", "pydist.train", "--model", "mlp", "--hidden", "64", "--epochs", "2", "--batch-size", "32",
         "--checkpoint", "run.ckpt", "--resume-if-present",
         "--checkpoint-every", "20", "--no-progress", "--metrics", "",
         "--plot", ""]
ENV = subprocess_env(MPIEXEC_TIMEOUT="240")


def launch(args, cwd, program, **popen):
    return launch_run(args, cwd, program, ENV, **popen)


def step_reached(cwd):
    return read_progress(cwd / "run").get("step", 0)


def test_sigkill_mid_epoch_restarts_from_the_checkpoint_and_ends_as_an_uninterrupted_run(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    straight.mkdir(), killed.mkdir()
    proc = launch(["-n", "3"], straight, TRAIN)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert "finished: 3 rank(s), 0 restart(s)" in out, out

    proc = launch(["-n", "3", "--max-restarts", "2"], killed, TRAIN)
    steps_per_epoch = 60000 // (3 * 32)                  # 625: kill between steps 200 and 625 of epoch 1
    deadline = time.monotonic() + 120
    while step_reached(killed) < 200 and time.monotonic() < deadline:
        time.sleep(0.02)
    reached = step_reached(killed)
    assert 200 <= reached < steps_per_epoch, f"step {reached}"
    pid = int((killed / "run" / "attempt-0" / "rank-1.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert re.search(r"rank 1 \(host \S+, pid \d+\) was killed by signal 9 \(SIGKILL\)", out), out
    lost = re.search(r"reached step (\d+); its newest checkpoint is step (\d+) .*: (\d+) step\(s\) lost", out)
    assert lost, out
    at, ckpt, n = (int(g) for g in lost.groups())
    # rank 0 reports each step as it reaches it, the checkpoint once written: it may still have been
    # writing step 200's when step 200 was seen
    assert ckpt % 20 == 0 and ckpt >= 180 and 0 <= n == at - ckpt <= 20, out   # at most --checkpoint-every
    assert f"resumed from run.ckpt at epoch 0, step {ckpt} (example {ckpt * 96} of epoch 1's order)" in out, out
    assert "finished: 3 rank(s), 1 restart(s)" in out, out
    # Same ranks, same order, the same steps recomputed from the same state: the same bits
    assert (killed / "run.ckpt").read_bytes() == (straight / "run.ckpt").read_bytes()


FLAKY = textwrap.dedent("""
    # Trainer.fit with its own checkpoint; rank 2 fails at the first two starts, as a bad node would.
    import os, sys
    import pydist as dist
    from pydist.engine import Trainer, mlp, load_fashion_mnist

    dist.init_process_group()
    if dist.get_rank() == 2 and int(os.environ["PYDIST_RESTART"]) < 2:
        raise RuntimeError("the GPU fell off the bus")
    (x, y), test = load_fashion_mnist()
    t = Trainer(mlp((32,)), batch_size=64, seed=1)
    if os.path.exists("flaky.ckpt"):
        t.load("flaky.ckpt")
    t.fit(x[:6000], y[:6000], epochs=2, checkpoint="flaky.ckpt", checkpoint_every=10, progress=False)
    if dist.get_rank() == 0:
        print(f"done at {dist.get_world_size()} ranks, step {t.step}", flush=True)
    dist.destroy_process_group()
""")


def test_a_rank_that_keeps_failing_is_left_out_down_to_min_ranks(tmp_path):
    (tmp_path / "flaky.py").write_text(FLAKY)
    proc = launch(["-n", "3", "--min-ranks", "2", "--max-restarts", "3"], tmp_path, ["flaky.py"])
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert out.count("rank 2 (host") == 2 and "the GPU fell off the bus" in out, out
    assert "rank 2 failed twice running on host" in out and "going on at 2 rank(s) (was 3)" in out, out
    assert "done at 2 ranks" in out and "finished: 2 rank(s), 2 restart(s)" in out, out


def test_the_failed_ranks_status_comes_through_when_the_launcher_gives_up(tmp_path):
    (tmp_path / "fails.py").write_text(textwrap.dedent("""
        import sys
        import pydist as dist
        dist.init_process_group()
        dist.barrier()
        if dist.get_rank() == 1:
            sys.exit(7)
        dist.barrier()
    """))
    proc = launch(["-n", "2", "--max-restarts", "1"], tmp_path, ["-m", "pydist", "fails.py"])
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 7, out
    assert out.count("rank 1 (host") == 2 and "exited with status 7" in out, out
    assert "giving up after 1 restart(s) (--max-restarts 1); exit status 7" in out, out


def test_arguments_are_checked(tmp_path):
    for args, message in ((["-n", "2", "--min-ranks", "3"], "--min-ranks"), (["-n", "2", "--hosts", "a:0"], "a:0"),
                          (["-n", "3", "--hosts", "a:1,b:1"], "2 slots for 3 ranks")):
        proc = launch(args, tmp_path, ["x.py"])
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 2 and message in out, out


def test_help_and_a_missing_program():
    """--help prints the options and exits 0 with or without `--` (the docs' command-line reference runs
    it); no `--` at all is a usage error (2) that says where the program goes."""
    for argv in (["--help"], ["--help", "--"]):
        proc = subprocess.run([sys.executable, "-m", "pydist.run", *argv], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and "--max-restarts" in proc.stdout, proc.stdout + proc.stderr
    proc = subprocess.run([sys.executable, "-m", "pydist.run", "-n", "2"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "the program to run goes after `--`" in proc.stderr, proc.stderr


def test_a_rank_that_ucx_ended_for_its_dead_peer_is_not_blamed(tmp_path):
    """UCX's cross-memory attach aborts a rank reading from a peer that has just died; its watcher may
    record its end a millisecond before the dead peer's. The launcher still names the peer."""
    import json
    from pydist.run import first_failure
    records = [{"rank": 1, "status": 137, "signal": 9, "ended": 10.002, "pid": 5},
               {"rank": 2, "status": 134, "signal": 6, "ended": 10.001, "pid": 6, "dead_peer_pid": 5},
               {"rank": 0, "status": 0, "signal": None, "ended": 12.0, "pid": 4}]
    for rec in records:
        (tmp_path / f"rank-{rec['rank']}.json").write_text(json.dumps(rec))
    assert first_failure(tmp_path, 3)["rank"] == 1
    (tmp_path / "rank-1.json").unlink()   # only the consequence recorded: it is all there is to say
    assert first_failure(tmp_path, 3)["rank"] == 2


def test_a_rank_that_mpi_failed_for_its_killed_peer_is_not_blamed(tmp_path):
    """A server SIGKILLed under --survive: MPI failed a worker's call ("Invalid communicator") and its
    record's end came 2 ms before the killed server's watcher woke to record the death (a soak run named
    the worker). A signal death that soon after a communication error is its cause; one 0.2 s later (a
    rank the launcher killed after another aborted) is not."""
    import json
    from pydist.run import first_failure
    error = "DistBackendError: the training step's communication failed: Other MPI error, error stack:"
    records = [{"rank": 2, "status": 1, "signal": None, "ended": 32.391, "pid": 6, "last_line": error},
               {"rank": 3, "status": 137, "signal": 9, "ended": 32.393, "pid": 7, "last_line": ""},
               {"rank": 0, "status": 1, "signal": None, "ended": 34.469, "pid": 4, "last_line": "DistError: x"}]
    for rec in records:
        (tmp_path / f"rank-{rec['rank']}.json").write_text(json.dumps(rec))
    assert first_failure(tmp_path, 4)["rank"] == 3
    records[1]["ended"] = 32.6   # killed after rank 2 aborted the job: rank 2 is the cause
    (tmp_path / "rank-3.json").write_text(json.dumps(records[1]))
    assert first_failure(tmp_path, 4)["rank"] == 2
    records[0]["last_line"] = "ValueError: a bad argument"   # not a communication error: the first end stands
    (tmp_path / "rank-2.json").write_text(json.dumps(dict(records[0], rank=2, ended=32.391)))
    records[1]["ended"] = 32.393
    (tmp_path / "rank-3.json").write_text(json.dumps(records[1]))
    assert first_failure(tmp_path, 4)["rank"] == 2


def _alive(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"python" in f.read()
    except OSError:
        return False


@pytest.mark.parametrize("how", ["launcher", "terminal"])
def test_ctrl_c_ends_every_rank_and_says_what_it_kept(tmp_path, how):
    """SIGINT to the launcher alone (kill -INT), or to its whole process group as a terminal's Ctrl-C
    sends it: every rank ends, the launcher prints one line naming the checkpoint and the records it
    kept, no traceback of its own, exit status 130. (It used to end in a raw KeyboardInterrupt
    traceback.)"""
    proc = launch(["-n", "2"], tmp_path, [*TRAIN, "--epochs", "20"], start_new_session=True)   # (the last --epochs)
    deadline = time.monotonic() + 120
    while (read_progress(tmp_path / "run").get("checkpoint_step") or 0) < 20 and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.02)
    pids = [int((tmp_path / "run" / "attempt-0" / f"rank-{r}.pid").read_text().split()[0]) for r in range(2)]
    if how == "launcher":
        proc.send_signal(signal.SIGINT)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    said = [line for line in out.splitlines() if line.startswith("pydist.run: ")]
    assert said[-1].startswith("pydist.run: interrupted: every rank ended; kept the newest checkpoint, step "), out
    assert f"(" + str(tmp_path / "run.ckpt") + f"), and the ranks' records in {tmp_path / 'run'}" in said[-1], out
    assert said[:-1] == ["pydist.run: starting 2 rank(s) on this machine"], out   # nothing else of its own
    assert not any(line.startswith("Traceback") for line in out.splitlines()), out   # (ranks' are [rankN]:)
    time.sleep(0.5)
    assert not any(_alive(pid) for pid in pids), out
    step = int(re.search(r"kept the newest checkpoint, step (\d+)", said[-1]).group(1))
    check = subprocess.run([sys.executable, "-c", "from pydist.engine import Trainer, mlp; "
                            f"print(Trainer(mlp((64,)), batch_size=32).load({str(tmp_path / 'run.ckpt')!r}).step)"],
                           env=ENV, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and int(check.stdout) >= step, check.stdout + check.stderr
