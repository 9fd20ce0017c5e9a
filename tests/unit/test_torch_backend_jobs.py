"""Whole jobs on the torch backend (pydist/torch.py) under real mpiexec: a rank that fails ends the job
with that rank's error and traceback (torch.distributed's excepthook captures stderr to prefix it, and
MPI_Abort never returns to let it print), never a hang or a segfault; and the tutorial-style example,
whose init_process_group(backend="pydist") has nothing but mpiexec to go on (env:// filled in by the
import), trains, identical on every rank."""
import json
import os
import re
import socket
import subprocess
import sys
import textwrap

import pytest

from unit_helpers import MPIEXEC

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(tmp_path, n, body, timeout=120, env=None):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(body))
    extra, env = env or {}, {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                                               "MASTER_PORT")}
    env.update(MPIEXEC_TIMEOUT=str(timeout), UCX_ERROR_SIGNALS="", JOB_OUT=str(tmp_path), **extra)
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, str(script)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout + 30)


def test_a_rank_that_raises_inside_ddp_training_ends_the_job_with_its_traceback(tmp_path):
    proc = run(tmp_path, 2, """
        import torch, torch.distributed as dist, torch.nn as nn
        import pydist.torch
        dist.init_process_group(backend="pydist")
        model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
        for step in range(3):
            if step == 1 and dist.get_rank() == 1:
                raise RuntimeError("rank 1 fails on purpose")
            model(torch.randn(3, 4)).sum().backward()
        print("finished", dist.get_rank())
    """)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "[rank1]: RuntimeError: rank 1 fails on purpose" in out, out
    assert "[rank1]: Traceback" in out and "aborting the job" in out, out
    assert "finished" not in out and "Segmentation fault" not in out and "signal 11" not in out, out


def test_a_rank_that_stops_answering_times_out_ddp_on_the_others(tmp_path):
    """torch's init_process_group(timeout=...) bounds pydist's waits: rank 1 stalls before its backward
    pass, rank 0's gradient bucket (its all-reduce on the group's worker thread) times out, and DDP
    raises that on rank 0 through the bucket's future, which ends the job long before rank 1 would have
    come back."""
    proc = run(tmp_path, 2, """
        import datetime, time, torch, torch.distributed as dist, torch.nn as nn
        import pydist.torch
        dist.init_process_group(backend="pydist", timeout=datetime.timedelta(seconds=3))
        dist.barrier()   # (both ranks past start-up before DDP's first collective: on a loaded machine
                         # one rank's imports alone can outlast the 3 s)
        model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
        for step in range(4):
            loss = model(torch.randn(3, 4)).sum()
            if step == 2 and dist.get_rank() == 1:
                time.sleep(100)
            loss.backward()
        print("finished", dist.get_rank())
    """)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert re.search(r"\[rank0\]: RuntimeError: .*DistTimeoutError: all_reduce timed out after 3", out), out
    assert "[rank0]: Traceback" in out and "aborting the job" in out, out
    assert "finished" not in out and "Segmentation fault" not in out and "signal 11" not in out, out


def test_monitored_barrier_names_the_rank_that_never_came(tmp_path):
    proc = run(tmp_path, 3, """
        import datetime, time, torch.distributed as dist
        import pydist.torch
        dist.init_process_group(backend="pydist")
        if dist.get_rank() == 0:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=2))
        elif dist.get_rank() == 2:   # waits for rank 0's release longer than rank 0 waits for rank 1
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
        time.sleep(100)
    """)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "[rank0]: pydist.DistError: monitored_barrier(): Rank 1 failed to pass monitoredBarrier in 2 s" in out, out


def test_timeouts_mean_what_torch_says(tmp_path):
    """torch's semantics, as gloo has them: a new_group's timeout (not init_process_group's 60 s) bounds
    a barrier that only rank 0 calls; monitored_barrier with a timeout of 0 fails at once on rank 0
    ("timed out in monitoredBarrier"); a rank that reached a monitored barrier rank 0 failed is told so
    in torch's words. Each rank writes what it saw; rank 1 never calls the monitored barriers."""
    proc = run(tmp_path, 3, """
        import datetime, json, os, time, torch.distributed as dist
        import pydist.torch
        dist.init_process_group(backend="pydist", timeout=datetime.timedelta(seconds=60))
        rank, seen = dist.get_rank(), {}
        short = dist.new_group(timeout=datetime.timedelta(seconds=1))
        if rank == 0:
            t = time.monotonic()
            try:
                dist.barrier(short)
            except RuntimeError as e:
                seen["barrier"] = [type(e).__name__, str(e), time.monotonic() - t]
        whole = dist.new_group()
        if rank == 0:
            try:
                whole.monitored_barrier(datetime.timedelta(0))
            except RuntimeError as e:
                seen["zero"] = [type(e).__name__, str(e)]
        dist.barrier()
        if rank != 1:
            try:
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=2))
            except RuntimeError as e:
                seen["monitored"] = [type(e).__name__, str(e)]
        json.dump(seen, open(os.path.join(os.environ["JOB_OUT"], f"rank{rank}.json"), "w"))
        time.sleep(3)   # rank 1 stays until the others have given up on it
    """)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    kind, text, waited = seen[0]["barrier"]
    assert kind == "DistTimeoutError" and 1.0 <= waited < 20, seen[0]
    assert re.search(" (Timed out|closed|timeout) ", text), text   # torch's own tests look for this
    assert seen[0]["zero"][0] == "DistTimeoutError" and "Rank 0 timed out in monitoredBarrier" in seen[0]["zero"][1]
    assert seen[0]["monitored"] == ["DistError", "monitored_barrier(): Rank 1 failed to pass monitoredBarrier in 2 s"]
    assert seen[2]["monitored"][0] == "DistTimeoutError", seen[2]
    assert seen[2]["monitored"][1].startswith("monitored_barrier(): Rank 2 successfully reached monitoredBarrier, "
                                              "but received errors while waiting for send/recv from rank 0"), seen[2]
    assert seen[1] == {} and list(seen[2]) == ["monitored"], seen


def test_a_new_default_group_works_after_a_timeout_broke_the_old_one(tmp_path):
    """torch's promise after destroy_process_group: init_process_group again gives a working group. Rank 0
    alone calls a barrier that times out (breaking the default group); every rank destroys and inits
    again (as torch's own suite does between tests), and the sums are right on every rank."""
    proc = run(tmp_path, 3, """
        import datetime, json, os, torch, torch.distributed as dist
        import pydist.torch
        store = lambda n: "file://" + os.path.join(os.environ["JOB_OUT"], f"store{n}")
        rank = int(os.environ["PMI_RANK"])
        dist.init_process_group("pydist", init_method=store(1), rank=rank, world_size=3,
                                timeout=datetime.timedelta(seconds=1))
        seen = {}
        if rank == 0:
            try:
                dist.barrier()
            except RuntimeError as e:
                seen["timeout"] = type(e).__name__
        dist.destroy_process_group()
        for n in (2, 3):
            dist.init_process_group("pydist", init_method=store(n), rank=rank, world_size=3)
            t = torch.full((4,), float(rank + 1))
            dist.all_reduce(t)
            g = dist.new_group([0, 2])
            u = torch.ones(2)
            if rank != 1:
                dist.all_reduce(u, group=g)
            seen[f"init{n}"] = [t.tolist(), u.tolist()]
            dist.destroy_process_group()
        json.dump(seen, open(os.path.join(os.environ["JOB_OUT"], f"rank{rank}.json"), "w"))
    """)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert seen[0]["timeout"] == "DistTimeoutError", seen
    for r in range(3):
        for n in (2, 3):
            assert seen[r][f"init{n}"] == [[6.0] * 4, [1.0, 1.0] if r == 1 else [2.0, 2.0]], seen


def test_the_tutorial_example_trains_identically_on_every_rank(tmp_path):
    example = os.path.join(ROOT, "examples", "torch_lenet_sync_sgd.py")
    proc = run(tmp_path, 2, f"""
        import runpy, sys
        sys.argv = ["torch_lenet_sync_sgd.py", "--limit", "6000", "--epochs", "2"]
        runpy.run_path({example!r}, run_name="__main__")
    """)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # rank 0's last line, printed after every rank has finished (ranks' lines may interleave before)
    done = re.search(r"done: loss ([0-9.]+) in the first epoch, ([0-9.]+) in the last, test accuracy ([0-9.]+), "
                     r"weights identical on all 2 ranks: True", out)
    assert done, out
    first, last, accuracy = map(float, done.groups())
    assert last < first - 0.2 and accuracy > 0.3, out   # it learns (chance is 0.1)


@pytest.mark.parametrize("variable", ["PYDIST_SHM_SMALL_BYTES", "PYDIST_SHM_BYTES", "PYDIST_PERSISTENT_BYTES"])
def test_torch_groups_of_the_whole_world_on_every_path(variable):
    """tests/mpi/test_torch_backend.py's whole-world-group tests (issue 25, item 1: two torch groups of
    the same ranks never share a pydist group) with one of pydist's paths off, read at init: the small
    collectives in shared memory, the shared-memory all-reduce, the persistent requests. The automatic
    choice runs in tests/mpi itself."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env[variable] = "0"
    cmd = [sys.executable, os.path.join(ROOT, "tests", "run_mpi.py"), "-n", "2", "--",
           os.path.join(ROOT, "tests", "mpi", "test_torch_backend.py"), "-k", "whole_world"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert re.search(r"world size 2: 5 passed, 0 failed on 2/2 ranks", out), out


def test_init_process_group_pydist_works_in_a_script_that_never_imports_pydist(tmp_path):
    """torch loads the "torch.backends" entry point (_pydist_torch_entry.py) at `import torch`: the backend
    is there, and env:// under mpiexec is filled in from MPI when init_process_group asks."""
    proc = run(tmp_path, 2, """
        import os, sys, torch, torch.distributed as dist
        assert "pydist" not in sys.modules, "import torch imported pydist"
        dist.init_process_group("pydist")
        t = torch.arange(4.0) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        with open(os.path.join(os.environ["JOB_OUT"], f"rank{dist.get_rank()}.txt"), "w") as f:
            f.write(f"{dist.get_world_size()} {dist.get_backend()} {t.tolist()}")
        dist.destroy_process_group()
    """)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for r in range(2):
        assert (tmp_path / f"rank{r}.txt").read_text() == "2 pydist [0.0, 3.0, 6.0, 9.0]", out


def test_import_torch_alone_starts_no_mpi_and_leaves_other_jobs_env_alone(tmp_path):
    """`import torch` loads the entry point and nothing of pydist: no pydist module, no libmpi in the
    process. Outside an MPI launcher env:// stays torch's: a gloo job of one with its own RANK,
    WORLD_SIZE, MASTER_ADDR and MASTER_PORT runs as it would without pydist installed."""
    script = tmp_path / "alone.py"
    script.write_text(textwrap.dedent("""
        import socket, sys, torch, torch.distributed as dist
        assert "_pydist_torch_entry" in sys.modules, "torch did not load pydist's entry point"
        assert not [m for m in sys.modules if m == "pydist" or m.startswith("pydist.")], "pydist was imported"
        assert not [l for l in open("/proc/self/maps") if "libmpi" in l], "libmpi is loaded"
        assert "pydist" in dist.Backend.backend_list
        dist.init_process_group("gloo")
        assert "pydist" not in sys.modules and dist.get_world_size() == 1
        dist.destroy_process_group()
        print("ok")
    """))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MPI_", "HYDRA", "PYDIST_"))}
    env.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


def test_a_plain_python_script_asking_for_pydist_is_a_world_of_one(tmp_path):
    """Outside any launcher, with no RANK in the environment, init_process_group("pydist") in a script that
    never imports pydist is a world of one, as the torch guide says (it was torch's "environment variable
    RANK expected"); gloo in the same state still gets torch's own error."""
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent("""
        import sys, torch, torch.distributed as dist
        backend = sys.argv[1]
        dist.init_process_group(backend)
        t = torch.arange(3.0)
        dist.all_reduce(t)
        print(dist.get_backend(), dist.get_rank(), dist.get_world_size(), t.tolist())
        dist.destroy_process_group()
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MPI_", "HYDRA", "PYDIST_", "OMPI_"))
           and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")}
    proc = subprocess.run([sys.executable, str(script), "pydist"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "pydist 0 1 [0.0, 1.0, 2.0]", proc.stdout + proc.stderr
    proc = subprocess.run([sys.executable, str(script), "gloo"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and "environment variable RANK expected, but not set" in proc.stderr, proc.stderr


SPAWNED = """
    import sys, torch, torch.distributed as dist
    rank, path = int(sys.argv[1]), sys.argv[2]
    try:
        dist.init_process_group("pydist", store=dist.FileStore(path, 2), rank=rank, world_size=2)
    except ValueError as e:
        print("refused:", e)
        sys.exit(3)
    t = torch.ones(1)
    dist.all_reduce(t)
    print("sum", t.item())
"""


def test_processes_started_without_mpiexec_are_refused_not_summed_alone(tmp_path):
    """Two processes started the way torch's spawn harness starts them (no mpiexec, each told its rank of
    2 through a store) are each an MPI world of one: every pydist call would sum alone (all_reduce of
    ones gave 1.0 where 2.0 is right). Each is refused at init_process_group, naming what MPI started
    and how to start the job."""
    script = tmp_path / "spawned.py"
    script.write_text(textwrap.dedent(SPAWNED))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MPI_", "HYDRA", "PYDIST_", "OMPI_"))
           and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(tmp_path / "store")], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    for r, proc in enumerate(procs):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 3, out + err
        assert out.startswith(f'refused: init_process_group(backend="pydist"): torch was told rank {r} of 2 where '
                              "MPI started rank 0 of 1 (each process is an MPI world of one"), out
        assert "Start the job with mpiexec -n 2 (or python -m pydist.run -n 2)" in out, out


def test_ranks_in_another_order_than_mpis_are_refused_on_every_rank(tmp_path):
    """Under mpiexec, torch told the ranks in reverse order: only pydist's ranks (MPI's) would be used,
    so every rank raises the same ValueError, naming the first rank whose view differs, and none waits
    for the others in a collective."""
    proc = run(tmp_path, 3, """
        import os, pydist, torch, torch.distributed as dist
        pydist.init_process_group()
        r, n = pydist.get_rank(), pydist.get_world_size()
        try:
            dist.init_process_group("pydist", store=dist.FileStore(os.path.join(os.environ["JOB_OUT"], "store"), n),
                                    rank=n - 1 - r, world_size=n)
            said = "went on"
        except ValueError as e:
            said = f"refused: {e}"
        with open(os.path.join(os.environ["JOB_OUT"], f"rank{r}.txt"), "w") as f:   # (long lines interleave)
            f.write(said)
    """)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = [(tmp_path / f"rank{r}.txt").read_text() for r in range(3)]
    assert len(set(said)) == 1 and said[0].startswith("refused: "), said   # the same words on every rank
    assert "torch was told rank 2 of 3 where MPI started rank 0 of 3; pydist's ranks are MPI's" in said[0], said


DCP_JOB = """
    import json, os, sys, torch, torch.distributed as dist, torch.nn as nn
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group("pydist")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    mesh = init_device_mesh("cpu", (size,))
    for layer in model[::2]:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(7)
    X, Y = torch.randn(12, 16, generator=g), torch.randint(0, 4, (12,), generator=g)   # the global batch
    mine = slice(rank * 12 // size, (rank + 1) * 12 // size)                          # 12: 2, 3 and 4 divide it

    def step():
        loss = nn.functional.cross_entropy(model(X[mine]), Y[mine])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        return mean.item()

    checkpoint = os.path.join(os.environ["JOB_OUT"], "ckpt")
    losses = []
    if sys.argv[1] == "save":
        losses = [step() for _ in range(3)]
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=checkpoint)
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=checkpoint)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    losses += [step() for _ in range(3)]
    if rank == 0:
        with open(os.path.join(os.environ["JOB_OUT"], f"{sys.argv[1]}-{size}.json"), "w") as f:
            json.dump(losses, f)
    dist.destroy_process_group()
"""


def test_a_dcp_checkpoint_of_fsdp2_saved_at_4_ranks_resumes_at_2_and_3_with_the_same_losses(tmp_path):
    """torch.distributed.checkpoint over pydist: an FSDP2 model and its AdamW state, sharded over 4 ranks,
    saved after 3 steps of a global batch; loaded at 2 and at 3 ranks (resharded by DCP), the next 3
    steps' losses are those of the 4-rank run that went on without stopping (up to the summation order
    of the ranks' shares: 1e-5)."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(DCP_JOB))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(MPIEXEC_TIMEOUT="200", UCX_ERROR_SIGNALS="", JOB_OUT=str(tmp_path))
    for n, mode in ((4, "save"), (2, "load"), (3, "load")):
        proc = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, str(script), mode], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=230)
        assert proc.returncode == 0, f"{mode} at {n} ranks:\n" + proc.stdout[-3000:] + proc.stderr[-3000:]
    unstopped = json.loads((tmp_path / "save-4.json").read_text())
    assert len(unstopped) == 6 and unstopped[5] < unstopped[0], unstopped
    for n in (2, 3):
        resumed = json.loads((tmp_path / f"load-{n}.json").read_text())
        assert len(resumed) == 3 and max(abs(a - b) for a, b in zip(resumed, unstopped[3:])) <= 1e-5, (n, resumed, unstopped)


@pytest.mark.parametrize("backend", ["pydist", "gloo"])
def test_torch_distributed_debug_detail_catches_a_mismatched_collective(tmp_path, backend):
    """TORCH_DISTRIBUTED_DEBUG=DETAIL: rank 0 all-reduces 4 floats, rank 1 five. gloo's wrapper and
    pydist's own check (pydist/debug.py) both raise on every rank, naming what each rank passed, where
    without it the call would mix up data or hang."""
    proc = run(tmp_path, 2, f"""
        import os, torch, torch.distributed as dist
        dist.init_process_group("{backend}")
        t = torch.ones(4 + dist.get_rank())
        try:
            dist.all_reduce(t)
            outcome = "no error"
        except Exception as e:
            outcome = f"{{type(e).__name__}}: {{e}}"
        with open(os.path.join(os.environ["JOB_OUT"], f"rank{{dist.get_rank()}}.txt"), "w") as f:
            f.write(outcome)
    """, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    out = proc.stdout + proc.stderr
    outcomes = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    if backend == "gloo":
        assert all("Detected mismatch between collectives on ranks" in o for o in outcomes), outcomes + [out]
    else:
        for o in outcomes:
            assert o.startswith("ValueError: all_reduce(): PYDIST_DEBUG=DETAIL") and "rank 0: all_reduce(" in o \
                and "(4,)" in o and "(5,)" in o, outcomes + [out]
