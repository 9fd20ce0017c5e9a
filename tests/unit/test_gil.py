"""Waiting: the GIL is released while MPI waits, timeouts and Ctrl-C end a wait that never finishes,
and a pending Work that is dropped neither crashes nor frees memory MPI may still write.

At world size 1 nothing can ever send to this rank, so an irecv from anyone never completes: it is
the wait that never finishes.
"""
import _thread
import datetime
import gc
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
import weakref

import numpy as np
import pytest

import pydist as dist
from pydist import _C
from unit_helpers import assert_group_works, popen_kwargs

# The fixture's pending receives are dropped at teardown, with the ResourceWarning tested below.
pytestmark = pytest.mark.filterwarnings("ignore:a Work for irecv was dropped:ResourceWarning")

# A thread that does nothing but count gets at least this many increments in the half second a
# wait lasts when the GIL is free (tens of millions on an idle core; held, it gets none).
MIN_PROGRESS = 20_000


class Counter(threading.Thread):
    """Counts as fast as Python can: proof that this thread holds the GIL now and then."""

    def __init__(self):
        super().__init__(daemon=True)
        self.count = 0
        self.stop = False

    def run(self):
        while not self.stop:
            self.count += 1


@pytest.fixture
def counter():
    c = Counter()
    c.start()
    while c.count == 0:
        time.sleep(0.001)
    yield c
    c.stop = True
    c.join(5)


@pytest.fixture
def pending_irecv():
    """A receive from anyone that can never complete."""
    buf = np.zeros(4)
    w = dist.irecv(buf)
    yield w


def test_pending_irecv_is_pending(pending_irecv):
    w = pending_irecv
    assert w.is_completed() is False
    assert w.is_success() is False
    assert w.exception() is None
    assert "pending" in repr(w)
    with pytest.raises(ValueError, match="has not completed"):
        w.source_rank()


def test_wait_timeout_releases_the_gil(pending_irecv, counter):
    w = pending_irecv
    before = counter.count
    t0 = time.monotonic()
    with pytest.raises(dist.DistTimeoutError):
        w.wait(timeout=0.5)
    elapsed = time.monotonic() - t0
    progress = counter.count - before
    assert 0.4 <= elapsed <= 3.0, elapsed
    assert progress >= MIN_PROGRESS, f"the counting thread made {progress} steps in {elapsed:.2f} s of wait"
    # the Work is still usable: still pending, and a later wait times out again
    assert w.is_completed() is False
    assert w.exception() is None
    with pytest.raises(dist.DistTimeoutError):
        w.wait(timeout=0.05)


def test_timeout_error_is_a_dist_error(pending_irecv):
    with pytest.raises(dist.DistTimeoutError) as info:
        pending_irecv.wait(timeout=0.01)
    assert isinstance(info.value, dist.DistError)
    assert isinstance(info.value, RuntimeError)
    assert not isinstance(info.value, dist.DistBackendError)


def test_timeout_accepts_timedelta(pending_irecv):
    t0 = time.monotonic()
    with pytest.raises(dist.DistTimeoutError):
        pending_irecv.wait(timeout=datetime.timedelta(seconds=0.2))
    elapsed = time.monotonic() - t0
    assert 0.15 <= elapsed <= 3.0, elapsed


def test_timeout_zero_polls_once(pending_irecv):
    t0 = time.monotonic()
    with pytest.raises(dist.DistTimeoutError):
        pending_irecv.wait(0)
    assert time.monotonic() - t0 < 1.0


def test_timeout_message_reports_the_seconds(pending_irecv):
    with pytest.raises(dist.DistTimeoutError) as info:
        pending_irecv.wait(timeout=0.25)
    msg = str(info.value)
    assert "irecv" in msg, msg
    assert "%" not in msg, f"unformatted message: {msg}"
    numbers = [float(x) for x in re.findall(r"\d+\.\d+", msg)]
    assert any(abs(x - 0.25) < 1e-6 for x in numbers), f"the timeout (0.25 s) is not in: {msg}"


def test_other_threads_may_call_in_while_one_waits(pending_irecv):
    # MPI_THREAD_MULTIPLE: a second Python thread runs collectives while the main thread waits.
    errors, done = [], []

    def work():
        try:
            for i in range(500):
                x = np.full(8, float(i))
                dist.all_reduce(x, op=dist.ReduceOp.MAX)
                assert np.all(x == i)
                w = dist.all_reduce(x, async_op=True)
                assert w.wait() is True
            done.append(True)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    th = threading.Thread(target=work)
    th.start()
    with pytest.raises(dist.DistTimeoutError):
        pending_irecv.wait(timeout=0.5)
    th.join(30)
    assert not th.is_alive()
    assert errors == [] and done == [True]


def test_blocking_recv_releases_the_gil_and_times_out(counter, restore_group):
    # The default group's timeout ends a blocking call, and the GIL is free meanwhile.
    dist.destroy_process_group()
    dist.init_process_group(backend="mpi", timeout=datetime.timedelta(seconds=0.5))
    buf = np.zeros(3)
    # Earlier tests leave pending Works in reference cycles; the collector could clear them (parking
    # their requests) at any allocation during the recv below. Collect them now, so only the recv counts.
    gc.collect()
    parked_before = _C.parked()
    before = counter.count
    t0 = time.monotonic()
    with pytest.raises(dist.DistTimeoutError):
        dist.recv(buf)
    elapsed = time.monotonic() - t0
    progress = counter.count - before
    assert 0.4 <= elapsed <= 3.0, elapsed
    assert progress >= MIN_PROGRESS, f"the counting thread made {progress} steps during recv"
    # A point-to-point timeout does not desynchronise collectives: the group still works, and the
    # receive was cancelled rather than left posted (it would steal the next message meant for a
    # later receive; tests/mpi/test_p2p.py checks that across ranks).
    assert _C.parked() == parked_before
    x = np.array([2.5])
    dist.all_reduce(x)
    assert x[0] == 2.5


def test_keyboard_interrupt_ends_a_wait_without_timeout(restore_group):
    # Make sure the group has no default timeout: only Ctrl-C can end this wait.
    dist.destroy_process_group()
    dist.init_process_group(backend="mpi")
    w = dist.irecv(np.zeros(2))
    timer = threading.Timer(0.3, _thread.interrupt_main)
    t0 = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            w.wait()
    finally:
        timer.cancel()
    elapsed = time.monotonic() - t0
    assert 0.25 <= elapsed <= 1.5, elapsed
    assert w.is_completed() is False  # interrupted, not completed
    with pytest.warns(ResourceWarning):
        del w
        gc.collect()
    assert_group_works()


def test_keyboard_interrupt_ends_a_blocking_recv(restore_group):
    dist.destroy_process_group()
    dist.init_process_group(backend="mpi")
    buf = np.zeros(2)
    timer = threading.Timer(0.3, _thread.interrupt_main)
    t0 = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            dist.recv(buf)
    finally:
        timer.cancel()
    assert 0.25 <= time.monotonic() - t0 <= 1.5
    assert_group_works()


def test_real_sigint_ends_a_wait_in_a_script():
    # Ctrl-C as a user sends it: SIGINT to a script blocked in wait() with no timeout.
    script = (
        "import sys, time, numpy as np, pydist as dist\n"
        "dist.init_process_group(backend='mpi')\n"
        "w = dist.irecv(np.zeros(2))\n"
        "print('waiting', flush=True)\n"
        "t0 = time.monotonic()\n"
        "try:\n"
        "    w.wait()\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted %.2f' % (time.monotonic() - t0), flush=True)\n"
        "    sys.exit(0)\n"
        "print('wait returned', flush=True)\n"
        "sys.exit(3)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            **popen_kwargs())
    try:
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, (proc.returncode, out, err)
    m = re.search(r"interrupted (\d+\.\d+)", out)
    assert m, out
    assert float(m.group(1)) < 5.0


def test_dropping_a_pending_work_warns_and_keeps_its_array(restore_group):
    buf = np.zeros(16)
    alive = weakref.ref(buf)
    w = dist.irecv(buf)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del w, buf
        gc.collect()
    resource = [c for c in caught if issubclass(c.category, ResourceWarning)]
    assert len(resource) == 1, [str(c.message) for c in caught]
    assert "irecv" in str(resource[0].message)
    # MPI may still write into the array: it must outlive the Work...
    assert alive() is not None
    assert_group_works()
    # ...until the receive is cancelled, at destroy_process_group
    dist.destroy_process_group()
    gc.collect()
    assert alive() is None
    dist.init_process_group(backend="mpi")
    assert_group_works()


def test_dropping_many_pending_works_does_not_crash():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        for _ in range(200):
            dist.irecv(np.zeros(3))
        gc.collect()
    assert_group_works()


def test_timeout_then_drop(pending_irecv):
    with pytest.raises(dist.DistTimeoutError):
        pending_irecv.wait(timeout=0.01)
    # the fixture drops it; nothing may crash and the group still works
    assert_group_works()
