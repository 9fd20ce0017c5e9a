"""The proof of data parallelism: R ranks with batch B, after 20 steps of the C step loop, hold the
same weights as one process with batch R*B (norm of the difference under 1e-5 of the weights' norm),
and every rank holds exactly the same weights. Runs at every world size of tests/run_mpi.py."""
import numpy as np
import pytest

import pydist as dist
from pydist import _C
from pydist.engine import Trainer, lenet5, load_fashion_mnist, mlp
from helpers import parallel_assert

STEPS, BATCH = 20, 16


@pytest.fixture(scope="module")
def test_set():
    _, (x, y) = load_fashion_mnist()     # the 10,000 test images: enough for 20 x 4 x 16
    return x, y


@pytest.mark.parametrize("make", [lenet5, lambda: mlp((64, 32))], ids=["lenet5", "mlp"])
def test_r_ranks_batch_b_equal_one_rank_batch_rb(make, test_set):
    x, y = test_set
    R = dist.get_world_size()
    sgd = dict(lr=0.05, momentum=0.9, weight_decay=1e-4)
    trainer = Trainer(make(), batch_size=BATCH, seed=5, **sgd)
    start = trainer.params.copy()
    trainer.train_steps(x, y, epoch=0, first=0, last=STEPS)

    # The same run in one process: same initial weights and data order, batch R*B, no communication.
    model = make()
    alone = _C.Engine(model.specs(), model.input_shape, R * BATCH)
    alone.init_params(5)
    perm = _C.epoch_permutation(len(y), 5, 0)
    alone.train_steps(x.reshape(len(y), -1), y, perm, 0, STEPS, R * BATCH, -1, sgd["lr"], sgd["momentum"], 0.0,
                      sgd["weight_decay"], False)

    ours = trainer.params.astype(np.float64)
    ref = alone.params.astype(np.float64)
    rel = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
    moved = np.linalg.norm(ours - start) / np.linalg.norm(start)
    parallel_assert(rel < 1e-5, f"R={R} x B={BATCH} differs from 1 x {R * BATCH}: relative {rel:.3g}")
    parallel_assert(moved > 1e-2, f"the weights barely moved ({moved:.3g}): the comparison would be empty")

    # Every rank holds the same bits.
    mine = trainer.params.copy()
    dist.broadcast(mine, 0)
    parallel_assert(np.array_equal(mine, trainer.params), "ranks hold different weights")


def test_initial_weights_come_from_rank_0(test_set):
    # Ranks seeded differently still start from rank 0's weights (they are broadcast).
    rank = dist.get_rank()
    trainer = Trainer(mlp((16,)), batch_size=4, seed=100 + rank)
    model = mlp((16,))
    e = _C.Engine(model.specs(), model.input_shape, 1)
    e.init_params(100)
    parallel_assert(np.array_equal(trainer.params, e.params), "weights differ from rank 0's")


def test_evaluate_agrees_across_ranks(test_set):
    x, y = test_set
    trainer = Trainer(mlp((32,)), batch_size=8, seed=1)
    ours = trainer.evaluate(x[:1000], y[:1000])
    model = mlp((32,))
    e = _C.Engine(model.specs(), model.input_shape, 500)
    e.init_params(1)
    loss_sum, correct = e.evaluate(x[:1000].reshape(1000, -1), y[:1000], 0, 1000, 500)
    parallel_assert(abs(ours["loss"] - loss_sum / 1000) < 1e-6 and ours["accuracy"] == correct / 1000,
                    f"{ours} vs {(loss_sum / 1000, correct / 1000)}")
