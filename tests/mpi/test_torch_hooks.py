"""pydist.torch.hooks: the compressors as DDP comm hooks, at 1-3 ranks, against torch's own hooks where
torch has the same math (fp16_compress_hook; bf16_compress_hook's function, whose NCCL check refuses
the CPU; powerSGD_hook where its answer does not depend on its
random start: gradients whose sum has rank <= K, which PowerSGD reproduces exactly), and against DDP
without a hook. torch's powerSGD_hook itself runs on pydist here too: its callbacks all-reduce and wait
on the group's worker thread (that deadlocked before the worker ran such calls inline)."""
import numpy as np
import pytest
import torch
import torch.distributed as tdist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

import pydist as dist
import pydist.torch
from pydist.torch import hooks
from helpers import parallel_assert

pytestmark = pytest.mark.world_size(max=3)


@pytest.fixture(scope="module", autouse=True)
def torch_group():
    # pydist:// agrees a fresh port over MPI: env:// would reuse the port of a default group an earlier
    # test file destroyed, and a rank could reach that closing store and wait for it forever
    if not tdist.is_initialized():
        tdist.init_process_group(backend="pydist", init_method="pydist://")
    yield


def train(hook=None, state=None, steps=4, batch=8):
    """An MLP under DDP from the same start on every rank, each rank its own batches; its weights."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 30), nn.ReLU(), nn.Linear(30, 5))
    ddp = nn.parallel.DistributedDataParallel(model)
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(10 + dist.get_rank())
    for _ in range(steps):
        x, y = torch.randn(batch, 20, generator=g), torch.randint(0, 5, (batch,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def all_same(a):
    every = [np.empty_like(a) for _ in range(dist.get_world_size())]
    dist.all_gather(every, np.ascontiguousarray(a))
    return all(np.array_equal(e, a) for e in every)


def test_fp16_equals_torchs_fp16_hook():
    plain = train()
    ours = train(hooks.fp16())
    theirs = train(default_hooks.fp16_compress_hook)
    parallel_assert(rel(ours, theirs) < 1e-4, f"fp16: {rel(ours, theirs):.3g} from torch's fp16_compress_hook")
    # torch sums in float16; we sum in float32, so we are at least as close to no compression
    parallel_assert(rel(ours, plain) <= rel(theirs, plain) * 1.5 + 1e-7, f"fp16: {rel(ours, plain):.3g} from "
                    f"no hook, torch's {rel(theirs, plain):.3g}")
    parallel_assert(all_same(ours), "replicas differ")


def torch_bf16_hook(state, bucket):
    """torch's bf16_compress_hook without its device check (it refuses anything but NCCL and XCCL): the
    same function torch's fp16 hook is, with bfloat16."""
    return default_hooks._compress_hook(torch.bfloat16, state, bucket)


def test_bf16_equals_torchs_bf16_hook():
    plain = train()
    ours = train(hooks.bf16())
    theirs = train(torch_bf16_hook)
    # bfloat16 keeps 8 bits of mantissa where float16 keeps 11: 8x fp16's tolerance
    parallel_assert(rel(ours, theirs) < 1e-3, f"bf16: {rel(ours, theirs):.3g} from torch's bf16 hook")
    parallel_assert(rel(ours, plain) <= rel(theirs, plain) * 1.5 + 1e-7, f"bf16: {rel(ours, plain):.3g} from "
                    f"no hook, torch's {rel(theirs, plain):.3g}")
    parallel_assert(all_same(ours), "replicas differ")


def test_powersgd_equals_torchs_powersgd_hook_when_exact():
    # one example a rank: each rank's weight gradients have rank 1, their sum rank <= 3 <= K = 4
    plain = train(batch=1)
    ours = train(hooks.powersgd(4), batch=1)
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=4, start_powerSGD_iter=2,
                                        min_compression_rate=0.5)
    theirs = train(powerSGD_hook.powerSGD_hook, state, batch=1)
    parallel_assert(rel(theirs, plain) < 1e-5, f"torch's PowerSGD is not exact here: {rel(theirs, plain):.3g}")
    parallel_assert(rel(ours, theirs) < 1e-5, f"powersgd: {rel(ours, theirs):.3g} from torch's powerSGD_hook")
    parallel_assert(all_same(ours), "replicas differ")


@pytest.mark.parametrize("make", [hooks.bf16, lambda: hooks.topk(0.1), hooks.sign, lambda: hooks.powersgd(2)],
                         ids=["bf16", "topk", "sign", "powersgd"])
def test_every_hook_trains_the_replicas_alike(make):
    plain = train(steps=8)
    ours = train(make(), steps=8)
    parallel_assert(all_same(ours), "replicas differ")
    start = train(steps=0)
    parallel_assert(rel(ours, start) > 0.1 * rel(plain, start), "the weights barely moved")
    parallel_assert(rel(ours, plain) < 0.5, f"{rel(ours, plain):.3g} from no compression")


def test_bad_arguments_are_clear():
    for bad in (0, -1, 1.5, float("nan"), "0.1", True):
        with pytest.raises(ValueError, match="ratio"):
            hooks.topk(bad)
    for bad in (0, -2, 2.5, True):
        with pytest.raises(ValueError, match="rank"):
            hooks.powersgd(bad)
    gloo = tdist.new_group(backend="gloo")
    with pytest.raises(ValueError, match="backend \"pydist\""):
        hooks._pydist_group(gloo, "fp16")
    # every rank's gloo connections made before any rank closes its own: a rank that destroyed the group
    # at once could close a connection its peer was still setting up ("Connection closed by peer")
    tdist.barrier(group=gloo)
    tdist.destroy_process_group(gloo)
