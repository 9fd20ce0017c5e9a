"""python -m pydist.tune: measure which path is fastest for each collective at each size on this machine,
and cache the table that init_process_group then uses (pydist/_path_table.py, csrc/paths/tuned.c).

    python -m pydist.tune                  # measure at 2 .. this machine's cores ranks, write the cache
    python -m pydist.tune --ranks 2 4      # those group sizes only
    python -m pydist.tune --show           # the cached table (or --table FILE), with its measurements
    python -m pydist.tune --clear          # remove this machine's cached table

Run it directly, not under mpiexec: it starts one `mpiexec -n R` job per group size R. Each job tries, for
all_reduce, broadcast, all_gather, all_to_all and reduce_scatter at every power of two from 8 B to
64 MiB of input per rank, every path the collective has on a group of R ranks within one node: the
shared-memory slots (up to their size), the 2-rank pair exchange, MPI's nonblocking collective, pydist's
ring (all_reduce, and reduce_scatter as the ring's first half) and its shared-memory all-reduce; and
pydist's built-in choice, which a path replaces only where it was at least 5% faster (safe defaults stay
where the difference is noise). Every path but the slots runs after the header round, which stays
whatever the table says, so a rank whose call differs still gets ValueError with every other. The paths
take turns within each repeat (--repeats), each first in turn, each timing a batch of calls (2 to 64,
back to back) after a barrier as the slowest rank saw it; a path is judged by the median over the
repeats of its time over the built-in choice's in the same repeat, as the two met the same machine. A
size whose winner differs from both its neighbours' takes theirs: a path's time changes smoothly with
the size, and one cell alone is most often the VM's noise (a 32 MiB all-reduce has measured 6 and 12 ms
minutes apart), so a row spans two sizes at least. About 5-10 s at 2 ranks.

It says how much the repeats disagreed (the median cell's interquartile range of a path's time over the
built-in choice's, and from it how well a median is known) and how busy other processes kept the cores,
and writes no table when either makes the 5% rule meaningless (other processes over 10% of the cores: the
table would fit their load; a median known less well than half of 5%): run it again when the machine is
quieter, or write it anyway with --force. --show says whether a table is fresh (this host, CPU, MPI
library and pydist) or stale.

The table is cached per host, CPU, MPI library and pydist version ($XDG_CACHE_HOME/pydist, or
PYDIST_TUNE_DIR): another library, a new CPU or a new pydist is another file, measured afresh. World rank
0's table is every rank's; PYDIST_TUNE=off runs without one, PYDIST_TUNE=FILE with that one.
"""
import argparse
import datetime
import glob
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from . import _path_table

SIZES = [1 << k for k in range(3, 27)]   # 8 B .. 64 MiB
# the timeline's name of each path a row may name (_C.last_call_path)
NAMED = {"small shm": "slots", "shm header + pair": "pair", "shm header + MPI": "mpi", "shm header + ring": "ring",
         "shm": "shm"}
GAIN = 1.05     # a path replaces the built-in choice only where it was at least this much faster
MIN_REPEATS_FOR_SPREAD = 3   # fewer repeats have no interquartile range worth the name


def fmt_bytes(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


# ---------------------------------------------------------------------------------------------------
# One group size, under mpiexec

def arrays_for(op, nbytes, ranks, rank):
    """Float32 arrays for `op` with `nbytes` of input per rank: (input, output or None when in place)."""
    import numpy as np
    n = max(1, nbytes // 4)
    if op in ("all_to_all", "reduce_scatter"):
        n = max(ranks, n // ranks * ranks)
    out = {"all_gather": n * ranks, "all_to_all": n, "reduce_scatter": n // ranks}.get(op)
    return np.full(n, rank + 1, np.float32), None if out is None else np.empty(out, np.float32)


def call_of(op, x, out):
    """pydist's call of `op` on arrays_for's arrays."""
    import pydist as dist
    return {"all_reduce": lambda: dist.all_reduce(x),
            "broadcast": lambda: dist.broadcast(x, 0),
            "all_gather": lambda: dist.all_gather_into_tensor(out, x),
            "all_to_all": lambda: dist.all_to_all_single(out, x),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(out, x)}[op]


def measure(part, sizes, repeats):
    import numpy as np
    import pydist as dist
    dist.init_process_group()
    rank, ranks = dist.get_rank(), dist.get_world_size()
    info = dist._C.shm_info()
    one_node = ranks > 1 and bool(info["segment"]) and info["node_size"] == ranks and info["small_bytes"] > 0
    slots = info["small_bytes"] if one_node else 0
    if one_node:
        dist._C.set_path_table(None)
    cells = []   # (op, nbytes, path)
    took = {}    # {op: {size: the path the built-in choice took}}
    times = []   # a row of repeats per cell
    began = time.perf_counter()
    for op in _path_table.OPS if one_node else ():
        for nbytes in sizes:
            batch = max(2, min(64, (2 << 20) // nbytes))   # back to back, as the sweep times them
            call = call_of(op, *arrays_for(op, nbytes, ranks, rank))
            call()
            # the path the built-in choice takes is measured once, as the built-in choice
            same = NAMED.get(dist._C.last_call_path())
            took.setdefault(op, {})[str(nbytes)] = same
            group = [(op, nbytes, path) for path in [_path_table.BUILT_IN, *_path_table.paths_of(op, ranks)]
                     if path != same and (path != "slots" or nbytes <= slots)]
            rows = np.zeros((len(group), repeats))
            for rep in range(-1, repeats):   # -1: warm-up, not kept
                for j in [*range(rep % len(group), len(group)), *range(rep % len(group))]:   # each first in turn
                    path = group[j][2]
                    dist._C.set_path_table(None if path == _path_table.BUILT_IN else [
                        (ranks, _path_table.OPS.index(op), _path_table.PATHS.index(path) + 1, 1 << 62)])
                    dist.barrier()
                    t = time.perf_counter()
                    for _ in range(batch):
                        call()
                    if rep >= 0:
                        rows[j, rep] = (time.perf_counter() - t) / batch
                dist._C.set_path_table(None)
            cells += group
            times.append(rows)
    times = np.concatenate(times) if times else np.zeros((0, repeats))
    if len(cells):
        dist.all_reduce(times, op=dist.ReduceOp.MAX)   # each cell as its slowest rank saw it
    seconds = time.perf_counter() - began
    if rank == 0:
        # Each path's time over the built-in choice's in the same repeat, the median of those ratios: the
        # two met the same machine, whose speed on a shared VM moves more between repeats than the
        # paths differ (a cell's group starts with the built-in choice).
        medians, ratios, spreads = {}, {}, {}
        for (op, nbytes, path), row in zip(cells, times):
            if path == _path_table.BUILT_IN:
                built = row
            medians.setdefault(op, {}).setdefault(str(nbytes), {})[path] = round(float(np.median(row)) * 1e6, 2)
            ratios.setdefault(op, {}).setdefault(str(nbytes), {})[path] = round(float(np.median(row / built)), 4)
            if path != _path_table.BUILT_IN and repeats >= MIN_REPEATS_FOR_SPREAD:
                # how much the repeats disagree: the interquartile range of the ratios, over their median
                q1, mid, q3 = np.percentile(row / built, (25, 50, 75))
                spreads.setdefault(op, {}).setdefault(str(nbytes), {})[path] = round(float((q3 - q1) / mid), 4)
        with open(part, "w") as f:
            json.dump({"ranks": ranks, "one_node": one_node, "slots": slots, "seconds": round(seconds, 1),
                       "times": medians, "ratios": ratios, "spreads": spreads, "built_in_paths": took}, f)
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------------
# From the medians to rows

def winner(cell):
    """The fastest path of a cell ({path: us}, or {path: time over the built-in choice's}); the built-in
    choice unless one beats it by GAIN."""
    best = min(cell, key=cell.get)
    built = cell.get(_path_table.BUILT_IN)
    return best if built is None or cell[best] * GAIN <= built else _path_table.BUILT_IN


def winners(times, built_in_paths=None):
    """{op: [(nbytes, path)]} in increasing size, the winner at each size, islands smoothed. An island
    is a path that no neighbour takes: the built-in choice counts as the path it took at that size
    (built_in_paths {op: {size: path}}), so the slots winning at their last size beside a built-in
    choice that was the slots below are a row, not an island."""
    out = {}
    for op, by_size in times.items():
        sizes = sorted(by_size, key=int)
        best = [winner(by_size[s]) for s in sizes]
        took = (built_in_paths or {}).get(op, {})

        def path(i):
            return (took.get(sizes[i]) or best[i]) if best[i] == _path_table.BUILT_IN else best[i]
        for i in range(1, len(sizes) - 1):
            around = best[i - 1]
            if path(i) != path(i - 1) and path(i + 1) == path(i - 1) and around in by_size[sizes[i]]:
                best[i] = around
        out[op] = [(int(s), p) for s, p in zip(sizes, best)]
    return out


def path_at(rows, nbytes):
    """The path rows_of's rows name for a call of `nbytes`."""
    return next((path for upto, path in rows if nbytes <= upto), rows[-1][1])


def rows_of(win):
    """[[upto, path]]: each run of one path as a row up to its last size."""
    rows = []
    for nbytes, path in win:
        if rows and rows[-1][1] == path:
            rows[-1][0] = nbytes
        else:
            rows.append([nbytes, path])
    return rows


BUSY_LIMIT = 0.10   # other processes' share of the machine's cores beyond which a table measures them


def cpu_seconds():
    """(CPU seconds every process on the machine has used, and this process and its waited-for descendants'),
    from /proc/stat and getrusage; None where there is no /proc/stat."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal: all but idle and iowait was taken (steal by the host)
    busy = (sum(v[:3]) + sum(v[5:8])) / os.sysconf("SC_CLK_TCK")
    ours = sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))
    return busy, ours


def others_busy(before, after, wall):
    """Other processes' share of the machine's cores between two cpu_seconds() (None if unknown)."""
    if before is None or after is None or wall <= 0:
        return None
    return max(0.0, ((after[0] - before[0]) - (after[1] - before[1])) / (wall * (os.cpu_count() or 1)))


def noise(spreads, repeats, busy):
    """What the run says about the machine: {"others_busy": other processes' share of its cores meanwhile,
    "spread": the median cell's interquartile range of a path's time over the built-in choice's, over the
    median, "uncertainty": how well that lets a cell's median be known (one standard error of a median:
    0.93 x IQR / sqrt(repeats)), "largest": [spread, ranks, op, bytes, path]}; the spread's keys only with
    MIN_REPEATS_FOR_SPREAD repeats or more. spreads: {ranks: {op: {size: {path: spread}}}}."""
    out = {"others_busy": None if busy is None else round(busy, 4)}
    cells = [(x, ranks, op, int(size), path) for ranks, ops in spreads.items() for op, by_size in ops.items()
             for size, by_path in by_size.items() for path, x in by_path.items()]
    if cells and repeats >= MIN_REPEATS_FOR_SPREAD:
        spread = statistics.median(c[0] for c in cells)
        out.update(spread=round(spread, 4), uncertainty=round(0.93 * spread / repeats ** 0.5, 4),
                   largest=list(max(cells)))
    return out


def too_noisy(summary):
    """Why the 5% rule means nothing on this run ("" when it does): other processes kept the cores busy (the
    table would fit that load, not the machine), or a median is known less well than half of 5%."""
    why = []
    if (summary.get("others_busy") or 0) > BUSY_LIMIT:
        why.append(f"other processes kept {summary['others_busy']:.0%} of the machine's cores busy, over "
                   f"{BUSY_LIMIT:.0%}")
    if summary.get("uncertainty", 0) > (GAIN - 1) / 2:
        why.append(f"a median was known to +-{summary['uncertainty']:.1%}, over half of {GAIN - 1:.0%}")
    return " and ".join(why)


def noise_words(summary):
    busy = summary.get("others_busy")
    words = ("other processes' load unknown" if busy is None else
             f"other processes kept {busy:.0%} of the machine's {os.cpu_count()} cores busy meanwhile")
    if "spread" not in summary:
        return words + f"; the repeats' spread is not judged with fewer than {MIN_REPEATS_FOR_SPREAD} (--repeats)"
    x, ranks, op, nbytes, path = summary["largest"]
    return (words + f"; the repeats' spread (interquartile range of a path's time over the built-in choice's in "
            f"the same repeat): median {summary['spread']:.1%}, so a median is known to about "
            f"+-{summary['uncertainty']:.1%}; largest {x:.1%} ({ranks} ranks, {op} {fmt_bytes(nbytes)}, {path})")


# ---------------------------------------------------------------------------------------------------
# The driver

def cores():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 2


def tune(args):
    from . import _libraries
    ident = _path_table.identity()
    out_path = args.table or _path_table.cache_path(ident)
    ranks_list = args.ranks or list(range(2, max(2, cores()) + 1))
    sizes = [s for s in SIZES if s <= args.max_bytes]
    mpiexec = _libraries.mpiexec()
    tables, times, ratios, spreads, seconds = {}, {}, {}, {}, {}
    began, cpu_before = time.monotonic(), cpu_seconds()
    with tempfile.TemporaryDirectory(prefix="pydist-tune-") as tmp:
        for ranks in ranks_list:
            part = os.path.join(tmp, f"{ranks}.json")
            env = dict(os.environ, PYDIST_TUNE="off", UCX_ERROR_SIGNALS="")
            cmd = [mpiexec, "-n", str(ranks), sys.executable, "-m", "pydist.tune", "--measure", part,
                   "--repeats", str(args.repeats), "--max-bytes", str(args.max_bytes)]
            print(f"tune: {ranks} ranks ...", flush=True)
            try:
                proc = subprocess.run(cmd, env=env, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                sys.exit(f"tune: the {ranks}-rank job did not finish in {args.timeout} s; nothing written")
            if proc.returncode != 0 or not os.path.exists(part):
                sys.exit(f"tune: the {ranks}-rank job failed (exit {proc.returncode}); nothing written")
            with open(part) as f:
                got = json.load(f)
            if not got["one_node"]:
                print(f"tune: {ranks} ranks: no shared-memory slots on this machine's group (MPI's paths "
                      "only); nothing to choose", flush=True)
                continue
            key = str(ranks)
            times[key], ratios[key], spreads[key] = got["times"], got["ratios"], got.get("spreads", {})
            tables[key] = {op: rows_of(win) for op, win in winners(got["ratios"], got["built_in_paths"]).items()}
            seconds[key] = got["seconds"]
    table = {"format": _path_table.FORMAT, **ident,
             "measured": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
             "seconds": round(time.monotonic() - began, 1), "job_seconds": seconds,
             "repeats": args.repeats, "tables": tables, "times": times, "ratios": ratios}
    table["noise"] = noise(spreads, args.repeats, others_busy(cpu_before, cpu_seconds(), table["seconds"]))
    _path_table.check(table)
    print(f"tune: {noise_words(table['noise'])}")
    why = too_noisy(table["noise"])
    if why and not args.force:
        print(f"tune: the machine was too noisy for the {GAIN - 1:.0%} rule to mean anything ({why}): no table "
              "written" + ("" if args.table else " (jobs go on with the cached one, if any)") + "; run it again "
              "when the machine is quieter (or with more --repeats), or write it anyway with --force")
        return 1
    write(out_path, table)
    if args.table:
        print(f"tune: wrote {out_path}; a job uses it with PYDIST_TUNE={out_path}")
    else:
        print(f"tune: wrote {out_path}; from now on every pydist job on this host with this MPI library and "
              f"this pydist takes its paths from it (PYDIST_TUNE=off: without it; --clear removes it)")
    show(table, out_path)
    return 0


def write(path, table):
    from ._files import replacing
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    with replacing(path) as f:
        json.dump(table, f, indent=1)
        f.write("\n")


def freshness(table, here):
    """("fresh" or "stale", why): whether `table` was measured where this process runs (here: identity())."""
    names = {"host": "host", "cpu": "CPU", "library": "MPI library", "libmpi": "libmpi", "pydist": "pydist"}
    differ = [f"{names[k]} {table.get(k, '?')!r} (here: {here[k]!r})" for k in names if table.get(k) != here[k]]
    if not differ:
        return "fresh", "measured on this host, CPU and MPI library, with this pydist"
    return "stale", ("measured for another " + "; ".join(differ) + ": the cache never gives it to a job here, "
                     "and PYDIST_TUNE=FILE would use choices measured elsewhere; `python -m pydist.tune` measures "
                     "a fresh one")


def show(table, path):
    state, why = freshness(table, _path_table.identity())
    print(f"path table {path}")
    print(f"  {state:8s} {why}")
    print(f"  measured {table.get('measured', '?')} in {table.get('seconds', '?')} s on {table.get('host', '?')}")
    print(f"  cpu      {table.get('cpu', '?')}")
    print(f"  mpi      {table.get('library', '?')} ({table.get('libmpi', '?')})")
    print(f"  pydist   {table.get('pydist', '?')}")
    if isinstance(table.get("noise"), dict):
        print(f"  noise    {noise_words(table['noise'])}")
    for ranks in sorted(table["tables"], key=int):
        print(f"{ranks} ranks (input bytes per rank: path)")
        for op in _path_table.OPS:
            rows = table["tables"][ranks].get(op)
            if not rows:
                continue
            spans = [f"<= {fmt_bytes(upto)} {path}" for upto, path in rows[:-1]]
            spans.append(f"{'larger' if spans else 'all'} {rows[-1][1]}")
            print(f"  {op:15s} " + " | ".join(spans))
    if table.get("times"):
        print("medians, us (the path the table takes marked *):")
        for ranks in sorted(table["times"], key=int):
            for op in _path_table.OPS:
                by_size = table["times"][ranks].get(op, {})
                if not by_size:
                    continue
                paths = [_path_table.BUILT_IN, *_path_table.paths_of(op, int(ranks))]
                print(f"  {ranks} ranks {op}: " + "  ".join(f"{p:>9s}" for p in paths))
                for s in sorted(by_size, key=int):
                    cell = by_size[s]
                    best = path_at(table["tables"].get(ranks, {}).get(op) or [[0, _path_table.BUILT_IN]], int(s))
                    print(f"  {fmt_bytes(int(s)):>18s}  " + "  ".join(
                        f"{cell[p]:8.1f}{'*' if p == best else ' '}" if p in cell else f"{'-':>9s}" for p in paths))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m pydist.tune", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", help="group sizes to measure (default 2 .. this machine's cores)")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds per path and size (median; default 5)")
    ap.add_argument("--max-bytes", type=int, default=SIZES[-1], help="largest input per rank (default 64 MiB)")
    ap.add_argument("--table", help="the table file to write or show (default: this machine's cache)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds each job may take (default 600)")
    ap.add_argument("--show", action="store_true", help="print the table and its measurements")
    ap.add_argument("--clear", action="store_true", help="remove this machine's cached table")
    ap.add_argument("--force", action="store_true", help="write the table even when the machine was too noisy for "
                                                         "the 5%% rule (other processes' load, the repeats' spread)")
    ap.add_argument("--measure", metavar="PART", help=argparse.SUPPRESS)   # one job's half, under mpiexec
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.max_bytes < 8 or (args.ranks and min(args.ranks) < 2):
        ap.error("--repeats >= 1, --max-bytes >= 8 and --ranks >= 2")
    if args.measure:
        return measure(args.measure, [s for s in SIZES if s <= args.max_bytes], args.repeats)
    if args.show or args.clear:
        path = args.table or _path_table.cache_path()
        if args.clear:
            try:
                os.remove(path)
                print(f"removed {path}")
            except FileNotFoundError:
                print(f"no table at {path}")
            return 0
        try:
            table = _path_table.read(path)
        except FileNotFoundError:
            print(f"no path table for this host and MPI library ({path}): pydist uses its built-in choices; "
                  "`python -m pydist.tune` measures one")
            others = [] if args.table else sorted(glob.glob(os.path.join(glob.escape(os.path.dirname(path)),
                                                                         "paths-*.json")))
            if others:
                print(f"{len(others)} stale table(s) in {os.path.dirname(path)} (measured for another host, CPU, MPI "
                      "library or pydist: no job here uses them); --show --table FILE shows one")
            return 1
        except (OSError, ValueError) as e:
            sys.exit(f"tune: {e}")
        show(table, path)
        return 0
    return tune(args)


if __name__ == "__main__":
    sys.exit(main())
