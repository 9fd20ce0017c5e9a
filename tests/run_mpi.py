#!/usr/bin/env python3
"""Run tests/mpi under real `mpiexec` at several world sizes and check every rank's result.

    python tests/run_mpi.py                 # world sizes 1, 2, 3, 4
    python tests/run_mpi.py -n 2 -- -k bcast  # one size, extra pytest arguments after --
    python tests/run_mpi.py -n 2 -- tests/mpi/test_p2p.py   # only these files (default: all of tests/mpi)
    python tests/run_mpi.py --durations 5     # also the 5 slowest tests at each size
    python tests/run_mpi.py --cluster -n 2 3  # across the hosts of scripts/cluster.sh (one rank per host)

Why a driver and not plain pytest: mpiexec's exit status is the OR of the ranks' and can be 0 after a
failure, and the ranks' output interleaves. So each rank writes its own report (tests/mpi/conftest.py),
and this driver fails if any test failed on any rank, if any rank wrote no report (it crashed or was
killed), or if any collected test never ran at any world size. Every mpiexec runs under a hard
timeout (MPIEXEC_TIMEOUT for hydra, and a subprocess timeout around it); a job it kills is reported
as such, with the test each unfinished rank was in (rank<r>.current, written by tests/mpi/conftest.py).

Oversubscription (more ranks than the 2 cores here): MPICH's blocking calls busy-poll and take a whole
scheduler slice per call at 3-4 ranks; pydist's own wait (MPI_Test + sched_yield) avoids that, so no
MPICH/UCX variable is needed for pydist's calls. What the environment below sets, and why:
  MPIEXEC_TIMEOUT     hydra kills the whole job after this many seconds (a hang becomes a failure)
  UCX_ERROR_SIGNALS=  (empty) keeps Python's own fault handler instead of UCX's
  UCX_TLS=^posix      only when /dev/shm is too small for UCX's ~4 MiB per rank shared-memory segments
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from pydist import _libraries as pydist_libraries

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MPIEXEC = shutil.which(pydist_libraries.mpiexec())   # the one matching pydist's libmpi


def mpi_env(timeout):
    env = dict(os.environ)
    env["MPIEXEC_TIMEOUT"] = str(int(timeout))
    env["UCX_ERROR_SIGNALS"] = ""
    env.setdefault("PYTHONFAULTHANDLER", "1")
    env.setdefault("PYDIST_TUNE", "off")   # the paths the tests expect, whatever this machine has measured
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize < 64 << 20:
            env["UCX_TLS"] = "^posix"
    except OSError:
        env["UCX_TLS"] = "^posix"
    return env


def run_size(n, pytest_args, timeout, cluster=False):
    """Run the suite at world size n. Returns (per-rank reports, the test each rank was in last,
    output, seconds, returncode, command, whether the timeout killed the job)."""
    report_dir = tempfile.mkdtemp(prefix=f"pydist-mpi-n{n}-")
    env = mpi_env(timeout)
    env["PYDIST_TEST_REPORT_DIR"] = report_dir
    launch = ([os.path.join(ROOT, "scripts", "cluster.sh"), "run", "-n", str(n), "--timeout", str(int(timeout)), "--"]
              if cluster else [MPIEXEC, "-n", str(n)])
    # tests/mpi unless the arguments name test files or folders of their own
    named = [a for a in pytest_args if not a.startswith("-") and os.path.exists(a.split("::")[0])]
    cmd = launch + [sys.executable, "-P", "-m", "pytest"] + ([] if named else [os.path.join(HERE, "mpi")]) + \
        ["-q", "-p", "no:cacheprovider", "-o", "console_output_style=classic"] + pytest_args
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout + 30)
        output, rc = proc.stdout + proc.stderr, proc.returncode
        timed_out = "APPLICATION TIMED OUT" in output   # hydra's words when MPIEXEC_TIMEOUT expires
    except subprocess.TimeoutExpired as e:
        output = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x
                         for x in (e.stdout or "", e.stderr or ""))
        output += f"\n*** mpiexec -n {n} did not finish within {timeout + 30} s and was killed\n"
        rc, timed_out = -9, True
    seconds = time.monotonic() - start
    reports, last_test = {}, {}
    for r in range(n):
        path = os.path.join(report_dir, f"rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                reports[r] = json.load(f)
        path = os.path.join(report_dir, f"rank{r}.current")
        if os.path.exists(path):
            with open(path) as f:
                last_test[r] = f.read()
    shutil.rmtree(report_dir, ignore_errors=True)
    return reports, last_test, output, seconds, rc, cmd, timed_out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, nargs="+", default=[1, 2, 3, 4], help="world sizes (default 1 2 3 4)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per mpiexec (default 600)")
    ap.add_argument("--durations", type=int, default=0, metavar="K",
                    help="print the K slowest tests at each world size (slowest rank's time)")
    ap.add_argument("--cluster", action="store_true",
                    help="launch through scripts/cluster.sh run (its simulated hosts, ranks round robin)")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args()
    if MPIEXEC is None:
        sys.exit("run_mpi.py: mpiexec.mpich not found; install MPICH (apt-get install -y mpich libmpich-dev)")

    ran_somewhere, collected = set(), set()
    passed = failed = 0
    problems = []
    for n in args.n:
        reports, last_test, output, seconds, rc, cmd, timed_out = run_size(n, args.pytest_args, args.timeout, args.cluster)
        missing = [r for r in range(n) if r not in reports]
        n_failed = n_passed = 0
        tests = set()
        for rep in reports.values():
            collected.update(rep["collected"])
            tests.update(rep["results"])
        for test in sorted(tests):
            outcomes = {r: rep["results"].get(test) for r, rep in reports.items()}
            bad = {r: o for r, o in outcomes.items() if o is None or o["outcome"] != "passed"}
            if bad or missing:
                n_failed += 1
                lines = [f"FAILED at n={n}: {test} on rank(s) {sorted(bad) or missing}"]
                by_text = {}   # ranks failing the same way are shown once
                for r, o in sorted(bad.items()):
                    text = o["longrepr"] if o else "(no result: the rank did not run this test)"
                    by_text.setdefault(text, []).append(r)
                for text, ranks in by_text.items():
                    lines.append(f"--- rank(s) {ranks} ---\n{text}")
                problems.append("\n".join(lines))
            else:
                n_passed += 1
            ran_somewhere.add(test)
        if missing:
            why = (f"the job was killed by its {args.timeout:.0f} s timeout" if timed_out
                   else f"crashed, hung or were killed; mpiexec exit status {rc}")
            where = "".join(f"\n  rank {r} was in: {last_test.get(r, '(no test started)')}" for r in missing)
            problems.append(f"FAILED at n={n}: rank(s) {missing} wrote no report ({why}).{where}\n"
                            f"Output tail:\n{output[-6000:]}")
        if not reports and not missing:
            problems.append(f"FAILED at n={n}: no report at all. Output tail:\n{output[-6000:]}")
        # 2: interrupted (a test module that cannot be imported stops the whole collection), 3: internal
        # error, 4: usage error. With 0 tests reported, these used to read as "0 passed, 0 failed".
        broken = sorted({rep["exitstatus"] for rep in reports.values()} - {0, 1, 5})
        if broken:
            n_failed += 1
            problems.append(f"FAILED at n={n}: pytest ended with exit status {broken} (2: interrupted, e.g. a "
                            f"collection error; 3: internal error; 4: usage error). Output tail:\n{output[-6000:]}")
        killed = f" (KILLED by the {args.timeout:.0f} s timeout)" if timed_out else ""
        print(f"world size {n}: {n_passed} passed, {n_failed} failed on {len(reports)}/{n} ranks "
              f"in {seconds:.1f} s{killed}", flush=True)
        if args.durations:
            slowest = {}
            for rep in reports.values():
                for test, o in rep["results"].items():
                    slowest[test] = max(slowest.get(test, 0.0), o["duration"])
            for test, d in sorted(slowest.items(), key=lambda kv: -kv[1])[:args.durations]:
                print(f"  {d:7.2f} s  {test}", flush=True)
        if n_failed or missing:
            print("  re-run: " + " ".join(cmd), flush=True)
        passed += n_passed
        failed += n_failed + (1 if missing else 0)

    never = sorted(collected - ran_somewhere)
    if never and not args.pytest_args:
        problems.append("tests that never ran at any world size (check their world_size markers): " + ", ".join(never))
        failed += len(never)
    if passed == 0 and failed == 0:
        problems.append("FAILED: no test ran at any world size")
        failed = 1
    for p in problems:
        print("\n" + p)
    print(f"\n{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
