"""The invariants that prove each training strategy (csrc/strategies/), at every world size of
tests/run_mpi.py (the suite runs 1, 2, 3 and 4 ranks):

- ring, central and ps equal allreduce after 20 steps (weights and momentum, relative difference
  < 1e-5): ps against allreduce on a group of its workers, with 1, 2 and 3 servers and a parameter
  count (11,935) that none of them divides, so the sharding must be invisible;
- average with period 1 and local momentum equals allreduce; average with a period longer than the
  run equals R independent single-process runs on their shards (bitwise); after each averaging step
  every rank holds the same bits;
- easgd with beta = 0 leaves the workers independent (bitwise) and the center where it started; each
  exchange conserves the workers' weights plus the center, and moves each worker alpha of the way;
- communication is counted as the strategy sends it; checkpoints save and restore what the strategy
  evaluates.
Each reference is computed independently: a pydist allreduce run, or an engine alone.
"""
import numpy as np
import pytest

import pydist as dist
from pydist import _C
from pydist.engine import Trainer, mlp, load_fashion_mnist
from helpers import parallel_assert

STEPS, BATCH, HIDDEN = 20, 8, (15,)
SGD = dict(lr=0.05, momentum=0.9, weight_decay=1e-4)


@pytest.fixture(scope="module")
def data():
    _, (x, y) = load_fashion_mnist()     # the 10,000 test images: plenty for 20 x 4 x 8
    return x, y


def trainer(strategy="allreduce", group=None, **options):
    return Trainer(mlp(HIDDEN), batch_size=BATCH, seed=5, group=group, strategy=strategy, **SGD, **options)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def alone_engine(start=None):
    """An engine training alone (no communication), from the initial weights or a trainer's state."""
    model = mlp(HIDDEN)
    e = _C.Engine(model.specs(), model.input_shape, BATCH)
    e.init_params(5)
    if start is not None:
        e.params[:] = start.params
        e.momentum[:] = start.engine.momentum
        e.momentum_started = start.engine.momentum_started
    return e


def shard_perm(n, rank, world):
    """The examples rank `rank` of `world` takes step by step, in order: its own run alone."""
    perm = _C.epoch_permutation(n, 5, 0)
    steps = n // (world * BATCH)
    return np.ascontiguousarray(perm[:steps * world * BATCH].reshape(steps, world, BATCH)[:, rank].ravel())


def run_alone(e, x, y, perm, first, last):
    e.train_steps(x.reshape(len(y), -1), y, perm, first, last, BATCH, -1, SGD["lr"], SGD["momentum"], 0.0,
                  SGD["weight_decay"], False)


def all_same(a):
    """Whether every rank holds exactly these bits."""
    mine = np.ascontiguousarray(a)
    every = [np.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return all(np.array_equal(o, mine) for o in every)


@pytest.mark.parametrize("strategy", ["ring", "central"])
def test_sync_strategy_equals_allreduce(strategy, data):
    x, y = data
    ref = trainer()
    ref.train_steps(x, y, 0, 0, STEPS)
    ours = trainer(strategy)
    ours.train_steps(x, y, 0, 0, STEPS)
    p, m, started = ours.engine.strategy_state()
    parallel_assert(rel(p, ref.params) < 1e-5, f"{strategy}: weights differ from allreduce: {rel(p, ref.params):.3g}")
    parallel_assert(rel(m, ref.engine.momentum) < 1e-5, f"{strategy}: momentum differs from allreduce")
    parallel_assert(rel(p, alone_engine().params) > 1e-2, "the weights barely moved: the comparison would be empty")
    parallel_assert(started and all_same(ours.params), f"{strategy}: ranks hold different weights")


@pytest.mark.parametrize("servers", [1, 2, 3])
def test_ps_equals_allreduce_on_its_workers(servers, data):
    x, y = data
    R = dist.get_world_size()
    if R <= servers:   # too few ranks: a clear error on every rank, not a hang
        with pytest.raises(ValueError, match="needs more ranks than servers"):
            trainer("ps", servers=servers)
        return
    W = R - servers
    workers = dist.new_group(list(range(W)))     # every rank calls new_group; only workers train in it
    ref = trainer(group=workers) if dist.get_rank() < W else None
    ps = trainer("ps", servers=servers)
    assert ps.workers == W and ps.is_server == (dist.get_rank() >= W)
    assert ps.engine.num_params % servers != 0 or servers == 1
    if ref is not None:
        ref.train_steps(x, y, 0, 0, STEPS)
    ps.train_steps(x, y, 0, 0, STEPS)
    p, m, _ = ps.engine.strategy_state()      # the servers' shards of momentum, gathered
    want = np.empty_like(p), np.empty_like(m)
    if ref is not None:
        want[0][:], want[1][:] = ref.params, ref.engine.momentum
    dist.broadcast(want[0], 0)
    dist.broadcast(want[1], 0)
    parallel_assert(rel(p, want[0]) < 1e-5, f"ps S={servers}: weights differ from allreduce: {rel(p, want[0]):.3g}")
    parallel_assert(rel(m, want[1]) < 1e-5, f"ps S={servers}: momentum differs from allreduce: {rel(m, want[1]):.3g}")
    parallel_assert(rel(p, alone_engine().params) > 1e-2, "the weights barely moved")


def test_average_period_1_local_momentum_equals_allreduce(data):
    x, y = data
    ref = trainer()
    ref.train_steps(x, y, 0, 0, STEPS)
    avg = trainer("average", period=1)
    avg.train_steps(x, y, 0, 0, STEPS)
    parallel_assert(rel(avg.params, ref.params) < 1e-5, f"average K=1 differs from allreduce: "
                    f"{rel(avg.params, ref.params):.3g}")
    parallel_assert(all_same(avg.params), "ranks differ after averaging")


def test_average_longer_than_the_run_is_independent_runs(data):
    x, y = data
    R, r = dist.get_world_size(), dist.get_rank()
    avg = trainer("average", period=10**6)
    avg.train_steps(x, y, 0, 0, STEPS)
    e = alone_engine()
    run_alone(e, x, y, shard_perm(len(y), r, R), 0, STEPS)
    parallel_assert(np.array_equal(avg.params, e.params), "average without an averaging step is not R "
                    f"independent runs: {rel(avg.params, e.params):.3g}")
    # What it evaluates is the mean of those runs.
    runs = [np.empty_like(e.params) for _ in range(R)]
    dist.all_gather(runs, e.params)
    parallel_assert(rel(avg.weights(), np.mean(np.array(runs, np.float64), axis=0)) < 1e-6, "weights() is not the mean")


@pytest.mark.parametrize("placement", ["local", "average", "reset"])
def test_average_step_leaves_every_rank_the_same_bits(placement, data):
    x, y = data
    avg = trainer("average", period=3, warmup=2, momentum_placement=placement)
    avg.train_steps(x, y, 0, 0, 2 + 3)              # warmup 2, then averages after local step 3
    parallel_assert(all_same(avg.params), "ranks hold different weights right after an averaging step")
    if placement == "average":
        parallel_assert(all_same(avg.engine.momentum), "averaged momentum differs across ranks")
    if placement == "reset":
        parallel_assert(not avg.engine.momentum_started and not avg.engine.momentum.any(), "momentum not reset")
    avg.train_steps(x, y, 0, 5, 6)                  # one local step: the ranks part again
    if dist.get_world_size() > 1:
        parallel_assert(not all_same(avg.params), "a local step left every rank the same: no local steps happen")


def test_easgd_beta_0_leaves_workers_independent(data):
    x, y = data
    R, r = dist.get_world_size(), dist.get_rank()
    ea = trainer("easgd", period=2, beta=0.0)
    center = ea.weights()
    ea.train_steps(x, y, 0, 0, STEPS)
    e = alone_engine()
    run_alone(e, x, y, shard_perm(len(y), r, R), 0, STEPS)
    parallel_assert(np.array_equal(ea.params, e.params), "easgd with beta 0 is not independent runs")
    parallel_assert(np.array_equal(ea.weights(), center), "easgd with beta 0 moved the center")


def test_easgd_exchange_conserves_workers_plus_center(data):
    x, y = data
    R, r = dist.get_world_size(), dist.get_rank()
    period, beta = 3, 0.9
    ea = trainer("easgd", period=period, beta=beta)
    ea.train_steps(x, y, 0, 0, period - 1)          # local steps only
    center = ea.weights().astype(np.float64)
    e = alone_engine(start=ea)                        # this worker's next local step, computed alone
    run_alone(e, x, y, shard_perm(len(y), r, R), period - 1, period)
    local = e.params.astype(np.float64)
    ea.train_steps(x, y, 0, period - 1, period)     # that step, then the exchange
    after, new_center = ea.params.astype(np.float64), ea.weights().astype(np.float64)
    alpha = beta / R
    parallel_assert(rel(after, local - alpha * (local - center)) < 1e-5,
                    "the worker did not move alpha toward the center")
    before_sum, after_sum = local.copy(), after.copy()
    dist.all_reduce(before_sum)
    dist.all_reduce(after_sum)
    parallel_assert(rel(after_sum + new_center, before_sum + center) < 1e-5,
                    f"the exchange did not conserve workers + center: "
                    f"{rel(after_sum + new_center, before_sum + center):.3g}")
    parallel_assert(all_same(ea.weights()), "ranks hold different centers")
    if R > 1:
        parallel_assert(rel(new_center, center) > 1e-4, "the center did not move")


def test_communication_is_counted_as_sent(data):
    x, y = data
    R, r = dist.get_world_size(), dist.get_rank()
    n, f = mlp(HIDDEN).num_params, 4
    steps = 3
    counts = {}
    for strategy in ["allreduce", "ring", "central"] + (["ps"] if R > 1 else []):
        counts[strategy] = trainer(strategy).train_steps(x, y, 0, 0, steps)[5:7]
    segment = [n // R + (i < n % R) for i in range(R)]
    ring_bytes = sum(segment[(r - k) % R] for k in range(R - 1)) + sum(segment[(r + 1 - k) % R] for k in range(R - 1))
    expect = {
        "allreduce": (2 * (R - 1) * n * f // R * steps, 2 * (R - 1) * steps) if R > 1 else (0, 0),
        "ring": (ring_bytes * f * steps, 2 * (R - 1) * steps),
        "central": ((R - 1) * n * f * steps, (R - 1) * steps) if r == 0 else (n * f * steps, steps),
    }
    if R > 1:   # ps, 1 server: a worker pushes all of its gradient; the server sends every worker the weights
        expect["ps"] = (n * f * steps, steps) if r < R - 1 else ((R - 1) * n * f * steps, (R - 1) * steps)
    for strategy, want in expect.items():
        got = tuple(int(v) for v in counts[strategy])
        if strategy == "allreduce":
            got = (got[0] // steps * steps, got[1])
        parallel_assert(got == want, f"{strategy}: rank {r} counted {got} (bytes, messages), expected {want}")


@pytest.mark.parametrize("strategy,options", [("ps", dict(servers=1)), ("average", dict(period=4)),
                                              ("easgd", dict(period=2))])
def test_checkpoint_saves_what_the_strategy_evaluates(strategy, options, data, tmp_path_factory):
    x, y = data
    R = dist.get_world_size()
    if strategy == "ps" and R < 2:
        return
    path = str(tmp_path_factory.getbasetemp() / f"{strategy}.ckpt")
    path_list = [path]
    dist.broadcast_object_list(path_list, 0)       # rank 0 writes; every rank names the same file
    first = trainer(strategy, **options)
    first.train_steps(x, y, 0, 0, 6)
    first.step = 6
    evaluated = first.weights()
    first.save(path_list[0])
    second = trainer(strategy, **options).load(path_list[0])
    # Every rank resumes from the saved weights (the mean of R equal copies is exact up to rounding).
    parallel_assert(rel(second.weights(), evaluated) < 1e-6, f"{strategy}: resumed weights differ from saved")
    parallel_assert(all_same(second.params), f"{strategy}: ranks resumed from different weights")
    parallel_assert(second.step == 6, "step not restored")
    if strategy == "ps":   # its whole state is saved: the resumed run continues exactly
        first.train_steps(x, y, 0, 6, 10)
        second.train_steps(x, y, 0, 6, 10)
        parallel_assert(np.array_equal(first.weights(), second.weights()), "ps resumed differs from uninterrupted")


def test_a_checkpoint_of_another_strategy_is_refused_on_every_rank(data, tmp_path_factory):
    """A checkpoint records its strategy: loading an allreduce checkpoint into a downpour trainer (whose
    file holds the servers' state, not a replica) is refused on every rank with the same message,
    naming both strategies, and the trainers keep their weights."""
    x, y = data
    R = dist.get_world_size()
    path = [str(tmp_path_factory.getbasetemp() / "strategy.ckpt")]
    dist.broadcast_object_list(path, 0)
    first = trainer("allreduce")
    first.train_steps(x, y, 0, 0, 2)
    first.save(path[0])
    other = trainer("downpour", window=2) if R > 1 else trainer("ring")
    before = other.params.copy()
    try:
        other.load(path[0])
        said = ""
    except ValueError as e:
        said = str(e)
    want = f"saved by strategy allreduce (model mlp-15); this trainer's strategy is {other.strategy} (model mlp-15)"
    parallel_assert(want in said, f"rank {dist.get_rank()} said {said!r}")
    messages = [None] * R
    dist.all_gather_object(messages, said)
    parallel_assert(len(set(messages)) == 1, f"the ranks said different things: {messages}")
    parallel_assert(np.array_equal(other.params, before), "a refused checkpoint changed the weights")
