"""torch's modern stack over the pydist backend, under real mpiexec: the functional collectives that
everything in torch.distributed.tensor runs on, DTensor's redistributions on 1-D and 2-D meshes, and
tensor parallelism, each beside the same calls over gloo in the same job (inputs are small integers
where a sum is compared, so every summation order gives the same bits) or beside the unsharded model.

World sizes 2 and 4: a world of one has nothing to redistribute, the 2-D meshes need 4 ranks, and at 3
(oversubscribed on 2 cores, as 4 is) the same calls add torch's start-up time and no case of pydist's
that tests/mpi does not run at 3 already."""
import copy
import itertools

import pytest
import torch
import torch.distributed as tdist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import pydist.torch  # noqa: F401  (registers the backend)
from helpers import parallel_assert

pytestmark = pytest.mark.world_size(sizes=(2, 4))


@pytest.fixture(scope="module")
def gloo():
    """torch's default group on pydist, a gloo group of every rank beside it, and one pydist and one
    gloo group of the first two ranks (a new_group that is not the world)."""
    if not tdist.is_initialized():
        tdist.init_process_group(backend="pydist")
    world_gloo = tdist.new_group(backend="gloo")
    pair_pydist = tdist.new_group([0, 1])
    pair_gloo = tdist.new_group([0, 1], backend="gloo")
    yield world_gloo, pair_pydist, pair_gloo
    tdist.destroy_process_group()


def ints(shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 4, shape, generator=g).to(dtype)


def funcol_calls(x, group, rank, size):
    """Every functional collective on `group` (a ProcessGroup or a 1-D DeviceMesh), waited for through
    wait_tensor: the results in order."""
    out = [funcol.all_reduce(x, "sum", group), funcol.all_reduce(x, "max", group),
           funcol.all_reduce(x, "avg", group),
           funcol.all_gather_tensor(x, 0, group), funcol.all_gather_tensor(x, 1, group),
           funcol.reduce_scatter_tensor(torch.cat([x] * size), "sum", 0, group),
           funcol.all_to_all_single(torch.cat([x] * size), None, None, group),
           funcol.broadcast(x, 1, group)]
    # uneven splits: rank r sends r + 1 rows to every peer
    rows = torch.arange(size * (rank + 1) * 3, dtype=torch.float32).reshape(-1, 3) + 100 * rank
    out.append(funcol.all_to_all_single(rows, [p + 1 for p in range(size)], [rank + 1] * size, group))
    return [funcol.wait_tensor(t) for t in out]


def test_functional_collectives_equal_gloo_on_the_world_a_new_group_and_a_mesh(gloo):
    world_gloo, pair_pydist, pair_gloo = gloo
    rank, size = tdist.get_rank(), tdist.get_world_size()
    x = ints((4, 3), seed=rank)
    cases = [("default group", tdist.group.WORLD, world_gloo, rank, size),
             ("1-D mesh", init_device_mesh("cpu", (size,)), DeviceMesh.from_group(world_gloo, "cpu"), rank, size)]
    if rank < 2:
        cases.append(("new_group [0, 1]", pair_pydist, pair_gloo, rank, 2))
    wrong = []
    for name, ours, theirs, r, n in cases:
        for i, (a, b) in enumerate(zip(funcol_calls(x, ours, r, n), funcol_calls(x, theirs, r, n))):
            if not torch.equal(torch.as_tensor(a), torch.as_tensor(b)):
                wrong.append((name, i))
    parallel_assert(not wrong, f"pydist differs from gloo in {wrong}")


@pytest.mark.world_size(sizes=(4,))
def test_functional_collectives_equal_gloo_on_each_dimension_of_a_2d_mesh(gloo):
    names = ("dp", "tp")
    ours = init_device_mesh("cpu", (2, 2), mesh_dim_names=names)
    theirs = init_device_mesh("cpu", (2, 2), mesh_dim_names=names, backend_override={0: "gloo", 1: "gloo"})
    x = ints((4, 3), seed=tdist.get_rank())
    wrong = []
    for dim in names:
        r = ours.get_local_rank(dim)
        for i, (a, b) in enumerate(zip(funcol_calls(x, (ours, names.index(dim)), r, 2),
                                       funcol_calls(x, (theirs, names.index(dim)), r, 2))):
            if not torch.equal(a, b):
                wrong.append((dim, i))
    parallel_assert(not wrong, f"pydist differs from gloo in {wrong}")


PLACEMENTS = [Shard(0), Shard(1), Replicate(), Partial()]


def source(x, mesh, placements):
    """x as a DTensor laid out by `placements`; a Partial dimension holds x / size on each rank (exact:
    x is a multiple of every mesh dimension's size)."""
    local = x
    for dim, p in enumerate(placements):
        if isinstance(p, Partial):
            local = local / mesh.size(dim)
    if not any(isinstance(p, Partial) for p in placements):
        return distribute_tensor(x, mesh, placements)
    shard = distribute_tensor(local, mesh, [Replicate() if isinstance(p, Partial) else p for p in placements])
    return DTensor.from_local(shard.to_local(), mesh, placements)


def redistribute_all(x, mesh, ndim):
    """Every redistribution from each layout of PLACEMENTS^ndim to each with no Partial (torch allows a
    Partial target only from Partial): {(from, to): (local shard, full tensor)}."""
    targets = [p for p in PLACEMENTS if not isinstance(p, Partial)]
    out = {}
    for src in itertools.product(PLACEMENTS, repeat=ndim):
        for dst in itertools.product(targets, repeat=ndim):
            r = source(x, mesh, list(src)).redistribute(mesh, list(dst))
            out[(src, dst)] = (r.to_local().clone(), r.full_tensor())
    return out


def check_redistributions(x, mesh_pydist, mesh_gloo, ndim):
    ours, theirs = redistribute_all(x, mesh_pydist, ndim), redistribute_all(x, mesh_gloo, ndim)
    wrong = [k for k in ours if not (torch.equal(ours[k][0], theirs[k][0]) and torch.equal(ours[k][1], x))]
    parallel_assert(not wrong and len(ours) == 4 ** ndim * 3 ** ndim, f"{len(wrong)} of {len(ours)}: {wrong[:4]}")


def test_dtensor_redistributes_every_way_on_a_1d_mesh(gloo):
    world_gloo = gloo[0]
    size = tdist.get_world_size()
    x = ints((4 * size, 2 * size), seed=7) * 4   # a multiple of every size: x / size is exact
    check_redistributions(x, init_device_mesh("cpu", (size,)), DeviceMesh.from_group(world_gloo, "cpu"), 1)


@pytest.mark.world_size(sizes=(4,))
def test_dtensor_redistributes_every_way_on_a_2d_mesh(gloo):
    x = ints((8, 8), seed=11) * 4
    ours = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    theirs = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"), backend_override={0: "gloo", 1: "gloo"})
    check_redistributions(x, ours, theirs, 2)


def test_tensor_parallel_mlp_equals_the_unsharded_model(gloo):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    size = tdist.get_world_size()
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(8, 4 * size), nn.ReLU(), nn.Linear(4 * size, 8))
    reference = copy.deepcopy(model)
    mesh = init_device_mesh("cpu", (size,))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(4))
    y, y_ref = model(x), reference(x)
    y.sum().backward()
    y_ref.sum().backward()
    grads = [(p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad, q.grad)
             for p, q in zip(model.parameters(), reference.parameters())]
    ok = torch.allclose(y, y_ref, atol=1e-5) and all(torch.allclose(a, b, atol=1e-5) for a, b in grads)
    parallel_assert(ok, f"output off by {(y - y_ref).abs().max():g}")


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.head_dim = dim // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x):
        b, t, _ = x.shape   # under tensor parallelism, q, k and v hold this rank's heads only
        q, k, v = (w(x).view(b, t, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.w1, self.w2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.w2(nn.functional.gelu(self.w1(x)))


class Block(nn.Module):
    """A pre-norm transformer block, laid out as torch's tensor-parallel tutorial's (Llama's) is."""

    def __init__(self, dim, heads):
        super().__init__()
        self.attention_norm, self.attention = nn.LayerNorm(dim), Attention(dim, heads)
        self.ffn_norm, self.feed_forward = nn.LayerNorm(dim), FeedForward(dim)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


def block_plan(sequence_parallel):
    """torch's plan for such a block: q, k, v and w1 column-wise, wo and w2 row-wise; with sequence
    parallelism the norms (and the residual stream) hold a slice of the sequence each."""
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)
    plan = {f"attention.{w}": ColwiseParallel() for w in ("wq", "wk", "wv")}
    plan["feed_forward.w1"] = ColwiseParallel()
    if not sequence_parallel:
        plan["attention.wo"] = plan["feed_forward.w2"] = RowwiseParallel()
        return plan
    plan["attention.wo"] = plan["feed_forward.w2"] = RowwiseParallel(output_layouts=Shard(1))
    plan["attention_norm"] = plan["ffn_norm"] = SequenceParallel()
    for m in ("attention", "feed_forward"):
        plan[m] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return plan


@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp+sequence-parallel"])
def test_tensor_parallel_transformer_block_equals_the_unsharded_one(gloo, sequence_parallel):
    from torch.distributed.tensor.parallel import parallelize_module
    rank, size = tdist.get_rank(), tdist.get_world_size()
    torch.manual_seed(5)
    reference = Block(dim=8 * size, heads=2 * size)   # two heads per rank
    model = parallelize_module(copy.deepcopy(reference), init_device_mesh("cpu", (size,)), block_plan(sequence_parallel))
    t = 4 * size   # four positions per rank
    x = torch.randn(2, t, 8 * size, generator=torch.Generator().manual_seed(6))
    mine = slice(rank * 4, rank * 4 + 4)
    y_ref = reference(x)
    y = model(x[:, mine] if sequence_parallel else x)   # with sequence parallelism: this rank's slice in and out
    y_ref_mine = y_ref[:, mine] if sequence_parallel else y_ref
    y.sum().backward()
    y_ref.sum().backward()
    bad = [name for (name, p), q in zip(model.named_parameters(), reference.parameters())
           if not torch.allclose(p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad, q.grad, atol=1e-4)]
    parallel_assert(torch.allclose(y, y_ref_mine, atol=1e-5) and not bad,
                    f"output off by {(y - y_ref_mine).abs().max():g}; gradients off: {bad}")


def fsdp_losses(mesh, steps=4, **options):
    """An MLP trained with FSDP2 (fully_shard on each Linear and on the root, AdamW) on `mesh`: the loss
    of every step. Each rank has a batch of its own, the same at every step and on every backend."""
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    for layer in model[::2]:
        fully_shard(layer, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(100 + tdist.get_rank())
    x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
    losses = []
    for _ in range(steps):
        loss = nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


FSDP_OPTIONS = {
    "reshard": {"reshard_after_forward": True},
    "no-reshard": {"reshard_after_forward": False},
    "bf16-params-fp32-reduce": "mixed",
}


@pytest.mark.parametrize("options", list(FSDP_OPTIONS), ids=list(FSDP_OPTIONS))
def test_fsdp2_trains_to_gloos_losses(gloo, options):
    from torch.distributed.fsdp import MixedPrecisionPolicy
    kw = FSDP_OPTIONS[options]
    if kw == "mixed":
        kw = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}
    size = tdist.get_world_size()
    ours = fsdp_losses(init_device_mesh("cpu", (size,)), **kw)
    theirs = fsdp_losses(DeviceMesh.from_group(gloo[0], "cpu"), **kw)
    gap = max(abs(a - b) for a, b in zip(ours, theirs))
    parallel_assert(gap <= 1e-6 and ours[-1] < ours[0], f"losses {ours} against gloo's {theirs}")


@pytest.mark.world_size(sizes=(4,))
def test_hsdp_on_a_2d_mesh_trains_to_gloos_losses(gloo):
    """HSDP: parameters sharded within each pair of ranks ("shard") and replicated across the pairs."""
    names = ("replicate", "shard")
    ours = fsdp_losses(init_device_mesh("cpu", (2, 2), mesh_dim_names=names))
    theirs = fsdp_losses(init_device_mesh("cpu", (2, 2), mesh_dim_names=names, backend_override={0: "gloo", 1: "gloo"}))
    gap = max(abs(a - b) for a, b in zip(ours, theirs))
    parallel_assert(gap <= 1e-6 and ours[-1] < ours[0], f"losses {ours} against gloo's {theirs}")
