"""pydist as a torch.distributed backend (pydist/torch.py), under real mpiexec at every world size:
torch's own calls on a "pydist" default group side by side with a gloo group over the same ranks in
the same job, compared exactly (inputs are small integers, so every summation order gives the same
bits); where gloo lacks a call, against NumPy. Then DistributedDataParallel: an MLP and LeNet-5 train
to the weights one process reaches with the whole batch, bitwise equal on every rank, with one bucket
and with many buckets in flight."""
import numpy as np
import pytest
import torch
import torch.distributed as tdist
import torch.nn as nn

import pydist as dist
import pydist.torch  # noqa: F401  (registers the backend)
from helpers import parallel_assert

OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG"]

# World sizes 1-3: at 4 ranks (oversubscribed on 2 cores) these tests add torch's time, not cases pydist
# has not already run at 4 ranks in the rest of tests/mpi.
pytestmark = pytest.mark.world_size(max=3)


@pytest.fixture(scope="module")
def gloo():
    """torch's default group on pydist (env://, filled in by the import), and a gloo group of every rank
    beside it."""
    if not tdist.is_initialized():
        tdist.init_process_group(backend="pydist")
    yield tdist.new_group(backend="gloo")
    tdist.destroy_process_group()


def test_init_method_pydist_url_and_its_store(gloo):
    """init_method="pydist://": rank, size and a TCPStore hosted by rank 0, from MPI alone."""
    rank, size = dist.get_rank(), dist.get_world_size()
    rendezvous = tdist.rendezvous("pydist://")
    store, r, n = next(rendezvous)
    store.set(f"hello{rank}", str(rank))
    store.wait([f"hello{p}" for p in range(size)])
    seen = [store.get(f"hello{p}").decode() for p in range(size)]
    parallel_assert((r, n) == (rank, size) and seen == [str(p) for p in range(size)], f"{r} {n} {seen}")


def ints(rank, shape, dtype, seed=0):
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randint(1, 4, shape, generator=g).to(dtype)


def test_backend_is_pydist(gloo):
    store = tdist.distributed_c10d._get_default_store()   # a real store for code that uses one
    store.set(f"rank{dist.get_rank()}", "here")
    store.wait([f"rank{p}" for p in range(dist.get_world_size())])
    ok = tdist.get_backend() == "pydist" and tdist.get_rank() == dist.get_rank()
    ok &= tdist.get_world_size() == dist.get_world_size() and tdist.get_backend(gloo) == "gloo"
    parallel_assert(ok, f"{tdist.get_backend()}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8,
                                   torch.float16, torch.bfloat16])
def test_all_reduce_every_op_equals_gloo(gloo, dtype):
    rank, wrong = tdist.get_rank(), []
    for name in OPS:
        op = getattr(tdist.ReduceOp, name)
        if name in ("BAND", "BOR", "BXOR") and dtype.is_floating_point or name == "AVG" and not dtype.is_floating_point:
            continue   # not defined for the dtype (pydist raises TypeError, as for NumPy arrays)
        x = ints(rank, (7,), dtype, seed=OPS.index(name))
        ours = x.clone()
        tdist.all_reduce(ours, op=op)
        if name == "AVG":   # gloo has no AVG: SUM / size, as torch defines it
            want = x.clone()
            tdist.all_reduce(want, op=tdist.ReduceOp.SUM, group=gloo)
            want /= tdist.get_world_size()
        else:
            want = x.clone()
            tdist.all_reduce(want, op=op, group=gloo)
        if not torch.equal(ours, want):
            wrong.append((name, ours.tolist(), want.tolist()))
    parallel_assert(not wrong, f"{wrong[:3]}")


def test_collectives_equal_gloo(gloo):
    rank, size = tdist.get_rank(), tdist.get_world_size()
    wrong = []

    def same(name, ours, theirs):
        if not all(torch.equal(a, b) for a, b in zip(ours, theirs)):
            wrong.append(name)

    for root in range(size):
        a, b = ints(rank, (5,), torch.float32, 1), ints(rank, (5,), torch.float32, 1)
        tdist.broadcast(a, root)
        tdist.broadcast(b, root, group=gloo)
        same(f"broadcast from {root}", [a], [b])
        a, b = ints(rank, (5,), torch.int64, 2), ints(rank, (5,), torch.int64, 2)
        tdist.reduce(a, root, op=tdist.ReduceOp.MAX)
        tdist.reduce(b, root, op=tdist.ReduceOp.MAX, group=gloo)
        if rank == root:
            same(f"reduce to {root}", [a], [b])
        x = ints(rank, (3,), torch.float64, 3)
        ga = [torch.empty(3, dtype=torch.float64) for _ in range(size)] if rank == root else None
        gb = [torch.empty(3, dtype=torch.float64) for _ in range(size)] if rank == root else None
        tdist.gather(x, ga, dst=root)
        tdist.gather(x, gb, dst=root, group=gloo)
        if rank == root:
            same(f"gather to {root}", ga, gb)
        parts = [ints(p, (2, 2), torch.int32, 4) for p in range(size)]
        sa, sb = torch.empty(2, 2, dtype=torch.int32), torch.empty(2, 2, dtype=torch.int32)
        tdist.scatter(sa, parts if rank == root else None, src=root)
        tdist.scatter(sb, parts if rank == root else None, src=root, group=gloo)
        same(f"scatter from {root}", [sa], [sb])

    x = ints(rank, (4,), torch.float32, 5)
    la, lb = [torch.empty(4) for _ in range(size)], [torch.empty(4) for _ in range(size)]
    tdist.all_gather(la, x)
    tdist.all_gather(lb, x, group=gloo)
    same("all_gather", la, lb)
    ta, tb = torch.empty(4 * size), torch.empty(4 * size)
    tdist.all_gather_into_tensor(ta, x)
    tdist.all_gather_into_tensor(tb, x, group=gloo)
    same("all_gather_into_tensor", [ta], [tb])

    inp = ints(rank, (2 * size, 3), torch.float32, 6)
    oa, ob = torch.empty(2 * size, 3), torch.empty(2 * size, 3)
    tdist.all_to_all_single(oa, inp)
    tdist.all_to_all_single(ob, inp, group=gloo)
    same("all_to_all_single", [oa], [ob])
    splits_in = [(rank + p) % 3 for p in range(size)]   # rank r sends (r + p) % 3 rows to p
    splits_out = [(p + rank) % 3 for p in range(size)]
    src = ints(rank, (sum(splits_in), 2), torch.int64, 7)
    va = torch.empty(sum(splits_out), 2, dtype=torch.int64)
    vb = torch.empty_like(va)
    tdist.all_to_all_single(va, src, splits_out, splits_in)
    tdist.all_to_all_single(vb, src, splits_out, splits_in, group=gloo)
    same("all_to_all_single with splits", [va], [vb])
    ins = [ints(rank, (3,), torch.float32, 8 + p) for p in range(size)]
    outs_a = [torch.empty(3) for _ in range(size)]
    outs_b = [torch.empty(3) for _ in range(size)]
    tdist.all_to_all(outs_a, ins)
    tdist.all_to_all(outs_b, ins, group=gloo)
    same("all_to_all", outs_a, outs_b)
    # Blocks of different sizes (gloo refuses them; torch's API allows them): against what each peer sent.
    ins = [ints(rank, (p + 1,), torch.float32, 30 + p) for p in range(size)]
    outs = [torch.empty(rank + 1) for _ in range(size)]
    tdist.all_to_all(outs, ins)
    same("all_to_all, uneven", outs, [ints(q, (rank + 1,), torch.float32, 30 + rank) for q in range(size)])
    parallel_assert(not wrong, f"{wrong}")


def test_reduce_scatter_against_numpy(gloo):
    rank, size = tdist.get_rank(), tdist.get_world_size()
    blocks = [ints(rank, (3,), torch.float32, 9 + p) for p in range(size)]
    out = torch.empty(3)
    tdist.reduce_scatter(out, blocks, op=tdist.ReduceOp.SUM)
    want = sum(ints(r, (3,), torch.float32, 9 + rank).numpy() for r in range(size))
    whole = torch.cat([ints(rank, (2,), torch.float64, 20 + p) for p in range(size)])
    single = torch.empty(2, dtype=torch.float64)
    tdist.reduce_scatter_tensor(single, whole, op=tdist.ReduceOp.MAX)
    want_single = np.max([ints(r, (2,), torch.float64, 20 + rank).numpy() for r in range(size)], axis=0)
    parallel_assert(np.array_equal(out.numpy(), want) and np.array_equal(single.numpy(), want_single),
                    f"{out} {want} {single} {want_single}")


def test_tensors_pydist_needs_to_adapt(gloo):
    """Non-contiguous tensors (copied in and back), tensors that require grad, bfloat16 moved as raw
    16-bit words and reduced by pydist's own ops; PREMUL_SUM is refused with a clear error."""
    rank, size = tdist.get_rank(), tdist.get_world_size()
    base = torch.zeros(4, 3)
    column = base[:, 1]
    column += rank + 1
    tdist.all_reduce(column)
    ok = torch.all(base[:, 1] == size * (size + 1) / 2) and torch.all(base[:, 0] == 0)
    w = torch.full((3,), float(rank), requires_grad=True)
    tdist.broadcast(w, 0)
    ok &= torch.all(w == 0) and w.requires_grad
    bf = torch.full((5,), rank + 0.5, dtype=torch.bfloat16)
    gathered = [torch.empty(5, dtype=torch.bfloat16) for _ in range(size)]
    tdist.all_gather(gathered, bf)
    ok &= all(torch.all(g == p + 0.5) for p, g in enumerate(gathered))
    strided = torch.full((4, 2), rank + 1.0, dtype=torch.bfloat16)[:, 0]
    tdist.all_reduce(strided, op=tdist.ReduceOp.MAX)
    ok &= bool(torch.all(strided == size))
    with pytest.raises((ValueError, RuntimeError), match="PREMUL_SUM|not support"):
        tdist.all_reduce(torch.ones(2), op=tdist._make_nccl_premul_sum(2.0))
    parallel_assert(bool(ok), f"{base} {w} {gathered}")


def test_async_and_point_to_point(gloo):
    rank, size = tdist.get_rank(), tdist.get_world_size()
    works = [tdist.all_reduce(torch.full((3,), float(k + rank)), async_op=True) for k in range(6)]
    ok = all(w.wait() for w in works) and all(w.is_completed() for w in works)
    results = [w.result()[0] for w in works]
    ok &= all(torch.all(t == sum(k + r for r in range(size))) for k, t in enumerate(results))
    if size > 1:
        right, left = (rank + 1) % size, (rank - 1) % size
        got = torch.zeros(2)
        ops = [tdist.P2POp(tdist.isend, torch.full((2,), float(rank)), right),
               tdist.P2POp(tdist.irecv, got, left)]
        for req in tdist.batch_isend_irecv(ops):
            req.wait()
        ok &= bool(torch.all(got == left))
        if rank == 0:
            anyone = torch.zeros(1)
            senders = sorted(tdist.recv(anyone) for _ in range(size - 1))
            ok &= senders == list(range(1, size))
        else:
            tdist.send(torch.tensor([float(rank)]), 0)
    objs = [None]
    tdist.broadcast_object_list(objs if rank else [{"step": 3}], src=0)
    gathered = [None] * size
    tdist.all_gather_object(gathered, ("rank", rank))
    ok &= gathered == [("rank", r) for r in range(size)] and (rank == 0 or objs == [{"step": 3}])
    at_root = [None] * size if rank == 0 else None
    tdist.gather_object({"from": rank}, at_root, dst=0)
    mine = [None]
    tdist.scatter_object_list(mine, [f"to {r}" for r in range(size)] if rank == 0 else None, src=0)
    ok &= mine == [f"to {rank}"] and (rank != 0 or at_root == [{"from": r} for r in range(size)])
    tdist.barrier()
    parallel_assert(bool(ok), f"{results} {gathered} {objs}")


@pytest.mark.parametrize("small_bytes", [65536, 0], ids=["shm", "mpi"])
def test_bfloat16_rounds_each_step_like_torch(gloo, small_bytes):
    """bfloat16 values that are not small integers: every pairwise step rounds to nearest even, as
    torch's own bfloat16 arithmetic does. Through the small collectives in shared memory the steps run
    in rank order, so the result is bitwise torch's rank-order sum; through MPI (which may order the
    steps differently) it is within the rounding of those steps, and bitwise the same on every rank."""
    rank, size = tdist.get_rank(), tdist.get_world_size()
    old = dist._C.set_shm_small_bytes(small_bytes)
    try:
        g = torch.Generator().manual_seed(11)
        every = [torch.randn(1000, generator=g).to(torch.bfloat16) for _ in range(size)]
        wrong = []
        for name in ("SUM", "PRODUCT", "MIN", "MAX", "AVG"):
            ours = every[rank].clone()
            tdist.all_reduce(ours, op=getattr(tdist.ReduceOp, name))
            want = every[0]
            for other in every[1:]:
                step = {"SUM": torch.add, "AVG": torch.add, "PRODUCT": torch.mul, "MIN": torch.minimum,
                        "MAX": torch.maximum}[name]
                want = step(want, other)   # bfloat16 in, bfloat16 out: rounded at each step
            if name == "AVG":
                want = want / size
            everyone = [torch.empty_like(ours) for _ in range(size)]
            tdist.all_gather(everyone, ours)
            same = all(torch.equal(everyone[0], o) for o in everyone)
            close = torch.allclose(ours.float(), want.float(), rtol=size * 2 ** -7, atol=size * 2 ** -7)
            exact = torch.equal(ours, want)
            if not same or not close or (small_bytes and not exact):
                wrong.append((name, same, close, exact))
    finally:
        dist._C.set_shm_small_bytes(old)
    parallel_assert(not wrong, f"{wrong}")


@pytest.mark.parametrize("algorithm", ["mpi", "ring", "shm"])
def test_pydist_own_all_reduce_takes_bfloat16_tensors(gloo, algorithm):
    """pydist's own API on torch bfloat16 tensors (NumPy has none): every algorithm reduces them with
    bfloat16's rounding, bitwise the same on every rank; the shared-memory one in rank order, so
    bitwise torch's rank-order sum."""
    rank, size = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(12)
    every = [torch.randn(70000, generator=g).to(torch.bfloat16) for _ in range(size)]
    ours = every[rank].clone()
    dist.all_reduce(ours, algorithm=algorithm)
    want = every[0]
    for other in every[1:]:
        want = want + other
    everyone = [torch.empty_like(ours) for _ in range(size)]
    dist.all_gather(everyone, ours)
    same = all(torch.equal(everyone[0], o) for o in everyone)
    close = torch.allclose(ours.float(), want.float(), rtol=size * 2 ** -7, atol=size * 2 ** -7)
    exact = torch.equal(ours, want)
    parallel_assert(same and close and (exact or algorithm != "shm"), f"{same} {close} {exact}")


def test_monitored_barrier(gloo):
    """torch.distributed.monitored_barrier on the pydist group (torch 2.13's own refuses every backend
    but gloo; importing pydist.torch puts one in its place that runs pydist's) and, unchanged, on gloo.
    A rank that never comes: tests/unit/test_torch_backend_jobs.py."""
    import datetime
    with pytest.raises(ValueError, match="GLOO"):
        pydist.torch._torch_monitored_barrier()   # torch's own, for the record
    tdist.monitored_barrier()
    tdist.monitored_barrier(timeout=datetime.timedelta(seconds=60), wait_all_ranks=True)
    tdist.monitored_barrier(group=gloo, timeout=datetime.timedelta(seconds=60))
    parallel_assert(tdist.monitored_barrier is pydist.torch.monitored_barrier, "not in place")


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64, torch.int64, torch.bfloat16])
def test_all_gather_coalesced_equals_gloo(gloo, dtype):
    """torch.distributed.all_gather_coalesced: tensors of several shapes (an empty one too) in one call,
    on the default group and on a subgroup, the same as gloo's; its output lists checked."""
    rank, size = dist.get_rank(), dist.get_world_size()
    shapes = [(1,), (2, 3), (0,), (3, 1, 2)]
    inputs = [ints(rank, shape, torch.float32, seed=i).to(dtype) for i, shape in enumerate(shapes)]
    results = []
    for group in (None, gloo):
        outs = [[torch.full(shape, -1).to(dtype) for shape in shapes] for _ in range(size)]
        tdist.all_gather_coalesced(outs, inputs, group=group)
        results.append(outs)
    expected = [[ints(r, shape, torch.float32, seed=i).to(dtype) for i, shape in enumerate(shapes)] for r in range(size)]
    ok = all(torch.equal(a, b) and torch.equal(a, e) for ra, rb, re_ in zip(*results, expected)
             for a, b, e in zip(ra, rb, re_))
    members = sorted({0, size - 1})
    sub = tdist.new_group(members)   # every rank calls new_group; only members gather
    if rank in members:
        outs = [[torch.empty(shape).to(dtype) for shape in shapes] for _ in members]
        work = tdist.all_gather_coalesced(outs, inputs, group=sub, async_op=True)
        work.wait()
        ok &= all(torch.equal(a, e) for ra, re_ in zip(outs, [expected[m] for m in members]) for a, e in zip(ra, re_))
    tdist.destroy_process_group(sub)
    parallel_assert(ok, "all_gather_coalesced differs from gloo's or from the inputs")


def test_sparse_all_reduce_equals_gloo(gloo):
    """A sparse COO all-reduce (SUM, as gloo's): entries that overlap across ranks and within a rank,
    values with dense dimensions, a rank with no entries; the same sum as gloo's and as the dense
    tensors' sum. Anything but SUM, or a sparse tensor in another collective, is refused."""
    rank, size = dist.get_rank(), dist.get_world_size()

    def sparse(r):
        g = torch.Generator().manual_seed(r)
        nnz = 0 if r == 1 else 5
        indices = torch.randint(0, 4, (2, nnz), generator=g)   # duplicates on purpose
        values = torch.randint(1, 5, (nnz, 3), generator=g).float()
        return torch.sparse_coo_tensor(indices, values, (4, 4, 3))

    ours, theirs = sparse(rank), sparse(rank)
    tdist.all_reduce(ours)
    tdist.all_reduce(theirs, group=gloo)
    dense = sum(sparse(r).to_dense() for r in range(size))
    ok = ours.is_sparse and torch.equal(ours.to_dense(), theirs.to_dense()) and torch.equal(ours.to_dense(), dense)
    with pytest.raises(ValueError, match="summed only"):
        tdist.all_reduce(sparse(rank), op=tdist.ReduceOp.MAX)
    with pytest.raises(TypeError, match="sparse"):
        tdist.broadcast(sparse(rank), src=0)
    parallel_assert(ok, f"{ours.to_dense()} {theirs.to_dense()}")


@pytest.mark.world_size(min=3, max=3)
def test_new_group_translates_ranks(gloo):
    rank = tdist.get_rank()
    members = [0, 2]
    g = tdist.new_group(members, backend="pydist")
    ok = True
    if rank in members:
        ok &= tdist.get_rank(g) == members.index(rank) and tdist.get_world_size(g) == 2
        x = torch.full((2,), float(rank))
        tdist.broadcast(x, src=2, group=g)   # a global rank, as torch takes it
        ok &= bool(torch.all(x == 2))
        y = torch.full((2,), float(rank + 1))
        tdist.all_reduce(y, group=g)
        ok &= bool(torch.all(y == 1 + 3))
    parallel_assert(bool(ok), f"rank {rank}")


class LeNet5(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84),
                                        nn.ReLU(), nn.Linear(84, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


def mlp():
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 10))


def train(model, batches, lr=0.05):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for x, y in batches:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("make,shape,bucket_mb", [(mlp, (20,), 25), (LeNet5, (1, 28, 28), 25),
                                                  (LeNet5, (1, 28, 28), 0.01)],
                         ids=["mlp", "lenet5", "lenet5-many-buckets"])
def test_ddp_equals_one_process_with_the_whole_batch(gloo, make, shape, bucket_mb):
    rank, size = tdist.get_rank(), tdist.get_world_size()
    per_rank, steps = 4, 3
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(size * per_rank, *shape, generator=g), torch.randint(0, 10, (size * per_rank,),
                                                                                  generator=g)) for _ in range(steps)]
    torch.manual_seed(0)
    alone = make()
    torch.manual_seed(0)
    model = make()
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
    mine = [(x[rank * per_rank:(rank + 1) * per_rank], y[rank * per_rank:(rank + 1) * per_rank]) for x, y in batches]
    ours = train(ddp, mine)
    want = train(alone, batches)
    rel = float((ours - want).abs().max() / want.abs().max())
    everyone = [torch.empty_like(ours) for _ in range(size)]
    tdist.all_gather(everyone, ours)
    bitwise = all(torch.equal(everyone[0], p) for p in everyone)
    # The buckets were in flight: DDP got futures of all-reduces still running on the group's worker
    # thread, or the worker held more than one call at a time (at 1 rank each finishes at once, so only
    # from 2 ranks on). Which of the two shows depends on how fast the small all-reduces are: once the
    # worker finished every bucket before DDP asked for its future ([0, 6] at 2 ranks, bec9d0f).
    worker = tdist.distributed_c10d._get_default_group()._worker
    seen = torch.tensor([worker.handed_out_running, worker.most_pending], dtype=torch.int64)
    tdist.all_reduce(seen, op=tdist.ReduceOp.MAX)
    flight = size == 1 or (seen[0] > 0 and bucket_mb >= 1) or seen[1] >= 2
    parallel_assert(rel < 1e-5 and bitwise and flight,
                    f"relative difference {rel:.2e}, bitwise equal on every rank: {bitwise}, "
                    f"futures handed out running / most in flight: {seen.tolist()}")


# ---------------------------------------------------------------------------------------------------
# Torch groups of the whole world: each is its own pydist group (issue 25, item 1). Before, every torch
# group of the whole world was pydist's default group, so the default group's worker thread and
# g2's ran collectives on one communicator and one shared-memory channel: sums mixed, or DistError.
# tests/unit/test_torch_backend_jobs.py runs these on every path (PYDIST_SHM_SMALL_BYTES=0,
# PYDIST_SHM_BYTES=0, PYDIST_PERSISTENT_BYTES=0).

def whole_world_groups(n):
    size = tdist.get_world_size()
    groups = [tdist.new_group(list(range(size))) for _ in range(n)]
    handles = {tdist.distributed_c10d._get_default_group()._group} | {g._group for g in groups}
    return groups, len(handles) == n + 1 and None in handles


def test_whole_world_group_and_default_group_never_mix(gloo):
    """The issue's reproduction: a on the default group and b on new_group(all ranks), both async."""
    rank, size = tdist.get_rank(), tdist.get_world_size()
    before = dist._C.live_groups()
    (g2,), distinct = whole_world_groups(1)
    wrong = []
    for k in range(200):
        a = torch.full((8,), float(1 + rank))
        b = torch.full((8,), float(100 * (1 + rank)))
        wa = tdist.all_reduce(a, async_op=True)
        wb = tdist.all_reduce(b, group=g2, async_op=True)
        wa.wait()
        wb.wait()
        want_a = np.sum([np.full(8, 1.0 + r) for r in range(size)], axis=0)
        want_b = np.sum([np.full(8, 100.0 * (1 + r)) for r in range(size)], axis=0)
        if not (np.array_equal(a.numpy(), want_a) and np.array_equal(b.numpy(), want_b)):
            wrong.append((k, a[0].item(), b[0].item()))
    tdist.destroy_process_group(g2)   # frees its communicator (ProcessGroupPydist.shutdown)
    freed = dist._C.live_groups() == before
    parallel_assert(distinct and not wrong and freed,
                    f"own pydist groups: {distinct}; wrong at {wrong[:3]}; freed at destroy: {freed}")


@pytest.mark.parametrize("numel", [8, 3000, 70000], ids=["small", "mid", "large"])
def test_whole_world_groups_from_several_threads(gloo, numel):
    """Three threads, each on its own group of every rank (the default group and two new_group(all)),
    each mixing blocking and async all_reduces, broadcasts and all_gathers: every result exactly NumPy's.
    Sizes on each side of the small/shared-memory/persistent thresholds."""
    import threading
    rank, size = tdist.get_rank(), tdist.get_world_size()
    groups, distinct = whole_world_groups(2)
    wrong = []

    def hammer(t, group, iterations):
        for k in range(iterations):
            seed = 1000 * t + k
            x = torch.from_numpy(np.full(numel, float(seed % 7 + rank + 1)))
            want = np.sum([np.full(numel, float(seed % 7 + r + 1)) for r in range(size)], axis=0)
            if k % 2:
                tdist.all_reduce(x, group=group, async_op=True).wait()
            else:
                tdist.all_reduce(x, group=group)
            y = torch.from_numpy(np.full(numel, float(rank * 10 + t)))
            if k % 3:
                tdist.broadcast(y, src=size - 1, group=group, async_op=True).wait()
            else:
                tdist.broadcast(y, src=size - 1, group=group)
            out = [torch.empty(4, dtype=torch.int64) for _ in range(size)]
            tdist.all_gather(out, torch.full((4,), 100 * t + rank, dtype=torch.int64), group=group)
            ok = np.array_equal(x.numpy(), want) and np.all(y.numpy() == (size - 1) * 10 + t) and \
                all(np.all(o.numpy() == 100 * t + r) for r, o in enumerate(out))
            if not ok:
                wrong.append((t, k))

    def run(t, group, iterations):
        try:
            hammer(t, group, iterations)
        except BaseException as e:   # recorded: every rank must see the failure, not hang
            wrong.append((t, repr(e)))

    iterations = 60 if numel < 10000 else 15
    threads = [threading.Thread(target=run, args=(t, g, iterations)) for t, g in enumerate([None] + groups)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for g in groups:
        tdist.destroy_process_group(g)
    parallel_assert(distinct and not wrong, f"own pydist groups: {distinct}; wrong: {wrong[:3]}")


def test_ddp_on_a_whole_world_group_beside_the_default_group(gloo):
    """DistributedDataParallel on new_group(all ranks) while another thread runs async all-reduces on the
    default group the whole time: DDP's weights are what one process reaches with the whole batch,
    bitwise equal on every rank, and every default-group sum is exactly NumPy's."""
    import threading
    rank, size = tdist.get_rank(), tdist.get_world_size()
    (g2,), distinct = whole_world_groups(1)
    per_rank, steps = 4, 4
    g = torch.Generator().manual_seed(6)
    batches = [(torch.randn(size * per_rank, 1, 28, 28, generator=g),
                torch.randint(0, 10, (size * per_rank,), generator=g)) for _ in range(steps)]
    torch.manual_seed(0)
    alone = LeNet5()
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(LeNet5(), process_group=g2, bucket_cap_mb=0.01)
    mine = [(x[rank * per_rank:(rank + 1) * per_rank], y[rank * per_rank:(rank + 1) * per_rank]) for x, y in batches]
    # The default group's traffic: as many rounds on every rank, so it runs through the whole training.
    wrong, rounds = [], 150

    def beside():
        try:
            for k in range(rounds):
                a = torch.full((8,), float(k + rank))
                tdist.all_reduce(a, async_op=True).wait()
                if not np.array_equal(a.numpy(), np.full(8, float(sum(k + r for r in range(size))))):
                    wrong.append(k)
        except BaseException as e:
            wrong.append(repr(e))

    t = threading.Thread(target=beside)
    t.start()
    ours = train(ddp, mine)
    t.join()
    want = train(alone, batches)
    rel = float((ours - want).abs().max() / want.abs().max())
    everyone = [torch.empty_like(ours) for _ in range(size)]
    tdist.all_gather(everyone, ours)
    bitwise = all(torch.equal(everyone[0], p) for p in everyone)
    tdist.destroy_process_group(g2)
    parallel_assert(distinct and rel < 1e-5 and bitwise and not wrong,
                    f"own pydist groups: {distinct}, relative difference {rel:.2e}, bitwise equal on every "
                    f"rank: {bitwise}, default group wrong: {wrong[:3]}")
