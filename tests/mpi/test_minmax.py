"""MIN and MAX on floats with NaN, signed zeros and infinities, on every path (csrc/core/minmax.h).

The rule, the same on every path and dtype: any NaN among the inputs gives NaN (as np.minimum and
np.maximum), the format's canonical quiet NaN whatever NaNs came in; otherwise the smallest or largest
value with -0.0 below +0.0 (MIN(-0.0, +0.0) = -0.0, MAX = +0.0). It is commutative and associative,
so every rank gets bitwise the same result whatever order the path meets the inputs in. At one rank
nothing is combined and the result is the input, NaN payloads and all. Before it, the same inputs gave [nan, nan] on the shared-memory
paths, [nan, 1.0] on the ring, and [1.0, nan] on rank 0 but [nan, 1.0] on rank 1 through MPI.

Each rank rebuilds every rank's input (make_bits), computes the expected bits alone with NumPy
(reference_bits, a twin of the rule written from the values, not from minmax.h's integer keys), checks
its own result's bits, and the ranks compare their results' digests. Paths: the automatic choice (the
small collectives in shared memory up to 64 KiB, the persistent requests up to 8 KiB), on ordinary
arrays and on dist.empty ones (the zero-copy shm all-reduce from 64 KiB), algorithm="shm" (staging
buffers; and 64-byte ones, many rounds), "ring", "mpi", the small path off, and the persistent
requests off (PYDIST_PERSISTENT_BYTES=0, a new session); sizes on both sides of every threshold.
"""
import contextlib
import hashlib
import os
import zlib

import ml_dtypes
import numpy as np
import pytest

import pydist as dist
from helpers import parallel_assert

TEST_TIMEOUT_S = float(os.environ.get("PYDIST_TEST_TIMEOUT", "60"))
MIN, MAX = dist.ReduceOp.MIN, dist.ReduceOp.MAX
PERSISTENT_BYTES, SMALL_BYTES = 8192, 65536

# name: (array dtype, its bits' dtype, exponent bits, mantissa bits)
FORMATS = {"float16": (np.dtype(np.float16), np.uint16, 5, 10),
           "bfloat16": (np.dtype(ml_dtypes.bfloat16), np.uint16, 8, 7),
           "float32": (np.dtype(np.float32), np.uint32, 8, 23),
           "float64": (np.dtype(np.float64), np.uint64, 11, 52)}


# ---------------------------------------------------------------------------------------------------
# Inputs and the reference

def values(bits, fmt):
    """The float64 values of an array of `fmt` bit patterns (exact: every format widens exactly)."""
    _, udt, _, _ = FORMATS[fmt]
    bits = np.ascontiguousarray(bits, udt)
    with np.errstate(invalid="ignore"):
        if fmt == "float16":
            return bits.view(np.float16).astype(np.float64)
        if fmt == "bfloat16":   # bfloat16 is float32's top half
            return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        if fmt == "float32":
            return bits.view(np.float32).astype(np.float64)
        return bits.view(np.float64).copy()


def float_bits(v, fmt):
    """The bits of the float `v` (exactly representable) in `fmt`."""
    if fmt == "bfloat16":
        return int(np.array(v, np.float32).view(np.uint32)) >> 16
    dt, udt, _, _ = FORMATS[fmt]
    return int(np.array(v, dt).view(udt))


def make_bits(seed, rank, n, fmt, size):
    """Rank `rank`'s input: n bit patterns of `fmt`. First the issue's case (rank r has NaN where the
    others have 1.0, a different element per rank), then every mix of -0.0/+0.0 over the ranks, then
    random draws of quiet, signalling and payload NaNs of both signs, zeros, infinities and finite
    values (equal ones across ranks included)."""
    _, udt, e, m = FORMATS[fmt]
    width = 1 + e + m
    sign, inf, quiet = 1 << (width - 1), ((1 << e) - 1) << m, 1 << (m - 1)
    rng = np.random.default_rng(zlib.crc32(f"{seed}:{rank}:{fmt}:{n}".encode()))
    finite = np.array([float_bits(v, fmt) for v in (1.0, -1.0, 2.5, -3.0, 0.5)] +
                      [1, sign | 1, inf - 1, sign | (inf - 1)], np.uint64)
    s = rng.integers(0, 2, n).astype(np.uint64) * np.uint64(sign)
    payload = rng.integers(1, quiet, n).astype(np.uint64)
    kind = rng.choice(6, size=n, p=[.06, .06, .04, .3, .14, .4])
    out = np.select([kind == 0, kind == 1, kind == 2, kind == 3, kind == 4],
                    [s | np.uint64(inf | quiet),                   # quiet NaN
                     s | np.uint64(inf | quiet) | payload,         # quiet NaN with a payload
                     s | np.uint64(inf) | payload,                 # signalling NaN
                     s,                                            # -0.0 or +0.0
                     s | np.uint64(inf)],                          # -inf or +inf
                    finite[rng.integers(0, len(finite), n)])
    lead = [inf | quiet if i == rank else float_bits(1.0, fmt) for i in range(size)]
    lead += [sign if (mix >> rank) & 1 else 0 for mix in range(1 << size)]
    k = min(n, len(lead))
    out[:k] = lead[:k]
    return out.astype(udt)


def reference_bits(op, inputs, fmt):
    """The expected bits of MIN/MAX over the ranks' inputs (one array of bits per rank), with NumPy."""
    bits = np.stack(inputs)
    vals = values(bits, fmt)
    nan, neg, zero = np.isnan(vals), np.signbit(vals), vals == 0
    best = (np.fmin if op == MIN else np.fmax).reduce(vals, axis=0)   # the NaNs left out
    if op == MIN:   # a zero result is -0.0 if any input is -0.0; MAX's is +0.0 if any input is +0.0
        best_neg = np.where(best == 0, (zero & neg).any(axis=0), np.signbit(best))
    else:
        best_neg = np.where(best == 0, ~(zero & ~neg).any(axis=0), np.signbit(best))
    chosen = ((vals == best) & (neg == best_neg)).argmax(axis=0)
    out = bits[chosen, np.arange(bits.shape[1])]
    if len(inputs) == 1:
        return bits[0]   # nothing combined: the input, NaN payloads and all
    _, _, e, m = FORMATS[fmt]
    quiet_nan = ((1 << e) - 1) << m | 1 << (m - 1)   # sign 0, exponent all ones, top mantissa bit
    return np.where(nan.any(axis=0), quiet_nan, out).astype(bits.dtype)


def digest_everywhere(raw):
    """Every rank's sha256 of `raw` (bytes), as a (size, 32) uint8 array."""
    mine = np.frombuffer(hashlib.sha256(raw).digest(), np.uint8).copy()
    every = np.zeros((dist.get_world_size(), 32), np.uint8)
    dist.all_gather_into_tensor(every, mine)
    return every


def test_reference_is_the_rule():
    """The reference itself, on cases written out by hand."""
    f = "float32"
    nan, nan2, mnan, snan = 0x7fc00000, 0x7fc00001, 0xffc00000, 0x7f800001
    one, zero, mzero, inf, minf = float_bits(1.0, f), 0, 0x80000000, 0x7f800000, 0xff800000
    cases = [  # (inputs per rank, MIN, MAX)
        ([nan, one], nan, nan), ([one, nan], nan, nan), ([nan2, one], nan, nan), ([mnan, nan2], nan, nan),
        ([one, snan], nan, nan), ([zero, mzero], mzero, zero), ([mzero, zero], mzero, zero),
        ([mzero, mzero], mzero, mzero), ([inf, minf], minf, inf), ([one, minf, zero], minf, one),
        ([mnan], mnan, mnan), ([one], one, one),   # one rank: the input as it is
    ]
    for inputs, want_min, want_max in cases:
        cols = [np.array([b], np.uint32) for b in inputs]
        assert int(reference_bits(MIN, cols, f)[0]) == want_min, (inputs, "MIN")
        assert int(reference_bits(MAX, cols, f)[0]) == want_max, (inputs, "MAX")


# ---------------------------------------------------------------------------------------------------
# Paths

def counters(group=None):
    info = dist._C.shm_info()
    keys = dist._C.persistent_stats(group._handle if group is not None else 0)[0]
    return {"small": info["calls_small"], "copied": info["calls_copied"], "in_place": info["calls_in_place"],
            "persistent": keys}


@contextlib.contextmanager
def env(name, value):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def new_session():
    dist.destroy_process_group()
    dist.init_process_group(backend="mpi", timeout=TEST_TIMEOUT_S)


@contextlib.contextmanager
def path(name):
    """Set up path `name`; yields (all_reduce's algorithm, group, whether arrays come from dist.empty,
    the counter that must move, or None)."""
    old_small = dist._C.set_shm_small_bytes(SMALL_BYTES)
    group = None
    try:
        if name in ("small-off", "mpi"):
            # What these must move is the persistent cache's count of keys, which stops growing at the
            # cache's cap: a session of its own starts it empty, whatever the files before filled.
            new_session()
            dist._C.set_shm_small_bytes(SMALL_BYTES)
        if name in ("small-off", "persistent-off"):
            dist._C.set_shm_small_bytes(0)
        if name == "persistent-off":
            with env("PYDIST_PERSISTENT_BYTES", "0"):
                new_session()
            dist._C.set_shm_small_bytes(0)
        if name == "shm-chunks":   # staging buffers of 64 bytes: every size takes several rounds
            with env("PYDIST_SHM_STAGE", "64"):
                group = dist.new_group(list(range(dist.get_world_size())))
                dist.all_reduce(np.zeros(1), group=group, algorithm="shm")   # the channel, with that stage
        algorithm = {"shm": "shm", "shm-alloc": "shm", "shm-chunks": "shm", "ring": "ring", "mpi": "mpi"}.get(name)
        moved = {"auto": "small", "shm": "copied", "shm-chunks": "copied", "shm-alloc": "in_place",
                 "auto-alloc": "in_place", "small-off": "persistent", "mpi": "persistent"}.get(name)
        if moved == "persistent" and not dist._C.mpi_info()["library_version"].startswith("MPICH Version:"):
            moved = None   # the persistent cache runs on MPICH only (csrc/paths/persistent.c)
        yield algorithm, group, name.endswith("-alloc"), moved
    finally:
        if group is not None:
            dist.destroy_process_group(group)
        if name == "persistent-off":
            new_session()
        dist._C.set_shm_small_bytes(old_small)


def element_counts(fmt, size, per_rank_blocks=1):
    """Element counts around the thresholds (8 KiB persistent, 64 KiB small and shm) for a buffer whose
    bytes are `per_rank_blocks` blocks of the count."""
    isz = FORMATS[fmt][0].itemsize
    counts = {1, 3, size + (1 << size) + 5}
    for bound in (PERSISTENT_BYTES, SMALL_BYTES):
        block = bound // (isz * per_rank_blocks)
        counts |= {block - 1, block, block + 1}
    return sorted(counts)


def array_of(bits, fmt, alloc):
    dt, udt, _, _ = FORMATS[fmt]
    x = dist.empty(bits.size, udt) if alloc else np.empty(bits.size, udt)
    x[...] = bits
    return x.view(dt)


# ---------------------------------------------------------------------------------------------------
# The collectives on every path

ALL_REDUCE_PATHS = ["auto", "auto-alloc", "shm", "shm-alloc", "shm-chunks", "ring", "mpi", "small-off",
                    "persistent-off"]
OTHER_PATHS = ["auto", "small-off", "persistent-off"]


@pytest.mark.parametrize("name", ALL_REDUCE_PATHS)
def test_all_reduce_min_max(name):
    rank, size = dist.get_rank(), dist.get_world_size()
    wrong, differ = [], []
    with path(name) as (algorithm, group, alloc, moved):
        before = counters(group)
        for fmt in FORMATS:
            counts = element_counts(fmt, size)
            if name == "shm-chunks":
                counts = [n for n in counts if n < 5000]   # 64-byte rounds: the small ones say it all
            for n in counts:
                for op in (MIN, MAX):
                    every = [make_bits(n, r, n, fmt, size) for r in range(size)]
                    x = array_of(every[rank], fmt, alloc)
                    dist.all_reduce(x, op=op, group=group, algorithm=algorithm)
                    got = x.view(FORMATS[fmt][1])
                    want = reference_bits(op, every, fmt)
                    if not np.array_equal(got, want):
                        bad = np.flatnonzero(got != want)[:3]
                        wrong.append((fmt, n, op.name, [(hex(got[i]), hex(want[i])) for i in bad]))
                    digests = digest_everywhere(got.tobytes())
                    if (digests != digests[0]).any():
                        differ.append((fmt, n, op.name))
        after = counters(group)
    taken = moved is None or size == 1 or after[moved] > before[moved]
    if name == "persistent-off":   # the cache stayed empty: MPI's nonblocking calls at every size
        taken = after["persistent"] == before["persistent"] == 0
    parallel_assert(not wrong and not differ and taken,
                    f"wrong {wrong[:4]}; ranks differ {differ[:4]}; {moved}: {before} -> {after}")


@pytest.mark.parametrize("name", OTHER_PATHS)
def test_reduce_min_max(name):
    """reduce: the root gets the rule's bits; every other rank's array is left as it was."""
    rank, size = dist.get_rank(), dist.get_world_size()
    wrong = []
    with path(name):
        case = 0
        for fmt in FORMATS:
            for n in element_counts(fmt, size):
                for op in (MIN, MAX):
                    root, case = case % size, case + 1
                    every = [make_bits(n + 7, r, n, fmt, size) for r in range(size)]
                    x = array_of(every[rank], fmt, False)
                    dist.reduce(x, dst=root, op=op)
                    got = x.view(FORMATS[fmt][1])
                    want = reference_bits(op, every, fmt) if rank == root else every[rank]
                    if not np.array_equal(got, want):
                        wrong.append((fmt, n, op.name, root))
    parallel_assert(not wrong, f"{wrong[:4]}")


@pytest.mark.parametrize("name", OTHER_PATHS)
@pytest.mark.parametrize("form", ["tensor", "list"])
def test_reduce_scatter_min_max(name, form):
    """reduce_scatter_tensor and reduce_scatter: each rank's block has the rule's bits, so the blocks
    gathered are the whole reference on every rank."""
    rank, size = dist.get_rank(), dist.get_world_size()
    wrong = []
    with path(name):
        for fmt in FORMATS:
            dt, udt, _, _ = FORMATS[fmt]
            for n in element_counts(fmt, size, per_rank_blocks=size):
                for op in (MIN, MAX):
                    every = [make_bits(n + 11, r, n * size, fmt, size) for r in range(size)]
                    out = np.empty(n, udt).view(dt)
                    if form == "tensor":
                        dist.reduce_scatter_tensor(out, every[rank].view(dt).copy(), op=op)
                    else:
                        dist.reduce_scatter(out, [b.view(dt).copy() for b in np.split(every[rank], size)], op=op)
                    whole = np.zeros(n * size, udt)
                    dist.all_gather_into_tensor(whole, out.view(udt))
                    if not np.array_equal(whole, reference_bits(op, every, fmt)):
                        wrong.append((fmt, n, op.name))
    parallel_assert(not wrong, f"{wrong[:4]}")


@pytest.mark.parametrize("name", ["auto", "shm", "ring", "mpi", "small-off"])
def test_torch_bfloat16_min_max(name):
    """torch's bfloat16 tensors (reduced as 16-bit words with bfloat16's rule) on pydist's own API."""
    import torch  # a test-time peer (make test installs it), never a dependency of pydist
    rank, size = dist.get_rank(), dist.get_world_size()
    wrong = []
    with path(name) as (algorithm, group, _, _):
        for n in element_counts("bfloat16", size):
            for op in (MIN, MAX):
                every = [make_bits(n + 3, r, n, "bfloat16", size) for r in range(size)]
                t = torch.from_numpy(every[rank].view(np.int16).copy()).view(torch.bfloat16)
                dist.all_reduce(t, op=op, group=group, algorithm=algorithm)
                got = t.view(torch.int16).numpy().view(np.uint16)
                if not np.array_equal(got, reference_bits(op, every, "bfloat16")):
                    wrong.append((n, op.name))
                digests = digest_everywhere(got.tobytes())
                if (digests != digests[0]).any():
                    wrong.append((n, op.name, "ranks differ"))
    parallel_assert(not wrong, f"{wrong[:4]}")


def test_integer_min_max_unchanged():
    """Integers (signed and unsigned, their extremes included) still reduce as np.minimum/np.maximum."""
    rank, size = dist.get_rank(), dist.get_world_size()
    wrong = []
    for dtype in (np.int8, np.int64, np.uint8, np.uint64):
        info = np.iinfo(dtype)
        every = [np.array([info.min, info.max, rank, -rank if info.min < 0 else 2 * rank, 1], dtype)
                 for rank in range(size)]
        for op, f in ((MIN, np.minimum), (MAX, np.maximum)):
            for algorithm in (None, "shm", "ring", "mpi"):
                x = every[rank].copy()
                dist.all_reduce(x, op=op, algorithm=algorithm)
                if not np.array_equal(x, f.reduce(np.stack(every), axis=0)):
                    wrong.append((np.dtype(dtype).name, op.name, algorithm))
    parallel_assert(not wrong, f"{wrong[:4]}")


@pytest.mark.parametrize("name", ["auto", "auto-alloc", "shm", "ring", "mpi"])
def test_every_16_bit_pattern(name):
    """Every float16 and bfloat16 bit pattern (subnormals, every NaN) against partners from the other
    ranks (the same patterns, rotated), 128 KiB: both sides of the kernels' and the user ops' rule."""
    rank, size = dist.get_rank(), dist.get_world_size()
    wrong = []
    with path(name) as (algorithm, group, alloc, _):
        for fmt in ("float16", "bfloat16"):
            every = [np.roll(np.arange(1 << 16, dtype=np.uint16), 7919 * r) for r in range(size)]
            for op in (MIN, MAX):
                x = array_of(every[rank], fmt, alloc)
                dist.all_reduce(x, op=op, group=group, algorithm=algorithm)
                if not np.array_equal(x.view(np.uint16), reference_bits(op, every, fmt)):
                    wrong.append((fmt, op.name))
    parallel_assert(not wrong, f"{wrong}")
