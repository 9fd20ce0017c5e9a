"""The compressors' vector loops (AVX2 and F16C, csrc/compress/cast16.c and sign.c) give the same bits as
their scalar loops, which PYDIST_SIMD=sse2 selects, over every kind of value: each rounding case,
subnormals of either width, the edge of float16's range, infinities, NaNs with payloads, and lengths
that leave a scalar tail. And both give NumPy's float16 rounding (with saturation) bit for bit.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from pydist import _C

SPECS = ["fp16", "bf16", "sign"]
LENGTHS = [1, 7, 8, 9, 255, 256, 257, 1000, 4099]

RUN = """
import sys
import numpy as np
from pydist import _C
sys.path.insert(0, {here!r})
from test_compression_kernels import outcomes
out = {{}}
for spec in {specs!r}:
    for n in {lengths!r}:
        for key, a in outcomes(spec, n).items():
            out[f"{{spec}}/{{n}}/{{key}}"] = a
np.savez({path!r}, **out)
"""


def values(n, seed, finite=False):
    """n float32 of every kind, in a shuffled order (so every kind lands in the vector part and the tail);
    `finite`: no infinities or NaNs."""
    rng = np.random.default_rng(seed)
    special = np.array([0.0, -0.0, np.inf, -np.inf, 65504.0, -65504.0, 65519.99, 65520.0, -65520.0, 1e6, -3e38,
                        2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -14, 6.0e-8, 1e-45, -1e-45, 1.0 + 2.0 ** -11,
                        1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8], np.float64).astype(np.float32)
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFA5A5A5, 0x7FFFFFFF, 0x7FC01234], np.uint32).view(np.float32)
    normal = (rng.standard_normal(n) * 10.0 ** rng.integers(-9, 6, n)).astype(np.float32)
    ties = (rng.integers(-4096, 4096, n) * 2.0 ** -12 + 2.0 ** -24).astype(np.float32)  # halfway cases
    pool = np.concatenate([special, nans, normal, ties])
    if finite:
        pool = pool[np.isfinite(pool)]
    return rng.permutation(pool)[:n].copy()


def outcomes(spec, n):
    """What one compressor does with n values, twice (the second encode carries the first's residual)."""
    # sign: a chunk holding an infinity or a NaN is poison (its scale is too), and which NaN, of which
    # sign, arithmetic on it gives is the compiler's choice (the ASan build's differs): finite values only
    finite = spec == "sign"
    z = _C.Compressor(spec, n)
    x = values(n, seed=n, finite=finite)
    first = np.frombuffer(z.encode(x), np.uint8).copy()
    residual = z.residual.copy()
    second = np.frombuffer(z.encode(values(n, seed=n + 1, finite=finite)), np.uint8).copy()
    acc = values(n, seed=n + 2, finite=finite)
    z.decode_add(first.tobytes(), acc, 0.37)
    return {"first": first, "residual": residual.view(np.uint32), "second": second,
            "final_residual": z.residual.view(np.uint32).copy(), "decoded": acc.view(np.uint32)}


@pytest.fixture(scope="module")
def scalar(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("kernels") / "scalar.npz")
    code = RUN.format(here=os.path.dirname(os.path.abspath(__file__)), specs=SPECS, lengths=LENGTHS, path=path)
    env = dict(os.environ, PYDIST_SIMD="sse2")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    return dict(np.load(path))


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("spec", SPECS)
def test_vector_and_scalar_loops_give_the_same_bits(spec, n, scalar):
    for key, a in outcomes(spec, n).items():
        b = scalar[f"{spec}/{n}/{key}"]
        assert a.shape == b.shape, f"{spec}, n={n}: {key} has shape {a.shape}, the scalar loop's {b.shape}"
        differ = np.flatnonzero(a != b)
        assert differ.size == 0, (f"{spec}, n={n}: {key} differs from the scalar loop's at {differ[:8]} "
                                  f"({a[differ[:4]]} against {b[differ[:4]]})")


@pytest.mark.parametrize("n", LENGTHS)
def test_fp16_payload_is_numpys_rounding_with_saturation(n):
    x = values(n, seed=n)
    payload = np.frombuffer(_C.Compressor("fp16", n).encode(x), np.uint16)
    with np.errstate(over="ignore", invalid="ignore"):
        xe = x + np.float32(0.0)   # what is encoded: the input plus the (zero) residual: -0.0 is +0.0, NaNs quiet
        want = np.clip(xe, -65504.0, 65504.0).astype(np.float16).view(np.uint16)
    nan = np.isnan(xe)
    assert np.array_equal(payload[~nan], want[~nan])
    # a NaN stays a quiet NaN with its sign and its payload's top bits
    b = xe[nan].view(np.uint32)
    assert np.array_equal(payload[nan], ((b >> 16) & 0x8000) | 0x7E00 | ((b >> 13) & 0x3FF))
