"""torch.distributed's API on NumPy arrays, over MPI.

This is the Python front of pydist (the counterpart of torch's ``distributed_c10d.py``): keywords,
defaults, groups, warnings and docstrings. Everything that touches memory or MPI is in the C module
``pydist._C``, which also re-checks every argument it uses. The common case (default group, blocking
call) is one Python frame and one C call.
"""
import atexit
import datetime
import enum
import os
import sys
import time
import traceback
import warnings

from . import _C

__all__ = [
    "ReduceOp", "reduce_op", "Backend", "GroupMember", "ProcessGroup", "Work",
    "DistError", "DistBackendError", "DistTimeoutError",
    "init_process_group", "destroy_process_group", "is_initialized", "is_available",
    "is_mpi_available", "is_gloo_available", "is_nccl_available", "get_backend", "get_rank",
    "get_world_size", "barrier", "send", "recv", "isend", "irecv", "broadcast", "all_reduce",
]

DistError = _C.DistError
DistBackendError = _C.DistBackendError
DistTimeoutError = _C.DistTimeoutError
Work = _C.Work


class ReduceOp(enum.IntEnum):
    """Reduction operations, as ``torch.distributed.ReduceOp``.

    ``AVG`` is the sum divided by the group size (floating and complex dtypes). On bool arrays SUM and
    MAX are logical or, PRODUCT and MIN logical and, as in NumPy. An op that does not fit the dtype
    (BXOR on float, MIN on complex) raises ``TypeError`` before anything is sent.
    """
    SUM = _C.OP_SUM
    AVG = _C.OP_AVG
    PRODUCT = _C.OP_PRODUCT
    MIN = _C.OP_MIN
    MAX = _C.OP_MAX
    BAND = _C.OP_BAND
    BOR = _C.OP_BOR
    BXOR = _C.OP_BXOR

    def __repr__(self):
        return f"<ReduceOp.{self.name}: {self.value}>"


class _ReduceOpAlias:
    """The deprecated ``reduce_op`` (SUM, PRODUCT, MIN, MAX); each use warns, as torch's does."""
    _members = ("SUM", "PRODUCT", "MIN", "MAX")

    def __getattr__(self, name):
        if name in self._members:
            warnings.warn("torch.distributed.reduce_op is deprecated, please use "
                          "torch.distributed.ReduceOp instead", FutureWarning, stacklevel=2)
            return ReduceOp[name]
        raise AttributeError(f"reduce_op has no member {name!r}; it has {', '.join(self._members)}")

    def __dir__(self):
        return list(self._members)


reduce_op = _ReduceOpAlias()


class Backend(str):
    """Backend names, as ``torch.distributed.Backend``. pydist always runs on MPI."""
    MPI = "mpi"
    GLOO = "gloo"
    NCCL = "nccl"

    def __new__(cls, name):
        return str.__new__(cls, str(name).lower())


class ProcessGroup:
    """A group of ranks with its own MPI communicator. ``GroupMember.WORLD`` is the default group."""

    def __init__(self, handle, ranks):
        self._handle = handle   # slot in _C's communicator table; -1 on ranks outside the group
        self.ranks = list(ranks)

    def size(self):
        return len(self.ranks)

    def rank(self):
        return self.ranks.index(get_rank()) if self._handle >= 0 else -1

    def __repr__(self):
        return f"<pydist.ProcessGroup ranks={self.ranks}>"


class GroupMember:
    WORLD = None             # set by init_process_group
    NON_GROUP_MEMBER = -100


_world = None   # the default ProcessGroup


def _group_handle(group, fn):
    """The _C handle for `group`, or -1 (with torch's warning) when this rank is not a member."""
    if group is None or group is GroupMember.WORLD:
        return 0
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"{fn}(): `group` must be a ProcessGroup from new_group() or None; "
                        f"got {type(group).__name__}")
    if group._handle < 0:
        warnings.warn(f"Running {fn} on global rank {get_rank()} which does not belong to the given group.",
                      stacklevel=3)
    return group._handle


def _seconds(timeout, fn):
    if timeout is None:
        return -1.0
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool):
        raise TypeError(f"{fn}(): `timeout` must be a datetime.timedelta or seconds; got {type(timeout).__name__}")
    if timeout <= 0:
        raise ValueError(f"{fn}(): `timeout` must be positive; got {timeout}")
    return float(timeout)


# ---------------------------------------------------------------------------------------------------
# Start-up and shut-down

def _launcher_size():
    """The job size the launcher announced in the environment, and who announced it."""
    for var, who in (("OMPI_COMM_WORLD_SIZE", "Open MPI's mpiexec"), ("PMI_SIZE", "a PMI launcher (hydra)"),
                     ("SLURM_NTASKS", "Slurm")):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 1:
            return int(value), var, who
    return 1, None, None


def _rank_prefix():
    try:
        return f"[rank{_C.get_rank(0)}]"
    except Exception:
        return f"[rank{os.environ.get('PMI_RANK', '?')}]"


def _excepthook(exc_type, exc, tb):
    """Print the traceback with a [rankN] prefix, then end the whole job with MPI_Abort.

    MPI_Finalize here would leave the other ranks blocked forever in their next collective.
    """
    prefix = _rank_prefix()
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    sys.stderr.write("".join(f"{prefix}: {line}\n" for line in text.rstrip("\n").split("\n")))
    sys.stderr.flush()
    if _C.is_initialized() and _C.get_world_size(0) > 1:
        sys.stderr.write(f"{prefix}: unhandled exception, aborting the job (MPI_Abort)\n")
        _abort(1)


def _abort(code):
    """MPI_Abort, after giving the launcher a moment to forward what this rank just printed (under
    load, hydra could otherwise kill the job before the traceback reaches the terminal)."""
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(0.2)
    _C.abort(code)


_atexit_registered = False


def init_process_group(backend="mpi", init_method=None, timeout=None, world_size=-1, rank=-1,
                       store=None, group_name="", pg_options=None, device_id=None):
    """Start MPI and create the default process group.

    Args:
        backend: ``"mpi"``. torch's ``"gloo"``/``"nccl"`` are accepted with a warning and run on MPI,
            so code written for torch.distributed runs unchanged.
        init_method, store: ignored: ``mpiexec`` does the rendezvous.
        timeout: ``datetime.timedelta`` or seconds; a blocking call that has not completed by then
            raises ``DistTimeoutError``. ``None`` (default): wait forever (Ctrl-C still works).
        world_size, rank: optional; if given they must match what MPI reports (``ValueError``).

    Run it with ``mpiexec -n 4 python script.py``; run as a plain ``python script.py`` it is a
    world of size 1. An unhandled exception on any rank then prints a ``[rankN]`` traceback and
    ends the whole job.

    Example::

        >>> import pydist as dist
        >>> dist.init_process_group(backend="mpi")
        >>> dist.get_rank(), dist.get_world_size()   # under mpiexec -n 2: (0, 2) and (1, 2)
    """
    global _world, _atexit_registered
    fn = "init_process_group"
    if backend is not None and str(backend).lower() != Backend.MPI:
        if str(backend).lower() not in (Backend.GLOO, Backend.NCCL):
            raise ValueError(f"{fn}(): `backend` must be 'mpi'; got {backend!r}")
        warnings.warn(f"{fn}(): pydist runs every backend on MPI; backend={backend!r} uses MPI", stacklevel=2)
    seconds = _seconds(timeout, fn)
    for name, value in (("world_size", world_size), ("rank", rank)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{fn}(): `{name}` must be an int; got {type(value).__name__}")
    if _C.is_initialized():
        raise ValueError(f"{fn}(): the default process group is already initialized; "
                         "call destroy_process_group() before initializing it again")
    my_rank, size, _level = _C.init(seconds)
    if not _atexit_registered:
        atexit.register(_C.finalize)
        _atexit_registered = True
    announced, var, who = _launcher_size()
    if size == 1 and announced > 1:
        _C.destroy()
        raise DistError(
            f"{fn}(): this process was started as one of {announced} ({var}={announced}, set by {who}), "
            f"but MPI sees a world of 1: pydist is built against MPICH and was launched by another MPI's "
            f"launcher. Launch it with MPICH's: mpiexec.mpich -n {announced} python ...")
    if world_size != -1 and world_size != size:
        _C.destroy()
        raise ValueError(f"{fn}(): `world_size` = {world_size} does not match MPI's world size {size} "
                         f"(set by mpiexec -n); leave it at -1")
    if rank != -1 and rank != my_rank:
        _C.destroy()
        raise ValueError(f"{fn}(): `rank` = {rank} does not match MPI's rank {my_rank} "
                         f"(set by mpiexec); leave it at -1")
    _world = ProcessGroup(0, range(size))
    GroupMember.WORLD = _world
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _excepthook


def destroy_process_group(group=None):
    """Free the default group (``group=None``) and every other group; MPI stays up for a later init."""
    global _world
    if group is not None and group is not _world:
        raise ValueError("destroy_process_group(): destroying a single sub-group is not supported yet; "
                         "call it with group=None")
    _C.destroy()
    _world = None
    GroupMember.WORLD = None


def is_initialized():
    """True between init_process_group() and destroy_process_group()."""
    return _C.is_initialized()


def is_available():
    return True


def is_mpi_available():
    return True


def is_gloo_available():
    return False


def is_nccl_available():
    return False


def get_backend(group=None):
    """The backend of `group`: always ``"mpi"``."""
    if not _C.is_initialized():
        raise ValueError("get_backend(): the default process group has not been initialized; "
                         "call pydist.init_process_group(backend=\"mpi\") first")
    if group is not None:
        _group_handle(group, "get_backend")
    return Backend(Backend.MPI)


def get_rank(group=None):
    """This process's rank in `group` (default: the world); -1 if it is not a member."""
    if group is None:
        return _C.get_rank(0)
    handle = _group_handle(group, "get_rank")
    return _C.get_rank(handle) if handle >= 0 else -1


def get_world_size(group=None):
    """The number of ranks in `group` (default: the world); -1 if this rank is not a member."""
    if group is None:
        return _C.get_world_size(0)
    handle = _group_handle(group, "get_world_size")
    return _C.get_world_size(handle) if handle >= 0 else -1


# ---------------------------------------------------------------------------------------------------
# Point-to-point

def send(tensor, dst, group=None, tag=0):
    """Send `tensor` to global rank `dst` and wait until its buffer may be reused.

    Example (``mpiexec -n 2``)::

        >>> x = np.array([1., -1.]) if dist.get_rank() == 0 else np.zeros(2)
        >>> if dist.get_rank() == 0: dist.send(x, dst=1)
        ... else: dist.recv(x, src=0)        # rank 1 now holds [1., -1.]
    """
    handle = 0 if group is None else _group_handle(group, "send")
    if handle < 0:
        return None
    return _C.send(tensor, dst, tag, handle)


def recv(tensor, src=None, group=None, tag=0):
    """Receive into `tensor` (in place) from global rank `src`, or from anyone if ``src=None``.

    Returns:
        The sender's global rank.
    """
    handle = 0 if group is None else _group_handle(group, "recv")
    if handle < 0:
        return -1
    return _C.recv(tensor, src, tag, handle)


def isend(tensor, dst, group=None, tag=0):
    """Start sending `tensor` to `dst`; returns a Work. The array is kept alive until it completes."""
    handle = 0 if group is None else _group_handle(group, "isend")
    if handle < 0:
        return None
    return _C.isend(tensor, dst, tag, handle)


def irecv(tensor, src=None, group=None, tag=0):
    """Start receiving into `tensor` from `src` (anyone if None); returns a Work.

    ``work.wait()`` completes it; ``work.source_rank()`` then names the sender.
    """
    handle = 0 if group is None else _group_handle(group, "irecv")
    if handle < 0:
        return None
    return _C.irecv(tensor, src, tag, handle)


# ---------------------------------------------------------------------------------------------------
# Collectives

def barrier(group=None, async_op=False, device_ids=None):
    """Block until every rank of `group` has called barrier()."""
    handle = 0 if group is None else _group_handle(group, "barrier")
    if handle < 0:
        return None
    return _C.barrier(handle, async_op)


def broadcast(tensor, src, group=None, async_op=False):
    """Copy `tensor` from global rank `src` into `tensor` on every other rank of `group` (in place).

    Returns:
        None, or a Work when ``async_op=True``.
    """
    handle = 0 if group is None else _group_handle(group, "broadcast")
    if handle < 0:
        return None
    return _C.broadcast(tensor, src, handle, async_op)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce `tensor` across every rank of `group` with `op`; every rank gets the result in place.

    Example (``mpiexec -n 3``, ranks holding 1, 2 and -3)::

        >>> t = np.array([[1.], [2.], [-3.]][dist.get_rank()])
        >>> dist.all_reduce(t, op=dist.ReduceOp.SUM)
        >>> t                                       # on every rank
        array([0.])

    Returns:
        None, or a Work when ``async_op=True``.
    """
    if group is None:
        return _C.all_reduce(tensor, op, 0, async_op)
    handle = _group_handle(group, "all_reduce")
    if handle < 0:
        return None
    return _C.all_reduce(tensor, op, handle, async_op)


if os.environ.get("PYDIST_WAIT", "").lower() == "mpi":
    _C.set_wait_mode(_C.WAIT_MPI)
