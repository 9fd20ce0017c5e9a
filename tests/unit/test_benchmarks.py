"""The benchmarks still run and print their figures (no timing is asserted: the machine is shared)."""
import json
import os
import re
import subprocess
import sys

import pytest

from pydist import _figures as figures
from unit_helpers import MPIEXEC

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


def test_collectives_sweep_quick():
    proc = subprocess.run([sys.executable, "benchmarks/collectives_sweep.py", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for op in OPS:
        # the title names the MPI library every program ran on (one, checked by the sweep)
        table = re.split(rf"\n{op}, 2 ranks, on MPICH Version: *\d[^\n]*\(busbw", out)[1].split("\n\n")[0]
        rows = [line.split() for line in table.splitlines() if re.match(r"\s+\d+ (B|KiB|MiB) \|", line)]
        # 3 sizes, each with a positive time for C, pydist and mpi4py
        assert len(rows) == 3, table
        for row in rows:
            times = [float(x) for x in row[3:6]]
            assert all(t > 0 for t in times), row
        assert f"{op}, 2 ranks: pydist - C at" in out and "time mpi4py/pydist" in out, out
        # the best program at each size, among raw C, mpi4py and pydist's paths, and pydist over it
        names = ("C", "pydist", "mpi4py", "ring", "shm", "noslot", "pyMPI")
        for row in rows:
            assert row[-2] in names and float(row[-1]) >= 1.0, row
        assert re.search(rf"{op}, 2 ranks: .*pydist/best of all: max \d+\.\d+ at", out), out


def test_collectives_sweep_own_arrays():
    # --arrays own: every size its own two arrays, in the C baseline as in the Python workers
    proc = subprocess.run([sys.executable, "benchmarks/collectives_sweep.py", "--quick", "--arrays", "own",
                           "--ops", "all_gather", "--programs", "c", "pydist"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "arrays: own" in proc.stdout.splitlines()[0], proc.stdout
    table = proc.stdout.split("(busbw")[1].split("\n\n")[0]
    rows = [line.split() for line in table.splitlines() if re.match(r"\s+\d+ (B|KiB|MiB) \|", line)]
    assert len(rows) == 3 and all(float(x) > 0 for row in rows for x in row[3:5]), table
    raw = subprocess.run([MPIEXEC, "-n", "2", "benchmarks/.build/usr-bin/collectives_raw", "-o", "all_gather:4096:10"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert raw.returncode == 0 and "arrays=own" in raw.stdout, raw.stdout + raw.stderr
    assert re.search(r"^result all_gather 4096 10 \d+\.\d+$", raw.stdout, re.M), raw.stdout


def test_mixed_sequence_prints_every_cell_and_the_worst():
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "benchmarks/mixed_sequence.py", "--sizes", "64",
                           "--repeats", "2", "--seconds", "0.002"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.split() and line.split()[0] in OPS]
    # each collective: alone, then after each of the five as pydist's call and as mpi4py's, then the copy
    assert [r[0] for r in rows] == list(OPS) and all(len(r) == 14 for r in rows), proc.stdout
    assert all(float(x) > 0 for r in rows for x in r[1:2] + r[3:]), proc.stdout
    assert "median of 2 repeats" in proc.stdout, proc.stdout
    assert re.search(r"worst cell: \d+\.\d+x, \w+ of 64 B after (pydist|mpi4py)'s \w+", proc.stdout), proc.stdout
    assert re.search(r"beyond the cache \(over the same call after a copy\): \d+\.\d+x, \w+ of 64 B after "
                     r"(pydist|mpi4py)'s \w+", proc.stdout), proc.stdout
    assert re.search(r"reference, mpi4py alone: \d+\.\d+x, mpi4py's \w+ of 64 B after mpi4py's \w+", proc.stdout), \
        proc.stdout
    assert re.search(r"against mpi4py in the same place: \d+\.\d+x, \w+ of 64 B after pydist's \w+: [\d.]+ us, "
                     r"mpi4py's after its own [\d.]+ us", proc.stdout), proc.stdout


def test_mpi_libraries_prints_one_row_per_library():
    # the build's library and the two make test installs (scripts/test_libraries.sh --install)
    proc = subprocess.run([sys.executable, "benchmarks/mpi_libraries.py", "--repeats", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if re.match(r"(MPICH|Intel)", line)]
    assert [r.split("|")[0].strip()[:13] for r in rows] == ["MPICH Version", "MPICH Version", "Intel(R) MPI "], proc.stdout
    assert "4.0.2" in rows[0] and "5.0.2" in rows[1], proc.stdout
    for row in rows:
        figures = [float(x) for x in " ".join(row.split("|")[1:]).split()]
        assert len(figures) == 6 and all(f > 0 for f in figures), row


def test_collectives_sweep_rejects_bad_sizes():
    proc = subprocess.run([sys.executable, "benchmarks/collectives_sweep.py", "--sizes", "6"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "multiples of 4 bytes" in proc.stderr, proc.stderr


def test_collectives_sweep_runs_beside_its_own_load_and_stops_it():
    """--load N: the header says the run is beside N busy processes, the figures come out, and none of
    the busy processes outlives the benchmark."""
    marker = "while True: pass"
    before = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    proc = subprocess.run([sys.executable, "benchmarks/collectives_sweep.py", "--quick", "--load", "1", "--ops",
                           "all_reduce", "--programs", "c", "pydist"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "beside 1 busy process(es) of its own" in proc.stdout.splitlines()[0], proc.stdout[:500]
    assert "and its 1 busy process(es)" in proc.stdout and "all_reduce" in proc.stdout, proc.stdout[-1500:]
    after = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert set(after) <= set(before), "a busy process outlived the benchmark"
    bad = subprocess.run([sys.executable, "benchmarks/collectives_sweep.py", "--load", "-1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--load at least 0" in bad.stderr, bad.stderr


def test_train_compare_at_two_ranks():
    """pydist's trainer, torch DDP over gloo and torch DDP over pydist (torch+pd) on the same LeNet-5,
    1 epoch at 2 ranks, nothing capped (one level, native; R=1 too would triple the time: one process
    does the whole epoch, three times; the scaling lines then say they need R=1)."""
    proc = subprocess.run([sys.executable, "benchmarks/train_compare.py", "--ranks", "2", "--epochs", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"^CPU: .+, \d+ cores; flags: .*\bsse2\b", out, re.M), out[:2000]
    assert re.search(r"^  native +nothing capped; torch's ATen runs \w+$", out, re.M), out[:2000]
    # level program R samples/s /torch GFLOP/s/rank %-of-peak test-acc per-epoch...
    rows = [line.split() for line in out.splitlines() if re.match(r"native +(pydist|torch|torch\+pd) +[12] ", line)]
    assert sorted((r[1], r[2]) for r in rows) == [("pydist", "2"), ("torch", "2"), ("torch+pd", "2")], out
    for r in rows:
        samples_per_s, ratio, gflops, share, accuracy = float(r[3]), float(r[4][:-1]), float(r[5]), int(r[6][:-1]), \
            float(r[7])
        assert samples_per_s > 0 and ratio > 0 and gflops > 0 and share > 0 and 0.7 < accuracy <= 1.0, r
        assert r[1] != "torch" or r[4] == "1.00x", r
    # the arithmetic floor: LeNet-5's step FLOPs and the level's single-core sgemm peak
    floor = re.search(r"LeNet-5 forward \+ backward ([\d.]+) MFLOP per step of 64 ", out)
    assert floor and 100 < float(floor.group(1)) < 200, out[:2000]
    peak = re.search(r"^  native +([\d.]+) GFLOP/s \(OpenBLAS \w+ kernels\): at most (\d+) samples/s per rank",
                     out, re.M)
    assert peak and float(peak.group(1)) > 1 and int(peak.group(2)) > 0, out[-2000:]
    assert "native torch+pd: needs R=1 in --ranks" in out


def test_train_compare_refuses_a_level_the_cpu_lacks(tmp_path, capsys):
    """--simd names a level whose instruction sets the CPU (here a /proc/cpuinfo of an AVX2 CPU) lacks:
    refused before any job runs."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import train_compare
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AVX2 CPU\nflags\t\t: fpu sse2 avx avx2 fma f16c\n")
    assert train_compare.parse_args(["--simd", "sse2", "avx2"], cpuinfo=str(cpuinfo)).simd == ["sse2", "avx2"]
    with pytest.raises(SystemExit) as exit:
        train_compare.parse_args(["--simd", "sse2", "avx512"], cpuinfo=str(cpuinfo))
    assert exit.value.code == 2
    assert "--simd avx512: this CPU lacks avx512bw avx512dq avx512f avx512vl" in capsys.readouterr().err


def test_strategies_quick(tmp_path):
    """Every strategy trains with 2 workers for a few steps (ps and the asynchronous ones at 3 ranks);
    the table has a row each, with staleness and wait share for the asynchronous ones; the window
    sweep has downpour and adag at windows 1 and 5; both plots are drawn."""
    proc = subprocess.run([sys.executable, "benchmarks/strategies.py", "--quick", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table, sweep = proc.stdout.split("\nnormal (no straggler)")[1].split("\nwindow sweep (no straggler)")
    rows = {r[0]: r for r in (line.split() for line in table.splitlines()) if len(r) == 15 and r[1] == "2"}
    served = ("ps", "downpour", "adag", "aeasgd", "dynsgd")
    assert sorted(rows) == sorted(("allreduce", "ring", "central", "average", "easgd") + served), table
    for name, r in rows.items():
        ranks, global_batch, accuracy, samples_per_s = int(r[2]), int(r[3]), float(r[4]), float(r[6])
        assert ranks == (3 if name in served else 2) and global_batch == 128, r
        # 40 steps from the same seed: every strategy is past chance (0.1) and none is done learning
        assert 0.2 < accuracy < 0.9 and samples_per_s > 0 and 0 <= float(r[14]) < 100, r   # idle %
        if name in served[1:]:
            # 2 workers, one server: a push finds about the other worker's one push since its pull
            staleness, wait = float(r[12]), float(r[13])
            assert 0 < staleness <= 2 and 0 < wait < 100, r
        else:
            assert r[12:14] == ["-", "-"], r
    points = {(r[0], r[3]): float(r[4]) for r in (line.split() for line in sweep.splitlines())
              if len(r) == 9 and r[1] == "2" and r[2] == "3"}
    assert sorted(points) == [("adag", "1"), ("adag", "5"), ("downpour", "1"), ("downpour", "5")], sweep
    # At window 1 adag divides by 1: the same algorithm as downpour, and --quick serves in a fixed order
    assert points[("adag", "1")] == points[("downpour", "1")], sweep
    assert points[("adag", "5")] == float(rows["adag"][4]), (sweep, rows["adag"])   # the comparison's run, reused
    assert "lr 0.02" in sweep
    for png in ("strategies.png", "strategies_window.png"):
        assert figures.page_px(tmp_path / png) >= figures.MIN_PAGE_PX   # legible at the docs' column
        assert figures.recorded_problems(tmp_path / png) == []


def test_strategies_says_what_it_skips(tmp_path):
    """A combination that cannot run is named with its reason, never dropped silently (no job runs)."""
    for argv, reason in ((["--workers", "1", "--strategies", "allreduce", "--slow-rank", "1", "--slow-ms", "5"],
                          "skipped allreduce W=1: no rank 1 to slow at R=1"),
                         (["--workers", "2", "--strategies", "adag", "--slow-rank", "3", "--slow-ms", "5"],
                          "skipped adag W=2: no rank 3 to slow at R=3")):
        proc = subprocess.run([sys.executable, "benchmarks/strategies.py", "--out", str(tmp_path)] + argv, cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and reason in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_strategies_rejects_bad_workers(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/strategies.py", "--workers", "0", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--workers, --sweep-workers and --sweep-windows must be >= 1" in proc.stderr, \
        proc.stderr


def test_pipeline_quick(tmp_path):
    """GPipe and 1F1B at 2 stages with 1 and 2 micro-batches, on LeNet-5 and a small MLP: a row per
    stage with positive busy time, the theory's bubble (P - 1) / (M + P - 1) beside the measured one,
    GPipe holding all M micro-batches on every stage and 1F1B min(P - p, M) (never more memory than
    GPipe's); both plots drawn; --replot prints the same tables from the saved JSON."""
    proc = subprocess.run([sys.executable, "benchmarks/pipeline.py", "--quick", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert f"os.cpu_count() = {os.cpu_count()}" in out, out
    # model P schedule M stage layers busy idle bubble% theory% peak-slots peak-KiB samples/s
    rows = [r for r in (line.split() for line in out.splitlines())
            if len(r) == 13 and r[1] == "2" and r[2] in ("gpipe", "1f1b")]
    table = {(r[0], r[2], int(r[3]), int(r[4])): r for r in rows}
    assert sorted(table) == sorted((model, schedule, M, stage) for model in ("lenet5", "mlp-256x4")
                                   for schedule in ("gpipe", "1f1b") for M in (1, 2) for stage in (0, 1)), out
    P = 2
    for (model, schedule, M, stage), r in table.items():
        busy, idle, bubble, theory = (float(v) for v in r[6:10])
        slots, kib, samples_per_s = int(r[10]), float(r[11]), float(r[12])
        assert busy > 0 and idle >= 0 and 0 <= bubble < 100 and samples_per_s > 0 and kib > 0, r
        assert theory == round(100 * (P - 1) / (M + P - 1), 1), r
        assert slots == (M if schedule == "gpipe" else min(P - stage, M)) and slots <= P, r
        assert kib <= float(table[(model, "gpipe", M, stage)][11]), r   # 1F1B never holds more than GPipe
    assert float(table[("mlp-256x4", "1f1b", 2, 1)][11]) < float(table[("mlp-256x4", "gpipe", 2, 1)][11]), out
    for png in ("pipeline_timeline.png", "pipeline_bubble.png"):
        assert figures.page_px(tmp_path / png) >= figures.MIN_PAGE_PX
        assert figures.recorded_problems(tmp_path / png) == []
    again = subprocess.run([sys.executable, "benchmarks/pipeline.py", "--quick", "--replot", "--out", str(tmp_path)],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert [line for line in again.stdout.splitlines() if line.split() in rows] == \
        [line for line in out.splitlines() if line.split() in rows], again.stdout


def test_pipeline_rejects_bad_micro_batches(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/pipeline.py", "--micro-batches", "3", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--micro-batches must divide the batch of 64" in proc.stderr, proc.stderr


def test_startup_one_round():
    # One round of each program without torch: the table has a row per program with figures, and the
    # goal line for pydist's import + init.
    proc = subprocess.run([sys.executable, "benchmarks/startup.py", "--rounds", "1", "--no-torch"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {line.split("|")[0].strip(): line for line in proc.stdout.splitlines() if line.count("|") == 3}
    assert {"numpy", "pydist"} <= set(rows), proc.stdout
    numpy_ms, import_ms, init_ms = (float(x) for x in rows["pydist"].split("|")[1].split())
    assert numpy_ms > 0 and import_ms > 0 and init_ms > 0, rows["pydist"]
    assert "pydist import + init_process_group:" in proc.stdout and "goal <= 250 ms" in proc.stdout


def test_shm_allreduce_quick():
    """benchmarks/shm_allreduce.py: MPI, shm, shm on dist.empty arrays and memcpy, one table, at 2 ranks."""
    proc = subprocess.run([sys.executable, "benchmarks/shm_allreduce.py", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line.split("|") for line in proc.stdout.splitlines() if re.match(r"\s+\d+ (KiB|MiB) \|", line)]
    assert len(rows) == 3, proc.stdout
    for row in rows:
        assert all(float(t) > 0 for t in row[1].split()) and len(row[2].split()) == 4, row
    assert "shm-alloc: at least as fast as MPI from" in proc.stdout and "load average" in proc.stdout, proc.stdout


def test_torch_backend_overhead_prints_its_table():
    """One quick round: a row per size with the three programs' times and the backend's overhead."""
    proc = subprocess.run([sys.executable, "benchmarks/torch_backend_overhead.py", "--sizes", "4", "4096",
                           "--rounds", "1", "--target-seconds", "0.02"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = re.findall(r"^\s*(4 B|4 KiB) \|\s+([\d.]+)\s+([\d.]+)\s+([\d.]+) \|\s+([+-][\d.]+)\s+([\d.]+)$", proc.stdout,
                      re.M)
    assert [r[0] for r in rows] == ["4 B", "4 KiB"], proc.stdout
    assert all(float(x) > 0 for r in rows for x in r[1:4]), rows


def test_cluster_model_quick(tmp_path):
    """benchmarks/cluster_model.py on simulated hosts at two link rates (tiny sizes and few steps: the
    figures are the benchmark's business, the test checks it runs end to end): the fitted model, a
    table of measured against predicted Tsync, the speed-up table, cluster.png; no cluster left up."""
    from test_cluster import REASON, cluster_to_ourselves
    if REASON is not None:
        pytest.skip(f"NOT RUN (several hosts): {REASON}")
    env = dict(os.environ, PYDIST_CLUSTER_FINALIZE_GUARD="1")
    with cluster_to_ourselves():   # (lane 1's cluster tests use the same hosts)
        proc = subprocess.run([sys.executable, "benchmarks/cluster_model.py", "--rates", "100mbit", "1gbit",
                               "--sizes", "246824", "1048576", "--batches", "16", "64", "--steps", "3",
                               "--reps", "3", "--out-dir", str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    fit = re.search(r"alpha ([\d.]+) ms, eta ([\d.]+), host ([\d.]+) Gbit/s \(fitted to 4 points\)", proc.stdout)
    assert fit and float(fit.group(2)) > 0 and float(fit.group(3)) > 0, proc.stdout
    rows = re.findall(r"^ *(100mbit|1gbit) +(\d+) +([\d.]+) +([\d.]+) +[+-][\d.]+%$", proc.stdout, re.M)
    assert len(rows) == 4 and all(float(m) > 0 and float(p) > 0 for *_, m, p in rows), proc.stdout
    speedups = re.findall(r"^ *(100mbit|1gbit) +([\d.]+)/([\d.]+) +([\d.]+)/([\d.]+) ", proc.stdout, re.M)
    assert len(speedups) == 2, proc.stdout
    assert (tmp_path / "cluster.png").stat().st_size > 10000 and (tmp_path / "cluster.json").exists()
    assert figures.page_px(tmp_path / "cluster.png") >= figures.MIN_PAGE_PX
    assert figures.recorded_problems(tmp_path / "cluster.png") == []
    before = (tmp_path / "cluster.png").stat().st_mtime_ns
    proc = subprocess.run([sys.executable, "benchmarks/cluster_model.py", "--replot", "--out-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "wrote" in proc.stdout, proc.stdout + proc.stderr
    assert (tmp_path / "cluster.png").stat().st_mtime_ns > before   # drawn again from cluster.json alone
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not re.search(r"^pdh\d", listed, re.M), listed


def test_compression_run_records_accuracy_against_time(tmp_path):
    """benchmarks/compression_run.py at 3 ranks on this machine (downpour: one server, two workers, each
    pushing topk payloads): an evaluation before training and after every chunk, the clock rising, the
    bytes a step the compressed pushes' (fewer than the uncompressed model's per exchange)."""
    out = tmp_path / "run.json"
    proc = subprocess.run([MPIEXEC, "-n", "3", sys.executable, "benchmarks/compression_run.py", "--model", "lenet5",
                           "--strategy", "downpour", "--compression", "topk:0.1", "--epochs", "0.05",
                           "--eval-every", "8", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["world_size"] == 3 and r["workers"] == 2 and r["compression"] == "topk:0.1" and r["finished"]
    steps = [p["step"] for p in r["points"]]
    assert steps[0] == 0 and steps[-1] == round(0.05 * r["steps_per_epoch"]) and steps == sorted(set(steps)), steps
    seconds = [p["seconds"] for p in r["points"]]
    assert seconds[0] == 0 and all(b > a for a, b in zip(seconds, seconds[1:])), seconds
    assert all(0 <= p["test_accuracy"] <= 1 for p in r["points"])
    assert 0 < r["points"][-1]["bytes_per_step"] < r["grad_bytes"], r["points"][-1]


def test_compression_cluster_quick(tmp_path):
    """benchmarks/compression_cluster.py across 2 simulated hosts at two link rates (LeNet-5, a few steps,
    a target every run reaches at once): the fast link's runs train all their steps, the slow link's stop
    at the target and take their final accuracy from the fast link's run, whose evaluations they must
    equal bit for bit; the table, compression.png; no cluster left up."""
    from test_cluster import REASON
    if REASON is not None:
        pytest.skip(f"NOT RUN (several hosts): {REASON}")
    env = dict(os.environ, PYDIST_CLUSTER_FINALIZE_GUARD="1")
    proc = subprocess.run([sys.executable, "benchmarks/compression_cluster.py", "--hosts", "2", "--rates", "100mbit",
                           "1gbit", "--models", "lenet5", "--strategies", "allreduce", "--compressors", "none",
                           "powersgd:4", "--epochs", "0.1", "0.1", "--eval-every", "12", "--target", "0.2",
                           "--out-dir", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = re.findall(r"^ +2 +(1gbit|100mbit) +lenet5 +allreduce +(none|powersgd:4) +([\d.]+) +([\d.]+) .* "
                      r"([\d.]+)(\*?) +([\d.]+) +([\d.]+)$", proc.stdout, re.M)
    assert len(rows) == 4, proc.stdout
    for rate, comp, ms, mib, final, mark, epochs, last in rows:
        assert float(ms) > 0 and float(mib) > 0 and 0 < float(final) <= 1 and 0 < float(last) <= 1, (rate, comp)
        assert (mark == "*") == (rate == "100mbit"), (rate, comp, mark)   # the slow link's runs stopped early
    assert "every evaluation a stopped run shares with its full run is bitwise the same" in proc.stdout, proc.stdout
    assert (tmp_path / "compression.png").stat().st_size > 10000 and (tmp_path / "compression.json").exists()
    assert figures.page_px(tmp_path / "compression.png") >= figures.MIN_PAGE_PX
    assert figures.recorded_problems(tmp_path / "compression.png") == []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not re.search(r"^pdh\d", listed, re.M), listed


def test_torch_stack_prints_its_table():
    """benchmarks/torch_stack.py, one quick round at 2 ranks: FSDP2, DDP and TP rows, both backends' times."""
    proc = subprocess.run([sys.executable, "benchmarks/torch_stack.py", "--ranks", "2", "--rounds", "1", "--steps", "1",
                           "--batch", "8"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = re.findall(r"^ +2 +(fsdp2|ddp|tp) \| +([\d.]+) +([\d.]+) \| +([\d.]+)x$", proc.stdout, re.M)
    assert [r[0] for r in rows] == ["fsdp2", "ddp", "tp"], proc.stdout
    assert all(float(x) > 0 for r in rows for x in r[1:]), rows


def test_path_table_quick(tmp_path):
    """benchmarks/path_table.py under mpiexec: every collective by the built-in choice, the table's and
    mpi4py's in one job, a row per size with both ratios, and the worst line; refused without a table."""
    env = dict(os.environ, UCX_ERROR_SIGNALS="", MPIEXEC_TIMEOUT="120", PYDIST_TUNE="force:ring,pair")
    cmd = [MPIEXEC, "-n", "2", sys.executable, "benchmarks/path_table.py", "--quick"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = re.findall(r"^\s+(8 B|64 KiB|1 MiB)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$",
                      proc.stdout, re.M)
    assert len(rows) == 15, proc.stdout
    for _, built, table, mpi4py, vs_built, vs_mpi4py in rows:
        assert abs(float(vs_built) - float(table) / float(built)) < 0.01 + 0.01 * float(vs_built), rows
        assert abs(float(vs_mpi4py) - float(table) / float(mpi4py)) < 0.01 + 0.01 * float(vs_mpi4py), rows
    assert re.search(r"^worst table/built-in: [\d.]+ at \w+ \d+ (B|KiB|MiB); worst table/mpi4py: ", proc.stdout, re.M)
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(env, PYDIST_TUNE="off"), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2 and "run `python -m pydist.tune` first" in proc.stderr, proc.stderr
