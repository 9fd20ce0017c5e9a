"""Strategy options at world size 1: each strategy takes its own options and refuses the others', a
group too small for a strategy is a clear error, the straggler sleep is real, and the command line
says the same."""
import os
import subprocess
import sys

import numpy as np
import pytest

from pydist import train
from pydist.engine import ASYNC, STRATEGIES, Trainer, mlp


def tiny(**kw):
    return Trainer(mlp((4,), input_shape=(1, 4, 4)), batch_size=2, **kw)


def data(n=16):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 16)).astype(np.float32), rng.integers(0, 10, n).astype(np.int32)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_every_strategy_trains_alone_where_it_can(strategy):
    x, y = data()
    if strategy == "ps" or strategy in ASYNC:   # a server and a worker need two ranks
        with pytest.raises(ValueError, match="needs more ranks than servers"):
            tiny(strategy=strategy)
        return
    t = tiny(strategy=strategy, **(dict(micro_batches=2) if strategy == "pipeline" else {}))
    before = t.params.copy()
    out = t.train_steps(x, y, 0, 0, 4)
    assert out[2] == 4 and out[5] == 0 and out[6] == 0      # 4 steps, nothing sent alone
    assert not np.array_equal(before, t.params)
    if strategy == "easgd":   # alone, the center still follows the one worker: alpha = beta of the way
        assert not np.array_equal(t.weights(), before) and not np.array_equal(t.weights(), t.params)
    else:
        assert np.array_equal(t.weights(), t.params)


@pytest.mark.parametrize("strategy,option,value", [
    ("allreduce", "period", 2), ("ring", "servers", 1), ("central", "beta", 0.5), ("ps", "period", 3),
    ("average", "beta", 0.5), ("average", "servers", 1), ("easgd", "warmup", 1),
    ("easgd", "momentum_placement", "reset"), ("allreduce", "momentum_placement", "local"),
    ("allreduce", "window", 2), ("ps", "deterministic", True), ("easgd", "window", 3), ("downpour", "beta", 0.5),
    ("adag", "period", 2), ("dynsgd", "momentum_placement", "local"), ("average", "deterministic", False)])
def test_an_option_the_strategy_does_not_take_is_an_error(strategy, option, value):
    with pytest.raises(ValueError, match=f"does not take `{option}`"):
        tiny(strategy=strategy, **{option: value})


@pytest.mark.parametrize("kw,match", [
    (dict(strategy="sgd"), "`strategy` must be one of"), (dict(strategy=None), "`strategy` must be one of"),
    (dict(strategy="average", period=0), "`period` must be an int >= 1"),
    (dict(strategy="average", period=2.0), "`period` must be an int"),
    (dict(strategy="average", warmup=-1), "`warmup` must be an int >= 0"),
    (dict(strategy="ps", servers=0), "`servers` must be an int >= 1"),
    (dict(strategy="average", momentum_placement="global"), "`momentum_placement` must be one of"),
    (dict(strategy="easgd", beta=1.5), r"`beta` must be a number in \[0, 1\]"),
    (dict(strategy="easgd", beta=float("nan")), r"`beta` must be a number in \[0, 1\]"),
    (dict(strategy="downpour", window=0), "`window` must be an int >= 1"),
    (dict(strategy="adag", window=2.5), "`window` must be an int"),
    (dict(strategy="dynsgd", servers=0), "`servers` must be an int >= 1"),
    (dict(strategy="aeasgd", beta=-0.1), r"`beta` must be a number in \[0, 1\]"),
    (dict(strategy="aeasgd", deterministic="yes"), "`deterministic` must be a bool"),
    (dict(slow_rank=0), "go together"), (dict(slow_rank=1, slow_ms=5), "`slow_rank` must be an int in"),
    (dict(slow_rank=0, slow_ms=-5), "`slow_ms` must be an int in")])
def test_bad_strategy_options_are_value_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        tiny(**kw)


def test_ps_servers_beyond_the_parameters_is_an_error_in_c():
    # the group check comes first at world size 1; the engine's own message for the shard count
    t = tiny()
    with pytest.raises(ValueError, match="needs more ranks"):
        t.engine.set_strategy(-1, "ps", 10**6, 0, 0, 0, 0.0, 0, 0, 0, *NO_PIPELINE, *t.sgd)
    with pytest.raises(ValueError, match="needs more ranks"):
        t.engine.set_strategy(-1, "downpour", 1, 0, 0, 0, 0.0, 0, 5, 0, *NO_PIPELINE, *t.sgd)
    with pytest.raises(ValueError, match="deterministic 0 or 1"):
        t.engine.set_strategy(-1, "downpour", 1, 0, 0, 0, 0.0, 0, 5, 2, *NO_PIPELINE, *t.sgd)
    with pytest.raises(ValueError, match="unknown strategy"):
        t.engine.set_strategy(-1, "nope", 0, 0, 0, 0, 0.0, 0, 0, 0, *NO_PIPELINE, *t.sgd)


NO_PIPELINE = (0, 0, 0, None)   # stages, micro_batches, schedule, split


def pipeline_in_c(t, stages=1, micro=2, schedule=0, split=(0, 4)):
    t.engine.set_strategy(-1, "pipeline", 0, 0, 0, 0, 0.0, 0, 0, 0, stages, micro, schedule, split, *t.sgd)


@pytest.mark.parametrize("kw,match", [
    (dict(micro_batches=0), "`micro_batches` must be an int >= 1"),
    (dict(micro_batches=3), "batch of 2 does not divide into 3 micro-batches"),
    (dict(micro_batches=2, schedule="zero-bubble"), "`schedule` must be one of gpipe, 1f1b"),
    (dict(micro_batches=2, stages=2), "2 pipeline stages must divide the 1 ranks"),
    (dict(micro_batches=2, split=[2]), r"`split` must name 0 increasing layer indices"),
    (dict(micro_batches=2, split="2"), "`split` must be a list of layer indices"),
    (dict(micro_batches=2, stages=0), "`stages` must be an int >= 1")])
def test_bad_pipeline_options_are_value_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        tiny(strategy="pipeline", **kw)


@pytest.mark.parametrize("args,match", [
    (dict(stages=5), r"need 0 <= stages <= 4"), (dict(schedule=2), "schedule 0 .gpipe. or 1"),
    (dict(split=(0, 2, 4)), "must hold stages . 1 = 2 boundaries"), (dict(split=(0, 3)), "split must run from layer 0"),
    (dict(stages=1, split=(1, 4)), "split must run from layer 0"), (dict(micro=0), "micro_batches must be >= 1"),
    (dict(split=(0, "a")), "must be an integer|must be an int")])
def test_pipeline_arguments_are_checked_in_c(args, match):
    t = tiny()
    with pytest.raises((ValueError, TypeError), match=match):
        pipeline_in_c(t, **args)


def test_pipeline_batch_must_divide_into_micro_batches_in_c():
    t = tiny()
    pipeline_in_c(t, micro=2)
    x, y = data()
    perm = np.arange(16, dtype=np.int32)
    with pytest.raises(ValueError, match="batch of 1 does not divide into 2 micro-batches"):
        t.engine.train_steps(x, y, perm, 0, 1, 1, -1, *t.sgd)
    out = t.engine.train_steps(x, y, perm, 0, 2, 2, -1, *t.sgd)   # its own strategy: alone, 1 stage
    assert out[2] == 2 and t.engine.pipeline_stats()["steps"] == 2


def brute_force_split(costs, stages):
    import itertools
    best = None
    for cuts in itertools.combinations(range(1, len(costs)), stages - 1):
        b = [0, *cuts, len(costs)]
        worst = max(sum(costs[i:j]) for i, j in zip(b, b[1:]))
        best = worst if best is None else min(best, worst)
    return best


def test_balanced_split_minimises_the_slowest_stage():
    from pydist.engine import balanced_split
    rng = np.random.default_rng(1)
    for _ in range(50):
        n = int(rng.integers(1, 9))
        costs = rng.integers(0, 20, n).tolist()
        stages = int(rng.integers(1, n + 1))
        b = balanced_split(costs, stages)
        assert b[0] == 0 and b[-1] == n and len(b) == stages + 1 and all(x < y for x, y in zip(b, b[1:]))
        assert max(sum(costs[i:j]) for i, j in zip(b, b[1:])) == brute_force_split(costs, stages), (costs, stages, b)
    assert balanced_split([1, 1, 1, 1], 2) == [0, 2, 4] and balanced_split([5, 1, 1, 1, 1, 1], 2) == [0, 1, 6]
    with pytest.raises(ValueError, match="3 stages for a model of 2 layers"):
        balanced_split([1, 1], 3)


def test_layer_costs_count_forward_and_backward_flops():
    from pydist.engine import Conv2d, Flatten, Linear, MaxPool2d, Model, ReLU, layer_costs
    m = Model([Conv2d(1, 2, 3), ReLU(), MaxPool2d(2), Flatten(), Linear(2 * 13 * 13, 10)], input_shape=(1, 28, 28))
    conv = 2 * (2 * 1 * 3 * 3) * 26 * 26          # a multiply-add per weight per output position
    # the first layer computes no input gradient: its backward is one forward's worth, not two
    assert layer_costs(m) == [2 * conv, 2 * 2 * 26 * 26, 2 * 2 * 26 * 26, 2 * 2 * 13 * 13, 3 * 2 * 338 * 10]


def test_layer_costs_before_the_first_parameters_have_no_backward():
    from pydist.engine import layer_costs, mlp
    # mlp: Flatten, Linear 784->16, ReLU, Linear 16->10; the Flatten's and the first Linear's input
    # gradients are never computed
    assert layer_costs(mlp((16,))) == [784, 2 * 2 * 784 * 16, 2 * 16, 3 * 2 * 16 * 10]


def test_step_flops_counts_forward_and_backward():
    from pydist.engine import Conv2d, Flatten, Linear, Model, ReLU, lenet5, step_flops
    m = Model([Conv2d(1, 2, 3), ReLU(), Flatten(), Linear(2 * 26 * 26, 10)], input_shape=(1, 28, 28))
    conv, relu, flat, fc = 2 * (2 * 9) * 26 * 26, 2 * 26 * 26, 2 * 26 * 26, 2 * 1352 * 10
    # the first layer's backward has no input gradient to compute: its forward's worth, not twice it
    assert step_flops(m, 4) == 4 * (2 * conv + 2 * relu + 2 * flat + 3 * fc)
    # LeNet-5's step of 64: about 147 MFLOP, most of it the two convolutions
    convs = 2 * (6 * 25) * 28 * 28 * 2 + 3 * 2 * (16 * 6 * 25) * 10 * 10
    assert convs / step_flops(lenet5(), 1) > 0.8 and 140e6 < step_flops(lenet5(), 64) < 150e6


def test_blas_coretype_follows_the_cpus_instruction_sets(tmp_path):
    from pydist import _libraries
    avx512 = "fpu sse2 avx avx2 fma avx512f avx512cd avx512bw avx512dq avx512vl"
    for flags, core in ((avx512, "SKYLAKEX"), ("sse2 avx avx2 fma", "HASWELL"), ("sse2 avx", None),
                        ("sse2 avx2 avx512f", None)):
        (tmp_path / "cpuinfo").write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        assert _libraries.blas_coretype(str(tmp_path / "cpuinfo"), simd="") == core, flags
    assert _libraries.blas_coretype(str(tmp_path / "missing"), simd="") is None
    # PYDIST_SIMD caps the BLAS's kernels with pydist's own
    (tmp_path / "cpuinfo").write_text(f"processor\t: 0\nflags\t\t: {avx512}\n")
    for simd, core in (("avx512", "SKYLAKEX"), ("avx2", "HASWELL"), ("sse2", "PRESCOTT")):
        assert _libraries.blas_coretype(str(tmp_path / "cpuinfo"), simd=simd) == core, simd
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nflags\t\t: sse2 avx avx2 fma\n")
    assert _libraries.blas_coretype(str(tmp_path / "cpuinfo"), simd="avx2") == "HASWELL"


def test_the_engines_blas_runs_this_cpus_kernels():
    # Debian 12's OpenBLAS does not know newer Xeons and would take its generic Prescott kernels, five
    # times slower; pydist names the family while it loads it (unless the user did), and leaves no
    # setting behind for NumPy or child processes.
    from pydist import _libraries
    from unit_helpers import subprocess_env
    env = {k: v for k, v in subprocess_env().items() if k != "OPENBLAS_CORETYPE"}
    code = "import os, pydist; print(os.environ.get('OPENBLAS_CORETYPE'), pydist._C.blas_core())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    left, core = out.stdout.split()
    assert left == "None"
    expected = _libraries.blas_coretype()
    if expected == "SKYLAKEX":
        assert core.upper() in ("SKYLAKEX", "COOPERLAKE", "SAPPHIRERAPIDS"), core
    elif expected == "HASWELL":
        assert core.upper() in ("HASWELL", "ZEN"), core
    elif expected == "PRESCOTT":   # PYDIST_SIMD=sse2
        assert core.upper() == "PRESCOTT", core


def test_sgemm_seconds_times_the_engines_blas():
    from pydist import _C
    assert 0 < _C.sgemm_seconds(64, 3) < 1.0
    with pytest.raises(ValueError, match="need 1 <= n <= 8192"):
        _C.sgemm_seconds(0, 1)


def test_slow_rank_sleeps_each_step_in_compute_time():
    x, y = data()
    out = tiny(slow_rank=0, slow_ms=30).train_steps(x, y, 0, 0, 3)
    assert out[3] >= 3 * 0.030      # a lower bound: the sleep is part of the step's compute time


@pytest.mark.parametrize("argv,error", [
    (["--strategy", "allreduce", "--period", "3"], "--period does not apply to --strategy allreduce"),
    (["--strategy", "ps", "--beta", "0.5"], "--beta does not apply to --strategy ps"),
    (["--slow-rank", "1"], "--slow-rank and --slow-ms go together"),
    (["--strategy", "ps", "--window", "3"], "--window does not apply to --strategy ps"),
    (["--deterministic"], "--deterministic does not apply to --strategy allreduce"),
    (["--strategy", "downpour", "--period", "3"], "--period does not apply to --strategy downpour"),
    (["--strategy", "gossip"], "invalid choice"),
    (["--stages", "2"], "--stages does not apply to --strategy allreduce"),
    (["--strategy", "ps", "--micro-batches", "4"], "--micro-batches does not apply to --strategy ps"),
    (["--strategy", "pipeline", "--schedule", "interleaved"], "invalid choice")])
def test_command_line_refuses_options_of_other_strategies(argv, error, capsys):
    with pytest.raises(SystemExit):
        train.parse_args(argv)
    assert error in capsys.readouterr().err


def test_command_line_passes_strategy_options():
    a = train.parse_args(["--strategy", "average", "--period", "8", "--warmup", "2", "--momentum-placement", "reset"])
    assert (a.strategy, a.period, a.warmup, a.momentum_placement) == ("average", 8, 2, "reset")


def test_command_line_passes_pipeline_options():
    a = train.parse_args(["--strategy", "pipeline", "--stages", "2", "--micro-batches", "8", "--schedule", "gpipe",
                          "--split", "5"])
    assert (a.strategy, a.stages, a.micro_batches, a.schedule, a.split) == ("pipeline", 2, 8, "gpipe", [5])


def test_command_line_passes_async_options():
    a = train.parse_args(["--strategy", "aeasgd", "--window", "10", "--beta", "0.5", "--deterministic", "--servers", "2"])
    assert (a.strategy, a.window, a.beta, a.deterministic, a.servers) == ("aeasgd", 10, 0.5, True, 2)
