"""Gradient compression with error feedback (csrc/compress/, _C.Compressor, Trainer(compression=...)),
at every world size of tests/run_mpi.py, each checked against a reference computed independently:

- fp16/bf16 on values exactly representable in 16 bits (and whose sums are exact) equal the plain
  all-reduce bitwise, with a zero residual;
- topk against a NumPy selection (largest magnitudes, ties to the lower index), sign against NumPy's
  signs and chunk means;
- powersgd is exact (within float tolerance) when K covers the rank of the summed matrix, and
  topk:1.0 / powersgd:K >= min(rows, cols) train as no compression on every data-parallel strategy;
- lossy compressors still train every strategy (at least a third of the uncompressed run's gain);
- error feedback conserves: over any number of steps, what was applied plus the final residuals equals
  the sum of the raw inputs (float64), for every compressor, one rank's payloads and the group's sum;
- every rank gets bitwise the same sum; the bytes each strategy reports per step are the payloads'
  exact sizes; a resumed run (allreduce, central, ps) continues bit for bit from its checkpoint;
- a strategy that takes no compression, and a malformed compressor, are clear errors;
- ranks with different compressors (kind, ratio, rank, buffer) are a DistError on every rank before any
  payload moves, and Trainers set up differently a ValueError on every rank; either leaves the buffers
  and the group as they were.
"""
import math

import numpy as np
import pytest

import pydist as dist
from pydist import _C
from pydist.engine import Trainer, mlp, load_fashion_mnist
from helpers import parallel_assert

LOSSY = ["fp16", "bf16", "topk:0.1", "sign", "powersgd:2"]
STEPS, BATCH, HIDDEN = 12, 8, (15,)
SGD = dict(lr=0.05, momentum=0.9, weight_decay=1e-4)
N = 784 * 15 + 15 + 15 * 10 + 10                  # mlp((15,))'s parameters
MATRICES = [(0, 15, 784), (784 * 15 + 15, 10, 15)]  # its weights, as the strategies hand them to powersgd


@pytest.fixture(scope="module")
def data():
    _, (x, y) = load_fashion_mnist()
    return x, y


def trainer(strategy="allreduce", compression=None, **options):
    return Trainer(mlp(HIDDEN), batch_size=BATCH, seed=5, strategy=strategy, compression=compression, **SGD,
                   **options)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def all_same(a):
    mine = np.ascontiguousarray(a)
    every = [np.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return all(np.array_equal(o, mine) for o in every)


def group_sum64(a):
    """The float64 sum over the ranks of a float32 array, exactly (each rank's values widened first)."""
    out = np.asarray(a, np.float64).copy()
    dist.all_reduce(out)
    return out


def inputs(step, rank, n=N, scale=1.0):
    return (np.random.default_rng(1000 * step + rank).standard_normal(n) * scale).astype(np.float32)


@pytest.mark.parametrize("spec", ["fp16", "bf16"])
def test_16_bit_values_equal_the_plain_all_reduce_bitwise(spec):
    R, r = dist.get_world_size(), dist.get_rank()
    rng = np.random.default_rng(7 + r)
    # small integers times powers of two: exact in either 16-bit format, and so are their sums
    x = (rng.integers(-64, 64, N) * 2.0 ** rng.integers(-6, 3, N)).astype(np.float32)
    plain = x.copy()
    dist.all_reduce(plain)
    z = _C.Compressor(spec, N)
    ours = x.copy()
    z.allreduce_sum(ours, 0, False)
    parallel_assert(np.array_equal(ours, plain), f"{spec}: the sum differs from the plain all-reduce")
    parallel_assert(not z.residual.any(), f"{spec}: exact values left a residual")


def test_fp16_saturates_instead_of_overflowing():
    z = _C.Compressor("fp16", 3)
    x = np.array([1e6, -1e6, 1.0], np.float32)
    out = np.zeros(3, np.float32)
    z.decode_add(z.encode(x), out)
    assert out.tolist() == [65504.0, -65504.0, 1.0]
    assert z.residual.tolist() == [1e6 - 65504.0, -1e6 + 65504.0, 0.0]


@pytest.mark.parametrize("ratio", [0.01, 0.1, 0.37, 1.0])
def test_topk_takes_the_largest_magnitudes(ratio):
    rng = np.random.default_rng(11)
    x = rng.integers(-20, 20, 5000).astype(np.float32)   # many ties at the threshold
    z = _C.Compressor(f"topk:{ratio}", x.size)
    out = np.zeros_like(x)
    z.decode_add(z.encode(x), out)
    k = min(x.size, max(1, math.ceil(ratio * x.size - 1e-9)))
    order = np.lexsort((np.arange(x.size), -np.abs(x)))   # magnitude down, then index up
    want = np.zeros_like(x)
    want[order[:k]] = x[order[:k]]
    assert np.array_equal(out, want)
    assert np.array_equal(z.residual, x - want)
    assert z.payload_bytes == 8 * k


def test_sign_is_the_chunks_mean_magnitude_with_each_sign():
    rng = np.random.default_rng(12)
    x = rng.standard_normal(1000).astype(np.float32)
    x[3] = -0.0
    z = _C.Compressor("sign", x.size)
    out = np.zeros_like(x)
    z.decode_add(z.encode(x), out)
    want = np.empty_like(x)
    xe = x + np.float32(0.0)   # what is encoded: the input plus the (zero) residual, so -0.0 is +0.0
    for lo in range(0, x.size, 256):
        chunk = xe[lo:lo + 256]
        scale = np.float32(np.mean(np.abs(chunk.astype(np.float64))))
        want[lo:lo + 256] = np.where(np.signbit(chunk), -scale, scale)
    assert np.array_equal(out, want)
    assert z.payload_bytes == 4 * 4 + 125


def test_powersgd_is_exact_when_k_covers_the_sums_rank():
    R, r = dist.get_world_size(), dist.get_rank()
    rows, cols = 20, 30
    rng = np.random.default_rng(20 + r)
    m = np.outer(rng.standard_normal(rows), rng.standard_normal(cols)).astype(np.float32)  # rank 1 a rank
    x = np.concatenate([m.ravel(), rng.standard_normal(7).astype(np.float32)])          # and a bias
    z = _C.Compressor(f"powersgd:{R}", x.size, [(0, rows, cols)])
    parallel_assert(z.matrices == [(0, rows, cols)], "the matrix should be factored, not sent whole")
    ours = x.copy()
    z.allreduce_sum(ours, 0, False)
    want = group_sum64(x)
    parallel_assert(rel(ours, want) < 1e-5, f"powersgd:{R} of a rank-{R} sum: {rel(ours, want):.3g}")
    # each rank keeps its M minus 1/R of the sum: together they hold (nearly) nothing
    parallel_assert(np.abs(group_sum64(z.residual)).max() < 1e-4 * np.abs(want).max(),
                    "the residuals should add up to (nearly) zero")
    parallel_assert(all_same(ours), "ranks hold different sums")


@pytest.mark.parametrize("spec", LOSSY)
def test_error_feedback_conserves_one_ranks_payloads(spec):
    z = _C.Compressor(spec, N, MATRICES)
    applied = np.zeros(N)
    raw = np.zeros(N)
    for step in range(7):
        g = inputs(step, dist.get_rank(), scale=10.0 ** (step % 3 - 1))
        raw += g
        out = np.zeros(N, np.float32)
        z.decode_add(z.encode(g), out)
        applied += out
    err = rel(applied + z.residual, raw)
    parallel_assert(err < 1e-5, f"{spec}: applied + residual differs from the inputs' sum by {err:.3g}")
    parallel_assert(np.abs(z.residual).max() > 0, f"{spec}: no residual at all: the check would be empty")


@pytest.mark.parametrize("ring", [False, True])
@pytest.mark.parametrize("spec", LOSSY)
def test_error_feedback_conserves_the_groups_sum(spec, ring):
    z = _C.Compressor(spec, N, MATRICES)
    applied = np.zeros(N)
    raw = np.zeros(N)
    same = True
    for step in range(7):
        g = inputs(step, dist.get_rank(), scale=10.0 ** (step % 3 - 1))
        raw += group_sum64(g)
        z.allreduce_sum(g, 0, ring)
        same &= all_same(g)
        applied += g
    err = rel(applied + group_sum64(z.residual), raw)
    parallel_assert(err < 1e-5, f"{spec}: applied + residuals differ from the inputs' sum by {err:.3g}")
    parallel_assert(same, f"{spec}: ranks got different sums")


# Every data-parallel strategy, with the options that make its run repeatable (the asynchronous ones
# serve their workers in a fixed order).
STRATEGIES = {"allreduce": {}, "ring": {}, "central": {}, "ps": {"servers": 1}, "average": {"period": 3},
              "easgd": {"period": 2, "beta": 0.5}, "downpour": {"servers": 1, "window": 2, "deterministic": True},
              "adag": {"servers": 1, "window": 2, "deterministic": True},
              "dynsgd": {"servers": 1, "window": 2, "deterministic": True},
              "aeasgd": {"servers": 1, "window": 2, "beta": 0.5, "deterministic": True}}


def too_few_ranks(strategy):
    return "servers" in STRATEGIES[strategy] and dist.get_world_size() == 1   # a worker and a server


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("spec", ["topk:1.0", "powersgd:15"])
def test_lossless_settings_train_as_no_compression(strategy, spec, data):
    x, y = data
    if too_few_ranks(strategy):
        return   # (test_strategies and test_async check the error)
    ref = trainer(strategy, **STRATEGIES[strategy])
    ref.train_steps(x, y, 0, 0, STEPS)
    ours = trainer(strategy, spec, **STRATEGIES[strategy])
    ours.train_steps(x, y, 0, 0, STEPS)
    parallel_assert(rel(ours.weights(), ref.weights()) < 1e-5,
                    f"{strategy} {spec}: {rel(ours.weights(), ref.weights()):.3g} from no compression")


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("spec", LOSSY)
def test_lossy_training_learns(strategy, spec, data):
    """The loss falls by at least a third of what the same run without compression gains in 60 steps
    (downpour with 3 workers gains least: 2.32 -> 1.59 uncompressed, 2.03 with topk:0.1), and every rank
    evaluates the same weights."""
    x, y = data
    if too_few_ranks(strategy):
        return
    last = {}
    for compression in (None, spec):
        t = Trainer(mlp(HIDDEN), batch_size=16, seed=5, strategy=strategy, compression=compression, lr=0.01,
                    momentum=0.9, **STRATEGIES[strategy])
        first = alone_loss(t, x, y)   # from the initial weights
        t.train_steps(x, y, 0, 0, 60)
        weights = t.weights()
        last[compression] = evaluate_loss(t, weights, x, y)
    parallel_assert(all_same(weights), f"{strategy} {spec}: ranks evaluate different weights")
    gained, plain = first - last[spec], first - last[None]
    parallel_assert(plain > 0.3 and gained > plain / 3, f"{strategy} {spec}: the loss fell {first:.3f} -> "
                    f"{last[spec]:.3f}, without compression -> {last[None]:.3f}")


def alone_loss(t, x, y):
    return evaluate_loss(t, t.params.copy(), x, y)


def evaluate_loss(t, weights, x, y):
    """The mean loss of the first 512 examples with these weights."""
    images, labels = t._check_data(x[:512], y[:512])
    loss_sum, _ = t.engine.evaluate(images, labels, 0, 512, 16, weights)
    return loss_sum / 512


def payload(spec, lo=0, n=N):
    """One rank's payload bytes for the entries [lo, lo + n) of mlp((15,))'s buffer."""
    mats = [(o - lo, r, c) for o, r, c in MATRICES if o >= lo and o + r * c <= lo + n]
    return _C.Compressor(spec, n, mats).payload_bytes


@pytest.mark.parametrize("spec", LOSSY + ["topk:1.0"])
def test_bytes_per_step_are_the_payloads(spec, data):
    x, y = data
    R, r = dist.get_world_size(), dist.get_rank()
    steps = 3
    # allreduce: every rank's payload to every other (an all-gather), or powersgd's two all-reduces
    got = trainer("allreduce", spec).train_steps(x, y, 0, 0, steps)[5:7]
    if spec.startswith("powersgd"):
        k = int(spec.split(":")[1])
        kept = _C.Compressor(spec, N, MATRICES).matrices
        p = sum(rows * k for _, rows, _ in kept) + N - sum(rows * cols for _, rows, cols in kept)
        q = sum(cols * k for _, _, cols in kept)
        per_step = sum(2 * (R - 1) * f * 4 // R for f in (p, q)), 4 * (R - 1)
    else:
        per_step = (R - 1) * payload(spec), R - 1
    want = (per_step[0] * steps, per_step[1] * steps)
    parallel_assert(tuple(got) == want, f"allreduce {spec}: rank {r} counted {tuple(got)}, expected {want}")
    # central: each other rank sends rank 0 its payload; rank 0 sends the weights back whole
    got = trainer("central", spec).train_steps(x, y, 0, 0, steps)[5:7]
    want = ((R - 1) * 4 * N * steps, (R - 1) * steps) if r == 0 else (payload(spec) * steps, steps)
    parallel_assert(tuple(got) == want or R == 1, f"central {spec}: rank {r} counted {tuple(got)}, expected {want}")


def test_ps_shards_are_compressed_each(data):
    x, y = data
    R, r = dist.get_world_size(), dist.get_rank()
    if R < 3:
        return   # two servers need a third rank
    t = trainer("ps", "fp16", servers=2)
    got = t.train_steps(x, y, 0, 0, 2)[5:7]
    W = R - 2
    shards = [(j * (N // 2) + min(j, N % 2), (j + 1) * (N // 2) + min(j + 1, N % 2)) for j in range(2)]
    if r < W:
        want = (2 * sum(2 * (hi - lo) for lo, hi in shards), 2 * 2)
    else:
        lo, hi = shards[r - W]
        want = (2 * W * 4 * (hi - lo), 2 * W)
    parallel_assert(tuple(got) == want, f"ps fp16: rank {r} counted {tuple(got)}, expected {want}")
    parallel_assert(all_same(t.weights()), "ranks disagree on the weights")


def test_the_pipeline_takes_no_compression():
    with pytest.raises(ValueError, match="takes no compression"):
        trainer("pipeline", "fp16")


def test_malformed_compression_is_a_clear_error():
    for bad in ("gzip", "topk", "topk:0", "topk:1.5", "topk:x", "powersgd:0", "powersgd:2.5", "fp16:3"):
        with pytest.raises(ValueError, match="compression"):
            trainer("allreduce", bad)
    with pytest.raises(TypeError, match="compression"):
        trainer("allreduce", 16)
    with pytest.raises(ValueError, match="float32 with"):
        _C.Compressor("fp16", 4).encode(np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="bytes encode"):
        _C.Compressor("fp16", 4).decode_add(b"abc", np.zeros(4, np.float32))


# (rank 0's and the others' compressor, the others' buffer length, what every rank is told differs)
MISMATCHED = [
    ("fp16", "bf16", 8, "compressors of different kinds (fp16 to bf16)"),   # the same bytes: it summed silently
    ("fp16", "topk:0.25", 8, "compressors of different kinds (fp16 to topk)"),   # it crashed the topk ranks
    ("sign", "fp16", 300, "compressors of different kinds (fp16 to sign)"),
    ("topk:0.1", "topk:0.2", 40, "topk ratios from 0.1 to 0.2"),
    ("powersgd:1", "powersgd:2", 64, "powersgd ranks from 1 to 2"),
    ("fp16", "fp16", 9, "buffers of 8 to 9 entries"),
    ("none", "fp16", 8, "compressors of different kinds (none to fp16)"),
]


@pytest.mark.world_size(min=2)
@pytest.mark.parametrize("first, others, n_others, said", MISMATCHED)
def test_ranks_with_different_compressors_all_refuse_before_any_payload_moves(first, others, n_others, said):
    """Every rank checks that the group's compressors agree (spec and buffer) before exchanging: each
    rank used to read the others' payloads by its own spec, so fp16 against bf16 returned two different
    sums, and fp16 against topk raised on one side while the other went on."""
    r = dist.get_rank()
    n = 8 if r == 0 else n_others
    matrices = [(0, 8, 8)] if n == 64 else []
    z = _C.Compressor(first if r == 0 else others, n, matrices) if matrices else \
        _C.Compressor(first if r == 0 else others, n)
    x = np.arange(n, dtype=np.float32)
    before, error = x.copy(), None
    try:
        z.allreduce_sum(x, 0, False)
    except dist.DistError as e:
        error = str(e)
    ok = error is not None and f"the group's ranks have {said}" in error and np.array_equal(x, before)
    parallel_assert(ok, f"rank {r} raised {error!r} and left {x} (from {before})")
    ones = np.ones(3, np.float32)
    dist.all_reduce(ones)   # the group is as usable as before
    parallel_assert(ones.tolist() == [dist.get_world_size()] * 3, f"the all-reduce after gave {ones}")
    same = _C.Compressor("fp16", 8)   # and a compressor every rank has alike sums
    y = np.ones(8, np.float32)
    same.allreduce_sum(y, 0, False)
    parallel_assert(np.array_equal(y, np.full(8, dist.get_world_size(), np.float32)), f"the agreed sum gave {y}")


@pytest.mark.world_size(min=2)
@pytest.mark.parametrize("mine, theirs, said", [
    (dict(compression="fp16"), dict(compression="bf16"), "their compression differs (fp16 and bf16)"),
    (dict(compression="topk:0.1"), dict(compression="topk:0.2"), "their topk ratio differs (0.1 and 0.2)"),
    (dict(compression=None), dict(compression="sign"), "their compression differs (none and sign)"),
    (dict(lr=0.05), dict(lr=0.1), "their lr differs (0.05 and 0.1)"),
    (dict(strategy="allreduce"), dict(strategy="ring"), "their strategy differs (allreduce and ring)"),
])
def test_ranks_that_construct_different_trainers_all_refuse(mine, theirs, said):
    """Set-up agrees the whole configuration once (strategy, options, compression, SGD, model) on every
    rank, so the training steps need no check of their own."""
    args = dict(dict(strategy="allreduce", compression=None, lr=0.05), **(mine if dist.get_rank() == 0 else theirs))
    try:
        Trainer(mlp(HIDDEN), batch_size=BATCH, seed=5, **args)
        error = None
    except ValueError as e:
        error = str(e)
    parallel_assert(error is not None and said in error and "Every rank must construct its Trainer alike" in error,
                    f"rank {dist.get_rank()} raised {error!r}")
    ones = np.ones(3, np.float32)
    dist.all_reduce(ones)
    parallel_assert(ones.tolist() == [dist.get_world_size()] * 3, f"the all-reduce after gave {ones}")


def shared_path(tmp_path_factory, name):
    """One file name for every rank: rank 0's temporary folder."""
    folder = np.frombuffer(str(tmp_path_factory.mktemp("ckpt")).encode().ljust(256, b"\0"), np.uint8).copy()
    dist.broadcast(folder, 0)
    return folder.tobytes().rstrip(b"\0").decode() + "/" + name


@pytest.mark.parametrize("strategy", ["allreduce", "central", "ps"])
@pytest.mark.parametrize("spec", LOSSY)
def test_a_resumed_run_continues_bit_for_bit(strategy, spec, data, tmp_path_factory):
    x, y = data
    if strategy == "ps" and dist.get_world_size() == 1:
        return
    options = {"servers": 1} if strategy == "ps" else {}
    path = shared_path(tmp_path_factory, f"{strategy}-{spec}.ckpt")
    first = trainer(strategy, spec, **options)
    first.train_steps(x, y, 0, 0, 6)
    first.step = 6
    first.save(path)
    first.train_steps(x, y, 0, 6, 12)
    again = trainer(strategy, spec, **options).load(path)
    parallel_assert(again.step == 6, "the checkpoint's step")
    again.train_steps(x, y, 0, 6, 12)
    same = np.array_equal(again.weights(), first.weights())
    parallel_assert(same, f"{strategy} {spec}: the resumed run differs by {rel(again.weights(), first.weights()):.3g}")
    # the residual came back too: without it the run would differ (checked where it is not empty)
    parallel_assert(np.array_equal(again.engine.compression_residual, first.engine.compression_residual),
                    f"{strategy} {spec}: residuals differ after resuming")


def test_another_compressor_resumes_from_zero_residuals_with_a_warning(data, tmp_path_factory):
    x, y = data
    path = shared_path(tmp_path_factory, "fp16.ckpt")
    t = trainer("allreduce", "fp16")
    t.train_steps(x, y, 0, 0, 3)
    t.save(path)
    other = trainer("allreduce", "topk:0.1")
    if dist.get_rank() == 0:
        with pytest.warns(UserWarning, match="start from zero"):
            other.load(path)
    else:
        other.load(path)
    parallel_assert(np.array_equal(other.params, t.params), "the weights load whatever the compressor")
    parallel_assert(not other.engine.compression_residual.any(), "the residuals should start from zero")


@pytest.mark.parametrize("spec", ["fp16", "topk:0.1", "sign"])
def test_averaging_and_pushes_send_the_payloads(spec, data):
    """average sends its weight differences compressed at each averaging step; a downpour worker pushes
    one payload per exchange."""
    x, y = data
    R, r = dist.get_world_size(), dist.get_rank()
    got = trainer("average", spec, period=3).train_steps(x, y, 0, 0, 6)[5]
    parallel_assert(got == 2 * (R - 1) * payload(spec), f"average {spec}: rank {r} counted {got}, expected "
                    f"{2 * (R - 1) * payload(spec)}")
    if R == 1:
        return
    stats = trainer("downpour", spec, servers=1, window=2).train_steps(x, y, 0, 0, 6)
    if r < R - 1:   # a worker: its pushes alone (the server sends the center and the grants)
        parallel_assert(stats[5] == stats[10] * payload(spec) and stats[10] > 0,
                        f"downpour {spec}: {stats[5]} bytes for {stats[10]} pushes of {payload(spec)}")
    else:
        parallel_assert(True)
