"""Process groups: every kind of subset, group= on every call (roots are global ranks, as in torch),
non-members, rank translation, and create/destroy without leaking communicators."""
import datetime

import numpy as np
import pytest

import pydist as dist
from helpers import make_input, parallel_assert


def subsets(size):
    """Singletons, everything, evens, odds, the last two, and a non-contiguous pair."""
    out = [[r] for r in range(size)] + [list(range(size)), list(range(0, size, 2)), list(range(1, size, 2)),
                                        list(range(max(0, size - 2), size))]
    if size >= 3:
        out.append([0, size - 1])
    return [s for i, s in enumerate(out) if s and s not in out[:i]]


@pytest.mark.parametrize("which", range(9))
def test_every_collective_on_a_subgroup(which):
    rank, size = dist.get_rank(), dist.get_world_size()
    groups = subsets(size)
    if which >= len(groups):
        parallel_assert(True)
        return
    members = groups[which]
    g = dist.new_group(list(reversed(members)))      # order given does not matter: sorted, as torch
    ok = True
    if rank not in members:
        with pytest.warns(UserWarning, match="does not belong"):
            assert dist.all_reduce(np.zeros(2), group=g) is None
        ok &= dist.get_rank(g) == -1 and dist.get_world_size(g) == -1
    else:
        n = len(members)
        me = members.index(rank)
        ok &= dist.get_rank(g) == me and dist.get_world_size(g) == n
        ok &= dist.get_process_group_ranks(g) == members
        ok &= all(dist.get_global_rank(g, i) == m and dist.get_group_rank(g, m) == i for i, m in enumerate(members))
        inp = {m: make_input(11, m, (5,), "int64") for m in members}
        x = inp[rank].copy()
        dist.all_reduce(x, group=g)
        ok &= np.array_equal(x, sum(inp.values()))
        for root in members:                          # global ranks as roots
            x = inp[rank].copy()
            dist.broadcast(x, src=root, group=g)
            ok &= np.array_equal(x, inp[root])
            x = inp[rank].copy()
            dist.reduce(x, dst=root, group=g)
            if rank == root:
                ok &= np.array_equal(x, sum(inp.values()))
            gl = [np.zeros(5, np.int64) for _ in members] if rank == root else None
            dist.gather(inp[rank], gl, dst=root, group=g)
            if rank == root:
                ok &= all(np.array_equal(gl[i], inp[m]) for i, m in enumerate(members))
            sl = [inp[m] * 7 for m in members] if rank == root else None
            out = np.zeros(5, np.int64)
            dist.scatter(out, sl, src=root, group=g)
            ok &= np.array_equal(out, inp[rank] * 7)
        outs = [np.zeros(5, np.int64) for _ in members]
        dist.all_gather(outs, inp[rank], group=g)
        ok &= all(np.array_equal(outs[i], inp[m]) for i, m in enumerate(members))
        flat = np.zeros(5 * n, np.int64)
        dist.all_gather_into_tensor(flat, inp[rank], group=g)
        ok &= np.array_equal(flat, np.concatenate([inp[m] for m in members]))
        big = {m: make_input(12, m, (3 * n,), "float64") for m in members}
        out = np.zeros(3)
        dist.reduce_scatter_tensor(out, big[rank], group=g)
        ok &= np.array_equal(out, sum(big.values())[3 * me:3 * me + 3])
        out2 = np.zeros(3)
        dist.reduce_scatter(out2, [big[rank][3 * i:3 * i + 3].copy() for i in range(n)], group=g)
        ok &= np.array_equal(out2, out)
        a2a = np.zeros(2 * n)
        dist.all_to_all_single(a2a, np.arange(2 * n, dtype=np.float64) + 100 * rank, group=g)
        ok &= np.array_equal(a2a, np.concatenate([np.arange(2 * me, 2 * me + 2) + 100.0 * m for m in members]))
        lists = [np.zeros(1) for _ in members]
        dist.all_to_all(lists, [np.array([rank * 10.0 + i]) for i in range(n)], group=g)
        ok &= all(lists[i][0] == m * 10.0 + me for i, m in enumerate(members))
        dist.barrier(group=g)
        if n >= 2:                                    # point-to-point with global ranks in a group
            right = members[(me + 1) % n]
            left = members[(me - 1) % n]
            buf = np.zeros(1)
            w = dist.irecv(buf, src=left, group=g)
            dist.send(np.array([float(rank)]), dst=right, group=g)
            w.wait()
            ok &= buf[0] == left and w.source_rank() == left
    dist.destroy_process_group(g)
    parallel_assert(ok)


@pytest.mark.world_size(min=2)
def test_overlapping_groups_alternately_and_async_out_of_order():
    rank, size = dist.get_rank(), dist.get_world_size()
    a = dist.new_group(list(range(size)))
    b = dist.new_group([0, 1])
    ok = True
    for k in range(5):
        x = np.array([rank + k], np.int64)
        wa = dist.all_reduce(x, group=a, async_op=True)
        y = np.array([rank * 10 + k], np.int64)
        wb = dist.all_reduce(y, group=b, async_op=True) if rank in (0, 1) else None
        if wb is not None:
            wb.wait()
            ok &= y[0] == 10 + 2 * k
        wa.wait()
        ok &= x[0] == sum(range(size)) + size * k
    dist.destroy_process_group(a)
    dist.destroy_process_group(b)
    parallel_assert(ok)


def test_groups_created_and_destroyed_many_times_do_not_leak():
    size = dist.get_world_size()
    start = dist._C.live_groups()
    for k in range(200):
        g = dist.new_group([r for r in range(size) if (r + k) % 2 == 0] or [0])
        if dist.get_rank(g) >= 0 and k % 20 == 0:
            x = np.ones(1)
            dist.all_reduce(x, group=g)
        dist.destroy_process_group(g)
        with pytest.raises(ValueError, match="destroyed"):
            dist.barrier(group=g)
    parallel_assert(dist._C.live_groups() == start, f"{dist._C.live_groups()} communicators, started with {start}")


def test_bad_group_arguments():
    size = dist.get_world_size()
    with pytest.raises(ValueError, match="distinct ranks"):
        dist.new_group([0, size])
    with pytest.raises(ValueError, match="distinct ranks"):
        dist.new_group([0, 0])
    with pytest.raises(TypeError, match="list of ints"):
        dist.new_group(["a"])
    with pytest.raises(TypeError, match="ProcessGroup"):
        dist.all_reduce(np.zeros(1), group=3)
    g = dist.new_group([0])
    if dist.get_rank() == 0 and size > 1:   # a root outside the group
        with pytest.raises(ValueError, match="not a member of `group`"):
            dist.broadcast(np.zeros(1), src=size - 1, group=g)
    dist.destroy_process_group(g)
    parallel_assert(True)


@pytest.mark.world_size(min=2)
def test_a_groups_own_timeout_bounds_its_waits_and_not_the_others():
    """new_group(timeout=...) bounds the waits on that group: an irecv on it that nothing matches times
    out after the group's 0.5 s (the session's is a minute) and is cancelled; the world and a group
    without a timeout of its own go on. A collective timing out on such a group, which leaves its
    messages behind: tests/unit/test_faults.py, in a job of its own."""
    import time
    rank, size = dist.get_rank(), dist.get_world_size()
    short = dist.new_group(list(range(size)), timeout=datetime.timedelta(seconds=0.5))
    plain = dist.new_group(list(range(size)))
    ok, msg = True, ""
    if rank == 1:
        work = dist.irecv(np.zeros(1), src=0, group=short)
        t = time.monotonic()
        try:
            work.wait()
            ok, msg = False, "the irecv completed"
        except dist.DistTimeoutError as e:
            waited = time.monotonic() - t
            ok, msg = 0.5 <= waited < 30 and "past its timeout of 0.500 s" in str(e), f"{waited:.2f} s: {e}"
        del work
    x, y = np.ones(2), np.ones(2)
    dist.all_reduce(x)
    dist.all_reduce(y, group=plain)
    ok &= x[0] == size and y[0] == size
    for g in (short, plain):
        dist.destroy_process_group(g)
    parallel_assert(ok, msg)
