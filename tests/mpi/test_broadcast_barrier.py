"""broadcast from every root and barrier, at every world size."""
import time

import numpy as np
import pytest

import pydist as dist
from helpers import DTYPES, make_input, parallel_assert


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 17, 1 << 20])
def test_broadcast_from_every_root(dtype, n):
    rank, size = dist.get_rank(), dist.get_world_size()
    ok = True
    for root in range(size):
        x = make_input(3, rank, (n,), dtype)
        dist.broadcast(x, src=root)
        ok &= np.array_equal(x, make_input(3, root, (n,), dtype))
    parallel_assert(ok)


def test_broadcast_async_and_readonly_root():
    """The root only reads, so a read-only array is fine there; receivers must be writeable."""
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.arange(6.0) if rank == 0 else np.zeros(6)
    if rank == 0:
        x.flags.writeable = False
    w = dist.broadcast(x, src=0, async_op=True)
    assert w.wait() is True
    parallel_assert(np.array_equal(x, np.arange(6.0)))


def test_barrier_really_waits():
    """The last rank arrives 1 s late; nobody may leave the barrier before it arrives. (The ranks
    leave the first barrier up to some tenths of a second apart on a busy machine: the margin
    between the 1 s and the 0.25 s checked keeps that from failing the test.)"""
    rank, size = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    start = time.monotonic()
    if rank == size - 1:
        time.sleep(1.0)
    dist.barrier()
    waited = time.monotonic() - start
    parallel_assert(waited >= 0.25 or size == 1 or rank == size - 1, f"left after {waited:.3f} s")
    w = dist.barrier(async_op=True)
    parallel_assert(w.wait() is True)
