"""An optional set-up step that fails on one rank changes nothing that another rank decides: every
collective of init runs on every rank, the failed rank takes the fallback path, and the job works
within init's timeout (real mpiexec: test_faults.py's run_job)."""
import pytest

from test_faults import reports, run_job


@pytest.mark.parametrize("failing", [0, 2])
def test_a_rank_without_its_heap_starts_and_computes_with_the_others(tmp_path, failing):
    """One rank cannot make its heap in the node's segment (PYDIST_TEST_SEGMENT_FALLBACK=heap, as if out
    of memory): init used to share the path table only on ranks with a segment, so the others waited in
    that broadcast until init's timeout. Now every rank takes part; each collective, small and past the
    slots, on ordinary and dist.empty arrays, gives NumPy's result on every rank."""
    proc, _ = run_job(tmp_path, 3, f"""
        if int(os.environ.get("PMI_RANK", "-1")) == {failing}:
            os.environ["PYDIST_TEST_SEGMENT_FALLBACK"] = "heap"   # read by init, on this rank only
        dist.init_process_group(timeout=20.0)
        r, n = dist.get_rank(), dist.get_world_size()
        rng = np.random.default_rng(7)
        inputs = [rng.integers(-100, 100, size=(n, count)).astype(np.float64) for count in (5, 40_000)]
        for data in inputs:
            x = data[r].copy()
            dist.all_reduce(x)
            report(f"SUM {{x.size}} {{np.array_equal(x, data.sum(axis=0))}}")
        y = dist.empty(40_000, dtype="float64")   # in the segment where this rank has a heap
        y[:] = inputs[1][r]
        dist.all_reduce(y)
        report(f"EMPTY {{np.array_equal(y, inputs[1].sum(axis=0))}}")
        dist.destroy_process_group()
    """, timeout=60)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in range(3):
        assert reports(tmp_path, rank) == ["SUM 5 True", "SUM 40000 True", "EMPTY True"], (rank, proc.stderr)
