"""Every decoder of bytes from outside refuses what is malformed with a Python exception (issue 41).

The bounded set of tests/fuzz_inputs.py (`make test`): a few thousand inputs per decoder, each run in a
child process, so a crash is a failure here rather than the end of the run. Every decoder (the
compressors' payloads, checkpoints, the PYDIST_* settings, timeline files, the launcher's records) must
show no failure at all, and reach both sides: valid inputs decode, malformed ones are refused. The soak is the same fuzzer with
more inputs: python tests/fuzz_inputs.py --seed S --per-decoder 100000.

Then the settings' readers, case by case: a malformed value is a ValueError naming the variable where
it is first read (they used to fall back to a default, wrap a sign, or raise int()'s anonymous error).
"""
import os
import subprocess
import sys

import pytest

from pydist import _C, _env
from pydist.engine import Trainer, mlp
from unit_helpers import subprocess_env

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fuzz_inputs  # noqa: E402

SEED, PER_DECODER = 41, 2000


@pytest.mark.parametrize("decoder", fuzz_inputs.DECODERS)
def test_a_decoder_refuses_malformed_input_with_an_exception(decoder, tmp_path):
    stats = fuzz_inputs.run_decoder(decoder, SEED, PER_DECODER, str(tmp_path))
    examples = "; ".join(f"{kind}: input {i}: {detail[:200]}" for kind, (i, detail, _) in stats.examples.items())
    assert stats.inputs == PER_DECODER, stats.line()
    assert not stats.failures, f"{stats.line()}: {examples}"
    # both sides reached: valid inputs decode, malformed ones are refused
    assert stats.accepted > PER_DECODER // 10 and sum(stats.rejected.values()) > PER_DECODER // 10, stats.line()


@pytest.mark.parametrize("name, value", [("PYDIST_SHM_BYTES", "12x"), ("PYDIST_SHM_STAGE", "-1"),
                                         ("PYDIST_PERSISTENT_BYTES", "99999999999999999999999"),
                                         ("PYDIST_SHM_SMALL_BYTES", " 64"), ("PYDIST_THREAD_LEVEL", "serial"),
                                         ("PYDIST_STALL_WARN", "inf"), ("PYDIST_STALL_WARN", "1e3")])
def test_a_malformed_setting_read_in_c_is_a_value_error_naming_it(name, value, monkeypatch):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"^{name} must be .*got '{value}'"):
        _C.mpi_info()
    monkeypatch.setenv(name, "0" if name != "PYDIST_THREAD_LEVEL" else "serialized")
    assert _C.mpi_info()["settings"][name] == (0 if name != "PYDIST_THREAD_LEVEL" else "serialized")


def test_init_refuses_a_malformed_setting_before_mpi_starts():
    code = ("import pydist as dist\n"
            "try:\n    dist.init_process_group()\nexcept ValueError as e:\n    print('ValueError:', e)\n"
            "print('initialized:', dist.is_initialized())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=subprocess_env(PYDIST_SHM_STAGE="1MiB"))
    assert proc.returncode == 0, proc.stderr
    assert "ValueError: PYDIST_SHM_STAGE must be a byte count" in proc.stdout, proc.stdout + proc.stderr
    assert "initialized: False" in proc.stdout


@pytest.mark.parametrize("name, value", [("PYDIST_WAIT", "spin"), ("PYDIST_DEBUG", "1"), ("PYDIST_SURVIVE", "yes"),
                                         ("PYDIST_BLAS_THREADS", "0"), ("PYDIST_BLAS_THREADS", "+4"),
                                         ("PYDIST_BLAS_THREADS", "\u0663")])
def test_a_malformed_setting_read_in_python_is_a_value_error_naming_it(name, value, monkeypatch):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"^{name} must be"):
        _env.read(name)


def test_the_trainer_reads_its_settings_strictly(monkeypatch):
    monkeypatch.setenv("PYDIST_BLAS_THREADS", "two")   # int() said "invalid literal", naming nothing
    with pytest.raises(ValueError, match="PYDIST_BLAS_THREADS must be a whole number"):
        Trainer(mlp((8,)), batch_size=8)
    monkeypatch.setenv("PYDIST_BLAS_THREADS", "1")
    monkeypatch.setenv("PYDIST_SURVIVE", "true")        # was taken as off
    with pytest.raises(ValueError, match="PYDIST_SURVIVE must be 1"):
        Trainer(mlp((8,)), batch_size=8, strategy="downpour")


def test_import_refuses_a_malformed_wait_mode():
    proc = subprocess.run([sys.executable, "-c", "import pydist"], capture_output=True, text=True, timeout=120,
                          env=subprocess_env(PYDIST_WAIT="MPI_Wait"))
    assert proc.returncode != 0 and "ValueError: PYDIST_WAIT must be mpi" in proc.stderr, proc.stderr
