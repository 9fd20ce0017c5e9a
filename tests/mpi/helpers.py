"""Helpers for multi-rank tests: independent NumPy references and assertions all ranks agree on.

Rank r's input is make_input(seed, r, shape, dtype), so every rank can rebuild every other rank's
input and compute the expected result locally, with NumPy and no communication (mpi4py's and
STYLE.md's way): a wrong result cannot hide behind the thing being tested.
"""
import zlib

import numpy as np

import pydist as dist

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]
OPS = list(dist.ReduceOp)


def valid(op, dtype):
    """Whether pydist defines `op` for `dtype`, read from the C library's own table."""
    try:
        dist._C.check_op(int(op), np.dtype(dtype))
        return True
    except TypeError:
        return False


def make_input(seed, rank, shape, dtype, op=None):
    """Deterministic input of rank `rank`. Values are small integers, so that sums and products over
    4 ranks are exact in every dtype (float16 included) and do not overflow int8; for PRODUCT they are
    in [-2, 2] (unsigned: [0, 3]) so that 4 factors stay exact too."""
    salt = zlib.crc32(f"{seed}:{rank}:{dtype}:{shape}".encode())
    rng = np.random.default_rng(salt)
    dt = np.dtype(dtype)
    small = op in (dist.ReduceOp.PRODUCT,)
    if dt.kind == "b":
        out = rng.integers(0, 2, size=shape)
    elif dt.kind == "u":
        out = rng.integers(0, 4 if small else 60, size=shape)
    else:
        lo, hi = (-2, 3) if small else (-30, 31)
        out = rng.integers(lo, hi, size=shape)
        if dt.kind == "c":
            out = out + 1j * rng.integers(lo, hi, size=shape)
    return np.asarray(out).astype(dt)   # np.asarray: a 0-d array, never a NumPy scalar, for shape ()


def reference(op, inputs):
    """The expected reduction of `inputs` (one array per rank), computed with NumPy."""
    dt = inputs[0].dtype
    stack = np.stack(inputs)
    if op == dist.ReduceOp.SUM:
        return np.add.reduce(stack, axis=0, dtype=dt)
    if op == dist.ReduceOp.AVG:
        total = np.add.reduce(stack, axis=0, dtype=dt)
        if dt.kind == "c":   # componentwise, as torch divides by a real count (not complex division)
            out = np.empty_like(total)
            out.real, out.imag = total.real / len(inputs), total.imag / len(inputs)
            return out
        return (total / dt.type(len(inputs))).astype(dt)
    if op == dist.ReduceOp.PRODUCT:
        return np.multiply.reduce(stack, axis=0, dtype=dt)
    if op == dist.ReduceOp.MIN:
        return np.minimum.reduce(stack, axis=0)
    if op == dist.ReduceOp.MAX:
        return np.maximum.reduce(stack, axis=0)
    if op == dist.ReduceOp.BAND:
        return np.bitwise_and.reduce(stack, axis=0)
    if op == dist.ReduceOp.BOR:
        return np.bitwise_or.reduce(stack, axis=0)
    if op == dist.ReduceOp.BXOR:
        return np.bitwise_xor.reduce(stack, axis=0)
    raise AssertionError(f"no reference for {op}")


def parallel_assert(ok, message="", group=None):
    """Assert `ok` on every rank at once: all ranks raise together, naming the ranks where it failed.

    Without this, one rank would fail alone and the others would wait for it in the next collective.
    """
    size = dist.get_world_size(group)
    flags = np.zeros(size, np.int32)
    flags[dist.get_rank(group)] = 0 if ok else 1
    dist.all_reduce(flags, group=group)
    failed = np.flatnonzero(flags).tolist()
    if failed:
        raise AssertionError(f"failed on rank(s) {failed} of {size}" + (f": {message}" if message and not ok
                                                                         else ""))


def max_diff(a, b):
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a.astype(np.complex128) - b.astype(np.complex128))))
