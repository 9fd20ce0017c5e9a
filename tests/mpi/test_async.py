"""The invariants of the asynchronous strategies (csrc/strategies/async.c), at every world size of
tests/run_mpi.py (1 to 4 ranks; the last S ranks are servers, S = 1 and 2 where the world allows):

- with one worker every asynchronous strategy equals sequential SGD with the same window (downpour
  and dynsgd plain SGD, adag its window rule, aeasgd the elastic rule with Nesterov momentum), computed
  by an engine alone;
- adag with window 1 equals downpour with window 1, and dynsgd with one worker equals downpour (bitwise,
  served in the same order);
- aeasgd with beta = 0 leaves the worker alone and the center still; an exchange conserves worker +
  center and moves the worker alpha of the way;
- a server's final shard is its initial shard plus the sum of the pushes it received (exact on
  integer-valued pushes, whatever the order they arrived in);
- --deterministic twice gives identical bits; the counts (pushes, staleness, exchanges) add up;
- at world size 1 (no room for a server) every asynchronous strategy is a clear error.
"""
import numpy as np
import pytest

import pydist as dist
from pydist import _C
from pydist.engine import ASYNC, Trainer, mlp, load_fashion_mnist
from helpers import parallel_assert

WINDOW, BATCH, HIDDEN = 3, 8, (15,)
STEPS = 7 * WINDOW          # ends on an exchange: the center holds every step
SGD = dict(lr=0.05, momentum=0.9, weight_decay=1e-4)


@pytest.fixture(scope="module")
def data():
    _, (x, y) = load_fashion_mnist()
    return x, y


def trainer(strategy, **options):
    return Trainer(mlp(HIDDEN), batch_size=BATCH, seed=5, strategy=strategy, **SGD, **options)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def alone_engine():
    model = mlp(HIDDEN)
    e = _C.Engine(model.specs(), model.input_shape, BATCH)
    e.init_params(5)
    return e


def run_alone(e, x, y, first, last, nesterov=False):
    """Steps [first, last) of the one worker's data (epoch 0's order), no communication."""
    perm = _C.epoch_permutation(len(y), 5, 0)
    e.train_steps(x.reshape(len(y), -1), y, perm, first, last, BATCH, -1, SGD["lr"], SGD["momentum"], 0.0,
                  SGD["weight_decay"], nesterov)


def sequential(strategy, x, y, beta=0.9):
    """One worker's run alone with the strategy's window rule applied in NumPy: the center it ends with."""
    e = alone_engine()
    center = e.params.astype(np.float64)
    for first in range(0, STEPS, WINDOW):
        run_alone(e, x, y, first, first + WINDOW, nesterov=strategy == "aeasgd")
        p = e.params.astype(np.float64)
        if strategy == "adag":
            center += (p - center) / WINDOW
            e.params[:] = center
        elif strategy == "aeasgd":
            elastic = beta * (p - center)          # alpha = beta / 1 worker
            center += elastic
            e.params[:] = p - elastic
        else:                                      # downpour, dynsgd (staleness 0 with one worker)
            center = p
    return center


def one_worker_servers():
    """Servers that leave exactly one worker: R - 1 (S = 1 at R = 2, 2 at R = 3, 3 at R = 4)."""
    return dist.get_world_size() - 1


def all_same(a):
    mine = np.ascontiguousarray(a)
    every = [np.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return all(np.array_equal(o, mine) for o in every)


@pytest.mark.parametrize("strategy", ASYNC)
def test_one_worker_equals_sequential_sgd_with_the_window(strategy, data):
    x, y = data
    if dist.get_world_size() == 1:
        with pytest.raises(ValueError, match="needs more ranks than servers"):
            trainer(strategy, window=WINDOW)
        return
    t = trainer(strategy, window=WINDOW, servers=one_worker_servers())
    assert t.workers == 1 and t.is_server == (dist.get_rank() > 0)
    t.train_steps(x, y, 0, 0, STEPS)
    center, want = t.weights(), sequential(strategy, x, y)
    parallel_assert(rel(center, want) < 1e-5, f"{strategy}: the center differs from sequential SGD with window "
                    f"{WINDOW}: {rel(center, want):.3g}")
    parallel_assert(rel(center, alone_engine().params) > 1e-2, "the center barely moved: the comparison is empty")
    parallel_assert(all_same(center), "ranks see different centers")


def test_adag_window_1_equals_downpour_window_1(data):
    x, y = data
    R = dist.get_world_size()
    if R == 1:
        return    # no room for a server: the error is the test above's
    for servers in sorted({1, min(2, R - 1)}):
        runs = {}
        for strategy in ("downpour", "adag"):
            t = trainer(strategy, window=1, servers=servers, deterministic=True)
            t.train_steps(x, y, 0, 0, 8)
            runs[strategy] = t.weights()
        parallel_assert(np.array_equal(runs["adag"], runs["downpour"]),
                        f"adag window 1 differs from downpour window 1 (S={servers}): "
                        f"{rel(runs['adag'], runs['downpour']):.3g}")


def test_dynsgd_with_one_worker_equals_downpour(data):
    x, y = data
    if dist.get_world_size() == 1:
        return
    runs = {}
    for strategy in ("downpour", "dynsgd"):
        t = trainer(strategy, window=WINDOW, servers=one_worker_servers())
        out = t.train_steps(x, y, 0, 0, STEPS)
        runs[strategy] = t.weights()
        if t.is_server:
            parallel_assert(out[7] == STEPS // WINDOW and out[8] == 0, f"{strategy}: one worker's pushes must all "
                            f"be fresh: {out[7]} pushes, staleness sum {out[8]}")
        else:
            parallel_assert(out[10] == STEPS // WINDOW, f"{strategy}: {out[10]} exchanges")
    parallel_assert(np.array_equal(runs["dynsgd"], runs["downpour"]), "dynsgd with one worker is not downpour")


def test_aeasgd_beta_0_leaves_the_worker_alone(data):
    x, y = data
    if dist.get_world_size() == 1:
        return
    t = trainer("aeasgd", window=WINDOW, beta=0.0, servers=one_worker_servers())
    start = t.weights()
    t.train_steps(x, y, 0, 0, STEPS)
    e = alone_engine()
    run_alone(e, x, y, 0, STEPS, nesterov=True)
    parallel_assert(t.is_server or np.array_equal(t.params, e.params), "aeasgd with beta 0 moved the worker")
    parallel_assert(np.array_equal(t.weights(), start), "aeasgd with beta 0 moved the center")


def test_aeasgd_exchange_conserves_worker_plus_center(data):
    x, y = data
    if dist.get_world_size() == 1:
        return
    beta = 0.6
    t = trainer("aeasgd", window=WINDOW, beta=beta, servers=one_worker_servers())
    t.train_steps(x, y, 0, 0, WINDOW)              # a block, then its exchange
    center = t.weights().astype(np.float64)
    e = alone_engine()                             # the worker's state, and its next block alone
    e.params[:] = t.params
    e.momentum[:] = t.engine.momentum
    e.momentum_started = t.engine.momentum_started
    dist.broadcast(e.params, 0)                    # the worker is rank 0
    dist.broadcast(e.momentum, 0)
    e.momentum_started = True
    run_alone(e, x, y, WINDOW, 2 * WINDOW, nesterov=True)
    local = e.params.astype(np.float64)
    t.train_steps(x, y, 0, WINDOW, 2 * WINDOW)     # that block, then the exchange
    new_center = t.weights().astype(np.float64)
    after = t.params.astype(np.float64)
    dist.broadcast(after, 0)
    parallel_assert(rel(after, local - beta * (local - center)) < 1e-5, "the worker did not move alpha toward the center")
    parallel_assert(rel(after + new_center, local + center) < 1e-6, "the exchange did not conserve worker + center: "
                    f"{rel(after + new_center, local + center):.3g}")
    parallel_assert(rel(new_center, center) > 1e-4, "the center did not move")


def test_server_shard_is_its_start_plus_the_pushes(data):
    """Integer-valued pushes, added in whatever order they arrive: the sum is exact."""
    x, y = data
    R, r = dist.get_world_size(), dist.get_rank()
    if R == 1:
        return
    zeros = np.zeros_like(x[:64])                  # zero images: finite gradients on any weights
    for servers in sorted({1, min(2, R - 1)}):
        t = trainer("downpour", window=2, servers=servers)
        W, n = t.workers, t.engine.num_params
        start = np.arange(n, dtype=np.float32) % 7 - 3   # the same integer weights on every rank
        t.params[:] = start
        t.engine.strategy_restore()
        rng = np.random.default_rng(r)
        pushed = np.zeros(n, np.float64)
        for k in range(5):
            if not t.is_server:
                push = rng.integers(-4, 5, n).astype(np.float32)
                pushed += push
                t.params[:] += push                 # the window's update, exactly
            # lr 0 and no momentum: the two local steps leave the weights as they are; then the exchange
            t.engine.global_step = 2 * k
            t.engine.train_steps(zeros, y[:64], _C.epoch_permutation(64, 0, 0), 0, 2, BATCH // 4, t._handle,
                                 0.0, 0.0, 0.0, 0.0, False)
        dist.all_reduce(pushed)
        parallel_assert(np.array_equal(t.weights(), start + pushed.astype(np.float32)),
                        f"S={servers}: the center is not its start plus the {W} workers' pushes")


def test_deterministic_runs_are_bitwise_repeatable(data):
    x, y = data
    if dist.get_world_size() == 1:
        return
    for strategy in ("dynsgd", "aeasgd"):
        runs = []
        for _ in range(2):
            t = trainer(strategy, window=2, deterministic=True)
            t.train_steps(x, y, 0, 0, 10)
            t.train_steps(x, y, 0, 10, 15)          # two calls: serving starts over at each
            runs.append((t.weights(), t.params.copy()))
        parallel_assert(np.array_equal(runs[0][0], runs[1][0]), f"{strategy}: two deterministic runs differ")
        parallel_assert(np.array_equal(runs[0][1], runs[1][1]), f"{strategy}: a rank's weights differ between runs")


def test_pushes_and_staleness_add_up(data):
    x, y = data
    R = dist.get_world_size()
    if R == 1:
        return
    t = trainer("downpour", window=2, deterministic=True)
    W = t.workers
    out = np.array(t.train_steps(x, y, 0, 0, 8), np.float64)
    total = out.copy()
    dist.all_reduce(total)
    # 4 exchanges per worker, each served once by the one server
    parallel_assert(total[10] == 4 * W and total[7] == 4 * W, f"exchanges {total[10]}, pushes {total[7]}")
    # round-robin: after the first round every push has seen the other W - 1 workers' updates
    want = (W - 1) * 4 * W - (W - 1) * W // 2
    parallel_assert(total[8] == want and (not t.is_server or out[9] == W - 1),
                    f"staleness sum {total[8]} (want {want}), max {out[9]}")
    parallel_assert(all_same(t.weights()), "ranks see different centers")


def test_checkpoint_saves_and_resumes_the_center(data, tmp_path_factory):
    x, y = data
    if dist.get_world_size() == 1:
        return
    path = [str(tmp_path_factory.getbasetemp() / "async.ckpt")]
    dist.broadcast_object_list(path, 0)            # rank 0 writes; every rank names the same file
    first = trainer("adag", window=WINDOW)
    first.train_steps(x, y, 0, 0, 2 * WINDOW)
    first.step = 2 * WINDOW
    center = first.weights()
    first.save(path[0])
    second = trainer("adag", window=WINDOW).load(path[0])
    parallel_assert(np.array_equal(second.weights(), center), "the resumed center differs from the saved one")
    parallel_assert(np.array_equal(second.params, center), "a rank did not resume from the center")
    second.train_steps(x, y, 0, 2 * WINDOW, 3 * WINDOW)   # and it trains on from there
    parallel_assert(rel(second.weights(), center) > 1e-4, "the resumed run's center did not move")


def test_fit_reports_staleness_and_waiting(data):
    x, y = data
    if dist.get_world_size() == 1:
        return
    t = trainer("dynsgd", window=2)
    n = 40 * t.workers * BATCH                     # 40 steps per epoch
    record = t.fit(x[:n], y[:n], epochs=1, progress=False, chunk_steps=15)[0]
    W = t.workers
    # every call's W x steps batches go in blocks of 2, each block ending in one push
    blocks = sum(-(-W * steps // 2) for steps in (15, 15, 10))
    parallel_assert(record["evaluated"] == "the center" and record["pushes_per_worker"] == blocks / W,
                    f"pushes per worker {record['pushes_per_worker']} (want {blocks} / {W})")
    parallel_assert(0 <= record["staleness_mean"] <= record["staleness_max"] and
                    (W > 1 or record["staleness_max"] == 0), f"staleness {record}")
    parallel_assert(0 < record["wait_share"] < 1, f"wait share {record['wait_share']}")
