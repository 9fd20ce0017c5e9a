"""torch's own distributed test suite over pydist's backend and over gloo, side by side.

    python tests/torch_suite/run.py                       # the whole list, pydist and gloo, 2 and 3 ranks
    python tests/torch_suite/run.py --subset              # the bounded list make test runs
    python tests/torch_suite/run.py -k all_gather --world-sizes 2

Runs torch's DistributedTest._DistTestBase (torch/testing/_internal/distributed/distributed_test.py,
the suite torch holds gloo, NCCL and MPI to) with tests/torch_suite/rank.py under mpiexec, once per
backend and world size; prints one table of outcomes per backend and world size, then every test whose
outcome differs between the backends. Exits 1 when a test passes over gloo and not over pydist, unless
exclusions.txt lists it with the reason.

Outcomes: passed; skipped (the test's own skip: no GPU, a world size it does not run at, ...);
errored (an exception on a rank); crashed (a rank died or the test ran past --deadline).
"""
import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from run_mpi import MPIEXEC, mpi_env  # noqa: E402

OUTCOMES = ("passed", "errored", "crashed", "skipped")


def all_tests():
    """Every test_* of DistributedTest._DistTestBase, in name order (BACKEND and friends are read at
    import: a stand-in is enough to list them)."""
    code = ("import os; os.environ.setdefault('BACKEND', 'gloo'); os.environ.setdefault('WORLD_SIZE', '2');"
            "os.environ.setdefault('TEMP_DIR', '/tmp');"
            "from torch.testing._internal.distributed.distributed_test import DistributedTest as D;"
            "print('\\n'.join(sorted(n for n in dir(D._DistTestBase) if n.startswith('test_'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return out.stdout.split()


def read_list(path):
    """Names from a file, one a line, '#' comments; for exclusions, {name: reason} ('name: reason')."""
    entries = {}
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                name, _, reason = line.partition(":")
                entries[name.strip()] = reason.strip()
    return entries


def run_backend(backend, size, names, args, work):
    """{test: (outcome, message, seconds)} for `names` over `backend` at `size` ranks: one mpiexec job,
    started again after a test that errored, hung or crashed."""
    results, todo, attempt = {}, list(names), 0
    while todo:
        attempt += 1
        out = os.path.join(work, f"{backend}-{size}-{attempt}")
        os.makedirs(out)
        with open(os.path.join(out, "tests.txt"), "w") as f:
            f.write("\n".join(todo) + "\n")
        limit = args.deadline * (len(todo) + 2)   # hydra's own hang guard, past every test's
        env = mpi_env(limit)
        env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        cmd = [MPIEXEC, "-n", str(size), sys.executable, os.path.join(HERE, "rank.py"), "--backend", backend,
               "--tests", os.path.join(out, "tests.txt"), "--out", out, "--deadline", str(args.deadline)]
        with open(os.path.join(out, "job.log"), "w") as log:
            try:
                proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=out,
                                      timeout=limit + 30)
                code = proc.returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
        ends = collections.defaultdict(dict)   # test -> {rank: record}
        started = set()
        for r in range(size):
            path = os.path.join(out, f"rank{r}.jsonl")
            if os.path.exists(path):
                for line in open(path):
                    rec = json.loads(line)
                    if rec["event"] == "end":
                        ends[rec["test"]][r] = rec
                    else:
                        started.add(rec["test"])
        done = 0
        for name in todo:
            got = ends.get(name, {})
            if len(got) == size:
                results[name] = merge(got.values())
                done += 1
                continue
            if got:   # some ranks ended it: errored or hung there, the others were stopped in it
                results[name] = merge(got.values(), stopped=size - len(got))
                done += 1
            elif name in started and not any(results[n][0] == "errored" for n in todo[:done]):
                # started, ended by no rank, and no earlier test's error ended the job: a rank died in it
                # (after an error, the ranks that passed may have started it before the job was ended)
                tail = open(os.path.join(out, "job.log"), errors="replace").read()[-3000:]
                results[name] = ("crashed", f"the job ended (status {code}) in this test:\n{tail}", 0.0)
                done += 1
            break
        if done == 0:   # nothing ran: the job itself failed to start
            tail = open(os.path.join(out, "job.log"), errors="replace").read()[-3000:]
            for name in todo:
                results[name] = ("crashed", f"the job ended (status {code}) before this test:\n{tail}", 0.0)
            break
        todo = todo[done:]
    return results


def merge(records, stopped=0):
    """One test's outcome from its ranks' records."""
    records = list(records)
    outcomes = [r["outcome"] for r in records]
    seconds = max(r["seconds"] for r in records)
    message = next((r["message"] for r in records if r["outcome"] in ("errored", "hung")), "")
    if "errored" in outcomes:
        return "errored", message, seconds
    if "hung" in outcomes or stopped:
        return "crashed", message or "a rank stopped in this test", seconds
    if "skipped" in outcomes:
        return "skipped", next(r["message"] for r in records if r["outcome"] == "skipped"), seconds
    return "passed", "", seconds


def first_line(message):
    """The exception's own line from a traceback, or the message's first line."""
    lines = [line for line in message.strip().splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Exit)\b", line)]
    return (errors[-1] if errors else lines[-1] if lines else "")[:200]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", nargs="+", default=["gloo", "pydist"])
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--subset", action="store_true", help="only the tests in subset.txt (what make test runs)")
    ap.add_argument("-k", default=None, help="only the tests whose name contains this")
    ap.add_argument("--deadline", type=float, default=120, help="seconds a test may run (a hang guard)")
    ap.add_argument("--json", default=None, help="write every outcome here")
    args = ap.parse_args(argv)
    if MPIEXEC is None:
        sys.exit("run.py: no mpiexec found")
    names = all_tests()
    if args.subset:
        keep = read_list(os.path.join(HERE, "subset.txt"))
        missing = sorted(set(keep) - set(names))
        if missing:
            sys.exit(f"run.py: subset.txt names tests torch's suite does not have: {missing}")
        names = [n for n in names if n in keep]
    if args.k:
        names = [n for n in names if args.k in n]
    excluded = read_list(os.path.join(HERE, "exclusions.txt"))
    work = tempfile.mkdtemp(prefix="torch_suite.")
    outcomes, t0 = {}, time.monotonic()
    try:
        for size in args.world_sizes:
            for backend in args.backends:
                t = time.monotonic()
                outcomes[backend, size] = run_backend(backend, size, names, args, work)
                counts = collections.Counter(o for o, _, _ in outcomes[backend, size].values())
                print(f"{backend:>7} at {size} ranks: " + ", ".join(f"{counts[o]} {o}" for o in OUTCOMES)
                      + f" ({time.monotonic() - t:.0f} s)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{len(names)} tests of torch's DistributedTest._DistTestBase, torch "
          f"{torch_version()}, {time.monotonic() - t0:.0f} s\n")
    print("| backend | ranks | " + " | ".join(OUTCOMES) + " |")
    print("|---|---|" + "---|" * len(OUTCOMES))
    for (backend, size), res in outcomes.items():
        counts = collections.Counter(o for o, _, _ in res.values())
        print(f"| {backend} | {size} | " + " | ".join(str(counts[o]) for o in OUTCOMES) + " |")
    failed = []
    if "gloo" in args.backends and "pydist" in args.backends:
        print("\nwhere the backends differ:")
        differ = 0
        for size in args.world_sizes:
            for name in names:
                g, p = outcomes["gloo", size][name], outcomes["pydist", size][name]
                if g[0] == p[0]:
                    continue
                differ += 1
                why = f"  [excluded: {excluded[name]}]" if name in excluded else ""
                print(f"  {size} ranks {name}: gloo {g[0]}, pydist {p[0]}{why}")
                if p[0] != "passed" and p[1]:
                    print(f"      pydist: {first_line(p[1])}")
                if g[0] != "passed" and g[1]:
                    print(f"      gloo: {first_line(g[1])}")
                if g[0] == "passed" and p[0] != "passed" and name not in excluded:
                    failed.append((size, name))
        if not differ:
            print("  none")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{b}-{s}": {n: {"outcome": o, "message": m, "seconds": sec} for n, (o, m, sec) in res.items()}
                       for (b, s), res in outcomes.items()}, f, indent=1)
    if failed:
        print(f"\n{len(failed)} test(s) pass over gloo and not over pydist, and are not in exclusions.txt")
        return 1
    return 0


def torch_version():
    import importlib.metadata
    return importlib.metadata.version("torch")


if __name__ == "__main__":
    sys.exit(main())
