"""send/recv/isend/irecv between ranks: rings, any-source receives, tags, truncation errors,
and the GIL released while a rank waits in recv."""
import gc
import os
import threading
import time
import weakref

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


def _irecv_too_small_and_keep_the_error():
    """A function that keeps a failed receive's exception in a local: exception -> traceback -> this
    frame -> the Work -> its array, a cycle only the garbage collector can free."""
    small = np.zeros(2, np.float32)
    ref = weakref.ref(small)
    work = dist.irecv(small, src=0)
    try:
        work.wait()
        error = None
    except dist.DistError as e:
        error = e
    return ref, error is not None


@two_or_more
def test_failed_receive_frees_its_array():
    rank = dist.get_rank()
    ok, msg = True, ""
    if rank == 0:
        dist.send(np.arange(10, dtype=np.float32), dst=1)
    elif rank == 1:
        ref, failed = _irecv_too_small_and_keep_the_error()
        gc.collect()
        ok, msg = failed and ref() is None, f"failed={failed}, array alive={ref() is not None}"
    parallel_assert(ok, msg)


@two_or_more
def test_two_threads_wait_on_one_receive():
    """Rank 1 waits on one irecv from two threads (and asks is_completed from a third) while rank 0
    sends a little later; repeated, so that completion races the other waiter."""
    rank = dist.get_rank()
    ok, msgs = True, []
    for i in range(20):
        if rank == 0:
            time.sleep(0.01 * (i % 4))
            dist.send(np.full(3, float(i)), dst=1)
        elif rank == 1:
            buf = np.zeros(3)
            w = dist.irecv(buf, src=0)
            results = []

            def waiter():
                try:
                    results.append(w.wait())
                except BaseException as e:   # any error is the failure under test
                    results.append(repr(e))

            threads = [threading.Thread(target=waiter) for _ in range(2)]
            threads.append(threading.Thread(target=lambda: results.append(w.is_completed() in (True, False))))
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            if results.count(True) != 3 or not (buf == i).all() or w.source_rank() != 0:
                ok = False
                msgs.append(f"round {i}: {results}, {buf}")
    parallel_assert(ok, "; ".join(msgs))


@two_or_more
def test_receive_timeout_cancels_the_receive_and_keeps_the_group():
    """A blocking recv that times out is cancelled, not left posted: the next message from that peer
    reaches the next receive. A point-to-point timeout does not break the group."""
    rank = dist.get_rank()
    dist.destroy_process_group()
    # only rank 1 gets a short timeout: the others wait for it in the barrier meanwhile
    dist.init_process_group(backend="mpi", timeout=2.0 if rank == 1 else 60.0)
    try:
        ok, msg = True, ""
        if rank == 1:
            try:
                dist.recv(np.zeros(1), src=0)
                ok, msg = False, "the first recv did not time out"
            except dist.DistTimeoutError:
                pass
        dist.barrier()                       # the group is not broken
        if rank == 0:
            dist.send(np.array([7.0]), dst=1)
        elif rank == 1 and ok:
            got = np.zeros(1)
            dist.recv(got, src=0)
            ok, msg = got[0] == 7.0, f"the second recv got {got}"
        x = np.ones(1)
        dist.all_reduce(x)
        parallel_assert(ok and x[0] == dist.get_world_size(), msg)
    finally:
        dist.destroy_process_group()
        dist.init_process_group(backend="mpi", timeout=float(os.environ.get("PYDIST_TEST_TIMEOUT", "60")))
