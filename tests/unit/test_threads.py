"""Threads and the garbage collector against the C core (world size 1).

pydist releases the GIL while MPI waits, so other threads run meanwhile: they may wait on the same
Work, create groups, or use PYDIST_DEBUG's validate-only mode, and none of that may corrupt another
thread's call. Work objects take part in garbage collection, so cycles through them (a failed
operation's traceback, a Work in its own result list) are freed, and a pending request's arrays are
never freed under MPI.
"""
import gc
import threading
import time
import warnings
import weakref

import numpy as np
import pytest

import pydist as dist
from pydist import _C
from unit_helpers import assert_group_works, run_script


# ---------------------------------------------------------------------------------------------------
# Garbage collection

def test_work_is_tracked_by_the_collector():
    w = dist.all_reduce(np.ones(3), async_op=True)
    assert gc.is_tracked(w)
    w.wait()


def test_completed_work_in_a_cycle_is_freed():
    arr = np.ones(5)
    ref = weakref.ref(arr)
    w = dist.all_reduce(arr, async_op=True)
    w.wait()
    w.result().append(w)      # Work -> its result list -> Work: only the collector can free this
    del arr, w
    gc.collect()
    assert ref() is None, "a Work in a reference cycle kept its array alive"


def test_pending_work_in_a_cycle_keeps_its_array_until_mpi_is_done(restore_group):
    """The collector may clear a cycle holding a pending Work: its array must stay alive (MPI may
    still write into it) on the parked list, and be freed once the request is cancelled."""
    gc.collect()              # Works earlier tests left in cycles are parked now, not in the count below
    parked = _C.parked()
    arr = np.zeros(4)
    ref = weakref.ref(arr)
    w = dist.irecv(arr)       # from anyone: at world size 1 nothing ever arrives
    w.result().append(w)
    del arr, w
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert any(issubclass(c.category, ResourceWarning) for c in caught), [str(c.message) for c in caught]
    assert ref() is not None, "the array of a pending receive was freed under MPI"
    assert _C.parked() == parked + 1
    dist.destroy_process_group()   # cancels parked receives and lets their arrays go
    gc.collect()
    assert ref() is None
    # Receives parked by earlier tests in this process are cancelled too, so the list is empty.
    assert _C.parked() == 0


# ---------------------------------------------------------------------------------------------------
# Threads

def test_two_threads_waiting_on_one_request():
    """Both waits time out cleanly; a third thread asking is_completed() meanwhile gets False."""
    w = dist.irecv(np.zeros(2))
    errors, answers = [], []
    stop = threading.Event()

    def waiter():
        try:
            w.wait(timeout=0.5)
            errors.append("no timeout")
        except dist.DistTimeoutError:
            pass
        except BaseException as e:   # anything else is a failure of the test
            errors.append(repr(e))

    def asker():
        while not stop.is_set():
            answers.append(w.is_completed())

    threads = [threading.Thread(target=waiter) for _ in range(2)] + [threading.Thread(target=asker)]
    for t in threads:
        t.start()
    for t in threads[:2]:
        t.join(30)
    stop.set()
    threads[2].join(30)
    assert not any(t.is_alive() for t in threads)
    assert errors == [] and answers and not any(answers)
    with pytest.warns(ResourceWarning):
        del w
        gc.collect()
    assert_group_works()


def test_new_group_from_two_threads_takes_distinct_slots():
    """new_group releases the GIL inside MPI_Comm_split; a slot chosen before that could be chosen by
    another thread too (before the fix: 2 duplicates in 400 groups)."""
    made = []

    def make():
        for _ in range(200):
            made.append(dist.new_group([0]))

    threads = [threading.Thread(target=make) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    handles = [g._handle for g in made]
    assert len(handles) == 400 and len(set(handles)) == 400, sorted(handles)
    x = np.array([3.0])
    for g in made:
        dist.all_reduce(x, group=g)
    assert x[0] == 3.0
    for g in made:
        dist.destroy_process_group(g)
    assert _C.live_groups() == 2   # the world's communicator and its private one, made with it


def test_validate_only_mode_belongs_to_its_thread():
    """PYDIST_DEBUG=DETAIL switches a thread's collectives to checks only for a moment; a collective in
    another thread at that moment must still run."""
    on, release = threading.Event(), threading.Event()

    def checker():
        _C.set_validate_only(True)
        on.set()
        release.wait(30)
        _C.set_validate_only(False)

    t = threading.Thread(target=checker)
    t.start()
    assert on.wait(30)
    try:
        out = np.zeros(3)
        dist.all_gather_into_tensor(out, np.array([1.0, 2.0, 3.0]))
    finally:
        release.set()
        t.join(30)
    np.testing.assert_array_equal(out, [1.0, 2.0, 3.0])


# ---------------------------------------------------------------------------------------------------
# The thread level MPI provides

SERIALIZED_SCRIPT = """
import threading, time
import numpy as np
import pydist as dist
from pydist import _C
dist.init_process_group()
level = _C.mpi_info()["thread_level"]
count = [0]
stop = threading.Event()
def spin():
    while not stop.is_set():
        count[0] += 1
        time.sleep(0.0005)
t = threading.Thread(target=spin)
t.start()
w = dist.irecv(np.zeros(2))
try:
    w.wait(timeout=0.5)
    outcome = "no timeout"
except dist.DistTimeoutError:
    outcome = "timeout"
stop.set()
t.join()
x = np.array([4.0])
dist.all_reduce(x)
print(level, outcome, count[0] > 100, x[0])
"""


def test_serialized_mpi_keeps_waits_interruptible_and_the_gil_free():
    """With MPI_THREAD_SERIALIZED the wait loop keeps the GIL while it calls MPI and releases it in
    between: other threads still run, timeouts still work."""
    proc = run_script(SERIALIZED_SCRIPT, PYDIST_THREAD_LEVEL="serialized")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2", "timeout", "True", "4.0"], proc.stdout   # MPI_THREAD_SERIALIZED == 2


@pytest.mark.parametrize("level", ["single", "funneled"])
def test_mpi_without_thread_support_is_refused(level):
    proc = run_script("import pydist as dist\n"
                      "try:\n"
                      "    dist.init_process_group()\n"
                      "except dist.DistError as e:\n"
                      "    print('REFUSED', e)\n", PYDIST_THREAD_LEVEL=level)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("REFUSED"), proc.stdout
    assert f"MPI_THREAD_{level.upper()}" in proc.stdout and "MPI_THREAD_SERIALIZED" in proc.stdout, proc.stdout
