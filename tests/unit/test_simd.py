"""PYDIST_SIMD: one cap for every vector kernel (csrc/core/simd.h). Each level this CPU runs is taken and
reported; a level it lacks, or a name that is no level, is refused with a clear error at import; and the
levels agree on LeNet-5's gradients within float32 rounding, while each level repeats its own bits.

The engine's and the reductions' own tests run again under each cap in scripts/test.sh ("every
instruction-set level"), so a wrong or missing build fails there against the independent references.
"""
import os
import pickle
import re
import subprocess
import sys

import numpy as np

from unit_helpers import SIMD_LEVELS, simd_levels, subprocess_env


def run_python(code, simd, timeout=120):
    env = subprocess_env()
    env.pop("OPENBLAS_CORETYPE", None)   # pydist's own cap on the BLAS is part of what is tested
    env.pop("PYDIST_SIMD", None)
    if simd is not None:
        env["PYDIST_SIMD"] = simd
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=timeout)


def test_each_level_this_cpu_runs_is_taken_and_reported():
    from pydist import _C
    cpu = _C.simd_info()["cpu"]
    assert cpu in SIMD_LEVELS
    # the level is fixed at import: a PYDIST_SIMD set afterwards changes nothing
    code = ("import os, pydist, pydist.__main__ as m; from pydist import _C; os.environ['PYDIST_SIMD'] = 'sse2'; "
            "print(_C.simd_info()['level'], _C.blas_core()); print(m.version())")
    for simd in simd_levels() + (None,):
        proc = run_python(code, simd)
        assert proc.returncode == 0, proc.stderr.decode()
        first, version = proc.stdout.decode().split("\n", 1)
        level, blas = first.split()
        assert level == (simd or cpu), (simd, level)
        assert f"vector kernels: {level} (" in version, version
        if simd == "sse2":
            assert blas.upper() == "PRESCOTT", blas   # the BLAS is capped with pydist's kernels


def test_a_level_this_cpu_lacks_or_no_level_is_refused_at_import():
    cpu = simd_levels()[-1]
    cases = [("avx1024", "PYDIST_SIMD must be sse2, avx2 or avx512"), ("AVX2", "PYDIST_SIMD must be")]
    cases += [(level, f"this CPU runs at most {cpu}") for level in SIMD_LEVELS[len(simd_levels()):]]
    for simd, message in cases:
        proc = run_python("import pydist", simd)
        err = proc.stderr.decode()
        assert proc.returncode == 1 and "ValueError" in err and message in err, (simd, err)
        assert "Segmentation" not in err and "Illegal instruction" not in err


LEVELS_SCRIPT = r"""
import pickle, sys
import numpy as np
from pydist import _C
from pydist.engine import lenet5
model = lenet5()
out = []
for B in (1, 5, 64):   # 5: a batch whose tiles and chunks do not divide evenly
    e = _C.Engine(model.specs(), model.input_shape, B)
    e.init_params(3)
    rng = np.random.default_rng(B)
    x = rng.random((B, 28 * 28), dtype=np.float32)
    y = rng.integers(0, 10, B).astype(np.int32)
    runs = []
    for _ in range(2):
        loss, _ = e.loss_and_grad(x, y)
        runs.append((loss, e.forward(x).copy(), e.grads.copy()))
    out.append(runs)
sys.stdout.buffer.write(pickle.dumps(out))
"""


def test_levels_agree_on_lenet5_and_each_repeats_its_bits():
    results = {}
    for simd in simd_levels():
        proc = run_python(LEVELS_SCRIPT, simd, timeout=300)
        assert proc.returncode == 0, proc.stderr.decode()
        results[simd] = pickle.loads(proc.stdout)
    widest = results[simd_levels()[-1]]
    for simd, batches in results.items():
        for (first, again), (ref, _) in zip(batches, widest):
            # bitwise repeatable on one level
            assert first[0] == again[0] and first[1].tobytes() == again[1].tobytes(), simd
            assert first[2].tobytes() == again[2].tobytes(), simd
            # within float32 rounding of the widest level (the levels' sums differ in their last bits)
            assert abs(first[0] - ref[0]) < 1e-5 * max(1.0, abs(ref[0])), (simd, first[0], ref[0])
            np.testing.assert_allclose(first[1], ref[1], rtol=1e-4, atol=1e-5, err_msg=simd)
            scale = np.abs(ref[2]).max()
            assert scale > 0
            diff = np.abs(first[2] - ref[2]).max()
            print(f"{simd}: batch {len(first[1])}: max gradient difference from the widest level {diff:.2e} "
                  f"(largest gradient {scale:.2e})")
            assert diff <= 1e-4 * scale, (simd, diff, scale)


def test_no_kernel_spills_its_registers_at_any_level():
    # The direct convolutions' tiles are sized to each level's register file; a tile that outgrows it
    # (as the 16-float tiles did in AVX2's 16 registers: LeNet-5 at 2.8% of the core's peak) shows as
    # stack traffic in a multiply-add loop. Read from the compiler's output for every level, AVX-512's
    # too, whatever this CPU runs.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, os.path.join(root, "scripts", "check_spills.py")], cwd=root,
                          capture_output=True, text=True, timeout=600)
    print(proc.stdout[-2000:])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for level in SIMD_LEVELS:
        assert f"{level:7} forward_tiles" in proc.stdout, level   # each level's loops were read


CONV_SOURCES = ["tests/c/conv_levels.c", "tests/c/conv_wide.c", "csrc/engine/conv_direct.c", "csrc/core/simd.c",
                "csrc/engine/conv_direct_sse2.c", "csrc/engine/conv_direct_avx2.c", "csrc/engine/conv_direct_avx512.c"]


def test_every_convolution_build_against_a_double_reference(tmp_path):
    # tests/c/conv_levels.c: each build of the direct convolutions this CPU runs, and the AVX-512 build's
    # 16-lane tiles compiled for AVX2 (so their logic is checked without AVX-512), against a plain
    # double-precision convolution on shapes that reach every tile, block and kernel size; under
    # AddressSanitizer, so a tile that reads or writes past its buffers fails too.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    exe = str(tmp_path / "conv_levels")
    flags = ["-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer"]
    subprocess.run(["gcc", *flags, "-std=c11", "-D_GNU_SOURCE", "-Icsrc", "-o", exe, *CONV_SOURCES, "-lm"],
                   cwd=root, check=True, timeout=600)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}   # its own ASan runtime, not Python's
    proc = subprocess.run([exe], capture_output=True, text=True, timeout=300, env=env)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for level in simd_levels():
        assert re.search(rf"^{level} +worst relative error", proc.stdout, re.M), proc.stdout
    if "avx2" in simd_levels():
        assert re.search(r"^avx512 tiles on avx2 +worst relative error", proc.stdout, re.M), proc.stdout
