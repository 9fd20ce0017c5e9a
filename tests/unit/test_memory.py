"""Leak checks in the style of bottleneck's: many calls, then the process's resident memory, the
number of live Python allocations and the arrays' reference counts must not have grown.

20,000 calls that each leaked one small object would add 20,000 Python blocks (checked with
sys.getallocatedblocks, which sees every leaked object however small); one that leaked a buffer or
an array would add megabytes of RSS.
"""
import gc
import os
import sys

import numpy as np
import pytest

import pydist as dist
from pydist import _C

ReduceOp = dist.ReduceOp

N = 20_000
RSS_SLACK = 4 << 20       # bytes
BLOCKS_SLACK = 2_000      # Python allocations (caches, interned strings)


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def check_no_leak(step, n=N):
    """Run step() n times after a warm-up; RSS and Python's allocated blocks must stay flat."""
    for _ in range(200):
        step()
    gc.collect()
    rss0, blocks0 = rss_bytes(), sys.getallocatedblocks()
    for _ in range(n):
        step()
    gc.collect()
    rss1, blocks1 = rss_bytes(), sys.getallocatedblocks()
    assert rss1 - rss0 < RSS_SLACK, f"RSS grew by {(rss1 - rss0) / 1e6:.1f} MB over {n} calls"
    assert blocks1 - blocks0 < BLOCKS_SLACK, f"{blocks1 - blocks0} Python blocks left over {n} calls"


@pytest.fixture
def arr():
    a = np.arange(1024, dtype=np.float32)
    yield a
    np.testing.assert_array_equal(a, np.arange(1024, dtype=np.float32))


def refcount_stays(a, step, n=2000):
    before = sys.getrefcount(a)
    for _ in range(n):
        step()
    gc.collect()
    assert sys.getrefcount(a) == before, (before, sys.getrefcount(a))


def test_all_reduce_sync(arr):
    check_no_leak(lambda: dist.all_reduce(arr))
    refcount_stays(arr, lambda: dist.all_reduce(arr))


def test_all_reduce_avg_float16():
    a = np.linspace(-3, 3, 4096).astype(np.float16)
    before = a.copy()
    check_no_leak(lambda: dist.all_reduce(a, op=ReduceOp.AVG))
    refcount_stays(a, lambda: dist.all_reduce(a, op=ReduceOp.AVG))
    assert a.tobytes() == before.tobytes()


def test_all_reduce_async_wait(arr):
    def step():
        w = dist.all_reduce(arr, op=ReduceOp.MAX, async_op=True)
        w.wait()
    check_no_leak(step)
    refcount_stays(arr, step)


def test_all_reduce_async_avg_wait_and_result(arr):
    def step():
        w = dist.all_reduce(arr, op=ReduceOp.AVG, async_op=True)
        w.wait()
        assert w.result()[0] is arr
        w.is_completed()
        repr(w)
    check_no_leak(step)
    refcount_stays(arr, step)


def test_work_holds_the_array_until_it_is_gone(arr):
    before = sys.getrefcount(arr)
    w = dist.all_reduce(arr, async_op=True)
    assert sys.getrefcount(arr) > before
    w.wait()
    del w
    assert sys.getrefcount(arr) == before


def test_broadcast_and_barrier(arr):
    def step():
        dist.broadcast(arr, src=0)
        dist.broadcast(arr, src=0, async_op=True).wait()
        dist.barrier()
    check_no_leak(step, n=N // 2)
    refcount_stays(arr, step)


def test_bad_op_for_dtype_raising_type_error(arr):
    def step():
        try:
            dist.all_reduce(arr, op=ReduceOp.BXOR)
        except TypeError:
            pass
        else:
            raise AssertionError("BXOR on float32 did not raise")
    check_no_leak(step)
    refcount_stays(arr, step)


def test_failing_argument_checks():
    nc = np.zeros((8, 8))[:, ::2]
    ro = np.zeros(8)
    ro.flags.writeable = False
    swapped = np.zeros(8, dtype=">f8")
    obj = np.zeros(8, dtype=object)
    lst = [1.0, 2.0]

    def step():
        for bad, exc in ((nc, ValueError), (ro, ValueError), (swapped, ValueError), (obj, TypeError),
                         (lst, TypeError)):
            try:
                dist.all_reduce(bad)
            except exc:
                pass
            else:
                raise AssertionError(f"{bad!r} did not raise")
        try:
            dist.all_reduce(ro, op=42)
        except ValueError:
            pass
        try:
            dist.send(nc, dst=0)
        except ValueError:
            pass
        try:
            dist.broadcast(nc, src=5)
        except ValueError:
            pass
    check_no_leak(step, n=N // 4)
    for a in (nc, ro, swapped, obj, lst):
        refcount_stays(a, step, n=500)


def test_torch_tensor():
    import torch
    t = torch.arange(256, dtype=torch.float32)
    base = sys.getrefcount(t)

    def step():
        dist.all_reduce(t)
        dist.all_reduce(t, op=ReduceOp.AVG, async_op=True).wait()
    check_no_leak(step, n=N // 2)
    gc.collect()
    assert sys.getrefcount(t) == base
    assert torch.equal(t, torch.arange(256, dtype=torch.float32))


def test_torch_tensor_failing():
    import torch
    t = torch.zeros(4, 4).t()
    b = torch.zeros(4, dtype=torch.bfloat16)
    base_t, base_b = sys.getrefcount(t), sys.getrefcount(b)

    def step():
        for bad, exc in ((t, ValueError), (b, TypeError)):
            try:
                dist.all_reduce(bad)
            except exc:
                pass
    check_no_leak(step, n=N // 4)
    gc.collect()
    assert (sys.getrefcount(t), sys.getrefcount(b)) == (base_t, base_b)


def test_queries_and_check_op():
    def step():
        dist.get_rank()
        dist.get_world_size()
        dist.is_initialized()
        _C.check_op(0, np.float16)
        try:
            _C.check_op(7, np.float16)
        except TypeError:
            pass
    check_no_leak(step)


def peak_rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


def test_large_buffer_is_not_copied():
    # 64 MiB reduced in place: a temporary copy would raise the peak RSS by 64 MiB
    a = np.ones(16 << 20, dtype=np.float32)
    a += 0  # touch every page
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current RSS
    rss0 = rss_bytes()
    assert peak_rss_bytes() - rss0 < 4 << 20
    for _ in range(3):
        dist.all_reduce(a, op=ReduceOp.AVG)
        dist.all_reduce(a, async_op=True).wait()
        dist.broadcast(a, src=0)
    assert peak_rss_bytes() - rss0 < 16 << 20, f"peak RSS rose by {(peak_rss_bytes() - rss0) / 1e6:.0f} MB"
    assert a[0] == 1.0 and a[-1] == 1.0
