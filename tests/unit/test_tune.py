"""python -m pydist.tune and the path table's file (issue 46; pydist/tune.py, pydist/_path_table.py): a
measured table is a valid one that --show reads back; init takes PYDIST_TUNE's table or this machine's
cached one, never through a link, and says so once when the cache is unusable; every rank takes world
rank 0's table; the cache is keyed by the MPI library, CPU and pydist; noise in one cell makes no row."""
import json
import os
import re
import subprocess
import sys

import pytest

from pydist import _path_table as pt
from pydist import tune
from unit_helpers import MPIEXEC, popen_kwargs

# what each rank of a job says about the table it holds after init
SAY_TABLE = ("import json, sys, pydist as dist; dist.init_process_group(); "
             "sys.stdout.write(f'TABLE {dist.get_rank()} {json.dumps(dist._C.path_table())}\\n'); sys.stdout.flush(); "
             "dist.destroy_process_group()")


def job(n, tmp_path, timeout=120, **env):
    """A job of n ranks that says its table; env's None values are unset."""
    kw = popen_kwargs(MPIEXEC_TIMEOUT=str(timeout), PYDIST_TUNE_DIR=str(tmp_path / "cache"),
                      **{k: v for k, v in env.items() if v is not None})
    for k in (k for k, v in env.items() if v is None):
        kw["env"].pop(k, None)
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, "-c", SAY_TABLE], capture_output=True,
                          timeout=timeout + 30, **kw)


def tables_said(proc):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = {int(rank): [tuple(r) for r in json.loads(rows)]
            for rank, rows in re.findall(r"TABLE (\d+) (\[[^\n]*?\]\]|\[\])", proc.stdout)}
    assert len(said) == proc.stdout.count("TABLE "), proc.stdout
    return said


def test_tune_writes_a_table_that_show_reads_and_init_takes(tmp_path):
    path = tmp_path / "t.json"
    kw = popen_kwargs(PYDIST_TUNE_DIR=str(tmp_path / "cache"))
    # (--force: the suite's other lane keeps the cores busy, which alone would refuse the table)
    proc = subprocess.run([sys.executable, "-m", "pydist.tune", "--ranks", "2", "--max-bytes", "4096",
                           "--repeats", "1", "--table", str(path), "--force"], capture_output=True, timeout=300, **kw)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"tune: wrote {path}; a job uses it with PYDIST_TUNE={path}" in proc.stdout, proc.stdout
    assert "the repeats' spread is not judged with fewer than 3" in proc.stdout, proc.stdout
    table = pt.read(str(path))
    assert set(table["tables"]["2"]) == set(pt.OPS)
    for op, rows in table["tables"]["2"].items():
        assert rows[-1][0] == 4096 and all(p in [pt.BUILT_IN, *pt.paths_of(op, 2)] for _, p in rows), (op, rows)
        assert set(table["times"]["2"][op]) == {str(1 << k) for k in range(3, 13)}, op
    show = subprocess.run([sys.executable, "-m", "pydist.tune", "--show", "--table", str(path)],
                          capture_output=True, timeout=60, **kw)
    assert show.returncode == 0, show.stderr
    for op in pt.OPS:
        assert f"  {op} " in show.stdout and f"2 ranks {op}:" in show.stdout, show.stdout
    assert table["cpu"] in show.stdout and table["library"] in show.stdout
    assert "  fresh    measured on this host, CPU and MPI library, with this pydist" in show.stdout, show.stdout
    said = tables_said(job(2, tmp_path, PYDIST_TUNE=str(path)))
    assert said == {0: pt.rows(table), 1: pt.rows(table)}


def test_every_rank_takes_world_rank_0s_table(tmp_path):
    def mpmd(first, second):
        kw = popen_kwargs(MPIEXEC_TIMEOUT="120")
        cmd = [MPIEXEC, "-n", "1", "-env", "PYDIST_TUNE", first, sys.executable, "-c", SAY_TABLE, ":",
               "-n", "1", "-env", "PYDIST_TUNE", second, sys.executable, "-c", SAY_TABLE]
        return tables_said(subprocess.run(cmd, capture_output=True, timeout=150, **kw))
    forced = pt.rows(pt.forcing("mpi"))
    assert mpmd("force:mpi", "off") == {0: forced, 1: forced}
    assert mpmd("off", "force:ring,pair") == {0: [], 1: []}


def test_a_named_table_that_cannot_be_used_is_the_same_error_on_every_rank(tmp_path):
    """Only world rank 0's table is used: its file missing is a ValueError naming it on every rank, once
    MPI has started (a rank that raised before MPI_Init left the others waiting in it); another rank's
    missing file changes nothing."""
    good = tmp_path / "good.json"
    good.write_text(json.dumps(pt.forcing("mpi")))
    missing = tmp_path / "missing.json"
    def mpmd(first, second):
        kw = popen_kwargs(MPIEXEC_TIMEOUT="120")
        cmd = [MPIEXEC, "-n", "1", "-env", "PYDIST_TUNE", first, sys.executable, "-c", SAY_TABLE, ":",
               "-n", "1", "-env", "PYDIST_TUNE", second, sys.executable, "-c", SAY_TABLE]
        return subprocess.run(cmd, capture_output=True, timeout=150, **kw)
    proc = mpmd(str(missing), str(good))
    assert proc.returncode != 0 and "TABLE" not in proc.stdout, proc.stdout + proc.stderr
    error = f"ValueError: init_process_group(): PYDIST_TUNE={missing}: No such file or directory"
    assert proc.stderr.count(error) == 2, proc.stderr   # rank 0's words, on both ranks
    forced = pt.rows(pt.forcing("mpi"))
    assert tables_said(mpmd(str(good), str(missing))) == {0: forced, 1: forced}


def test_a_cache_never_stops_a_job(tmp_path):
    """Whatever is wrong with the cached table (nesting past Python's recursion limit, one group size
    spelled twice), init says so once and goes on with the built-in choices."""
    cache = tmp_path / "cache"
    cache.mkdir()
    kw = popen_kwargs(PYDIST_TUNE_DIR=str(cache))
    kw["env"].pop("PYDIST_TUNE", None)
    where = subprocess.run([sys.executable, "-c", "from pydist import _path_table as pt; print(pt.cache_path())"],
                           capture_output=True, timeout=60, **kw).stdout.strip()
    rows = [[1 << 20, "mpi"]]
    for text, said in [("[" * 100_000 + "]" * 100_000, "nested too deeply"),
                       (json.dumps({"format": pt.FORMAT, "tables": {"2": {"all_reduce": rows},
                                                                    "02": {"all_reduce": rows}}}), "written plainly")]:
        with open(where, "w") as f:
            f.write(text)
        proc = job(2, tmp_path, PYDIST_TUNE=None)
        assert tables_said(proc) == {0: [], 1: []}, proc.stderr
        assert proc.stderr.count("the cached path table is not used") == 2 and said in proc.stderr, proc.stderr


def test_the_cache_is_used_never_through_a_link_and_a_bad_one_is_said_once(tmp_path):
    cache = tmp_path / "cache"
    kw = popen_kwargs(PYDIST_TUNE_DIR=str(cache))
    kw["env"].pop("PYDIST_TUNE", None)
    where = subprocess.run([sys.executable, "-c", "from pydist import _path_table as pt; print(pt.cache_path())"],
                           capture_output=True, timeout=60, **kw).stdout.strip()
    assert os.path.dirname(where) == str(cache), where
    table = pt.forcing("ring,pair")
    table["tables"] = {"2": table["tables"]["2"]}
    cache.mkdir()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(table))
    os.symlink(elsewhere, where)   # a link planted at the cache's name: not followed
    proc = job(2, tmp_path, PYDIST_TUNE=None)
    assert tables_said(proc) == {0: [], 1: []}
    assert proc.stderr.count("the cached path table is not used") == 2, proc.stderr   # once per rank
    os.remove(where)
    with open(where, "w") as f:
        f.write("{not json")
    proc = job(2, tmp_path, PYDIST_TUNE=None)
    assert tables_said(proc) == {0: [], 1: []} and "is not JSON" in proc.stderr, proc.stderr
    with open(where, "w") as f:
        json.dump(table, f)
    proc = job(2, tmp_path, PYDIST_TUNE=None)
    assert tables_said(proc) == {0: pt.rows(table), 1: pt.rows(table)} and not proc.stderr.strip(), proc.stderr
    assert tables_said(job(2, tmp_path, PYDIST_TUNE="off")) == {0: [], 1: []}
    # a table named by PYDIST_TUNE that is not there is the user's error, said at init
    proc = job(1, tmp_path, PYDIST_TUNE=str(tmp_path / "missing.json"))
    assert proc.returncode != 0 and "ValueError: init_process_group(): PYDIST_TUNE=" in proc.stderr, proc.stderr
    proc = job(1, tmp_path, PYDIST_TUNE="force:fast")
    assert proc.returncode != 0 and "paths are slots, pair, mpi, ring, shm" in proc.stderr, proc.stderr


def test_the_cache_key_follows_the_library_cpu_and_pydist(monkeypatch, tmp_path):
    monkeypatch.setenv("PYDIST_TUNE_DIR", str(tmp_path))
    base = {"host": "node/../7", "cpu": "AMD EPYC", "library": "MPICH Version: 4.0.2", "libmpi": "/usr/lib/libmpi.so.12",
            "pydist": "0.1.0"}
    first = pt.cache_path(base)
    assert os.path.dirname(first) == str(tmp_path) and "/" not in os.path.basename(first)[:-5]
    assert os.path.basename(first).startswith("paths-node_.._7-")
    for key, value in [("library", "MPICH Version: 5.0.2"), ("cpu", "Intel Xeon"), ("pydist", "0.2.0"),
                       ("libmpi", "/opt/mpich/lib/libmpi.so.12")]:
        assert pt.cache_path(dict(base, **{key: value})) != first, key
    assert pt.cache_path(dict(base)) == first


def test_tables_that_are_not_tables_are_refused():
    good = {"format": pt.FORMAT, "tables": {"2": {"all_reduce": [[1024, "slots"], [1 << 20, "ring"]]}}}
    pt.check(good)
    assert pt.rows(good) == [(2, 0, 1, 1024), (2, 0, 4, 1 << 20)]
    for bad, match in [
        ({"format": "other", "tables": {}}, "not a path table"),
        ({"format": pt.FORMAT}, "no 'tables'"),
        ({"format": pt.FORMAT, "tables": {"1": {}}}, "group size"),
        ({"format": pt.FORMAT, "tables": {"two": {}}}, "group size"),
        ({"format": pt.FORMAT, "tables": {"2": {"all_reduce": []}}}, "non-empty"),
        ({"format": pt.FORMAT, "tables": {"2": {"gather": [[8, "mpi"]]}}}, "unknown collective"),
        ({"format": pt.FORMAT, "tables": {"2": {"all_reduce": [[8, "pair"]]}}}, "not one of"),
        ({"format": pt.FORMAT, "tables": {"3": {"broadcast": [[8, "pair"]]}}}, "not one of"),
        ({"format": pt.FORMAT, "tables": {"2": {"all_reduce": [[64, "mpi"], [64, "ring"]]}}}, "increase"),
        ({"format": pt.FORMAT, "tables": {"2": {"all_reduce": [[8.0, "mpi"]]}}}, "a row must be"),
        ({"format": pt.FORMAT, "tables": {"2": {"all_reduce": [[True, "mpi"]]}}}, "a row must be"),
    ]:
        with pytest.raises(ValueError, match=match):
            pt.check(bad)


def test_one_noisy_cell_makes_no_row():
    def cells(at_32):
        fast, slow = {"slots": 1.0, "mpi": 2.0}, {"slots": 2.0, "mpi": 1.0}
        return {"all_reduce": {str(8 << i): c for i, c in enumerate([fast, fast, at_32, fast, slow, slow])}}
    # 32 B's mpi is ahead, its neighbours' slots are not: one cell, theirs, however far ahead it was
    for at_32 in ({"slots": 1.03, "mpi": 1.0}, {"slots": 2.0, "mpi": 1.0}):
        win = tune.winners(cells(at_32))["all_reduce"]
        assert [p for _, p in win] == ["slots"] * 4 + ["mpi"] * 2
        assert tune.rows_of(win) == [[64, "slots"], [256, "mpi"]]
    # two cells in a row make a row; the last size may stand alone
    by_size = cells({"slots": 2.0, "mpi": 1.0})["all_reduce"]
    by_size["64"] = {"slots": 2.0, "mpi": 1.0}
    by_size["256"] = {"slots": 1.0, "mpi": 2.0}
    win = tune.winners({"all_reduce": by_size})["all_reduce"]
    assert tune.rows_of(win) == [[16, "slots"], [128, "mpi"], [256, "slots"]]


def test_a_path_that_the_built_in_choice_took_below_is_no_island():
    # 2-rank broadcast: the built-in choice takes the slots up to 32 KiB and the pair exchange past it;
    # the slots, 3x faster at 64 KiB (their last size), make a row there
    b = pt.BUILT_IN
    ratios = {"broadcast": {"32768": {b: 1.0, "pair": 4.0}, "65536": {b: 1.0, "slots": 0.35, "mpi": 1.1},
                            "131072": {b: 1.0, "mpi": 1.1}}}
    took = {"broadcast": {"32768": "slots", "65536": "pair", "131072": "pair"}}
    win = tune.winners(ratios, took)["broadcast"]
    assert tune.rows_of(win) == [[32768, b], [65536, "slots"], [131072, b]]
    # without knowing what the built-in choice took, the lone cell is smoothed away
    assert tune.rows_of(tune.winners(ratios)["broadcast"]) == [[131072, b]]
    # and a path no neighbour takes is still an island
    took["broadcast"]["32768"] = "pair"
    assert tune.rows_of(tune.winners(ratios, took)["broadcast"]) == [[131072, b]]


def test_show_marks_the_path_the_rows_name_at_each_size():
    rows = [[32768, pt.BUILT_IN], [65536, "slots"], [1 << 20, "mpi"]]
    assert [tune.path_at(rows, n) for n in (8, 32768, 32769, 65536, 1 << 20, 1 << 26)] == \
        [pt.BUILT_IN, pt.BUILT_IN, "slots", "slots", "mpi", "mpi"]


def test_a_path_replaces_the_built_in_choice_only_where_it_is_5_percent_faster():
    assert tune.winner({pt.BUILT_IN: 1.0, "mpi": 0.97, "pair": 0.99}) == pt.BUILT_IN
    assert tune.winner({pt.BUILT_IN: 1.0, "mpi": 0.9, "pair": 0.99}) == "mpi"
    table = {"format": pt.FORMAT, "tables": {"2": {"broadcast": [[64, pt.BUILT_IN], [1 << 20, "pair"]]}}}
    pt.check(table)
    assert pt.rows(table) == [(2, 1, 0, 64), (2, 1, 2, 1 << 20)]


def busy_cores():
    """One busy loop per core, for as long as the caller holds them."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]


def test_tune_on_a_busy_machine_writes_no_table_unless_forced(tmp_path):
    """Two runs a minute apart on a busy machine chose differently: the table fits the load of the moment.
    Other processes over 10% of the cores is a refusal that says why; --force writes it all the same."""
    path = tmp_path / "t.json"
    kw = popen_kwargs(PYDIST_TUNE_DIR=str(tmp_path / "cache"))
    cmd = [sys.executable, "-m", "pydist.tune", "--ranks", "2", "--max-bytes", "1024", "--repeats", "3"]
    hogs = busy_cores()
    try:
        refused = subprocess.run(cmd, capture_output=True, timeout=300, **kw)
        forced = subprocess.run(cmd + ["--table", str(path), "--force"], capture_output=True, timeout=300, **kw)
    finally:
        for p in hogs:
            p.kill()
            p.wait()
    assert refused.returncode == 1, refused.stdout + refused.stderr
    busy = re.search(r"other processes kept (\d+)% of the machine's cores busy, over 10%", refused.stdout)
    assert busy and int(busy.group(1)) > 10, refused.stdout
    assert "no table written (jobs go on with the cached one, if any)" in refused.stdout, refused.stdout
    assert "--force" in refused.stdout and not (tmp_path / "cache").exists(), refused.stdout
    assert re.search(r"the repeats' spread \(.*\): median \d+\.\d%, so a median is known to about \+-\d+\.\d%",
                     refused.stdout), refused.stdout
    assert forced.returncode == 0 and path.exists(), forced.stdout + forced.stderr
    table = pt.read(str(path))
    assert table["noise"]["others_busy"] > tune.BUSY_LIMIT and table["noise"]["spread"] >= 0, table["noise"]


def test_noise_is_judged_from_the_load_and_the_spread():
    spreads = {"2": {"all_reduce": {"8": {"mpi": 0.02, "ring": 0.04}, "16": {"mpi": 0.30}}}}
    quiet = tune.noise(spreads, 9, 0.01)
    assert quiet["spread"] == 0.04 and quiet["largest"] == [0.30, "2", "all_reduce", 16, "mpi"]
    assert quiet["uncertainty"] == round(0.93 * 0.04 / 3, 4) and tune.too_noisy(quiet) == ""
    assert "over 10%" in tune.too_noisy(tune.noise(spreads, 9, 0.25))
    wide = tune.noise({"2": {"broadcast": {"8": {"mpi": 0.2}}}}, 4, 0.0)   # +-9.3%: a coin flip at 5%
    assert "a median was known to +-9.3%, over half of 5%" == tune.too_noisy(wide)
    assert "spread" not in tune.noise(spreads, 2, None) and tune.too_noisy(tune.noise(spreads, 2, None)) == ""


def test_show_tells_a_stale_table_from_a_fresh_one(tmp_path):
    here = pt.identity()
    table = dict(pt.forcing("mpi"), **here)
    assert tune.freshness(table, here)[0] == "fresh"
    state, why = tune.freshness(dict(table, cpu="Another CPU", pydist="0.0.1"), here)
    assert state == "stale" and "CPU 'Another CPU'" in why and "pydist '0.0.1'" in why and here["cpu"] in why
    path = tmp_path / "old.json"
    path.write_text(json.dumps(dict(table, library="Open MPI v5.0.8")))
    show = subprocess.run([sys.executable, "-m", "pydist.tune", "--show", "--table", str(path)], capture_output=True,
                          timeout=60, **popen_kwargs())
    assert show.returncode == 0 and "  stale    measured for another MPI library 'Open MPI v5.0.8'" in show.stdout, \
        show.stdout + show.stderr
    # a cache folder with only another version's table: no table for this one, and the stale one is named
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "paths-vm-0123456789abcdef.json").write_text(json.dumps(dict(table, pydist="0.0.1")))
    none = subprocess.run([sys.executable, "-m", "pydist.tune", "--show"], capture_output=True, timeout=60,
                          **popen_kwargs(PYDIST_TUNE_DIR=str(cache)))
    assert none.returncode == 1 and "no path table for this host" in none.stdout, none.stdout + none.stderr
    assert f"1 stale table(s) in {cache}" in none.stdout, none.stdout
