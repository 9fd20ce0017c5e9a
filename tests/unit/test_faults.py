"""Jobs that go wrong must say what went wrong, on which rank, within seconds (real mpiexec).

Each case runs a small script under mpiexec with a hard timeout and checks the exit status, the
message and the time taken. Ranks' output through mpiexec is not line-atomic, so a script that has
something to report writes it with report(), one file per rank, and the test reads those files.
"""
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from unit_helpers import MPIEXEC

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PRELUDE = """
import os, sys, time
import numpy as np
import pydist as dist

def report(msg):
    with open(os.path.join(os.environ["JOB_OUT"], f"rank{dist.get_rank()}.txt"), "a") as f:
        f.write(msg.replace(chr(10), " | ") + chr(10))
"""


def run_job(tmp_path, n, body, env_extra=None, timeout=60):
    script = tmp_path / "job.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    env = dict(os.environ, MPIEXEC_TIMEOUT=str(timeout), UCX_ERROR_SIGNALS="", JOB_OUT=str(tmp_path),
               **(env_extra or {}))
    start = time.monotonic()
    proc = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, str(script)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout + 30)
    return proc, time.monotonic() - start


def reports(tmp_path, rank):
    path = tmp_path / f"rank{rank}.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_timeout_names_the_operation_and_breaks_the_group(tmp_path):
    """Rank 1 never joins the all-reduce: the others raise DistTimeoutError after the 2 s timeout
    (not before it, and not when rank 1 finally leaves), and the group then refuses further calls
    at once."""
    proc, _ = run_job(tmp_path, 3, """
        dist.init_process_group(timeout=2.0)
        if dist.get_rank() != 1:
            t = time.monotonic()
            try:
                dist.all_reduce(np.ones(4))
            except dist.DistTimeoutError as e:
                report(f"TIMEOUT after {time.monotonic() - t:.2f} s: {e}")
            t = time.monotonic()
            try:
                dist.barrier()
            except dist.DistError as e:
                report(f"BROKEN in {time.monotonic() - t:.3f} s: {e}")
            # A rank that leaves without MPI_Finalize ends the job: wait (through the files, MPI being
            # broken) until the other has reported too, or on a busy machine its report may be lost.
            files = [os.path.join(os.environ["JOB_OUT"], f"rank{r}.txt") for r in (0, 2)]
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not all(
                    os.path.exists(f) and len(open(f).readlines()) >= 2 for f in files):
                time.sleep(0.05)
        else:
            time.sleep(10)   # longer than the others' bound below; the job ends when they exit
        os._exit(0)   # the broken collectives can never finish: skip the orderly shutdown
    """)
    for r in (0, 2):
        timeout_line, broken = reports(tmp_path, r)
        assert timeout_line.startswith("TIMEOUT after"), (timeout_line, proc.stderr)
        waited = float(timeout_line.split()[2])
        assert 2.0 <= waited < 6.0, timeout_line   # 2.0 s on a quiet machine; 6: a hang guard only
        assert "all_reduce timed out after" in timeout_line
        assert broken.startswith("BROKEN in"), broken
        # at once: 0.000 s measured, and well under another 2 s timeout
        assert float(broken.split()[2]) < 1.0 and "broken" in broken and "all_reduce" in broken, broken


def test_a_groups_own_timeout_bounds_its_collectives_and_breaks_only_that_group(tmp_path):
    """new_group(timeout=0.5): rank 0 alone calls an all-reduce on it, which times out after the group's
    0.5 s (the session's is a minute) and breaks that group only; the world and a group without a
    timeout of its own go on. (A job of its own: the timed-out call's messages stay at the ranks that
    never made it, docs/guides/errors.md.)"""
    proc, _ = run_job(tmp_path, 3, """
        dist.init_process_group(timeout=60.0)
        short = dist.new_group([0, 1, 2], timeout=0.5)
        plain = dist.new_group([0, 1, 2])
        if dist.get_rank() == 0:
            t = time.monotonic()
            try:
                dist.all_reduce(np.ones(4), group=short)
            except dist.DistTimeoutError as e:
                report(f"TIMEOUT after {time.monotonic() - t:.2f} s: {e}")
            try:
                dist.barrier(group=short)
            except dist.DistError as e:
                report(f"BROKEN: {e}")
        x, y = np.ones(2), np.ones(2)
        dist.all_reduce(x)
        dist.all_reduce(y, group=plain)
        report(f"SUMS {x[0]:g} {y[0]:g}")
        dist.barrier()
        time.sleep(1)   # every rank's report written before the first exit ends the job
        os._exit(0)     # the broken all-reduce can never finish: skip the orderly shutdown
    """)
    timeout_line, broken, sums = reports(tmp_path, 0)
    assert timeout_line.startswith("TIMEOUT after"), (timeout_line, proc.stderr)
    assert 0.5 <= float(timeout_line.split()[2]) < 20, timeout_line   # 20: a hang guard only
    assert "past its timeout of 0.500 s" in timeout_line, timeout_line
    assert broken.startswith("BROKEN") and "broken" in broken, broken
    assert sums == "SUMS 3 3" and reports(tmp_path, 1) == reports(tmp_path, 2) == ["SUMS 3 3"], proc.stderr


def test_monitored_barrier_names_the_missing_rank(tmp_path):
    proc, seconds = run_job(tmp_path, 4, """
        dist.init_process_group()
        if dist.get_rank() == 2:
            time.sleep(10)   # longer than the others' bound below; the job ends when they exit
            os._exit(0)
        t = time.monotonic()
        try:
            dist.monitored_barrier(timeout=1.5, wait_all_ranks=True)
            report("PASSED")
        except dist.DistError as e:
            report(f"ERROR after {time.monotonic() - t:.2f} s: {e}")
        time.sleep(2)   # the first rank to exit ends the job: let every rank write its report first
        os._exit(0)
    """)
    (err,) = reports(tmp_path, 0)
    assert "Rank 2 failed to pass monitoredBarrier" in err, (err, proc.stderr)
    assert 1.5 <= float(err.split()[2]) < 4.5, err   # 1.50 s on a quiet machine; 4.5: a hang guard only


def test_monitored_barrier_passes_when_everyone_arrives(tmp_path):
    proc, _ = run_job(tmp_path, 3, """
        dist.init_process_group()
        time.sleep(0.1 * dist.get_rank())
        dist.monitored_barrier(timeout=10)
        report("PASSED")
    """)
    assert proc.returncode == 0, proc.stderr
    assert all(reports(tmp_path, r) == ["PASSED"] for r in range(3))


def test_detail_mode_reports_what_each_rank_passed(tmp_path):
    proc, _ = run_job(tmp_path, 3, """
        dist.init_process_group()
        r = dist.get_rank()
        try:
            if r == 1:
                dist.broadcast(np.ones((2, 2), np.float32), src=0)
            else:
                dist.all_reduce(np.ones(4), op=dist.ReduceOp.MAX)
            report("NO ERROR")
        except ValueError as e:
            report(f"ERROR {e}")
        x = np.ones(2)
        dist.all_reduce(x)
        report(f"AFTER {x.tolist()}")
    """, env_extra={"PYDIST_DEBUG": "DETAIL"})
    assert proc.returncode == 0, proc.stderr
    for r in range(3):
        err, after = reports(tmp_path, r)
        assert "rank 0: all_reduce(float64 (4,), op=MAX)" in err, err
        assert "rank 1: broadcast(float32 (2, 2), src=0)" in err, err
        assert "rank 2: all_reduce(float64 (4,), op=MAX)" in err, err
        assert after == "AFTER [3.0, 3.0]"


def test_detail_mode_catches_ranks_choosing_different_all_reduce_algorithms(tmp_path):
    # Without the check, the ring's point-to-point steps would never meet MPI's all-reduce: a hang.
    proc, _ = run_job(tmp_path, 2, """
        dist.init_process_group()
        try:
            dist.all_reduce(np.ones(4), algorithm="ring" if dist.get_rank() == 1 else "mpi")
            report("NO ERROR")
        except ValueError as e:
            report(f"ERROR {e}")
    """, env_extra={"PYDIST_DEBUG": "DETAIL"})
    assert proc.returncode == 0, proc.stderr
    for r in range(2):
        err = reports(tmp_path, r)[0]
        assert "rank 0: all_reduce(float64 (4,), op=SUM)" in err, err
        assert "rank 1: all_reduce(float64 (4,), op=SUM, algorithm='ring')" in err, err


def _dies(tmp_path, how):
    return run_job(tmp_path, 3, f"""
        dist.init_process_group()
        if dist.get_rank() == 1:
            time.sleep(0.3)
            {how}
        dist.all_reduce(np.zeros(3))
        print("NOT REACHED", flush=True)
    """, timeout=60)


# A job with a dead rank ends by itself in 1-3 s on a quiet machine; the bound only has to tell that
# from the job's 60 s limit.
DEAD_JOB_ENDS_S = 30


def test_dead_rank_exception(tmp_path):
    proc, seconds = _dies(tmp_path, "raise RuntimeError('boom')")
    assert proc.returncode != 0 and "[rank1]" in proc.stderr and "boom" in proc.stderr, proc.stderr
    assert seconds < DEAD_JOB_ENDS_S and "NOT REACHED" not in proc.stdout


def test_dead_rank_sys_exit(tmp_path):
    """A rank's script ends early (sys.exit): the ranks waiting for it give up within the 2 s grace
    and name it, and the job ends non-zero."""
    proc, seconds = _dies(tmp_path, "sys.exit(0)")
    assert proc.returncode != 0
    assert "rank 1 has exited" in proc.stderr and "all_reduce cannot complete" in proc.stderr, proc.stderr
    assert seconds < DEAD_JOB_ENDS_S and "NOT REACHED" not in proc.stdout


def test_dead_rank_sigkill(tmp_path):
    """SIGKILL leaves no chance to say anything: the launcher sees the process die and ends the job,
    naming the process and its signal."""
    proc, seconds = _dies(tmp_path, "os.kill(os.getpid(), 9)")
    assert proc.returncode != 0
    assert "BAD TERMINATION" in proc.stdout + proc.stderr
    assert seconds < DEAD_JOB_ENDS_S and "NOT REACHED" not in proc.stdout


def _async_worker_dies(tmp_path, how):
    return run_job(tmp_path, 3, f"""
        from pydist.engine import Trainer, mlp, load_fashion_mnist
        dist.init_process_group()
        _, (x, y) = load_fashion_mnist()
        t = Trainer(mlp((15,)), batch_size=8, strategy="downpour", window=2)   # rank 2 serves ranks 0, 1
        t.train_steps(x, y, 0, 0, 10)
        if dist.get_rank() == 1:
            {how}
        t.train_steps(x, y, 0, 10, 400)
        print(f"NOT REACHED by rank {{dist.get_rank()}}", flush=True)   # worker 0 may finish: it waits for no one
    """, timeout=60)


def test_async_worker_exits_mid_run(tmp_path):
    """A worker leaves between calls: the server waiting for its pushes names it, and the job ends."""
    proc, seconds = _async_worker_dies(tmp_path, "sys.exit(0)")
    assert proc.returncode != 0
    assert "rank 1 has exited" in proc.stderr and "training step's communication" in proc.stderr, proc.stderr
    assert seconds < DEAD_JOB_ENDS_S and "NOT REACHED by rank 2" not in proc.stdout


def test_async_worker_killed_mid_run(tmp_path):
    proc, seconds = _async_worker_dies(tmp_path, "os.kill(os.getpid(), 9)")
    assert proc.returncode != 0 and "BAD TERMINATION" in proc.stdout + proc.stderr
    assert seconds < DEAD_JOB_ENDS_S and "NOT REACHED by rank 2" not in proc.stdout


def _pipeline_stage_fails(tmp_path, how):
    return run_job(tmp_path, 3, f"""
        from pydist.engine import Trainer, mlp, load_fashion_mnist
        dist.init_process_group()
        _, (x, y) = load_fashion_mnist()
        t = Trainer(mlp((15, 12)), batch_size=8, strategy="pipeline", stages=3, micro_batches=4)
        t.train_steps(x, y, 0, 0, 5)
        if dist.get_rank() == 1:      # the middle stage: both neighbours wait for it
            {how}
        t.train_steps(x, y, 0, 5, 400)
        print(f"NOT REACHED by rank {{dist.get_rank()}}", flush=True)
    """, timeout=60)


def test_pipeline_stage_that_raises_ends_the_job_naming_its_rank(tmp_path):
    """A stage raises between steps while its neighbours wait inside the pipeline for its
    activations and gradients: the job ends with that rank's traceback, not a hang."""
    proc, seconds = _pipeline_stage_fails(tmp_path, "raise RuntimeError('stage 1 failed')")
    assert proc.returncode != 0 and "[rank1]" in proc.stderr and "stage 1 failed" in proc.stderr, proc.stderr
    assert seconds < DEAD_JOB_ENDS_S and "NOT REACHED" not in proc.stdout


def test_pipeline_stage_that_exits_is_named_by_its_neighbours(tmp_path):
    proc, seconds = _pipeline_stage_fails(tmp_path, "sys.exit(0)")
    assert proc.returncode != 0
    assert "rank 1 has exited" in proc.stderr and "training step's communication" in proc.stderr, proc.stderr
    assert seconds < DEAD_JOB_ENDS_S and "NOT REACHED" not in proc.stdout


def test_ctrl_c_ends_a_job_blocked_in_a_collective(tmp_path):
    """SIGINT to mpiexec while ranks wait in a barrier that rank 2 never joins: the job ends within
    2 seconds."""
    script = tmp_path / "blocked.py"
    script.write_text(PRELUDE + textwrap.dedent("""
        dist.init_process_group()
        report("READY")
        if dist.get_rank() == 2:
            time.sleep(120)
        dist.barrier()
    """))
    env = dict(os.environ, MPIEXEC_TIMEOUT="60", UCX_ERROR_SIGNALS="", JOB_OUT=str(tmp_path))
    proc = subprocess.Popen([MPIEXEC, "-n", "3", sys.executable, str(script)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not all(reports(tmp_path, r) == ["READY"] for r in range(3)):
            assert proc.poll() is None and time.monotonic() < deadline, "job ended before every rank was ready"
            time.sleep(0.05)
        time.sleep(0.5)   # let them block
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        seconds = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert seconds < 2.0, f"took {seconds:.2f} s"


def test_echoes_of_one_ctrl_c_do_not_cut_a_ranks_report_short(tmp_path):
    """One Ctrl-C reaches a rank up to three times within milliseconds (the terminal, mpiexec, a launcher):
    the echoes are dropped, so each rank says its one line and ends the job, and no "Error in
    sys.excepthook" traceback (an echo landing as the first KeyboardInterrupt reached the hook) appears."""
    script = tmp_path / "spin.py"
    script.write_text(PRELUDE + textwrap.dedent("""
        import signal
        dist.init_process_group()
        report(f"READY {os.getpid()} {signal.getsignal(signal.SIGINT).__name__}")
        while True:
            sum(range(1000))   # Python bytecode all the time: a signal is handled at once
    """))
    env = dict(os.environ, MPIEXEC_TIMEOUT="60", UCX_ERROR_SIGNALS="", JOB_OUT=str(tmp_path))
    proc = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, str(script)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not all(reports(tmp_path, r) for r in range(2)):
            assert proc.poll() is None and time.monotonic() < deadline, "job ended before every rank was ready"
            time.sleep(0.05)
        said = [reports(tmp_path, r)[0].split() for r in range(2)]
        assert [s[2] for s in said] == ["_keyboard_interrupt"] * 2, said
        for _ in range(3):
            for s in said:
                os.kill(int(s[1]), signal.SIGINT)
            time.sleep(0.002)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "Error in sys.excepthook" not in out and "Traceback" not in out, out
    for r in range(2):
        assert re.search(rf"^\[rank{r}\]: KeyboardInterrupt in <module> \(spin.py:\d+\)$", out, re.M), out


def test_the_ctrl_c_handler_drops_echoes_and_raises_again_later():
    from pydist import distributed
    with pytest.raises(KeyboardInterrupt):
        distributed._keyboard_interrupt(signal.SIGINT, None)
    assert distributed._keyboard_interrupt(signal.SIGINT, None) is None   # an echo
    time.sleep(distributed.SIGINT_ECHO_S + 0.05)
    with pytest.raises(KeyboardInterrupt):
        distributed._keyboard_interrupt(signal.SIGINT, None)
