"""Every bad argument: the exception type, a message that names the function and the argument, and a
default group that still works afterwards."""
import json
import re

import numpy as np
import pytest

import pydist as dist
from pydist import _C
from unit_helpers import ALL_PAIRS, DTYPES, assert_group_works, init_default, is_valid, run_script

ReduceOp = dist.ReduceOp


@pytest.fixture(autouse=True)
def group_still_works():
    """After each error case the default group still gives the right answer."""
    yield
    assert_group_works()


def check(exc_type, fn, arg, call, *also):
    """call() raises exc_type whose message names `fn()` and `` `arg` `` (and contains each of `also`)."""
    with pytest.raises(exc_type) as info:
        call()
    assert type(info.value) is exc_type, f"{type(info.value).__name__}: {info.value}"
    msg = str(info.value)
    assert f"{fn}()" in msg, f"message does not name {fn}(): {msg}"
    if arg is not None:
        assert f"`{arg}`" in msg, f"message does not name `{arg}`: {msg}"
    for text in also:
        assert text in msg, f"message lacks {text!r}: {msg}"
    return msg


def run_python(script):
    """Run `script` in a fresh singleton interpreter (hard timeout); its stdout."""
    proc = run_script(script)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def readonly(a):
    a.flags.writeable = False
    return a


def unaligned(dtype, n=4):
    """A writeable array of `dtype` that starts one byte into a buffer, so it is misaligned."""
    dt = np.dtype(dtype)
    buf = bytearray(dt.itemsize * n + 1)
    a = np.frombuffer(buf, dtype=dt, count=n, offset=1)
    assert not a.flags.aligned and a.flags.writeable and a.flags.c_contiguous
    return a


# The calls that take an array, with how each reaches its array check at world size 1 (send/isend
# cannot: every dst is either out of range or this rank itself, which is refused first).
ARRAY_CALLS = {
    "all_reduce": lambda a: dist.all_reduce(a),
    "all_reduce(async)": lambda a: dist.all_reduce(a, op=ReduceOp.MAX, async_op=True),
    "broadcast": lambda a: dist.broadcast(a, src=0),
    "broadcast(async)": lambda a: dist.broadcast(a, src=0, async_op=True),
    "recv": lambda a: dist.recv(a),
    "irecv": lambda a: dist.irecv(a),
}
WRITING_CALLS = ["all_reduce", "all_reduce(async)", "recv", "irecv"]


def fn_name(key):
    return key.split("(")[0]


# ---------------------------------------------------------------------------------------------------
# Not an array

@pytest.mark.parametrize("key", list(ARRAY_CALLS))
@pytest.mark.parametrize("obj", [[1.0, 2.0], (1, 2), None, 3.0, np.float64(2.0), b"abcd", bytearray(8),
                                 memoryview(bytearray(8))],
                         ids=["list", "tuple", "None", "float", "numpy-scalar", "bytes", "bytearray",
                              "memoryview"])
def test_not_an_array_is_type_error(key, obj):
    msg = check(TypeError, fn_name(key), "tensor", lambda: ARRAY_CALLS[key](obj), "numpy.ndarray")
    assert type(obj).__name__ in msg


# ---------------------------------------------------------------------------------------------------
# Layout: contiguity, alignment, byte order, writeability

@pytest.mark.parametrize("key", list(ARRAY_CALLS))
def test_non_contiguous_is_value_error_with_strides(key):
    a = np.zeros((3, 4), dtype=np.float64)[:, ::2]
    msg = check(ValueError, fn_name(key), "tensor", lambda: ARRAY_CALLS[key](a), "C-contiguous")
    assert str(a.strides) in msg and str(a.shape) in msg, msg


@pytest.mark.parametrize("make", [lambda: np.arange(6.0)[::-1], lambda: np.asfortranarray(np.zeros((3, 4))),
                                  lambda: np.zeros((4, 4), dtype=np.int32).T,
                                  lambda: np.broadcast_to(np.zeros(1), (5,))],
                         ids=["reversed", "fortran", "transposed", "broadcast_to"])
def test_other_non_contiguous_layouts(make):
    a = make()
    msg = check(ValueError, "all_reduce", "tensor", lambda: dist.all_reduce(a), "C-contiguous")
    assert str(a.strides) in msg, msg


@pytest.mark.parametrize("key", WRITING_CALLS)
def test_read_only_where_the_call_writes(key):
    a = readonly(np.zeros(4))
    check(ValueError, fn_name(key), "tensor", lambda: ARRAY_CALLS[key](a), "writeable")
    np.testing.assert_array_equal(a, np.zeros(4))


def test_read_only_is_fine_for_the_broadcast_root():
    a = readonly(np.arange(4.0))
    assert dist.broadcast(a, src=0) is None
    assert dist.broadcast(a, src=0, async_op=True).wait() is True
    np.testing.assert_array_equal(a, np.arange(4.0))


@pytest.mark.parametrize("key", list(ARRAY_CALLS))
@pytest.mark.parametrize("dtype", [">f8", ">i4", ">c16", ">f2", ">u2"])
def test_byte_swapped_is_value_error(key, dtype):
    a = np.ones(3, dtype=dtype)
    assert not a.dtype.isnative
    check(ValueError, fn_name(key), "tensor", lambda: ARRAY_CALLS[key](a), "byte order")


@pytest.mark.parametrize("key", list(ARRAY_CALLS))
@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.float16, np.complex64])
def test_unaligned_is_value_error(key, dtype):
    a = unaligned(dtype)
    check(ValueError, fn_name(key), "tensor", lambda: ARRAY_CALLS[key](a), "aligned")


# ---------------------------------------------------------------------------------------------------
# dtypes

UNSUPPORTED = [object, "U3", "S4", "V8", "datetime64[s]", "timedelta64[ms]", np.longdouble, np.clongdouble,
               [("a", "<i4"), ("b", "<f4")], [("x", "<f8")]]
UNSUPPORTED_IDS = ["object", "str", "bytes", "void", "datetime64", "timedelta64", "longdouble",
                   "clongdouble", "structured", "one-field-struct"]


@pytest.mark.parametrize("key", list(ARRAY_CALLS))
@pytest.mark.parametrize("dtype", UNSUPPORTED, ids=UNSUPPORTED_IDS)
def test_unsupported_dtype_is_type_error(key, dtype):
    dt = np.dtype(dtype)
    assert dt.itemsize not in (2, 4, 8) or dt.kind not in "fc", "longdouble is double here: pick another"
    a = np.zeros(3, dtype=dt)
    check(TypeError, fn_name(key), "tensor", lambda: ARRAY_CALLS[key](a), "unsupported dtype")


# ---------------------------------------------------------------------------------------------------
# The dtype x op matrix

# What the contract says (DESIGN.md and ReduceOp's docstring): AVG only for floating and complex,
# bitwise ops not for floating or complex, MIN/MAX not for complex.
CONTRACT_INVALID = {
    "b": {"AVG"},
    "i": {"AVG"},
    "u": {"AVG"},
    "f": {"BAND", "BOR", "BXOR"},
    "c": {"MIN", "MAX", "BAND", "BOR", "BXOR"},
}




def test_check_op_does_not_depend_on_init():
    # The table must say the same before init_process_group as after it (tests and tools enumerate
    # it at import or collection time): float16's ops are as valid before MPI starts as after.
    script = ("import json, numpy as np, pydist as dist\n"
              "from pydist import _C\n"
              "def table():\n"
              "    out = {}\n"
              "    for dt in ('bool', 'int32', 'uint8', 'float16', 'float32', 'complex64'):\n"
              "        for op in dist.ReduceOp:\n"
              "            try:\n"
              "                _C.check_op(int(op), dt); out[dt + '-' + op.name] = True\n"
              "            except TypeError:\n"
              "                out[dt + '-' + op.name] = False\n"
              "    return out\n"
              "before = table()\n"
              "dist.init_process_group(backend='mpi')\n"
              "after = table()\n"
              "print(json.dumps({k: [before[k], after[k]] for k in before if before[k] != after[k]}))\n")
    out = run_python(script)
    assert json.loads(out) == {}, f"check_op answers [before init, after init] differ: {out}"


def test_check_op_table_matches_contract():
    for dt in DTYPES:
        kind = np.dtype(dt).kind
        for op in ReduceOp:
            if op.name in CONTRACT_INVALID[kind]:
                check(TypeError, "check_op", None, lambda: _C.check_op(int(op), dt), f"ReduceOp.{op.name}",
                      np.dtype(dt).name)
            else:
                assert _C.check_op(int(op), dt) is None, (dt, op)


@pytest.mark.parametrize("dtype, op", ALL_PAIRS)
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_invalid_dtype_op_pair_is_type_error(dtype, op, async_op):
    a = np.ones(5, dtype=dtype)
    if is_valid(dtype, op):  # a valid pair: the call goes through (test_api.py checks values)
        w = dist.all_reduce(a, op=op, async_op=async_op)
        assert (w.wait() if async_op else w is None) is True
        return
    check(TypeError, "all_reduce", None, lambda: dist.all_reduce(a, op=op, async_op=async_op),
          f"ReduceOp.{op.name}", np.dtype(dtype).name)
    np.testing.assert_array_equal(a, np.ones(5, dtype=dtype))  # nothing was sent or written


@pytest.mark.parametrize("dtype, op", [(np.float32, ReduceOp.BXOR), (np.complex64, ReduceOp.MIN),
                                       (np.int32, ReduceOp.AVG), (np.float16, ReduceOp.BAND),
                                       (np.complex128, ReduceOp.MAX), (np.float64, ReduceOp.BOR),
                                       (np.bool_, ReduceOp.AVG), (np.uint64, ReduceOp.AVG)],
                         ids=lambda v: getattr(v, "name", None) or np.dtype(v).name)
def test_known_invalid_pairs(dtype, op):
    a = np.zeros(2, dtype=dtype)
    check(TypeError, "all_reduce", None, lambda: dist.all_reduce(a, op=op),
          f"ReduceOp.{op.name} is not defined for dtype {np.dtype(dtype).name}")


def test_invalid_pair_message_names_the_argument():
    # STYLE.md: argument errors always read ``fn(): `arg` <rule>; got <what>``
    check(TypeError, "all_reduce", "op", lambda: dist.all_reduce(np.zeros(2, dtype=np.float32), op=ReduceOp.BXOR),
          "BXOR", "float32")


def test_invalid_pair_with_torch_tensor():
    import torch
    t = torch.ones(3)
    check(TypeError, "all_reduce", None, lambda: dist.all_reduce(t, op=ReduceOp.BXOR), "ReduceOp.BXOR")


# ---------------------------------------------------------------------------------------------------
# op

@pytest.mark.parametrize("op", [42, 8, -1, 2**40, -(2**40)])
def test_op_out_of_range_is_value_error(op):
    a = np.ones(3)
    check(ValueError, "all_reduce", "op", lambda: dist.all_reduce(a, op=op))


@pytest.mark.parametrize("op", [2**32, 2**32 + 3, -(2**32) + 4])
def test_op_that_wraps_to_a_valid_int_is_value_error(op):
    # must not be truncated to a C int: 2**32 is not SUM, 2**32 + 3 is not MIN
    a = np.array([1.0, 2.0])
    check(ValueError, "all_reduce", "op", lambda: dist.all_reduce(a, op=op))


@pytest.mark.parametrize("op", [2**70, -(2**70)])
def test_op_overflowing_c_long_is_value_error(op):
    check(ValueError, "all_reduce", "op", lambda: dist.all_reduce(np.ones(3), op=op), "out of range")


@pytest.mark.parametrize("op", ["SUM", 1.0, None, True])
def test_op_of_wrong_type_is_type_error(op):
    check(TypeError, "all_reduce", "op", lambda: dist.all_reduce(np.ones(3), op=op))


# ---------------------------------------------------------------------------------------------------
# Peers: dst / src / tag

@pytest.mark.parametrize("name, call, arg", [
    ("send", lambda a: dist.send(a, dst=0), "dst"),
    ("isend", lambda a: dist.isend(a, dst=0), "dst"),
    ("recv", lambda a: dist.recv(a, src=0), "src"),
    ("irecv", lambda a: dist.irecv(a, src=0), "src"),
], ids=["send", "isend", "recv", "irecv"])
def test_send_recv_to_self_is_value_error(name, call, arg):
    check(ValueError, name, arg, lambda: call(np.zeros(3)), "itself")


@pytest.mark.parametrize("peer", [5, 1, -2, -7])
@pytest.mark.parametrize("name, call, arg", [
    ("send", lambda a, p: dist.send(a, dst=p), "dst"),
    ("isend", lambda a, p: dist.isend(a, dst=p), "dst"),
    ("irecv", lambda a, p: dist.irecv(a, src=p), "src"),
], ids=["send", "isend", "irecv"])
def test_peer_out_of_range_is_value_error(name, call, arg, peer):
    with pytest.raises(ValueError) as info:
        call(np.zeros(3), peer)
    msg = str(info.value)
    assert f"{name}()" in msg and f"`{arg}`" in msg and str(peer) in msg, msg


@pytest.mark.parametrize("peer", [5, 1, -2])
def test_recv_src_out_of_range_is_value_error(peer, restore_group):
    # A bug here would block forever in a receive from anyone: bound it with a short group timeout.
    dist.destroy_process_group()
    dist.init_process_group(backend="mpi", timeout=1.0)
    check(ValueError, "recv", "src", lambda: dist.recv(np.zeros(3), src=peer), str(peer))


@pytest.mark.parametrize("src", [3, 1, -1, -5])
def test_broadcast_src_out_of_range_is_value_error(src):
    a = np.zeros(3)
    check(ValueError, "broadcast", "src", lambda: dist.broadcast(a, src=src), str(src))
    check(ValueError, "broadcast", "src", lambda: dist.broadcast(a, src=src, async_op=True))


@pytest.mark.parametrize("name, call, arg", [
    ("send", lambda v: dist.send(np.zeros(2), dst=v), "dst"),
    ("isend", lambda v: dist.isend(np.zeros(2), dst=v), "dst"),
    ("recv", lambda v: dist.recv(np.zeros(2), src=v), "src"),
    ("irecv", lambda v: dist.irecv(np.zeros(2), src=v), "src"),
    ("broadcast", lambda v: dist.broadcast(np.zeros(2), src=v), "src"),
], ids=["send", "isend", "recv", "irecv", "broadcast"])
@pytest.mark.parametrize("value", ["1", 1.0, True, np.float64(0.0), np.True_, np.array(0)],
                         ids=["str", "float", "bool", "np.float64", "np.bool", "0-d array"])
def test_peer_of_wrong_type_is_type_error(name, call, arg, value):
    check(TypeError, name, arg, lambda: call(value))


@pytest.mark.parametrize("kind", [np.int64, np.int32, np.uint8])
def test_numpy_integers_are_ranks_and_tags(kind):
    """A rank or tag read from a NumPy table is an integer (it has __index__), as torch accepts it."""
    a = np.arange(3.0)
    assert dist.broadcast(a, src=kind(0)) is None and np.array_equal(a, np.arange(3.0))
    # past the type check: the rank itself is what is wrong at world size 1
    check(ValueError, "send", "dst", lambda: dist.send(a, dst=kind(0), tag=kind(3)))
    check(ValueError, "irecv", "src", lambda: dist.irecv(a, src=kind(0), tag=kind(3)))
    assert dist.get_global_rank(None, kind(0)) == 0 and dist.get_group_rank(None, kind(0)) == 0
    assert dist.new_group([kind(0)]).ranks == [0]


@pytest.mark.parametrize("tag", [-1, -100, 2**31, 2**40])
@pytest.mark.parametrize("name, call", [
    ("send", lambda t: dist.send(np.zeros(2), dst=0, tag=t)),
    ("isend", lambda t: dist.isend(np.zeros(2), dst=0, tag=t)),
    ("recv", lambda t: dist.recv(np.zeros(2), tag=t)),
    ("irecv", lambda t: dist.irecv(np.zeros(2), tag=t)),
], ids=["send", "isend", "recv", "irecv"])
def test_bad_tag_is_value_error(name, call, tag):
    check(ValueError, name, "tag", lambda: call(tag), str(tag))


@pytest.mark.parametrize("tag", ["0", 0.0, None])
def test_tag_of_wrong_type_is_type_error(tag):
    check(TypeError, "recv", "tag", lambda: dist.recv(np.zeros(2), tag=tag))
    check(TypeError, "isend", "tag", lambda: dist.isend(np.zeros(2), dst=0, tag=tag))


# ---------------------------------------------------------------------------------------------------
# group and timeout

@pytest.mark.parametrize("name, call", [
    ("all_reduce", lambda g: dist.all_reduce(np.zeros(2), group=g)),
    ("broadcast", lambda g: dist.broadcast(np.zeros(2), src=0, group=g)),
    ("barrier", lambda g: dist.barrier(group=g)),
    ("send", lambda g: dist.send(np.zeros(2), dst=0, group=g)),
    ("recv", lambda g: dist.recv(np.zeros(2), group=g)),
    ("isend", lambda g: dist.isend(np.zeros(2), dst=0, group=g)),
    ("irecv", lambda g: dist.irecv(np.zeros(2), group=g)),
    ("get_rank", lambda g: dist.get_rank(group=g)),
    ("get_world_size", lambda g: dist.get_world_size(group=g)),
], ids=lambda v: v if isinstance(v, str) else None)
@pytest.mark.parametrize("group", ["world", 0, object()], ids=["str", "int", "object"])
def test_group_that_is_not_a_process_group_is_type_error(name, call, group):
    check(TypeError, name, "group", lambda: call(group), "ProcessGroup")


@pytest.mark.parametrize("timeout", [-1, 0, -0.5, float("nan")])
def test_init_timeout_not_positive_is_value_error(timeout):
    check(ValueError, "init_process_group", "timeout",
          lambda: dist.init_process_group(backend="mpi", timeout=timeout))


@pytest.mark.parametrize("timeout", [-1, 0, float("nan")])
def test_new_group_timeout_not_positive_is_value_error(timeout):
    check(ValueError, "new_group", "timeout", lambda: dist.new_group([0], timeout=timeout))


@pytest.mark.parametrize("ranks", [[0.7], [0.0], ["0"], [None]])
def test_new_group_ranks_that_are_not_ints_are_type_errors(ranks):
    """int(0.7) is 0: a float must not quietly become a rank."""
    check(TypeError, "new_group", "ranks", lambda: dist.new_group(ranks))


@pytest.mark.parametrize("name, call", [
    ("get_process_group_ranks", lambda g: dist.get_process_group_ranks(g)),
    ("get_global_rank", lambda g: dist.get_global_rank(g, 0)),
    ("get_group_rank", lambda g: dist.get_group_rank(g, 0)),
], ids=lambda v: v if isinstance(v, str) else None)
@pytest.mark.parametrize("group", ["world", 0, object()], ids=["str", "int", "object"])
def test_rank_lookups_with_what_is_not_a_group_are_type_errors(name, call, group):
    check(TypeError, name, "group", lambda: call(group), "ProcessGroup")


@pytest.mark.parametrize("timeout", ["10", [1], True])
def test_init_timeout_of_wrong_type_is_type_error(timeout):
    check(TypeError, "init_process_group", "timeout",
          lambda: dist.init_process_group(backend="mpi", timeout=timeout))


@pytest.mark.parametrize("kwargs, arg", [({"world_size": "1"}, "world_size"), ({"rank": 0.0}, "rank"),
                                         ({"world_size": True}, "world_size")])
def test_init_size_or_rank_of_wrong_type_is_type_error(kwargs, arg):
    check(TypeError, "init_process_group", arg, lambda: dist.init_process_group(backend="mpi", **kwargs))


def test_bad_init_after_destroy_leaves_nothing_half_done(restore_group):
    dist.destroy_process_group()
    check(ValueError, "init_process_group", "timeout", lambda: dist.init_process_group(timeout=-1))
    check(ValueError, "init_process_group", "backend", lambda: dist.init_process_group(backend="x"))
    check(TypeError, "init_process_group", "world_size", lambda: dist.init_process_group(world_size=None))
    assert dist.is_initialized() is False
    init_default()


def test_wait_timeout_errors():
    w = dist.all_reduce(np.ones(2), async_op=True)
    check(ValueError, "wait", "timeout", lambda: w.wait(-1))
    check(ValueError, "wait", "timeout", lambda: w.wait(timeout=-0.1))
    check(TypeError, "wait", "timeout", lambda: w.wait("1"))
    with pytest.raises(TypeError, match="at most one argument"):
        w.wait(1, 2)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        w.wait(seconds=1)
    assert w.wait() is True


def test_source_rank_of_a_send_or_collective_is_value_error():
    w = dist.all_reduce(np.ones(2), async_op=True)
    w.wait()
    with pytest.raises(ValueError, match=r"source_rank\(\)"):
        w.source_rank()


def test_destroy_something_that_is_not_a_group_is_type_error():
    check(TypeError, "destroy_process_group", "group", lambda: dist.destroy_process_group(group="g"))
    assert dist.is_initialized()


# ---------------------------------------------------------------------------------------------------
# torch tensors that NumPy cannot view

def test_torch_tensor_numpy_cannot_view_is_type_error():
    # In a child process: torch throws (and catches) a C++ exception on the way to this TypeError,
    # which aborts the AddressSanitizer run of these tests (see unit_helpers.subprocess_env).
    # complex32 has no NumPy dtype (bfloat16, which has none either, pydist reads as bfloat16).
    script = ("import torch, pydist as dist\n"
              "dist.init_process_group(backend='mpi')\n"
              "t = torch.zeros(3, dtype=torch.complex32)\n"
              "try:\n"
              "    dist.all_reduce(t)\n"
              "except TypeError as e:\n"
              "    print(e)\n"
              "b = torch.full((3,), 1.5, dtype=torch.bfloat16)\n"
              "dist.all_reduce(b, op=dist.ReduceOp.MAX)\n"
              "print('bfloat16', b.tolist())\n")
    msg = run_python(script)
    assert "all_reduce()" in msg and "`tensor`" in msg and "torch tensor" in msg and "ComplexHalf" in msg, msg
    assert "bfloat16 [1.5, 1.5, 1.5]" in msg, msg


def test_torch_non_contiguous_is_value_error_not_a_silent_copy():
    import torch
    t = torch.zeros(3, 4).t()
    check(ValueError, "all_reduce", "tensor", lambda: dist.all_reduce(t), "must be contiguous", "(1, 4)",
          "tensor.contiguous()")


# ---------------------------------------------------------------------------------------------------
# The private _C functions: wrong counts and types are TypeErrors, never a crash

# name: (number of positional args, positions that must be C ints). Valid calls are never made here:
# abort/finalize/init/destroy would end or change MPI, recv(src=-1) would block forever.
C_FASTCALL = {
    "init": 2, "abort": 1, "start_and_abort": 2, "get_rank": 1, "get_world_size": 1, "send": 4, "recv": 4, "isend": 4,
    "irecv": 4, "barrier": 2, "broadcast": 4, "all_reduce": 4, "set_wait_mode": 1, "check_op": 2,
}
C_INT_ARGS = {
    "abort": [0], "get_rank": [0], "get_world_size": [0], "send": [1, 2, 3], "recv": [1, 2, 3],
    "isend": [1, 2, 3], "irecv": [1, 2, 3], "barrier": [0], "broadcast": [1, 2], "all_reduce": [1, 2],
    "set_wait_mode": [0], "check_op": [0],
}
C_NOARGS = ["destroy", "finalize", "is_initialized", "mpi_info"]
C_OPTIONAL_LAST = {"all_reduce"}   # may take one more argument (all_reduce's algorithm code)


@pytest.mark.parametrize("name", sorted(C_FASTCALL))
def test_c_wrong_arg_count_is_type_error(name):
    fn = getattr(_C, name)
    want = C_FASTCALL[name]
    allowed = {want, want + 1} if name in C_OPTIONAL_LAST else {want}
    takes = f"{want} or {want + 1}" if name in C_OPTIONAL_LAST else f"{want}"
    for n in sorted({0, want - 1, want + 1, want + 2, want + 5} - allowed):
        if n < 0:
            continue
        with pytest.raises(TypeError, match=rf"{name}\(\) takes {takes} arguments \({n} given\)"):
            fn(*([0] * n))
    with pytest.raises(TypeError):
        fn(tensor=np.zeros(1))  # positional only


@pytest.mark.parametrize("name", sorted(C_INT_ARGS))
@pytest.mark.parametrize("bad", ["0", 1.5, None, True, object()], ids=["str", "float", "None", "bool", "object"])
def test_c_wrong_arg_type_is_type_error(name, bad):
    fn = getattr(_C, name)
    base = {
        "abort": [0], "get_rank": [0], "get_world_size": [0], "send": [np.zeros(2), 0, 0, 0],
        "recv": [np.zeros(2), 0, 0, 0], "isend": [np.zeros(2), 0, 0, 0], "irecv": [np.zeros(2), 0, 0, 0],
        "barrier": [0, False], "broadcast": [np.zeros(2), 0, 0, False],
        "all_reduce": [np.zeros(2), 0, 0, False], "set_wait_mode": [0], "check_op": [0, np.float32],
    }[name]
    for pos in C_INT_ARGS[name]:
        if bad is None and name in ("recv", "irecv") and pos == 1:
            continue  # src=None is valid there: receive from any rank (tested in test_api.py)
        args = list(base)
        args[pos] = bad
        op = name in ("all_reduce", "check_op") and pos == (1 if name == "all_reduce" else 0)
        with pytest.raises(TypeError, match="must be a pydist.ReduceOp" if op else "must be an int"):
            fn(*args)


@pytest.mark.parametrize("name", ["all_reduce", "broadcast", "recv", "irecv"])
@pytest.mark.parametrize("bad", [None, [1.0], "x", 3])
def test_c_wrong_tensor_is_type_error(name, bad):
    fn = getattr(_C, name)
    args = {"all_reduce": [bad, 0, 0, False], "broadcast": [bad, 0, 0, False],
            "recv": [bad, None, 0, 0], "irecv": [bad, None, 0, 0]}[name]
    with pytest.raises(TypeError, match="`tensor`"):
        fn(*args)


@pytest.mark.parametrize("name", C_NOARGS)
def test_c_noargs_functions_take_no_arguments(name):
    with pytest.raises(TypeError):
        getattr(_C, name)(1)


def test_c_init_wrong_types_and_second_init():
    for bad in ("1", None, [1.0], object()):
        with pytest.raises(TypeError):
            _C.init(bad, -1.0)
        with pytest.raises(TypeError):
            _C.init(-1.0, bad)
    with pytest.raises(TypeError):
        _C.init(-1.0)
    with pytest.raises(ValueError, match="already initialized"):
        _C.init(-1.0, -1.0)


@pytest.mark.parametrize("handle", [-1, 1, 7, _C.MAX_GROUPS, _C.MAX_GROUPS + 1, 2**40])
def test_c_bad_group_handle_is_value_error(handle):
    x = np.ones(2)
    for call in (lambda: _C.get_rank(handle), lambda: _C.get_world_size(handle),
                 lambda: _C.barrier(handle, False), lambda: _C.all_reduce(x, 0, handle, False),
                 lambda: _C.broadcast(x, 0, handle, False), lambda: _C.recv(x, -1, 0, handle),
                 lambda: _C.irecv(x, -1, 0, handle), lambda: _C.send(x, 0, 0, handle)):
        with pytest.raises(ValueError, match="`group`"):
            call()


def test_c_check_op_bad_dtype_and_op():
    with pytest.raises(TypeError):
        _C.check_op(0, "not a dtype")
    with pytest.raises(TypeError, match="unsupported dtype"):
        _C.check_op(0, object)
    with pytest.raises(ValueError, match="`op`"):
        _C.check_op(42, np.float32)


def test_c_set_wait_mode_bad_mode():
    with pytest.raises(ValueError, match="`mode`"):
        _C.set_wait_mode(2)
    old = _C.set_wait_mode(_C.WAIT_POLL)
    assert old == _C.WAIT_POLL
    assert _C.set_wait_mode(_C.WAIT_POLL) == _C.WAIT_POLL


def test_c_mpi_info():
    info = _C.mpi_info()
    assert info["mpi_version"] >= 4
    assert "MPICH" in info["library_version"]
    assert re.fullmatch(r"\d", str(info["thread_level"]))
    assert isinstance(info["wait_spin"], bool)   # whether the wait loop spins without yielding


@pytest.mark.parametrize("call", ["all_reduce", "reduce", "reduce_scatter_tensor"])
def test_op_given_a_string_names_the_member_to_use(call):
    """A user who writes op="sum" (as NumPy or MPI's names would suggest) is told the ReduceOp to use;
    anything else not a ReduceOp gets the list of members, never "must be an int"."""
    x = np.ones(4)
    run = {"all_reduce": lambda op: dist.all_reduce(x, op=op), "reduce": lambda op: dist.reduce(x, 0, op=op),
           "reduce_scatter_tensor": lambda op: dist.reduce_scatter_tensor(np.ones(4), x, op=op)}[call]
    for given, member in (("sum", "SUM"), ("Max", "MAX"), ("band", "BAND")):
        with pytest.raises(TypeError, match=rf"^{call}\(\): `op` must be a pydist.ReduceOp, not a string: use "
                                            rf"pydist.ReduceOp.{member} for '{given}'$"):
            run(given)
    for given, shown in (("average", "str 'average'"), (1.5, "float 1.5"), (None, "NoneType None"),
                         (True, "bool True")):
        with pytest.raises(TypeError, match=rf"`op` must be a pydist.ReduceOp \(SUM, AVG, PRODUCT, MIN, MAX, BAND, "
                                            rf"BOR, BXOR\); got {re.escape(shown)}$"):
            run(given)
    run(dist.ReduceOp.MAX)
    run(int(dist.ReduceOp.SUM))   # a plain int is still a member's value
    assert np.array_equal(x, np.ones(4))


def test_a_peer_out_of_a_world_of_one_asks_about_the_launcher():
    """send(dst=1) in a process started without mpiexec: the range, and the likely cause."""
    assert dist.get_world_size() == 1
    with pytest.raises(ValueError, match=r"^send\(\): `dst` must be a rank in \[0, 1\); got 1 \(this process is a "
                                         r"world of one: was it started by mpiexec -n N or python -m pydist.run -n "
                                         r"N\?\)$"):
        dist.send(np.ones(2), dst=1)
    with pytest.raises(ValueError, match=r"^broadcast\(\): `src` must be a rank in \[0, 1\); got 3 \(this process"):
        dist.broadcast(np.ones(2), src=3)


def test_a_non_contiguous_torch_tensor_is_told_in_torch_terms():
    """torch counts strides in elements and makes a tensor contiguous with .contiguous(): the message
    says so (NumPy arrays keep NumPy's terms: byte strides, numpy.ascontiguousarray)."""
    torch = pytest.importorskip("torch")
    t = torch.ones(4, 2).t()
    with pytest.raises(ValueError, match=r"^all_reduce\(\): `tensor` must be contiguous; got a tensor of shape "
                                         r"\(2, 4\) with strides \(1, 2\), in elements \(use tensor.contiguous\(\)\)$"):
        dist.all_reduce(t)
    with pytest.raises(ValueError, match=r"^all_reduce\(\): `tensor` must be C-contiguous; got strides \(16, 8\) for "
                                         r"shape \(4, 1\) \(use numpy.ascontiguousarray\)$"):
        dist.all_reduce(np.ones((4, 2))[:, :1])
