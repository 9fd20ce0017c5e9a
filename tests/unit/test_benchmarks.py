"""The benchmarks still run and print their figures (no timing is asserted: the machine is shared)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_allreduce_sweep_quick():
    proc = subprocess.run([sys.executable, "benchmarks/allreduce_sweep.py", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for size in ("4 B", "4 KiB", "1 MiB"):
        assert any(line.strip().startswith(size) for line in out.splitlines()), out
    assert "pydist costs" in out and "min bandwidth ratio" in out, out
