"""One rank of torch's own distributed test suite (DistributedTest._DistTestBase), run under mpiexec.

    mpiexec -n N python tests/torch_suite/rank.py --backend pydist|gloo --tests FILE --out DIR

Each test runs as torch's harness runs it in a spawned process (TestDistBackend._run): the test's own
folders (TEMP_DIR), init_process_group(backend, init_method=file://..., world_size=N, rank=MPI's rank,
timeout=the test's), torch's file barrier, the test, the barrier again, destroy_process_group. The
difference from torch's harness: the processes are MPI's ranks, started once, and run the tests one
after another. Each rank appends a line of JSON to DIR/rank<R>.jsonl when a test starts and when it
ends (passed, skipped, errored with the traceback); a test that runs past --deadline seconds ends the
rank with "hung" (mpiexec then ends the others) and run.py starts the job again after it, as it does
after a test that errored and after one that times out a collective on purpose (leaves_messages).

The suite asks whether the backend is gloo where it means "the CPU backend"; pydist answers as gloo's
alias (BackendName, import_suite), so it runs gloo's list of tests with gloo's expectations. The
tests themselves are not changed.
"""
import argparse
import datetime
import json
import os
import sys
import threading
import time
import traceback
import unittest


def mpi_rank_and_size():
    """From the launcher's environment (hydra's PMI_*, Open MPI's OMPI_COMM_WORLD_*)."""
    for rank, size in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    sys.exit("rank.py: not started by mpiexec (no PMI_RANK/PMI_SIZE in the environment)")


class BackendName(str):
    """pydist's name as the suite sees it: "pydist", and equal to "gloo" too. The suite asks
    `BACKEND == "gloo"` (or `!=`, or `in ["gloo", ...]`) where it means "the CPU backend that does
    timeouts, sparse tensors, DDP on the CPU, ..."; pydist's backend claims all of that, so it takes
    gloo's branch at each such question and is held to the same tests and expectations. Everything
    else sees "pydist": init_process_group(backend=BACKEND), BACKEND.lower(), messages."""

    def __eq__(self, other):
        return str.__eq__(self, other) or other == "gloo"

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = str.__hash__


def import_suite(backend):
    """torch's distributed_test, with its questions about the backend answered for `backend`: gloo
    as itself; pydist as gloo's alias (BackendName), both in the decorators that decide at import
    (the module is imported as for gloo) and in the tests' bodies, and in torch's tables of backend
    features (DistTestCases: pydist is in every set gloo is in)."""
    from torch.testing._internal.common_distributed import DistTestCases
    if backend == "pydist":
        os.environ["BACKEND"] = "gloo"
        for table in (DistTestCases.skip_collective, DistTestCases.backend_feature):
            for backends in table.values():
                if "gloo" in backends:
                    backends.add(backend)
    from torch.testing._internal.distributed import distributed_test as suite
    os.environ["BACKEND"] = backend
    if backend == "pydist":
        suite.BACKEND = BackendName(backend)
    return suite


def leaves_messages(name):
    """Tests in which one rank times out a collective on purpose: what it sent stays at the ranks that
    never made the call, where a later test's group could take it (docs/guides/errors.md, timeouts).
    torch's harness runs every test in fresh processes; after these, so does this one."""
    return "timeout" in name or "monitored_barrier" in name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", required=True)
    ap.add_argument("--tests", required=True, help="a file with one test name a line")
    ap.add_argument("--out", required=True, help="the folder for rank<R>.jsonl and the tests' folders")
    ap.add_argument("--deadline", type=float, default=120, help="seconds a test may run (a hang guard)")
    args = ap.parse_args()
    rank, size = mpi_rank_and_size()
    os.environ["BACKEND"], os.environ["WORLD_SIZE"] = args.backend, str(size)
    os.environ.setdefault("TEMP_DIR", args.out)   # read at import; each test gets its own below
    # the harness's file:// rendezvous, as torch's CI runs gloo (tests that need it ask at import)
    os.environ["INIT_METHOD"] = "file://" + os.path.join(args.out, "init_file")
    if args.backend == "pydist":
        import pydist.torch  # noqa: F401  (registers the backend; starts MPI)
    import torch.distributed as dist
    from torch.testing._internal import common_utils
    from torch.testing._internal.common_distributed import TEST_SKIPS
    suite = import_suite(args.backend)

    class Case(suite.TestDistBackend, suite.DistributedTest._DistTestBase):
        pass

    skip_codes = {skip.exit_code: skip.message for skip in TEST_SKIPS.values()}
    names = [line.strip() for line in open(args.tests) if line.strip()]
    log = open(os.path.join(args.out, f"rank{rank}.jsonl"), "a", buffering=1)

    def record(**fields):
        log.write(json.dumps(fields) + "\n")
        log.flush()
        os.fsync(log.fileno())

    for index, name in enumerate(names):
        folder = os.path.join(args.out, "tests", name)
        for sub in ("barrier", "test_dir", "init_dir"):
            os.makedirs(os.path.join(folder, sub), exist_ok=True)
        os.environ["TEMP_DIR"] = folder
        # a fresh rendezvous file per test, as each test's fresh processes see it in torch's harness
        os.environ["INIT_METHOD"] = suite.INIT_METHOD = "file://" + os.path.join(folder, "init_dir", "shared_init_file")
        suite.Barrier.barrier_id = 0
        record(test=name, event="start")
        method = getattr(Case, name)
        if getattr(method, "__unittest_skip__", False):
            # a skip decided at import (unittest's own, which torch's spawn harness honours before it
            # starts any process): the test does not run
            record(test=name, event="end", outcome="skipped", seconds=0.0,
                   message=getattr(method, "__unittest_skip_why__", ""))
            continue
        start = time.monotonic()

        def hung(name=name):
            record(test=name, event="end", outcome="hung", seconds=round(time.monotonic() - start, 1),
                   message=f"still running after {args.deadline:g} s")
            os._exit(3)

        guard = threading.Timer(args.deadline, hung)
        guard.daemon = True
        guard.start()
        outcome, message = "passed", ""
        try:
            case = Case(name)
            case.rank, case.file_name = rank, os.path.join(folder, "store")
            timeout = suite.CUSTOM_PG_TIMEOUT.get(name, suite.default_pg_timeout)
            dist.init_process_group(init_method=case.init_method, backend=args.backend, world_size=size,
                                     rank=rank, timeout=datetime.timedelta(seconds=timeout))
            case._barrier()
            common_utils.set_rng_seed()
            try:
                getattr(case, name)()
            except unittest.SkipTest as e:
                outcome, message = "skipped", str(e)
            except SystemExit as e:   # torch's decorators skip by exiting with a code of TEST_SKIPS
                if e.code in skip_codes:
                    outcome, message = "skipped", skip_codes[e.code]
                else:
                    outcome, message = "errored", f"SystemExit({e.code!r})"
            except Exception:
                outcome, message = "errored", traceback.format_exc()
            case._barrier()
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:   # the set-up or the barriers around the test
            if outcome == "passed":
                outcome, message = "errored", traceback.format_exc()
            try:
                if dist.is_initialized():
                    dist.destroy_process_group()
            except Exception:
                pass
        guard.cancel()
        record(test=name, event="end", outcome=outcome, seconds=round(time.monotonic() - start, 1),
               message=message[-4000:])
        if outcome == "errored" and index + 1 < len(names):
            # the others may still be inside the test's collectives: start afresh (run.py does)
            os._exit(4)
        if leaves_messages(name) and outcome != "skipped":
            break   # run.py starts the rest in fresh processes, as torch's harness gives every test
    log.close()


if __name__ == "__main__":
    main()
