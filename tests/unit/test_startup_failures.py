"""A rank that fails before init_process_group, or before MPI's start-up completes, ends the job with the
truth, under each way of running one (real mpiexec): plain mpiexec within init's timeout (MPI_Init has no
deadline of its own, and hydra does not end a job for a process that exits before its start-up began),
python -m pydist at once, and python -m pydist.run at once, retrying only what a restart could mend."""
import subprocess
import sys
import textwrap

from unit_helpers import MPIEXEC, launch_run, subprocess_env

ENV = subprocess_env(MPIEXEC_TIMEOUT="120")

# rank 1 (or every rank) cannot open its input before it starts MPI, as a script with a wrong path does
EARLY = textwrap.dedent("""
    import os, sys
    import pydist as dist
    if os.environ.get("FAIL_RANK", "1") in ("all", os.environ.get("PMI_RANK")):
        open("/nonexistent/input.bin")
    dist.init_process_group(timeout=float(sys.argv[1]) if len(sys.argv) > 1 else None)
    dist.barrier()
    print(f"rank {dist.get_rank()} past init", flush=True)
""")


def run(cmd, cwd, **env):
    return subprocess.run(cmd, cwd=cwd, env=dict(ENV, **env), capture_output=True, text=True, timeout=150)


def test_plain_mpiexec_ends_within_inits_timeout(tmp_path):
    (tmp_path / "early.py").write_text(EARLY)
    proc = run([MPIEXEC, "-n", "3", sys.executable, "early.py", "3"], tmp_path)
    assert proc.returncode != 0 and "past init" not in proc.stdout, proc.stdout + proc.stderr
    assert "FileNotFoundError" in proc.stderr, proc.stderr
    assert "MPI's start-up did not complete within 3 s (its timeout): a rank never began it" in proc.stderr, proc.stderr


def test_python_m_pydist_ends_the_job_at_once(tmp_path):
    (tmp_path / "early.py").write_text(EARLY)
    proc = run([MPIEXEC, "-n", "3", sys.executable, "-m", "pydist", "early.py"], tmp_path)   # no timeout at all
    assert proc.returncode != 0 and "past init" not in proc.stdout, proc.stdout + proc.stderr
    assert "[rank1]: FileNotFoundError" in proc.stderr, proc.stderr
    assert "[rank1]: failed before MPI started; ending the job from MPI's start-up" in proc.stderr, proc.stderr


def launch(args, cwd, program):
    proc = launch_run(args, cwd, program, ENV)
    out, _ = proc.communicate(timeout=150)
    return proc.returncode, out


def test_pydist_run_ends_the_attempt_when_a_rank_fails_before_init(tmp_path):
    (tmp_path / "early.py").write_text(EARLY)
    rc, out = launch(["-n", "3", "--max-restarts", "1"], tmp_path, ["early.py"])
    assert rc == 1, out
    assert out.count("rank 1 ended before it began init_process_group") == 2, out   # in both attempts
    assert out.count("rank 1 (host") == 2 and "FileNotFoundError" in out, out
    assert "giving up after 1 restart(s) (--max-restarts 1); exit status 1" in out, out


def test_pydist_run_does_not_restart_what_a_restart_repeats(tmp_path):
    (tmp_path / "early.py").write_text(EARLY)
    (tmp_path / "usage.py").write_text("import argparse\nargparse.ArgumentParser().add_argument('--epochs', type=int)"
                                       "\nargparse.ArgumentParser().parse_args()\n")
    rc, out = launch(["-n", "2", "--max-restarts", "3"], tmp_path, ["usage.py", "--epochs", "x"])
    assert rc == 2 and "giving up: exit status 2 is a usage error (the program's arguments)" in out, out
    assert "restarting" not in out, out
    proc = launch_run(["-n", "3", "--max-restarts", "3"], tmp_path, ["early.py"], dict(ENV, FAIL_RANK="all"))
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 1, out
    assert "giving up: all 3 ranks failed the same way, the program's own failure" in out, out
    assert "restarting" not in out, out
