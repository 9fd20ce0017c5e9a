"""pytest plugin for tests/mpi: the same test files run on every rank of an `mpiexec -n N` job.

tests/run_mpi.py starts the job. Here each rank:
- initialises pydist once, with a timeout, so a test that leaves a peer waiting fails with
  DistTimeoutError instead of hanging the job;
- keeps only the tests whose `world_size(min=, max=)` or `world_size(sizes=(...))` marker admits N
  (deselected, never skipped);
- writes its own report, rank<r>.json, into $PYDIST_TEST_REPORT_DIR: mpiexec's exit status and
  interleaved output cannot say which rank failed, so the driver reads every rank's report; and,
  as each test starts, its name into rank<r>.current, so that the driver can say where a rank that
  was killed (a hang, the job's timeout) had stopped.
"""
import json
import os

import pydist as dist

TEST_TIMEOUT_S = float(os.environ.get("PYDIST_TEST_TIMEOUT", "60"))


_results = {}     # nodeid -> {"outcome", "longrepr", "duration"}
_collected = []


def pytest_configure(config):
    if not dist.is_initialized():
        dist.init_process_group(backend="mpi", timeout=TEST_TIMEOUT_S)


def _admits(item, size):
    mark = item.get_closest_marker("world_size")
    if mark is None:
        return True
    if "sizes" in mark.kwargs:   # world_size(sizes=(2, 4)): only these
        return size in mark.kwargs["sizes"]
    lo = mark.kwargs.get("min", 1)
    hi = mark.kwargs.get("max", None)
    return size >= lo and (hi is None or size <= hi)


def pytest_collection_modifyitems(config, items):
    size = dist.get_world_size()
    keep = [it for it in items if _admits(it, size)]
    dropped = [it for it in items if not _admits(it, size)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep
    _collected[:] = [it.nodeid for it in items] + [it.nodeid for it in dropped]


def pytest_runtest_logstart(nodeid, location):
    out_dir = os.environ.get("PYDIST_TEST_REPORT_DIR")
    if out_dir:
        with open(os.path.join(out_dir, f"rank{dist.get_rank()}.current"), "w") as f:
            f.write(nodeid)


def pytest_runtest_logreport(report):
    # one outcome per test: a failure in setup/call/teardown wins over a pass
    prev = _results.get(report.nodeid)
    if report.when == "call" or report.failed:
        if prev is None or prev["outcome"] == "passed":
            _results[report.nodeid] = {"outcome": report.outcome,
                                      "longrepr": str(report.longrepr) if report.failed else "",
                                      "duration": report.duration}


def pytest_sessionfinish(session, exitstatus):
    out_dir = os.environ.get("PYDIST_TEST_REPORT_DIR")
    if not out_dir:
        return
    report = {"rank": dist.get_rank(), "size": dist.get_world_size(), "exitstatus": int(exitstatus),
              "collected": _collected, "results": _results}
    path = os.path.join(out_dir, f"rank{dist.get_rank()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(path + ".tmp", path)
