"""The compressors' vector loops (AVX2 and F16C, csrc/compress/cast16.c and sign.c) give the same bits as
their scalar loops, which PYDIST_SIMD=sse2 selects, over every kind of value: each rounding case,
subnormals of either width, the edge of float16's range, infinities, NaNs with payloads, and lengths
that leave a scalar tail. And both give NumPy's float16 rounding (with saturation) bit for bit.

decode_add refuses, with a ValueError and `out` untouched, every payload that encode could not have
written (issue 41: a top-k index outside the buffer wrote out of bounds), and accepts every one it did.
"""
import os
import struct
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


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("spec", ["fp16", "bf16", "topk:0.3", "topk:1.0", "sign", "powersgd:2"])
def test_every_payload_encode_writes_decodes(spec, n):
    # every kind of value, NaNs and infinities too: the checks must refuse nothing encode writes
    z = _C.Compressor(spec, n, [(0, 1, n)] if spec.startswith("powersgd") else ())
    for seed in range(3):
        out = np.zeros(n, np.float32)
        z.decode_add(z.encode(values(n, seed=seed)), out)


def refused(z, payload, match):
    out = np.arange(z.residual.size, dtype=np.float32)
    before = out.copy()
    with pytest.raises(ValueError, match=match):
        z.decode_add(payload, out)
    assert np.array_equal(out, before), "a refused payload changed `out`"


def test_topk_indices_outside_or_out_of_order_are_refused():
    z = _C.Compressor("topk:0.25", 8)   # 2 (index, value) pairs
    pairs = lambda i, j: struct.pack("<2i2f", i, j, 1.0, 2.0)  # noqa: E731
    refused(z, pairs(2**30, 5), r"pair 0 has index 1073741824, outside \[0, 8\)")   # the 16 bytes
    refused(z, pairs(1, 8), r"pair 1 has index 8, outside")
    refused(z, pairs(-1, 3), r"pair 0 has index -1, outside")
    refused(z, pairs(1, -2**31), r"pair 1 has index -2147483648, outside")
    refused(z, pairs(3, 3), r"pair 1 has index 3 after 3: the indices must increase")
    refused(z, pairs(5, 2), r"pair 1 has index 2 after 5")
    out = np.zeros(8, np.float32)
    z.decode_add(pairs(0, 7), out, 0.5)
    assert out.tolist() == [0.5, 0, 0, 0, 0, 0, 0, 1.0]


def test_sign_scales_and_unused_bits_are_checked():
    z = _C.Compressor("sign", 9)   # one scale, then 2 bytes of bits (7 unused)
    payload = lambda scale_bits, b0=0, b1=0: struct.pack("<I2B", scale_bits, b0, b1)  # noqa: E731
    for bits in (0xBF800000, 0x80000000, 0xFFC00000, 0xFF800000):   # -1, -0.0, a negative NaN, -inf
        refused(z, payload(bits), "never negative")
    refused(z, payload(0x7FC00001), "a NaN only as the quiet NaN")
    refused(z, payload(0x3F800000, 0, 2), "bits set past its last entry")
    for bits in (0x00000000, 0x3F800000, 0x7F800000, 0x7FC00000):   # 0, 1, inf, the NaN encode writes
        z.decode_add(payload(bits, 0xFF, 1), np.zeros(9, np.float32))
    refused(_C.Compressor("sign", 600), struct.pack("<3f", 1.0, 1.0, -2.0) + bytes(75), "sign chunk 2 has scale -2")


def test_lengths_and_scales_are_checked_for_every_compressor():
    for spec in ("none", "fp16", "bf16", "topk:0.5", "sign", "powersgd:1"):
        z = _C.Compressor(spec, 16, [(0, 4, 4)])
        good = z.encode(np.ones(16, np.float32))
        for bad in (good[:-1], good + b"\0", b""):
            refused(z, bad, "bytes encode")
        for scale in (float("nan"), float("inf"), 1e39):
            with pytest.raises(ValueError, match="scale"):
                z.decode_add(good, np.zeros(16, np.float32), scale)
