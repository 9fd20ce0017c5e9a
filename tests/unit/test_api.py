"""World-size-1 semantics of the public API: what torch.distributed code sees in a plain process."""
import datetime
import warnings

import numpy as np
import pytest

import pydist as dist
from pydist import _C
from unit_helpers import (ALL_PAIRS, DTYPE_IDS, DTYPES, assert_group_works, assert_same_bits, init_default,
                          is_valid, make_values)

ReduceOp = dist.ReduceOp

# NumPy's reference for each op over a stack of per-rank inputs (axis 0). AVG is SUM / world size.
UFUNC = {ReduceOp.SUM: np.add, ReduceOp.PRODUCT: np.multiply, ReduceOp.MIN: np.minimum,
         ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or,
         ReduceOp.BXOR: np.bitwise_xor}
BOOL_UFUNC = {ReduceOp.SUM: np.logical_or, ReduceOp.PRODUCT: np.logical_and, ReduceOp.MIN: np.logical_and,
              ReduceOp.MAX: np.logical_or, ReduceOp.BAND: np.logical_and, ReduceOp.BOR: np.logical_or,
              ReduceOp.BXOR: np.logical_xor}


def numpy_reference(inputs, op):
    """What all_reduce must leave on every rank, from NumPy alone (inputs: one array per rank).

    A fold of the op over the ranks' arrays, as MPI applies it: with one rank that is the rank's own
    array (NumPy's ufunc.reduce would start from the identity and turn -0.0 into 0.0).
    """
    dt = inputs[0].dtype
    ufunc = np.add if op == ReduceOp.AVG else (BOOL_UFUNC if dt == np.bool_ else UFUNC)[op]
    out = inputs[0].copy()
    for other in inputs[1:]:
        out = ufunc(out, other, dtype=dt)
    if op == ReduceOp.AVG:
        out = out / dt.type(len(inputs))
    return out




# ---------------------------------------------------------------------------------------------------
# Queries

def test_world_of_one():
    assert dist.is_initialized() is True
    assert dist.is_available() is True
    assert dist.is_mpi_available() is True
    assert dist.get_rank() == 0
    assert dist.get_world_size() == 1
    assert dist.get_backend() == "mpi"
    assert dist.get_backend() == dist.Backend.MPI


def test_world_group_member():
    world = dist.GroupMember.WORLD
    assert isinstance(world, dist.ProcessGroup)
    assert world.size() == 1 and world.rank() == 0 and world.ranks == [0]
    assert dist.get_rank(group=world) == 0
    assert dist.get_world_size(group=world) == 1
    assert dist.get_backend(world) == "mpi"
    x = np.array([3.0, 4.0])
    dist.all_reduce(x, group=world)
    np.testing.assert_array_equal(x, [3.0, 4.0])


def test_backend_names():
    assert dist.Backend("MPI") == "mpi" == dist.Backend.MPI
    assert dist.Backend.GLOO == "gloo" and dist.Backend.NCCL == "nccl"


# ---------------------------------------------------------------------------------------------------
# ReduceOp and the deprecated reduce_op

def test_reduce_op_members_have_torch_names_and_values():
    # torch.distributed.ReduceOp.RedOpType: SUM 0, AVG 1, PRODUCT 2, MIN 3, MAX 4, BAND 5, BOR 6, BXOR 7
    torch_values = {"SUM": 0, "AVG": 1, "PRODUCT": 2, "MIN": 3, "MAX": 4, "BAND": 5, "BOR": 6, "BXOR": 7}
    assert {op.name: int(op) for op in ReduceOp} == torch_values
    for name, value in torch_values.items():
        assert getattr(ReduceOp, name) == value
        assert getattr(_C, f"OP_{name}") == value


def test_reduce_op_alias_warns_and_works():
    with pytest.warns(FutureWarning, match="reduce_op is deprecated"):
        op = dist.reduce_op.SUM
    assert op is ReduceOp.SUM
    x = np.array([1, 2, 3], dtype=np.int64)
    with pytest.warns(FutureWarning):
        dist.all_reduce(x, op=dist.reduce_op.SUM)
    np.testing.assert_array_equal(x, [1, 2, 3])
    for name in ("PRODUCT", "MIN", "MAX"):
        with pytest.warns(FutureWarning):
            assert getattr(dist.reduce_op, name) is getattr(ReduceOp, name)


def test_reduce_op_alias_has_only_torch_members():
    # torch's reduce_op has SUM, PRODUCT, MIN, MAX only
    assert sorted(dir(dist.reduce_op)) == ["MAX", "MIN", "PRODUCT", "SUM"]
    with pytest.raises(AttributeError, match="AVG"):
        dist.reduce_op.AVG  # noqa: B018


# ---------------------------------------------------------------------------------------------------
# all_reduce: every valid (dtype, op) leaves what NumPy computes for one rank

@pytest.mark.parametrize("dtype, op", ALL_PAIRS)
def test_all_reduce_matches_numpy(dtype, op):
    x = make_values(dtype)  # complex values are finite: NumPy's complex x / 1 is exact for those
    if not is_valid(dtype, op):  # test_errors.py covers these; here only: the table and the call agree
        with pytest.raises(TypeError):
            dist.all_reduce(x, op=op)
        return
    want = numpy_reference([x.copy()], op)
    assert dist.all_reduce(x, op=op) is None
    assert_same_bits(x, want)


@pytest.mark.parametrize("dtype, op", ALL_PAIRS)
def test_all_reduce_async_matches_numpy(dtype, op):
    x = make_values(dtype, seed=1).reshape(-1, 1)
    if not is_valid(dtype, op):
        with pytest.raises(TypeError):
            dist.all_reduce(x, op=op, async_op=True)
        return
    want = numpy_reference([x.copy()], op)
    w = dist.all_reduce(x, op=op, async_op=True)
    assert isinstance(w, dist.Work)
    assert w.wait() is True
    assert w.is_completed() is True
    assert w.is_success() is True
    assert w.exception() is None
    result = w.result()
    assert isinstance(result, list) and len(result) == 1 and result[0] is x
    assert "completed" in repr(w)
    assert_same_bits(x, want)
    assert w.wait() is True  # waiting again on a completed Work is fine


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_all_reduce_sum_of_one_rank_is_identity(dtype):
    x = make_values(dtype, n=101, seed=2)
    before = x.copy()
    dist.all_reduce(x)  # default op is SUM
    assert_same_bits(x, before)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.complex64, np.complex128],
                         ids=lambda d: np.dtype(d).name)
def test_all_reduce_avg_is_x_over_one(dtype):
    x = make_values(dtype, n=64, seed=3)
    want = x / np.dtype(dtype).type(1)
    dist.all_reduce(x, op=ReduceOp.AVG)
    assert_same_bits(x, want)
    # nothing but NaNs may differ from the input, and not even those for quiet NaNs
    assert_same_bits(x, make_values(dtype, n=64, seed=3))


def test_avg_divides_once_sync_and_async():
    # A signalling NaN comes back quiet after a division (x / 1 in NumPy does the same): proof that the
    # division ran, in place, exactly as NumPy's, on both paths.
    snan = np.array([0x7FA00001, 0xFFA00002, 0x3F800000], dtype=np.uint32).view(np.float32)
    with np.errstate(invalid="ignore"):
        want = (snan / np.float32(1)).view(np.uint32)
    for async_op in (False, True):
        x = snan.copy()
        w = dist.all_reduce(x, op=ReduceOp.AVG, async_op=async_op)
        if async_op:
            assert w.wait() is True
            assert w.wait() is True  # a second wait must not divide again
        assert np.array_equal(x.view(np.uint32), want), (x.view(np.uint32), want)


@pytest.mark.parametrize("shape", [(0,), (), (1,), (3, 0, 2), (2, 3, 5)], ids=str)
def test_all_reduce_any_shape(shape):
    x = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    x -= 2.5
    assert isinstance(x, np.ndarray) and x.shape == shape
    before = x.copy()
    dist.all_reduce(x, op=ReduceOp.AVG)
    assert_same_bits(x, before)
    w = dist.all_reduce(x, op=ReduceOp.MAX, async_op=True)
    assert w.wait() is True and w.result()[0] is x
    assert_same_bits(x, before)


def test_all_reduce_large_array():
    x = np.arange(1 << 21, dtype=np.float32)
    before = x.copy()
    dist.all_reduce(x, op=ReduceOp.SUM)
    assert_same_bits(x, before)


def test_all_reduce_accepts_dtype_aliases():
    # dtypes are found by kind and size, so every alias of a type works
    for dt in (np.intc, np.uintc, np.longlong, np.ulonglong, np.short, np.byte, np.ubyte, np.single,
               np.double, np.half, np.csingle, np.cdouble, np.intp, np.uintp):
        x = np.ones(3, dtype=dt)
        dist.all_reduce(x, op=ReduceOp.PRODUCT)
        np.testing.assert_array_equal(x, np.ones(3, dtype=dt))


# ---------------------------------------------------------------------------------------------------
# broadcast and barrier

@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_broadcast_from_self_is_noop(dtype):
    x = make_values(dtype, seed=4)
    before = x.copy()
    assert dist.broadcast(x, src=0) is None
    assert_same_bits(x, before)
    w = dist.broadcast(x, 0, async_op=True)
    assert isinstance(w, dist.Work)
    assert w.wait() is True and w.is_completed() is True
    assert w.result() == [x] and w.result()[0] is x
    assert_same_bits(x, before)


def test_broadcast_root_may_be_read_only():
    x = np.arange(5, dtype=np.int32)
    x.flags.writeable = False
    dist.broadcast(x, src=0)
    w = dist.broadcast(x, src=0, async_op=True)
    assert w.wait() is True
    np.testing.assert_array_equal(x, np.arange(5))


def test_broadcast_empty_and_scalar():
    for x in (np.zeros(0, dtype=np.int8), np.array(2.5), np.zeros((0, 4), dtype=np.complex64)):
        before = x.copy()
        dist.broadcast(x, src=0)
        assert_same_bits(x, before)


def test_barrier():
    assert dist.barrier() is None
    w = dist.barrier(async_op=True)
    assert isinstance(w, dist.Work)
    assert w.wait() is True
    assert w.is_completed() is True
    assert w.result() == []
    for _ in range(100):
        dist.barrier()


def test_wait_accepts_seconds_and_timedelta_on_completed_work():
    x = np.ones(4)
    w = dist.all_reduce(x, async_op=True)
    assert w.wait(5) is True
    assert w.wait(timeout=2.5) is True
    assert w.wait(datetime.timedelta(seconds=1)) is True
    assert w.wait(timeout=None) is True
    assert w.wait(0) is True


def test_work_cannot_be_built_by_hand():
    with pytest.raises(TypeError):
        dist.Work()


# ---------------------------------------------------------------------------------------------------
# init / destroy

def test_second_init_is_value_error_naming_destroy():
    with pytest.raises(ValueError, match=r"destroy_process_group\(\)"):
        dist.init_process_group(backend="mpi")
    assert_group_works()


def test_destroy_then_init_again(restore_group):
    for _ in range(3):
        dist.destroy_process_group()
        assert dist.is_initialized() is False
        assert dist.GroupMember.WORLD is None
        dist.init_process_group(backend="mpi")
        assert dist.is_initialized() is True
        assert_group_works()


def _not_initialized_calls():
    x = np.zeros(3)
    return [
        ("get_rank", lambda: dist.get_rank()),
        ("get_world_size", lambda: dist.get_world_size()),
        ("get_backend", lambda: dist.get_backend()),
        ("barrier", lambda: dist.barrier()),
        ("barrier", lambda: dist.barrier(async_op=True)),
        ("all_reduce", lambda: dist.all_reduce(x)),
        ("all_reduce", lambda: dist.all_reduce(x, op=ReduceOp.MAX, async_op=True)),
        ("broadcast", lambda: dist.broadcast(x, src=0)),
        ("send", lambda: dist.send(x, dst=1)),
        ("recv", lambda: dist.recv(x, src=1)),
        ("recv", lambda: dist.recv(x)),
        ("isend", lambda: dist.isend(x, dst=1)),
        ("irecv", lambda: dist.irecv(x)),
    ]


@pytest.mark.parametrize("index", range(len(_not_initialized_calls())),
                         ids=[name for name, _ in _not_initialized_calls()])
def test_calls_after_destroy_say_to_init(index, restore_group):
    name, call = _not_initialized_calls()[index]
    dist.destroy_process_group()
    with pytest.raises(ValueError) as info:
        call()
    msg = str(info.value)
    assert "init_process_group" in msg, msg
    assert f"{name}()" in msg, f"the message should name {name}(): {msg}"
    # and nothing was left half-initialised
    assert dist.is_initialized() is False
    init_default()
    assert_group_works()


def test_destroy_twice_is_value_error(restore_group):
    dist.destroy_process_group()
    with pytest.raises(ValueError, match="destroy_process_group"):
        dist.destroy_process_group()


@pytest.mark.parametrize("kwargs, arg", [({"world_size": 2}, "world_size"), ({"rank": 1}, "rank"),
                                         ({"world_size": 3, "rank": 0}, "world_size"),
                                         ({"world_size": 1, "rank": 2}, "rank")],
                         ids=["world_size=2", "rank=1", "world_size=3", "rank=2"])
def test_init_with_size_or_rank_mpi_does_not_confirm(kwargs, arg, restore_group):
    dist.destroy_process_group()
    with pytest.raises(ValueError) as info:
        dist.init_process_group(backend="mpi", **kwargs)
    msg = str(info.value)
    assert "init_process_group()" in msg and f"`{arg}`" in msg, msg
    assert dist.is_initialized() is False
    with pytest.raises(ValueError, match="init_process_group"):
        dist.get_rank()
    init_default()
    assert_group_works()


def test_init_with_matching_size_and_rank(restore_group):
    dist.destroy_process_group()
    dist.init_process_group(backend="mpi", world_size=1, rank=0)
    assert dist.get_rank() == 0 and dist.get_world_size() == 1
    assert_group_works()


@pytest.mark.parametrize("backend", ["gloo", "nccl", "GLOO"])
def test_torch_backends_warn_and_run_on_mpi(backend, restore_group):
    dist.destroy_process_group()
    with pytest.warns(UserWarning, match=backend):
        dist.init_process_group(backend=backend)
    assert dist.get_backend() == "mpi"
    assert_group_works()


@pytest.mark.parametrize("backend", ["MPI", None])
def test_mpi_backend_spellings_do_not_warn(backend, restore_group):
    dist.destroy_process_group()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist.init_process_group(backend=backend)
    assert_group_works()


def test_unknown_backend_is_value_error(restore_group):
    with pytest.raises(ValueError, match=r"init_process_group\(\): `backend`.*'tcp'"):
        dist.init_process_group(backend="tcp")
    assert_group_works()  # the check comes before anything is touched
    dist.destroy_process_group()
    with pytest.raises(ValueError, match="`backend`"):
        dist.init_process_group(backend="ucc")
    assert dist.is_initialized() is False


def test_init_with_timeout(restore_group):
    for timeout in (datetime.timedelta(seconds=30), 30, 12.5):
        dist.destroy_process_group()
        dist.init_process_group(backend="mpi", timeout=timeout)
        assert_group_works()


def test_init_method_and_store_are_ignored(restore_group):
    dist.destroy_process_group()
    dist.init_process_group(backend="mpi", init_method="env://", store=None, group_name="g")
    assert_group_works()


# ---------------------------------------------------------------------------------------------------
# torch tensors (torch is a test dependency: these fail, never skip, without it)

TORCH_DTYPES = ["bool", "int8", "uint8", "int16", "int32", "int64", "float16", "float32", "float64",
                "complex64", "complex128"]


@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_torch_tensor_all_reduce(name):
    import torch
    t = (torch.arange(12) % 5).to(getattr(torch, name)).reshape(3, 4)
    before = t.clone()
    ptr = t.data_ptr()
    op = ReduceOp.SUM if "complex" in name else ReduceOp.MAX
    assert dist.all_reduce(t, op=op) is None
    assert t.data_ptr() == ptr and t.dtype == before.dtype and t.shape == before.shape
    assert torch.equal(t, before)
    w = dist.all_reduce(t, async_op=True)
    assert w.wait() is True
    assert w.result()[0] is t
    assert torch.equal(t, before)


def test_torch_tensor_is_written_in_place():
    # At world size 1 AVG divides by 1: a signalling NaN comes back quiet, as torch's own t / 1 does.
    # The change must show in the tensor itself: its memory is viewed, not copied.
    import torch
    bits = torch.tensor([0x7FA00001, 0x3F800000], dtype=torch.int32)
    t = bits.view(torch.float32).clone()
    want = (t / 1).view(torch.int32)
    assert not torch.equal(want, bits)  # this platform quiets NaNs on division
    dist.all_reduce(t, op=ReduceOp.AVG)
    assert torch.equal(t.view(torch.int32), want), t.view(torch.int32)


def test_torch_tensor_requires_grad():
    import torch
    t = torch.tensor([1.0, -2.0, 3.5], requires_grad=True)
    dist.all_reduce(t, op=ReduceOp.SUM)
    assert t.requires_grad and t.is_leaf
    assert torch.equal(t.detach(), torch.tensor([1.0, -2.0, 3.5]))
    (t * 3).sum().backward()
    assert torch.equal(t.grad, torch.full((3,), 3.0))
    # gradient buffers are what data-parallel code reduces
    dist.all_reduce(t.grad, op=ReduceOp.AVG)
    assert torch.equal(t.grad, torch.full((3,), 3.0))


def test_torch_parameter_and_broadcast():
    import torch
    p = torch.nn.Parameter(torch.linspace(-1, 1, 7))
    dist.broadcast(p, src=0)
    dist.all_reduce(p, op=ReduceOp.AVG)
    assert isinstance(p, torch.nn.Parameter)
    assert torch.equal(p.detach(), torch.linspace(-1, 1, 7))
    lin = torch.nn.Linear(4, 3)
    before = [q.detach().clone() for q in lin.parameters()]
    for q in lin.parameters():
        dist.broadcast(q.data, src=0)
        dist.all_reduce(q, async_op=True).wait()
    for q, b in zip(lin.parameters(), before):
        assert torch.equal(q.detach(), b)
