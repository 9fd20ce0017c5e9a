"""Object collectives (pickle), batch_isend_irecv, and Work handles that own their arrays."""
import gc

import numpy as np
import pytest

import pydist as dist
from helpers import parallel_assert


def _obj(r):
    return {"rank": r, "name": f"worker-{r}", "data": list(range(r * 3)), "arr": np.arange(r, dtype=np.int16)}


def _same(a, b):
    return a.keys() == b.keys() and all(
        np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k] for k in a)


def test_broadcast_object_list_every_root():
    rank, size = dist.get_rank(), dist.get_world_size()
    ok = True
    for root in range(size):
        objs = [_obj(root), "text" * root, None] if rank == root else [None, None, None]
        dist.broadcast_object_list(objs, src=root)
        ok &= _same(objs[0], _obj(root)) and objs[1] == "text" * root and objs[2] is None
    parallel_assert(ok)


def test_all_gather_object_and_gather_object():
    rank, size = dist.get_rank(), dist.get_world_size()
    out = [None] * size
    dist.all_gather_object(out, _obj(rank))
    ok = all(_same(out[r], _obj(r)) for r in range(size))
    for root in range(size):
        got = [None] * size if rank == root else None
        dist.gather_object(_obj(rank), got, dst=root)
        if rank == root:
            ok &= all(_same(got[r], _obj(r)) for r in range(size))
    parallel_assert(ok)


def test_scatter_object_list_every_root():
    rank, size = dist.get_rank(), dist.get_world_size()
    ok = True
    for root in range(size):
        out = [None]
        inputs = [_obj(root * 10 + r) for r in range(size)] if rank == root else None
        dist.scatter_object_list(out, inputs, src=root)
        ok &= _same(out[0], _obj(root * 10 + rank))
    parallel_assert(ok)


@pytest.mark.world_size(min=2)
def test_batch_isend_irecv_ring():
    """Each rank sends to both neighbours and receives from both, in one batch (torch's example)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    from_left, from_right = np.zeros(3), np.zeros(3)
    ops = [dist.P2POp(dist.isend, np.full(3, rank * 1.0), right, tag=1),
           dist.P2POp(dist.irecv, from_left, left, tag=1),
           dist.P2POp(dist.isend, np.full(3, rank * 10.0), left, tag=2),
           dist.P2POp(dist.irecv, from_right, right, tag=2)]
    works = dist.batch_isend_irecv(ops)
    for w in reversed(works):
        w.wait()
    parallel_assert(np.array_equal(from_left, np.full(3, left * 1.0)) and
                    np.array_equal(from_right, np.full(3, right * 10.0)))


def test_batch_isend_irecv_rejects_bad_lists():
    with pytest.raises(ValueError, match="P2POp"):
        dist.batch_isend_irecv([])
    with pytest.raises(ValueError, match="P2POp"):
        dist.batch_isend_irecv([("isend", np.zeros(1), 0)])
    with pytest.raises(ValueError, match="isend or pydist.irecv"):
        dist.P2POp(dist.all_reduce, np.zeros(1), 0)
    parallel_assert(True)


@pytest.mark.world_size(min=2)
@pytest.mark.parametrize("name", ["broadcast_object_list", "all_gather_object", "gather_object",
                                  "scatter_object_list"])
def test_an_unpicklable_object_raises_on_every_rank(name):
    """One rank's object cannot be pickled (a lock): that rank raises pickle's error and every other
    rank a DistError naming it, instead of waiting for a message that never comes. The next call works."""
    import threading
    rank, size = dist.get_rank(), dist.get_world_size()
    culprit = size - 1      # the root for the rooted calls, so the failure is where the pickling happens
    lock = threading.Lock()
    mine = lock if rank == culprit else {"rank": rank}
    calls = {
        "broadcast_object_list": lambda obj: dist.broadcast_object_list([obj, 2], src=culprit),
        "all_gather_object": lambda obj: dist.all_gather_object([None] * size, obj),
        "gather_object": lambda obj: dist.gather_object(obj, [None] * size if rank == culprit else None,
                                                        dst=culprit),
        "scatter_object_list": lambda obj: dist.scatter_object_list(
            [None], [obj] * size if rank == culprit else None, src=culprit),
    }
    with pytest.raises(Exception) as info:
        calls[name](mine)
    if rank == culprit:
        ok = type(info.value).__name__ in ("TypeError", "PicklingError") and "lock" in str(info.value)
    else:
        ok = isinstance(info.value, dist.DistError) and f"[{culprit}]" in str(info.value) and name in str(info.value)
    out = [None] * size
    dist.all_gather_object(out, rank)
    parallel_assert(ok and out == list(range(size)), f"{type(info.value).__name__}: {info.value}; then {out}")


@pytest.mark.world_size(min=2)
@pytest.mark.parametrize("bad, error", [(("x", None), TypeError), ((np.zeros(3, np.float32), -1), ValueError),
                                        ((np.zeros(3), None, 2**40), ValueError)])
def test_batch_with_a_bad_entry_posts_nothing(bad, error):
    """A bad entry late in the batch raises before anything is posted: the good send ahead of it must
    not go out, or the neighbour's next receive on that tag would get its stale data."""
    rank, size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    arr, peer, tag = (bad + (0,))[:3]
    stale = np.full(3, -1.0)
    ops = [dist.P2POp(dist.isend, stale, right, tag=7),
           dist.P2POp(dist.irecv, arr, left if peer is None else peer, tag=tag)]
    with pytest.raises(error):
        dist.batch_isend_irecv(ops)
    got = np.zeros(3)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, np.full(3, rank * 1.0), right, tag=7),
                                    dist.P2POp(dist.irecv, got, left, tag=7)])
    for w in works:
        w.wait()
    parallel_assert(np.array_equal(got, np.full(3, left * 1.0)), f"got {got}")


def test_work_keeps_its_arrays_alive():
    """The caller drops every reference to the arrays of a pending collective and collects garbage:
    the Work owns them, so MPI never writes into freed memory, and result() still has them."""
    rank, size = dist.get_rank(), dist.get_world_size()
    works = []
    for k in range(5):
        outs = [np.zeros(1000) for _ in range(size)]
        works.append(dist.all_gather(outs, np.full(1000, rank + k, np.float64), async_op=True))
        flat = np.zeros(7 * size, np.int32)
        works.append(dist.all_gather_into_tensor(flat, np.full(7, rank, np.int32), async_op=True))
        del outs, flat
    gc.collect()
    junk = [np.ones(1000) for _ in range(50)]   # reuse freed memory, if any had been freed
    ok = True
    for k in range(5):
        w, w2 = works[2 * k], works[2 * k + 1]
        w.wait()
        w2.wait()
        ok &= all(np.array_equal(w.result()[r], np.full(1000, r + k, np.float64)) for r in range(size))
        ok &= np.array_equal(w2.result()[0], np.repeat(np.arange(size, dtype=np.int32), 7))
    parallel_assert(ok and all(j.sum() == 1000 for j in junk))


def test_groups_die_with_the_default_group():
    """After destroy_process_group() and a new init, an old group object must not silently reach a
    newer group that reuses its slot."""
    size = dist.get_world_size()
    old = dist.new_group(list(range(size)))
    dist.destroy_process_group()
    dist.init_process_group(backend="mpi", timeout=60)
    new = dist.new_group(list(range(size)))
    with pytest.raises(ValueError, match="destroyed"):
        dist.all_reduce(np.zeros(1), group=old)
    x = np.ones(1)
    dist.all_reduce(x, group=new)
    dist.destroy_process_group(new)
    parallel_assert(x[0] == size)
