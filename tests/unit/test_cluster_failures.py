"""A host that fails under a synchronous job (issue 27, part 4): on 3 simulated hosts (scripts/cluster.sh),
python -m pydist.run trains with the all-reduce strategy, one rank per host; mid-epoch the ranks of host
pdh3 are SIGKILLed and pdh3 drops off the network. The launcher names the rank and its host, finds that
pdh3 no longer answers, and restarts the job from the newest checkpoint on the two hosts left
(--min-ranks 2): the run ends with exit status 0, at the step a 2-rank run from that checkpoint ends at,
having recomputed at most --checkpoint-every steps.

The order is that of a host that dies: its ranks die, the job ends (mpiexec hears of the death from the
host's hydra proxy within a second), and the host is gone by the time the launcher asks. The launcher is
paused (SIGSTOP) from just before the kill until its mpiexec has ended and the link is down, so the probe
always meets the dead link, however busy the machine. Taking the link down in the same instant as the kill
instead leaves mpiexec waiting for the proxy's word until MPIEXEC_TIMEOUT (300 s measured with the default
timeout; the launcher then goes on exactly as here).

Needs root and network namespaces, as test_cluster.py, whose helpers these are; skipped the same way
("NOT RUN (several hosts)"). One cluster of its own, brought up after test_cluster.py's is down (pytest
runs the modules one after the other and ends a module's fixtures before the next module starts).
"""
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

import pytest

from pydist.engine import Trainer, mlp
from pydist.run import read_progress
from test_cluster import ENV, PMI_RACE, REASON, cluster, cluster_to_ourselves, leftovers

pytestmark = pytest.mark.skipif(REASON is not None, reason=f"NOT RUN (several hosts): {REASON}")

HOSTS = 3
EVERY = 20            # --checkpoint-every
ASYNC_EVERY = 100     # --checkpoint-every of the asynchronous case
BATCH = 32            # per rank: 625 steps an epoch at 3 ranks, about 75 a second here
EXAMPLES = 60000      # Fashion-MNIST's training set
TRAIN = ["-m", "pydist.train", "--model", "mlp", "--hidden", "64", "--batch-size", str(BATCH), "--strategy",
         "allreduce", "--epochs", "1", "--checkpoint", "run.ckpt", "--resume-if-present",
         "--checkpoint-every", str(EVERY),
         "--no-progress", "--metrics", "", "--plot", ""]


@pytest.fixture(scope="module")
def hosts():
    with cluster_to_ourselves():
        cluster("down")
        cluster("up", str(HOSTS))
        yield HOSTS
        cluster("link", "pdh3", "up", check=False)
        cluster("down")
        assert leftovers() == []


def ranks_in(host):
    """The pids of the training processes in `host` (not their watchers, `pydist.run --watch`)."""
    out = subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True).stdout.split()
    pids = []
    for pid in out:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"pydist.train" in argv and b"--watch" not in argv:
            pids.append(int(pid))
    return pids


def children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def ended(pid):
    """Whether process `pid` has exited (a zombie its parent has not reaped yet, or gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


def wait_for(what, condition, timeout):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.02)


def start(cmd, cwd):
    """The launcher in a session of its own, its output read as it comes (never a full pipe)."""
    launcher = subprocess.Popen(cmd, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(launcher.stdout), daemon=True)
    reader.start()
    return launcher, lines, reader


def stop(launcher):
    """A launcher still running after a failed test: its whole session goes (cluster.sh, mpiexec, ranks)."""
    if launcher.poll() is None:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=30)


def test_the_mpiexec_line_starts_jobs_and_a_host_whose_link_is_down_does_not_answer(hosts):
    line = shlex.split(cluster("mpiexec").stdout)
    assert line[:2] == ["env", "MPIEXEC_TIMEOUT=300"] and "-launcher-exec" in line, line

    def probe(host, timeout):   # as python -m pydist.run probes a host
        try:
            return subprocess.run([*line, "-hosts", host, "-n", "1", "hostname"], env=ENV, capture_output=True,
                                  text=True, timeout=timeout).stdout.strip()
        except subprocess.TimeoutExpired:
            return None

    assert probe("pdh2", 30) == "pdh2"
    cluster("link", "pdh2", "down")
    try:
        assert re.search(r"^\s+pdh2\s.*, link down$", cluster("status").stdout, re.M)
        # hydra's proxy cannot connect back ("No route to host") and mpiexec waits for it regardless
        assert probe("pdh2", 5) is None
    finally:
        cluster("link", "pdh2", "up")
    assert "link down" not in cluster("status").stdout
    assert probe("pdh2", 30) == "pdh2"
    for args, message in ((("link", "pdh4", "down"), "not a host of this cluster"), (("link", "pdh1"), "usage"),
                          (("mpiexec", "--timeout", "0"), "--timeout")):
        proc = cluster(*args, check=False)
        assert proc.returncode != 0 and message in proc.stderr, (args, proc.stderr)


def test_a_host_whose_ranks_die_is_dropped_and_the_job_finishes_on_the_others(hosts, tmp_path):
    mpiexec = cluster("mpiexec", "--timeout", "120").stdout.strip()   # hydra's hang guard, per attempt
    cmd = [sys.executable, "-m", "pydist.run", "-n", "3", "--hosts", "pdh1,pdh2,pdh3", "--min-ranks", "2",
           "--max-restarts", "2", "--probe-timeout", "5", "--mpiexec", mpiexec, "--run-dir", str(tmp_path / "run"),
           "--", *TRAIN]
    started = time.monotonic()
    launcher, lines, reader = start(cmd, tmp_path)
    timings = {}
    try:
        # past step 200's checkpoint, in the middle of the next --checkpoint-every steps
        wait_for("step 210 of the first attempt", lambda: read_progress(tmp_path / "run").get("step", 0) >= 210
                 or launcher.poll() is not None, 120)
        assert launcher.poll() is None, "".join(lines)
        [job] = children(launcher.pid)   # mpiexec (`env` execs it)
        with open(f"/proc/{job}/cmdline", "rb") as f:
            assert b"mpiexec" in f.read().split(b"\0")[0], f"pid {job} is not mpiexec"
        os.kill(launcher.pid, signal.SIGSTOP)
        try:
            victims = ranks_in("pdh3")
            assert len(victims) == 1, victims   # round robin: rank 2
            killed = time.monotonic()
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            wait_for("mpiexec ending after the kill", lambda: ended(job), 60)
            timings["kill to mpiexec's end"] = time.monotonic() - killed
            cluster("link", "pdh3", "down")
        finally:
            os.kill(launcher.pid, signal.SIGCONT)
        launcher.wait(timeout=300)
        reader.join(timeout=10)
    finally:
        stop(launcher)
        cluster("link", "pdh3", "up", check=False)
    timings["whole run"] = time.monotonic() - started
    out = "".join(lines)
    print(f"timings: {', '.join(f'{k} {v:.2f} s' for k, v in timings.items())}\n{out}")
    assert launcher.returncode == 0, out

    # named: the rank, its host, how it died
    assert re.search(r"rank 2 \(host pdh3, pid \d+\) was killed by signal 9 \(SIGKILL\)", out), out
    lost = re.search(r"reached step (\d+); its newest checkpoint is step (\d+) .*: (\d+) step\(s\) lost", out)
    assert lost, out
    at, ckpt, n = (int(g) for g in lost.groups())
    # rank 0 reports a checkpoint once it is written, before its next step: step 210 seen, 200's is there
    assert ckpt % EVERY == 0 and ckpt >= 200 and 0 <= n == at - ckpt <= EVERY, out
    # the healthy hosts answer; pdh3 does not, and the job goes on without it
    assert "host pdh1 does not answer" not in out and "host pdh2 does not answer" not in out, out
    assert "host pdh3 does not answer: dropping it" in out, out
    assert "going on at 2 rank(s) (was 3)" in out and "restarting 2 rank(s) on pdh1:1,pdh2:1 (attempt 2)" in out, out
    assert (f"resumed from run.ckpt at epoch 0, step {ckpt} (example {ckpt * 3 * BATCH} of epoch 1's order; saved "
            f"at 3 rank(s), a global batch of {3 * BATCH}; now 2, {2 * BATCH})") in out, out
    restarts = 1
    if "(attempt 3)" in out:
        # the 2-rank run ended in test_cluster.py's finalize guard/hydra race, after its last checkpoint: the
        # launcher ran it once more, from that checkpoint, which has nothing left to do
        second = out.split("(attempt 2)", 1)[1].split("(attempt 3)", 1)[0]
        assert any(s in second for s in PMI_RACE) or "mpiexec exited with status 141" in second, out
        restarts = 2
    assert f"finished: 2 rank(s), {restarts} restart(s), {n} step(s) recomputed" in out, out

    # the checkpoint: the end of the epoch, reached at 2 ranks from where the 3-rank run stopped
    final = ckpt + (EXAMPLES - ckpt * 3 * BATCH) // (2 * BATCH)
    t = Trainer(mlp((64,)), batch_size=BATCH).load(tmp_path / "run.ckpt")
    assert (t.epoch, t.step) == (1, final), (t.epoch, t.step, final)
    assert (t.resumed_from["world_size"], t.resumed_from["global_batch"]) == (2, 2 * BATCH), t.resumed_from


def test_an_asynchronous_job_whose_hosts_ranks_die_finishes_on_the_others(hosts, tmp_path):
    """--survive (part 3) across hosts: downpour with 4 workers, two on pdh1 and two on pdh2, and its
    server on pdh3. Both ranks of pdh2 are SIGKILLed mid-chunk; the job ends nothing, trains the chunk's
    batches on the workers left and finishes at 3 ranks with exit status 0."""
    mpiexec = cluster("mpiexec", "--timeout", "120").stdout.strip()
    # downpour, and chunks of 100 steps (over a second here): long enough that the kill lands inside one
    train = [*TRAIN[:TRAIN.index("--strategy") + 1], "downpour", *TRAIN[TRAIN.index("--strategy") + 2:]]
    train[train.index("--checkpoint-every") + 1] = str(ASYNC_EVERY)
    cmd = [sys.executable, "-m", "pydist.run", "-n", "5", "--survive", "--hosts", "pdh1:2,pdh2:2,pdh3:1",
           "--max-restarts", "0", "--mpiexec", mpiexec, "--run-dir", str(tmp_path / "run"), "--", *train]
    launcher, lines, reader = start(cmd, tmp_path)
    try:
        # a checkpoint written: the next chunk of training has begun (a death between chunks restarts)
        wait_for("the first checkpoint", lambda: (read_progress(tmp_path / "run").get("checkpoint_step") or 0)
                 >= ASYNC_EVERY or launcher.poll() is not None, 120)
        assert launcher.poll() is None, "".join(lines)
        victims = ranks_in("pdh2")
        assert len(victims) == 2, victims   # ranks 2 and 3, workers
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        launcher.wait(timeout=300)
        reader.join(timeout=10)
    finally:
        stop(launcher)
    out = "".join(lines)
    assert launcher.returncode == 0, out
    for rank in (2, 3):
        assert re.search(rf"rank {rank} \(host pdh2, pid \d+\) was killed by signal 9 \(SIGKILL\).*the job carried on "
                         rf"without it", out), out
    trained = re.findall(r"(\d+) of the chunk's (\d+) batches were trained", out)
    assert trained and all(a == b for a, b in trained), out
    assert re.search(r"training goes on with 2 workers \(ranks 0, 1, 4\)", out), out
    assert "finished: 3 of 5 rank(s) to the end, 0 restart(s)" in out, out
    t = Trainer(mlp((64,)), batch_size=BATCH).load(tmp_path / "run.ckpt", strict=False)   # (an asynchronous strategy saved it)
    assert t.epoch == 1 and (t.resumed_from["world_size"], t.resumed_from["global_batch"]) == (3, 2 * BATCH), out
