"""PYDIST_DEBUG=DETAIL: check that every rank calls the same collective the same way.

The counterpart of TORCH_DISTRIBUTED_DEBUG=DETAIL. Before each collective, every rank of the group
contributes a fingerprint of its call (operation, dtype, shape, root, reduce op) to an all-gather;
if they differ, every rank raises ValueError with a message that says what each rank passed, instead
of hanging or silently mixing up data (MPI only matches collectives by order, not by kind). This
costs one extra small all-gather per call, so it is off unless PYDIST_DEBUG=DETAIL is set when
pydist is imported.
"""
import functools
import inspect
import zlib

import numpy as np

from . import _C

# collective name -> (array argument, root argument or None, op argument or None)
CHECKED = {
    "barrier": (None, None, None),
    "broadcast": ("tensor", "src", None),
    "all_reduce": ("tensor", None, "op"),
    "reduce": ("tensor", "dst", "op"),
    "all_gather": ("tensor", None, None),
    "all_gather_into_tensor": ("input_tensor", None, None),
    "gather": ("tensor", "dst", None),
    "scatter": ("tensor", "src", None),
    "reduce_scatter": ("output", None, "op"),
    "reduce_scatter_tensor": ("output", None, "op"),
    "all_to_all": ("input_tensor_list", None, None),
    "all_to_all_single": ("input", None, None),
}
NAMES = sorted(CHECKED)
# with split sizes, each rank's input legitimately has its own number of rows
SHAPES_MAY_DIFFER = {"all_to_all_single"}
MAX_DIMS = 6
WIDTH = 6 + MAX_DIMS   # name, dtype, ndim, root, op, dims..., algorithm
ALGORITHMS = (None, "ring")   # all_reduce's algorithm= ("mpi" is None): a ring meets no MPI call and hangs


def _fingerprint(name, bound):
    array_arg, root_arg, op_arg = CHECKED[name]
    row = np.full(WIDTH, -1, np.int64)
    row[0] = NAMES.index(name)
    arr = bound.arguments.get(array_arg) if array_arg else None
    if isinstance(arr, (list, tuple)):
        arr = arr[0] if arr else None
    if arr is not None and hasattr(arr, "shape") and hasattr(arr, "dtype"):
        row[1] = zlib.crc32(str(arr.dtype).encode())
        if name not in SHAPES_MAY_DIFFER:
            row[2] = len(arr.shape)
            for i, d in enumerate(tuple(arr.shape)[:MAX_DIMS]):
                row[5 + i] = int(d)
    if root_arg:
        row[3] = int(bound.arguments.get(root_arg, 0))
    if op_arg:
        row[4] = int(bound.arguments.get(op_arg, 0))
    algorithm = bound.arguments.get("algorithm")
    if "algorithm" in bound.arguments:
        row[WIDTH - 1] = ALGORITHMS.index(None if algorithm == "mpi" else algorithm)
    return row


_DTYPE_NAMES = {zlib.crc32(n.encode()): n for n in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
    "float64", "complex64", "complex128")}


# ReduceOp's names by value, from _C as distributed.ReduceOp takes them (this module sits below distributed)
_OP_NAMES = {getattr(_C, "OP_" + name): name for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")}


def _describe(row):
    """What one rank's fingerprint row says it called, e.g. all_reduce(float32 (4,), op=SUM)."""
    name = NAMES[int(row[0])]
    _, root_arg, op_arg = CHECKED[name]
    parts = []
    if row[1] >= 0:
        dtype = _DTYPE_NAMES.get(int(row[1]), "other dtype")
        dims = tuple(int(d) for d in row[5:5 + min(int(row[2]), MAX_DIMS)]) if row[2] >= 0 else ""
        parts.append(f"{dtype} {dims}".strip())
    if root_arg:
        parts.append(f"{root_arg}={int(row[3])}")
    if op_arg and int(row[4]) in _OP_NAMES:
        parts.append(f"op={_OP_NAMES[int(row[4])]}")
    if row[WIDTH - 1] > 0:   # only a non-default algorithm is worth naming
        parts.append(f"algorithm={ALGORITHMS[int(row[WIDTH - 1])]!r}")
    return f"{name}({', '.join(parts)})"


def wrap(fn, group_handle):
    """fn, checked first: all ranks of the group must make the same call."""
    name = fn.__name__
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        handle = group_handle(bound.arguments.get("group"), name)
        if handle < 0:
            return fn(*args, **kwargs)   # not a member: fn warns and returns None
        # Argument errors first, locally, exactly as without DETAIL: nothing is sent by this call.
        _C.set_validate_only(True)
        try:
            fn(*args, **kwargs)
        finally:
            _C.set_validate_only(False)
        row = _fingerprint(name, bound)
        size = _C.get_world_size(handle)
        rows = np.zeros(size * WIDTH, np.int64)
        _C.all_gather_into_tensor(rows, row, handle, False)
        rows = rows.reshape(size, WIDTH)
        if not (rows == row).all():
            # every rank holds every fingerprint, so every rank raises the same message
            calls = "\n  ".join(f"rank {r}: {_describe(rows[r])}" for r in range(size))
            raise ValueError(f"{name}(): PYDIST_DEBUG=DETAIL: the ranks of the group did not make the same "
                             f"collective call (operation, dtype, shape, root, op or algorithm differ):\n  {calls}")
        return fn(*args, **kwargs)

    return checked
