"""Checkpoints every few steps that resume at any world size (issue 27, part 1), at every world size of
tests/run_mpi.py. A checkpoint records where the epoch's global sample order stopped, so:

- resumed at the same R from a mid-epoch checkpoint (`checkpoint_every`), a run ends bitwise where the
  uninterrupted one does (the same chunks, so the asynchronous strategies too, with --deterministic);
- resumed at R' ranks with R' x B' == R x B, the next 20 steps equal the uninterrupted run's within
  float tolerance (the same global batches; only the order of the sums differs);
- resumed at R' with any batch, the run equals a fresh run at R' started by hand from the state read out
  of the file by an independent reader (NumPy, below) at the position it records: bitwise.
R' runs on a group of the first R' ranks (every R' <= R), so the suite's world sizes cover each pair.
"""
import shutil

import numpy as np
import pytest

import pydist as dist
from pydist.engine import Trainer, load_fashion_mnist, mlp
from helpers import parallel_assert

HIDDEN, SGD, SEED = (15,), dict(lr=0.05, momentum=0.9, weight_decay=1e-4), 5
GLOBAL = 24                        # a global batch every R of 1-4 divides
N = 20 * GLOBAL + 10               # 20 steps an epoch at R x B = 24, and a remainder
HEADER = 192                       # csrc/engine/checkpoint.h, format 5


@pytest.fixture(scope="module")
def data():
    _, (x, y) = load_fashion_mnist()
    return x[:N], y[:N]


def trainer(batch, group=None, strategy="allreduce", **options):
    return Trainer(mlp(HIDDEN), batch_size=batch, seed=SEED, group=group, strategy=strategy, **SGD, **options)


def shared_path(tmp_path_factory, name):
    path = [str(tmp_path_factory.getbasetemp() / name)]
    dist.broadcast_object_list(path, 0)          # rank 0 writes; every rank names the same file
    return path[0]


class KeepsCheckpointAt(Trainer):
    """A Trainer whose rank 0 copies the checkpoint it has just written at step `at` aside: the file a
    run killed right after that step would have left."""
    def __init__(self, *args, at, copy_to, **kwargs):
        super().__init__(*args, **kwargs)
        self.at, self.copy_to = at, copy_to

    def save(self, path):
        super().save(path)
        if self.step == self.at and self.rank == 0:
            shutil.copyfile(path, self.copy_to)


def read_checkpoint(path, n):
    """(params, momentum, step, epoch, sample, world, global_batch) straight from the file's bytes."""
    raw = open(path, "rb").read()
    assert raw[:4] == b"PCDP" and int.from_bytes(raw[4:8], "little") == 5
    head = np.frombuffer(raw[8:HEADER], np.uint8)
    u64 = lambda at: int(np.frombuffer(raw[at:at + 8], np.uint64)[0])   # offsets as in CheckpointHeader
    params = np.frombuffer(raw[HEADER:HEADER + 4 * n], np.float32)
    momentum = np.frombuffer(raw[HEADER + 4 * n:HEADER + 8 * n], np.float32)
    assert head.size == HEADER - 8
    return params, momentum, u64(16), u64(24), u64(104), u64(112), u64(120)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


STRATEGIES = [("allreduce", {}), ("ring", {}), ("central", {}), ("ps", dict(servers=1)), ("average", dict(period=3)),
              ("easgd", dict(period=2)), ("downpour", dict(window=2, deterministic=True)),
              ("aeasgd", dict(window=2, deterministic=True)), ("pipeline", dict(micro_batches=2))]


# Where every worker keeps its own replica, the checkpoint holds what the strategy stands for (the
# average and mean momentum, the center: README "Strategies") and a resume restarts every worker from
# it, like an exchange: average, easgd and the asynchronous strategies are held to the fresh-run
# equality below instead (even at an averaging step the mean of R equal replicas is not always their bits).
SAME_R = [(s, o) for s, o in STRATEGIES if s in ("allreduce", "ring", "central", "ps", "pipeline")]


@pytest.mark.parametrize("strategy,options", SAME_R, ids=[s for s, _ in SAME_R])
def test_mid_epoch_checkpoint_resumes_bitwise_at_the_same_world_size(strategy, options, data, tmp_path_factory):
    x, y = data
    R = dist.get_world_size()
    if strategy in ("ps", "downpour", "aeasgd") and R < 2:
        return
    B = 4
    live, kept = shared_path(tmp_path_factory, f"{strategy}-live.ckpt"), shared_path(tmp_path_factory, f"{strategy}.ckpt")
    straight = KeepsCheckpointAt(mlp(HIDDEN), batch_size=B, seed=SEED, strategy=strategy, **SGD, **options,
                                 at=None, copy_to=kept)
    workers = straight.workers
    per_epoch = N // (workers * B)
    at = straight.at = (per_epoch + per_epoch // 2) // 3 * 3   # a checkpoint in the middle of epoch 2 (every 3 steps)
    straight.fit(x, y, epochs=2, checkpoint=live, checkpoint_every=3, progress=False)
    resumed = trainer(B, strategy=strategy, **options).load(kept)
    parallel_assert((resumed.epoch, resumed.step) == (1, at), f"resumed at {(resumed.epoch, resumed.step)}")
    parallel_assert(resumed.resumed_from["sample"] == (at - per_epoch) * workers * B, f"{resumed.resumed_from}")
    resumed.fit(x, y, epochs=2, checkpoint=live, checkpoint_every=3, progress=False)
    parallel_assert(resumed.step == straight.step, f"{strategy}: {resumed.step} steps, uninterrupted {straight.step}")
    parallel_assert(np.array_equal(resumed.weights(), straight.weights()),
                    f"{strategy}: resumed mid-epoch differs from the uninterrupted run")


def resume_group(r_new):
    """The first r_new ranks as a group (None: the whole world), and whether this rank is in it."""
    group = dist.new_group(list(range(r_new))) if r_new < dist.get_world_size() else None
    return group, dist.get_rank() < r_new


def test_resume_at_another_world_size_with_the_same_global_batch_follows_the_run(data, tmp_path_factory):
    x, y = data
    R = dist.get_world_size()
    path = shared_path(tmp_path_factory, "global.ckpt")
    at = 20 + 8                                     # step 8 of epoch 2
    straight = KeepsCheckpointAt(mlp(HIDDEN), batch_size=GLOBAL // R, seed=SEED, **SGD, at=at, copy_to=path)
    straight.fit(x, y, epochs=2, checkpoint=path + ".live", checkpoint_every=7, progress=False)
    straight.train_steps(x, y, 2, 0, 8, global_step=straight.step)   # 20 steps after the checkpoint
    problems = []   # checked by every rank together after the loop (a group's members alone cannot)
    for r_new in range(1, R + 1):
        group, member = resume_group(r_new)
        if not member:
            continue
        resumed = trainer(GLOBAL // r_new, group=group).load(path)
        if resumed.resumed_from != {"epoch": 1, "step": at, "sample": 8 * GLOBAL, "world_size": R,
                                    "global_batch": GLOBAL}:
            problems.append(f"R'={r_new}: {resumed.resumed_from}")
        resumed.fit(x, y, epochs=2, progress=False)   # the rest of epoch 2: 12 steps
        if resumed.step != 40:
            problems.append(f"R'={r_new}: {resumed.step} steps")
        resumed.train_steps(x, y, 2, 0, 8, global_step=resumed.step)
        if not rel(resumed.params, straight.params) < 1e-5:
            problems.append(f"R={R} resumed at R'={r_new}: {rel(resumed.params, straight.params):.3g} from the "
                            f"uninterrupted run")
    parallel_assert(not problems, "; ".join(problems))


@pytest.mark.parametrize("strategy,options", STRATEGIES, ids=[s for s, _ in STRATEGIES])
def test_resume_at_any_world_size_equals_a_fresh_run_from_the_saved_state(strategy, options, data,
                                                                          tmp_path_factory):
    x, y = data
    R = dist.get_world_size()
    servers = options.get("servers", 1) if strategy in ("ps", "downpour", "aeasgd") else 0
    if R <= servers:
        return
    path = shared_path(tmp_path_factory, f"{strategy}-any.ckpt")
    first = trainer(6, strategy=strategy, **options)
    first.fit(x, y, epochs=1, progress=False)
    # 4 steps into epoch 2 (the asynchronous workers take them as they come), then a checkpoint
    first.train_steps(x, y, 1, 0, 4, global_step=first.step)
    first.step += 4
    first.save(path)
    problems = []
    for r_new in range(servers + 1, R + 1):
        group, member = resume_group(r_new)
        if not member:
            continue
        B = 4 if strategy != "pipeline" else 2 * r_new   # any batch (the pipeline's divides into micro-batches)
        resumed = trainer(B, group=group, strategy=strategy, **options).load(path)
        if resumed.resumed_from["world_size"] != R:
            problems.append(f"{resumed.resumed_from}")
        resumed.fit(x, y, epochs=2, progress=False)
        # The same by hand: a fresh trainer at R' given the file's state, read by NumPy, and the rest of
        # epoch 2's order from the example the file names
        fresh = trainer(B, group=group, strategy=strategy, **options)
        params, momentum, step, epoch, sample, world, gb = read_checkpoint(path, fresh.engine.num_params)
        if (step, epoch, sample, world, gb) != (first.step, 1, 4 * first.global_batch, R, first.global_batch):
            problems.append(f"the file says {(step, epoch, sample, world, gb)}")
        fresh.params[:], fresh.engine.momentum[:] = params, momentum
        fresh.engine.momentum_started = True
        fresh.engine.strategy_restore()
        steps = (N - sample) // fresh.global_batch
        fresh.train_steps(x, y, 1, 0, steps, sample=sample, global_step=step)
        if resumed.step != step + steps:
            problems.append(f"{strategy}: resumed ran to {resumed.step}, not {step + steps}")
        if not np.array_equal(resumed.weights(), fresh.weights()):
            problems.append(f"{strategy}: saved at R={R}, resumed at R'={r_new} differs from a fresh run from the "
                            f"state")
    parallel_assert(not problems, "; ".join(problems))
