"""No crash, no hang from any argument at world size 2: the public API under random values, types,
shapes, dtypes, layouts, roots, peers, tags, split sizes and step indices (hypothesis).

Every rank must make the same calls in the same order, so hypothesis runs on rank 0 only (a fixed seed,
no example database, no shrinking) and sends each case it draws to the other ranks, which run the same
check on it. (Seeding hypothesis alike on every rank was not enough: the ranks drew different cases,
probably because hypothesis also draws constants it finds in the modules each process has loaded.)
Outcomes allowed: a correct result (compared with the answer each rank computes alone with NumPy,
tests/fuzz_cases.py) or TypeError / ValueError / OverflowError / DistError, and after every example the
world still reduces correctly.

What torch leaves to the caller stays with the caller here: an argument that is valid on one rank and
not on another (a gather_list on the wrong rank, a read-only array on a broadcast's receiver) makes
that rank raise and the others wait for it. So for collectives every rank first runs the call's
argument checks alone (_C.set_validate_only, the PYDIST_DEBUG=DETAIL mechanism), the ranks compare
verdicts, and the call is made only where every rank passed. Point-to-point operations are posted
asynchronously, and an operation whose partner failed its checks is completed by a stand-in partner.
"""
import collections
import os
import sys
import warnings
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

import pydist as dist
from pydist import _C
from pydist.engine import Trainer, mlp
from helpers import parallel_assert

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fuzz_cases as fc  # noqa: E402  (tests/fuzz_cases.py, shared with tests/unit/test_fuzz.py)
from fuzz_cases import ALLOWED, EDGE_INTS, Spec, junk, specs  # noqa: E402

SEED = 20240808
SAME_ON_EVERY_RANK = settings(database=None, deadline=None, phases=[Phase.explicit, Phase.generate],
                              suppress_health_check=list(HealthCheck), max_examples=20)
pytestmark = pytest.mark.world_size(min=2, max=2)
WAIT_S = 30.0   # hang guard on every wait; a quiet machine needs milliseconds
MODES = st.sampled_from(["valid", "valid", "one_bad", "one_bad", "chaos"])


def assert_world_works():
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.array([rank + 1.0, -2.0 * rank])
    dist.all_reduce(x)
    assert x[0] == size * (size + 1) / 2 and x[1] == -size * (size - 1), x


def everyone(flag):
    """Each rank's flag, on every rank."""
    flags = np.zeros(dist.get_world_size(), np.int64)
    dist.all_gather_into_tensor(flags, np.array([int(flag)], np.int64))
    return flags.astype(bool)


TALLY = collections.Counter()   # outcomes of call(), to show that a fuzz test reached both kinds


def call(fn, *args, allowed=ALLOWED, **kwargs):
    """fn's result, or the allowed exception it raised. Anything else propagates."""
    name = getattr(fn, "__name__", str(fn))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = fn(*args, **kwargs)
        except allowed as e:
            TALLY[name, "error"] += 1
            return None, e
    TALLY[name, "ok"] += 1
    return result, None


def example(check, case):
    """Run one example's check on every rank; all ranks fail together (an unexpected exception on one
    rank would otherwise leave the others waiting for it in the next collective)."""
    problem = ""
    try:
        problem = check(*case) or ""
    except Exception as e:  # noqa: BLE001 -- reported on every rank below
        problem = f"{type(e).__name__}: {e}"
    parallel_assert(not problem, f"{problem}\n  case: {case!r}")
    assert_world_works()


_DONE = "no more cases"


def fuzz(strategy, check, max_examples=20, reached=()):
    """check(*case) on every rank for each case hypothesis draws (on rank 0) from `strategy`. Each call
    named in `reached` must have both succeeded and raised at least once on every rank."""
    TALLY.clear()
    _fuzz(strategy, check, max_examples)
    missing = [(name, kind) for name in reached for kind in ("ok", "error") if TALLY[name, kind] == 0]
    parallel_assert(not missing, f"the fuzz never reached {missing}: {dict(TALLY)}")


def _fuzz(strategy, check, max_examples):
    if dist.get_rank() == 0:
        @seed(SEED)
        @settings(SAME_ON_EVERY_RANK, max_examples=max_examples)
        @given(strategy)
        def run(case):
            dist.broadcast_object_list([case], src=0)
            example(check, case)
        try:
            run()
        finally:
            dist.broadcast_object_list([_DONE], src=0)
        return
    failure = None
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0)
        if isinstance(box[0], str) and box[0] == _DONE:
            break
        try:
            example(check, box[0])
        except AssertionError as e:   # rank 0 failed too; it replays the example once, then stops
            failure = e
    if failure is not None:
        raise failure


# ---------------------------------------------------------------------------------------------------
# Collectives

def run_collective(case):
    rank, size = dist.get_rank(), dist.get_world_size()
    fn = getattr(dist, case.name)
    kwargs = fc.resolve_aliases({k: fc.build(v, rank, size) for k, v in case.kwargs.items()})
    groups = fc.Groups(size)
    try:
        group = groups.get(case.group)
        _C.set_validate_only(True)   # the checks alone: nothing is sent
        try:
            _, probe_error = call(fn, **kwargs, group=group, async_op=case.async_op)
        finally:
            _C.set_validate_only(False)
        passed = everyone(probe_error is None)
        if case.mode == "valid" and not passed.all():
            return f"a valid {case.name} failed its checks on ranks {np.flatnonzero(~passed)}: {probe_error!r}"
        if not passed.all():
            return ""   # refused by every rank, or per-rank validity: torch would wait here too
        result, error = call(fn, **kwargs, group=group, async_op=case.async_op)
        if error is not None:
            return f"{case.name} passed its checks, then raised {error!r}"
        if isinstance(result, dist.Work):
            result.wait(timeout=WAIT_S)
    finally:
        groups.close()
    if case.group not in ("none", "world", "sub"):
        return ""
    try:
        pairs = fc.expected_pairs(case, kwargs, rank, size)
    except fc.Unknown:
        return "the valid case has no expected value" if case.mode == "valid" else ""
    bad = [i for i, (got, want) in enumerate(pairs) if not fc.same(got, want)]
    return f"{case.name}: wrong values in output(s) {bad}" if bad else ""


@pytest.mark.parametrize("name", fc.COLLECTIVES)
def test_fuzz_collectives(name):
    # barrier has no arguments of its own, so fewer draws are bad ones: 20 of them missed every error now
    # and then (1 run in 5 on an EPYC, from the same generator); 60 reach both kinds
    fuzz(fc.collective_cases(2, name).map(lambda case: (case,)), run_collective,
         max_examples=60 if name == "barrier" else 20, reached=[name])


# ---------------------------------------------------------------------------------------------------
# Point-to-point: rank `sender` sends to rank 1 - sender, which receives; both are posted nonblocking,
# and an operation whose partner failed its checks gets a stand-in partner, so none is left pending.

@st.composite
def p2p_cases(draw):
    dtype = draw(st.sampled_from(fc.SUPPORTED))
    spec = Spec(dtype, draw(fc.shapes), draw(fc.seeds), "plain")
    sender = draw(st.integers(0, 1))
    args = {"send_tensor": spec, "recv_tensor": spec, "dst": 1 - sender,
            "src": draw(st.sampled_from([sender, None])), "tag": draw(st.integers(0, 32767)),
            "group": draw(st.sampled_from(["none", "world", "sub"]))}
    mode = draw(MODES)
    keys = list(args)
    for key in ([draw(st.sampled_from(keys))] if mode == "one_bad" else keys if mode == "chaos" else []):
        if mode == "chaos" and not draw(st.booleans()):
            continue
        if key.endswith("tensor"):
            args[key] = draw(st.one_of(junk, specs(), st.builds(Spec, st.just(dtype), fc.shapes, fc.seeds,
                                                                 st.sampled_from(fc.BAD_LAYOUTS))))
        elif key in ("dst", "src"):
            args[key] = draw(st.one_of(junk, st.integers(-2, 3), st.sampled_from(EDGE_INTS)))
        elif key == "tag":
            args[key] = draw(st.one_of(junk, st.integers(-3, 3), st.sampled_from(EDGE_INTS)))
        else:
            args[key] = draw(st.one_of(st.sampled_from(["destroyed", "outside"]), junk))
    return sender, args, mode, draw(st.booleans())


def run_p2p(sender, a, mode, blocking):
    rank = dist.get_rank()
    if rank > 1:
        return ""
    groups = fc.Groups(dist.get_world_size())
    try:
        group = groups.get(a["group"])
        is_sender = rank == sender
        mine = fc.build(a["send_tensor"] if is_sender else a["recv_tensor"], rank, 2)
        if is_sender:
            work, error = call(dist.isend, mine, a["dst"], group=group, tag=a["tag"])
        else:
            work, error = call(dist.irecv, mine, a["src"], group=group, tag=a["tag"])
        posted = everyone(error is None and work is not None)
        if mode == "valid" and not posted[:2].all():
            return f"a valid {'isend' if is_sender else 'irecv'} raised {error!r}"
        stand_in = None
        if posted[sender] and not posted[1 - sender] and not is_sender:
            # the send is posted: receive it into an array of the sender's dtype and size
            like = fc.build(a["send_tensor"], sender, 2)
            stand_in = dist.irecv(np.empty_like(like), sender, group=group, tag=a["tag"])
        elif posted[1 - sender] and not posted[sender] and is_sender:
            stand_in = dist.isend(np.zeros(0, np.uint8), 1 - sender, group=group, tag=a["tag"])   # matches any receive
        for w in (work, stand_in):
            if w is not None:
                # a receive smaller than the message fails here, as MPI's truncation error
                _, error = call(w.wait, timeout=WAIT_S)
                if error is not None and not (not is_sender and isinstance(error, dist.DistBackendError)):
                    return f"wait raised {error!r}"
        if posted[:2].all() and a["send_tensor"] == a["recv_tensor"] and isinstance(a["send_tensor"], Spec) \
                and a["group"] in ("none", "world", "sub") and not is_sender:
            if not fc.same(mine, fc.build(a["send_tensor"], sender, 2)) or work.source_rank() != sender:
                return f"irecv got {mine!r} from {work.source_rank()}"
        if blocking and mode == "valid":   # the blocking forms, with the same valid arguments
            if is_sender:
                dist.send(mine, a["dst"], group=group, tag=a["tag"])
            else:
                got = np.zeros_like(mine)
                if dist.recv(got, a["src"], group=group, tag=a["tag"]) != sender or not fc.same(got, mine):
                    return "recv got the wrong data or sender"
    finally:
        groups.close()
    return ""


def test_fuzz_point_to_point():
    fuzz(p2p_cases(), run_p2p, max_examples=80, reached=["isend" if dist.get_rank() == 0 else "irecv"])


# ---------------------------------------------------------------------------------------------------
# Groups, object collectives, monitored_barrier

picklable = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=4)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=2), inner, max_size=2)),
    max_leaves=5)


def run_objects(fn, obj, root, group_token):
    """Valid calls, or a bad root that every rank refuses alike. (A list missing on the root alone would
    make that rank raise while the others wait for it, as in torch: not drawn.)"""
    rank, size = dist.get_rank(), dist.get_world_size()
    groups = fc.Groups(size)
    member = group_token in ("none", "world", "sub")
    valid_root = type(root) is int and 0 <= root < size
    mine = (rank, obj)
    try:
        g = groups.get(group_token)
        if fn == "broadcast_object_list":
            lst = [(root, obj), "x"] if rank == root else [None, None]
            _, error = call(dist.broadcast_object_list, lst, src=root, group=g)
            want = [(root, obj), "x"]
            got = lst
        elif fn == "all_gather_object":
            got = [None] * size
            _, error = call(dist.all_gather_object, got, mine, group=g)
            want = [(r, obj) for r in range(size)]
        elif fn == "gather_object":
            got = [None] * size if rank == root else None
            _, error = call(dist.gather_object, mine, got, dst=root, group=g)
            want = [(r, obj) for r in range(size)] if rank == root else None
        else:
            got = [None]
            _, error = call(dist.scatter_object_list, got, [(r, obj) for r in range(size)] if rank == root
                            else None, src=root, group=g)
            want = [(rank, obj)]
    finally:
        groups.close()
    if group_token == "destroyed" or member and not valid_root and fn != "all_gather_object":
        return "" if error is not None else f"{fn} with root {root!r}, group {group_token} did not raise"
    if error is not None:
        return f"{fn} raised {error!r}"
    if member and got != want:
        return f"{fn} gave {got!r}, not {want!r}"
    return ""


def test_fuzz_object_collectives():
    fuzz(st.tuples(st.sampled_from(["broadcast_object_list", "all_gather_object", "gather_object",
                                    "scatter_object_list"]),
                   picklable, st.one_of(st.integers(0, 1), st.integers(0, 1), st.sampled_from([-1, 2, 2**63]),
                                        st.sampled_from([None, "0", 0.0])),
                   st.sampled_from(["none", "world", "sub", "outside", "destroyed"])),
         run_objects, max_examples=40,
         reached=["broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list"])


def run_groups(ranks_arg, timeout):
    rank = dist.get_rank()
    g, error = call(dist.new_group, ranks_arg, timeout=timeout)
    if error is not None:
        return ""
    try:
        members = g.ranks
        x = np.array([rank + 1.0])
        call(dist.all_reduce, x, group=g)
        want = sum(r + 1.0 for r in members) if rank in members else rank + 1.0
        if x[0] != want or dist.get_world_size(g) != (len(members) if rank in members else -1):
            return f"group {members}: sum {x[0]}, want {want}"
        for r in range(dist.get_world_size()):
            got, error = call(dist.get_group_rank, g, r)
            if (got, error is None) != ((members.index(r), True) if r in members else (None, False)):
                return f"get_group_rank({members}, {r}) gave {got}, {error!r}"
    finally:
        dist.destroy_process_group(g)
    return ""


def test_fuzz_new_group():
    fuzz(st.tuples(st.one_of(st.lists(st.integers(0, 1), max_size=3), st.lists(st.integers(-2, 3), max_size=3),
                             st.none(), junk),
                   st.one_of(st.none(), st.just(30.0), junk)),
         run_groups, max_examples=40, reached=["new_group"])


def run_monitored_barrier(timeout, wait_all, group_token):
    groups = fc.Groups(dist.get_world_size())
    try:
        result, error = call(dist.monitored_barrier, group=groups.get(group_token), timeout=timeout,
                             wait_all_ranks=wait_all)
    finally:
        groups.close()
    if error is None and result is not None:
        return f"monitored_barrier returned {result!r}"
    return ""


def test_fuzz_monitored_barrier():
    # Positive timeouts are 30 s only: a short one would let rank 0 give up on a rank that is merely
    # slow (correctly), and leave that rank waiting for a release that does not come.
    fuzz(st.tuples(st.one_of(st.none(), st.just(30.0), st.sampled_from([-1.0, 0, "30", [30]]), junk.filter(
                       lambda t: not isinstance(t, (int, float)) or isinstance(t, bool) or t <= 0)),
                   st.one_of(st.booleans(), junk),
                   st.sampled_from(["none", "world", "sub", "destroyed", "outside"])),
         run_monitored_barrier, max_examples=30, reached=["monitored_barrier"])


# ---------------------------------------------------------------------------------------------------
# The engine at world size 2: Trainer (every rank must raise together when rank 0's file fails)

def params_agree(trainer):
    crc = zlib.crc32(np.ascontiguousarray(trainer.params).tobytes())
    crcs = np.zeros(dist.get_world_size(), np.int64)
    dist.all_gather_into_tensor(crcs, np.array([crc], np.int64))
    return (crcs == crcs[0]).all()


def run_trainer(method, mode, data_seed, n, batch, a, b, path_token, folder):
    rng = np.random.default_rng(data_seed)
    x, y = rng.standard_normal((n, 16)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32)
    t = Trainer(mlp((6,), classes=3, input_shape=(1, 4, 4)), batch_size=batch, seed=data_seed)
    path = {"ok": os.path.join(folder, "t.ckpt"), "missing": os.path.join(folder, "no", "t.ckpt"),
            "dir": folder, "nul": "t\0.ckpt"}.get(path_token, path_token) if isinstance(path_token, str) else path_token
    files = ALLOWED + (OSError,)
    if method == "train_steps":
        result, error = call(t.train_steps, x, y, 0, a, b)
        if error is None and result[2] != b - a:
            return f"train_steps({a}, {b}) took {result[2]} steps"
    elif method == "engine_train_steps":   # _C.Engine.train_steps on the world group, any step indices
        perm = _C.epoch_permutation(n, 0, 0)
        result, error = call(t.engine.train_steps, x, y, perm, a, b, batch, 0, 0.1, 0.0, 0.0, 0.0, False)
        if error is None and result[2] != b - a:
            return f"train_steps({a}, {b}) took {result[2]} steps"
    elif method == "evaluate":
        result, error = call(t.evaluate, x, y, batch_size=a)
    elif method == "fit":
        _, error = call(t.fit, x, y, epochs=1, chunk_steps=b, progress=False, checkpoint=path,
                        metrics=path + ".jsonl" if isinstance(path, str) else path, allowed=files)
    else:
        def save_then_load():
            t.save(path)
            t.step = 7
            return t.load(path).step
        step, error = call(save_then_load, allowed=files)
        if error is None and step != 0:
            return f"load gave step {step}, not 0"
    errors = everyone(error is not None)
    if errors.any() and not errors.all():
        return f"{method}: rank(s) {np.flatnonzero(errors)} raised alone: {error!r}"
    if mode == "valid" and error is not None:
        return f"valid {method} raised {error!r}"
    if not params_agree(t):
        return "the ranks' parameters differ"
    return ""


steps = st.one_of(st.integers(0, 4), st.integers(-2, 6), st.sampled_from(EDGE_INTS), junk)


@pytest.mark.parametrize("method", ["train_steps", "engine_train_steps", "evaluate", "fit", "save_load"])
def test_fuzz_trainer(method, tmp_path_factory):
    # One folder every rank shares: rank 0's, sent to the others.
    folder = str(tmp_path_factory.mktemp("fuzz")) if dist.get_rank() == 0 else ""
    box = [folder]
    dist.broadcast_object_list(box, src=0)
    folder = box[0]

    def check(mode, data_seed, n, batch, a, b, path):
        if mode == "valid":   # a case every rank must run through: steps within the data, a good path
            n = max(n, 2 * batch)
            avail = n // (2 * batch)   # steps of one global batch (2 ranks x batch) in the data
            a = data_seed % (avail + 1)
            b = a + (data_seed // 3) % (avail - a + 1)
            if method == "evaluate":
                a = 1 + data_seed % 5          # the batch size
            if method == "fit":
                b = 1 + data_seed % 3          # chunk_steps
            path = "ok"
        with fc.working_dir(folder):   # a fuzzed relative path lands here
            return run_trainer(method, mode, data_seed, n, batch, a, b, path, folder)

    fuzz(st.tuples(MODES, st.integers(0, 99), st.integers(0, 12), st.integers(1, 3), steps, steps,
                   st.one_of(st.sampled_from(["ok", "missing", "dir", "nul"]), junk)), check, max_examples=15,
         reached=[{"engine_train_steps": "train_steps", "save_load": "save_then_load"}.get(method, method)])


@pytest.mark.world_size(min=3)
def test_split_sizes_whose_sum_wraps_are_value_errors():
    # [2**63 - 1, 2**63 - 1, 2] summed to 0 in 64 bits, passed as the 0 rows of an empty array, and
    # the call returned having delivered nothing, silently.
    size = dist.get_world_size()
    splits = [2**63 - 1, 2**63 - 1, 2] + [0] * (size - 3)
    empty = np.zeros((0, 4))
    for out_splits, in_splits in [(splits, [0] * size), ([0] * size, splits)]:
        with pytest.raises(ValueError, match="split_sizes"):
            dist.all_to_all_single(empty, empty.copy(), out_splits, in_splits)
    assert_world_works()


@pytest.mark.world_size(min=2)
@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "uint64"])
def test_unsigned_min_and_max_compare_as_unsigned(dtype):
    # Found by the fuzz: MPICH 4.0.2 compares unsigned integers as signed in MPI_MIN/MPI_MAX, so that
    # MIN(1, 200) on uint8 was 200 (pmodels/mpich#6083); dtypes.c now uses its own ops where MPI errs.
    rank, size = dist.get_rank(), dist.get_world_size()
    top = np.iinfo(dtype).max
    inputs = [np.array([1, top, top // 2 + 1, r, top - r], dtype) for r in range(size)]
    ok = True
    for op, ufunc in [(dist.ReduceOp.MIN, np.minimum), (dist.ReduceOp.MAX, np.maximum)]:
        want = ufunc.reduce(np.stack(inputs))
        x = inputs[rank].copy()
        dist.all_reduce(x, op=op)
        ok &= np.array_equal(x, want)
        for root in range(size):
            y = inputs[rank].copy()
            dist.reduce(y, dst=root, op=op)
            ok &= np.array_equal(y, want if rank == root else inputs[rank])
        out = np.zeros(5, dtype)
        dist.reduce_scatter_tensor(out, np.concatenate([inputs[rank]] * size), op=op)
        ok &= np.array_equal(out, want)
    parallel_assert(ok, f"{dtype}: unsigned MIN/MAX")
