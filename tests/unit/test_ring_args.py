"""all_reduce(algorithm=...) at world size 1: the argument checks, and the ring of one rank (no
messages at all) doing what MPI's all-reduce does, for every dtype x op of the C table."""
import numpy as np
import pytest

import pydist as dist
from pydist import _C
from unit_helpers import ALL_PAIRS, assert_same_bits, is_valid, make_values

ReduceOp = dist.ReduceOp


@pytest.mark.parametrize("dtype, op", ALL_PAIRS)
def test_ring_of_one_rank_equals_mpi(dtype, op):
    x = make_values(dtype)
    y = x.copy()
    if not is_valid(dtype, op):
        with pytest.raises(TypeError, match=r"all_reduce\(\): .*not defined for dtype"):
            dist.all_reduce(x, op=op, algorithm="ring")
        return
    dist.all_reduce(x, op=op, algorithm="ring")
    dist.all_reduce(y, op=op, algorithm="mpi")
    assert_same_bits(x, y)


@pytest.mark.parametrize("n", [0, 1, 5])
def test_ring_of_one_rank_async(n):
    x = np.arange(n, dtype=np.float32) * 3
    w = dist.all_reduce(x, op=ReduceOp.AVG, async_op=True, algorithm="ring")
    assert w.wait() is True and w.is_completed() and w.is_success() and w.exception() is None
    assert w.result()[0] is x
    assert np.array_equal(x, np.arange(n, dtype=np.float32) * 3)


@pytest.mark.parametrize("bad", ["Ring", "nccl", "", "ring "])
def test_unknown_algorithm_is_a_value_error(bad):
    with pytest.raises(ValueError, match=r"all_reduce\(\): `algorithm` must be None, \"mpi\", \"ring\" or \"shm\"; got "
                       + repr(bad).replace("'", "'")):
        dist.all_reduce(np.zeros(2), algorithm=bad)


@pytest.mark.parametrize("bad", [1, b"ring", ["ring"], True])
def test_non_str_algorithm_is_a_type_error(bad):
    with pytest.raises(TypeError, match=r"all_reduce\(\): `algorithm` must be None, \"mpi\", \"ring\" or \"shm\"; got "
                       + type(bad).__name__):
        dist.all_reduce(np.zeros(2), algorithm=bad)


def test_algorithm_is_keyword_only():
    with pytest.raises(TypeError, match="positional"):
        dist.all_reduce(np.zeros(2), ReduceOp.SUM, None, False, "ring")


def test_ring_validates_the_array_as_mpi_does():
    with pytest.raises(ValueError, match=r"all_reduce\(\): `tensor` must be C-contiguous"):
        dist.all_reduce(np.zeros((4, 4))[:, ::2], algorithm="ring")
    ro = np.zeros(3)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"all_reduce\(\): `tensor`"):
        dist.all_reduce(ro, algorithm="ring")
    with pytest.raises(ValueError, match=r"all_reduce\(\): `op` must be a ReduceOp"):
        dist.all_reduce(np.zeros(3), op=99, algorithm="ring")


def test_c_level_algorithm_code_is_checked():
    with pytest.raises(ValueError, match=r"all_reduce\(\): `algorithm` must be 0 \(MPI\), 1 \(ring\), 2 \(shm\) or 3 \(automatic\); got 7"):
        _C.all_reduce(np.zeros(2), 0, 0, False, 7)
    with pytest.raises(TypeError, match="algorithm"):
        _C.all_reduce(np.zeros(2), 0, 0, False, "ring")


def test_ring_validate_only_sends_nothing():
    """PYDIST_DEBUG=DETAIL's first pass: checks only, the array untouched, no private communicator made."""
    x = np.ones(3)
    before = _C.live_groups()
    old = _C.set_validate_only(True)
    try:
        assert _C.all_reduce(x, 1, 0, False, 1) is None   # AVG would change nothing; SUM of one rank neither
        with pytest.raises(TypeError, match="not defined for dtype"):
            _C.all_reduce(np.zeros(2), int(ReduceOp.BXOR), 0, False, 1)
    finally:
        _C.set_validate_only(old)
    assert _C.live_groups() == before
