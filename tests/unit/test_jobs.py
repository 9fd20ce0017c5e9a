"""Whole jobs under real mpiexec: the examples print what the tutorial says, and a rank that dies
ends the job quickly with a message naming it, instead of leaving the others waiting."""
import os
import subprocess
import sys
import textwrap
import time

import pytest

from pydist import _libraries as pydist_libraries
from unit_helpers import MPIEXEC

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def mpirun(n, args, timeout=60):
    env = dict(os.environ, MPIEXEC_TIMEOUT=str(timeout), UCX_ERROR_SIGNALS="")
    start = time.monotonic()
    proc = subprocess.run([MPIEXEC, "-n", str(n), sys.executable] + args, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout + 30)
    return proc, time.monotonic() - start


def test_example_p2p():
    proc, _ = mpirun(2, ["examples/ptdist_p2p.py"])
    assert proc.returncode == 0, proc.stderr
    assert "Rank 0 has data [ 1. -1.]" in proc.stdout
    assert "Rank 1 has data [ 1. -1.]" in proc.stdout


@pytest.mark.parametrize("n", [3, 4])
def test_example_allreduce(n):
    proc, _ = mpirun(n, ["examples/ptdist_allreduce.py"])
    assert proc.returncode == 0, proc.stderr
    expected = sum([1.0, 2.0, -3.0][r % 3] for r in range(n))
    for r in range(n):
        assert f"Rank {r} has data {expected}" in proc.stdout, proc.stdout


def test_unhandled_exception_on_one_rank_ends_the_job(tmp_path):
    """Rank 1 raises while the others wait in a collective it will never join: the job must end
    within seconds, non-zero, with rank 1's traceback prefixed by [rank1]."""
    script = tmp_path / "dies.py"
    script.write_text(textwrap.dedent("""
        import time
        import numpy as np
        import pydist as dist
        dist.init_process_group()
        if dist.get_rank() == 1:
            time.sleep(0.2)
            raise RuntimeError("boom on purpose")
        dist.all_reduce(np.zeros(4))      # waits for rank 1 forever, unless the job is ended
        print("NOT REACHED", flush=True)
    """))
    proc, seconds = mpirun(3, [str(script)], timeout=60)
    assert proc.returncode != 0
    assert "[rank1]" in proc.stderr and "boom on purpose" in proc.stderr, proc.stderr
    assert "NOT REACHED" not in proc.stdout
    assert seconds < 15, f"took {seconds:.1f} s"


def test_launched_by_another_mpi_is_refused():
    """Open MPI's mpiexec sets OMPI_COMM_WORLD_SIZE; an MPICH build then sees a world of 1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA"))}
    env["OMPI_COMM_WORLD_SIZE"] = "2"
    proc = subprocess.run([sys.executable, "-c", "import pydist as d; d.init_process_group()"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "DistError" in proc.stderr and pydist_libraries.mpiexec() in proc.stderr, proc.stderr


def test_python_m_pydist_ends_the_job_on_sys_exit(tmp_path):
    """Under `python -m pydist`, a non-zero sys.exit on one rank also ends the whole job."""
    script = tmp_path / "exits.py"
    script.write_text(textwrap.dedent("""
        import sys
        import numpy as np
        import pydist as dist
        dist.init_process_group()
        if dist.get_rank() == 2:
            sys.exit(3)
        dist.barrier()
        print("NOT REACHED", flush=True)
    """))
    proc, seconds = mpirun(3, ["-m", "pydist", str(script)], timeout=60)
    assert proc.returncode != 0
    assert "[rank2]" in proc.stderr and "status 3" in proc.stderr, proc.stderr
    assert "NOT REACHED" not in proc.stdout
    assert seconds < 15, f"took {seconds:.1f} s"
