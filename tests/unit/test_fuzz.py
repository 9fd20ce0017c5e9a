"""No crash from any argument: the public API under random values, types, shapes, dtypes, layouts,
ranks, tags, split sizes and step indices (hypothesis), at world size 1.

The only outcomes allowed are a correct result (checked: at world size 1 every collective is an
identity or a copy, so the expected value is the input) or TypeError / ValueError / OverflowError /
DistError, and the default group still reduces correctly after every example. The first part holds
one regression test per defect the audit found (each crashed, wrapped or hung before its fix); the
second part is the fuzz. tests/mpi/test_fuzz.py does the same at world size 2.

hypothesis runs with a fixed seed and no example database, so a CI run is reproducible.
"""
import collections
import datetime
import gzip
import math
import os
import pickle
import sys
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, seed, settings
from hypothesis import strategies as st

import pydist as dist
from pydist import _C
from pydist.engine import Conv2d, Flatten, Linear, MaxPool2d, Model, ReLU, Trainer, lenet5, load_idx, mlp
from unit_helpers import assert_group_works

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fuzz_cases as fc  # noqa: E402  (tests/fuzz_cases.py, shared with tests/mpi/test_fuzz.py)
from fuzz_cases import ALLOWED, EDGE_INTS, GROUP_TOKENS, INT_MAX, SUPPORTED, UNSUPPORTED, Spec, junk, specs  # noqa

# Calls that write a file may also meet the file system's own refusal (a missing folder, a directory).
ALLOWED_WITH_FILES = ALLOWED + (OSError,)
SEED = 20240808
FUZZ = settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck))


# ---------------------------------------------------------------------------------------------------
# Regressions: each of these crashed, wrapped around or hung before the fix that added its check.

def tiny_trainer(**kwargs):
    return Trainer(mlp((8,), input_shape=(1, 4, 4)), batch_size=2, **kwargs)


def tiny_data(n=10, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 16)).astype(np.float32), rng.integers(0, 10, n).astype(np.int32)


def test_train_steps_whose_bound_overflowed_is_value_error():
    # end * world * batch wrapped past the bound check and the step loop read out of bounds (segfault)
    x, y = tiny_data()
    with pytest.raises(ValueError, match="step_end"):
        tiny_trainer().train_steps(x, y, 0, 0, 2**62 + 200000)


def test_engine_train_steps_bounds_are_exact():
    t = tiny_trainer()
    x, y = tiny_data()
    perm = np.arange(10, dtype=np.int32)
    sgd = (0.1, 0.0, 0.0, 0.0, False)
    assert t.engine.train_steps(x, y, perm, 0, 5, 2, -1, *sgd)[2] == 5   # 5 x 2 = all 10 entries
    for begin, end, batch, group, what in [
            (0, 6, 2, -1, "entries of `perm`"), (0, 2**31, 2, -1, "step_end"), (3, 2, 2, -1, "step_end"),
            (-1, 2, 2, -1, "step_end"), (0, 1, 0, -1, "`batch`"), (0, 1, 3, -1, "`batch`"),
            (0, 1, 2**40, -1, "`batch`"), (0, 1, 2, -5, "`group`"), (0, 1, 2, 4095, "`group`")]:
        with pytest.raises(ValueError, match=what):
            t.engine.train_steps(x, y, perm, begin, end, batch, group, *sgd)
    with pytest.raises(ValueError, match="out of range"):
        t.engine.train_steps(x, y, perm, 0, 2**63, 2, -1, *sgd)


@pytest.mark.parametrize("layers,shape,batch", [
    ([(4, 0, 0, 0, 0, 0), (0, 0, 2, 0, 0, 0)], (2**16, 2**15, 1), 1),      # flatten: c*h*w overflowed int
    ([(1, 1, 2, 1, 1, INT_MAX), (4, 0, 0, 0, 0, 0), (0, 4, 2, 0, 0, 0)], (1, 1, 1), 1),  # h + 2 padding
    ([(1, 1, 2, 1, 1, 2**30), (4, 0, 0, 0, 0, 0), (0, 4, 2, 0, 0, 0)], (1, 1, 1), 1),    # padded output
    ([(4, 0, 0, 0, 0, 0), (0, 2**16, 2**16, 0, 0, 0)], (1, 2**16, 1), 1),   # linear weights > 2^31
    ([(4, 0, 0, 0, 0, 0), (0, 1, 2**30, 0, 0, 0), (0, 2**30, 2, 0, 0, 0)], (1, 1, 1), 1),  # params sum
    ([(1, 2**16, 2**16, 1, 1, 0), (4, 0, 0, 0, 0, 0), (0, 2**16, 2, 0, 0, 0)], (2**16, 1, 1), 1),
    ([(1, 1, 1, 16, 1, 0), (4, 0, 0, 0, 0, 0), (0, 1, 2, 0, 0, 0)], (1, 16, 2**16), 2**12),  # im2col
    ([(4, 0, 0, 0, 0, 0), (0, 784, 2, 0, 0, 0)], (1, 28, 28), INT_MAX),    # input x batch
])
def test_model_sizes_that_overflow_are_value_errors(layers, shape, batch):
    # Before: products of ints wrapped, buffers were allocated too small (or absurdly large)
    with pytest.raises(ValueError, match="2\\^31 - 1 floats"):
        _C.Engine(layers, shape, batch)


def test_layer_values_beyond_c_int_are_overflow_errors():
    with pytest.raises(OverflowError, match="layer 1"):
        _C.Engine([(4, 0, 0, 0, 0, 0), (0, 16, 2**31, 0, 0, 0)], (1, 4, 4), 1)
    with pytest.raises(TypeError, match="layer 0"):
        _C.Engine([(4, 0, 0, "a", 0, 0)], (1, 4, 4), 1)


def test_checkpoint_keeps_a_negative_seed(tmp_path):
    # load() gave the seed back as an unsigned 64-bit number, which Trainer.load could not store
    t = tiny_trainer(seed=-1)
    t.save(tmp_path / "a.ckpt")
    assert tiny_trainer(seed=5).load(tmp_path / "a.ckpt").seed == -1
    with pytest.raises(ValueError, match="`step`"):
        t.engine.save(str(tmp_path / "b.ckpt"), -1, 0, 0, 0, 1, 1)


def test_paths_with_nul_are_value_errors_and_bytes_paths_work(tmp_path):
    # PyUnicode_AsUTF8 let "a\0b" through as the shorter name "a"
    t = tiny_trainer()
    with pytest.raises(ValueError, match="null"):
        t.engine.save(str(tmp_path / "a\0b"), 0, 0, 0, 0, 1, 1)
    with pytest.raises(ValueError, match="null"):
        load_idx(str(tmp_path / "i\0"), str(tmp_path / "l"))
    assert not os.path.exists(tmp_path / "a")
    with pytest.raises(TypeError, match="`path`"):
        t.engine.load(3)
    t.engine.save(os.fsencode(tmp_path / "c.ckpt"), 4, 1, 9, 64, 2, 32)
    assert t.engine.load(os.fsencode(tmp_path / "c.ckpt")) == (4, 1, 9, None, (64, 2, 32))


def test_labels_are_checked_before_narrowing_to_int32():
    # int64 label 2**32 + 1 became class 1 in astype(int32); float labels were truncated
    t = tiny_trainer()
    x, _ = tiny_data(4)
    with pytest.raises(ValueError, match="labels"):
        t.evaluate(x, np.array([2**32 + 1, 0, 0, 0]))
    with pytest.raises(TypeError, match="labels"):
        t.evaluate(x, np.array([1.7, 0, 0, 0]))
    with pytest.raises(TypeError, match="images"):
        t.evaluate(x.astype(np.complex64), np.zeros(4, np.int64))


def test_trainer_arguments_that_hung_or_divided_by_zero():
    t = tiny_trainer()
    x, y = tiny_data()
    with pytest.raises(ValueError, match="no examples"):          # ZeroDivisionError before
        t.evaluate(x[:0], y[:0])
    with pytest.raises(ValueError, match="chunk_steps"):          # an endless loop before
        t.fit(x, y, epochs=1, chunk_steps=0, progress=False)
    with pytest.raises(TypeError):                                # open(3) would write to fd 3
        t.fit(x, y, epochs=1, metrics=3, progress=False)
    with pytest.raises(ValueError, match="finite"):
        tiny_trainer(momentum=float("nan"))
    with pytest.raises(ValueError, match="input_shape"):
        Model([Flatten(), Linear(16, 2)], input_shape=(True, 4, 4))


def test_all_to_all_single_split_sizes():
    out, x = np.zeros((3, 2)), np.arange(6.0).reshape(3, 2)
    for splits in ([3], (3,), np.array([3]), [np.int64(3)], [], None):
        out[:] = 0
        dist.all_to_all_single(out, x, splits, splits)
        np.testing.assert_array_equal(out, x)
    for splits, exc, what in [
            ([2**63 - 1], ValueError, "summing"), ([2**64], ValueError, "summing"), ([-1], ValueError, "summing"),
            ([3, 0], ValueError, "one entry per rank"), ([True], TypeError, "ints"), ([3.0], TypeError, "ints"),
            (["3"], TypeError, "ints"), ("3", TypeError, "list of ints"), (3, TypeError, "list of ints")]:
        with pytest.raises(exc, match=what):
            dist.all_to_all_single(out, x, splits, [3])
        with pytest.raises(exc, match=what):
            dist.all_to_all_single(out, x, [3], splits)
    with pytest.raises(ValueError, match="to itself"):    # MPI left the rest of `out` untouched, silently
        dist.all_to_all_single(np.zeros((4, 2)), x)
    with pytest.raises(ValueError, match="to itself"):
        dist.all_to_all_single(np.zeros((3, 3)), x)


def test_torch_tensors_are_found_through_public_attributes_only():
    # is_torch_tensor read type->tp_dict, which is NULL for builtin types from Python 3.12 on
    p = torch.nn.Parameter(torch.ones(3))
    with torch.no_grad():
        dist.all_reduce(p)
    assert p.tolist() == [1.0, 1.0, 1.0]
    for bad in (5, 2.5, "x", None, [1.0], fc.Tensor(), np.float64(1.0)):
        with pytest.raises(TypeError, match="numpy.ndarray"):
            dist.all_reduce(bad)
    assert_group_works()


# ---------------------------------------------------------------------------------------------------
# The fuzz: collectives (the cases and their NumPy answers are in tests/fuzz_cases.py)

TALLY = collections.Counter()   # outcomes of call(), to show that a fuzz test reached both kinds


def call(fn, *args, allowed=ALLOWED, **kwargs):
    """fn's result, or the allowed exception it raised; a Work is waited for. Anything else fails."""
    name = getattr(fn, "__name__", str(fn))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the warnings of calls outside the group, of reduce_op
        try:
            result = fn(*args, **kwargs)
        except allowed as e:
            event(f"{name}: {type(e).__name__}")
            TALLY[name, "error"] += 1
            return None, e
    event(f"{name}: ok")
    TALLY[name, "ok"] += 1
    if isinstance(result, dist.Work):
        assert result.wait() is True
    return result, None


def build(value):
    return fc.build(value, 0, 1)


def run_and_tally(run, name, at_least=2):
    """Run a hypothesis test; `name` must have both succeeded and raised at least `at_least` times, or
    the fuzz did not reach one of the two kinds of outcome."""
    TALLY.clear()
    run()
    assert TALLY[name, "ok"] >= at_least and TALLY[name, "error"] >= at_least, dict(TALLY)


@pytest.mark.parametrize("name", fc.COLLECTIVES)
def test_fuzz_collectives(name):
    @seed(SEED)
    @settings(FUZZ, max_examples=25)
    @given(fc.collective_cases(1, name, torch_layout=True))
    def run(case):
        check_collective(case)
    run_and_tally(run, name, at_least=1 if name == "barrier" else 2)


def check_collective(case):
    kwargs = fc.resolve_aliases({k: build(v) for k, v in case.kwargs.items()})
    groups_ = fc.Groups(1)
    try:
        result, error = call(getattr(dist, case.name), **kwargs, group=groups_.get(case.group),
                             async_op=case.async_op)
    finally:
        groups_.close()
    if case.mode == "valid":
        assert error is None, f"a valid call raised {error!r}"
    if error is None and case.group in ("none", "world", "sub"):
        try:
            pairs = fc.expected_pairs(case, kwargs, 0, 1)
        except fc.Unknown:
            pairs = None
            assert case.mode != "valid"
        for got, want in pairs or []:
            assert fc.same(got, want), (case, got, want)
    assert_group_works()


def mostly(valid, weight=3):
    """`valid` most of the time, anything at all otherwise."""
    return st.integers(0, weight).flatmap(lambda i: valid if i else junk)


ranks = mostly(st.one_of(st.integers(-2, 3), st.sampled_from(EDGE_INTS)))
groups = mostly(st.sampled_from(GROUP_TOKENS), weight=4)


@seed(SEED)
@FUZZ
@given(fn=st.sampled_from(["send", "recv", "isend", "irecv"]), tensor=mostly(specs()), peer=ranks,
       tag=mostly(st.one_of(st.integers(-2, 40000), st.sampled_from(EDGE_INTS))), group=groups)
def test_fuzz_point_to_point(fn, tensor, peer, tag, group):
    # At world size 1 no peer is valid (every dst/src is this rank or outside the world); src=None,
    # receive from anyone, would wait forever, as in torch, and is left out.
    if fn in ("recv", "irecv") and peer is None:
        peer = 0
    groups_ = fc.Groups(1)
    try:
        result, error = call(getattr(dist, fn), build(tensor), peer, group=groups_.get(group), tag=tag)
    finally:
        groups_.close()
    assert error is not None or group == "outside", (fn, peer, tag, result)
    assert_group_works()


def short_or_refused(t):
    """A timeout a pending wait may be given here: refused (not a number, negative) or at most 50 ms.
    (NaN is left out: Work.wait(timeout=nan) waits for ever, reported to the lead.)"""
    if t is None:   # wait for ever
        return False
    try:
        v = float(t.total_seconds() if hasattr(t, "total_seconds") else t)
    except Exception:  # noqa: BLE001 -- wait() refuses it too
        return True
    return v <= 0.05 or isinstance(t, bool)   # NaN <= 0.05 is False


@seed(SEED)
@FUZZ
@given(kind=st.sampled_from(["all_reduce", "barrier", "pending irecv"]),
       method=st.sampled_from(["wait", "is_completed", "is_success", "exception", "result", "source_rank"]),
       timeout=mostly(st.one_of(st.none(), st.floats(0, 0.05), st.just(datetime.timedelta(milliseconds=5)))),
       extra=st.sampled_from([(), (), (), (1,), (1, 2)]))
def test_fuzz_work(kind, method, timeout, extra):
    if kind == "pending irecv" and (method == "wait" and not short_or_refused(timeout)):
        timeout = 0.01
    x = np.arange(3.0)
    work = {"all_reduce": lambda: dist.all_reduce(x, async_op=True),
            "barrier": lambda: dist.barrier(async_op=True),
            "pending irecv": lambda: dist.irecv(np.zeros(2))}[kind]()   # from anyone: nobody sends
    args = ((timeout,) if method == "wait" else ()) + extra
    result, error = call(getattr(work, method), *args)
    if error is None and method == "wait":
        assert result is True and kind != "pending irecv"
    if kind != "pending irecv":
        assert work.wait() is True and work.is_completed() and np.array_equal(x, np.arange(3.0))
    else:
        assert not work.is_completed()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)   # dropped while pending: parked, as designed
            del work
    assert_group_works()


# ---------------------------------------------------------------------------------------------------
# The fuzz: groups, queries, object collectives, monitored_barrier, check_op

@seed(SEED)
@FUZZ
@given(ranks_arg=mostly(st.lists(st.one_of(st.integers(-1, 2), st.sampled_from(EDGE_INTS)), max_size=3)),
       group=groups, rank=ranks, timeout=mostly(st.one_of(st.none(), st.floats(-1, 100))))
def test_fuzz_groups_and_queries(ranks_arg, group, rank, timeout):
    g_objs = fc.Groups(1)
    try:
        g, error = call(dist.new_group, ranks_arg, timeout=timeout)
        if error is None:
            g_objs.made.append(g)
            assert g.ranks == (sorted(int(r) for r in ranks_arg) if ranks_arg is not None else [0])
            assert call(dist.get_world_size, g)[0] == (len(g.ranks) if g.ranks else -1)
            x = np.array([2.5])
            call(dist.all_reduce, x, group=g)
            assert x[0] == 2.5
        target = g_objs.get(group)
        # get_process_group_ranks, get_global_rank and get_group_rank take only real groups here: given
        # another object they raise AttributeError (distributed.py; reported to the lead).
        real = g_objs.get(group if group in GROUP_TOKENS else "world")
        for fn, args in [(dist.get_rank, (target,)), (dist.get_world_size, (target,)),
                         (dist.get_backend, (target,)), (dist.get_process_group_ranks, (real,)),
                         (dist.get_global_rank, (real, rank)), (dist.get_group_rank, (real, rank))]:
            result, error = call(fn, *args)
            if error is None and fn is dist.get_rank:
                assert result in (0, -1)
            if error is None and fn is dist.get_global_rank:
                assert result == 0
    finally:
        g_objs.close()
    assert dist.is_initialized() and dist.is_available() and dist.is_mpi_available()
    assert_group_works()


picklable = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=4),
              st.binary(max_size=4)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.tuples(inner, inner),
                            st.dictionaries(st.text(max_size=2), inner, max_size=2)),
    max_leaves=6)
anything = st.one_of(picklable, picklable, picklable, st.just(lambda: 0))
# Unpicklable objects raise pickle's own errors, as in torch: PicklingError, or AttributeError for a
# local object.
PICKLE_ERRORS = (pickle.PicklingError, AttributeError)


@seed(SEED)
@FUZZ
@given(fn=st.sampled_from(["broadcast_object_list", "all_gather_object", "gather_object",
                           "scatter_object_list"]),
       obj=anything, objs=mostly(st.lists(anything, min_size=1, max_size=2)), root=mostly(st.just(0)),
       group=groups)
def test_fuzz_object_collectives(fn, obj, objs, root, group):
    g_objs = fc.Groups(1)
    g = g_objs.get(group)
    member = group in ("none", "world", "sub")
    lst = objs if isinstance(objs, list) else None
    try:
        if fn == "broadcast_object_list":
            kept = list(lst) if lst is not None else None
            _, error = call(dist.broadcast_object_list, objs, src=root, group=g, allowed=ALLOWED + PICKLE_ERRORS)
            if error is None and lst is not None:
                assert lst == kept   # the source's list is left as it was
        elif fn == "all_gather_object":
            out = [None] if lst is None else lst
            _, error = call(dist.all_gather_object, out, obj, group=g, allowed=ALLOWED + PICKLE_ERRORS)
            if error is None and member:
                assert out == [obj]
        elif fn == "gather_object":
            _, error = call(dist.gather_object, obj, lst, dst=root, group=g, allowed=ALLOWED + PICKLE_ERRORS)
            if error is None and member:
                assert lst == [obj]
        else:
            out = [None]
            _, error = call(dist.scatter_object_list, out, lst, src=root, group=g,
                            allowed=ALLOWED + PICKLE_ERRORS)
            if error is None and member:
                assert out == lst[:1]
    finally:
        g_objs.close()
    assert_group_works()


@seed(SEED)
@FUZZ
@given(timeout=mostly(st.one_of(st.none(), st.floats(-1, 100), st.sampled_from(
           [datetime.timedelta(seconds=5), datetime.timedelta(0), datetime.timedelta(seconds=-1)]))),
       wait_all=mostly(st.booleans()), group=groups)
def test_fuzz_monitored_barrier(timeout, wait_all, group):
    g_objs = fc.Groups(1)
    try:
        result, error = call(dist.monitored_barrier, group=g_objs.get(group), timeout=timeout,
                             wait_all_ranks=wait_all)
    finally:
        g_objs.close()
    assert error is not None or result is None
    assert_group_works()


@seed(SEED)
@FUZZ
@given(op=mostly(st.one_of(st.sampled_from(list(dist.ReduceOp)), st.integers(-2, 10))),
       dtype=mostly(st.sampled_from(SUPPORTED + UNSUPPORTED)))
def test_fuzz_check_op(op, dtype):
    result, error = call(_C.check_op, op, dtype)
    assert error is not None or result is None
    assert_group_works()


# ---------------------------------------------------------------------------------------------------
# The fuzz: the engine (_C.Engine, its methods and module functions)

SMALL = mostly(st.one_of(st.integers(-2, 5), st.sampled_from([-2**31 - 1, 2**31, 2**63, 2**64])), weight=5)
# Only small or out-of-range values: a valid layer list of large values would allocate gigabytes.
# Products that overflow are test_model_sizes_that_overflow_are_value_errors's business.
LINEAR, CONV2D, MAXPOOL2D, RELU, FLATTEN = range(5)


@st.composite
def small_models(draw):
    """(layers, input_shape, max_batch) of a valid small model: [conv, relu, [pool]], flatten, linear."""
    c, h, w = draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(1, 6))
    shape, layers = (c, h, w), []
    if draw(st.booleans()):
        out, pad = draw(st.integers(1, 3)), draw(st.integers(0, 1))
        k = draw(st.integers(1, min(h, w) + 2 * pad))
        stride = draw(st.integers(1, 2))
        layers += [(CONV2D, c, out, k, stride, pad), (RELU, 0, 0, 0, 0, 0)]
        c, h, w = out, (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        if min(h, w) >= 2 and draw(st.booleans()):
            layers.append((MAXPOOL2D, 0, 0, 2, 2, 0))
            h, w = h // 2, w // 2
    layers += [(FLATTEN, 0, 0, 0, 0, 0), (LINEAR, c * h * w, draw(st.integers(2, 4)), 0, 0, 0)]
    return layers, shape, draw(st.integers(1, 4))


@seed(SEED)
@settings(FUZZ, max_examples=120)
@given(model=small_models(), mode=st.sampled_from(["valid", "valid", "one_bad", "one_bad", "chaos"]),
       data=st.data())
def test_fuzz_engine_construction(model, mode, data):
    layers, shape, max_batch = model
    layers = [list(l) for l in layers]
    if mode != "valid":
        fields = [("layer", i, j) for i in range(len(layers)) for j in range(6)] + [("shape", i, 0) for i in range(3)]
        fields.append(("batch", 0, 0))
        chosen = [data.draw(st.sampled_from(fields))] if mode == "one_bad" else \
            [f for f in fields if data.draw(st.integers(0, 3)) == 0]
        shape = list(shape)
        for kind, i, j in chosen:
            if kind == "layer":
                layers[i][j] = data.draw(SMALL)
            elif kind == "shape":
                shape[i] = data.draw(SMALL)
            else:
                max_batch = data.draw(SMALL)
        if data.draw(st.integers(0, 5)) == 0:
            layers = data.draw(st.sampled_from([[], None, "layers", [layers[0][:5]], [tuple(layers[0]) + (0,)],
                                                [layers[0]] * 3]))
    if isinstance(layers, list):
        layers = [tuple(l) if isinstance(l, list) else l for l in layers]
    e, error = call(_C.Engine, layers, tuple(shape), max_batch)
    if mode == "valid":
        assert error is None, f"valid Engine({layers}, {shape}, {max_batch}) raised {error!r}"
    if error is None:
        assert e.num_params == sum(w + b for _, w, _, b in e.layout) and e.classes >= 2
        assert e.params.shape == e.grads.shape == e.momentum.shape == (e.num_params,)
        x = np.zeros((e.max_batch, int(np.prod(shape))), np.float32)
        assert e.forward(x).shape == (e.max_batch, e.classes)
    assert_group_works()


ENGINE = None


def engine():
    """One small engine (conv, pool, linear; 4 x 4 images, 3 classes, batches up to 4) for the method
    fuzz; its parameters are reset for each example."""
    global ENGINE
    if ENGINE is None:
        m = Model([Conv2d(1, 2, 3, padding=1), ReLU(), MaxPool2d(2), Flatten(), Linear(8, 3)], input_shape=(1, 4, 4))
        ENGINE = _C.Engine(m.specs(), m.input_shape, 4)
    ENGINE.init_params(0)
    ENGINE.momentum_started = False
    return ENGINE


def images_and_labels(n, seed_, classes=3, layout="plain"):
    rng = np.random.default_rng(seed_)
    x = fc.materialize(Spec("float32", (n, 16), seed_, layout))
    return x, rng.integers(0, classes, n).astype(np.int32)


def wrong(data, key, value):
    """Something wrong, or odd, for the engine argument `key` whose right value is `value`."""
    if isinstance(value, np.ndarray):
        options = [specs().map(build),
                   st.builds(lambda lay, s: fc.materialize(Spec(value.dtype, value.shape, s, lay)),
                             st.sampled_from(fc.BAD_LAYOUTS), st.integers(0, 99)),
                   st.sampled_from([value.astype(np.float64), value.astype(np.int64), value[:-1] if len(value)
                                    else value, value.reshape(-1), value[None], -np.ones_like(value),
                                    np.full_like(value, 2**30)])]
    elif isinstance(value, bool):
        options = [st.just(np.array([1, 2]))]   # a truth value NumPy refuses to give
    elif isinstance(value, float):
        options = [st.sampled_from([math.nan, math.inf, -1.0, 1e308, 10**400])]
    elif isinstance(value, int):
        options = [st.one_of(st.integers(-3, 12), st.sampled_from(EDGE_INTS))]
    else:
        # relative: the fuzz runs in a temporary folder (".": a folder, not a file)
        options = [st.sampled_from(["e\0.ckpt", "missing/e.ckpt", ".", b".", 3])]
    return data.draw(st.one_of(junk, *options))


@pytest.mark.parametrize("method", ["forward", "loss_and_grad", "sgd_step", "train_steps", "evaluate", "save",
                                    "load", "init_params", "momentum_started"])
def test_fuzz_engine_methods(tmp_path_factory, method):
    @seed(SEED)
    @settings(FUZZ, max_examples=30)
    @given(mode=st.sampled_from(["valid", "valid", "one_bad", "one_bad", "chaos"]), data=st.data())
    def run(mode, data):
        with fc.working_dir(tmp_path_factory.getbasetemp()):   # a fuzzed relative path lands here
            check_engine_method(tmp_path_factory, method, mode, data)
    run_and_tally(run, "setattr" if method == "momentum_started" else method,
                  at_least=1 if method == "momentum_started" else 2)


def check_engine_method(tmp_path_factory, method, mode, data):
    e = engine()
    n = data.draw(st.integers(1, 12))
    B = data.draw(st.integers(1, min(4, n)))
    x, y = images_and_labels(n, data.draw(st.integers(0, 99)), layout=data.draw(st.sampled_from(["plain"] * 3 + [
        "readonly"])))
    path = str(tmp_path_factory.getbasetemp() / "engine.ckpt")
    sgd = [data.draw(st.floats(0, 1)), data.draw(st.floats(0, 1)), 0.0, data.draw(st.floats(0, 0.1)),
           data.draw(st.booleans())]
    steps = n // B
    begin = data.draw(st.integers(0, steps))
    valid = {
        "forward": [x[:B]], "loss_and_grad": [x[:B], y[:B]], "sgd_step": sgd,
        "train_steps": [x, y, np.random.default_rng(n).permutation(n).astype(np.int32), begin,
                        data.draw(st.integers(begin, steps)), B, data.draw(st.sampled_from([-1, 0]))] + sgd,
        "evaluate": [x, y, begin, data.draw(st.integers(begin, n)), B],
        "save": [path, data.draw(st.integers(0, 2**63 - 1)), data.draw(st.integers(0, 99)),
                 data.draw(st.integers(-2**63, 2**63 - 1)), data.draw(st.integers(-1, 2**63 - 1)),
                 data.draw(st.integers(1, 2**63 - 1)), data.draw(st.integers(1, 2**63 - 1))],
        "load": [path], "init_params": [data.draw(st.integers(-2**63, 2**63 - 1))],
        "momentum_started": [data.draw(st.one_of(st.booleans(), junk))],
    }[method]
    args = list(valid)
    if mode != "valid":
        for i in ([data.draw(st.integers(0, len(args) - 1))] if mode == "one_bad" else range(len(args))):
            if mode == "one_bad" or data.draw(st.booleans()):
                args[i] = wrong(data, i, args[i])
        if data.draw(st.integers(0, 9)) == 0:   # a wrong number of arguments
            args = args[:-1] if data.draw(st.booleans()) else args + [0]
    if method == "momentum_started":
        _, error = call(setattr, e, "momentum_started", *args)
        assert error is not None or e.momentum_started == bool(args[0])
        assert_group_works()
        return
    if method == "load" and mode == "valid":
        e.save(path, 1, 2, 3, 0, 1, 1)
    result, error = call(getattr(e, method), *args, allowed=ALLOWED_WITH_FILES)
    if mode == "valid":
        assert error is None, f"valid {method}{tuple(args)!r} raised {error!r}"
    if error is None:
        check_engine_result(e, method, args, result)
    assert_group_works()


def check_engine_result(e, method, args, result):
    """What a call that succeeded must have done (args may be odd but acceptable ones)."""
    if method == "forward":
        assert result.shape == (len(args[0]), e.classes) and result.dtype == np.float32
    elif method == "loss_and_grad":
        assert 0 <= result[1] <= len(args[0])
        assert result[0] >= 0 or math.isnan(result[0])
    elif method == "train_steps":
        assert result[2] == args[4] - args[3]
    elif method == "evaluate":
        assert 0 <= result[1] <= args[3] - args[2]
    elif method == "save":
        # no compression state; a position of -1 (unknown) comes back as None
        assert e.load(args[0]) == (*args[1:4], None, tuple(args[4:7]) if args[4] >= 0 else None)
    elif method == "load":
        assert len(result) == 5 and result[4] == (0, 1, 1)


@seed(SEED)
@FUZZ
@given(n=mostly(st.one_of(st.integers(-2, 50), st.sampled_from(EDGE_INTS))), seed_=mostly(st.integers()),
       epoch=mostly(st.one_of(st.integers(-2, 5), st.sampled_from(EDGE_INTS))),
       threads=mostly(st.one_of(st.just(1), st.integers(-2, 0), st.sampled_from([1025, 2**31, 2**63]))))
def test_fuzz_engine_module_functions(n, seed_, epoch, threads):
    # n up to 2**31 - 1 is valid and takes gigabytes: only small n are drawn valid
    if type(n) is int and 50 < n < 2**31:
        n = 50
    perm, error = call(_C.epoch_permutation, n, seed_, epoch)
    if error is None:
        assert perm.dtype == np.int32 and np.array_equal(np.sort(perm), np.arange(n))
    _, error = call(_C.set_blas_threads, threads)
    assert error is not None or (type(threads) is int and 1 <= threads <= 1024)
    _C.set_blas_threads(1)
    assert_group_works()


@seed(SEED)
@FUZZ
@given(magic=st.sampled_from([0x803, 0x803, 0x801, 0, 0xFFFFFFFF]),
       dims=st.one_of(st.lists(st.integers(1, 5), min_size=3, max_size=3),
                      st.lists(st.one_of(st.integers(0, 5), st.sampled_from([2**28, 2**28 + 1, 2**32 - 1])),
                               max_size=3)),
       extra=st.sampled_from([0, 0, 0, 1, -1, -3]), gz=st.booleans(), labels_n=st.one_of(st.none(), st.integers(0, 5)),
       label=st.integers(0, 255))
def test_fuzz_load_idx(tmp_path_factory, magic, dims, extra, gz, labels_n, label):
    """IDX files with any header: a ValueError naming the file, or arrays that match the header."""
    folder = tmp_path_factory.getbasetemp()
    n_bytes = max(0, math.prod(d for d in dims if d < 2**20) + extra)
    labels_n = dims[0] if labels_n is None and dims and dims[0] < 2**20 else (labels_n or 0)
    opener = gzip.open if gz else open
    with opener(folder / "img", "wb") as f:
        f.write(magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in dims) + bytes(n_bytes))
    with opener(folder / "lab", "wb") as f:
        f.write((0x801).to_bytes(4, "big") + labels_n.to_bytes(4, "big") + bytes([label] * labels_n))
    result, error = call(load_idx, folder / "img", folder / "lab")
    if error is None:
        images, labels = result
        assert images.shape == tuple(dims) and labels.shape == (dims[0],) and images.dtype == np.float32
        assert (labels == label).all()
    assert_group_works()


# ---------------------------------------------------------------------------------------------------
# The fuzz: the Python front of the engine (layers, Model, Trainer)

@seed(SEED)
@FUZZ
@given(kind=st.sampled_from(["Linear", "Conv2d", "MaxPool2d", "mlp", "lenet5", "Model"]),
       a=SMALL, b=SMALL, c=SMALL, d=SMALL, e_=SMALL, shape=st.one_of(st.tuples(SMALL, SMALL, SMALL), junk))
def test_fuzz_layers_and_models(kind, a, b, c, d, e_, shape):
    if kind == "Linear":
        call(Linear, a, b)
    elif kind == "Conv2d":
        call(Conv2d, a, b, c, stride=d, padding=e_)
    elif kind == "MaxPool2d":
        call(MaxPool2d, a)
    elif kind == "mlp":
        m, error = call(mlp, hidden=(a,) if not isinstance(a, list) else a, classes=b, input_shape=shape)
        if error is None:
            assert m.num_params > 0
    elif kind == "lenet5":
        m, error = call(lenet5, a)
        if error is None:
            assert m.num_params == 61706 - 850 + 85 * a
    else:
        layers = [Conv2d(1, 2, 3), ReLU(), Flatten(), Linear(8, 2)] if a == 0 else [a, b]
        call(Model, layers, input_shape=shape)
    assert_group_works()


def tiny_model():
    return mlp((6,), classes=3, input_shape=(1, 4, 4))


@pytest.mark.parametrize("method", ["init", "train_steps", "evaluate", "fit", "save_load", "steps_per_epoch"])
def test_fuzz_trainer(tmp_path_factory, method):
    @seed(SEED)
    # save_load has one argument to spoil against six of Trainer's: more draws, so the path goes wrong
    # often enough to count (each is a save and a load of a tiny model, milliseconds)
    @settings(FUZZ, max_examples=60 if method == "save_load" else 25)
    @given(mode=st.sampled_from(["valid", "valid", "one_bad", "one_bad", "chaos"]), data=st.data())
    def run(mode, data):
        with fc.working_dir(tmp_path_factory.getbasetemp()):   # a fuzzed relative path lands here
            check_trainer(tmp_path_factory, method, mode, data)
    run_and_tally(run, {"init": "Trainer", "save_load": "save"}.get(method, method))


def check_trainer(tmp_path_factory, method, mode, data):
    folder = tmp_path_factory.getbasetemp()
    n = data.draw(st.integers(0, 12))
    x, y = images_and_labels(n, data.draw(st.integers(0, 99)))
    init = {"lr": data.draw(st.floats(0.001, 1)), "momentum": data.draw(st.floats(0, 1)),
            "weight_decay": data.draw(st.floats(0, 0.1)), "dampening": data.draw(st.floats(0, 1)),
            "batch_size": data.draw(st.integers(1, 4)), "seed": data.draw(st.integers(-2**63, 2**63 - 1))}
    steps = n // init["batch_size"]
    first = data.draw(st.integers(0, steps))
    call_args = {
        "init": {}, "steps_per_epoch": {"n": n},
        "train_steps": {"images": x, "labels": y, "epoch": data.draw(st.integers(0, 3)), "first": first,
                        "last": data.draw(st.integers(first, steps))},
        "evaluate": {"images": x, "labels": y, "batch_size": data.draw(st.integers(1, 600))},
        # no large valid epoch counts: fit trains them all
        "fit": {"images": x, "labels": y, "epochs": data.draw(st.integers(0, 2)), "chunk_steps": data.draw(
            st.integers(1, 4)), "checkpoint": data.draw(st.sampled_from([None, str(folder / "fit.ckpt")]))},
        "save_load": {"path": str(folder / "trainer.ckpt")},
    }[method]
    valid = mode == "valid" and not (method == "fit" and steps < 1) and not (method == "evaluate" and n == 0)
    if mode != "valid":
        pool = list(init) + list(call_args)
        one = data.draw(st.sampled_from(list(call_args) or list(init)) if data.draw(st.booleans()) else
                        st.sampled_from(list(init)))
        for key in ([one] if mode == "one_bad" else pool):
            if mode == "chaos" and not data.draw(st.booleans()):
                continue
            target = init if key in init else call_args
            if key == "epochs":   # finite junk only: fit(epochs=10**9) would train for ever, correctly
                target[key] = data.draw(st.sampled_from([-1, 1.5, math.nan, -math.inf, None, "2", [1],
                                                         np.int64(1), object()]))
            else:
                target[key] = wrong(data, key, target[key])
    trainer, error = call(Trainer, tiny_model(), **init)
    if valid:
        assert error is None, f"Trainer(**{init}) raised {error!r}"
    if error is not None:
        trainer = Trainer(tiny_model(), batch_size=2)
    if method == "train_steps":
        result, error = call(trainer.train_steps, **call_args)
        if error is None:
            assert result[2] == call_args["last"] - call_args["first"]
    elif method == "evaluate":
        result, error = call(trainer.evaluate, **call_args)
        if error is None:
            assert 0.0 <= result["accuracy"] <= 1.0
    elif method == "fit":
        result, error = call(trainer.fit, **call_args, progress=False, allowed=ALLOWED_WITH_FILES)
        if error is None and type(call_args["epochs"]) is int:
            assert len(result) == max(0, call_args["epochs"]) and trainer.epoch == len(result)
    elif method == "save_load":
        _, error = call(trainer.save, **call_args, allowed=ALLOWED_WITH_FILES)
        if error is None:
            loaded = Trainer(tiny_model(), batch_size=2).load(call_args["path"])
            assert (loaded.step, loaded.epoch, loaded.seed) == (trainer.step, trainer.epoch, trainer.seed)
            assert np.array_equal(loaded.params, trainer.params)
        call(trainer.load, **call_args, allowed=ALLOWED_WITH_FILES)
    elif method == "steps_per_epoch":
        result, error = call(trainer.steps_per_epoch, **call_args)
    if valid:
        assert error is None, f"valid {method}({call_args}) raised {error!r}"
    _C.set_blas_threads(1)
    assert_group_works()
