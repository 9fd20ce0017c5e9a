"""How a script behaves as a process: launched by the wrong mpiexec, run alone, dying of an exception.

Each case runs a fresh interpreter with a hard timeout and no launcher variables of its own.
"""
import os

import pytest

import pydist as dist
from unit_helpers import run_script as run

INIT = "import pydist as dist; dist.init_process_group()"


@pytest.mark.parametrize("var, size, who", [("OMPI_COMM_WORLD_SIZE", 2, "Open MPI"),
                                            ("OMPI_COMM_WORLD_SIZE", 4, "Open MPI")])
def test_wrong_launcher_is_an_error_naming_mpiexec_mpich(var, size, who):
    proc = run(INIT, **{var: str(size)})
    assert proc.returncode != 0, proc.stdout + proc.stderr
    err = proc.stderr
    assert "pydist.DistError" in err, err
    assert dist._libraries.mpiexec() in err and f"-n {size}" in err, err
    assert f"{var}={size}" in err and who in err, err


# srun without a PMI connection for MPICH (Slurm's default --mpi=none, or --mpi=pmix for an MPICH
# without PMIx): refused before MPI_Init, on every task, naming the fix. (tests/unit/test_slurm.py runs
# the same under a real srun.)
@pytest.mark.parametrize("extra, plugin", [({}, "none"), ({"PMIX_RANK": "1", "PMIX_NAMESPACE": "slurm.pmix.1.0"}, "pmix")])
def test_srun_without_pmi_is_an_error_naming_mpi_pmi2(extra, plugin):
    proc = run(INIT, SLURM_STEP_NUM_TASKS="3", SLURM_NTASKS="3", SLURM_PROCID="1", **extra)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    err = proc.stderr
    assert "pydist.DistError" in err and "task 1 of the 3 that srun started" in err, err
    assert f"srun --mpi={plugin}" in err and "srun --mpi=pmi2" in err and "SLURM_MPI_TYPE=pmi2" in err, err


# Alone by choice inside a Slurm job: a script a batch script runs directly (the job's SLURM_NTASKS,
# no step), `mpiexec -n 1` inside an allocation of 2 (PMI_SIZE=1 decides), a one-task srun step.
@pytest.mark.parametrize("env", [{"SLURM_NTASKS": "2", "SLURM_JOB_ID": "7"},
                                 {"SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "PMI_SIZE": "1", "PMI_RANK": "0"},
                                 {"SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}])
def test_alone_by_choice_inside_slurm_is_fine(env):
    proc = run(INIT + "; print(dist.get_rank(), dist.get_world_size())", **env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "1"]


def test_wrong_launcher_error_is_catchable_and_leaves_nothing_initialised():
    script = ("import pydist as dist\n"
              "try:\n"
              "    dist.init_process_group()\n"
              "except dist.DistError as e:\n"
              "    print(type(e).__name__, isinstance(e, RuntimeError), dist.is_initialized())\n")
    proc = run(script, OMPI_COMM_WORLD_SIZE="2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["DistError", "True", "False"]


def test_launcher_size_one_is_fine():
    proc = run(INIT + "; print(dist.get_rank(), dist.get_world_size())", OMPI_COMM_WORLD_SIZE="1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "1"]


def test_plain_singleton_exits_zero():
    script = (INIT + "\nimport numpy as np\n"
              "a = np.arange(4.0); dist.all_reduce(a); dist.barrier()\n"
              "print(dist.get_rank(), dist.get_world_size(), a.tolist())\n"
              "print(dist._C.__file__)\n")
    proc = run(script)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "0 1 [0.0, 1.0, 2.0, 3.0]"
    # the child ran the very extension under test
    assert os.path.samefile(lines[1], dist._C.__file__), (lines[1], dist._C.__file__)
    assert "Traceback" not in proc.stderr, proc.stderr


def test_singleton_destroy_and_exit():
    proc = run(INIT + "; dist.destroy_process_group(); print('ok')")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_unhandled_exception_prints_rank_prefixed_traceback():
    proc = run(INIT + "\nraise RuntimeError('boom in user code')\n")
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines, "nothing on stderr"
    assert lines[0] == "[rank0]: Traceback (most recent call last):", proc.stderr
    assert "[rank0]: RuntimeError: boom in user code" in lines, proc.stderr
    tb = lines[:lines.index("[rank0]: RuntimeError: boom in user code") + 1]
    assert all(ln.startswith("[rank0]: ") for ln in tb), proc.stderr


def test_unhandled_pydist_error_prints_rank_prefix():
    # an argument error from pydist itself, not caught: same prefix, same non-zero exit
    proc = run(INIT + "\ndist.all_reduce([1, 2])\n")
    assert proc.returncode != 0
    assert "[rank0]: TypeError: all_reduce(): `tensor` must be a numpy.ndarray" in proc.stderr, proc.stderr


def test_exit_with_pending_work_does_not_hang_or_crash():
    # a receive nobody will ever match, still referenced at exit, and another dropped before it
    script = (INIT + "\nimport numpy as np, warnings\n"
              "warnings.simplefilter('ignore', ResourceWarning)\n"
              "w = dist.irecv(np.zeros(3))\n"
              "dist.irecv(np.zeros(5))\n"
              "print('end', flush=True)\n")
    proc = run(script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "end"


def test_exit_code_of_sys_exit_is_kept():
    proc = run(INIT + "\nimport sys; sys.exit(7)\n")
    assert proc.returncode == 7, proc.stderr


def test_hwloc_setting_is_for_mpi_init_only():
    # init turns hwloc's PCI discovery off for MPI_Init (start-up time) and takes it back out of the
    # environment, so processes this one starts see the environment the user gave; a user's own
    # HWLOC_COMPONENTS is left as it was.
    script = (INIT + "\nimport subprocess\n"
              "print(subprocess.run(['sh', '-c', 'echo \"[$HWLOC_COMPONENTS]\"'], capture_output=True, text=True).stdout)")
    proc = run(script)
    assert proc.returncode == 0, proc.stderr
    assert "[]" in proc.stdout, proc.stdout
    proc = run(script, HWLOC_COMPONENTS="x86")
    assert proc.returncode == 0, proc.stderr
    assert "[x86]" in proc.stdout, proc.stdout


def test_import_starts_no_blas_threads_and_leaves_the_environment():
    # The engine's OpenBLAS is loaded with one thread (an idle pthreads pool spins, and slowed
    # MPI_Init at 2 ranks on 2 cores from 30 to 110 ms); NumPy's and the user's settings are untouched.
    script = ("import os, numpy\n"
              "before = len(os.listdir('/proc/self/task'))\n"
              "import pydist\n"
              "print(len(os.listdir('/proc/self/task')) - before, os.environ.get('OPENBLAS_NUM_THREADS'))")
    proc = run(script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "None"], proc.stdout
    proc = run(script, OPENBLAS_NUM_THREADS="3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[1] == "3", proc.stdout
