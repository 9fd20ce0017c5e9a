"""An optional set-up step that fails on one rank changes nothing that another rank decides: every
collective of init runs on every rank, the failed rank takes the fallback path, and the job works
within init's timeout (real mpiexec: test_faults.py's run_job)."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from test_faults import PRELUDE, ROOT, reports, run_job

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import chaos  # noqa: E402  (its simulated hosts: one UTS and IPC namespace per host)


@pytest.mark.parametrize("failing", [0, 2])
def test_a_rank_without_its_heap_starts_and_computes_with_the_others(tmp_path, failing):
    """One rank cannot make its heap in the node's segment (PYDIST_TEST_SEGMENT_FALLBACK=heap, as if out
    of memory): init used to share the path table only on ranks with a segment, so the others waited in
    that broadcast until init's timeout. Now every rank takes part; each collective, small and past the
    slots, on ordinary and dist.empty arrays, gives NumPy's result on every rank."""
    proc, _ = run_job(tmp_path, 3, f"""
        if int(os.environ.get("PMI_RANK", "-1")) == {failing}:
            os.environ["PYDIST_TEST_SEGMENT_FALLBACK"] = "heap"   # read by init, on this rank only
        dist.init_process_group(timeout=20.0)
        r, n = dist.get_rank(), dist.get_world_size()
        rng = np.random.default_rng(7)
        inputs = [rng.integers(-100, 100, size=(n, count)).astype(np.float64) for count in (5, 40_000)]
        for data in inputs:
            x = data[r].copy()
            dist.all_reduce(x)
            report(f"SUM {{x.size}} {{np.array_equal(x, data.sum(axis=0))}}")
        y = dist.empty(40_000, dtype="float64")   # in the segment where this rank has a heap
        y[:] = inputs[1][r]
        dist.all_reduce(y)
        report(f"EMPTY {{np.array_equal(y, inputs[1].sum(axis=0))}}")
        dist.destroy_process_group()
    """, timeout=60)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in range(3):
        assert reports(tmp_path, rank) == ["SUM 5 True", "SUM 40000 True", "EMPTY True"], (rank, proc.stderr)


# A rank's init, and what came of it into rank<R>.txt (pydist has no rank to give when init failed); then
# a plain exit, with MPI_Finalize: a rank that left with os._exit made hydra kill the others, maybe before
# they had written (between simulated hosts, the finalize guard ends a hung MPI_Finalize with status 0).
TRY_INIT = textwrap.dedent("""
    me = int(os.environ.get("PMI_RANK", "-1"))
    t = time.monotonic()
    try:
        dist.init_process_group(timeout=30.0)
        said = "STARTED"
    except dist.DistError as e:
        said = f"{time.monotonic() - t:.1f} {e}"
    out = os.environ["JOB_OUT"]
    with open(os.path.join(out, f"rank{me}.part"), "w") as f:
        print(said, file=f)
    os.rename(os.path.join(out, f"rank{me}.part"), os.path.join(out, f"rank{me}.txt"))
""")


def assert_the_same_error(proc, tmp_path, n, want):
    """Every one of the n ranks raised the same error, starting `want`, well within init's 30 s."""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    said = [reports(tmp_path, rank) for rank in range(n)]
    shown = "\n".join(f"rank {r}: {lines}" for r, lines in enumerate(said)) + "\n" + proc.stderr[-3000:]
    texts = {lines[0].split(" ", 1)[1] for lines in said if lines}
    assert len(texts) == 1 and all(len(lines) == 1 for lines in said), shown
    assert texts.pop().startswith(want), shown
    assert all(float(lines[0].split()[0]) < 15.0 for lines in said), shown


@pytest.mark.parametrize("step, words", [("private_comm", "its private communicator"),
                                         ("liveness", "its liveness channel")])
@pytest.mark.parametrize("failing", [0, 2])
def test_a_step_one_rank_fails_at_init_is_the_same_error_on_every_rank(tmp_path, step, words, failing):
    """One rank cannot set up its private communicator or its liveness channel (PYDIST_TEST_FAIL_SETUP, as
    if out of memory). It used to raise at once while the others waited for it in the node's segment and
    the path table's broadcast until init's timeout (then raised another error, a timeout). Now it takes
    part in init's collectives, and every rank raises the same DistError, naming the rank and the step,
    well within the timeout."""
    proc, _ = run_job(tmp_path, 3, textwrap.dedent(f"""
        if int(os.environ.get("PMI_RANK", "-1")) == {failing}:
            os.environ["PYDIST_TEST_FAIL_SETUP"] = "{step}"   # read by init, on this rank only
    """) + TRY_INIT, timeout=90)
    want = (f"init_process_group(): world rank {failing} could not set up {words}"
            f"{' (how it learns of dead ranks)' if step == 'liveness' else ''}: MemoryError: out of memory")
    assert_the_same_error(proc, tmp_path, 3, want)


def unshare_works():
    try:
        return subprocess.run(["unshare", "--uts", "--ipc", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def run_two_nodes(tmp_path, body, timeout=90):
    """4 ranks on two simulated hosts, sim-h1 and sim-h2 (2 each): hydra's ssh launcher runs each host's
    proxy in a UTS and IPC namespace of its own (tests/chaos.py's wrapper), so each host is its own MPICH
    node with its own shared-memory segment, and UCX goes over TCP between them."""
    launch, guard = tmp_path / "launch", tmp_path / "finalize_guard.so"
    launch.write_text(chaos.HOST_LAUNCH)
    launch.chmod(0o755)
    # (UCX over TCP may hang in MPI_Finalize: the guard of scripts/cluster.sh ends such a rank after 5 s)
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(guard),
                    os.path.join(ROOT, "scripts", "cluster_finalize_guard.c"), "-ldl", "-lpthread"], check=True)
    script = tmp_path / "job.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    env = dict(os.environ, MPIEXEC_TIMEOUT=str(timeout), UCX_ERROR_SIGNALS="", JOB_OUT=str(tmp_path))
    mpiexec = shutil.which("mpiexec.mpich") or "mpiexec"
    cmd = [mpiexec, "-launcher", "ssh", "-launcher-exec", str(launch), "-genv", "LD_PRELOAD", str(guard),
           "-hosts", "sim-h1:2,sim-h2:2", "-n", "4", sys.executable, str(script)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout + 30)


@pytest.mark.skipif(not unshare_works(), reason="NOT RUN (simulated hosts): no UTS/IPC namespaces here (root)")
@pytest.mark.parametrize("knob", ["PYDIST_TEST_SEGMENT_FALLBACK=heap", "PYDIST_SHM_BYTES=0"])
def test_one_node_without_its_heap_or_segment_computes_with_the_other(tmp_path, knob):
    """Host sim-h2's ranks make no heap in their node's segment, or no segment at all (as a node whose
    /dev/shm is full): the world-wide steps of init run alike on both hosts, and every collective, on
    ordinary and dist.empty arrays, on the world and on each host's group, gives NumPy's result."""
    name, value = knob.split("=")
    proc = run_two_nodes(tmp_path, f"""
        import socket
        if socket.gethostname() == "sim-h2":
            os.environ["{name}"] = "{value}"   # this node's ranks only
        dist.init_process_group(timeout=30.0)
        r, n = dist.get_rank(), dist.get_world_size()
        rng = np.random.default_rng(7)
        results = []
        for count in (5, 40_000):
            data = rng.integers(-100, 100, size=(n, count)).astype(np.float64)
            x = data[r].copy()
            dist.all_reduce(x)
            results.append(np.array_equal(x, data.sum(axis=0)))
            y = dist.empty(count, dtype="float64")
            y[:] = data[r]
            dist.all_reduce(y)
            results.append(np.array_equal(y, data.sum(axis=0)))
        hosts = [None] * n
        dist.all_gather_object(hosts, socket.gethostname())
        mine = [i for i in range(n) if hosts[i] == hosts[r]]
        groups = [dist.new_group([i for i in range(n) if hosts[i] == h]) for h in sorted(set(hosts))]
        group = groups[sorted(set(hosts)).index(hosts[r])]
        z = np.full(1000, float(r))
        dist.all_reduce(z, group=group)
        results.append(np.array_equal(z, np.full(1000, float(sum(mine)))))
        report(f"{{socket.gethostname()}} {{all(results)}} {{results}}")
        dist.barrier()   # then a plain exit (a rank leaving by os._exit would make hydra kill the others)
    """)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    said = [reports(tmp_path, rank) for rank in range(4)]
    assert [lines[0].split()[:2] for lines in said] == [["sim-h1", "True"]] * 2 + [["sim-h2", "True"]] * 2, said


@pytest.mark.skipif(not unshare_works(), reason="NOT RUN (simulated hosts): no UTS/IPC namespaces here (root)")
def test_one_node_failing_a_step_at_init_is_the_same_error_on_both(tmp_path):
    """Host sim-h2's ranks cannot set up their liveness channel: every rank of both hosts raises the same
    DistError (naming the first of them) within init's timeout."""
    proc = run_two_nodes(tmp_path, textwrap.dedent("""
        import socket
        if socket.gethostname() == "sim-h2":
            os.environ["PYDIST_TEST_FAIL_SETUP"] = "liveness"
    """) + TRY_INIT)
    assert_the_same_error(proc, tmp_path, 4, "init_process_group(): world rank 2 could not set up its liveness channel")
