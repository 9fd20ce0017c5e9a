"""What the fuzz tests (tests/unit/test_fuzz.py, tests/mpi/test_fuzz.py) throw at pydist, and what a
correct answer is.

A case is drawn by hypothesis *without* knowing the rank, so that every rank of a job draws the very
same case and makes the same calls in the same order; it holds abstract arguments (Spec, OnRoot, Splits)
that each rank turns into its own arrays with build(). Rank r's array of a Spec has its own values
(materialize(spec, r)), so every rank can rebuild every other rank's input and compute the expected
result locally, with NumPy (expected_pairs): a wrong result cannot hide behind the code under test.

A case is "valid" (every argument right: the call must succeed and give the NumPy answer), "one_bad"
(one argument replaced by something wrong or odd) or "chaos" (any argument may be anything).
"""
import collections
import contextlib
import os

import numpy as np
from hypothesis import strategies as st

import pydist as dist
from pydist import _C

ALLOWED = (TypeError, ValueError, OverflowError, dist.DistError)
INT_MAX = 2**31 - 1
EDGE_INTS = [-2**64, -2**63 - 1, -2**63, -2**31 - 1, -2**31, -3, -1, 0, 1, 2, 3, 7, 32767, 32768, INT_MAX,
             2**31, 2**32, 2**62 + 200000, 2**63 - 1, 2**63, 2**64, 10**30]
SUPPORTED = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
             "float32", "float64", "complex64", "complex128"]
UNSUPPORTED = ["longdouble", "clongdouble", "object", "U2", "S3", "V4", "datetime64[s]", "timedelta64[ms]",
               "<i4,<f8"]
BAD_LAYOUTS = ["noncontiguous", "transposed", "fortran", "readonly", "swapped", "unaligned", "broadcast"]
GROUP_TOKENS = ("none", "world", "sub", "destroyed", "outside")


class Tensor:
    """Named like torch's tensor, from another module: not a torch tensor."""
    __module__ = "torchvision.fake"

    def __reduce__(self):   # pickled by tests/mpi/test_fuzz.py, despite the module it claims
        return _fake_tensor, ()


def _fake_tensor():
    return Tensor()


Spec = collections.namedtuple("Spec", "dtype shape seed layout")
OnRoot = collections.namedtuple("OnRoot", "value root")          # `value` on rank `root`, None elsewhere
Splits = collections.namedtuple("Splits", "matrix side form")    # rank r's row ("in") or column ("out")
A2A = collections.namedtuple("A2A", "dtype trail matrix seed side")  # all_to_all_single's rank-sized array


def materialize(spec, rank=0):
    """The array (or torch tensor) a Spec describes: its values depend on the rank, its layout does not."""
    dt = np.dtype(spec.dtype)
    rng = np.random.default_rng(spec.seed * 8 + rank)
    if dt.kind in "biufc":
        a = np.asarray(rng.integers(-5, 6, size=spec.shape))
        a = np.asarray(a % 2 == 0) if dt.kind == "b" else a.astype(dt)   # 0-d arrays, never NumPy scalars
    else:
        a = np.zeros(spec.shape, dt)
    layout = spec.layout
    if layout == "noncontiguous":
        a = np.stack([a, a], axis=-1)[..., 0]
    elif layout == "transposed":
        a = np.ascontiguousarray(a).T
    elif layout == "fortran":
        a = np.asfortranarray(a)
    elif layout == "readonly":
        a.setflags(write=False)
    elif layout == "swapped":
        a = a.astype(a.dtype.newbyteorder("S"))
    elif layout == "unaligned" and a.dtype.itemsize > 1 and a.dtype.kind in "biufc":
        buf = np.zeros(a.nbytes + 1, np.uint8)
        u = buf[1:].view(a.dtype).reshape(a.shape)
        u[...] = a
        a = u
    elif layout == "broadcast" and a.ndim >= 1 and a.shape[0] >= 1:
        a = np.broadcast_to(a[:1], (3,) + a.shape[1:])
    elif layout == "torch":
        import torch
        try:
            return torch.from_numpy(np.ascontiguousarray(a))
        except TypeError:   # a dtype torch has no tensor for: stay an array
            return a
    return a


def build(value, rank, size):
    """Abstract arguments (also inside lists) as rank `rank` of `size` passes them."""
    if isinstance(value, Spec):
        return materialize(value, rank)
    if isinstance(value, OnRoot):
        return build(value.value, rank, size) if rank == value.root else None
    if isinstance(value, Splits):
        m = np.array(value.matrix, dtype=np.int64).reshape(size, size)
        row = m[rank] if value.side == "in" else m[:, rank]
        return {"list": [int(v) for v in row], "tuple": tuple(int(v) for v in row), "array": row.copy(),
                "numpy ints": [np.int64(v) for v in row]}[value.form]
    if isinstance(value, A2A):
        return materialize(Spec(value.dtype, (a2a_rows(value, rank, size),) + value.trail, value.seed, "plain"),
                           rank)
    if isinstance(value, list):
        return [build(v, rank, size) for v in value]
    return value


def a2a_rows(a, rank, size):
    if a.matrix is None:
        return 2 * size
    m = np.array(a.matrix).reshape(size, size)
    return int(m[rank].sum() if a.side == "in" else m[:, rank].sum())


@contextlib.contextmanager
def working_dir(path):
    """Run in `path`, so that a fuzzed relative file name is written there and nowhere else."""
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


# ---------------------------------------------------------------------------------------------------
# Strategies

shapes = st.lists(st.integers(0, 4), max_size=3).map(tuple)
seeds = st.integers(0, 2**16)


def specs(dtypes=None, layouts=None):
    return st.builds(Spec, st.sampled_from(dtypes or SUPPORTED * 2 + UNSUPPORTED), shapes, seeds,
                     st.sampled_from(layouts or ["plain"] * 3 + BAD_LAYOUTS))


_junk = st.one_of(
    st.none(), st.booleans(), st.sampled_from(EDGE_INTS), st.integers(), st.floats(), st.text(max_size=3),
    st.binary(max_size=3), st.lists(st.integers(-2, 3), max_size=3), st.tuples(st.integers(-2, 3)),
    st.builds(np.int64, st.integers(-3, 3)), st.builds(np.float32, st.floats(-3, 3)), st.just(np.bool_(True)),
    st.just(object()), st.just({"a": 1}), st.just(Tensor()), specs(),
)
# Anything at all. Deferred, so that st.one_of(valid, junk) stays two branches (one_of flattens nested
# one_of strategies, and junk's many branches would crowd out the valid one).
junk = st.deferred(lambda: _junk)


def valid_ops(dtype):
    """The ReduceOps the C table defines for dtype (asked at draw time, the same on every rank)."""
    ok = []
    for op in dist.ReduceOp:
        try:
            _C.check_op(int(op), np.dtype(dtype))
            ok.append(op)
        except TypeError:
            pass
    return ok


Case = collections.namedtuple("Case", "name kwargs group async_op mode")

COLLECTIVES = ["barrier", "broadcast", "all_reduce", "reduce", "all_gather_into_tensor", "all_gather",
               "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all_single", "all_to_all"]


@st.composite
def collective_cases(draw, size, name, torch_layout=False):
    """A Case for the collective `name` at world size `size`."""
    dtype = draw(st.sampled_from(SUPPORTED))
    shape = draw(shapes)
    layouts = ["plain"] * 3 + (["torch"] if torch_layout else [])
    t = Spec(dtype, shape, draw(seeds), draw(st.sampled_from(layouts)))
    n = int(np.prod(shape))
    root = draw(st.integers(0, size - 1))
    op = draw(st.sampled_from(valid_ops(dtype)))

    def like(count=1, flat=False):
        return Spec(dtype, (count * n,) if flat else shape, draw(seeds), draw(st.sampled_from(layouts)))

    kw = {
        "barrier": lambda: {},
        "broadcast": lambda: {"tensor": t, "src": root},
        "all_reduce": lambda: {"tensor": t, "op": op},
        "reduce": lambda: {"tensor": t, "dst": root, "op": op},
        "all_gather_into_tensor": lambda: {"output_tensor": like(size, flat=True), "input_tensor": t},
        "all_gather": lambda: {"tensor_list": [like() for _ in range(size)], "tensor": t},
        "gather": lambda: {"tensor": t, "gather_list": OnRoot([like() for _ in range(size)], root), "dst": root},
        "scatter": lambda: {"tensor": t, "scatter_list": OnRoot([like() for _ in range(size)], root), "src": root},
        "reduce_scatter": lambda: {"output": t, "input_list": [like() for _ in range(size)], "op": op},
        "reduce_scatter_tensor": lambda: {"output": t, "input": like(size, flat=True), "op": op},
        "all_to_all": lambda: {"output_tensor_list": [like() for _ in range(size)],
                               "input_tensor_list": [like() for _ in range(size)]},
    }
    if name == "all_to_all_single":
        matrix = draw(st.one_of(st.none(), st.lists(st.integers(0, 3), min_size=size * size,
                                                     max_size=size * size).map(tuple)))
        trail = draw(st.lists(st.integers(0, 3), max_size=2).map(tuple))
        form = draw(st.sampled_from(["list", "tuple", "array", "numpy ints"]))
        kwargs = {"output": A2A(dtype, trail, matrix, draw(seeds), "out"),
                  "input": A2A(dtype, trail, matrix, draw(seeds), "in"),
                  "output_split_sizes": Splits(matrix, "out", form) if matrix is not None else None,
                  "input_split_sizes": Splits(matrix, "in", form) if matrix is not None else None}
    else:
        kwargs = kw[name]()
    group = draw(st.sampled_from(["none", "world", "sub"]))
    async_op = draw(st.booleans())
    mode = draw(st.sampled_from(["valid", "valid", "one_bad", "one_bad", "chaos"]))
    keys = list(kwargs) + ["group", "async_op"]
    if mode == "one_bad":
        bad = {draw(st.sampled_from(keys))}
    elif mode == "chaos":
        bad = {k for k in keys if draw(st.booleans())}
    else:
        bad = set()
    for key in bad:
        if key == "group":
            group = draw(st.one_of(st.sampled_from(["destroyed", "outside"]), junk))
        elif key == "async_op":
            async_op = draw(junk)
        else:
            kwargs[key] = draw(bad_value(key, kwargs[key], size))
    return Case(name, kwargs, group, async_op, mode)


def bad_value(key, value, size):
    """Something wrong (or just odd) in place of the argument `key` whose right value is `value`."""
    out = [junk]
    if key in ("src", "dst"):
        out.append(st.one_of(st.integers(-2, size + 1), st.sampled_from(EDGE_INTS)))
    elif key == "op":
        out.append(st.one_of(st.sampled_from(list(dist.ReduceOp)), st.integers(-2, 10)))
    elif key.endswith("split_sizes"):
        out.append(st.lists(st.one_of(st.integers(-2, 9), st.sampled_from(EDGE_INTS)), max_size=size + 1))
        out.append(st.just([2**63 - 1, 2**63 - 1, 2] + [0] * (size - 3)) if size >= 3 else st.just([2**63 - 1]))
        out.append(st.just([]))
    elif isinstance(value, Spec):
        out.append(specs())
        out.append(st.builds(Spec, st.just(value.dtype), st.just(value.shape), seeds, st.sampled_from(BAD_LAYOUTS)))
        out.append(st.just("alias"))   # the call's other array itself
    elif isinstance(value, (list, OnRoot)):
        lst = value.value if isinstance(value, OnRoot) else value
        out.append(st.lists(specs(), max_size=size + 1))
        out.append(st.just(lst[:-1]))
        out.append(st.just(tuple(lst)))
        out.append(st.builds(lambda s, i: lst[:i] + [s] + lst[i + 1:], specs(), st.integers(0, len(lst) - 1)))
        out.append(st.just(None))
        if isinstance(value, OnRoot):
            out.append(st.builds(OnRoot, st.just(lst), st.integers(0, size)))   # on another rank
            out.append(st.just(lst))                                            # on every rank
    elif isinstance(value, A2A):
        out.append(st.builds(A2A, st.just(value.dtype), st.lists(st.integers(0, 3), max_size=2).map(tuple),
                             st.just(value.matrix), seeds, st.sampled_from(["in", "out"])))
        out.append(specs())
    return st.one_of(*out)


class Groups:
    """The group tokens of one example as objects; every group made is freed when the example ends."""

    def __init__(self, size):
        self.size, self.made = size, []

    def get(self, token):
        if not isinstance(token, str) or token not in GROUP_TOKENS:
            return token
        if token == "none":
            return None
        if token == "world":
            return dist.GroupMember.WORLD
        g = dist.new_group([] if token == "outside" else list(range(self.size)))
        self.made.append(g)
        if token == "destroyed":
            dist.destroy_process_group(g)
        return g

    def close(self):
        for g in self.made:
            if g._handle > 0:
                dist.destroy_process_group(g)


def resolve_aliases(kwargs):
    """A bad value "alias" stands for the call's other array: the output is the input itself."""
    arrays = [v for v in kwargs.values() if hasattr(v, "shape")]
    for k, v in kwargs.items():
        if isinstance(v, str) and v == "alias":
            others = [a for a in arrays if a is not v]
            kwargs[k] = others[0] if others else None
    return kwargs


# ---------------------------------------------------------------------------------------------------
# The expected result, with NumPy

def reference(op, inputs):
    """The reduction of `inputs` (one array per rank) with `op`, as NumPy computes it."""
    dt = inputs[0].dtype
    stack = np.stack(inputs)
    op = dist.ReduceOp(int(op))
    if op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
        total = np.add.reduce(stack, axis=0, dtype=dt)
        if op == dist.ReduceOp.SUM:
            return total
        if dt.kind == "c":   # componentwise, as torch divides by a real count
            out = np.empty_like(total)
            out.real, out.imag = total.real / len(inputs), total.imag / len(inputs)
            return out
        return (total / dt.type(len(inputs))).astype(dt)
    ufunc = {dist.ReduceOp.PRODUCT: np.multiply, dist.ReduceOp.MIN: np.minimum, dist.ReduceOp.MAX: np.maximum,
             dist.ReduceOp.BAND: np.bitwise_and, dist.ReduceOp.BOR: np.bitwise_or,
             dist.ReduceOp.BXOR: np.bitwise_xor}[op]
    return ufunc.reduce(stack, axis=0, dtype=dt) if op == dist.ReduceOp.PRODUCT else ufunc.reduce(stack, axis=0)


class Unknown(Exception):
    """The arguments are not ones expected_pairs can compute an answer for (the call's result is then
    not compared, only its outcome)."""


def _arr(spec, rank):
    if not isinstance(spec, Spec):
        raise Unknown
    return np.asarray(materialize(spec, rank))


def _rank(v):
    """A root or an op that the call took: a Python int (ReduceOp is one); NumPy ints are refused."""
    if not isinstance(v, int) or isinstance(v, bool):
        raise Unknown
    return int(v)


def _specs(lst, size):
    if not isinstance(lst, list) or len(lst) != size or not all(isinstance(s, Spec) for s in lst):
        raise Unknown
    return lst


def as_numpy(x):
    return x.numpy() if hasattr(x, "numpy") and not isinstance(x, np.ndarray) else np.asarray(x)


def expected_pairs(case, built, rank, size):
    """[(array the call wrote, the NumPy answer)] for a call that succeeded on rank `rank` of a group of
    every rank; raises Unknown where the abstract arguments do not say."""
    a, name = case.kwargs, case.name
    inputs = lambda key: [_arr(a[key], r) for r in range(size)]  # noqa: E731
    if name == "barrier":
        return []
    if name == "broadcast":
        return [(built["tensor"], _arr(a["tensor"], _rank(a["src"])))]
    if name == "all_reduce":
        return [(built["tensor"], reference(_rank(a["op"]), inputs("tensor")))]
    if name == "reduce":
        mine = _arr(a["tensor"], rank)
        return [(built["tensor"], reference(_rank(a["op"]), inputs("tensor")) if rank == _rank(a["dst"]) else mine)]
    if name == "all_gather_into_tensor":
        return [(built["output_tensor"], np.concatenate([x.reshape(-1) for x in inputs("input_tensor")]))]
    if name == "all_gather":
        _specs(a["tensor_list"], size)
        return list(zip(built["tensor_list"], inputs("tensor")))
    if name == "gather":
        dst = _rank(a["dst"])
        if not isinstance(a["gather_list"], OnRoot) or a["gather_list"].root != dst:
            raise Unknown
        _specs(a["gather_list"].value, size)
        return list(zip(built["gather_list"], inputs("tensor"))) if rank == dst else []
    if name == "scatter":
        src = _rank(a["src"])
        if not isinstance(a["scatter_list"], OnRoot) or a["scatter_list"].root != src:
            raise Unknown
        return [(built["tensor"], _arr(_specs(a["scatter_list"].value, size)[rank], src))]
    if name == "reduce_scatter":
        mine = [_arr(s, r) for r in range(size) for s in [_specs(a["input_list"], size)[rank]]]
        return [(built["output"], reference(_rank(a["op"]), mine))]
    if name == "reduce_scatter_tensor":
        n = _arr(a["output"], 0).size
        blocks = [x.reshape(-1)[rank * n:(rank + 1) * n] for x in inputs("input")]
        return [(built["output"], reference(_rank(a["op"]), blocks))]
    if name == "all_to_all_single":
        out, inp = a["output"], a["input"]
        if not isinstance(out, A2A) or not isinstance(inp, A2A) or out.trail != inp.trail or \
                (out.side, inp.side) != ("out", "in") or out.dtype != inp.dtype:
            raise Unknown
        m = np.array(inp.matrix).reshape(size, size) if inp.matrix is not None else np.full((size, size), 2)
        parts = []
        for q in range(size):
            xq = build(inp, q, size)
            start = int(m[q, :rank].sum())
            parts.append(xq[start:start + int(m[q, rank])])
        return [(built["output"], np.concatenate(parts))]
    if name == "all_to_all":
        ins = _specs(a["input_tensor_list"], size)
        _specs(a["output_tensor_list"], size)
        return [(built["output_tensor_list"][q], _arr(ins[rank], q)) for q in range(size)]
    raise Unknown


def same(got, want):
    """Equal dtype and values (flattened: an output of any shape holds its elements in order); NaN equals
    NaN, since AVG of a NaN may change its payload."""
    got, want = as_numpy(got), np.asarray(want)
    return got.dtype == want.dtype and got.size == want.size and \
        np.array_equal(got.reshape(-1), want.reshape(-1), equal_nan=got.dtype.kind in "fc")
