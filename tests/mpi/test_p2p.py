"""send/recv/isend/irecv between ranks: rings, any-source receives, tags, truncation errors,
and the GIL released while a rank waits in recv."""
import threading
import time

import numpy as np
import pytest

import pydist as dist
from helpers import DTYPES, make_input, parallel_assert

two_or_more = pytest.mark.world_size(min=2)


@two_or_more
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 13, 300_007])
def test_ring_send_recv(dtype, n):
    """Every rank sends to its right neighbour and receives from its left one (even ranks send
    first, so blocking calls cannot deadlock)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    out = make_input(2, rank, (n,), dtype)
    got = np.zeros(n, dtype)
    if rank % 2 == 0:
        dist.send(out, dst=right)
        sender = dist.recv(got, src=left)
    else:
        sender = dist.recv(got, src=left)
        dist.send(out, dst=right)
    parallel_assert(sender == left and np.array_equal(got, make_input(2, left, (n,), dtype)),
                    f"from {sender}")


@two_or_more
def test_isend_irecv_all_pairs_out_of_order():
    """Every rank posts a receive from every other rank and a send to each, then waits in reverse."""
    rank, size = dist.get_rank(), dist.get_world_size()
    bufs = {p: np.zeros(5, np.int64) for p in range(size) if p != rank}
    recvs = {p: dist.irecv(bufs[p], src=p, tag=7) for p in bufs}
    sends = [dist.isend(np.full(5, rank * 100 + p, np.int64), dst=p, tag=7) for p in bufs]
    ok = True
    for p in sorted(recvs, reverse=True):
        ok &= recvs[p].wait() is True and recvs[p].source_rank() == p
        ok &= np.array_equal(bufs[p], np.full(5, p * 100 + rank))
    for w in sends:
        ok &= w.wait() is True and w.is_completed()
    parallel_assert(ok)


@two_or_more
def test_recv_from_anyone_returns_sender():
    rank, size = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        seen = set()
        for _ in range(size - 1):
            buf = np.zeros(1, np.int32)
            sender = dist.recv(buf)        # src=None: any rank
            seen.add(sender)
            assert buf[0] == sender * 10
        ok = seen == set(range(1, size))
    else:
        dist.send(np.array([rank * 10], np.int32), dst=0)
        ok = True
    parallel_assert(ok)


@two_or_more
def test_tags_keep_messages_apart():
    rank = dist.get_rank()
    if rank == 0:
        dist.send(np.array([1.0]), dst=1, tag=1)
        dist.send(np.array([2.0]), dst=1, tag=2)
        ok = True
    elif rank == 1:
        b2, b1 = np.zeros(1), np.zeros(1)
        w2 = dist.irecv(b2, src=0, tag=2)   # posted first, but matches only tag 2
        dist.recv(b1, src=0, tag=1)
        w2.wait()
        ok = b1[0] == 1.0 and b2[0] == 2.0
    else:
        ok = True
    parallel_assert(ok)


@two_or_more
def test_truncation_is_a_dist_error_and_the_group_survives():
    """A message longer than the receive buffer: MPI's own error text, as pydist.DistError."""
    rank = dist.get_rank()
    ok, msg = True, ""
    if rank == 0:
        dist.send(np.arange(10, dtype=np.float32), dst=1)
    elif rank == 1:
        small = np.zeros(5, np.float32)
        try:
            dist.recv(small, src=0)
            ok, msg = False, "no error"
        except dist.DistError as e:
            ok = isinstance(e, dist.DistBackendError) and isinstance(e, RuntimeError) and "truncat" in str(e).lower()
            msg = str(e)
    parallel_assert(ok, msg)
    x = np.array([1.0])
    dist.all_reduce(x)
    parallel_assert(x[0] == dist.get_world_size(), "group broken after the error")


@two_or_more
def test_gil_is_released_while_waiting_in_recv():
    """Rank 1 waits in a blocking recv that rank 0 satisfies after 1 s; a Python thread on rank 1
    must keep running meanwhile."""
    rank = dist.get_rank()
    ok, msg = True, ""
    # Start together: ranks reach a test up to a few tenths of a second apart on a busy machine, and
    # rank 1 must still be waiting well over 0.3 s when the message comes.
    dist.barrier()
    if rank == 0:
        time.sleep(1.0)
        dist.send(np.array([42.0]), dst=1)
    elif rank == 1:
        ticks = []
        stop = threading.Event()

        def spin():
            while not stop.is_set():
                ticks.append(time.monotonic())
                time.sleep(0.001)

        t = threading.Thread(target=spin)
        t.start()
        time.sleep(0.02)
        before = len(ticks)
        start = time.monotonic()
        buf = np.zeros(1)
        dist.recv(buf, src=0)
        waited = time.monotonic() - start
        during = len(ticks) - before
        stop.set()
        t.join()
        ok = buf[0] == 42.0 and waited > 0.3 and during > 50
        msg = f"waited {waited:.3f} s, thread ticked {during} times"
    parallel_assert(ok, msg)
