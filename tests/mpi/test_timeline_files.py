"""The files a timeline writes at predictable names are never written through a link (issue 41).

Each rank writes run.rank<R>.json and rank 0 writes the merged run.json through a temporary file; a
rank on another host sends its file to rank 0, which writes it as run.rank<R>.json beside its own. Here
someone else has planted a link at each of those names (and at the name the merged file's temporary
had before: run.json.<pid>.tmp), pointing at a file of theirs: the timeline replaces the links, and the
files they point at keep what they held. Any world size; the other host needs two ranks."""
import json
import os
import shutil
import tempfile

import numpy as np
import pytest

import pydist as dist
from helpers import parallel_assert

THEIRS = "someone else's file\n"


def shared_dir():
    """A new directory every rank sees, made by rank 0."""
    where = [tempfile.mkdtemp(prefix="pydist-timeline-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(where, 0)
    return where[0]


def plant(folder, names):
    """Links at `names` in `folder`, each to a victim file of its own; {link name: its victim}."""
    victims = {}
    for i, name in enumerate(names):
        victim = os.path.join(folder, f"victim{i}")
        with open(victim, "w") as f:
            f.write(THEIRS)
        os.symlink(victim, os.path.join(folder, name))
        victims[name] = victim
    return victims


def record_and_check(folder, own, victims):
    """Record a region into `own`/run.json on every rank; then rank 0 checks what went wrong in `folder`
    (its own): a victim changed, the merged file not a whole trace of every rank, a part or temporary
    file left behind; another rank with a folder of its own, that nothing is left there."""
    rank, size = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    with dist.timeline(os.path.join(own, "run.json")):
        dist.all_reduce(np.ones(4, np.float32))
    found = []
    if rank == 0:
        for name, victim in victims.items():
            with open(victim) as f:
                if f.read() != THEIRS:
                    found.append(f"{victim} (linked from {name}) was written through the link")
        path = os.path.join(folder, "run.json")
        if os.path.islink(path):
            found.append("run.json is still a link")
        else:
            with open(path) as f:
                trace = json.load(f)
            ranks = {e["pid"] for e in trace["traceEvents"] if e.get("cat") == "comm"}
            if ranks != set(range(size)):
                found.append(f"run.json holds the calls of ranks {sorted(ranks)}")
        left = sorted(n for n in os.listdir(folder) if n.startswith("run.rank") or
                      (n.endswith(".tmp") and n not in victims))
        if left:
            found.append(f"left behind: {left}")
    elif own != folder and os.listdir(own):
        found.append(f"rank {rank} left {os.listdir(own)} in its own folder")
    parallel_assert(not found, "; ".join(found))


def test_links_at_the_ranks_files_and_the_temporary_are_replaced():
    rank, size = dist.get_rank(), dist.get_world_size()
    folder = shared_dir()
    try:
        victims = {}
        if rank == 0:
            names = [f"run.rank{r}.json" for r in range(size)] + [f"run.json.{os.getpid()}.tmp", "run.json"]
            victims = plant(folder, names)
        record_and_check(folder, folder, victims)
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.world_size(min=2)
def test_a_link_where_rank_0_writes_another_hosts_file(monkeypatch):
    """Ranks 1.. say they are on other hosts and record into folders of their own (their disks): their
    files reach rank 0 through MPI, and rank 0 writes each as run.rank<R>.json, where the links are."""
    rank, size = dist.get_rank(), dist.get_world_size()
    folder = shared_dir()
    own = folder if rank == 0 else tempfile.mkdtemp(prefix="pydist-elsewhere-")
    if rank > 0:
        monkeypatch.setattr(dist.timeline.socket, "gethostname", lambda: f"elsewhere{rank}")
    try:
        victims = plant(folder, [f"run.rank{r}.json" for r in range(1, size)]) if rank == 0 else {}
        record_and_check(folder, own, victims)
    finally:
        dist.barrier()
        shutil.rmtree(own, ignore_errors=True)
        if rank == 0:
            shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.world_size(min=2)
def test_a_rank_that_cannot_write_its_part_is_the_same_error_on_every_rank():
    """The last rank's part cannot be written (its folder is gone when the region ends, as a full or
    read-only disk would refuse it): it used to raise alone while rank 0 waited for its part in the
    merge until the timeout. Now every rank raises the same OSError naming that rank, and the group goes
    on working."""
    rank, size = dist.get_rank(), dist.get_world_size()
    folder = shared_dir()
    own = tempfile.mkdtemp(prefix="pydist-timeline-own-") if rank == size - 1 else folder
    said = None
    try:
        with dist.timeline(os.path.join(own, "run.json")):
            dist.all_reduce(np.ones(4, np.float32))
            if rank == size - 1:
                shutil.rmtree(own)
    except OSError as e:
        said = str(e)
    every = [None] * size
    dist.all_gather_object(every, said)
    want = f"timeline: rank {size - 1} could not write its part of the timeline"
    parallel_assert(len(set(every)) == 1 and said is not None and want in said and "was not merged" in said,
                    f"the ranks said {every}")
    x = np.ones(3, np.float32)
    dist.all_reduce(x)
    parallel_assert(x.tolist() == [size] * 3, f"the all-reduce after gave {x}")
    if rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
