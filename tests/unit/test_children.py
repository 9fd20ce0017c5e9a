"""A process made from a rank never finalizes or aborts MPI and never harms the parent's job (issue 25,
item 7; DESIGN.md, "Semantics every path keeps"), under real mpiexec at 2 ranks: every rank makes a
child of one kind (os.fork leaving by sys.exit, an exception or os._exit; multiprocessing with each
start method; subprocess running python that imports pydist), the child's every call into pydist
raises DistError naming the child and the parent's rank, and then the parents' collectives are exactly
NumPy's and the job exits 0 on every rank. Before, a forked child's sys.exit ran MPI_Finalize at exit
(UCX asserted and the parent died in its own finalize, exit code 6), and a fresh interpreter's
init_process_group joined the job as its parent's rank through the inherited PMI_FD or aborted on it."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import pydist
from unit_helpers import MPIEXEC

# The pydist under test (the in-place build, or the AddressSanitizer one scripts/test.sh points to)
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(pydist.__file__)))

JOB = """
import json, multiprocessing, os, subprocess, sys
import numpy as np
import pydist as dist

def calls():
    \"\"\"In the child: every kind of call, each answered by what it raised.\"\"\"
    import numpy as np
    import pydist as dist
    got = {}
    tries = [("init_process_group", lambda: dist.init_process_group(timeout=20))]
    if dist.is_initialized():   # a forked child holds the parent's session
        peer = 1 - dist.get_rank()
        tries += [("all_reduce", lambda: dist.all_reduce(np.ones(3))),
                  ("all_reduce async", lambda: dist.all_reduce(np.ones(3), async_op=True)),
                  ("broadcast", lambda: dist.broadcast(np.ones(3), 0)),
                  ("barrier", lambda: dist.barrier()),
                  ("send", lambda: dist.send(np.ones(2), peer)),
                  ("irecv", lambda: dist.irecv(np.ones(2), peer)),
                  ("new_group", lambda: dist.new_group([0, 1])),
                  ("empty", lambda: dist.empty(4)),
                  ("destroy_process_group", lambda: dist.destroy_process_group())]
    for name, call in tries:
        try:
            call()
            got[name] = "returned"
        except dist.DistError as e:
            got[name] = "DistError: " + str(e)
        except BaseException as e:
            got[name] = type(e).__name__ + ": " + str(e)
    return got


def record(got):
    with open(os.path.join(os.environ["JOB_OUT"], "child%s.json" % os.environ.get("PMI_RANK")), "w") as f:
        json.dump(got, f)


def in_child(how):
    record(calls())
    if how == "exit":
        sys.exit(0)
    if how == "raise":
        raise RuntimeError("the child fails on purpose")
    os._exit(3)


def mp_child(queue):
    queue.put(calls())


def check(rank, size, k):
    \"\"\"The parents' collectives, against NumPy.\"\"\"
    x = np.full(5, float(rank + k))
    dist.all_reduce(x)
    y = np.arange(4.0) * (rank + 1)
    dist.broadcast(y, 1)
    w = dist.all_reduce(np.full(3, rank + 1), async_op=True)
    w.wait()
    return bool(np.array_equal(x, np.full(5, float(sum(r + k for r in range(size))))) and
                np.array_equal(y, np.arange(4.0) * 2) and np.array_equal(w.result()[0], np.full(3, 3)))


if __name__ == "__main__":
    KIND, OUT = sys.argv[1], os.environ["JOB_OUT"]
    dist.init_process_group(timeout=60)
    rank, size = dist.get_rank(), dist.get_world_size()
    ok = [check(rank, size, 0)]
    w = dist.all_reduce(np.ones(2), async_op=True)   # pending across the fork on purpose
    if KIND.startswith("fork-"):
        pid = os.fork()
        if pid == 0:
            in_child(KIND[5:])
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
    elif KIND.startswith("mp-"):
        ctx = multiprocessing.get_context(KIND[3:])
        queue = ctx.Queue()
        p = ctx.Process(target=mp_child, args=(queue,))
        p.start()
        record(queue.get(timeout=60))
        p.join(60)
        code = p.exitcode
    else:
        script = "import json, sys; sys.path.insert(0, %r); from job import calls; print(json.dumps(calls()))" % (
            os.path.dirname(os.path.abspath(__file__)))
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                              close_fds=(KIND == "subprocess"))
        sys.stderr.write(proc.stderr)
        record(json.loads(proc.stdout.strip().splitlines()[-1]))
        code = proc.returncode
    w.wait()
    ok += [check(rank, size, k) for k in range(1, 20)]
    dist.barrier()
    with open(os.path.join(OUT, "rank%d.json" % rank), "w") as f:
        json.dump({"ok": all(ok), "child exit": code}, f)
"""

# kind: the child's exit code it must leave with
KINDS = {"fork-exit": 0, "fork-raise": 1, "fork-_exit": 3, "mp-fork": 0, "mp-spawn": 0, "mp-forkserver": 0,
         "subprocess": 0, "subprocess-open-fds": 0}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_child_never_harms_the_parents_job(tmp_path, kind):
    (tmp_path / "job.py").write_text(JOB)
    env = dict(os.environ, MPIEXEC_TIMEOUT="90", UCX_ERROR_SIGNALS="", JOB_OUT=str(tmp_path))
    env["PYTHONPATH"] = os.pathsep.join([PKG_PARENT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(tmp_path / "job.py"), kind], cwd=str(tmp_path),
                          env=env, capture_output=True, text=True, timeout=150)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "MPI_Finalize" not in out and "MPI_Abort" not in out and "Assertion" not in out, out
    for rank in range(2):
        parent = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert parent == {"ok": True, "child exit": KINDS[kind]}, (rank, parent, out)
        child = json.loads((tmp_path / f"child{rank}.json").read_text())
        forked = kind.startswith("fork-") or kind == "mp-fork"
        assert len(child) == (10 if forked else 1), child
        for call, answer in child.items():
            assert answer.startswith(f"DistError: {call.split()[0]}(): this is a child process"), (call, answer)
            assert f"of rank {rank}" in answer and "MPI" in answer, (call, answer)
    if kind == "fork-raise":   # the child's traceback, and no abort of the job
        assert "RuntimeError: the child fails on purpose" in out and "aborting the job" not in out, out
