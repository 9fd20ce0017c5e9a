"""`import pydist` inside pydist's checkout imports the checkout's folder, not the installed package. With
no in-place build there, the import stops at once with one sentence saying so and what to do, for
`import pydist`, `python -m pydist` and the CLIs alike, never with words about something else (a
circular import, a missing build for an MPI library)."""
import glob
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def checkout(tmp_path):
    """A checkout as `git clone` leaves it: the package's Python files, setup.py and csrc/, no build."""
    os.mkdir(tmp_path / "pydist")
    for f in glob.glob(os.path.join(ROOT, "pydist", "*.py")):
        if not f.endswith("_build_config.py"):   # (written by a build)
            shutil.copy(f, tmp_path / "pydist")
    shutil.copy(os.path.join(ROOT, "setup.py"), tmp_path)
    os.mkdir(tmp_path / "csrc")
    return tmp_path


@pytest.mark.parametrize("argv", [["-c", "import pydist"], ["-m", "pydist", "--version"], ["-m", "pydist.train"],
                                  ["-m", "pydist.run", "-n", "2", "--", "x.py"]])
def test_an_unbuilt_checkout_says_what_it_is_in_one_sentence(checkout, argv):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, *argv], cwd=checkout, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        f"ImportError: pydist: {checkout} is pydist's source folder, which has no build, and Python imports pydist "
        f"from it rather than the installed one: run from another folder, or build here first "
        f"(python setup.py build_ext --inplace)"), proc.stderr
    assert "circular" not in proc.stderr and "MPI library" not in proc.stderr, proc.stderr


def test_a_checkout_built_in_place_imports(checkout):
    """With a build in the folder (here: this checkout's own), the same folder imports and runs."""
    for name in ("_C_*.so", "_build_config.py"):
        for f in glob.glob(os.path.join(ROOT, "pydist", name)):
            shutil.copy(f, checkout / "pydist")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import pydist, numpy as np; pydist.init_process_group(); x = np.ones(3); pydist.all_reduce(x); " \
           "print(pydist.__file__, x.sum())"
    proc = subprocess.run([sys.executable, "-c", code], cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(checkout / "pydist" / "__init__.py"), "3.0"], proc.stdout
