"""pydist under a real Slurm (Debian's Slurm 22.05, one node, scripts/slurm.sh): srun --mpi=pmi2 at 2 and 3
tasks, an sbatch script, salloc + mpiexec.mpich, the elastic launcher inside an allocation; and the
launches that would leave every task alone as rank 0 of 1 (plain srun, --mpi=pmix) refused on every
task with the fix, while a process meant to be alone inside a job never is.

One cluster for the module (a fixture), brought up fresh and brought down at the end. The cluster is
set up as a default site is: MpiDefault=none, so plain srun gives no PMI connection.
"""
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from pydist.run import read_progress
from unit_helpers import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLURM = os.path.join(ROOT, "scripts", "slurm.sh")
PY = sys.executable
MISSING = [tool for tool in ("srun", "sbatch", "salloc", "slurmd", "slurmctld", "munged")
           if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}")]
if MISSING and not os.environ.get("PYDIST_REQUIRE_PEERS"):
    pytestmark = pytest.mark.skip(reason=f"NOT RUN (Slurm): {', '.join(MISSING)} not installed (scripts/setup.sh --test)")

COLLECTIVES = textwrap.dedent("""
    # Each rank's data is drawn from its rank's own seed; whole numbers, so every sum is exact whatever
    # the order MPI adds in, and the reference is computed here from all ranks' seeds.
    import os
    import numpy as np
    import pydist as dist

    dist.init_process_group()
    r, n = dist.get_rank(), dist.get_world_size()
    data = lambda k, m=12: np.random.default_rng(k).integers(-1000, 1000, m * n).astype(np.float64)
    a = data(r); dist.all_reduce(a)
    assert np.array_equal(a, sum(data(k) for k in range(n)))
    b = data(r); dist.all_reduce(b, op=dist.ReduceOp.MAX)
    assert np.array_equal(b, np.max([data(k) for k in range(n)], axis=0))
    g = np.empty(n * 5); dist.all_gather_into_tensor(g, data(r, 5)[:5])
    assert np.array_equal(g, np.concatenate([data(k, 5)[:5] for k in range(n)]))
    c = data(r) if r == n - 1 else np.zeros(12 * n); dist.broadcast(c, src=n - 1)
    assert np.array_equal(c, data(n - 1))
    s = np.empty(12); dist.reduce_scatter_tensor(s, data(r))
    assert np.array_equal(s, sum(data(k) for k in range(n))[12 * r:12 * (r + 1)])
    t = np.empty(12 * n); dist.all_to_all_single(t, data(r))
    assert np.array_equal(t, np.concatenate([data(k)[12 * r:12 * (r + 1)] for k in range(n)]))
    got = np.empty(12 * n)
    reqs = [dist.isend(data(r), (r + 1) % n), dist.irecv(got, (r - 1) % n)]
    [q.wait() for q in reqs]
    assert np.array_equal(got, data((r - 1) % n))
    dist.barrier()
    print(f"rank {r} of {n}: collectives ok (SLURM_PROCID={os.environ.get('SLURM_PROCID')})", flush=True)
    print("library:", dist._C.mpi_info()["library_version"].strip().splitlines()[0], flush=True)
    dist.destroy_process_group()
""")
ALONE = ("import pydist as dist; dist.init_process_group(); "
         "print('alone:', dist.get_rank(), dist.get_world_size(), flush=True); dist.destroy_process_group()")
INIT = "import pydist as dist; dist.init_process_group()"
DATA = "/usr/share/datasets/fashion-mnist"
TIMEOUT = 240   # per job, a hang guard: the longest (3 tasks of LeNet-5 for one epoch) takes ~30 s here


@pytest.fixture(scope="module")
def slurm():
    assert not MISSING, f"Slurm is not installed ({', '.join(MISSING)} missing): scripts/setup.sh --test installs it"
    proc = subprocess.run([SLURM, "up"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"scripts/slurm.sh up failed:\n{proc.stdout}{proc.stderr}"
    conf = os.path.join(proc.stdout.strip().splitlines()[-1], "slurm.conf")
    assert os.path.isfile(conf), proc.stdout
    try:
        yield subprocess_env(SLURM_CONF=conf, PYTHONUNBUFFERED="1")
    finally:
        down = subprocess.run([SLURM, "down"], capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr


def job(cmd, env, cwd, timeout=TIMEOUT):
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("tasks", [2, 3])
def test_srun_mpi_pmi2_runs_the_collectives(slurm, tmp_path, tasks):
    (tmp_path / "collectives.py").write_text(COLLECTIVES)
    proc = job(["srun", "--mpi=pmi2", "-n", str(tasks), PY, "collectives.py"], slurm, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # srun's task number is the rank
    assert sorted(x for x in proc.stdout.split("\n") if x.startswith("rank")) == [
        f"rank {r} of {tasks}: collectives ok (SLURM_PROCID={r})" for r in range(tasks)], proc.stdout


# The other libraries of MPICH's ABI that make test installs (scripts/test_libraries.sh): under srun,
# Slurm's PMI-2 server speaks to each, so PYDIST_LIBMPI alone picks the library.
LIBRARIES = {"mpich5": "MPICH Version: *5\\.", "impi": "Intel\\(R\\) MPI Library"}


@pytest.mark.parametrize("name", sorted(LIBRARIES))
def test_srun_mpi_pmi2_on_another_library(slurm, tmp_path, name):
    lib = os.path.join(ROOT, f".mpi-{name}", "lib", "libmpi.so.12")
    assert os.path.isfile(lib), f"{lib} is missing: scripts/test_libraries.sh --install (setup.sh --test) installs it"
    (tmp_path / "collectives.py").write_text(COLLECTIVES)
    proc = job(["srun", "--mpi=pmi2", "-n", "2", PY, "collectives.py"], dict(slurm, PYDIST_LIBMPI=lib), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("collectives ok") == 2, proc.stdout
    assert len(re.findall(f"^library: {LIBRARIES[name]}", proc.stdout, re.M)) == 2, proc.stdout


# Open MPI speaks PMIx: Slurm's pmix plugin starts its ranks (Open MPI 5.0 from PyPI, 4.1 from Debian, as
# scripts/test_libraries.sh installs them), and under --mpi=pmi2 it is refused with that fix.
OPEN_MPI = {"openmpi5": ("lib", {}), "openmpi4": ("usr/lib/x86_64-linux-gnu", {
    "OPAL_PREFIX": "usr", "OPAL_SYSCONFDIR": "etc/openmpi", "LD_LIBRARY_PATH": "usr/lib/x86_64-linux-gnu"})}


@pytest.mark.parametrize("name", sorted(OPEN_MPI))
def test_srun_mpi_pmix_on_open_mpi(slurm, tmp_path, name):
    prefix = os.path.join(ROOT, f".mpi-{name}")
    libdir, relocate = OPEN_MPI[name]
    lib = os.path.join(prefix, libdir, "libmpi.so.40")
    assert os.path.isfile(lib), f"{lib} is missing: scripts/test_libraries.sh --install (setup.sh --test) installs it"
    env = dict(slurm, PYDIST_LIBMPI=lib, OMPI_MCA_pml="ob1", **{k: os.path.join(prefix, v) for k, v in relocate.items()})
    (tmp_path / "collectives.py").write_text(COLLECTIVES)
    proc = job(["srun", "--mpi=pmix", "-n", "2", PY, "collectives.py"], env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("collectives ok") == 2, proc.stdout
    assert len(re.findall("^library: Open MPI v[45]\\.", proc.stdout, re.M)) == 2, proc.stdout
    if name == "openmpi5":
        proc = job(["srun", "--mpi=pmi2", "-n", "2", PY, "collectives.py"], env, tmp_path)
        assert proc.returncode != 0 and proc.stderr.count("run it as `srun --mpi=pmix ...`") == 2, proc.stderr


def test_slurm_mpi_type_in_the_environment_does_the_same(slurm, tmp_path):
    (tmp_path / "collectives.py").write_text(COLLECTIVES)
    proc = job(["srun", "-n", "2", PY, "collectives.py"], dict(slurm, SLURM_MPI_TYPE="pmi2"), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("collectives ok") == 2, proc.stdout


def train(epochs=1, metrics="metrics.jsonl"):
    return [PY, "-m", "pydist.train", "--model", "lenet5", "--epochs", str(epochs), "--data", DATA,
            "--no-progress", "--metrics", metrics, "--plot", "", "--checkpoint", "lenet5.ckpt"]


def check_trained(cwd, ranks, out):
    lines = [json.loads(x) for x in (cwd / "metrics.jsonl").read_text().splitlines() if x.strip()]
    epochs = [x for x in lines if "test_accuracy" in x]
    assert len(epochs) == 1 and epochs[0]["test_accuracy"] > 0.7, lines
    assert epochs[0]["step"] == 60000 // (ranks * 64), (ranks, epochs)   # the epoch was split over `ranks` ranks
    assert "summary" in out, out
    assert (cwd / "lenet5.ckpt").stat().st_size > 0


def test_srun_runs_the_main_job(slurm, tmp_path):
    proc = job(["srun", "--mpi=pmi2", "-n", "2", *train()], slurm, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_trained(tmp_path, 2, proc.stdout)


def test_sbatch_script_runs_the_main_job_with_srun(slurm, tmp_path):
    # the batch script's own python is alone by choice (SLURM_NTASKS=3, no step): never refused
    script = textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH --ntasks=3
        #SBATCH --output=job.out
        {PY} -c "{ALONE}"
        srun --mpi=pmi2 {shlex.join(train())}
        """)
    (tmp_path / "job.sh").write_text(script)
    proc = job(["sbatch", "--wait", "job.sh"], slurm, tmp_path)
    out = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert proc.returncode == 0, proc.stdout + proc.stderr + out
    assert out.splitlines()[0] == "alone: 0 1", out
    check_trained(tmp_path, 3, out)


def test_salloc_and_mpiexec_mpich(slurm, tmp_path):
    # hydra starts its proxy with srun inside the allocation (one task), and the ranks get PMI from it
    (tmp_path / "collectives.py").write_text(COLLECTIVES)
    proc = job(["salloc", "-n", "2", "mpiexec.mpich", "-n", "2", PY, "collectives.py"], slurm, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(re.findall(r"rank (\d) of 2: collectives ok", proc.stdout)) == ["0", "1"], proc.stdout


@pytest.mark.parametrize("launch", [["salloc", "-n", "2", "mpiexec.mpich", "-n", "1"],   # PMI_SIZE=1 decides
                                    ["salloc", "-n", "2"],                                # salloc's own command
                                    ["srun", "-n", "1"]])                                 # a one-task step
def test_a_process_meant_to_be_alone_in_a_job_is_not_refused(slurm, tmp_path, launch):
    proc = job([*launch, PY, "-c", ALONE], slurm, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "alone: 0 1" in proc.stdout.splitlines(), proc.stdout


@pytest.mark.parametrize("mpi", [None, "pmix"])
def test_srun_without_pmi_is_refused_on_every_task_naming_the_fix(slurm, tmp_path, mpi):
    # Slurm's default (--mpi=none), and PMIx, which this MPICH does not speak: MPI_Init would run each
    # task as rank 0 of 1 (MPICH 4) or abort (MPICH 5); init_process_group says so before it
    cmd = ["srun", "-n", "2"] + ([f"--mpi={mpi}"] if mpi else []) + [PY, "-c", INIT + "; print('not refused')"]
    proc = job(cmd, slurm, tmp_path)
    assert proc.returncode != 0 and "not refused" not in proc.stdout, proc.stdout + proc.stderr
    for task in (0, 1):
        assert f"task {task} of the 2 that srun started" in proc.stderr, proc.stderr
    assert proc.stderr.count(f"(srun --mpi={mpi or 'none'})") == 2, proc.stderr
    assert "srun --mpi=pmi2" in proc.stderr and "SLURM_MPI_TYPE=pmi2" in proc.stderr, proc.stderr


ELASTIC = ["-m", "pydist.train", "--model", "mlp", "--hidden", "64", "--epochs", "1", "--batch-size", "32",
           "--checkpoint", "run.ckpt", "--resume-if-present",
           "--checkpoint-every", "20", "--no-progress", "--metrics", "",
           "--plot", ""]


def test_the_elastic_launcher_inside_an_allocation_restarts_after_a_sigkill(slurm, tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    straight.mkdir(), killed.mkdir()
    run = ["salloc", "-n", "2", PY, "-m", "pydist.run", "-n", "2", "--max-restarts", "1", "--run-dir", "run", "--"]
    proc = job(run + ELASTIC, slurm, straight)
    assert proc.returncode == 0 and "finished: 2 rank(s), 0 restart(s)" in proc.stdout + proc.stderr, proc.stdout + proc.stderr

    proc = subprocess.Popen(run + ELASTIC, env=slurm, cwd=killed, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    steps_per_epoch = 60000 // (2 * 32)
    deadline = time.monotonic() + 120
    while read_progress(killed / "run").get("step", 0) < 100 and time.monotonic() < deadline:
        time.sleep(0.02)
    reached = read_progress(killed / "run").get("step", 0)
    assert 100 <= reached < steps_per_epoch, f"step {reached}"
    pid = int((killed / "run" / "attempt-0" / "rank-1.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, out
    assert re.search(r"rank 1 \(host \S+, pid \d+\) was killed by signal 9 \(SIGKILL\)", out), out
    assert "finished: 2 rank(s), 1 restart(s)" in out, out
    # the restarted run ends with the uninterrupted run's weights, bit for bit
    assert (killed / "run.ckpt").read_bytes() == (straight / "run.ckpt").read_bytes()
