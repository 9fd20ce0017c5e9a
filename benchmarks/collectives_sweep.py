#!/usr/bin/env python3
"""Collectives sweep: pydist beside raw MPI in C and mpi4py, per collective and message size.

    python benchmarks/collectives_sweep.py                        # 2 and 4 ranks, 5 collectives, 4 B .. 64 MiB
    python benchmarks/collectives_sweep.py --ranks 2 --ops all_reduce --factor 2   # the all-reduce sweep, every size doubling
    python benchmarks/collectives_sweep.py --quick                # 2 ranks, 3 sizes, 1 repeat (smoke test)
    PYDIST_WAIT=mpi python benchmarks/collectives_sweep.py        # pydist waits with plain MPI_Wait
    python benchmarks/collectives_sweep.py --arrays own           # each size its own arrays (default: views)
    python benchmarks/collectives_sweep.py --load 2 --ranks 2     # beside 2 busy processes of its own

Run it directly, not under mpiexec: it launches the jobs itself. It compiles collectives_raw.c (the
raw-C baseline) into benchmarks/.build/, calibrates an iteration count per program, collective and size
from one short probe job each (so each cell takes about --target-seconds), then runs the programs in
turn, C, pydist, mpi4py, C, pydist, mpi4py ..., so that noise on this shared machine falls on all of
them. Each run is one `mpiexec -n R` job under a hard timeout. Tables show the median over repeats (or, with
--stat min, the fastest run).

What is timed, float32, SIZE being the whole buffer as nccl-tests counts it (R ranks, chunk = SIZE/R):
    all_reduce      SUM in place on SIZE bytes       dist.all_reduce              / comm.Allreduce(IN_PLACE)
    all_gather      chunk in, SIZE out               dist.all_gather_into_tensor  / comm.Allgather
    reduce_scatter  SIZE in, chunk out, SUM          dist.reduce_scatter_tensor   / comm.Reduce_scatter_block
    broadcast       SIZE bytes from rank 0           dist.broadcast               / comm.Bcast
    all_to_all      SIZE in, SIZE out                dist.all_to_all_single       / comm.Alltoall

Each table ends with the best program at each size and pydist's time over the best one's (py/best):
the best of raw C, mpi4py and every pydist path measured, which the default programs include:
no-slots and plain-mpi are pydist with PYDIST_SHM_SMALL_BYTES=0 (and PYDIST_PERSISTENT_BYTES=0),
every collective; ring and shm are all_reduce's algorithm= choices. pydist takes this machine's path
table when `python -m pydist.tune` has measured one; `--programs ... untuned` adds pydist without it
(PYDIST_TUNE=off), the before and after in one run.

The all_reduce table has a fourth column, ring: pydist's own ring (all_reduce(algorithm="ring")), and
its summary says from which size up the ring is at least as fast as MPI's all-reduce (pydist's MPI
path and raw C), or that it never is in the measured range. `--programs ... shm shm-alloc` adds two
more all_reduce columns: pydist's shared-memory all-reduce (algorithm="shm") on ordinary arrays, and
on dist.empty arrays (reduced in place, no copy). The pydist column is all_reduce's automatic choice,
which takes shm from 64 KiB up on one node (benchmarks/shm_allreduce.py compares them in detail).

All of them measure the same way (collectives_raw.c's header): warm-up calls, a barrier, N timed calls,
the slowest rank's elapsed time (an all-reduce with MAX) divided by N. Bandwidth follows nccl-tests:
algbw = SIZE / time, busbw = algbw * factor, factor 2(R-1)/R for all_reduce, (R-1)/R for all_gather,
reduce_scatter and all_to_all, 1 for broadcast.

--load N starts N busy processes (a CPU loop each) before the first job and stops them after the last,
so that every program runs on a machine whose other load is known: the busy machine researchers
have (a browser, DataLoader workers, a second job), not a background left to chance. The header and
the footer say how many ran.

mpi4py must be built against MPICH (scripts/setup.sh --test does it; the PyPI wheel wants another
libmpi): MPICC=mpicc.mpich pip install --no-binary mpi4py mpi4py.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

from mpi_jobs import MPIEXEC, run
from pydist import _libraries as pydist_libraries

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "collectives_raw.c")
MPICC = shutil.which(pydist_libraries.mpicc())   # the same MPICH as pydist's libmpi and MPIEXEC
# One binary per MPICH, in a folder named after its mpicc's (usr-bin for Debian's, ...-.venv-bin for
# PyPI's in a venv), so that a checkout rebuilt against the other MPICH never runs the first one's.
BINARY = os.path.join(HERE, ".build", os.path.dirname(MPICC or "/none").strip(os.sep).replace(os.sep, "-"),
                      "collectives_raw")

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
PROGRAMS = ("c", "pydist", "untuned", "mpi4py", "ring", "shm", "shm-alloc", "no-slots", "plain-mpi")
DEFAULT_PROGRAMS = ("c", "pydist", "mpi4py", "ring", "shm", "no-slots", "plain-mpi")
# pydist's other paths, as pydist's automatic choice with a setting that takes one path away (read at
# init): no-slots, no shared-memory slots for the small collectives (so no header round either: MPI's
# nonblocking call, or a small one's persistent request); plain-mpi, MPI's nonblocking call for all.
PATH_SETTINGS = {"untuned": {"PYDIST_TUNE": "off"},
                 "no-slots": {"PYDIST_SHM_SMALL_BYTES": "0"},
                 "plain-mpi": {"PYDIST_SHM_SMALL_BYTES": "0", "PYDIST_PERSISTENT_BYTES": "0"}}
PYDIST_PROGRAMS = ("pydist", "untuned", "ring", "shm", "shm-alloc", "no-slots", "plain-mpi")
BEST_GOAL = 1.05       # the goal: pydist's time <= 1.05x the best of every program at each size
RING_OPS = ("all_reduce",)                      # what the ring and shm programs run
ALL_REDUCE_ONLY = ("ring", "shm", "shm-alloc")
QUICK_SIZES = [4, 4 << 10, 1 << 20]
SMALL_BYTES = 4 << 10  # "small messages" of the goal: up to 4 KiB
GOAL_BYTES = 64 << 10  # the goal: pydist <= 0.9x mpi4py's time at every size up to 64 KiB
MIN_ITERS = 3          # even 64 MiB gets a few timed calls, so one hiccup is not the whole answer
MAX_ITERS = 1_000_000  # the smallest sizes, ~0.5 us apart
PROBE_SECONDS, PROBE_MAX_ITERS = 0.01, 50  # blocking MPI at 4 ranks on 2 cores takes ~5 ms per call


def bus_factor(op, ranks):
    if op == "all_reduce":
        return 2 * (ranks - 1) / ranks
    return 1.0 if op == "broadcast" else (ranks - 1) / ranks


def item_bytes(op, nbytes, ranks):
    """The whole-buffer size actually used: every size works for all_reduce and broadcast; the chunked
    collectives need a multiple of 4*R (the C program and MPI's block calls take equal chunks)."""
    unit = 4 * ranks
    return max(unit, nbytes // unit * unit)


# ---------------------------------------------------------------------------------------------------
# Workers: one rank of the pydist or mpi4py job. Same method as time_item() in collectives_raw.c.

# The chunk's views are taken once, outside the timed call, as raw C passes a pointer: a NumPy slice
# costs about 0.15 us, a third of what an 8 B call adds to raw C's time.
def pydist_calls(in_, out, chunk):
    import pydist as dist
    in_chunk, out_chunk = in_[:chunk], out[:chunk]
    return {
        "all_reduce": lambda: dist.all_reduce(in_),
        "all_gather": lambda: dist.all_gather_into_tensor(out, in_chunk),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(out_chunk, in_),
        "broadcast": lambda: dist.broadcast(in_, 0),
        "all_to_all": lambda: dist.all_to_all_single(out, in_),
    }


def ring_calls(in_, out, chunk):
    import pydist as dist
    return {"all_reduce": lambda: dist.all_reduce(in_, algorithm="ring")}


def shm_calls(in_, out, chunk):
    import pydist as dist
    return {"all_reduce": lambda: dist.all_reduce(in_, algorithm="shm")}


def mpi4py_calls(in_, out, chunk):
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    in_chunk, out_chunk = in_[:chunk], out[:chunk]
    return {
        "all_reduce": lambda: comm.Allreduce(MPI.IN_PLACE, in_, op=MPI.SUM),
        "all_gather": lambda: comm.Allgather(in_chunk, out),
        "reduce_scatter": lambda: comm.Reduce_scatter_block(in_, out_chunk, op=MPI.SUM),
        "broadcast": lambda: comm.Bcast(in_, root=0),
        "all_to_all": lambda: comm.Alltoall(in_, out),
    }


def worker(program, plan, arrays="shared"):
    import numpy as np
    if program in PYDIST_PROGRAMS:
        os.environ.update(PATH_SETTINGS.get(program, {}))
        import pydist as dist
        dist.init_process_group(backend="mpi")
        rank, ranks = dist.get_rank(), dist.get_world_size()
        calls = {"ring": ring_calls, "shm": shm_calls, "shm-alloc": shm_calls}.get(program, pydist_calls)
        barrier, slowest = dist.barrier, lambda a: dist.all_reduce(a, op=dist.ReduceOp.MAX)
    else:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        rank, ranks = comm.Get_rank(), comm.Get_size()
        calls = mpi4py_calls
        barrier, slowest = comm.Barrier, lambda a: comm.Allreduce(MPI.IN_PLACE, a, op=MPI.MAX)
    # Two arrays for all items, written up front (page faults are not timed); zeros stay zeros.
    largest = max(b for _, b, _ in plan) // 4
    in_buf, out_buf = np.zeros(largest, dtype=np.float32), np.zeros(largest, dtype=np.float32)
    if program == "shm-alloc":   # in pydist's shared segment: reduced in place
        in_buf = dist.zeros(largest, dtype=np.float32)
    in_buf.fill(0)
    out_buf.fill(0)
    elapsed = np.zeros(1, dtype=np.float64)
    if rank == 0:
        wait = "MPI_Wait" if os.environ.get("PYDIST_WAIT", "").lower() == "mpi" else "poll"
        print(f"# {program} worker: ranks={ranks} dtype=float32" + (f" wait={wait}" if program != "mpi4py" else ""))
        print("# result <op> <bytes> <iters> <us per call, slowest rank>")
        # (Open MPI's version string, through mpi4py, ends in the NUL its length counts)
        version = (dist._C.mpi_info()["library_version"] if program != "mpi4py"
                   else MPI.Get_library_version().rstrip("\x00"))
        print(f"# library {version.strip().splitlines()[0]}", flush=True)
    for op, nbytes, iters in plan:
        count = nbytes // 4
        if arrays == "own":   # arrays of this size, as a program has them (--arrays)
            in_buf, out_buf = np.zeros(count, dtype=np.float32), np.zeros(count, dtype=np.float32)
            if program == "shm-alloc":
                in_buf = dist.zeros(count, dtype=np.float32)
            in_buf.fill(0)
            out_buf.fill(0)
        call = calls(in_buf[:count], out_buf[:count], count // ranks)[op]
        for _ in range(iters // 10 + 2):
            call()
        barrier()
        start = time.perf_counter()
        for _ in range(iters):
            call()
        elapsed[0] = time.perf_counter() - start
        slowest(elapsed)
        if rank == 0:
            print(f"result {op} {nbytes} {iters} {elapsed[0] / iters * 1e6:.4f}", flush=True)
    if program in PYDIST_PROGRAMS:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------------
# Driver

def compile_baseline():
    os.makedirs(os.path.dirname(BINARY), exist_ok=True)
    cmd = [MPICC, "-O2", "-Wall", "-o", BINARY, SOURCE]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        sys.exit(f"collectives_sweep: compiling the baseline failed:\n{' '.join(cmd)}\n"
                 f"{proc.stdout}{proc.stderr}")


LIBRARY = {}   # {"name": the MPI library every job ran on}, from the jobs' "# library" lines


def run_job(program, ranks, plan, timeout, raw_flags=(), arrays="shared"):
    """Run one mpiexec job over the plan [(op, bytes, iters)]. Returns {(op, bytes): us per call}."""
    items = [f"{op}:{b}:{i}" for op, b, i in plan]
    if program == "c":
        argv = [BINARY] + list(raw_flags) + (["-o"] if arrays == "own" else []) + items
    else:
        argv = [sys.executable, os.path.abspath(__file__), "--worker", program, arrays, ",".join(items)]
    cmd = [MPIEXEC, "-n", str(ranks)] + argv
    returncode, output = run(cmd, timeout, "collectives_sweep")
    results = {}
    for line in output.splitlines():
        if line.startswith("# library "):   # every program must run on the same MPI library
            library = " ".join(line[len("# library "):].split())
            if LIBRARY.setdefault("name", library) != library:
                sys.exit(f"collectives_sweep: {program} ran on {library!r}, the others on {LIBRARY['name']!r}: "
                         f"not a baseline (is mpi4py or the C program linked to another MPI?)")
        fields = line.split()
        if len(fields) == 5 and fields[0] == "result":
            results[(fields[1], int(fields[2]))] = float(fields[4])
    if returncode != 0 or len(results) != len(plan):
        shown = " ".join(cmd[:6]) + (" ..." if len(cmd) > 6 else "")
        sys.exit(f"collectives_sweep: {shown}\nexited with {returncode} after "
                 f"{len(results)} of {len(plan)} items; its output:\n{output}")
    return results


def iters_for(seconds, seconds_per_call, most):
    return max(MIN_ITERS, min(most, round(seconds / seconds_per_call)))


def human(nbytes):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def print_table(op, ranks, items, med, programs):
    factor = bus_factor(op, ranks)
    names = {"c": "C", "pydist": "pydist", "untuned": "untuned", "mpi4py": "mpi4py", "ring": "ring", "shm": "shm", "shm-alloc": "alloc",
             "no-slots": "noslot", "plain-mpi": "pyMPI"}
    cols = [p for p in PROGRAMS if p in programs and (p not in ALL_REDUCE_ONLY or op in RING_OPS)]
    head = f"{'size':>8} | " + " ".join(f"{names[p] + ' us':>10}" for p in cols) + " | " + \
        " ".join(f"{names[p][:6] + ' bus':>10}" for p in cols)
    extra = []
    if "c" in cols:
        extra.append(f"{'py-C us':>9}")
    if "mpi4py" in cols:
        extra.append(f"{'mpi4py/py':>9}")
    extra += [f"{'best':>6}", f"{'py/best':>7}"]
    head += " | " + " ".join(extra)
    print(f"\n{op}, {ranks} ranks, on {LIBRARY.get('name', '?')} (busbw in GB/s; mpi4py/py > 1 means pydist is faster)")
    print(head)
    print("-" * len(head))
    for b in items:
        t = {p: med[p][(op, b)] for p in cols}
        row = f"{human(b):>8} | " + " ".join(f"{t[p]:>10.2f}" for p in cols) + " | " + \
            " ".join(f"{b / (t[p] * 1e3) * factor:>10.3f}" for p in cols)
        parts = []
        if "c" in cols:
            parts.append(f"{t['pydist'] - t['c']:>+9.2f}")
        if "mpi4py" in cols:
            parts.append(f"{t['mpi4py'] / t['pydist']:>9.3f}")
        best = best_of(t)
        parts += [f"{names[best]:>6}", f"{t['pydist'] / t[best]:>7.3f}"]
        print(row + " | " + " ".join(parts))


def best_of(times):
    """The program with the least time in {program: us} (pydist itself on a tie)."""
    return min(times, key=lambda p: (times[p], p != "pydist"))


def summary(op, ranks, items, med, programs):
    py = med["pydist"]
    lines = []
    small = [b for b in items if b <= SMALL_BYTES]
    if "c" in programs and small:
        worst = max(small, key=lambda b: py[(op, b)] - med["c"][(op, b)])
        lines.append(f"pydist - C at {human(small[0])}: {py[(op, small[0])] - med['c'][(op, small[0])]:+.2f} us, "
                     f"worst up to {human(SMALL_BYTES)}: {py[(op, worst)] - med['c'][(op, worst)]:+.2f} us "
                     f"at {human(worst)} (goal: <= 0.5 us at 8 B)")
    large = [b for b in items if b >= 1 << 20]
    if "c" in programs and large:
        worst = min(large, key=lambda b: med["c"][(op, b)] / py[(op, b)])
        lines.append(f"bandwidth pydist/C at >= 1 MiB: min {med['c'][(op, worst)] / py[(op, worst)]:.3f} "
                     f"at {human(worst)}")
    upto = [b for b in items if b <= GOAL_BYTES]
    if "mpi4py" in programs and upto:
        worst = min(upto, key=lambda b: med["mpi4py"][(op, b)] / py[(op, b)])
        lines.append(f"time mpi4py/pydist up to {human(GOAL_BYTES)}: min {med['mpi4py'][(op, worst)] / py[(op, worst)]:.3f} "
                     f"at {human(worst)} (goal: >= 1.11, pydist's time <= 0.9x mpi4py's)")
    if "ring" in programs and op in RING_OPS:
        lines.append(ring_crossing(op, items, med))
    ratios = {}
    for b in items:
        t = {p: med[p][(op, b)] for p in med if (op, b) in med[p]}
        ratios[b] = t["pydist"] / t[best_of(t)]
    worst = max(items, key=lambda b: ratios[b])
    over = [human(b) for b in items if ratios[b] > BEST_GOAL]
    lines.append(f"pydist/best of all: max {ratios[worst]:.3f} at {human(worst)} (goal: <= {BEST_GOAL}; "
                 f"over it at {', '.join(over) if over else 'no size'})")
    print(f"{op}, {ranks} ranks: " + "; ".join(lines))


def ring_crossing(op, items, med):
    """Where the ring's curve crosses MPI's: the smallest size from which the ring is at least as fast
    at every larger measured size, against pydist's MPI path and against raw C."""
    parts = []
    for base in ("pydist", "c"):
        if base not in med:
            continue
        fast = [b for b in items if med["ring"][(op, b)] <= med[base][(op, b)]]
        start = next((b for b in items if all(c in fast for c in items if c >= b)), None)
        name = "pydist MPI" if base == "pydist" else "raw C MPI"
        ratio = med[base][(op, items[-1])] / med["ring"][(op, items[-1])]
        parts.append(f"ring at least as fast as {name} from {human(start)} up" if start is not None else
                     f"ring never at least as fast as {name} from any size up")
        parts[-1] += f" ({name}/ring time at {human(items[-1])}: {ratio:.3f})"
    return "; ".join(parts)


def sweep(args, ranks, sizes, programs):
    items_of = {op: sorted({item_bytes(op, b, ranks) for b in sizes}) for op in args.ops}
    cells = [(op, b) for op in args.ops for b in items_of[op]]
    cells_of = {p: [c for c in cells if p not in ALL_REDUCE_ONLY or c[0] in RING_OPS] for p in programs}
    programs = [p for p in programs if cells_of[p]]
    # Calibrate each program on its own: at 4 ranks on 2 cores blocking MPI takes milliseconds where
    # pydist takes microseconds, and one shared count would make one side run for minutes or be noise.
    plans = {}
    for p in programs:
        probe_plan = [(op, b, iters_for(PROBE_SECONDS, 2e-6 + b / 1e9, PROBE_MAX_ITERS)) for op, b in cells_of[p]]
        probe = run_job(p, ranks, probe_plan, args.timeout, args.raw_flags.split(), args.arrays)
        # A larger message never takes less time, so a probe slowed by a passing hiccup is capped by
        # the next larger size's time; otherwise one bad probe leaves that size with few iterations.
        for op in {op for op, _ in cells_of[p]}:
            sz = items_of[op]
            for small, large in reversed(list(zip(sz, sz[1:]))):
                probe[(op, small)] = min(probe[(op, small)], probe[(op, large)])
        plans[p] = [(op, b, iters_for(args.target_seconds, probe[(op, b)] * 1e-6, MAX_ITERS))
                    for op, b in cells_of[p]]
    runs = {p: [] for p in programs}
    for rep in range(args.repeats):
        for p in programs:
            runs[p].append(run_job(p, ranks, plans[p], args.timeout, args.raw_flags.split(), args.arrays))
        print(f"# {ranks} ranks: repeat {rep + 1}/{args.repeats} done ({time.monotonic() - args.started:.0f} s)",
              file=sys.stderr, flush=True)
    stat = min if args.stat == "min" else statistics.median
    med = {p: {c: stat(r[c] for r in runs[p]) for c in cells_of[p]} for p in programs}
    if args.json:   # for drivers (benchmarks/mpi_libraries.py): one record per program and cell
        import json
        with open(args.json, "a") as f:
            for p in programs:
                for (op, b), us in med[p].items():
                    f.write(json.dumps({"library": LIBRARY.get("name"), "ranks": ranks, "program": p,
                                        "op": op, "bytes": b, "us": us}) + "\n")
    for op in args.ops:
        print_table(op, ranks, items_of[op], med, programs)
    print()
    for op in args.ops:
        summary(op, ranks, items_of[op], med, programs)
    sys.stdout.flush()


def start_load(n):
    """n busy processes (a CPU loop each, at the default priority), in a session of their own."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL,
                             start_new_session=True) for _ in range(n)]


def stop_load(procs):
    for p in procs:
        p.kill()
    for p in procs:
        p.wait(timeout=10)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="world sizes (default 2 4)")
    ap.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS), help="collectives (default all)")
    ap.add_argument("--programs", nargs="+", choices=PROGRAMS, default=list(DEFAULT_PROGRAMS),
                    help="what to run beside each other (default all but shm-alloc; pydist always runs; "
                         "ring, shm, shm-alloc: all_reduce(algorithm=...), in the all_reduce table only; "
                         "no-slots, plain-mpi: pydist's other paths, every collective)")
    ap.add_argument("--min-bytes", type=int, default=4, help="smallest message (default 4)")
    ap.add_argument("--max-bytes", type=int, default=64 << 20, help="largest message (default 64 MiB)")
    ap.add_argument("--factor", type=int, default=4, help="size step of the sweep (default 4)")
    ap.add_argument("--sizes", type=int, nargs="+", help="message sizes in bytes, instead of the sweep")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each program, median shown (default 3)")
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="each cell's figure over the repeats: the median (default), or the fastest run, "
                         "which a machine whose speed swings from run to run (a shared VM) distorts least")
    ap.add_argument("--target-seconds", type=float, default=0.05,
                    help="timed seconds per cell per run, which sets the iteration counts (default 0.05)")
    ap.add_argument("--raw-flags", default="",
                    help="options for collectives_raw, e.g. '-i -t' to make it call MPI as pydist does")
    ap.add_argument("--arrays", choices=("shared", "own"), default="shared",
                    help="every size a view of two arrays of the largest size (shared: nccl-tests' layout, "
                         "huge pages from 4 MiB), or two arrays of its own size per size (own: as a program "
                         "has them, small ones on the heap); Open MPI's copies depend on it (docs/performance.md)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per mpiexec job (default 300)")
    ap.add_argument("--json", help="also append each figure to this file, one JSON object a line")
    ap.add_argument("--quick", action="store_true", help="4 B, 4 KiB and 1 MiB, 2 ranks, 1 repeat, short cells")
    ap.add_argument("--load", type=int, default=0, metavar="N",
                    help="run beside N busy processes that the benchmark starts and stops (default 0)")
    ap.add_argument("--worker", nargs=3, metavar=("PROGRAM", "ARRAYS", "PLAN"), help=argparse.SUPPRESS)  # under mpiexec
    args = ap.parse_args()

    if args.worker:
        program, arrays, plan = args.worker
        worker(program, [(op, int(b), int(i)) for op, b, i in (x.split(":") for x in plan.split(","))], arrays)
        return
    if MPIEXEC is None or MPICC is None:
        sys.exit(f"collectives_sweep: needs {pydist_libraries.mpiexec()} and {pydist_libraries.mpicc()}, "
                 f"the MPICH pydist was built with (Debian package mpich, or PyPI's mpich)")
    programs = [p for p in PROGRAMS if p in args.programs or p == "pydist"]
    if "mpi4py" in programs:
        try:
            import mpi4py  # noqa: F401  (only to say how to get it; the workers import it under mpiexec)
        except ImportError:
            sys.exit("collectives_sweep: mpi4py is not installed; scripts/setup.sh --test builds it against "
                     "MPICH, or leave it out with --programs c pydist")
    if args.quick:
        sizes, args.repeats, args.target_seconds = QUICK_SIZES, 1, 0.02
        if args.ranks == [2, 4]:
            args.ranks = [2]
    elif args.sizes:
        sizes = sorted(set(args.sizes))
    else:
        sizes, b = [], args.min_bytes
        while b <= args.max_bytes:
            sizes.append(b)
            b *= max(2, args.factor)
    bad = [b for b in sizes if b <= 0 or b % 4]
    if bad or min(args.ranks) < 1 or args.repeats < 1 or args.load < 0:
        sys.exit(f"collectives_sweep: sizes must be positive multiples of 4 bytes (got {bad}), "
                 f"--ranks and --repeats at least 1 (got {args.ranks}, {args.repeats}), --load at least 0 "
                 f"(got {args.load})")

    args.started = time.monotonic()
    # Printed with the results: other processes on these 2 cores distort every side (MPICH's
    # busy-polling calls more than pydist's yielding wait), and this says whether there were any.
    load_before = os.getloadavg()[0]
    compile_baseline()
    wait = "MPI_Wait (PYDIST_WAIT=mpi)" if os.environ.get("PYDIST_WAIT", "").lower() == "mpi" else "poll (default)"
    load = f"beside {args.load} busy process(es) of its own" if args.load else "no load of its own"
    print(f"float32 collectives; {'fastest' if args.stat == 'min' else 'median'} of {args.repeats} interleaved runs of {', '.join(programs)}; "
          f"pydist wait: {wait}; raw C flags: '{args.raw_flags}'; arrays: {args.arrays}; {os.cpu_count()} CPUs; {load}")
    busy = start_load(args.load)
    try:
        for ranks in args.ranks:
            sweep(args, ranks, sizes, programs)
    finally:
        stop_load(busy)
    print(f"\n1-min load average: {load_before:.2f} before the run, {os.getloadavg()[0]:.2f} after "
          f"(the run itself adds up to {max(args.ranks)}{f', and its {args.load} busy process(es)' if args.load else ''})")
    sys.stdout.flush()  # the tables first, then the stderr footer, when both go to one terminal
    print(f"# total {time.monotonic() - args.started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
