"""The build: no compiler warnings with -Wall -Wextra, one clear line when MPICH is missing, and
`pip install .` into a fresh virtual environment works."""
import os
import subprocess
import sys
import venv

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
    assert "MPICH was not found" in last and "apt-get install -y mpich libmpich-dev" in last, proc.stderr


def test_pip_install_into_a_fresh_venv(tmp_path):
    """What a researcher types: a new venv, `pip install .` (build isolation: only setuptools and
    numpy are fetched for the build), then an all-reduce from outside the source tree."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = str(env_dir / "bin" / "python")
    proc = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", ROOT],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check = ("import numpy as np, pydist as dist; dist.init_process_group(backend='mpi'); "
             "a = np.arange(3.0); dist.all_reduce(a); print(dist.__file__, a.tolist())")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only the new venv's pydist
    proc = subprocess.run([py, "-c", check], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert str(env_dir) in proc.stdout and "[0.0, 1.0, 2.0]" in proc.stdout, proc.stdout
