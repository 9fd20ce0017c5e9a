"""The conformance fuzzer's bounded set (tests/conformance.py has the generator, the checks and the soak):
random programs of every collective and point-to-point call, sync and async, on sub-groups, at sizes
around every threshold, run on every path, each must finish, match NumPy's answer on every rank, and give
every rank of a group bitwise the same bytes.

A path is read at init, so each test re-initialises the session with the path's environment (and the
small staging chunk), runs the programs, and restores the session the other tests use. Every rank keeps
its own records; they are compared across ranks at the end with the same judge() as the soak's driver,
and a failure names the seed and the command that re-runs it alone.
"""
import os
import sys

import pytest

import pydist as dist
from helpers import parallel_assert

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import conformance as conf  # noqa: E402  (tests/conformance.py)

SEEDS = range(1, 1 + int(os.environ.get("PYDIST_CONFORMANCE_PROGRAMS", "8")))
LENGTH = 16                 # items per program: the soak draws longer ones
SESSION_TIMEOUT_S = 10.0     # a hang fails the program within this, not the suite's 60 s


def start_session(env, timeout):
    """Re-initialise pydist with `env` in os.environ (None: remove the variable); returns the old values."""
    old = {k: os.environ.get(k) for k in env}
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    dist.destroy_process_group()
    dist.init_process_group(backend="mpi", timeout=timeout)
    return old


@pytest.mark.parametrize("path", list(conf.PATHS))
def test_programs_on_path(path):
    size, rank = dist.get_world_size(), dist.get_rank()
    suite_timeout = float(os.environ.get("PYDIST_TEST_TIMEOUT", "60"))
    env = dict(conf.JOB_ENV, **conf.PATHS[path])
    old = start_session(env, SESSION_TIMEOUT_S)
    records, calls = {}, 0
    try:
        for seed in SEEDS:
            prog = conf.generate(seed, size, length=LENGTH)
            rec = {"event": "done", "problems": [], "hashes": {}, "error": None}
            try:
                n, rec["problems"], rec["hashes"] = conf.run_program(prog, dist)
                calls += n
            except Exception as e:  # noqa: BLE001 -- judged below, on every rank; the path stops here
                rec["error"] = f"{type(e).__name__}: {e}"
                rec["timeout"] = type(e).__name__ == "DistTimeoutError"
                records[seed] = rec
                break
            records[seed] = rec
    finally:
        # the C default of PYDIST_PERSISTENT_BYTES is the current bound, so "unset" would keep 0
        if "PYDIST_PERSISTENT_BYTES" in env and old["PYDIST_PERSISTENT_BYTES"] is None:
            old["PYDIST_PERSISTENT_BYTES"] = str(conf.PERSISTENT_BYTES)
        start_session(old, suite_timeout)
    everyone = [None] * size
    dist.all_gather_object(everyone, records)
    failures = []
    for seed in SEEDS:
        recs = {r: everyone[r][seed] for r in range(size) if seed in everyone[r]}
        for f in conf.judge(seed, recs, size, path, killed=False, ended=False, length=LENGTH) or []:
            failures.append(f"{f.category}: {f.detail[:500]}\n    re-run: {f.rerun()}")
        if len(recs) < size or any(rec["error"] for rec in recs.values()):
            break   # the programs after it did not run on every rank
    parallel_assert(not failures, f"{len(failures)} failure(s) at {size} ranks on path {path}:\n" +
                    "\n".join(failures))
    parallel_assert(calls > 0 or size == 1 or failures, "no call ran")
