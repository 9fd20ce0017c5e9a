"""Helpers shared by the tests in tests/unit (imported by name; conftest.py holds the fixtures)."""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import pydist as dist
from pydist import _C, _libraries

# The launcher of the MPICH pydist runs on (Debian's mpiexec.mpich, or the mpich package's own)
MPIEXEC = shutil.which(_libraries.mpiexec())


# Every dtype the contract lists, in DESIGN.md's order.
DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
          np.float16, np.float32, np.float64, np.complex64, np.complex128]
DTYPE_IDS = [np.dtype(d).name for d in DTYPES]


def init_default():
    """The session's default group: what every test may assume is there."""
    dist.init_process_group(backend="mpi")


def reset_group():
    if dist.is_initialized():
        dist.destroy_process_group()
    init_default()


def make_values(dtype, n=23, seed=0):
    """Values of `dtype` that cover the edges: extremes, signed zeros, inf and nan where they exist."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        out = rng.integers(0, 2, n).astype(dt)
        out[:2] = [False, True]
        return out
    if dt.kind in "iu":
        info = np.iinfo(dt)
        out = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        out[:3] = [info.min, info.max, 0]
        return out
    if dt.kind == "f":
        fi = np.finfo(dt)
        out = (rng.standard_normal(n) * 100).astype(dt)
        out[:9] = [0.0, -0.0, np.inf, -np.inf, np.nan, fi.max, -fi.max, fi.tiny, fi.smallest_subnormal]
        return out
    if dt.kind == "c":
        part = np.finfo(dt).dtype
        re = (rng.standard_normal(n) * 100).astype(part)
        im = (rng.standard_normal(n) * 100).astype(part)
        out = (re + 1j * im).astype(dt)
        out[0] = 0
        out[1] = complex(np.finfo(part).max, -np.finfo(part).tiny)
        return out
    raise AssertionError(f"no values for {dt}")


def assert_same_bits(got, want):
    """Equal dtype, shape and bytes: nan payloads and signed zeros included."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.tobytes() == want.tobytes(), f"\n got  {got!r}\n want {want!r}"


def assert_group_works():
    """The default group still reduces correctly (used after every error case)."""
    assert dist.is_initialized()
    x = np.array([1.5, -2.0, 3.25])
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    np.testing.assert_array_equal(x, [1.5, -2.0, 3.25])
    y = np.array([7, -3], dtype=np.int32)
    w = dist.all_reduce(y, op=dist.ReduceOp.MAX, async_op=True)
    assert w.wait() is True
    np.testing.assert_array_equal(y, [7, -3])
    assert dist.get_rank() == 0 and dist.get_world_size() == 1


# Variables a launcher sets: a child interpreter must not inherit them, or it is not a singleton.
LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPIR_", "SLURM_", "MPI_LOCAL")
SUBPROCESS_TIMEOUT_S = 60


SIMD_LEVELS = ("sse2", "avx2", "avx512")   # csrc/core/simd.h, narrowest first


def simd_levels():
    """The instruction-set levels this CPU runs (PYDIST_SIMD's values it accepts), narrowest first."""
    from pydist import _C
    return SIMD_LEVELS[:SIMD_LEVELS.index(_C.simd_info()["cpu"]) + 1]


def subprocess_env(**extra):
    """Environment for a fresh singleton interpreter that imports the same pydist as this one
    (the in-place build, an installed one, or the AddressSanitizer build scripts/test.sh points to)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(dist.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg_parent] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["UCX_ERROR_SIGNALS"] = ""
    preload = env.get("LD_PRELOAD", "")
    if "libasan" in preload and "libstdc++" not in preload:
        # scripts/test.sh preloads AddressSanitizer's runtime alone; its __cxa_throw interceptor then
        # finds no C++ runtime and aborts the first time a C++ library (torch) throws, even an
        # exception that library catches itself. Loading libstdc++ right after it fixes that.
        env["LD_PRELOAD"] = preload + " libstdc++.so.6"
    env.update(extra)
    return env


def popen_kwargs(**extra_env):
    """Keyword arguments for subprocess: our environment, run from a neutral directory (the working
    directory comes first on a child's sys.path and must not shadow the pydist under test)."""
    return {"env": subprocess_env(**extra_env), "cwd": tempfile.gettempdir(), "text": True}


def run_script(script, **extra_env):
    """Run `script` with `python -c` in a fresh singleton interpreter, with a hard timeout."""
    return subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=SUBPROCESS_TIMEOUT_S,
                          **popen_kwargs(**extra_env))


def is_valid(dtype, op):
    """The C table's answer (pydist._C.check_op), asked at run time, after init_process_group."""
    try:
        _C.check_op(int(op), dtype)
    except TypeError:
        return False
    return True


# Every (dtype, op); which are valid is read from the C table inside each test, not at collection
# (before init_process_group) time.
ALL_PAIRS = [pytest.param(dt, op, id=f"{np.dtype(dt).name}-{op.name}") for dt in DTYPES for op in dist.ReduceOp]


def fit_resumed_at_step_7(trainer, x, y):
    """Train one epoch of 20 steps (x holds 20 batches), then 7 steps of epoch 2 as a resumed run
    would have, then fit() on with progress shown in chunks of 3 steps."""
    trainer.fit(x, y, epochs=1, progress=False)
    trainer.train_steps(x, y, 1, 0, 7)
    trainer.step += 7
    trainer.fit(x, y, epochs=2, progress=True, chunk_steps=3)


def launch_run(args, cwd, program, env, **popen):
    """python -m pydist.run ARGS -- PROGRAM in `cwd`, its reports in cwd/run, output merged (tests of the
    elastic launcher)."""
    cmd = [sys.executable, "-m", "pydist.run", *args, "--run-dir", str(cwd / "run"), "--", *program]
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            **popen)
