"""Bad input on some ranks, at every world size: the error is raised before anything is sent, so
the other ranks are not left waiting, and the group keeps working."""
import numpy as np
import pytest

import pydist as dist
from helpers import parallel_assert


def _still_works():
    x = np.array([1], np.int64)
    dist.all_reduce(x)
    parallel_assert(x[0] == dist.get_world_size(), "the group stopped working after an argument error")


@pytest.mark.parametrize("bad, exc, words", [
    ([1.0, 2.0], TypeError, "must be a numpy.ndarray"),
    (np.zeros((4, 4))[:, ::2], ValueError, "C-contiguous"),
    (np.zeros(3, dtype=">f8"), ValueError, "native byte order"),
    (np.array(["a"]), TypeError, "unsupported dtype"),
    (np.zeros(3, np.longdouble), TypeError, "unsupported dtype"),
])
def test_bad_array_on_one_rank(bad, exc, words):
    """Only the last rank passes a bad array; everyone else calls nothing. The bad call must fail
    locally, at once, without waiting for anyone."""
    rank, size = dist.get_rank(), dist.get_world_size()
    if rank == size - 1:
        with pytest.raises(exc, match=words) as info:
            dist.all_reduce(bad)
        assert "all_reduce()" in str(info.value) and "`tensor`" in str(info.value)
    _still_works()


def test_read_only_and_bad_op():
    ro = np.zeros(3)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        dist.all_reduce(ro)
    with pytest.raises(TypeError, match="BXOR is not defined for dtype float32"):
        dist.all_reduce(np.zeros(3, np.float32), op=dist.ReduceOp.BXOR)
    with pytest.raises(TypeError, match="MIN is not defined for dtype complex64"):
        dist.all_reduce(np.zeros(3, np.complex64), op=dist.ReduceOp.MIN)
    _still_works()


def test_ranks_out_of_range():
    rank, size = dist.get_rank(), dist.get_world_size()
    for call, arg in ((lambda: dist.send(np.zeros(1), dst=size), "dst"),
                      (lambda: dist.recv(np.zeros(1), src=size + 3), "src"),
                      (lambda: dist.broadcast(np.zeros(1), src=-1), "src"),
                      (lambda: dist.send(np.zeros(1), dst=rank), "dst")):
        with pytest.raises(ValueError, match=f"`{arg}`"):
            call()
    _still_works()
