"""The invariants of the pipeline strategy (csrc/strategies/pipeline.c), at every world size of
tests/run_mpi.py (1, 2, 3 and 4 ranks), every stage count P that divides it (R = P x D replicas):

- any P and any number of micro-batches M (M < P included: it only idles) give, after 20 steps, the
  same weights, momentum and loss as one process taking the whole batch (relative difference < 1e-5),
  on an MLP and on LeNet-5 (convolutions and max-pools cut between stages);
- GPipe and 1F1B compute bitwise the same step;
- P x D equals `allreduce` on a group of D ranks;
- each stage holds what its schedule says (GPipe: M micro-batches' activations, 1F1B: min(P - p, M)),
  runs its forwards and backwards in the schedule's order, and sends what it must (counted);
- a checkpoint holds the whole model: P stages resume as 1 stage and the reverse, exactly where an
  uninterrupted run would be.
Each reference is computed independently: an engine alone, or a pydist allreduce run.
"""
import numpy as np
import pytest

import pydist as dist
from pydist import _C
from pydist.engine import SCHEDULES, Trainer, lenet5, load_fashion_mnist, mlp
from helpers import parallel_assert

STEPS, BATCH = 20, 8
SGD = dict(lr=0.05, momentum=0.9, weight_decay=1e-4)
MODELS = {"mlp": lambda: mlp((15, 12, 10)), "lenet5": lenet5}   # 8 and 12 layers


@pytest.fixture(scope="module")
def data():
    _, (x, y) = load_fashion_mnist()     # the 10,000 test images: plenty for 20 x 4 x 12
    return x, y


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def stage_counts():
    R = dist.get_world_size()
    return [p for p in range(1, R + 1) if R % p == 0]


def pipeline(model="mlp", batch=BATCH, **options):
    return Trainer(MODELS[model](), batch_size=batch, seed=5, strategy="pipeline", **SGD, **options)


def one_process(model, x, y, batch, first=0, last=STEPS, start=None):
    """An engine alone taking the whole batch each step: (engine, sum of the steps' losses)."""
    m = MODELS[model]()
    e = _C.Engine(m.specs(), m.input_shape, batch)
    e.init_params(5)
    if start is not None:
        e.params[:], e.momentum[:] = start
        e.momentum_started = True
    perm = _C.epoch_permutation(len(y), 5, 0)
    out = e.train_steps(x.reshape(len(y), -1), y, perm, first, last, batch, -1, SGD["lr"], SGD["momentum"], 0.0,
                        SGD["weight_decay"], False)
    return e, out[0]


def check_equals_one_process(trainer, out, model, x, y, what):
    P, D = trainer.stages, trainer.workers
    ref, ref_loss = one_process(model, x, y, BATCH * D)
    params, momentum, started = trainer.engine.strategy_state()
    parallel_assert(rel(params, ref.params) < 1e-5, f"{what}: weights differ from one process: "
                    f"{rel(params, ref.params):.3g}")
    parallel_assert(rel(momentum, ref.momentum) < 1e-5, f"{what}: momentum differs from one process")
    parallel_assert(started, f"{what}: momentum not started")
    parallel_assert(rel(ref.params, one_process(model, x, y, BATCH * D, last=0)[0].params) > 1e-2,
                    "the weights barely moved: the comparison would be empty")
    # the last stage of each replica scores its replica's batch; the other stages score nothing
    last_stage = dist.get_rank() // D == P - 1
    total = np.array([out[0]])
    dist.all_reduce(total)
    parallel_assert(abs(total[0] / D - ref_loss) < 1e-5 * ref_loss and (last_stage or out[0] == 0.0),
                    f"{what}: the loss ({total[0] / D}) is not one process's ({ref_loss}), or a stage before the "
                    f"last scored one ({out[0]})")


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("micro", [1, 2, 8])     # 1: one micro-batch (fewer than the stages); 8: of one example
def test_any_stages_and_micro_batches_equal_one_process(schedule, micro, data):
    x, y = data
    for P in stage_counts():
        t = pipeline(stages=P, micro_batches=micro, schedule=schedule)
        out = t.train_steps(x, y, 0, 0, STEPS)
        check_equals_one_process(t, out, "mlp", x, y, f"P={P} M={micro} {schedule}")


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_lenet5_stages_equal_one_process(schedule, data):
    """Stages cut between convolutions, ReLUs and max-pools (an explicit split cuts right after a
    max-pool, the balanced one elsewhere)."""
    x, y = data
    R = dist.get_world_size()
    splits = [None] + ([[3, 6, 9][:R - 1]] if R > 1 else [])
    for split in splits:
        t = pipeline("lenet5", stages=R, micro_batches=4, schedule=schedule, split=split)
        out = t.train_steps(x, y, 0, 0, STEPS)
        check_equals_one_process(t, out, "lenet5", x, y, f"LeNet-5 P={R} split {t.split} {schedule}")


def test_gpipe_equals_1f1b_bitwise(data):
    x, y = data
    R = dist.get_world_size()
    runs = []
    for schedule in SCHEDULES:
        t = pipeline(stages=R, micro_batches=4, schedule=schedule)
        out = t.train_steps(x, y, 0, 0, STEPS)
        runs.append((t.weights(), out[0]))
    parallel_assert(np.array_equal(runs[0][0], runs[1][0]) and runs[0][1] == runs[1][1],
                    f"GPipe and 1F1B differ: {rel(runs[0][0], runs[1][0]):.3g}")


@pytest.mark.world_size(min=2)
def test_hybrid_equals_allreduce_on_its_replicas(data):
    """P stages x D replicas equals allreduce with D ranks (each replica takes the shard that rank of
    allreduce would)."""
    x, y = data
    R = dist.get_world_size()
    for P in [p for p in stage_counts() if p < R]:
        D = R // P
        group = dist.new_group(list(range(D)))    # every rank calls new_group; D of them train in it
        ref = Trainer(MODELS["mlp"](), batch_size=BATCH, seed=5, group=group, **SGD) if dist.get_rank() < D else None
        if ref is not None:
            ref.train_steps(x, y, 0, 0, STEPS)
        t = pipeline(stages=P, micro_batches=2)
        assert t.workers == D
        t.train_steps(x, y, 0, 0, STEPS)
        want = ref.params.copy() if ref is not None else np.empty(t.engine.num_params, np.float32)
        dist.broadcast(want, 0)
        got = t.weights()
        parallel_assert(rel(got, want) < 1e-5, f"{P} x {D}: differs from allreduce on {D} ranks: {rel(got, want):.3g}")
        dist.destroy_process_group(group)


def layer_floats(model):
    """Floats per example entering each layer, and leaving the last: the MLP's shapes, computed here."""
    sizes = [784]
    for layer in model.layers:
        sizes.append(layer.out_features if hasattr(layer, "out_features") else sizes[-1])
    return sizes


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_stage_holds_and_sends_what_its_schedule_says(schedule, data):
    x, y = data
    R, M, steps = dist.get_world_size(), 4, 3
    t = pipeline(stages=R, micro_batches=M, schedule=schedule)
    out = t.train_steps(x, y, 0, 0, steps)
    st, trace = t.engine.pipeline_stats(), t.engine.pipeline_trace()
    p, lo, hi, mb = dist.get_rank(), t.split[dist.get_rank()], t.split[dist.get_rank() + 1], BATCH // M
    sizes = layer_floats(t.model)
    want_slots = M if schedule == "gpipe" else min(R - p, M)
    parallel_assert(st["slots"] == want_slots and st["peak_slots"] == want_slots,
                    f"{schedule}: stage {p} holds {st['peak_slots']} of {st['slots']} slots, expected {want_slots}")
    # a micro-batch's activations: the stage's input and every layer's output, the gradient of its
    # output, of its input (sent back, stages > 0) and the labels (last stage)
    floats = sum(sizes[lo:hi + 1]) + sizes[hi] + (sizes[lo] if p > 0 else 0)
    want_bytes = 4 * mb * floats + (4 * mb if p == R - 1 else 0)
    parallel_assert(st["slot_bytes"] == want_bytes, f"stage {p}: {st['slot_bytes']} bytes per slot, expected {want_bytes}")
    # the last step's order: gpipe all forwards, then all backwards; 1f1b warm-up, then one of each
    warm = M if schedule == "gpipe" else min(R - 1 - p, M)
    order = [(0, j) for j in range(warm)]
    f, b = warm, 0
    while f < M:
        order += [(0, f), (1, b)]
        f, b = f + 1, b + 1
    order += [(1, j) for j in range(b, M)] + [(2, -1)]
    got = [(kind, micro) for kind, micro, _, _ in trace]
    parallel_assert(got == order, f"{schedule}: stage {p} ran {got}, expected {order}")
    parallel_assert(all(t0 <= t1 for _, _, t0, t1 in trace) and all(a[3] <= b[2] + 1e-9 for a, b in zip(trace, trace[1:])),
                    "the timeline's blocks overlap or run backwards")
    parallel_assert(st["busy_s"] > 0 and st["idle_s"] >= 0 and st["steps"] == steps, f"stats: {st}")
    # sent: activations forward (stages < P-1), their gradients back (stages > 0), M messages each
    sent = (sizes[hi] if p < R - 1 else 0) + (sizes[lo] if p > 0 else 0)
    messages = (M if p < R - 1 else 0) + (M if p > 0 else 0)
    parallel_assert((out[5], out[6]) == (steps * 4 * BATCH * sent, steps * messages),
                    f"stage {p} counted {(out[5], out[6])} (bytes, messages), expected "
                    f"{(steps * 4 * BATCH * sent, steps * messages)}")


def test_checkpoint_resumes_in_any_layout(data, tmp_path_factory):
    """Saved from P = R stages, resumed with 1 stage on R replicas, and the reverse: each continues
    exactly as one process would have (the global batch of 12 is the same in both layouts)."""
    x, y = data
    R = dist.get_world_size()
    path = [str(tmp_path_factory.getbasetemp() / "pipeline.ckpt")]
    dist.broadcast_object_list(path, 0)            # rank 0 writes; every rank names the same file
    layouts = [dict(stages=R, micro_batches=4, batch=12), dict(stages=1, micro_batches=1, batch=12 // R)]
    ref, _ = one_process("mlp", x, y, 12)          # 20 steps of the global batch
    for before, after in (layouts, layouts[::-1]):
        first = pipeline(**before)
        first.train_steps(x, y, 0, 0, STEPS // 2)
        first.step = STEPS // 2
        first.save(path[0])
        second = pipeline(**after).load(path[0])
        parallel_assert(second.step == STEPS // 2, "step not restored")
        parallel_assert(np.array_equal(second.weights(), first.weights()), "resumed weights differ from saved")
        second.train_steps(x, y, 0, STEPS // 2, STEPS)
        got = second.weights()
        parallel_assert(rel(got, ref.params) < 1e-5, f"{before['stages']} stages resumed as {after['stages']}: "
                        f"{rel(got, ref.params):.3g} from an uninterrupted run")
        dist.barrier()                             # nobody reads the file while the next run writes it


def test_evaluation_sees_the_whole_model(data):
    x, y = data
    R = dist.get_world_size()
    t = pipeline(stages=R, micro_batches=2)
    t.train_steps(x, y, 0, 0, STEPS)
    ref, _ = one_process("mlp", x, y, BATCH)
    m = MODELS["mlp"]()
    e = _C.Engine(m.specs(), m.input_shape, 500)
    e.params[:] = ref.params
    loss, correct = e.evaluate(x.reshape(len(y), -1), y, 0, 2000, 500)
    ev = t.evaluate(x[:2000], y[:2000])
    parallel_assert(abs(ev["loss"] - loss / 2000) < 1e-4 and abs(ev["accuracy"] - correct / 2000) < 1e-3,
                    f"evaluate() {ev} differs from one process's ({loss / 2000}, {correct / 2000})")


@pytest.mark.world_size(min=3)
def test_stages_must_divide_the_ranks():
    R = dist.get_world_size()
    P = next(p for p in range(2, R) if R % p != 0)
    with pytest.raises(ValueError, match="must divide"):
        pipeline(stages=P, micro_batches=2)
