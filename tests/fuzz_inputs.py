"""A seeded fuzzer of every decoder of bytes from outside (issue 41): each must refuse what is malformed
with a Python exception (ValueError, or OSError for a file it cannot read), never crash, hang, write
out of bounds or return something wrong.

    python tests/fuzz_inputs.py --seed 1 --per-decoder 100000
    python tests/fuzz_inputs.py --seed 1 --per-decoder 2000 --decoder topk --decoder checkpoint
    python tests/fuzz_inputs.py --replay fuzz-failures/topk-1-1234.input

One target per decoder (DECODERS):
  none fp16 bf16 topk sign powersgd   a compressor's payload, through _C.Compressor.decode_add
  checkpoint                          a checkpoint file, through Trainer.load at world size 1
  env                                 the PYDIST_* settings: those C reads (_C.mpi_info()["settings"],
                                      as init_process_group checks them) and those pydist/_env.py reads
  trace                               a timeline file: trace_report.load, summary, merge([path])
  progress, record                    pydist.run.read_progress(folder), read_record(folder, rank)
  pathtable                           a path table file (cached or PYDIST_TUNE's), as init reads it:
                                      _path_table.read, rows, then _C.set_path_table
Inputs are valid ones mutated (bit flips, bytes and words set to extremes, NaN and infinities, huge
counts, truncation, extension, splices, structure-aware edits) and random ones. Every target holds its
decoder to an independent reference as well: the verdict (accepted or refused) must be the reference's,
an accepted compressor payload must decode to the reference's sum and a checkpoint to its file's
parameters, and a refused input must leave the output (the `out` array, the trainer) as it was.

Each decoder's inputs run in a child process (`--worker`), one result line per input; a child that
dies (a crash, a sanitizer's abort) or goes quiet past HANG_S is recorded as a failure with the input
that did it, saved (as every failing input, up to SAVE_PER_KIND of a kind) under --save-dir, and a new
child goes on from the next input. Input i of a decoder is a function of (seed, decoder, i) alone, so a
failure is rebuilt exactly, in the parent or by --replay.

Printed per decoder: inputs, accepted, rejected (by exception type), failures (by kind; 0 expected),
and the time taken. The exit status is 1 when any decoder failed.
"""
import argparse
import collections
import json
import math
import os
import re
import random
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
import zlib

COMPRESSORS = ["none", "fp16", "bf16", "topk", "sign", "powersgd"]
DECODERS = COMPRESSORS + ["checkpoint", "env", "trace", "progress", "record", "pathtable"]
HANG_S = 60.0          # one input past this is a hang (an input takes well under 10 ms on a quiet machine)
HARNESS_ERROR = 3      # a worker's exit status when the fuzzer itself failed
SAVE_PER_KIND = 5      # failing inputs saved per (decoder, kind)
FLT_MAX = 3.4028234663852886e38

INT32_EDGES = [0, 1, -1, 2, 7, 8, 255, 256, 1000, 2**15, 2**16, 2**31 - 1, -2**31, 2**30, -2**30]
U64_EDGES = [0, 1, 2, 3, 4, 127, 128, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63,
             2**63 + 1, 2**64 - 2, 2**64 - 1]
FLOAT_BITS = [0x00000000, 0x80000000, 0x3F800000, 0xBF800000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
              0x7F800001, 0x7FFFFFFF, 0x00000001, 0x80000001, 0x7F7FFFFF, 0xFF7FFFFF, 0x7FC00001]


def _rng(seed, decoder, i):
    return random.Random(f"{seed}:{decoder}:{i}")


# ---------------------------------------------------------------------------------------------------
# Byte mutations, shared by every target

def _mutate_bytes(rng, data, others=()):
    """data with 1 to 3 mutations; `others`: valid inputs of the same kind, for splices."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(11)
        if op == 0 and b:                       # bit flips
            for _ in range(rng.randint(1, 8)):
                at = rng.randrange(len(b))
                b[at] ^= 1 << rng.randrange(8)
        elif op == 1 and b:                     # a byte to an extreme
            b[rng.randrange(len(b))] = rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256)])
        elif op == 2 and len(b) >= 4:           # an aligned word to an extreme int32
            at = rng.randrange(len(b) // 4) * 4
            b[at:at + 4] = struct.pack("<i", rng.choice(INT32_EDGES))
        elif op == 3 and len(b) >= 4:           # an aligned word to a special float32
            at = rng.randrange(len(b) // 4) * 4
            b[at:at + 4] = struct.pack("<I", rng.choice(FLOAT_BITS))
        elif op == 4 and len(b) >= 8:           # an aligned 8 bytes to an extreme count
            at = rng.randrange(len(b) // 8) * 8
            b[at:at + 8] = struct.pack("<Q", rng.choice(U64_EDGES))
        elif op == 5:                           # truncated
            del b[rng.randrange(len(b) + 1):]
        elif op == 6:                           # extended
            b += rng.randbytes(rng.choice([1, 2, 3, 4, 8, 64]))
        elif op == 7 and others:                # a splice with another valid input
            other = rng.choice(others)
            cut = rng.randrange(min(len(b), len(other)) + 1)
            b = b[:cut] + bytearray(other[cut:])
        elif op == 8 and b:                     # a chunk deleted or repeated
            lo = rng.randrange(len(b))
            hi = min(len(b), lo + rng.randint(1, 16))
            b = b[:lo] + b[hi:] if rng.random() < 0.5 else b[:hi] + b[lo:hi] + b[hi:]
        elif op == 9:                           # random bytes, the same length
            b = bytearray(rng.randbytes(len(b)))
        else:                                   # random bytes, another length
            b = bytearray(rng.randbytes(rng.choice([0, 1, 3, 4, 7, 16, len(b) + 4])))
    return bytes(b)


def _values(rng, n):
    """n float32 of every kind: normal, tiny, huge, zeros of both signs, and now and then infinities and
    NaNs (with payloads)."""
    import numpy as np
    gen = np.random.default_rng(rng.randrange(2**32))
    x = (gen.standard_normal(n) * 10.0 ** gen.integers(-8, 6, n)).astype(np.float32)
    if n and rng.random() < 0.3:
        special = np.array(FLOAT_BITS, np.uint32).view(np.float32)
        at = gen.integers(0, n, max(1, n // 50))
        x[at] = gen.choice(special, at.size)
    return x


# ---------------------------------------------------------------------------------------------------
# Compressor payloads

LENGTHS = [0, 1, 2, 7, 8, 9, 31, 255, 256, 257, 600, 1000]


def _topk_count(ratio, n):
    return 0 if n <= 0 else min(n, max(1, math.ceil(ratio * n - 1e-9)))


def _compressor_case(rng, kind):
    """(the Compressor's arguments, as JSON) for one input of `kind`."""
    n = rng.choice(LENGTHS)
    spec, matrices = kind, []
    if kind == "topk":
        spec = f"topk:{rng.choice([0.01, 0.1, 0.3, 0.5, 1.0])}"
    elif kind == "powersgd":
        spec = f"powersgd:{rng.randint(1, 3)}"
        at = 0
        while at < n and rng.random() < 0.7:
            rows, cols = rng.randint(2, 24), rng.randint(2, 24)
            lo = at + rng.randint(0, 8)
            if lo + rows * cols > n:
                break
            matrices.append([lo, rows, cols])
            at = lo + rows * cols
    return {"spec": spec, "n": n, "matrices": matrices}


_COMPRESSORS = {}


def _compressor(case):
    from pydist import _C
    key = json.dumps(case, sort_keys=True)
    if key not in _COMPRESSORS:
        _COMPRESSORS[key] = _C.Compressor(case["spec"], case["n"], [tuple(m) for m in case["matrices"]])
    return _COMPRESSORS[key]


def make_compressor_input(kind, seed, i):
    rng = _rng(seed, kind, i)
    case = _compressor_case(rng, kind)
    z = _compressor(case)
    valid = [_encode(z, _values(rng, case["n"])) for _ in range(2)]
    r = rng.random()
    if r < 0.15:
        data = valid[0]
    elif r < 0.9:
        data = _mutate_bytes(rng, valid[0], valid[1:])
    else:   # random bytes of the right length, or of any
        size = len(valid[0]) if rng.random() < 0.7 else rng.randrange(2 * len(valid[0]) + 8)
        data = rng.randbytes(size)
    s = rng.random()
    case["scale"] = 1.0 if s < 0.6 else rng.uniform(-4, 4) if s < 0.9 else rng.choice(
        [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e39, FLT_MAX, 1e-45])
    case["out_seed"] = rng.randrange(2**32)
    return case, data


def _encode(z, x):
    """A payload encode writes for x: from a fresh compressor, so it is x's own, whatever came before."""
    from pydist import _C
    fresh = _C.Compressor(z.spec, x.size, z.matrices)
    return fresh.encode(x)


def _payload_reference(case, z, data):
    """Whether the reference takes `data` for `case`: None, or why not."""
    import numpy as np
    n, kind = case["n"], case["spec"].split(":")[0]
    want = (4 * n if kind == "none" else 2 * n if kind in ("fp16", "bf16") else
            4 * (-(-n // 256)) + -(-n // 8) if kind == "sign" else
            8 * _topk_count(float(case["spec"].split(":")[1]), n) if kind == "topk" else z.payload_bytes)
    if len(data) != want:
        return f"length {len(data)} != {want}"
    if not abs(case["scale"]) <= FLT_MAX:
        return "scale"
    if kind == "topk":
        k = len(data) // 8
        index = np.frombuffer(data, np.int32, k)
        if k and (index[0] < 0 or index[-1] >= n or np.any(np.diff(index.astype(np.int64)) <= 0)):
            return "topk indices"
    if kind == "sign" and n:
        chunks = -(-n // 256)
        bits = np.frombuffer(data, np.uint32, chunks)
        if np.any((bits >> 31) != 0) or np.any((bits > 0x7F800000) & (bits != 0x7FC00000)):
            return "sign scales"
        if n % 8 and data[-1] >> (n % 8):
            return "sign padding"
    return None


def _decode_reference(case, data, out):
    """out + scale x the payload, in float32 as the C loops compute it (a product, then a sum); for powersgd
    only the entries outside its matrices (the rest is a BLAS product), the others NaN-masked."""
    import numpy as np
    n, kind, s = case["n"], case["spec"].split(":")[0], np.float32(case["scale"])
    ref = out.copy()
    with np.errstate(all="ignore"):
        if kind == "none":
            ref += s * np.frombuffer(data, np.float32)
        elif kind == "fp16":
            ref += s * np.frombuffer(data, np.float16).astype(np.float32)
        elif kind == "bf16":
            ref += s * (np.frombuffer(data, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif kind == "topk":
            k = len(data) // 8
            index, value = np.frombuffer(data, np.int32, k), np.frombuffer(data, np.float32, k, 4 * k)
            ref[index] += s * value
        elif kind == "sign":
            chunks = -(-n // 256)
            scales = np.frombuffer(data, np.float32, chunks)
            bits = np.unpackbits(np.frombuffer(data, np.uint8, offset=4 * chunks), bitorder="little")[:n]
            v = scales[np.arange(n) // 256]
            ref += s * np.where(bits == 1, -v, v)
        else:
            return None
    return ref


def run_compressor(kind, case, data):
    """(outcome, detail) of one payload: accepted, rejected:<type>, or failure:<kind>."""
    import numpy as np
    z = _compressor(case)
    out = _values(random.Random(case["out_seed"]), case["n"])
    before = out.copy()
    try:
        z.decode_add(data, out, case["scale"])
    except ValueError as e:
        if not np.array_equal(out.view(np.uint32), before.view(np.uint32)):
            return "failure:wrote-then-refused", str(e)
        if _payload_reference(case, z, data) is None:
            return "failure:refused-a-valid-payload", str(e)
        return "rejected:ValueError", ""
    except Exception as e:   # anything else is the decoder's failure
        return f"failure:{type(e).__name__}", str(e)[:200]
    why = _payload_reference(case, z, data)
    if why is not None:
        return "failure:accepted-a-malformed-payload", why
    ref = _decode_reference(case, data, before)
    if kind == "powersgd":   # the entries outside the matrices go raw: exactly as summed here
        inside = np.zeros(case["n"], bool)
        for lo, rows, cols in z.matrices:
            inside[lo:lo + rows * cols] = True
        raw = np.frombuffer(data, np.float32)[len(data) // 4 - int((~inside).sum()):]
        with np.errstate(all="ignore"):
            ref, got = before[~inside] + np.float32(case["scale"]) * raw, out[~inside]
    else:
        got = out
    if not np.array_equal(ref, got, equal_nan=True):
        differ = np.flatnonzero(~((ref == got) | (np.isnan(ref) & np.isnan(got))))
        return "failure:wrong-sum", f"at {differ[:4].tolist()}: {got[differ[:4]]} != {ref[differ[:4]]}"
    return "accepted", ""


# ---------------------------------------------------------------------------------------------------
# Checkpoints: Trainer.load at world size 1

MAGIC = 0x50444350
HEADER = {2: 56, 3: 104, 4: 128, 5: 192}   # csrc/engine/checkpoint.h
FIELDS = [(8, 8), (16, 8), (24, 8), (32, 8), (40, 8), (48, 8), (56, 8), (64, 8), (104, 8), (112, 8), (120, 8),
          (4, 4), (0, 4)]          # num_params, step, epoch, seed, hash, momentum flag, state ranks and bytes,
                                   # sample, world, global batch; version; magic
_CKPT = {}


def _trainer(compression="topk:0.5"):
    from pydist.engine import Trainer, mlp
    return Trainer(mlp((8,)), batch_size=8, seed=3, compression=compression)


def _with_crc(data):
    return data[:-4] + zlib.crc32(data[:-4]).to_bytes(4, "little")


def _checkpoint_bases():
    """Valid checkpoints of the fuzzed model (version 5 with compression state, without, and the same as
    versions 2, 3 and 4), one of another strategy and one of another model; built once per process, the
    same in every process."""
    if _CKPT:
        return _CKPT
    import numpy as np
    from pydist.engine import Trainer, mlp
    folder = tempfile.mkdtemp(prefix="pydist-fuzz-")
    try:
        rng = np.random.default_rng(7)
        x, y = rng.standard_normal((64, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, 64).astype(np.int32)
        bases = []
        for compression in ("topk:0.5", None):
            t = _trainer(compression)
            t.train_steps(x, y, 0, 0, 3)
            t.step = 3
            t.save(os.path.join(folder, "a.ckpt"))
            with open(os.path.join(folder, "a.ckpt"), "rb") as f:
                bases.append(f.read())
        v5 = bases[0]
        body = v5[192:-4]
        bases.append(_with_crc(v5[:4] + (4).to_bytes(4, "little") + v5[8:128] + body + b"\0" * 4))
        bases.append(_with_crc(v5[:4] + (3).to_bytes(4, "little") + v5[8:104] + body + b"\0" * 4))
        bases.append(_with_crc(v5[:4] + (2).to_bytes(4, "little") + v5[8:56] + bases[1][192:-4] + b"\0" * 4))
        for other in (Trainer(mlp((8,)), batch_size=8, seed=3, strategy="ring"), Trainer(mlp((9,)), batch_size=8)):
            other.save(os.path.join(folder, "b.ckpt"))
            with open(os.path.join(folder, "b.ckpt"), "rb") as f:
                bases.append(f.read())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    _CKPT["bases"] = bases
    _CKPT["n"], _CKPT["hash"] = struct.unpack_from("<Q", v5, 8)[0], struct.unpack_from("<Q", v5, 40)[0]
    return _CKPT


def make_checkpoint_input(seed, i):
    rng = _rng(seed, "checkpoint", i)
    bases = _checkpoint_bases()["bases"]
    data = rng.choice(bases)
    r = rng.random()
    if r < 0.1:
        pass
    elif r < 0.55:   # header fields to extremes (and the name's bytes), the CRC made right or not
        b = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.2:   # a byte of the compressor's, the model's or the strategy's name
                b[rng.choice([72 + rng.randrange(32), 128 + rng.randrange(48), 176 + rng.randrange(16)])] = \
                    rng.choice([0, 0x20, 0x7E, 0x7F, 0xFF, 0x1F, ord("x")])
                continue
            at, size = rng.choice(FIELDS)
            if at + size <= len(b):
                edges = U64_EDGES if size == 8 else [0, 1, 2, 3, 4, 5, MAGIC, 2**32 - 1]
                b[at:at + size] = rng.choice(edges).to_bytes(size, "little")
        data = bytes(b)
        if rng.random() < 0.2:   # and the length made to fit some of it
            data = data[:-4] + bytes(rng.choice([1, 4, 8, 1000])) + data[-4:] if rng.random() < 0.5 else \
                data[:rng.randrange(len(data))]
        data = _with_crc(data) if rng.random() < 0.8 and len(data) >= 4 else data
    elif r < 0.95:
        data = _mutate_bytes(rng, data, bases)
        data = _with_crc(data) if rng.random() < 0.5 and len(data) >= 4 else data
    else:
        data = rng.randbytes(rng.choice([0, 3, 56, 128, 192, len(data)]))
    return {"name": f"c{i % 2}.ckpt"}, data


def _checkpoint_reference(data, n, model_hash):
    """None when checkpoint.c's rules (csrc/engine/checkpoint.h) take `data` into the fuzzed trainer
    (strategy allreduce), else why not."""
    if len(data) < 56:
        return "short"
    magic, version = struct.unpack_from("<II", data)
    if magic != MAGIC or version not in HEADER or len(data) < HEADER[version]:
        return "magic, version or header"
    h = dict(zip(["num_params", "step", "epoch", "seed", "hash", "momentum"], struct.unpack_from("<6Q", data, 8)))
    ranks, each, name = (struct.unpack_from("<2Q", data, 56) + (data[72:104],)) if version >= 3 else (0, 0, bytes(32))
    names = [name] + ([data[128:176], data[176:192]] if version >= 5 else [])
    for field in names:
        end = field.find(b"\0")
        if end < 0 or any(c < 0x20 or c > 0x7E for c in field[:end]) or any(field[end:]):
            return "name"
    if h["num_params"] != n or h["hash"] != model_hash:
        return "model"
    if version >= 5 and names[2].rstrip(b"\0") not in (b"", b"allreduce"):
        return "strategy"
    if (ranks == 0) != (each == 0):
        return "state size"
    want = HEADER[version] + 8 * n + ranks * each + 4
    if ranks * each >= 2**64 or want >= 2**64:
        return "state size"
    if h["step"] >= 2**63 or h["epoch"] >= 2**63 or h["momentum"] > 1:
        return "fields"
    if version >= 4:
        sample, world, batch = struct.unpack_from("<3Q", data, 104)
        if sample != 2**64 - 1 and (sample >= 2**63 or not 1 <= world < 2**63 or not 1 <= batch < 2**63):
            return "position"
    if len(data) != want:
        return "length"
    if zlib.crc32(data[:-4]) != int.from_bytes(data[-4:], "little"):
        return "crc"
    return None


_LOADER = {}


def run_checkpoint(case, data):
    import numpy as np
    ctx = _checkpoint_bases()
    if not _LOADER:
        _LOADER["folder"] = tempfile.mkdtemp(prefix="pydist-fuzz-")
        _LOADER["trainer"] = _trainer()
        _LOADER["good"] = os.path.join(_LOADER["folder"], "good.ckpt")
        with open(_LOADER["good"], "wb") as f:
            f.write(ctx["bases"][0])
    t = _LOADER["trainer"]

    def state():
        return (t.params.tobytes(), t.engine.momentum.tobytes(), t.engine.momentum_started, t.step, t.epoch,
                t.seed, t.engine.compression_state(), t.resumed_from)

    before = state()
    path = os.path.join(_LOADER["folder"], case["name"])
    with open(path, "wb") as f:
        f.write(data)
    why = _checkpoint_reference(data, ctx["n"], ctx["hash"])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # another compressor's state: a warning, and zero residuals
            t.load(path)
    except (ValueError, OSError) as e:
        if state() != before:
            return "failure:changed-then-refused", str(e)[:200]
        if why is None:
            return "failure:refused-a-valid-checkpoint", str(e)[:200]
        return f"rejected:{type(e).__name__}", ""
    except Exception as e:
        return f"failure:{type(e).__name__}", str(e)[:200]
    if why is not None:
        return "failure:accepted-a-malformed-checkpoint", why
    at = HEADER[struct.unpack_from("<I", data, 4)[0]]
    n = ctx["n"]
    if t.params.tobytes() != data[at:at + 4 * n] or t.engine.momentum.tobytes() != data[at + 4 * n:at + 8 * n]:
        return "failure:loaded-other-values", ""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t.load(_LOADER["good"])   # as it was, for the next input
    return "accepted", ""


# ---------------------------------------------------------------------------------------------------
# Environment settings

BYTES_MAX = 2**40
SETTINGS = {   # name: (valid examples, how pydist reads it)
    "PYDIST_SHM_BYTES": (["0", "268435456", "4096", "1099511627776"], "c"),
    "PYDIST_SHM_SMALL_BYTES": (["0", "65536", "100000"], "c"),
    "PYDIST_SHM_STAGE": (["64", "1048576", "4096"], "c"),
    "PYDIST_PERSISTENT_BYTES": (["0", "8192"], "c"),
    "PYDIST_THREAD_LEVEL": (["single", "funneled", "serialized", "multiple"], "c"),
    "PYDIST_STALL_WARN": (["0", "60", "0.5", "1000000000"], "c"),
    "PYDIST_WAIT": (["mpi", "MPI"], "py"),
    "PYDIST_DEBUG": (["DETAIL", "detail", "OFF"], "py"),
    "PYDIST_BLAS_THREADS": (["1", "4", "1024"], "py"),
    "PYDIST_SURVIVE": (["0", "1"], "py"),
}
ODD_CHARS = [" ", "\t", "+", "-", "x", "e", ".", "_", "0", "9", "\u0663", "\u00b2", "\uff11", "\u0130", "\n", "%",
             "\u00a0", "a", "A", "\x7f", "\x01"]


def make_env_input(seed, i):
    rng = _rng(seed, "env", i)
    name = rng.choice(sorted(SETTINGS))
    value = rng.choice(SETTINGS[name][0])
    r = rng.random()
    if r < 0.15:
        pass
    elif r < 0.6:
        for _ in range(rng.randint(1, 2)):
            op = rng.randrange(6)
            at = rng.randrange(len(value) + 1)
            if op == 0:
                value = value[:at] + rng.choice(ODD_CHARS) + value[at:]
            elif op == 1 and value:
                value = value[:at] + value[at + 1:]
            elif op == 2:
                value = value + "0" * rng.choice([1, 5, 10, 20, 40])
            elif op == 3:
                value = value.upper() if rng.random() < 0.5 else value.swapcase()
            elif op == 4:
                value = rng.choice(["", "-1", "-0", "0x10", "1e3", "1.5", "nan", "inf", "18446744073709551616",
                                    "18446744073709551615", "1099511627777", "1025", "00001", "true", "yes"])
            else:
                value = value * 2
    else:
        value = "".join(rng.choice(ODD_CHARS) if rng.random() < 0.5 else chr(rng.randrange(0x21, 0x7F))
                        for _ in range(rng.randrange(12)))
    return {"name": name, "value": value}, value.encode("utf-8", "surrogateescape")


def _env_reference(name, value):
    """(ok, value) as the setting's rules (docs/reference/environment.md) read it."""
    if value == "":
        return True, {"PYDIST_BLAS_THREADS": 1, "PYDIST_SURVIVE": False}.get(name)
    digits = value.isascii() and value.isdigit()
    if name == "PYDIST_THREAD_LEVEL":
        return (value in SETTINGS[name][0]), value
    if name == "PYDIST_STALL_WARN":
        ok = re.fullmatch(r"[0-9]+(\.[0-9]+)?", value) is not None and float(value) <= 1e9
        return ok, float(value) if ok else None
    if SETTINGS[name][1] == "c":
        return (digits and int(value) <= BYTES_MAX), int(value) if digits else None
    if name == "PYDIST_WAIT":
        return value.lower() == "mpi", "mpi"
    if name == "PYDIST_DEBUG":
        return value.lower() in ("off", "detail"), value.lower()
    if name == "PYDIST_BLAS_THREADS":
        return (digits and 1 <= int(value) <= 1024), int(value) if digits else None
    return value in ("0", "1"), value == "1"


def run_env(case, data):
    from pydist import _C, _env
    name, value = case["name"], case["value"]
    ok, want = _env_reference(name, value)
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        got = _C.mpi_info()["settings"][name] if SETTINGS[name][1] == "c" else _env.read(name)
    except ValueError as e:
        if ok:
            return "failure:refused-a-valid-setting", str(e)[:200]
        if name not in str(e):
            return "failure:error-names-not-the-variable", str(e)[:200]
        return "rejected:ValueError", ""
    except Exception as e:
        return f"failure:{type(e).__name__}", str(e)[:200]
    finally:
        if saved is None:
            del os.environ[name]
        else:
            os.environ[name] = saved
    if not ok:
        return "failure:accepted-a-malformed-setting", f"{name}={value!r} read as {got!r}"
    if got != want:
        return "failure:read-another-value", f"{name}={value!r} read as {got!r}, not {want!r}"
    return "accepted", ""


# ---------------------------------------------------------------------------------------------------
# Timeline files (pydist.trace_report)

def _trace_bases():
    def span(rank, ts, dur, cat, name, **args):
        return {"ph": "X", "pid": rank, "tid": 10 + rank, "ts": ts, "dur": dur, "cat": cat, "name": name,
                "args": args}
    traces = []
    for ranks in ([0], [0, 1]):
        events = []
        for r in ranks:
            events += [{"ph": "M", "pid": r, "tid": 0, "name": "process_name", "args": {"name": f"rank {r} (vm)"}},
                       {"ph": "M", "pid": r, "tid": 10 + r, "name": "thread_name", "args": {"name": "main"}}]
            for k in range(3):
                s = 1000.0 + 5000.0 * k
                events += [span(r, s, 4000.0, "step", "step", step=k + 1),
                           span(r, s, 1500.0 + 500 * r, "compute", "forward"),
                           span(r, s + 2000, 1800.0, "sync", "gradient sync", group=7, seq=k, bytes=4096)]
            events += [{"ph": "b", "id": f"0x{r}1", "pid": r, "tid": 10 + r, "ts": 100.0, "cat": "comm",
                        "name": "all_reduce", "args": {"group": 7, "seq": 9, "bytes": 64, "path": "shm", "peer": -1}},
                       {"ph": "e", "id": f"0x{r}1", "pid": r, "tid": 10 + r, "ts": 300.0, "cat": "comm",
                        "name": "all_reduce", "args": {}}]
        info = {str(r): {"events": len(events), "dropped": 0, "host": "vm", "groups": {"7": ranks}} for r in ranks}
        traces.append({"traceEvents": events, "displayTimeUnit": "ms",
                       "otherData": {"pydist": {"version": 1, "ranks": info}}})
    return traces


JSON_ODD = [None, True, False, 0, -1, 1.5, -0.0, 2**63, 2**64 + 5, -2**70, 10**400, 1e308, -1e308, 5e-324, "",
            "x", "\u0000", "\ud800x", [], {}, [1, [2]], {"a": 1}, "NaN", "0x10"]


def _edit_json(rng, value):
    """`value` with one random part deleted, repeated (in a list), replaced, or edited in turn."""
    if isinstance(value, (dict, list)) and value and rng.random() < 0.8:
        out = dict(value) if isinstance(value, dict) else list(value)
        key = rng.choice(list(out)) if isinstance(out, dict) else rng.randrange(len(out))
        r = rng.random()
        if r < 0.15:
            del out[key]
        elif r < 0.25 and isinstance(out, list):
            out.insert(key, out[key])
        elif r < 0.35:
            out[key] = rng.choice(JSON_ODD)
        else:
            out[key] = _edit_json(rng, out[key])
        return out
    return rng.choice(JSON_ODD)


def _text(rng, trace):
    text = json.dumps(trace)
    if rng.random() < 0.1:   # NaN and Infinity, as Python writes them (not JSON)
        text = text.replace("1500.0", rng.choice(["NaN", "Infinity", "-Infinity", "1e999"]), 1)
    return text.encode()


def make_trace_input(seed, i):
    rng = _rng(seed, "trace", i)
    bases = _trace_bases()
    base = rng.choice(bases)
    r = rng.random()
    if r < 0.1:
        data = _text(rng, base)
    elif r < 0.6:
        edited = base
        for _ in range(rng.randint(1, 3)):
            edited = _edit_json(rng, edited)
        data = _text(rng, edited)
    elif r < 0.9:
        data = _mutate_bytes(rng, _text(rng, base), [_text(rng, b) for b in bases])
    elif r < 0.95:   # nesting deep enough to exhaust a recursive reader
        depth = rng.choice([100, 1000, 100_000])
        data = (b'{"traceEvents": [' + b"[" * depth + b"]" * depth + b"]}")
    else:
        data = rng.randbytes(rng.randrange(64))
    return {}, data


_FOLDER = {}


def _folder():
    if "path" not in _FOLDER:
        _FOLDER["path"] = tempfile.mkdtemp(prefix="pydist-fuzz-")
    return _FOLDER["path"]


def run_trace(case, data):
    from pydist import trace_report
    path = os.path.join(_folder(), "rank.json")
    with open(path, "wb") as f:
        f.write(data)
    try:
        trace = trace_report.load(path)
        trace_report.summary(trace)
        trace_report.merge([path])
    except (ValueError, OSError) as e:
        return f"rejected:{type(e).__name__}", ""
    except Exception as e:
        where = traceback.extract_tb(e.__traceback__)[-1]
        return f"failure:{type(e).__name__}", f"{os.path.basename(where.filename)}:{where.lineno}: {str(e)[:150]}"
    return "accepted", ""


# ---------------------------------------------------------------------------------------------------
# The launcher's records (pydist.run): progress.json (rank 0's report) and rank-N.json (a watcher's)

PROGRESS = {"step": 120, "time": 1.7e9, "restart": "0", "checkpoint": "/runs/a/run.ckpt", "checkpoint_step": 100,
            "finished": True}
RECORD = {"rank": 1, "host": "vm", "pid": 4242, "started": 1.7e9, "ended": 1.7e9 + 30, "status": 1, "signal": 9,
          "last_line": "Killed"}


def _make_json_input(rng, base):
    r = rng.random()
    if r < 0.1:
        return json.dumps(base).encode()
    if r < 0.6:
        edited = base
        for _ in range(rng.randint(1, 2)):
            edited = _edit_json(rng, edited)
        return _text(rng, edited) if isinstance(edited, (dict, list)) else json.dumps(edited).encode()
    if r < 0.9:
        return _mutate_bytes(rng, json.dumps(base).encode())
    if r < 0.95:
        depth = rng.choice([1000, 100_000])
        return b"[" * depth + b"]" * depth
    return rng.randbytes(rng.randrange(48))


def make_progress_input(seed, i):
    return {}, _make_json_input(_rng(seed, "progress", i), PROGRESS)


def make_record_input(seed, i):
    rng = _rng(seed, "record", i)
    return {"rank": 1}, _make_json_input(rng, RECORD)


def _real(x):
    return (isinstance(x, int) and not isinstance(x, bool)) or (isinstance(x, float) and math.isfinite(x))


def _count(x):
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


# what each field of a returned dict must be, when it is there
PROGRESS_FIELDS = {"step": _count, "checkpoint_step": _count, "time": _real, "finished": lambda x: isinstance(x, bool),
                   "checkpoint": lambda x: isinstance(x, str), "restart": lambda x: x is None or isinstance(x, str)}
RECORD_FIELDS = {"rank": _count, "pid": _count, "status": lambda x: isinstance(x, int) and not isinstance(x, bool),
                 "signal": lambda x: x is None or _count(x), "started": _real, "ended": _real,
                 "host": lambda x: isinstance(x, str), "last_line": lambda x: x is None or isinstance(x, str)}


def _check_fields(got, fields):
    bad = [k for k, ok in fields.items() if k in got and not ok(got[k])]
    return f"fields {bad}: {[got[k] for k in bad]!r:.150}" if bad else None


def run_progress(case, data):
    from pydist import run
    folder = _folder()
    with open(os.path.join(folder, run.PROGRESS), "wb") as f:
        f.write(data)
    try:
        got = run.read_progress(folder)
    except (ValueError, OSError) as e:
        return f"rejected:{type(e).__name__}", ""
    except Exception as e:
        return f"failure:{type(e).__name__}", str(e)[:200]
    if not isinstance(got, dict):
        return "failure:not-a-dict", f"{type(got).__name__}"
    if not got:
        return "rejected:empty", ""   # no report: the launcher's answer to a malformed one
    why = _check_fields(got, PROGRESS_FIELDS)
    return ("failure:unchecked-field", why) if why else ("accepted", "")


def run_record(case, data):
    from pydist import run
    folder = _folder()
    with open(os.path.join(folder, f"rank-{case['rank']}.json"), "wb") as f:
        f.write(data)
    try:
        got = run.read_record(folder, case["rank"])
    except (ValueError, OSError) as e:
        return f"rejected:{type(e).__name__}", ""
    except Exception as e:
        return f"failure:{type(e).__name__}", str(e)[:200]
    if got is None:
        return "rejected:None", ""
    if not isinstance(got, dict):
        return "failure:not-a-dict-or-None", f"{type(got).__name__}"
    why = _check_fields(got, RECORD_FIELDS)
    if why is None and "rank" in got and got["rank"] != case["rank"]:
        why = f"rank {got['rank']!r} in the file of rank {case['rank']}"
    return ("failure:unchecked-field", why) if why else ("accepted", "")


# ---------------------------------------------------------------------------------------------------
# The path table (pydist/_path_table.py): the file init reads, cached per machine or named by PYDIST_TUNE

TABLE_FORMAT = "pydist path table 1"
TABLE_OPS = ("all_reduce", "broadcast", "all_gather", "all_to_all", "reduce_scatter")   # tuned.h's order
TABLE_PATHS = ("slots", "pair", "mpi", "ring", "shm")                                    # tuned.h's 1..5
TABLE_BASES = [
    {"format": TABLE_FORMAT, "host": "vm", "measured": "2026-12-01T00:00:00Z",
     "tables": {"2": {"all_reduce": [[65536, "built-in"], [2097152, "shm"], [16777216, "built-in"],
                                     [33554432, "ring"], [67108864, "built-in"]],
                      "broadcast": [[32768, "built-in"], [65536, "slots"], [67108864, "pair"]],
                      "all_to_all": [[67108864, "built-in"]],
                      "reduce_scatter": [[32768, "built-in"], [65536, "ring"]]},
                "3": {"all_gather": [[4096, "slots"], [1 << 20, "mpi"]]}},
     "times": {"2": {"all_reduce": {"8": {"built-in": 2.6, "mpi": 6.4}}}}},
    {"format": TABLE_FORMAT, "tables": {str(r): {op: [[1 << 62, "mpi"]] for op in TABLE_OPS} for r in (2, 4, 64)}},
]
# spellings of a group size: the plain one, and others of the same number that a table must not hold
RANK_SPELLINGS = ["02", " 2", "2 ", "+2", "2.0", "\u0662", "0x2", "1", "1025", "-2", "", "two"]


def make_pathtable_input(seed, i):
    rng = _rng(seed, "pathtable", i)
    base = json.loads(json.dumps(rng.choice(TABLE_BASES)))
    if rng.random() < 0.15:   # a group size spelled otherwise, beside or instead of the plain one
        key = rng.choice(list(base["tables"]))
        spelled = rng.choice(RANK_SPELLINGS)
        base["tables"][spelled] = base["tables"][key] if rng.random() < 0.5 else base["tables"].pop(key)
        return {}, json.dumps(base).encode()
    return {}, _make_json_input(rng, base)


def _table_paths(op, ranks):
    """The paths a row may name (tuned.c's path_allowed), besides "built-in"."""
    allowed = {"slots", "mpi"}
    if ranks == 2 and op in ("broadcast", "all_gather", "all_to_all"):
        allowed.add("pair")
    if op in ("all_reduce", "reduce_scatter"):
        allowed.add("ring")
    if op == "all_reduce":
        allowed.add("shm")
    return allowed


def _pathtable_reference(data):
    """(rows, None) when the rules take `data`: its C rows (ranks, op, path, upto) in tuned.c's order;
    (None, why) when they refuse it."""
    try:
        table = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None, "not JSON"
    if not isinstance(table, dict) or table.get("format") != TABLE_FORMAT or not isinstance(table.get("tables"), dict):
        return None, "not a path table"
    out = []
    for key, ops in table["tables"].items():
        if not (isinstance(key, str) and re.fullmatch(r"[1-9][0-9]*", key) and 2 <= int(key) <= 1024):
            return None, f"group size {key!r}"
        if not isinstance(ops, dict):
            return None, "ops"
        for op, rows in ops.items():
            if op not in TABLE_OPS or not isinstance(rows, list) or not rows:
                return None, f"op {op!r}"
            last = 0
            for row in rows:
                if not (isinstance(row, list) and len(row) == 2 and type(row[0]) is int and type(row[1]) is str):
                    return None, "row"
                upto, path = row
                if not (last < upto <= 1 << 62) or (path != "built-in" and path not in _table_paths(op, int(key))):
                    return None, "row's size or path"
                last = upto
                out.append((int(key), TABLE_OPS.index(op), 0 if path == "built-in" else TABLE_PATHS.index(path) + 1,
                            upto))
    if len(out) > 2048:
        return None, "too many rows"
    return sorted(out, key=lambda r: (r[0], r[1], r[3])), None


def run_pathtable(case, data):
    from pydist import _C, _path_table
    path = os.path.join(_folder(), "paths.json")
    with open(path, "wb") as f:
        f.write(data)
    want, why = _pathtable_reference(data)
    try:
        _C.set_path_table(_path_table.rows(_path_table.read(path)))
        got = [tuple(r) for r in _C.path_table()]
    except (ValueError, OSError) as e:
        return (f"rejected:{type(e).__name__}", "") if want is None else (
            "failure:refused-a-valid-table", f"{type(e).__name__}: {str(e)[:150]}")
    except Exception as e:
        return f"failure:{type(e).__name__}", str(e)[:200]
    finally:
        _C.set_path_table(None)
    if want is None:
        return "failure:took-an-invalid-table", why
    return ("accepted", "") if got == want else ("failure:wrong-rows", f"{got[:3]} ... against {want[:3]} ...")


# ---------------------------------------------------------------------------------------------------
# One input, by decoder

def make_input(decoder, seed, i):
    """(case, data) of input i: case is JSON (what the input is besides its bytes), data the bytes."""
    if decoder in COMPRESSORS:
        return make_compressor_input(decoder, seed, i)
    return globals()[f"make_{decoder}_input"](seed, i)


def run_input(decoder, case, data):
    if decoder in COMPRESSORS:
        return run_compressor(decoder, case, data)
    return globals()[f"run_{decoder}"](case, data)


def save_input(folder, decoder, seed, i, case, data, kind, detail):
    """The input as a file --replay reads: a JSON line, then the bytes."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{decoder}-{seed}-{i}.input")
    head = {"decoder": decoder, "seed": seed, "index": i, "case": case, "kind": kind, "detail": detail}
    with open(path, "wb") as f:
        f.write(json.dumps(head).encode() + b"\n" + data)
    return path


# ---------------------------------------------------------------------------------------------------
# The worker (a child process) and the parent that restarts it

def worker(decoder, seed, start, end):
    import faulthandler
    faulthandler.enable()   # a crash prints the Python stack on stderr, which the parent keeps
    warnings.simplefilter("ignore")
    out = sys.stdout
    for i in range(start, end):
        try:
            case, data = make_input(decoder, seed, i)
            outcome, detail = run_input(decoder, case, data)
        except Exception:   # the fuzzer's own fault (run_input catches the decoder's): stop, loudly
            traceback.print_exc()
            sys.exit(HARNESS_ERROR)
        out.write(f"{i}\t{outcome}\t{json.dumps(detail)}\n")
        out.flush()


def _child_env():
    """This environment, with this pydist first on the path (an ASan build's too), no launcher variables
    (a child is no rank of a job), and UCX leaving Python's crash handler alone."""
    import pydist
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPIR_CVAR_", "PYDIST_MPI_OWNER"))}
    parent = os.path.dirname(os.path.dirname(os.path.abspath(pydist.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([parent] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["UCX_ERROR_SIGNALS"] = ""
    for name in SETTINGS:   # the env target sets each itself
        env.pop(name, None)
    return env


class Stats:
    def __init__(self, decoder):
        self.decoder, self.inputs, self.accepted, self.seconds = decoder, 0, 0, 0.0
        self.rejected, self.failures = collections.Counter(), collections.Counter()
        self.examples = {}   # failure kind -> (index, detail, saved file)

    def line(self):
        rejected = ", ".join(f"{k} {v}" for k, v in sorted(self.rejected.items())) or "none"
        failures = ", ".join(f"{k} {v}" for k, v in sorted(self.failures.items()))
        return (f"{self.decoder}: inputs {self.inputs}, accepted {self.accepted}, rejected "
                f"{sum(self.rejected.values())} ({rejected}), failures {sum(self.failures.values())}"
                + (f" ({failures})" if failures else "") + f", {self.seconds:.1f} s")


def run_decoder(decoder, seed, count, save_dir, log=None):
    """Run inputs [0, count) of `decoder` in child processes; returns its Stats."""
    stats, i, started = Stats(decoder), 0, time.monotonic()
    saved = collections.Counter()

    def fail(index, kind, detail, case=None, data=None):
        stats.failures[kind] += 1
        if saved[kind] < SAVE_PER_KIND:
            saved[kind] += 1
            if data is None:
                case, data = make_input(decoder, seed, index)
            path = save_input(save_dir, decoder, seed, index, case, data, kind, detail)
            stats.examples.setdefault(kind, (index, detail, path))

    while i < count:
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", decoder, str(seed), str(i),
                                     str(count)], stdout=subprocess.PIPE, stderr=err, env=_child_env())
            buf, last = b"", time.monotonic()
            while True:
                ready, _, _ = select.select([proc.stdout], [], [], 1.0)
                chunk = os.read(proc.stdout.fileno(), 65536) if ready else None
                if chunk:
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        index, outcome, detail = line.decode().split("\t", 2)
                        index, detail = int(index), json.loads(detail)
                        stats.inputs += 1
                        if outcome == "accepted":
                            stats.accepted += 1
                        elif outcome.startswith("rejected:"):
                            stats.rejected[outcome.split(":", 1)[1]] += 1
                        else:
                            fail(index, outcome.split(":", 1)[1], detail)
                        i = index + 1
                    last = time.monotonic()
                elif chunk == b"":   # the child ended: done, or died at input i
                    break
                elif time.monotonic() - last > HANG_S:
                    proc.kill()
                    proc.wait()
                    break
            code = proc.wait()
            if code == HARNESS_ERROR:
                err.seek(0)
                raise RuntimeError(f"{decoder}: the fuzzer failed at input {i}:\n{err.read().decode()[-3000:]}")
            if i < count:   # it died (or hung) at input i: save it and go on from the next
                err.seek(0)
                lines = err.read().decode(errors="replace").strip().splitlines()
                why = [line for line in lines if line.startswith(("Fatal Python error", "==", "SUMMARY"))][:3]
                kind = "hang" if code == -9 else f"crash (exit status {code})"
                fail(i, kind, " | ".join(why or lines[-4:])[-600:])
                stats.inputs += 1
                i += 1
            elif code != 0:
                err.seek(0)
                raise RuntimeError(f"{decoder}: the worker exited {code} after its last input: {err.read()[-2000:]}")
        if log:
            log(f"  {decoder}: {i}/{count} inputs ...")
    stats.seconds = time.monotonic() - started
    return stats


def replay(path):
    """Run one saved input in this process (a crash then shows here), and say what came of it."""
    with open(path, "rb") as f:
        head = json.loads(f.readline())
        data = f.read()
    print(f"{head['decoder']} input {head['index']} (seed {head['seed']}), saved as {head['kind']}: {head['detail']}")
    print("now:", *run_input(head["decoder"], head["case"], data))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-decoder", type=int, default=1000, help="inputs per decoder")
    p.add_argument("--decoder", action="append", choices=DECODERS, help="only these (repeatable; default: all)")
    p.add_argument("--save-dir", default="fuzz-failures", help="where failing inputs are saved")
    p.add_argument("--replay", help="run one saved input here")
    p.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        decoder, seed, start, end = args.worker
        return worker(decoder, int(seed), int(start), int(end))
    if args.replay:
        return replay(args.replay)
    failed, started = False, time.monotonic()
    for decoder in args.decoder or DECODERS:
        stats = run_decoder(decoder, args.seed, args.per_decoder, args.save_dir)
        print(stats.line(), flush=True)
        for kind, (index, detail, path) in sorted(stats.examples.items()):
            print(f"    {kind}: input {index}: {detail[:300]} (saved: {path})")
        failed |= bool(stats.failures)
    print(f"seed {args.seed}, {args.per_decoder} inputs per decoder, {time.monotonic() - started:.1f} s in all")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
