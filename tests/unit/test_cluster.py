"""Several hosts (issue 14): scripts/cluster.sh makes 3 simulated hosts (network namespaces on a bridge),
and real jobs run across them with ranks on 2 and on 3 hosts: tests/mpi's collectives, sub-groups and
point-to-point, a rank that exits, a timeout, the training engine with every strategy, the examples.

Needs root and working network namespaces. Where the machine has neither, every test here is SKIPPED
with a reason that starts "NOT RUN (several hosts)", so that it shows in pytest's summary (-rs) and is
never mistaken for a pass.

One cluster for the whole module (a fixture), brought down first in case an earlier run left one, and
brought down at the end, which the last test checks leaves nothing behind.
"""
import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER = os.path.join(ROOT, "scripts", "cluster.sh")
HOSTS = 3
DATA = "/usr/share/datasets/fashion-mnist"


def why_not():
    """Why this machine cannot run a simulated cluster, or None."""
    if os.geteuid() != 0:
        return "not root (network namespaces and links need root)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) not installed"
    try:
        proc = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`ip netns list` failed: {e}"
    if proc.returncode != 0:
        return f"`ip netns` unusable: {proc.stderr.strip()}"
    return None


REASON = why_not()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"NOT RUN (several hosts): {REASON}")

# Ranks find pydist in this checkout; a finalize that hangs in UCX's TCP disconnect (see
# scripts/cluster_finalize_guard.c) is cut after 1 s rather than 5: finalize takes milliseconds,
# and all work is done by then.
ENV = dict(os.environ, PYTHONPATH=ROOT, PYDIST_CLUSTER_FINALIZE_GUARD="1", PYTHONFAULTHANDLER="1")
ENV["PATH"] = os.path.dirname(sys.executable) + os.pathsep + ENV.get("PATH", "")


# The simulated cluster is the machine's: the suite's two lanes both bring it up and down (this module and
# test_cluster_failures.py in one, test_benchmarks.py's cluster_model run in the other), so each holds
# this lock for as long as it uses the cluster. (/run is root's, as the cluster is.)
LOCK = "/run/pydist-cluster.lock"
LOCK_WAIT_S = 600   # longer than either user holds it (about 4 min, on a busy machine)


@contextlib.contextmanager
def cluster_to_ourselves():
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"the simulated cluster was still in use by another test after {LOCK_WAIT_S} s "
                                f"({LOCK} held)")
                time.sleep(0.5)
        yield
    finally:
        os.close(fd)   # (releases the lock)


def cluster(*args, timeout=120, check=True):
    proc = subprocess.run([CLUSTER, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, f"cluster.sh {' '.join(args)}: rc {proc.returncode}\n{proc.stdout}{proc.stderr}"
    return proc


# What hydra prints when the finalize guard ended a rank that was inside MPI_Finalize's PMI barrier
# after all (its proxy then writes the barrier's answer to a closed socket), or the proxy's SIGPIPE
# death (128 + 13) from the same race: UCX's TCP disconnect hang (openucx/ucx#8738) and the guard meet
# hydra, not pydist. Seen in one job in 5-10 at 3 hosts, at this commit and at every earlier one
# measured (bdebc52: 2 of 12), on a quiet machine too. Its other face: the guard ends a rank (exit 0)
# while a peer is still in MPI_Finalize, whose UCX then sees the connection drop and exits 1, or a
# proxy asserts (!closed); the guard's own line on stderr says every operation had completed. Seen in
# 2 of 25 probe jobs at 296f0f6 and 5 of 25 at 8173ac4 (tests/unit/test_cluster.py's probe, 3 hosts).
PMI_RACE = ("error sending PMI response", "error writing PMI line",
            "cluster finalize guard: MPI_Finalize did not return")


def run(n, *cmd, ppn=None, timeout=120, retry=True):
    """`cluster.sh run` of a command across the hosts; returns the finished process. A job that ended
    in the guard/hydra race above (every rank's work done) is run again, up to twice, saying so on
    stderr (two races in a row were seen in about 1 job in 30)."""
    args = ["run", "-n", str(n), "--timeout", str(timeout)] + (["--ppn", str(ppn)] if ppn else []) + ["--", *cmd]
    proc = cluster(*args, timeout=timeout + 60, check=False)
    for _ in range(2 if retry else 0):
        if proc.returncode != 141 and (proc.returncode == 0 or not any(s in proc.stderr for s in PMI_RACE)):
            break
        print(f"test_cluster: the finalize guard met hydra's PMI barrier (rc {proc.returncode}); once more",
              file=sys.stderr)
        proc = cluster(*args, timeout=timeout + 60, check=False)
    return proc


def script(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def leftovers():
    """Our namespaces and links that still exist."""
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return (re.findall(r"^(?:pdh\d+|pdsw)\b", ns, re.M) + re.findall(r"^\d+: (pdv\d+|pdbr0)\b", links, re.M)
            + [p for p in ("/run/pydist-cluster",) if os.path.exists(p)]
            + [p for p in (f"/etc/netns/pdh{i}" for i in range(1, HOSTS + 1)) if os.path.exists(p)])


def link_bytes():
    """{host: bytes its eth0 has sent} from `cluster.sh status`."""
    out = cluster("status").stdout
    return {m[0]: int(m[1]) for m in re.findall(r"^\s+(pdh\d+)\s+\S+\s+rx \d+ B, tx (\d+) B", out, re.M)}


@pytest.fixture(scope="module")
def hosts():
    with cluster_to_ourselves():
        cluster("down")
        cluster("up", str(HOSTS))
        yield HOSTS
        cluster("down")


# What a rank reports about where it runs, and one all-reduce of `mib` MiB (timed) checked against
# the sum every rank can compute for itself.
PROBE = """
import socket, sys, time
import numpy as np
import pydist as dist
dist.init_process_group()
r, n = dist.get_rank(), dist.get_world_size()
mib = float(sys.argv[1])
a = np.full(max(int(mib * (1 << 18)), 1), r + 1, dtype=np.float32)
dist.barrier()
t = time.perf_counter()
dist.all_reduce(a)
dt = time.perf_counter() - t
assert (a == n * (n + 1) / 2).all(), a[:4]
info = dist._C.shm_info()
print(f"RANK {r} {n} {socket.gethostname()} {info['node_size']} {info['node_rank']} {dt:.4f}", flush=True)
dist.destroy_process_group()
"""


def probe(tmp_path, n, mib=0.0, ppn=None):
    proc = run(n, sys.executable, "-P", script(tmp_path, "probe.py", PROBE), str(mib), ppn=ppn, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # (hydra may join two ranks' lines into one: matched anywhere, not per line)
    found = re.findall(r"RANK (\d+) \d+ (pdh\d+) (\d+) (\d+) (\d+\.\d{4})", proc.stdout)
    rows = sorted((int(r), h, int(ns), int(nr), float(dt)) for r, h, ns, nr, dt in found)
    assert [row[0] for row in rows] == list(range(n)), proc.stdout
    return rows


def test_the_root_namespace_keeps_its_interfaces(hosts):
    """The bridge and its ports live in the switch namespace (pdsw): an MPI job starting on this machine
    while a cluster comes up or goes down must not see an interface vanish as UCX opens it (MPI_Init
    failed with "init_worker No such device" beside the cluster tests in stop 53's CI)."""
    root = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=10).stdout
    assert not re.findall(r"^\d+: (pd\w+)", root, re.M), root
    switch = subprocess.run(["ip", "-n", "pdsw", "-o", "link"], capture_output=True, text=True, timeout=10).stdout
    ports = set(re.findall(r"^\d+: (pdv\d+|pdbr0)\b", switch, re.M))
    assert ports == {"pdbr0", *(f"pdv{i}" for i in range(1, hosts + 1))}, switch


def test_up_twice_refuses_and_status_lists_the_hosts(hosts):
    proc = cluster("up", "2", check=False)
    assert proc.returncode != 0
    assert "already up" in proc.stderr and "down" in proc.stderr, proc.stderr
    out = cluster("status").stdout
    for i in range(1, hosts + 1):
        assert re.search(rf"^\s+pdh{i}\s+10\.77\.0\.{i}\s", out, re.M), out
    proc = cluster("rate", "fast", check=False)
    assert proc.returncode != 0 and "not understood" in proc.stderr, proc.stderr
    if shutil.which("setpriv"):   # as an ordinary user: refused, saying why
        # a copy the user can reach (the checkout may sit in a folder only root can enter, as mktemp's)
        reachable = tempfile.mkdtemp(prefix="pydist-cluster-")
        try:
            os.chmod(reachable, 0o755)
            copy = os.path.join(reachable, "cluster.sh")
            shutil.copy(CLUSTER, copy)
            os.chmod(copy, 0o755)
            proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", copy, "up", "2"],
                                  capture_output=True, text=True, timeout=30, cwd=reachable)
        finally:
            shutil.rmtree(reachable, ignore_errors=True)
        assert proc.returncode != 0 and "must run as root" in proc.stderr, proc.stderr


def test_ranks_on_different_hosts_are_different_nodes_and_their_traffic_crosses_the_links(hosts, tmp_path):
    before = link_bytes()
    # round robin over 3 hosts: one rank per host, each its own node (MPI_Comm_split_type, pydist's shm)
    rows = probe(tmp_path, 3, mib=1)
    assert [(h, ns, nr) for _, h, ns, nr, _ in rows] == [("pdh1", 1, 0), ("pdh2", 1, 0), ("pdh3", 1, 0)], rows
    after = link_bytes()
    for h in ("pdh1", "pdh2", "pdh3"):   # the ring all-reduce sends 2 (R-1)/R x 1 MiB from every host
        assert after[h] - before[h] > (1 << 20), (before, after)
    # 2 ranks per host on 2 hosts: ranks of one host share a node, the hosts do not
    rows = probe(tmp_path, 4, ppn=2)
    assert [(h, ns, nr) for _, h, ns, nr, _ in rows] == [("pdh1", 2, 0), ("pdh1", 2, 1), ("pdh2", 2, 0),
                                                         ("pdh2", 2, 1)], rows


def test_a_shaped_link_slows_a_large_all_reduce(hosts, tmp_path):
    mib, mbit = 2, 50
    cluster("rate", f"{mbit}mbit")
    try:
        slow = max(row[4] for row in probe(tmp_path, 2, mib=mib))
    finally:
        cluster("rate", "none")
    fast = max(row[4] for row in probe(tmp_path, 2, mib=mib))
    wire = mib * (1 << 20) * 8 / (mbit * 1e6)   # 2 ranks: each sends the whole array once
    assert slow > 0.8 * wire, (slow, wire)      # no faster than the link allows
    assert fast < slow / 3, (fast, slow)


# One or two cases of each: every collective (all_reduce, broadcast, reduce, all_gather, gather,
# scatter, reduce_scatter, all_to_all, async), every collective on a sub-group, point-to-point.
MPI_FILES = ("test_all_reduce.py", "test_broadcast_barrier.py", "test_collectives.py", "test_groups.py",
             "test_p2p.py")
MPI_SELECTION = ("(test_every_op_and_dtype and SUM and float64) or (test_multi_mib and float32) or "
                 "(test_broadcast_from_every_root and float32) or (test_reduce_every_root and SUM and float32) or "
                 "(test_all_gather_list_and_tensor and float32) or (test_gather_and_scatter_every_root and float64) "
                 "or (test_reduce_scatter and float32 and SUM) or test_all_to_all_lists or "
                 "test_all_to_all_single_equal_and_uneven or test_async_collectives_out_of_order or "
                 "test_every_collective_on_a_subgroup or (test_ring_send_recv and float64) or "
                 "test_isend_irecv_all_pairs or test_recv_from_anyone")


def test_mpi_tests_across_hosts(hosts):
    """A selection of tests/mpi at 3 ranks, one per host, through tests/run_mpi.py --cluster (2 hosts: the
    engine and the examples below; each world size here costs ~6 s of start-up)."""
    files = [os.path.join(ROOT, "tests", "mpi", f) for f in MPI_FILES]   # only these: collects 5x faster
    cmd = [sys.executable, os.path.join(ROOT, "tests", "run_mpi.py"), "--cluster", "-n", "3",
           "--timeout", "240", "--", "-k", MPI_SELECTION] + files
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-4000:]
    sizes = re.findall(r"^world size (\d): (\d+) passed, 0 failed on (\d)/\d ranks", proc.stdout, re.M)
    assert [(s, r) for s, _, r in sizes] == [("3", "3")], proc.stdout
    assert all(int(p) >= 25 for _, p, _ in sizes), proc.stdout


def test_a_rank_that_exits_ends_the_job_with_a_clear_message(hosts, tmp_path):
    body = ("import numpy as np, pydist as dist\n"
            "dist.init_process_group()\n"
            "if dist.get_rank() == 1:\n"
            "    raise SystemExit(0)\n"
            "dist.all_reduce(np.ones(4))\n")
    start = time.monotonic()
    proc = run(2, sys.executable, "-P", script(tmp_path, "dead.py", body), timeout=60)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "rank 1 has exited" in proc.stderr and "all_reduce cannot complete" in proc.stderr, proc.stderr
    assert time.monotonic() - start < 45, "the job should end at once, not at its timeout"


def test_a_hung_job_ends_at_its_timeout_and_leaves_no_process(hosts):
    start = time.monotonic()
    proc = run(2, sys.executable, "-c", "import time; time.sleep(120)", timeout=3)
    took = time.monotonic() - start
    assert proc.returncode != 0
    assert "TIMED OUT" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert took < 30, took
    # A killed rank may take a moment to be reaped on a busy machine: gone within 10 s is what counts.
    deadline = time.monotonic() + 10
    for i in range(1, hosts + 1):
        while True:
            pids = subprocess.run(["ip", "netns", "pids", f"pdh{i}"], capture_output=True, text=True).stdout.split()
            if pids == [] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert pids == [], (i, pids)


# Every strategy the engine has (pydist.engine.STRATEGIES, so a new one is tested here too), a few
# steps each on 1,536 Fashion-MNIST examples; the model must learn something (accuracy well above
# chance's 0.1) and every rank must agree on the evaluation.
ENGINE = """
import sys
import numpy as np
import pydist as dist
from pydist.engine import STRATEGIES, Trainer, load_fashion_mnist, mlp
dist.init_process_group()
(x, y), (xt, yt) = load_fashion_mnist(sys.argv[1])
x, y, xt, yt = x[:1536], y[:1536], xt[:600], yt[:600]
for name in STRATEGIES:
    t = Trainer(mlp((32,)), lr=0.05, batch_size=32, seed=1, strategy=name)
    t.fit(x, y, 1, progress=False)
    ev = t.evaluate(xt, yt)
    got = [None] * dist.get_world_size()
    dist.all_gather_object(got, round(ev["accuracy"], 6))
    assert len(set(got)) == 1, (name, got)
    if dist.get_rank() == 0:
        print(f"STRATEGY {name} {ev['accuracy']:.3f}", flush=True)
"""


@pytest.mark.parametrize("n, ppn", [(3, None), (4, 2)], ids=["3hosts", "2hosts-2each"])
def test_engine_every_strategy_across_hosts(hosts, tmp_path, n, ppn):
    from pydist.engine import STRATEGIES
    proc = run(n, sys.executable, "-P", script(tmp_path, "engine.py", ENGINE), DATA, ppn=ppn, timeout=240)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    acc = dict(re.findall(r"^STRATEGY (\w+) ([\d.]+)$", proc.stdout, re.M))
    assert sorted(acc) == sorted(STRATEGIES), proc.stdout
    for name, a in acc.items():
        # above chance (0.1) after one short epoch; the asynchronous ones vary with the machine's load
        # (downpour reached 0.29 once with another process busy, 0.45 and up otherwise)
        assert float(a) > 0.2, (name, a, proc.stdout)


def test_examples_across_hosts(hosts):
    ex = os.path.join(ROOT, "examples")
    proc = run(3, sys.executable, "-P", os.path.join(ex, "ptdist_allreduce.py"), timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(re.findall(r"Rank (\d) has data (-?\d+\.\d)", proc.stdout)) == [("0", "0.0"), ("1", "0.0"),
                                                                          ("2", "0.0")], proc.stdout
    proc = run(2, sys.executable, "-P", os.path.join(ex, "ptdist_p2p.py"), timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Rank 1 has data" in proc.stdout, proc.stdout


def test_torch_example_across_hosts(hosts):
    """(~13 s here, most of it importing torch in two processes on two busy cores)"""
    ex = os.path.join(ROOT, "examples")
    # torch.distributed over pydist: its rendezvous (a TCPStore on rank 0's host, found by hostname)
    proc = run(2, sys.executable, "-P", os.path.join(ex, "torch_lenet_sync_sgd.py"), "--limit", "1024",
               "--epochs", "1", "--batch", "64", timeout=180)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "weights identical on all 2 ranks: True" in proc.stdout, proc.stdout


def test_a_job_killed_midway_then_down_leaves_nothing(hosts, tmp_path):
    """Last: kills a running job with SIGKILL (launcher and all), then `down`, twice."""
    job = subprocess.Popen([CLUSTER, "run", "-n", "3", "--timeout", "60", "--", sys.executable, "-c",
                            "import pydist as dist, time; dist.init_process_group(); print('up', flush=True); "
                            "time.sleep(60)"], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        # every rank is up (hydra may glue the ranks' lines together: "upup")
        seen = ""
        while seen.count("up") < 3:
            line = job.stdout.readline()
            assert line, f"the job ended before every rank was up: {seen!r}"
            seen += line
    finally:
        os.killpg(job.pid, signal.SIGKILL)   # the job's own session: cluster.sh, timeout, mpiexec
        job.wait(timeout=30)
    ranks = subprocess.run(["ip", "netns", "pids", "pdh1"], capture_output=True, text=True).stdout.split()
    assert ranks, "the ranks should still be running inside the hosts before `down`"
    cluster("down")
    assert leftovers() == []
    cluster("down")   # twice is fine
    assert leftovers() == []
