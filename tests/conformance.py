#!/usr/bin/env python3
"""Differential conformance fuzzer: random pydist *programs*, run on every path, held to DESIGN.md's
"Semantics every path keeps".

    python tests/conformance.py --programs 200                       # 2 3 4 ranks x every path
    python tests/conformance.py --programs 50 --ranks 2 --paths auto shm_off
    python tests/conformance.py --seed 1234 --programs 1 --ranks 3 --paths auto    # re-run one program
    python tests/conformance.py --seed 1234 --ranks 3 --show                       # print it, per rank
    python tests/conformance.py --seed 1234 --ranks 3 --paths auto --shrink        # reduce a failure

A program is drawn from (seed, world size) alone, never the rank, so every rank of a job draws the very
same program; it is a list of items (a collective on a group, a point-to-point message, a new_group),
and each rank's view of it is a list of actions: `call` (a blocking call), `start` (async_op=True, isend,
irecv) and `wait` (Work.wait, in random order, often several and more than 4 outstanding). Point-to-point
starts are moved earlier on one side ("hoisted") past outstanding collectives, e.g. rank 0
`w = all_reduce(a, async_op=True); send(x, 1); w.wait()` while rank 1 does `recv(x, 0); all_reduce(a)`.

Only valid MPI programs are kept: simulate() runs every rank's actions under the worst case MPI allows
(a blocking send waits for its receive, every collective waits for every member to start it, a
nonblocking start never waits), and a hoist that could deadlock there is undone. So a program here
completes with MPI's nonblocking collectives and must complete with pydist.

Checks, per program and rank: it finishes (the session timeout of init_process_group(timeout=) and the
job's watchdog catch hangs), every result matches a NumPy reference each rank computes alone from every
rank's input (inputs come from (seed, item, rank), so every rank can rebuild all; reductions are exact:
sums on integer values, products on small ones, MIN/MAX with NaN if any input is NaN, MIN(-0.0, +0.0) =
-0.0 and MAX = +0.0), and every rank of a group gets bitwise the same bytes from every call whose result
is the same by definition (hashes compared across ranks by the driver, NaN payloads included).

Paths (a path is a job's environment, read at init): auto, small_off (PYDIST_SHM_SMALL_BYTES=0),
shm_off (PYDIST_SHM_BYTES=0), persistent_off (PYDIST_PERSISTENT_BYTES=0), and three path tables that
force one path at every size (PYDIST_TUNE=force:...: forced_mpi, forced_ring with the 2-rank pair
exchange, forced_shm); every job runs with PYDIST_SHM_STAGE=4096, so that the shared-memory all-reduce
reaches its multi-chunk path at small sizes, and with no cached path table (PYDIST_TUNE=off) but the
forced ones.

Each rank appends one JSON line per program to its own file (rank<r>.jsonl): the driver, not pydist,
compares the ranks, and a job that dies or hangs still says which program it was in; the driver then
goes on with a fresh job from the next program. tests/mpi/test_conformance.py runs a bounded set of the
same programs in `make test`.

Extending: a new call is one class with draw() (its arguments, from the generator's rng), run() (the
call on one rank: kwargs and the arrays it writes) and expect() (NumPy's answer), added to CALLS.
"""
import argparse
import dataclasses
import functools
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Thresholds the sizes are drawn around (bytes per rank): the persistent cache's bound, the small
# shared-memory path's bound, the automatic shm all-reduce's crossover, the staging chunk we set, and
# where a 2-rank broadcast leaves the slots for the pair path (shm_info()["pair_broadcast_bytes"]).
PERSISTENT_BYTES = 8192
SMALL_BYTES = 65536
SHM_AUTO_BYTES = 65536
STAGE_BYTES = 4096
BIG_BYTES = 32 << 20          # SHM_AUTO_COPY_BYTES: automatic shm on ordinary arrays (only with --big)
PAIR_BCAST_BYTES = 32768
THRESHOLDS = [STAGE_BYTES, PERSISTENT_BYTES, PAIR_BCAST_BYTES, SMALL_BYTES]
PRIMES = [2, 3, 5, 7, 13, 31, 61, 127, 257, 1021, 4093]
MAX_PROGRAM_BYTES = 24 << 20  # per rank: keeps 4 ranks x 4 paths within a small machine

JOB_ENV = {"PYDIST_SHM_STAGE": str(STAGE_BYTES), "PYDIST_TUNE": "off"}
PATHS = {
    "auto": {},
    "small_off": {"PYDIST_SHM_SMALL_BYTES": "0"},
    "shm_off": {"PYDIST_SHM_BYTES": "0"},
    "persistent_off": {"PYDIST_PERSISTENT_BYTES": "0"},
    # path tables that force one path at every size (pydist/_path_table.py): the data of every call
    # past the header round by MPI; all_reduce by the ring and the others by the 2-rank pair exchange;
    # all_reduce by the shared-memory all-reduce, even where the slots would have carried it
    "forced_mpi": {"PYDIST_TUNE": "force:mpi"},
    "forced_ring": {"PYDIST_TUNE": "force:ring,pair"},
    "forced_shm": {"PYDIST_TUNE": "force:shm"},
}

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "bfloat16", "float32", "float64", "complex64", "complex128"]
FLOATS = ["float16", "bfloat16", "float32", "float64"]
OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG"]
ALGORITHMS = [None, None, "shm", "ring", "mpi"]


def np_dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def kind(name):
    return "f" if name in FLOATS else np.dtype(name).kind if name != "bfloat16" else "f"


def op_valid(op, dtype):
    """pydist's dtype x op matrix (_C.check_op), written out so the generator needs no pydist."""
    k = kind(dtype)
    if op in ("BAND", "BOR", "BXOR"):
        return k in "biu"
    if op == "AVG":
        return k in "fc"
    if op in ("MIN", "MAX"):
        return k in "biuf"
    return True


# ---------------------------------------------------------------------------------------------------
# The program model

@dataclasses.dataclass
class Item:
    id: int
    call: str               # a CALLS key, "message" or "new_group"
    group: int              # index into Program.groups (0: the world, passed as group=None)
    members: list           # global ranks taking part
    args: dict              # drawn by the call's draw(): dtype, count, op, root, ...
    mode: dict              # rank -> "sync" | "async"


@dataclasses.dataclass
class Program:
    seed: int
    size: int
    groups: list            # [ranks of group 0 (the world), ranks of group 1, ...]
    items: list
    actions: list           # [rank] -> [(verb, item id)], verb: "call" | "start" | "wait"
    hoists: int = 0         # point-to-point starts moved earlier (and kept: the program stays valid)

    def item(self, iid):
        return self.items[iid]

    def keep(self, ids):
        """This program with only the items `ids` (new_group items always stay): for --shrink. Removing
        an item removes only waits, so a valid program stays valid."""
        ids = set(ids) | {it.id for it in self.items if it.call == "new_group"}
        acts = [[a for a in acts if a[1] in ids] for acts in self.actions]
        return dataclasses.replace(self, actions=acts)


# ---------------------------------------------------------------------------------------------------
# Sizes and values

def draw_count(rng, itemsize, parts=1):
    """An element count per part, drawn around every threshold (bytes per rank = parts x count)."""
    r = rng.random()
    if r < 0.10:
        return 0
    if r < 0.22:
        return 1
    if r < 0.40:
        return int(rng.choice(PRIMES[:8]))
    if r < 0.85:
        bound = int(rng.choice(THRESHOLDS))
        total = bound // itemsize + int(rng.choice([-1, 0, 0, 1, 2]))
        return max(0, -(-total // parts) + int(rng.choice([-1, 0, 0, 1])))
    return int(rng.integers(1, 3 * SMALL_BYTES // itemsize // parts + 2))


SPECIAL_FLOATS = {"sum": [np.nan, np.inf, -np.inf, -0.0, 0.0], "prod": [np.nan, np.inf, -np.inf, -0.0, 0.0],
                  "avg": [np.nan, np.inf, -0.0, 0.0]}


def values(rng, dtype, n, cls, special_rate):
    """n values of `dtype` for a call of class `cls`: "move" (any bit pattern: data movement is bitwise),
    "sum"/"avg" (small integers: sums are exact in every order), "prod" (in [-2, 2]: products of 4 are
    exact), "minmax" (wide values, extremes, subnormals), "bits" (any integer). NaN, +/-inf, +/-0.0 and
    the extreme integers are sprinkled in at `special_rate`."""
    dt = np_dtype(dtype)
    k = kind(dtype)
    if k == "b":
        return rng.integers(0, 2, n).astype(bool)
    if cls == "move":
        return rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8).view(dt)
    if k in "iu":
        info = np.iinfo(dt)
        if cls == "prod":
            base = rng.integers(0, 4, n) if k == "u" else rng.integers(-2, 3, n)
        elif cls == "sum":
            base = rng.integers(0, 61, n) if k == "u" else rng.integers(-30, 31, n)
        else:
            base = rng.integers(int(info.min), int(info.max), n, dtype=dt, endpoint=True)
        out = np.asarray(base).astype(dt)
        special = np.array([info.min, info.max, 0, 1, info.max // 2 + 1] + ([-1] if k == "i" else []), dt)
        mask = rng.random(n) < special_rate
        out[mask] = rng.choice(special, int(mask.sum()))
        return out
    if k == "c":
        part = np.float32 if dt.itemsize == 8 else np.float64
        lo, hi = (-2, 3) if cls == "prod" else (-30, 31)
        re, im = (rng.integers(lo, hi, n).astype(part) for _ in range(2))
        if cls in ("sum", "avg"):   # componentwise, so as exact as the real parts; products mix them
            for x in (re, im):
                mask = rng.random(n) < special_rate
                x[mask] = rng.choice(np.array(SPECIAL_FLOATS[cls], part), int(mask.sum()))
        out = np.empty(n, dt)
        out.real, out.imag = re, im
        return out
    wide = np.float32 if dtype in ("float16", "bfloat16") else dt.type
    if cls == "prod":
        base = rng.integers(-2, 3, n).astype(wide)
    elif cls in ("sum", "avg"):
        base = rng.integers(-30, 31, n).astype(wide)
    else:   # minmax: quarters, many ties, so the sign of zero and NaN decide
        base = (rng.integers(-40, 41, n) / 4.0).astype(wide)
    special = list(SPECIAL_FLOATS.get(cls, [np.nan, np.inf, -np.inf, -0.0, 0.0, -0.0, 0.0]))
    if cls == "minmax":
        fi = np.finfo(np.float32) if dtype == "bfloat16" else np.finfo(dt)
        tiny = float(np.float32(9.18355e-41)) if dtype == "bfloat16" else float(fi.smallest_subnormal)
        big = 3.3895313892515355e38 if dtype == "bfloat16" else float(fi.max)
        special += [tiny, -tiny, big, -big]
    mask = rng.random(n) < special_rate
    base[mask] = rng.choice(np.array(special, wide), int(mask.sum()))
    return base.astype(dt)


def value_class(op):
    return {"SUM": "sum", "AVG": "avg", "PRODUCT": "prod", "MIN": "minmax", "MAX": "minmax"}.get(op, "bits")


def junk(rng, dt, n):
    """What an output holds before the call: bytes the call must overwrite (never mistaken for an answer)."""
    if dt == np.bool_:
        return np.ones(n, bool)
    return np.full(n * dt.itemsize, 0xA5, np.uint8).view(dt).copy()


# ---------------------------------------------------------------------------------------------------
# References (NumPy, on each rank alone) and comparison

def reference(op, inputs, dtype):
    """The reduction of `inputs` (one array per member) as every path must give it."""
    dt = np_dtype(dtype)
    k = kind(dtype)
    stack = np.stack(inputs) if inputs else np.zeros((0, 0), dt)
    wide = stack.astype(np.float32) if dtype == "bfloat16" else stack
    wdt = wide.dtype
    n = len(inputs)
    # Row by row, never ufunc.reduce(axis=0): NumPy's starts from the identity, so its sum of -0.0 and
    # -0.0 is +0.0 where IEEE (and every rank adding in any order) gives -0.0.
    def fold(ufunc):
        return functools.reduce(lambda x, y: ufunc(x, y, dtype=wdt), list(wide))

    if op in ("SUM", "AVG"):
        total = fold(np.add)
        if dtype == "bfloat16":
            total = total.astype(dt).astype(np.float32)   # the sum is exact: this rounding changes nothing
        if op == "SUM":
            out = total
        elif k == "c":   # componentwise, as torch divides by a real count
            out = np.empty_like(total)
            out.real, out.imag = total.real / n, total.imag / n
        else:
            out = total / wdt.type(n)
    elif op == "PRODUCT":
        out = fold(np.multiply)
    elif op in ("MIN", "MAX"):
        out = (np.minimum if op == "MIN" else np.maximum).reduce(wide, axis=0)
        if k == "f":   # NaN if any is NaN; MIN(-0.0, +0.0) = -0.0, MAX(-0.0, +0.0) = +0.0
            out = out.copy()
            out[np.isnan(wide).any(axis=0)] = np.nan
            zero = wide == 0
            want_neg = (zero & np.signbit(wide)).any(axis=0) if op == "MIN" else \
                ~(zero & ~np.signbit(wide)).any(axis=0)
            fix = out == 0
            out[fix] = np.where(want_neg[fix], -0.0, 0.0)
    else:
        out = {"BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op].reduce(stack, axis=0)
    return np.asarray(out).astype(dt)


def bits(a):
    """`a` as unsigned integers of its width (complex: per component), every NaN made one NaN."""
    a = np.ascontiguousarray(a)
    if a.dtype.kind == "c":
        a = a.view(np.float32 if a.dtype.itemsize == 8 else np.float64)
    if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
        u = a.view(f"u{a.dtype.itemsize}").copy()
        nan = np.isnan(a.astype(np.float32) if a.dtype.name == "bfloat16" else a)
        u[nan] = 0
        return u, nan
    return a.view(f"u{a.dtype.itemsize}"), None


def differs(got, want):
    """None if `got` is `want` bit for bit (NaN payloads aside), else (how, a short description); how:
    "NaN lost", "NaN made", "sign of zero" or "value" (the first wrong element's kind)."""
    got, want = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
    if got.dtype != want.dtype or got.size != want.size:
        return "shape", f"got {got.dtype}[{got.size}], want {want.dtype}[{want.size}]"
    (g, gn), (w, wn) = bits(got), bits(want)
    bad = g != w if gn is None else (g != w) | (gn != wn)
    if not bad.any():
        return None
    j = int(np.flatnonzero(bad)[0])
    how = "value"
    if gn is not None:
        sign = np.uint64(1) << np.uint64(8 * g.dtype.itemsize - 1)   # both are zeros, one of them negative
        zeros = int(g[j]) | int(w[j]) == int(sign)
        how = "NaN lost" if wn[j] and not gn[j] else "NaN made" if gn[j] and not wn[j] else \
            "sign of zero" if zeros else "value"
    i = j // 2 if gn is not None and got.dtype.kind == "c" else j
    return how, f"{int(bad.sum())} of {got.size} elements differ, first at [{i}]: got {got[i]!r}, want {want[i]!r}"


def digest(arrays):
    h = hashlib.blake2b(digest_size=8)
    for a in arrays:
        h.update(np.ascontiguousarray(a).view(np.uint8).tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------------
# The calls. Each draws its arguments (the same on every rank), runs on one rank (the kwargs of the
# pydist call and the arrays it writes) and says what those arrays must hold.

class Ctx:
    """What run()/expect() need on one rank: the program's seed, the item, this rank's group index."""

    def __init__(self, prog, item, rank):
        self.prog, self.item, self.rank = prog, item, rank
        self.m = item.members
        self.n = len(self.m)
        self.i = self.m.index(rank) if rank in self.m else -1
        self.a = item.args

    def data(self, gi, which=0, count=None, cls=None):
        """Input `which` of group rank gi: rebuilt the same on every rank."""
        a = self.a
        rng = np.random.default_rng([self.prog.seed, self.item.id, gi, which])
        return values(rng, a["dtype"], a["count"] if count is None else count,
                      cls or (value_class(a["op"]) if "op" in a else "move"), a.get("special", 0.0))

    def out(self, count=None):
        return junk(None, np_dtype(self.a["dtype"]), self.a["count"] if count is None else count)

    def root(self):
        return self.m[self.a["root"]]


class Call:
    name = ""
    weight = 1.0
    same_everywhere = False   # every member's result is bitwise the same by definition
    ops = False               # takes a ReduceOp
    parts = 1                 # per-rank bytes = parts x count x itemsize (for drawing sizes)

    def draw(self, rng, size, n):
        dtype = str(rng.choice(DTYPES))
        a = {"dtype": dtype}
        if self.ops:
            a["op"] = str(rng.choice([o for o in OPS if op_valid(o, dtype)]))
        a["count"] = draw_count(rng, np_dtype(dtype).itemsize, n if self.parts < 0 else 1)
        a["special"] = float(rng.choice([0.0, 0.0, 0.05, 0.3]))
        a["root"] = int(rng.integers(0, n))
        return a

    def bytes(self, a, n):
        return np_dtype(a["dtype"]).itemsize * a["count"] * n

    def run(self, c):
        raise NotImplementedError

    def expect(self, c):
        raise NotImplementedError

    def describe(self, a):
        s = f"{a['dtype']}[{a['count']}]"
        if "op" in a:
            s += f", {a['op']}"
        return s


class Barrier(Call):
    name = "barrier"
    weight = 0.5

    def draw(self, rng, size, n):
        return {}

    def bytes(self, a, n):
        return 0

    def run(self, c):
        return {}, []

    def expect(self, c):
        return []

    def describe(self, a):
        return ""


class Broadcast(Call):
    name = "broadcast"
    same_everywhere = True

    def run(self, c):
        t = c.data(c.a["root"]) if c.i == c.a["root"] else c.out()
        return {"tensor": t, "src": c.root()}, [t]

    def expect(self, c):
        return [c.data(c.a["root"])]

    def describe(self, a):
        return super().describe(a) + f", src=group rank {a['root']}"


class AllReduce(Call):
    name = "all_reduce"
    weight = 4.0
    same_everywhere = True
    ops = True

    def draw(self, rng, size, n):
        a = super().draw(rng, size, n)
        a["algorithm"] = ALGORITHMS[int(rng.integers(0, len(ALGORITHMS)))]
        # dist.empty arrays on every rank: the automatic and "shm" all-reduce work in place
        a["shm_array"] = a["dtype"] != "bfloat16" and rng.random() < 0.3
        if a["dtype"] in ("float32", "uint8") and rng.random() < BIG_CHANCE[0]:
            a["count"] = BIG_BYTES // np_dtype(a["dtype"]).itemsize + int(rng.choice([-1, 0, 1]))
            a["special"] = 0.0
        return a

    def run(self, c):
        t = c.data(c.i)
        if c.a["shm_array"]:
            import pydist as dist
            s = dist.empty(t.shape, t.dtype)
            s[...] = t
            t = s
        kw = {"tensor": t, "op": op_of(c.a["op"])}
        if c.a["algorithm"] is not None:
            kw["algorithm"] = c.a["algorithm"]
        return kw, [t]

    def expect(self, c):
        return [reference(c.a["op"], [c.data(j) for j in range(c.n)], c.a["dtype"])]

    def describe(self, a):
        return super().describe(a) + (f", algorithm={a['algorithm']!r}" if a["algorithm"] else "") + \
            (", dist.empty arrays" if a["shm_array"] else "")


BIG_CHANCE = [0.0]   # --big: the share of all-reduces of 32 MiB (the automatic shm copy crossover)


class Reduce(Call):
    name = "reduce"
    ops = True

    def run(self, c):
        t = c.data(c.i)
        return {"tensor": t, "dst": c.root(), "op": op_of(c.a["op"])}, [t]

    def expect(self, c):   # the other ranks' arrays are only read
        if c.i == c.a["root"]:
            return [reference(c.a["op"], [c.data(j) for j in range(c.n)], c.a["dtype"])]
        return [c.data(c.i)]

    def describe(self, a):
        return super().describe(a) + f", dst=group rank {a['root']}"


class AllGather(Call):
    name = "all_gather"
    same_everywhere = True

    def run(self, c):
        outs = [c.out() for _ in range(c.n)]
        return {"tensor_list": outs, "tensor": c.data(c.i)}, outs

    def expect(self, c):
        return [c.data(j) for j in range(c.n)]


class AllGatherIntoTensor(Call):
    name = "all_gather_into_tensor"
    same_everywhere = True

    def run(self, c):
        out = c.out(c.a["count"] * c.n)
        return {"output_tensor": out, "input_tensor": c.data(c.i)}, [out]

    def expect(self, c):
        return [np.concatenate([c.data(j) for j in range(c.n)])]


class Gather(Call):
    name = "gather"

    def run(self, c):
        outs = [c.out() for _ in range(c.n)] if c.i == c.a["root"] else None
        return {"tensor": c.data(c.i), "gather_list": outs, "dst": c.root()}, outs or []

    def expect(self, c):
        return [c.data(j) for j in range(c.n)] if c.i == c.a["root"] else []

    def describe(self, a):
        return super().describe(a) + f", dst=group rank {a['root']}"


class Scatter(Call):
    name = "scatter"

    def run(self, c):
        ins = [c.data(c.i, which=j) for j in range(c.n)] if c.i == c.a["root"] else None
        out = c.out()
        return {"tensor": out, "scatter_list": ins, "src": c.root()}, [out]

    def expect(self, c):
        return [c.data(c.a["root"], which=c.i)]

    def describe(self, a):
        return super().describe(a) + f", src=group rank {a['root']}"


class ReduceScatter(Call):
    name = "reduce_scatter"
    ops = True
    parts = -1   # every rank sends group-size blocks

    def run(self, c):
        out = c.out()
        return {"output": out, "input_list": [c.data(c.i, which=j) for j in range(c.n)],
                "op": op_of(c.a["op"])}, [out]

    def expect(self, c):
        return [reference(c.a["op"], [c.data(j, which=c.i) for j in range(c.n)], c.a["dtype"])]


class ReduceScatterTensor(Call):
    name = "reduce_scatter_tensor"
    ops = True
    parts = -1

    def run(self, c):
        out = c.out()
        inp = np.concatenate([c.data(c.i, which=j) for j in range(c.n)]) if c.n else c.out(0)
        return {"output": out, "input": inp, "op": op_of(c.a["op"])}, [out]

    def expect(self, c):
        return [reference(c.a["op"], [c.data(j, which=c.i) for j in range(c.n)], c.a["dtype"])]


def split_matrix(rng, n, count):
    """counts[i][j]: elements group rank i sends to group rank j: equal blocks, or uneven ones."""
    if rng.random() < 0.5:
        return [[count] * n for _ in range(n)]
    return [[int(rng.integers(0, 2 * count + 2)) for _ in range(n)] for _ in range(n)]


class AllToAll(Call):
    """pydist's all_to_all takes blocks of one size (all_to_all_single's split sizes may differ)."""
    name = "all_to_all"
    parts = -1

    def draw(self, rng, size, n):
        a = super().draw(rng, size, n)
        a["matrix"] = [[a["count"]] * n for _ in range(n)]
        return a

    def bytes(self, a, n):
        return np_dtype(a["dtype"]).itemsize * sum(map(sum, a["matrix"]))

    def run(self, c):
        m = c.a["matrix"]
        outs = [c.out(m[j][c.i]) for j in range(c.n)]
        ins = [c.data(c.i, which=j, count=m[c.i][j]) for j in range(c.n)]
        return {"output_tensor_list": outs, "input_tensor_list": ins}, outs

    def expect(self, c):
        m = c.a["matrix"]
        return [c.data(j, which=c.i, count=m[j][c.i]) for j in range(c.n)]

    def describe(self, a):
        return f"{a['dtype']}, counts {a['matrix']}"


class AllToAllSingle(AllToAll):
    name = "all_to_all_single"

    def draw(self, rng, size, n):
        a = super().draw(rng, size, n)
        # Per rank: split sizes given or not. Some ranks' blocks are equal (row and column all `count`),
        # and those may leave the split sizes out beside ranks whose blocks are uneven (a valid alltoallv).
        a["splits"] = [False] * n
        if rng.random() < 0.5:
            m = split_matrix(rng, n, a["count"])
            even = [i for i in range(n) if rng.random() < 0.4]
            for i in even:
                for j in range(n):
                    m[i][j] = m[j][i] = a["count"]
            a["matrix"] = m
            a["splits"] = [i not in even or bool(rng.random() < 0.5) for i in range(n)]
        return a

    def run(self, c):
        m = c.a["matrix"]
        out = c.out(sum(m[j][c.i] for j in range(c.n)))
        parts = [c.data(c.i, which=j, count=m[c.i][j]) for j in range(c.n)]
        inp = np.concatenate(parts) if parts else c.out(0)
        kw = {"output": out, "input": inp}
        if c.a["splits"][c.i]:
            kw["output_split_sizes"] = [m[j][c.i] for j in range(c.n)]
            kw["input_split_sizes"] = list(m[c.i])
        return kw, [out]

    def expect(self, c):
        parts = super().expect(c)
        return [np.concatenate(parts) if parts else c.out(0)]

    def describe(self, a):
        given = [i for i, g in enumerate(a["splits"]) if g]
        return super().describe(a) + (f", split sizes on ranks {given}" if given else ", no split sizes")


class Message(Call):
    """One point-to-point message: send or isend on its source, recv or irecv on its destination."""
    name = "message"
    weight = 3.0

    def draw(self, rng, size, n):
        a = super().draw(rng, size, n)
        a.pop("root")
        src, dst = (int(x) for x in rng.choice(n, 2, replace=False))
        a["src"], a["dst"] = src, dst   # group ranks
        return a

    def bytes(self, a, n):
        return np_dtype(a["dtype"]).itemsize * a["count"]

    def run(self, c):
        if c.i == c.a["src"]:
            return {"tensor": c.data(c.a["src"]), "dst": c.m[c.a["dst"]]}, []
        out = c.out()
        return {"tensor": out, "src": c.m[c.a["src"]]}, [out]

    def expect(self, c):
        return [c.data(c.a["src"])] if c.i == c.a["dst"] else []

    def describe(self, a):
        return f"{a['dtype']}[{a['count']}]"


class CompressedSum(Call):
    """The compressed sum of pydist.torch.hooks and Compressor.allreduce_sum on the group: with one spec and
    buffer length on every member, the float32 sum, in group-rank order, of what each member's payload
    decodes to (rebuilt here with Compressor.encode and decode_add); with one member (`odd`) whose spec or
    length differs, a DistError on every member before any payload moves (flag 1), its buffer untouched.
    Blocking only: there is no async_op form."""
    name = "compressed_sum"
    weight = 1.5
    sync_only = True
    SPECS = ["fp16", "bf16", "topk:0.25", "topk:0.5", "sign"]

    def draw(self, rng, size, n):
        a = {"dtype": "float32", "count": int(rng.choice([1, 7, 100, 257, 4093])), "special": 0.0, "op": "SUM",
             "spec": str(rng.choice(self.SPECS)), "ring": bool(rng.random() < 0.5), "odd": -1}
        if n > 1 and rng.random() < 0.4:   # one member compresses differently: another spec, or one entry more
            a["odd"] = int(rng.integers(0, n))
            a["odd_spec"] = str(rng.choice(self.SPECS))
            a["odd_count"] = a["count"] + (a["odd_spec"] == a["spec"])
        return a

    def bytes(self, a, n):
        return 4 * a["count"] * (n + 2)

    def layout(self, a, i):
        return (a["odd_spec"], a["odd_count"]) if i == a["odd"] else (a["spec"], a["count"])

    def run(self, c):
        spec, count = self.layout(c.a, c.i)
        x, flag = c.data(c.i, count=count), np.zeros(1, np.int64)
        return {"spec": spec, "x": x, "ring": c.a["ring"], "flag": flag}, [x, flag]

    def call(self, kw, group):
        import pydist as dist
        from pydist import _C
        from pydist.distributed import _group_handle
        handle = 0 if group is None else _group_handle(group, "compressed_sum")
        try:
            _C.Compressor(kw["spec"], kw["x"].size).allreduce_sum(kw["x"], handle, kw["ring"])
        except dist.DistError as e:
            if "the group's ranks have" not in str(e):
                raise
            kw["flag"][0] = 1

    def expect(self, c):
        a = c.a
        if a["odd"] >= 0:
            return [c.data(c.i, count=self.layout(a, c.i)[1]), np.ones(1, np.int64)]
        from pydist import _C
        out = np.zeros(a["count"], np.float32)
        for j in range(c.n):
            z = _C.Compressor(a["spec"], a["count"])
            z.decode_add(z.encode(c.data(j)), out)
        return [out, np.zeros(1, np.int64)]

    def describe(self, a):
        odd = f", group rank {a['odd']}: {a['odd_spec']}[{a['odd_count']}]" if a["odd"] >= 0 else ""
        return f"{a['spec']}[{a['count']}]{', ring' if a['ring'] else ''}{odd}"


CALLS = {cls.name: cls() for cls in [Barrier, Broadcast, AllReduce, Reduce, AllGather, AllGatherIntoTensor,
                                     Gather, Scatter, ReduceScatter, ReduceScatterTensor, AllToAll,
                                     AllToAllSingle, Message, CompressedSum]}


def op_of(name):
    import pydist as dist
    return getattr(dist.ReduceOp, name)


# ---------------------------------------------------------------------------------------------------
# The generator

def generate(seed, size, length=None):
    """The program of `seed` at world size `size`: the same on every rank (no rank, no clock, no pydist)."""
    rng = np.random.default_rng([seed, size, 0xC0FFEE])
    groups = [list(range(size))]
    items = []
    # sub-groups: one with every rank (its own channel beside the world's), and a random subset
    if rng.random() < 0.6:
        groups.append(list(range(size)))
    if size > 1 and rng.random() < 0.6:
        k = int(rng.integers(1, size + 1))
        groups.append(sorted(int(x) for x in rng.choice(size, k, replace=False)))
    for g in range(1, len(groups)):
        items.append(Item(len(items), "new_group", 0, list(range(size)), {"ranks": groups[g], "index": g},
                          {r: "sync" for r in range(size)}))
    p_async = float(rng.choice([0.0, 0.3, 0.7, 1.0]))
    n_items = length if length is not None else int(rng.choice([4, 8, 16, 32, 48]))
    names = list(CALLS)
    weights = np.array([CALLS[k].weight for k in names])
    budget = MAX_PROGRAM_BYTES
    while len([i for i in items if i.call != "new_group"]) < n_items:
        if rng.random() < 0.08:   # a burst: K > 4 async calls of one key, then a message (issue item 3)
            burst(rng, items, groups, size, p_async)
            continue
        name = names[int(rng.choice(len(names), p=weights / weights.sum()))]
        gi = int(rng.integers(0, len(groups)))
        members = groups[gi]
        if name == "message" and len(members) < 2:
            continue
        call = CALLS[name]
        args = call.draw(rng, size, len(members))
        cost = call.bytes(args, len(members)) * 3
        if cost > budget:
            continue
        budget -= cost
        mode = {r: "async" if rng.random() < p_async and not getattr(call, "sync_only", False) else "sync"
                for r in members}
        items.append(Item(len(items), name, gi, members, args, mode))
    actions = [schedule(rng, items, r) for r in range(size)]
    prog = Program(seed, size, groups, items, actions)
    assert simulate(prog) is None, f"unhoisted program {seed} does not complete: {simulate(prog)}"
    hoist(rng, prog)
    return prog


def burst(rng, items, groups, size, p_async):
    gi = int(rng.integers(0, len(groups)))
    members = groups[gi]
    call = CALLS[str(rng.choice(["all_reduce", "broadcast", "all_gather_into_tensor", "barrier"]))]
    args = call.draw(rng, size, len(members))
    if "count" in args:   # one key of the persistent cache, within the small path's slots
        args["count"] = int(rng.choice([1, 7, 100, PERSISTENT_BYTES // np_dtype(args["dtype"]).itemsize]))
    if call.name == "all_reduce":
        args["algorithm"], args["shm_array"] = None, False
    for _ in range(int(rng.integers(5, 10))):
        items.append(Item(len(items), call.name, gi, members, dict(args), {r: "async" for r in members}))
    if len(members) >= 2:
        m = CALLS["message"].draw(rng, size, len(members))
        items.append(Item(len(items), "message", gi, members, m, {r: "sync" for r in members}))


def participants(item):
    return [item.members[item.args["src"]], item.members[item.args["dst"]]] if item.call == "message" \
        else item.members


def schedule(rng, items, rank):
    """Rank `rank`'s actions: its items in program order; an async one is waited a few actions later or
    at the end, waits that fall together in random order."""
    acts, due = [], []
    for it in items:
        if rank not in participants(it):
            continue
        if it.mode[rank] == "sync":
            acts.append(("call", it.id))
        else:
            acts.append(("start", it.id))
            later = int(rng.geometric(0.3)) if rng.random() < 0.7 else 10**9
            due.append((len(acts) + later, it.id))
        now = [d for d in due if d[0] <= len(acts)]
        if now:
            due = [d for d in due if d[0] > len(acts)]
            for _, iid in sorted(now, key=lambda _: rng.random()):
                acts.append(("wait", iid))
    for _, iid in sorted(due, key=lambda _: rng.random()):
        acts.append(("wait", iid))
    return acts


def hoist(rng, prog):
    """Move point-to-point starts earlier on one side, past outstanding collectives and other calls, and
    keep each move that leaves a program that completes under MPI's worst case."""
    first = sum(1 for it in prog.items if it.call == "new_group")   # groups exist before anything else
    for it in prog.items:
        if it.call != "message" or rng.random() < 0.4:
            continue
        side = it.members[it.args["dst"] if rng.random() < 0.7 else it.args["src"]]
        acts = prog.actions[side]
        at = next(k for k, a in enumerate(acts) if a[1] == it.id and a[0] != "wait")
        to = max(first, at - int(rng.integers(1, 9)))
        if to >= at:
            continue
        moved = acts[:to] + [acts[at]] + acts[to:at] + acts[at + 1:]
        prog.actions[side] = moved
        if simulate(prog) is None:
            prog.hoists += 1
        else:
            prog.actions[side] = acts


def simulate(prog):
    """None if every rank's actions complete under the worst case MPI allows, else where they stop.

    A collective completes once every member has started it; a message once both sides have started it
    (a blocking send may wait for its receive); starting never waits. Every such condition only becomes
    true over time, so running each rank as far as it can, until nothing moves, decides it."""
    started = set()
    pos = [0] * prog.size

    def complete(iid):
        return all((iid, r) in started for r in participants(prog.items[iid]))

    moved = True
    while moved:
        moved = False
        for r in range(prog.size):
            acts = prog.actions[r]
            while pos[r] < len(acts):
                verb, iid = acts[pos[r]]
                if verb in ("call", "start"):
                    started.add((iid, r))
                if verb != "start" and not complete(iid):
                    break
                pos[r] += 1
                moved = True
    stuck = {r: prog.actions[r][pos[r]] for r in range(prog.size) if pos[r] < len(prog.actions[r])}
    return stuck or None


# ---------------------------------------------------------------------------------------------------
# Showing a program

def show_action(prog, rank, verb, iid):
    it = prog.items[iid]
    if it.call == "new_group":
        return f"g{it.args['index']} = new_group({it.args['ranks']})"
    g = "" if it.group == 0 else f", group=g{it.group}"
    if verb == "wait":
        return f"w{iid}.wait()"
    w = f"w{iid} = " if verb == "start" else ""
    if it.call == "message":
        src, dst = it.members[it.args["src"]], it.members[it.args["dst"]]
        name = ("isend" if verb == "start" else "send") if rank == src else ("irecv" if verb == "start" else "recv")
        peer = f"dst={dst}" if rank == src else f"src={src}"
        return f"{w}{name}({CALLS['message'].describe(it.args)}, {peer}, tag={iid}{g})"
    extra = ", async_op=True" if verb == "start" else ""
    return f"{w}{it.call}({CALLS[it.call].describe(it.args)}{g}{extra})".replace("(, ", "(")


def listing(prog):
    used = {iid for acts in prog.actions for _, iid in acts}
    lines = [f"program seed={prog.seed} at {prog.size} ranks: {sum(1 for i in prog.items if i.call != 'new_group' and i.id in used)} "
             f"items, {prog.hoists} hoisted point-to-point starts; groups {prog.groups}"]
    for r in range(prog.size):
        lines.append(f"rank {r}:")
        lines += [f"  {show_action(prog, r, v, i)}" for v, i in prog.actions[r]]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# Running a program on one rank (inside a pydist job)

def run_program(prog, dist):
    """Run `prog`'s actions on this rank; return (calls made, [problems], {item id: hash}). Exceptions
    (a DistError, a timeout) propagate: the caller ends the job, as the ranks are out of step."""
    rank = dist.get_rank()
    handles = {0: None}
    prepared, works = {}, {}
    calls = 0
    for it in prog.items:   # inputs first: the calls should meet, not wait on NumPy
        if it.call != "new_group" and rank in participants(it):
            c = Ctx(prog, it, rank)
            prepared[it.id] = (c,) + CALLS[it.call].run(c)
    made = []
    try:
        for verb, iid in prog.actions[rank]:
            it = prog.items[iid]
            if it.call == "new_group":
                g = dist.new_group(it.args["ranks"])
                handles[it.args["index"]] = g
                made.append(g)
                continue
            c, kw, _ = prepared[iid]
            group = handles[it.group]
            if verb == "wait":
                works.pop(iid).wait()
                continue
            calls += 1
            if it.call == "message":
                sending = c.i == it.args["src"]
                if verb == "start":
                    works[iid] = (dist.isend if sending else dist.irecv)(**kw, group=group, tag=iid)
                elif sending:
                    dist.send(**kw, group=group, tag=iid)
                else:
                    got = dist.recv(**kw, group=group, tag=iid)
                    if got != kw["src"]:
                        raise AssertionError(f"item {iid}: recv returned source {got}, want {kw['src']}")
                continue
            if getattr(CALLS[it.call], "sync_only", False):   # a call of its own (compressed_sum)
                CALLS[it.call].call(kw, group)
                continue
            fn = getattr(dist, it.call)
            if verb == "start":
                works[iid] = fn(**kw, group=group, async_op=True)
                if works[iid] is None:
                    raise AssertionError(f"item {iid}: {it.call}(async_op=True) returned None, not a Work")
            else:
                if fn(**kw, group=group) is not None:
                    raise AssertionError(f"item {iid}: blocking {it.call} returned something")
        if works:
            raise AssertionError(f"items {sorted(works)} were started and never waited (generator bug)")
    finally:
        for g in made:
            dist.destroy_process_group(g)
    problems, hashes = [], {}
    for iid, (c, kw, outs) in prepared.items():
        it = prog.items[iid]
        want = CALLS[it.call].expect(c)
        if len(want) != len(outs):
            problems.append([it.call + " outputs", f"item {iid} {it.call}: {len(outs)} outputs, want {len(want)}"])
            continue
        loose = it.args.get("op") == "PRODUCT" and kind(it.args["dtype"]) == "c"
        for k, (got, w) in enumerate(zip(outs, want)):
            if loose:   # a complex product's sign of zero depends on the order: NumPy defines none
                got, w = np.asarray(got) + 0, np.asarray(w) + 0   # -0.0 + 0.0 = +0.0
            d = differs(got, w)
            if d:
                sig = " ".join(str(x) for x in (it.call, it.args.get("op", ""), d[0], "algorithm=%s" % (
                    it.args["algorithm"],) if it.args.get("algorithm") else "") if x)
                problems.append([sig, f"item {iid} {it.call}({CALLS[it.call].describe(it.args)}) output {k}: {d[1]}"])
        if CALLS[it.call].same_everywhere:
            hashes[str(iid)] = digest(outs)
    return calls, problems, hashes


def worker(args):
    """One rank of a job: run the programs, one JSON line per program into out/rank<r>.jsonl."""
    import pydist as dist
    dist.init_process_group(backend="mpi", timeout=args.session_timeout)
    rank, size = dist.get_rank(), dist.get_world_size()
    keep = json.loads(args.keep) if args.keep else None
    with open(os.path.join(args.out, f"rank{rank}.jsonl"), "a", buffering=1) as f:
        for seed in range(args.first, args.first + args.count):
            prog = generate(seed, size, args.length)
            if keep is not None:
                prog = prog.keep(keep)
            f.write(json.dumps({"seed": seed, "event": "start"}) + "\n")
            start = time.monotonic()
            rec = {"seed": seed, "event": "done", "calls": 0, "problems": [], "hashes": {}, "error": None}
            try:
                rec["calls"], rec["problems"], rec["hashes"] = run_program(prog, dist)
            except BaseException as e:  # noqa: BLE001 -- the record says what; the job cannot go on
                rec["error"] = f"{type(e).__name__}: {e}"
                rec["timeout"] = type(e).__name__ in ("DistTimeoutError",)
                rec["trace"] = traceback.format_exc()[-1500:]
            rec["secs"] = round(time.monotonic() - start, 3)
            f.write(json.dumps(rec) + "\n")
            if rec["error"]:
                f.flush()
                os._exit(3)   # the other ranks are out of step: the driver ends the job, then goes on
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------------
# The driver: jobs, the comparison across ranks, the figures

def mpi_env(path, timeout):
    sys.path.insert(0, HERE)
    from run_mpi import mpi_env as base
    env = base(timeout)
    env.update(JOB_ENV)
    env.update(PATHS[path])
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def mpiexec():
    from pydist import _libraries
    return shutil.which(_libraries.mpiexec())


def read_records(out, size):
    recs = {}
    for r in range(size):
        p = os.path.join(out, f"rank{r}.jsonl")
        if not os.path.exists(p):
            continue
        with open(p) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue   # a line cut by the kill
                recs.setdefault(rec["seed"], {}).setdefault(r, {}).update(rec)
    return recs


@dataclasses.dataclass
class Failure:
    seed: int
    size: int
    path: str
    category: str       # hang, error, crash, ranks differ, wrong result
    detail: str
    sig: str = ""       # what kinds of failure have in common (the call, op, how), for the summary
    keep: list = None
    length: int = None  # items per program, where not the generator's own choice

    def key(self):
        return (self.category, self.sig)

    def rerun(self):
        cmd = f"python tests/conformance.py --ranks {self.size} --paths {self.path} --seed {self.seed} --programs 1"
        cmd += f" --length {self.length}" if self.length else ""
        return cmd + (f" --keep {','.join(map(str, self.keep))}" if self.keep else "")


def judge(seed, ranks_recs, size, path, killed, ended, length=None):
    """Failures of one program from every rank's record (None: the program did not start)."""
    if not ranks_recs:
        return None
    out = []
    done = {r: rec for r, rec in ranks_recs.items() if rec.get("event") == "done"}
    errs = {r: rec for r, rec in done.items() if rec.get("error")}
    if errs:
        timeout = any(rec.get("timeout") for rec in errs.values())
        text = "; ".join(f"rank {r}: {rec['error']}" for r, rec in sorted(errs.items()))
        first = next(iter(errs.values()))["error"]
        sig = first.split(":")[0] + (" in " + first.split(":")[1].split()[0] if ":" in first else "")
        out.append(("hang" if timeout else "error", text.replace("\n", " ")[:400], sig))
    missing = [r for r in range(size) if r not in done]
    if missing and not errs:
        if killed:
            out.append(("hang", f"rank(s) {missing} still in the program when the watchdog ended the job", "watchdog"))
        elif ended:
            out.append(("crash", f"rank(s) {missing} wrote no result; the job ended", ""))
    for r, rec in sorted(done.items()):
        for sig, p in rec.get("problems", []):
            out.append(("wrong result", f"rank {r}: {p}", sig))
    by_item = {}
    for r, rec in done.items():
        for iid, h in rec.get("hashes", {}).items():
            by_item.setdefault(iid, {}).setdefault(h, []).append(r)
    prog = None
    for iid, hs in sorted(by_item.items(), key=lambda kv: int(kv[0])):
        if len(hs) > 1:
            prog = prog or generate(seed, size, length)
            it = prog.items[int(iid)]
            out.append(("ranks differ", f"item {iid} {it.call}({CALLS[it.call].describe(it.args)}): ranks "
                        + " vs ".join(str(sorted(v)) for v in hs.values()),
                        " ".join(str(x) for x in (it.call, it.args.get("op", ""), it.args.get("algorithm") or "") if x)))
    return [Failure(seed, size, path, c, d, sig, length=length) for c, d, sig in out]


def run_job(size, path, first, count, session_timeout, watchdog, keep=None, length=None):
    """Programs first..first+count-1 in one job, until one breaks it. Returns ({seed: failures}, calls,
    seeds finished, next seed to run)."""
    out = tempfile.mkdtemp(prefix=f"pydist-conf-n{size}-")
    hard = int(600 + count * 10)   # hydra's own limit, behind the watchdog
    cmd = [mpiexec(), "-n", str(size), sys.executable, "-P", os.path.abspath(__file__), "--worker",
           "--first", str(first), "--count", str(count), "--out", out, "--session-timeout", str(session_timeout)]
    if keep is not None:
        cmd += ["--keep", json.dumps(keep)]
    if length is not None:
        cmd += ["--length", str(length)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=mpi_env(path, hard), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    log = tempfile.TemporaryFile()
    killed = False
    last, last_size = time.monotonic(), -1
    import threading
    pump = threading.Thread(target=lambda: shutil.copyfileobj(proc.stdout, log), daemon=True)
    pump.start()
    while proc.poll() is None:
        time.sleep(0.1)
        grown = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
        if grown != last_size:
            last, last_size = time.monotonic(), grown
        elif time.monotonic() - last > watchdog:
            killed = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    pump.join(5)
    recs = read_records(out, size)
    shutil.rmtree(out, ignore_errors=True)
    failures, calls, finished = {}, 0, 0
    nxt = first + count
    for seed in range(first, first + count):
        f = judge(seed, recs.get(seed, {}), size, path, killed, True, length)
        if f is None:   # the job broke on an earlier program
            nxt = seed
            break
        finished += 1
        calls += sum(rec.get("calls", 0) for rec in recs[seed].values())
        if f:
            failures[seed] = f
        if any(x.category in ("hang", "error", "crash") for x in f):
            nxt = seed + 1
            break
    if finished == 0:   # the job broke before its first program: say so rather than loop
        log.seek(0)
        tail = log.read()[-3000:].decode(errors="replace")
        failures[first] = [Failure(first, size, path, "crash", f"the job ran no program: {tail.strip()[-600:]}",
                                   "no program ran")]
        finished, nxt = 1, first + 1
    return failures, calls, finished, nxt


def soak(args):
    start = time.monotonic()
    tasks = [(n, p) for n in args.ranks for p in args.paths]
    figures = {t: {"programs": 0, "calls": 0, "failures": 0} for t in tasks}
    failures = []
    keep = [int(x) for x in args.keep.split(",")] if args.keep else None

    def one(task):
        n, p = task
        seed, end = args.seed, args.seed + args.programs
        while seed < end:
            fs, calls, finished, seed = run_job(n, p, seed, min(args.per_job, end - seed),
                                                args.session_timeout, args.watchdog, keep, args.length)
            figures[task]["programs"] += finished
            figures[task]["calls"] += calls
            for s, f in sorted(fs.items()):
                figures[task]["failures"] += 1
                for x in f:
                    x.keep, x.length = keep, args.length
                failures.extend(f)
                print(f"FAIL n={n} path={p} seed={s}: {f[0].category}: {f[0].detail[:300]}", flush=True)
    if args.jobs > 1:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(args.jobs) as ex:
            list(ex.map(one, tasks))
    else:
        for t in tasks:
            one(t)
    secs = time.monotonic() - start
    print(f"\n{'ranks':>5} {'path':<15} {'programs':>8} {'calls':>9} {'failed':>6}")
    for (n, p), fig in figures.items():
        print(f"{n:>5} {p:<15} {fig['programs']:>8} {fig['calls']:>9} {fig['failures']:>6}")
    total_p = sum(f["programs"] for f in figures.values())
    total_c = sum(f["calls"] for f in figures.values())
    bad = sum(f["failures"] for f in figures.values())
    print(f"\n{len(set(s for s in range(args.seed, args.seed + args.programs)))} programs x "
          f"{len(tasks)} (world size, path) = {total_p} runs, {total_c} calls, paths {args.paths}, "
          f"{bad} failed runs, {secs:.0f} s")
    cats = {}
    for f in failures:
        cats.setdefault(f.key(), []).append(f)
    if cats:
        print("\nFailures by kind (count, first seed, re-run):")
    for k, fs in sorted(cats.items(), key=lambda kv: -len(kv[1])):
        f = min(fs, key=lambda x: (x.size, x.seed))
        paths = ", ".join(p for p in PATHS if any(x.path == p for x in fs))
        sizes = sorted({x.size for x in fs})
        print(f"  [{len(fs)}] {f.category}: {f.sig} (paths {paths}; ranks {sizes})\n      e.g. {f.detail[:200]}"
              f"\n      re-run: {f.rerun()}\n      reduce: {f.rerun().replace(' --programs 1', ' --shrink')}")
    return 1 if bad else 0


def shrink(args):
    """Remove items from a failing program while it fails the same way (category), one job per try."""
    n, path = args.ranks[0], args.paths[0]
    prog = generate(args.seed, n, args.length)

    def fails(ids):
        fs, _, _, _ = run_job(n, path, args.seed, 1, args.session_timeout, args.watchdog, sorted(ids), args.length)
        return fs.get(args.seed, [])

    first = fails([it.id for it in prog.items])
    if not first:
        print(f"seed {args.seed} passes at {n} ranks on {path}: nothing to shrink")
        return 0
    want = first[0].category
    print(f"seed {args.seed}: {want}: {first[0].detail[:200]}\nshrinking...", flush=True)
    ids = [it.id for it in prog.items if it.call != "new_group"]
    chunk = max(1, len(ids) // 2)
    while chunk >= 1:
        k = 0
        while k < len(ids):
            trial = ids[:k] + ids[k + chunk:]
            if trial and any(f.category == want for f in fails(trial)):
                ids = trial
                print(f"  {len(ids)} items left", flush=True)
            else:
                k += chunk
        chunk //= 2
    small = prog.keep(ids)
    last = [f for f in fails(ids) if f.category == want]
    print("\n" + listing(small))
    print(f"\n{want}: {last[0].detail if last else '?'}")
    f = Failure(args.seed, n, path, want, "", keep=ids, length=args.length)
    print(f"re-run: {f.rerun()}")
    return 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", type=int, default=100, help="programs per (world size, path)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--seed", type=int, default=1, help="program seeds are seed .. seed + programs - 1")
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    ap.add_argument("--per-job", type=int, default=40, help="programs per mpiexec job")
    ap.add_argument("--session-timeout", type=float, default=8.0, help="init_process_group(timeout=)")
    ap.add_argument("--watchdog", type=float, default=30.0, help="kill a job whose ranks wrote nothing for this long")
    ap.add_argument("--jobs", type=int, default=1, help="jobs at once (one per core pair is plenty)")
    ap.add_argument("--big", type=float, default=0.0, help="share of all-reduces of 32 MiB (default 0)")
    ap.add_argument("--show", action="store_true", help="print the program of --seed at --ranks[0], per rank")
    ap.add_argument("--shrink", action="store_true", help="reduce the failing program --seed (--ranks[0], --paths[0])")
    ap.add_argument("--length", type=int, default=None, help="items per program (default: drawn, 4 to 48)")
    ap.add_argument("--keep", default=None, help="run only these item ids of the program (from --shrink)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    BIG_CHANCE[0] = args.big
    if args.worker:
        return worker(args)
    if args.show:
        prog = generate(args.seed, args.ranks[0], args.length)
        if args.keep:
            prog = prog.keep(int(x) for x in args.keep.split(","))
        print(listing(prog))
        return 0
    if mpiexec() is None:
        sys.exit("conformance.py: mpiexec.mpich not found")
    if args.shrink:
        return shrink(args)
    return soak(args)


if __name__ == "__main__":
    sys.exit(main())
