"""The torch backend on the timeline (issue 28; pydist/torch.py, pydist/torch_hooks.py): a 2-rank DDP job
over pydist's backend with PYDIST_TIMELINE set gives, on both ranks, a "backward" span per backward pass
and a "bucket all_reduce" span per gradient bucket (cat "torch"), each around the pydist all-reduce that
carried it on the group's worker thread; with a pydist comm hook too."""
import json
import re
import os
import subprocess
import sys
import textwrap

from trace_format import validate
from unit_helpers import MPIEXEC

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 3   # per model

JOB = f"""
import torch, torch.distributed as dist, torch.nn as nn
import pydist.torch
from pydist.torch import hooks
dist.init_process_group(backend="pydist")
torch.manual_seed(0)
for hook in (None, hooks.fp16()):
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    model = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.1)   # several buckets
    if hook is not None:
        model.register_comm_hook(None, hook)
    for step in range({STEPS}):
        model(torch.randn(16, 64)).sum().backward()
print(f"params {{sum(p.numel() for p in net.parameters())}}", flush=True)   # one write per rank, before MPI_Finalize's exit
"""


def test_ddp_buckets_and_backward_passes_on_every_rank(tmp_path):
    (tmp_path / "job.py").write_text(textwrap.dedent(JOB))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(MPIEXEC_TIMEOUT="60", UCX_ERROR_SIGNALS="", PYDIST_TIMELINE="run.json",
               PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "job.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=90)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "params " in out, out
    params = int(re.search(r"params (\d+)\n", out).group(1))   # (both ranks print it; their lines may interleave)
    trace = json.loads((tmp_path / "run.json").read_text())
    problems = validate(trace)
    assert problems == [], problems[:10]
    events = trace["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    for rank in (0, 1):
        spans = sorted((e for e in events if e["ph"] == "X" and e["pid"] == rank), key=lambda e: e["ts"])
        backward = [e for e in spans if e.get("cat") == "torch" and e["name"] == "backward"]
        buckets = [e for e in spans if e.get("cat") == "torch" and e["name"] == "bucket all_reduce"]
        assert len(backward) == 2 * STEPS, (rank, backward)
        assert all(threads[rank, e["tid"]] == "main" for e in backward), rank
        assert all(threads[rank, e["tid"]].startswith("pydist-torch") for e in buckets), rank
        # each backward pass's buckets: issued from its first on, indexed 0, 1, ... and holding every gradient
        for i, b in enumerate(backward):
            end = backward[i + 1]["ts"] if i + 1 < len(backward) else float("inf")
            mine = [e for e in buckets if b["ts"] <= e["ts"] < end]
            assert len(mine) == b["args"]["buckets"] >= 1, (rank, i, b, mine)
            assert sorted(e["args"]["bucket"] for e in mine) == list(range(len(mine))), (rank, i, mine)
            assert sum(e["args"]["bytes"] for e in mine) == 4 * params, (rank, i, mine)
        # without a hook, each bucket span holds the pydist all-reduce that carried it (same thread, bytes)
        plain = [e for e in buckets if e["ts"] < backward[STEPS]["ts"]]
        for e in plain:
            inner = [c for c in spans if c.get("cat") == "comm" and c["tid"] == e["tid"] and
                     e["ts"] <= c["ts"] and c["ts"] + c["dur"] <= e["ts"] + e["dur"]]
            assert [(c["name"], c["args"]["bytes"]) for c in inner] == [("all_reduce", e["args"]["bytes"])], (rank, e)
