"""The benchmarks still run and print their figures (no timing is asserted: the machine is shared)."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


def test_collectives_sweep_quick():
    proc = subprocess.run([sys.executable, "benchmarks/collectives_sweep.py", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for op in OPS:
        table = out.split(f"\n{op}, 2 ranks (busbw")[1].split("\n\n")[0]
        rows = [line.split() for line in table.splitlines() if re.match(r"\s+\d+ (B|KiB|MiB) \|", line)]
        # 3 sizes, each with a positive time for C, pydist and mpi4py
        assert len(rows) == 3, table
        for row in rows:
            times = [float(x) for x in row[3:6]]
            assert all(t > 0 for t in times), row
        assert f"{op}, 2 ranks: pydist - C at" in out and "time mpi4py/pydist" in out, out


def test_collectives_sweep_rejects_bad_sizes():
    proc = subprocess.run([sys.executable, "benchmarks/collectives_sweep.py", "--sizes", "6"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "multiples of 4 bytes" in proc.stderr, proc.stderr


def test_train_compare_quick():
    """pydist's trainer and torch DDP (gloo) on the same LeNet-5, 1 epoch at 1 and 2 ranks."""
    proc = subprocess.run([sys.executable, "benchmarks/train_compare.py", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if re.match(r"(pydist|torch)\s+[12]\s", line)]
    assert sorted((r[0], r[1]) for r in rows) == [("pydist", "1"), ("pydist", "2"), ("torch", "1"), ("torch", "2")]
    for r in rows:
        assert float(r[2]) > 0 and 0.7 < float(r[4]) <= 1.0, r   # samples/s, test accuracy after 1 epoch
    assert "pydist / torch samples/s" in proc.stdout


def test_strategies_quick(tmp_path):
    """Every strategy trains at 2 ranks for a few steps; the table has a row each, the plot is drawn."""
    proc = subprocess.run([sys.executable, "benchmarks/strategies.py", "--quick", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = proc.stdout.split("\nnormal (no straggler)")[1]
    rows = {r[0]: r for r in (line.split() for line in table.splitlines()) if len(r) == 12 and r[1] == "2"}
    assert sorted(rows) == sorted(("allreduce", "ring", "central", "ps", "average", "easgd")), table
    for name, r in rows.items():
        workers, accuracy, samples_per_s = int(r[2]), float(r[4]), float(r[6])
        assert workers == (1 if name == "ps" else 2), r
        # 40 steps from the same seed: every strategy is past chance (0.1) and none is done learning
        assert 0.2 < accuracy < 0.9 and samples_per_s > 0, r
    assert (tmp_path / "strategies.png").stat().st_size > 0


def test_strategies_says_what_it_skips(tmp_path):
    """A combination that cannot run is named with its reason, never dropped silently (no job runs)."""
    for argv, reason in ((["--ranks", "1", "--strategies", "ps"], "skipped ps R=1: ps needs at least one worker"),
                         (["--ranks", "2", "--strategies", "allreduce", "--slow-rank", "2", "--slow-ms", "5"],
                          "skipped allreduce R=2: no rank 2 to slow at R=2")):
        proc = subprocess.run([sys.executable, "benchmarks/strategies.py", "--out", str(tmp_path)] + argv, cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and reason in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
