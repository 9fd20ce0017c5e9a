"""The path table: which path carries each collective at each size, as `python -m pydist.tune` measured
it on this machine (pydist/tune.py), in a file cached per host and MPI library.

init_process_group reads it (rows_for_init) and hands the rows to C (csrc/paths/tuned.c), which gives
every rank world rank 0's table, so every choice made from it is the same on every rank. Without a table,
or for a group size or collective it has no rows for, every path keeps its built-in choice.

PYDIST_TUNE: unset, this machine's cached table if there is one (one that cannot be used, for any
reason, is said once on stderr and left out); "off", none; a file's path, that table (world rank 0's
is used: if it cannot be, init raises a ValueError naming the file on every rank); "force:PATH[,PATH...]", a table that sends every
collective, at every size and on groups of 2 to 64 ranks, by the first of those paths it has (the others
keep their built-in choice): to try a path, and for the conformance fuzzer, which runs its programs so.
PYDIST_TUNE_DIR: where tables are cached (default $XDG_CACHE_HOME/pydist, else ~/.cache/pydist).

The file (JSON):
    {"format": "pydist path table 1", "host": ..., "library": ..., "libmpi": ..., "cpu": ..., "pydist": ...,
     "measured": "2026-11-29T04:30:00Z", "seconds": 6.1,
     "tables": {"2": {"all_reduce": [[32768, "slots"], [262144, "shm"], [4194304, "ring"], ...], ...}},
     "times": {"2": {"all_reduce": {"8": {"slots": 1.9, "mpi": 4.2, ...}, ...}}},   (medians, us; --show)
     "ratios": {"2": {"all_reduce": {"8": {"built-in": 1.0, "mpi": 2.1, ...}, ...}}}}   (what chose the rows:
     each path's time over the built-in choice's in the same repeat, median over the repeats)
A row [upto, path]: calls whose input is at most `upto` bytes (and past the row before) take `path`
("built-in": the choice pydist makes without a table); past the last row, the last row's path. The
input is the array each rank passes (all_gather: its own block).
"""
import functools
import hashlib
import json
import os
import platform
import socket
import stat
import sys

FORMAT = "pydist path table 1"
OPS = ("all_reduce", "broadcast", "all_gather", "all_to_all", "reduce_scatter")   # csrc/paths/tuned.h's order
PATHS = ("slots", "pair", "mpi", "ring", "shm")   # tuned.h's PD_TUNED_SLOTS.. (1..5)
BUILT_IN = "built-in"                            # PD_TUNED_NONE (0): the choice pydist makes without a table
MAX_RANKS, MAX_ROWS = 1024, 2048                  # tuned.h's
MAX_FILE_BYTES = 1 << 20
FORCE_RANKS = range(2, 65)


def paths_of(op, ranks):
    """The paths a row of `op` may name on a group of `ranks` (tuned.c's path_allowed)."""
    out = ["slots"]
    if ranks == 2 and op in ("broadcast", "all_gather", "all_to_all"):
        out.append("pair")
    out.append("mpi")
    if op in ("all_reduce", "reduce_scatter"):
        out.append("ring")
    if op == "all_reduce":
        out.append("shm")
    return out


@functools.lru_cache(maxsize=1)   # (init reads it every time; /proc/cpuinfo is long on large machines)
def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def identity():
    """What a cached table belongs to: this host, its CPU, the MPI library loaded, and pydist's build."""
    return dict(_identity())


@functools.lru_cache(maxsize=1)   # none of it changes within a process; init asks at every call
def _identity():
    from . import __version__, _C, _libraries
    library = _C.mpi_info()["library_version"].strip().splitlines()[0].strip()
    return {"host": socket.gethostname(), "cpu": cpu_name(), "library": library,
            "libmpi": os.path.realpath(_libraries.LIBMPI[0]), "pydist": __version__}


def cache_dir():
    d = os.environ.get("PYDIST_TUNE_DIR")
    if d:
        return d
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pydist")


def cache_path(ident=None):
    """This host's table for this MPI library: a change of library, CPU or pydist is another file."""
    ident = ident or identity()
    key = hashlib.sha256(json.dumps([ident[k] for k in ("cpu", "library", "libmpi", "pydist")]).encode()).hexdigest()
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in ident["host"])[:64] or "host"
    return os.path.join(cache_dir(), f"paths-{host}-{key[:16]}.json")


def read(path):
    """The table in `path` (a dict, checked by check()), never through a link. OSError, ValueError."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise ValueError(f"{path} is larger than a path table can be ({st.st_size} bytes)")
        data = f.read(MAX_FILE_BYTES + 1)
    try:
        table = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not JSON: {e}") from None
    except RecursionError:
        raise ValueError(f"{path} is nested too deeply to be a path table") from None
    check(table, path)
    return table


def check(table, where="the path table"):
    """ValueError unless `table` is a path table: the format, and every row in range and in order."""
    def bad(why):
        raise ValueError(f"{where}: {why}")
    if not isinstance(table, dict) or table.get("format") != FORMAT:
        bad(f"not a path table (its format must be {FORMAT!r})")
    tables = table.get("tables")
    if not isinstance(tables, dict):
        bad("no 'tables'")
    n = 0
    for ranks_key, ops in tables.items():
        # one spelling per number ("2", never "02" beside it): two keys of one size would be two tables
        if not (isinstance(ranks_key, str) and ranks_key.isascii() and ranks_key.isdigit() and
                ranks_key == str(int(ranks_key)) and 2 <= int(ranks_key) <= MAX_RANKS):
            bad(f"group size {ranks_key!r} is not a whole number from 2 to {MAX_RANKS}, written plainly")
        ranks = int(ranks_key)
        if not isinstance(ops, dict):
            bad(f"tables[{ranks_key!r}] is not an object")
        for op, rows in ops.items():
            if op not in OPS:
                bad(f"unknown collective {op!r} (one of {', '.join(OPS)})")
            if not isinstance(rows, list) or not rows:
                bad(f"{op} at {ranks} ranks: rows must be a non-empty list")
            last = 0
            for row in rows:
                if not (isinstance(row, list) and len(row) == 2 and type(row[0]) is int and isinstance(row[1], str)):
                    bad(f"{op} at {ranks} ranks: a row must be [bytes, path]; got {row!r}")
                upto, path = row
                if not last < upto <= 1 << 62:
                    bad(f"{op} at {ranks} ranks: sizes must increase from 1 B (got {upto} after {last})")
                if path != BUILT_IN and path not in paths_of(op, ranks):
                    bad(f"{op} at {ranks} ranks: path {path!r} is not one of "
                        f"{', '.join([BUILT_IN, *paths_of(op, ranks)])}")
                last = upto
                n += 1
    if n > MAX_ROWS:
        bad(f"{n} rows; at most {MAX_ROWS}")


def rows(table):
    """The C rows (ranks, op, path, upto) of a checked table, in tuned.c's order."""
    out = []
    for ranks_key in sorted(table["tables"], key=int):
        ops = table["tables"][ranks_key]
        for op in sorted(ops, key=OPS.index):
            out += [(int(ranks_key), OPS.index(op), 0 if path == BUILT_IN else PATHS.index(path) + 1, upto)
                    for upto, path in ops[op]]
    return out


def forcing(spec):
    """The table of PYDIST_TUNE=force:PATH[,PATH...] (spec: what follows "force:")."""
    wanted = spec.split(",")
    unknown = [p for p in wanted if p not in PATHS]
    if not spec or unknown:
        raise ValueError(f"force:{spec}: paths are {', '.join(PATHS)}, separated by commas")
    tables = {}
    for ranks in FORCE_RANKS:
        for op in OPS:
            path = next((p for p in wanted if p in paths_of(op, ranks)), None)
            if path is not None:
                tables.setdefault(str(ranks), {})[op] = [[1 << 62, path]]
    return {"format": FORMAT, "tables": tables}


_warned = set()


def rows_for_init():
    """(rows, problem) for init_process_group: the C rows of PYDIST_TUNE's table or this machine's cached
    one (None: no table), and why the table PYDIST_TUNE names cannot be used (None: it can). Nothing here
    raises before MPI starts: init raises world rank 0's problem on every rank once MPI has, since only
    rank 0's table is used. A cached table that cannot be used, for any reason, is said once on stderr
    and left out."""
    setting = os.environ.get("PYDIST_TUNE", "")
    if setting == "off":
        return None, None
    if setting.startswith("force:"):
        try:
            return rows(forcing(setting[len("force:"):])), None
        except ValueError as e:
            return None, f"init_process_group(): PYDIST_TUNE={setting}: {e}"
    if setting:
        try:
            return rows(read(setting)), None
        except OSError as e:
            return None, f"init_process_group(): PYDIST_TUNE={setting}: {e.strerror or e}"
        except ValueError as e:
            return None, f"init_process_group(): PYDIST_TUNE: {e}"
    try:
        path = cache_path()
        return rows(read(path)), None
    except FileNotFoundError:
        return None, None
    except Exception as e:   # whatever is wrong with a cache, the job goes on without it
        why = f"{type(e).__name__}: {e}" if not isinstance(e, (OSError, ValueError)) else str(e)
        if why not in _warned:
            _warned.add(why)
            print(f"pydist: the cached path table is not used ({why}); `python -m pydist.tune` measures a new one",
                  file=sys.stderr)
        return None, None
