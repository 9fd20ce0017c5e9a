"""Threads against one process's C state, at 2 and more ranks (issue 45, part 2).

Several threads may issue collectives on different groups at once, and point-to-point calls on any
group, as MPI_THREAD_MULTIPLE allows: tests/threads_stress.py's bounded run (8 threads, 4 groups,
thousands of calls on every path, blocking and async, each result against NumPy; with the small
collectives' slots and with the persistent cache). Two threads inside collectives on one group at
once have no order MPI could match across ranks: the second is refused with DistError before it sends
anything, while point-to-point calls on that group and collectives on others go on.
"""
import json
import os
import shutil
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

import pydist as dist
from helpers import parallel_assert

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import threads_stress  # noqa: E402  (tests/threads_stress.py)

@pytest.mark.world_size(sizes=(2, 3))
@pytest.mark.parametrize("slots", [True, False], ids=["slots", "persistent"])
def test_eight_threads_on_four_groups_match_numpy(slots):
    """The schedule's 3000 calls (about 7 in 8 on each rank's groups), every result bitwise against
    NumPy, every call on the timeline, and each path taken."""
    box = [tempfile.mkdtemp(prefix="pydist-stress-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, 0)
    try:
        summary = threads_stress.run(seed=11 + slots, calls=3000, slots=slots, record=box[0])
    finally:
        dist.barrier()
        if dist.get_rank() == 0:
            shutil.rmtree(box[0], ignore_errors=True)
    message = ""
    if dist.get_rank() == 0:
        paths = summary["paths"]
        # The shared-memory paths where MPI puts the ranks on one node (MPICH 5 on Debian unstable
        # splits every rank into a node of its own: MPI's paths carry everything there).
        one_node = dist._C.shm_info()["node_size"] == dist.get_world_size()
        # The persistent cache on MPICH only (csrc/paths/persistent.c: Intel MPI's restarts are wrong).
        cache = dist._C.mpi_info()["library_version"].startswith("MPICH Version:")
        # The ring where the library has MPI_Isendrecv (not Open MPI 4.1: MPI carries those calls there).
        ring = {"ring"} if dist._C.mpi_info()["isendrecv"] else set()
        want = ring | {"MPI"} | ({"small shm"} if slots and one_node else set()) | \
            ({"persistent"} if not slots and cache else set()) | ({"shm"} if not slots and one_node else set())
        message = "" if want <= set(paths) else f"paths taken {paths}, want each of {sorted(want)}"
    parallel_assert(not message, message)


def inside_call(thread):
    """Whether `thread` is in pydist's all_reduce (its Python frame, waiting in C)."""
    frame = sys._current_frames().get(thread.ident)
    return frame is not None and frame.f_code.co_name == "all_reduce"


@pytest.mark.world_size(min=2)
def test_two_threads_in_collectives_on_one_group_the_second_is_refused():
    """Rank 0: thread A waits in all_reduce on g (rank 1 is not there yet). Meanwhile on rank 0,
    all_reduce and barrier on g are refused, naming the call A is in; a collective on another group
    and a send on g go through. Then rank 1 joins A's call, and g still works; and the refused calls
    took no number: on the timeline, every group's collectives are numbered alike on every rank."""
    g, h = dist.new_group([0, 1]), dist.new_group([0, 1])
    rank = dist.get_rank()
    box = [tempfile.mkdtemp(prefix="pydist-refused-") if rank == 0 else None]
    dist.broadcast_object_list(box, 0)
    trace = os.path.join(box[0], "trace.json")
    try:
        with dist.timeline(trace):
            errors = refused_calls(g, h, rank)
        if rank == 0:
            errors += numbered_alike(trace)
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(box[0], ignore_errors=True)
    parallel_assert(not errors, "; ".join(errors))
    dist.destroy_process_group(g)
    dist.destroy_process_group(h)


def numbered_alike(trace):
    """Each group's collectives carry the numbers 1, 2, ... on each rank of the merged trace."""
    with open(trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "comm" and e["ph"] in "Xb"]
    numbers = {}
    for e in events:
        if e["args"]["seq"] > 0:
            numbers.setdefault((e["args"]["group"], e["pid"]), []).append(e["args"]["seq"])
    return [f"group {gid} on rank {r}: collectives numbered {sorted(seqs)}"
            for (gid, r), seqs in numbers.items() if sorted(seqs) != list(range(1, len(seqs) + 1))]


def refused_calls(g, h, rank):
    errors = []
    if rank == 0:
        x = np.array([1.0, 2.0])
        a = threading.Thread(target=lambda: dist.all_reduce(x, group=g))
        a.start()
        deadline = time.monotonic() + 30
        while not inside_call(a) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)   # past the few instructions from the frame to the wait
        for name, call in (("all_reduce", lambda: dist.all_reduce(np.ones(2), group=g)),
                           ("barrier", lambda: dist.barrier(g, async_op=True))):
            try:
                call()
                errors.append(f"{name} on g from a second thread was not refused")
            except dist.DistError as e:
                if "another thread" not in str(e) or "inside all_reduce()" not in str(e):
                    errors.append(f"{name}: unclear message: {e}")
        z = np.array([5.0])
        dist.all_reduce(z, group=h)                              # another group: goes on
        dist.isend(np.array([7.0]), 1, group=g, tag=3).wait()     # point-to-point on g: goes on
        a.join(60)
        if a.is_alive() or z[0] != 10.0 or list(x) != [2.0, 4.0]:
            errors.append(f"alive={a.is_alive()} z={z} x={x}")
    elif rank == 1:
        z = np.array([5.0])
        dist.all_reduce(z, group=h)
        got = np.zeros(1)
        dist.irecv(got, 0, group=g, tag=3).wait()
        x = np.array([1.0, 2.0])
        dist.all_reduce(x, group=g)
        if got[0] != 7.0 or z[0] != 10.0 or list(x) != [2.0, 4.0]:
            errors.append(f"got={got} z={z} x={x}")
    if rank < 2:
        y = np.array([float(rank)])
        dist.all_reduce(y, group=g)   # the refused calls left nothing behind on g
        if y[0] != 1.0:
            errors.append(f"g afterwards: {y}")
    return errors

