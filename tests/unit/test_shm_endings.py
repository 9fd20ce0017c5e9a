"""Nothing is left in /dev/shm however a job ends, at the moment it can hurt (issue 25, item 5).

Each case runs its own job under mpiexec and ends it one way: normally, by MPI_Abort (an exception on
one rank), SIGTERM to mpiexec, SIGKILL of one rank, `timeout` while one rank still computes, a rank
raising before its first collective. The moments: inside the set-up of init's session segment
(segment 0), inside the set-up of the world's channel (segment 1), and while collectives run. The
set-up windows are hit on purpose: PYDIST_TEST_SEGMENT_PAUSE makes one rank stop there, once it
has mapped the segment and before the ranks confirm it (where a named segment still has its name),
and say so on stderr; the test acts on that line.

Other developers run jobs on this machine at the same time, so /dev/shm is compared only for this
job's names: pydist's named segments are /dev/shm/pydist-<pid namespace>-<creator's pid>-<n>, and every rank writes
its pid to a file before it imports pydist. With memfd segments there is no name at all; the
tests also read a live rank's /proc/<pid>/maps to see that the memfd is what it maps.
"""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from unit_helpers import MPIEXEC, popen_kwargs

HARD_S = 120      # MPIEXEC_TIMEOUT: a hang guard only
NS = os.stat("/proc/self/ns/pid").st_ino   # the jobs' pid namespace (this one's), in their segments' names

PRELUDE = """
import os, sys, threading, time
import numpy as np
OUT = os.environ["JOB_OUT"]
RANK = int(os.environ["PMI_RANK"])
with open(os.path.join(OUT, f"pid{RANK}"), "w") as f:
    f.write(str(os.getpid()))
# JOB_PAUSE=<rank>:<segment>: that rank pauses inside that segment's set-up
if os.environ.get("JOB_PAUSE", ":").split(":")[0] == str(RANK):
    os.environ["PYDIST_TEST_SEGMENT_PAUSE"] = os.environ["JOB_PAUSE"].split(":")[1] + ":300"   # the ending ends it
import pydist as dist
from pydist import _C

def report(msg):
    with open(os.path.join(OUT, f"rank{RANK}.txt"), "a") as f:
        f.write(msg + chr(10))

def abort_when_told():
    # MPI_Abort from this rank when the test creates OUT/abort: what pydist's exception hook ends an
    # uncaught exception with. A thread, because the main thread is inside the set-up's wait (in C).
    while not os.path.exists(os.path.join(OUT, "abort")):
        time.sleep(0.01)
    report("ABORTING")
    _C.abort(1)

if RANK == 1 and os.environ.get("JOB_ABORTER"):
    threading.Thread(target=abort_when_told, daemon=True).start()
"""

# init (segment 0: the session's), the world's first collective (segment 1: its channel, made there
# or at init), then collectives until the job is ended; rank 1 computes between them when told to.
JOB = """
dist.init_process_group()
x = np.full(4, RANK + 1.0)
dist.all_reduce(x, op=dist.ReduceOp.MAX)
y = dist.empty(1 << 16)
y[:] = RANK + 1.0
dist.all_reduce(y, op=dist.ReduceOp.MAX)
report(f"COLLECTIVES {x[0]} {y[0]}")
if RANK == 1 and os.environ.get("JOB_COMPUTE"):
    while True:   # still computing when the job is ended; rank 0 waits in its next all_reduce
        sum(range(1000))
while True:
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    dist.all_reduce(y, op=dist.ReduceOp.MAX)
"""


class Job:
    """One mpiexec job, its output read line by line as it comes (the pause lines)."""

    def __init__(self, tmp_path, n, body, prefix=(), **env):
        self.out, self.n = tmp_path, n
        script = tmp_path / "job.py"
        script.write_text(PRELUDE + textwrap.dedent(body))
        self.lines, self.started = [], time.monotonic()
        self.proc = subprocess.Popen(
            [*prefix, MPIEXEC, "-n", str(n), sys.executable, str(script)], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
            **popen_kwargs(JOB_OUT=str(tmp_path), MPIEXEC_TIMEOUT=str(HARD_S), **env))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self):
        return "\n".join(self.lines)

    def wait_for(self, text, timeout=90):
        """The first output line containing text (or the rank's report file line, for reports)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hit = [l for l in self.lines if text in l]
            if hit:
                return hit[0]
            assert self.proc.poll() is None, f"the job ended before {text!r}:\n{self.output()}"
            time.sleep(0.02)
        raise AssertionError(f"no {text!r} within {timeout} s:\n{self.output()}")

    def wait_report(self, rank, text, timeout=90):
        deadline, path = time.monotonic() + timeout, self.out / f"rank{rank}.txt"
        while time.monotonic() < deadline:
            if path.exists() and text in path.read_text():
                return
            assert self.proc.poll() is None, f"the job ended before rank {rank} said {text!r}:\n{self.output()}"
            time.sleep(0.02)
        raise AssertionError(f"rank {rank} did not say {text!r} within {timeout} s:\n{self.output()}")

    def pids(self):
        return [int((self.out / f"pid{r}").read_text()) for r in range(self.n)]

    def finish(self, timeout=60):
        """Wait for mpiexec and for every rank to be gone (a rank's memory is freed only then)."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the job did not end within {timeout} s:\n{self.output()}")
        self.reader.join(10)
        pids = self.pids()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.05)
        assert not any(alive(p) for p in pids), (pids, self.output())
        return rc

    def kill(self):
        """Cleanup after a failed case: our own job only (its process group, then its ranks by pid)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        for r in range(self.n):
            path = self.out / f"pid{r}"
            if path.exists() and alive(int(path.read_text())):
                os.kill(int(path.read_text()), signal.SIGKILL)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:   # a zombie is dead: its mappings are gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def named_segments(pids):
    """This job's names in /dev/shm."""
    return sorted(n for n in os.listdir("/dev/shm") if any(n.startswith(f"pydist-{NS}-{p}-") for p in pids))


def shared_mappings(pid):
    """The inodes a live process maps from memfds and from /dev/shm's pydist names."""
    memfd, named = set(), set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and fields[5].startswith("/memfd:pydist"):
                memfd.add(fields[4])
            elif len(fields) >= 6 and fields[5].startswith("/dev/shm/pydist-"):
                named.add(fields[4])
    return memfd, named


def assert_memfd_mapped(job, at_least):
    """Every rank maps at least `at_least` pydist memfds (the paused segment included) and no named one
    (a rank may still be opening the paused segment: give it a moment)."""
    for pid in job.pids():
        deadline = time.monotonic() + 20
        while True:
            memfd, named = shared_mappings(pid)
            if len(memfd) >= at_least or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(memfd) >= at_least and not named, (pid, memfd, named, job.output())


@pytest.fixture
def jobs():
    started = []
    yield lambda *a, **kw: started.append(Job(*a, **kw)) or started[-1]
    for job in started:
        job.kill()


MOMENTS = {"init": 0, "channel": 1, "collectives": None}   # the segment whose set-up is paused


def reach(job, moment, rank):
    """Wait until the job is at the moment; check its ranks map memfds, not names."""
    if MOMENTS[moment] is None:
        job.wait_report(0, "COLLECTIVES")
        job.wait_report(1, "COLLECTIVES")
        assert_memfd_mapped(job, 2)
    else:
        line = job.wait_for(f"pydist-test: paused in segment set-up {MOMENTS[moment]} (rank {rank},")
        assert "memfd" in line, line
        assert_memfd_mapped(job, MOMENTS[moment] + 1)


def pause_env(moment, rank):
    return {} if MOMENTS[moment] is None else {"JOB_PAUSE": f"{rank}:{MOMENTS[moment]}"}


@pytest.mark.parametrize("moment", MOMENTS)
def test_mpi_abort_leaves_nothing(tmp_path, jobs, moment):
    """Rank 0 (the creator) paused in the set-up; rank 1 calls MPI_Abort meanwhile."""
    job = jobs(tmp_path, 2, JOB, JOB_ABORTER="1", **pause_env(moment, 0))
    reach(job, moment, 0)
    (tmp_path / "abort").touch()
    assert job.finish() != 0
    assert (tmp_path / "rank1.txt").read_text().splitlines()[-1] == "ABORTING", job.output()
    assert named_segments(job.pids()) == []


@pytest.mark.parametrize("moment", MOMENTS)
def test_sigterm_to_mpiexec_leaves_nothing(tmp_path, jobs, moment):
    job = jobs(tmp_path, 2, JOB, **pause_env(moment, 0))
    reach(job, moment, 0)
    job.proc.send_signal(signal.SIGTERM)
    job.finish()   # its status is 15, or sometimes 0 (hydra's race): the ranks' being gone is the point
    assert named_segments(job.pids()) == []


@pytest.mark.parametrize("moment", MOMENTS)
def test_sigkill_of_a_rank_leaves_nothing(tmp_path, jobs, moment):
    """SIGKILL of rank 0, the rank that made the segment (nothing of ours runs on its way out)."""
    job = jobs(tmp_path, 2, JOB, **pause_env(moment, 0))
    reach(job, moment, 0)
    os.kill(job.pids()[0], signal.SIGKILL)
    assert job.finish() != 0
    assert named_segments(job.pids()) == []


@pytest.mark.parametrize("moment", MOMENTS)
def test_timeout_while_a_rank_computes_leaves_nothing(tmp_path, jobs, moment):
    """`timeout 12 mpiexec ...`: rank 1 is still busy (paused in the set-up, or computing between
    collectives) and rank 0 waits for it when `timeout` ends the job."""
    job = jobs(tmp_path, 2, JOB, prefix=("timeout", "12"), JOB_COMPUTE="1", **pause_env(moment, 1))
    reach(job, moment, 1)
    assert job.finish() == 124, job.output()   # 124: timeout ended it
    assert time.monotonic() - job.started >= 12
    assert named_segments(job.pids()) == []


def test_normal_exit_leaves_nothing_and_empty_arrays_outlive_the_session(tmp_path, jobs):
    """The whole life of a job: init, collectives on the world and on a new group (three segments,
    all memfds), dist.empty arrays that outlive destroy_process_group, a second session, exit."""
    job = jobs(tmp_path, 2, """
        dist.init_process_group()
        x = dist.empty(1 << 16)
        x[:] = RANK + 1.0
        dist.all_reduce(x)                       # in place, in the session segment
        assert _C.shm_info()["calls_in_place"] == 1, _C.shm_info()
        g = dist.new_group([0, 1])
        s = np.full(3, RANK + 1.0)
        dist.all_reduce(s, group=g)              # through the group's channel
        report(f"MAPPED {RANK}")
        while not os.path.exists(os.path.join(OUT, "go")):
            time.sleep(0.01)
        dist.destroy_process_group()
        x += 1.0                                 # still memory of ours after the session is gone
        report(f"AFTER {x[0]} {x[-1]} {s[0]}")
        dist.init_process_group()
        z = x.copy()
        dist.all_reduce(x)                       # an ordinary array to the new session
        report(f"SECOND {x[0]} {np.array_equal(x, 2 * z)}")
        dist.destroy_process_group()
    """)
    job.wait_report(0, "MAPPED")
    job.wait_report(1, "MAPPED")
    assert_memfd_mapped(job, 3)   # the session segment and two channels
    (tmp_path / "go").touch()
    assert job.finish() == 0, job.output()
    for r in range(2):
        lines = (tmp_path / f"rank{r}.txt").read_text().splitlines()
        assert lines[1:] == ["AFTER 4.0 4.0 3.0", "SECOND 8.0 True"], lines
    assert named_segments(job.pids()) == []


@pytest.mark.parametrize("group", ["world", "new_group"])
def test_rank_raising_before_its_first_collective_leaves_nothing(tmp_path, jobs, group):
    """The issue's case: rank 1 raises before the group's first collective while rank 0 is in it (its
    channel was made there), through pydist's exception hook (MPI_Abort)."""
    job = jobs(tmp_path, 2, f"""
        dist.init_process_group()
        g = dist.new_group([0, 1]) if {group == "new_group"} else None
        if RANK == 1:
            time.sleep(0.5)
            raise RuntimeError("before the first collective")
        dist.all_reduce(np.ones(4), group=g)
    """)
    assert job.finish() != 0
    assert "[rank1]: RuntimeError: before the first collective" in job.output(), job.output()
    assert "MPI_Abort" in job.output()
    assert named_segments(job.pids()) == []


# ---------------------------------------------------------------------------------------------------
# The named fallback (no memfd_create, or /proc hidden)

def test_hidden_proc_falls_back_to_named_segments(tmp_path, jobs):
    """The other ranks cannot open rank 0's memfd through /proc: every rank takes the named path (3
    ranks: two that fail, one that did not), the collectives are right, and the names are gone."""
    job = jobs(tmp_path, 3, """
        dist.init_process_group()
        x = dist.empty(1 << 16)
        x[:] = RANK + 1.0
        dist.all_reduce(x)
        s = np.full(3, RANK + 1.0)
        dist.all_reduce(s)
        assert _C.shm_info()["segment"] and _C.shm_info()["calls_in_place"] == 1, _C.shm_info()
        maps = [l.split()[5] for l in open("/proc/self/maps") if " /dev/shm/pydist-" in l or " /memfd:pydist" in l]
        report(f"{x[0]} {s[0]} {sorted(set(maps))}")
        dist.destroy_process_group()
    """, PYDIST_TEST_SEGMENT_FALLBACK="proc")
    assert job.finish() == 0, job.output()
    pid0 = job.pids()[0]
    for r in range(3):
        line = (tmp_path / f"rank{r}.txt").read_text().strip()
        assert line == f"6.0 6.0 ['/dev/shm/pydist-{NS}-{pid0}-0', '/dev/shm/pydist-{NS}-{pid0}-1']", line
    assert named_segments(job.pids()) == []


def test_named_leftover_of_a_killed_job_is_swept_by_the_next(tmp_path, jobs):
    """Without memfd_create, a job killed inside a set-up leaves its name (this is the window memfd
    closes: the test can see a leak); the next job's init removes it, and leaves alone a name whose
    process is alive, and names it cannot prove dead: another pid namespace's (a container sharing
    /dev/shm, where the same pid is another process) and the older form without a namespace."""
    (tmp_path / "first").mkdir()
    first = jobs(tmp_path / "first", 2, JOB, PYDIST_TEST_SEGMENT_FALLBACK="memfd", JOB_PAUSE="0:1")
    line = first.wait_for("pydist-test: paused in segment set-up 1 (rank 0,")
    assert "named" in line, line
    pid0 = first.pids()[0]
    assert named_segments([pid0]) == [f"pydist-{NS}-{pid0}-1"]
    os.kill(pid0, signal.SIGKILL)
    assert first.finish() != 0
    assert named_segments(first.pids()) == [f"pydist-{NS}-{pid0}-1"]   # the named path's leak

    live = f"/dev/shm/pydist-{NS}-{os.getpid()}-999"   # a name whose process (this one) is alive
    unprovable = [f"/dev/shm/pydist-{NS + 1}-{pid0}-7", f"/dev/shm/pydist-{pid0}-7"]   # dead here, maybe not there
    for name in [live, *unprovable]:
        open(name, "w").close()
    try:
        (tmp_path / "second").mkdir()
        second = jobs(tmp_path / "second", 2, """
            dist.init_process_group()
            x = np.ones(4)
            dist.all_reduce(x)
            report(f"{x[0]}")
        """)
        assert second.finish() == 0, second.output()
        assert named_segments([pid0]) == []
        assert os.path.exists(live) and all(os.path.exists(n) for n in unprovable)
    finally:
        for name in [live, *unprovable]:
            os.unlink(name)
        for name in named_segments([pid0]):
            os.unlink(f"/dev/shm/{name}")
