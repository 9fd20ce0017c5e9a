"""A timeline of every rank: where the time goes, call by call and phase by phase.

Record a whole run with ``PYDIST_TIMELINE=run.json mpiexec -n 4 python train.py``, or a region of a
program (every rank enters and leaves it at the same point, as with a collective)::

    import pydist as dist
    with dist.timeline("run.json"):
        train()

Every rank records into a buffer in C (no Python on the hot path): each communication call (its
name, group, bytes, the path that carried it, start and end), and in the training engine each step's
phases and each strategy's own events. Times come from each rank's monotonic clock, aligned to rank
0's at the start. At the end each rank writes ``run.rank<R>.json``; rank 0 gathers them into one
Chrome trace, ``run.json``, which Perfetto (ui.perfetto.dev) and chrome://tracing open as it is, and
annotates every collective with how long each rank waited for the last one to arrive. Then::

    python -m pydist.timeline summary run.json --png run.png   # per rank compute/comm/wait, stragglers
    python -m pydist.timeline merge run.rank*.json -o run.json  # if the job could not merge them

Off (the default), recording costs one predictable branch per event.
"""
import contextlib
import json
import os
import socket
import sys
import types

import numpy as np

from . import _C
from . import _files
from . import distributed as dist
from . import trace_report

MAX_EVENTS = 4_000_000   # per rank (about 200 bytes each); later events are counted as dropped
_ROUNDS = 8              # ping-pongs per rank when aligning clocks; the fastest one counts
_active = None           # the recording in progress: its path, or None
_hosts = []              # each rank's host name, from the start


def part_path(path, rank):
    """Where rank `rank` writes its own file: run.json -> run.rank3.json."""
    stem, ext = os.path.splitext(os.fspath(path))
    return f"{stem}.rank{rank}{ext or '.json'}"


def _clock_offsets(hosts):
    """Each rank's clock minus rank 0's (ns), measured by ping-pongs with rank 0 and taken from the one
    with the shortest round trip (its error is at most half that trip); exactly 0 on rank 0's host,
    whose ranks share one monotonic clock; then rank 0's clock at the time 0 of the timeline, last.
    Collective over the world."""
    rank, size = dist.get_rank(), dist.get_world_size()
    offsets = np.zeros(size + 1, np.int64)
    stamp = np.zeros(1, np.int64)
    for peer in range(1, size):
        if hosts[peer] == hosts[0]:
            continue
        if rank == 0:
            best = None
            for _ in range(_ROUNDS):
                t0 = _C.timeline_clock()
                dist.send(stamp, peer)
                dist.recv(stamp, peer)
                t1 = _C.timeline_clock()
                if best is None or t1 - t0 < best[0]:
                    best = (t1 - t0, int(stamp[0]) - (t0 + t1) // 2)
            offsets[peer] = best[1]
        elif rank == peer:
            for _ in range(_ROUNDS):
                dist.recv(stamp, 0)
                stamp[0] = _C.timeline_clock()
                dist.send(stamp, 0)
    offsets[size] = _C.timeline_clock()
    dist.broadcast(offsets, 0)
    return offsets


def start(path, max_events=MAX_EVENTS):
    """Start recording on every rank (collective over the world); stop() writes the files."""
    global _active
    if _active is not None:
        raise ValueError(f"timeline: already recording into {_active!r}; one timeline at a time")
    if not isinstance(max_events, int) or max_events <= 0:
        raise ValueError(f"timeline: `max_events` must be a positive int; got {max_events!r}")
    path = os.path.abspath(os.fspath(path))
    hosts = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    _hosts[:] = hosts
    offsets = _clock_offsets(hosts)
    rank = dist.get_rank()
    _C.timeline_start(int(offsets[-1]) + int(offsets[rank]), rank, max_events)   # rank 0's time 0, in our clock
    _active = path
    return path


def stop():
    """Stop recording, write this rank's file, and (collective over the world) merge every rank's into
    the timeline's path on rank 0. Returns the merged path on rank 0, this rank's file elsewhere, or,
    when the ranks could not meet (one has died), this rank's file with the way to merge them later."""
    global _active
    path, _active = _active, None
    if path is None:
        return None
    rank = dist.get_rank()
    mine = part_path(path, rank)
    extra = {"host": socket.gethostname(), "pid": os.getpid(),
             "groups": {str(k): v for k, v in _C.timeline_groups().items()}}
    failed, data = None, None
    try:
        events, dropped = _C.timeline_write(mine, f"rank {rank} ({extra['host']})", json.dumps(extra)[1:-1])
        if dropped:
            print(f"pydist: timeline: rank {rank} kept {events} events and dropped {dropped} past max_events",
                  file=sys.stderr)
        # the files of ranks on other hosts reach rank 0 through MPI (it may not see their disks)
        if _hosts[rank] != _hosts[0]:
            with open(mine, "rb") as f:
                data = f.read()
    except OSError as e:   # this rank's disk: every rank hears of it below, and raises alike
        failed = (e.errno, f"rank {rank} could not write its part of the timeline ({mine}): {e.strerror or e}")
    size = dist.get_world_size()
    try:
        failures = [None] * size
        dist.all_gather_object(failures, failed)
        if not any(failures):
            parts = [None] * size if rank == 0 else None
            dist.gather_object(data, parts, dst=0)
    except Exception as e:   # a rank has died: keep what was written
        print(f"pydist: timeline: rank {rank} wrote {mine}; the ranks could not meet to merge ({e}); merge with "
              f"python -m pydist.timeline merge {part_path(path, '*')} -o {path}", file=sys.stderr)
        return mine
    failures = [f for f in failures if f]
    if failures:   # the same error on every rank (its errno gives the same subclass: IsADirectoryError, ...);
        more = f" (and {len(failures) - 1} more rank(s))" if len(failures) > 1 else ""   # the parts stay
        code, words = failures[0]
        raise OSError(code, f"timeline: {words}{more}; the timeline was not merged (the parts written are kept)")
    if rank != 0:
        if data is not None:
            os.remove(mine)   # rank 0 has it
        return mine
    names = [part_path(path, r) for r in range(size)]
    for r in range(1, size):
        if parts[r] is not None:
            with _files.replacing(names[r], "wb") as f:   # from another host
                f.write(parts[r])
    trace_report.merge(names, path)
    for name in names:
        with contextlib.suppress(OSError):
            os.remove(name)
    return path


@contextlib.contextmanager
def timeline(path, max_events=MAX_EVENTS):
    """Record the region's timeline into `path` (a Chrome trace; see the module's docstring). Every rank
    must enter and leave it at the same point, as with a collective. Yields the path."""
    start(path, max_events)
    try:
        yield path
    finally:
        stop()


def event(name, t0, t1, cat="user", **args):
    """A span of your own on the timeline: `t0`/`t1` from timeline_clock() (ns); args str or int."""
    _C.timeline_event(cat, name, int(t0), int(t1), args)


clock = _C.timeline_clock


def _from_env():
    """PYDIST_TIMELINE=run.json: record from init_process_group to the end of the job."""
    import atexit
    path = os.environ.get("PYDIST_TIMELINE")
    if path and _active is None:
        start(path)
        atexit.register(_stop_at_exit)


def _stop_at_exit():
    if _active is not None:
        if dist.is_initialized():
            stop()


def main(argv=None):
    """python -m pydist.timeline merge|summary|png ...: pydist/trace_report.py's commands."""
    return trace_report.main(argv)


class _CallableModule(types.ModuleType):
    """So that ``dist.timeline("run.json")`` is the context manager while ``pydist.timeline`` stays
    this module (``import pydist.timeline as tl; tl.event(...)``)."""
    def __call__(self, path, max_events=MAX_EVENTS):
        return timeline(path, max_events)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
