"""float16: MPI has no half type, so pydist moves it as 16-bit words and reduces with its own
half <-> float conversion (csrc/core/dtypes.c). At world size 1, AVG runs that conversion on every element
(half -> float, divide by 1, round back to half), so it must give NumPy's x / 1 bit for bit: the
input itself for every value but signalling NaNs, which come back quiet, as in NumPy.
"""
import numpy as np
import pytest

import pydist as dist
from pydist import _C

ReduceOp = dist.ReduceOp
F16_OPS = [ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX]
F16_INVALID = [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]

# Named bit patterns
SPECIAL = {
    "+0": 0x0000, "-0": 0x8000,
    "min subnormal": 0x0001, "-min subnormal": 0x8001, "max subnormal": 0x03FF, "-max subnormal": 0x83FF,
    "mid subnormal": 0x0155, "min normal": 0x0400, "-min normal": 0x8400,
    "max": 0x7BFF, "-max": 0xFBFF, "one": 0x3C00, "-one": 0xBC00, "one+ulp": 0x3C01,
    "+inf": 0x7C00, "-inf": 0xFC00,
    "qnan": 0x7E00, "-qnan": 0xFE00, "qnan payload": 0x7E5A, "-qnan payload": 0xFFFF,
}
# Values that float16 can only round to: their float16 nearest is what travels
ROUNDED = [0.1, 1 / 3, 2049.0, 65519.0, 3.14159265, 1e-5, 6.1e-5, -0.2, 1e-7, 5.96e-8, 2.98e-8]


def bits(a):
    return a.view(np.uint16)


def is_snan(b):
    """float16 signalling NaN: exponent all ones, mantissa non-zero with its top bit clear."""
    return ((b & 0x7C00) == 0x7C00) & ((b & 0x03FF) != 0) & ((b & 0x0200) == 0)


def all_halves():
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).copy()


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_avg_every_bit_pattern_is_numpy_x_over_one(async_op):
    x = all_halves()
    src = bits(x).copy()
    with np.errstate(invalid="ignore"):
        want = bits(x / np.float16(1)).copy()
    w = dist.all_reduce(x, op=ReduceOp.AVG, async_op=async_op)
    if async_op:
        assert w.wait() is True
    got = bits(x)
    snan = is_snan(src)
    # every value that is not a signalling NaN comes back as it went: bit for bit
    keep = ~snan
    bad = np.nonzero(got[keep] != src[keep])[0]
    assert bad.size == 0, [(hex(src[keep][i]), hex(got[keep][i])) for i in bad[:10]]
    # and NumPy agrees on every one of the 65,536 patterns, signalling NaNs included
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, [(hex(src[i]), hex(got[i]), hex(want[i])) for i in bad[:10]]
    # a signalling NaN stays a NaN of the same sign
    assert np.all(np.isnan(x[snan]))
    assert np.array_equal(got[snan] & 0x8000, src[snan] & 0x8000)


@pytest.mark.parametrize("name", list(SPECIAL))
@pytest.mark.parametrize("op", F16_OPS, ids=lambda o: o.name)
def test_special_values_every_op(op, name):
    x = np.array([SPECIAL[name]] * 3, dtype=np.uint16).view(np.float16)
    before = bits(x).copy()
    dist.all_reduce(x, op=op)
    assert np.array_equal(bits(x), before), (name, hex(before[0]), hex(bits(x)[0]))


@pytest.mark.parametrize("op", F16_OPS, ids=lambda o: o.name)
def test_mixed_values_every_op(op):
    specials = np.array(list(SPECIAL.values()), dtype=np.uint16).view(np.float16)
    with np.errstate(over="ignore"):  # the ends of the range overflow to +-inf, on purpose
        ramp = np.linspace(-70000, 70000, 257).astype(np.float16)
    x = np.concatenate([specials, np.array(ROUNDED, dtype=np.float16), ramp])
    before = bits(x).copy()
    w = dist.all_reduce(x, op=op, async_op=True)
    assert w.wait() is True
    assert np.array_equal(bits(x), before)


@pytest.mark.parametrize("value", ROUNDED)
def test_rounded_values_are_identity(value):
    x = np.array([value, -value], dtype=np.float16)  # NumPy's rounding to half
    before = bits(x).copy()
    assert float(x[0]) != value  # none of them fits a half exactly
    for op in F16_OPS:
        dist.all_reduce(x, op=op)
        assert np.array_equal(bits(x), before), (value, op.name, hex(before[0]), hex(bits(x)[0]))


def test_negative_zero_keeps_its_sign():
    x = np.array([-0.0, 0.0, -0.0], dtype=np.float16)
    for op in F16_OPS:
        dist.all_reduce(x, op=op)
        assert list(bits(x)) == [0x8000, 0x0000, 0x8000], op.name
        assert np.signbit(x).tolist() == [True, False, True]


def test_subnormals_survive_avg():
    sub = np.arange(1, 0x400, dtype=np.uint16)
    x = np.concatenate([sub, sub | 0x8000]).view(np.float16)
    before = bits(x).copy()
    dist.all_reduce(x, op=ReduceOp.AVG)
    assert np.array_equal(bits(x), before)
    assert np.all(x[:0x3FF] > 0) and np.all(x[0x3FF:] < 0)


def test_extremes_and_inf_nan_avg():
    x = np.array([65504, -65504, np.inf, -np.inf, np.nan, 6.104e-05, 5.96e-08], dtype=np.float16)
    before = bits(x).copy()
    dist.all_reduce(x, op=ReduceOp.AVG)
    assert np.array_equal(bits(x), before)
    assert x[0] == 65504 and np.isposinf(x[2]) and np.isneginf(x[3]) and np.isnan(x[4])


@pytest.mark.parametrize("op", F16_INVALID, ids=lambda o: o.name)
def test_bitwise_ops_are_type_errors(op):
    x = np.ones(4, dtype=np.float16)
    with pytest.raises(TypeError, match=rf"all_reduce\(\): `op` ReduceOp.{op.name} is not defined for dtype float16"):
        dist.all_reduce(x, op=op)
    with pytest.raises(TypeError):
        dist.all_reduce(x, op=op, async_op=True)
    with pytest.raises(TypeError):
        _C.check_op(int(op), np.float16)
    assert np.array_equal(x, np.ones(4, dtype=np.float16))


@pytest.mark.parametrize("op", F16_OPS, ids=lambda o: o.name)
def test_check_op_accepts_float16_ops(op):
    assert _C.check_op(int(op), np.float16) is None
    assert _C.check_op(int(op), "float16") is None
    assert _C.check_op(int(op), np.dtype("<f2")) is None


@pytest.mark.parametrize("shape", [(0,), (), (1,), (7, 3), (2, 0, 5), (4, 4, 4)], ids=str)
def test_shapes(shape):
    rng = np.random.default_rng(5)
    x = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
    x[is_snan(x)] |= 0x0200  # keep to quiet NaNs: the identity must hold everywhere
    x = x.view(np.float16)
    before = bits(x).copy()
    for op in F16_OPS:
        dist.all_reduce(x, op=op)
    assert bits(x).shape == before.shape and np.array_equal(bits(x), before)


def test_large_array_avg():
    rng = np.random.default_rng(6)
    raw = rng.integers(0, 1 << 16, size=3_000_001, dtype=np.uint16)
    raw[is_snan(raw)] |= 0x0200
    x = raw.copy().view(np.float16)
    dist.all_reduce(x, op=ReduceOp.AVG)
    assert np.array_equal(bits(x), raw)


def test_broadcast_float16_untouched():
    x = all_halves()
    before = bits(x).copy()
    dist.broadcast(x, src=0)
    assert np.array_equal(bits(x), before)  # signalling NaNs too: broadcast only moves words


def test_torch_float16_avg():
    import torch
    t = torch.tensor([0.1, -0.0, 65504.0, 6e-8, float("inf"), -3.5], dtype=torch.float16)
    before = t.view(torch.int16).clone()
    dist.all_reduce(t, op=ReduceOp.AVG)
    assert torch.equal(t.view(torch.int16), before)
    dist.all_reduce(t, op=ReduceOp.MIN, async_op=True).wait()
    assert torch.equal(t.view(torch.int16), before)
