"""The driver of torch's own distributed test suite (tests/torch_suite): how it merges the ranks' records
into one outcome, how pydist's name answers the suite's questions about gloo, and that its lists name
tests torch's suite has. The suite itself runs in make test's torch stage (run.py --subset)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUITE = os.path.join(ROOT, "tests", "torch_suite")
sys.path.insert(0, SUITE)
import run  # noqa: E402
from rank import BackendName  # noqa: E402


def rec(outcome, message="", seconds=1.0):
    return {"test": "t", "event": "end", "outcome": outcome, "message": message, "seconds": seconds}


def test_a_test_passes_only_when_every_rank_passed_it():
    assert run.merge([rec("passed"), rec("passed", seconds=2.5)]) == ("passed", "", 2.5)
    assert run.merge([rec("passed"), rec("errored", "Traceback\nValueError: no")])[:2] == \
        ("errored", "Traceback\nValueError: no")
    assert run.merge([rec("skipped", "Need at least 2 CUDA devices")] * 2)[:2] == \
        ("skipped", "Need at least 2 CUDA devices")
    assert run.merge([rec("passed"), rec("hung", "still running after 120 s")])[:2] == \
        ("crashed", "still running after 120 s")
    assert run.merge([rec("passed")], stopped=1)[0] == "crashed"   # a rank died in it
    assert run.merge([rec("errored", "x"), rec("hung", "y")])[0] == "errored"


def test_the_table_shows_the_exceptions_own_line():
    tb = "Traceback (most recent call last):\n  File \"x.py\", line 1\nRuntimeError: barrier timeout\n\nnoise"
    assert run.first_line(tb) == "RuntimeError: barrier timeout"
    assert run.first_line("just a message") == "just a message"


def test_pydists_name_is_gloos_alias_where_the_suite_asks_for_gloo():
    name = BackendName("pydist")
    assert name == "gloo" and name == "pydist" and not name != "gloo" and name != "nccl" and name != "mpi"
    assert name in ["gloo", "nccl"] and name in ("pydist",) and name not in ["nccl", "mpi"]
    assert hash(name) == hash("pydist") and name in {"pydist"}   # the feature tables hold "pydist" itself
    assert name.lower() == "pydist" and type(name.upper()) is str and f"{name}" == "pydist"


def test_the_lists_name_tests_torchs_suite_has():
    names = set(run.all_tests())
    assert len(names) > 250, len(names)   # torch 2.13's DistributedTest._DistTestBase: 285
    subset = run.read_list(os.path.join(SUITE, "subset.txt"))
    assert 20 <= len(subset) and set(subset) <= names, sorted(set(subset) - names)
    excluded = run.read_list(os.path.join(SUITE, "exclusions.txt"))
    assert set(excluded) <= names and all(excluded.values()), excluded   # each with its reason


def test_outside_mpiexec_a_rank_says_so():
    proc = subprocess.run([sys.executable, os.path.join(SUITE, "rank.py"), "--backend", "gloo", "--tests", "x",
                           "--out", "y"], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_"))})
    assert proc.returncode != 0 and "not started by mpiexec" in proc.stderr, proc.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
