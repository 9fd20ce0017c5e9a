"""torch.distributed's API on NumPy arrays, over MPI.

This is the Python front of pydist (the counterpart of torch's ``distributed_c10d.py``): keywords,
defaults, groups, warnings and docstrings. Everything that touches memory or MPI is in the C module
``pydist._C``, which also re-checks every argument it uses. The common case (default group, blocking
call) is one Python frame and one C call.
"""
import atexit
import contextlib
import datetime
import enum
import operator
import os
import signal
import stat
import sys
import time
import traceback
import warnings
import weakref

import numpy  # noqa: F401  (before _C, so that NumPy's own BLAS starts with the user's settings)

from . import _env
from . import _libraries
from . import _path_table


def _load_C():
    """Import _C with its OpenBLAS (the engine's) starting one thread. A pthreads OpenBLAS starts its
    pool when it is loaded, and the idle threads spin for a while: on 2 cores that left MPI_Init and
    init_process_group at 2 ranks 110 ms instead of 30 (benchmarks/startup.py). The engine runs one BLAS
    thread per rank anyway (Trainer's blas_threads, which may raise it). A user's own setting wins.
    Libraries the build took from PyPI packages are loaded just before it (_libraries.py), under the
    same setting: PyPI's OpenBLAS starts its pool when that load runs. The engine's OpenBLAS is also
    told which kernels this CPU runs (_libraries.blas_coretype): one older than the CPU would take
    its generic ones, five times slower."""
    def load():
        abi = _libraries.load()
        try:
            return _libraries.import_build(abi)   # pydist._C, the build for the library's ABI
        except ImportError as e:   # "undefined symbol: MPI_...": an MPI older than the calls pydist makes
            if "undefined symbol: " not in str(e) or _libraries.LIBMPI is None:
                raise
            symbol = str(e).split("undefined symbol: ", 1)[1].split()[0]
            path, why, version = _libraries.LIBMPI[:3]
            raise ImportError(f"pydist: the MPI library {path} ({version}; {why}) lacks {symbol}, which "
                              f"pydist calls: it needs MPICH 4 or later, Intel MPI 2021 or later, Open MPI "
                              f"4.1 or later, or the MPI-5 standard ABI; point PYDIST_LIBMPI at one") from None

    setting = {"OPENBLAS_NUM_THREADS": "1", "OPENBLAS_CORETYPE": _libraries.blas_coretype()}
    setting = {k: v for k, v in setting.items() if v is not None and k not in os.environ}
    os.environ.update(setting)
    try:
        return load()
    finally:
        for k in setting:
            del os.environ[k]


_C = _load_C()

# What the modules above this one do as the world group starts and ends (pydist/__init__.py fills them:
# the timeline's recording, which itself calls down into this module, so it is reached from above).
_at_init = []
_at_destroy = []

__all__ = [
    "ReduceOp", "reduce_op", "Backend", "GroupMember", "ProcessGroup", "Work",
    "DistError", "DistBackendError", "DistTimeoutError",
    "init_process_group", "destroy_process_group", "is_initialized", "is_available",
    "is_mpi_available", "is_gloo_available", "is_nccl_available", "get_backend", "get_rank",
    "get_world_size", "barrier", "send", "recv", "isend", "irecv", "broadcast", "all_reduce",
    "reduce", "all_gather", "all_gather_into_tensor", "gather", "scatter", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "new_group", "get_global_rank",
    "get_group_rank", "get_process_group_ranks", "P2POp", "batch_isend_irecv", "monitored_barrier",
    "broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list", "empty", "zeros",
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
    """A group of ranks with its own MPI communicator. ``GroupMember.WORLD`` is the default group.

    Made by :func:`new_group` (and by init_process_group for the default group), not directly.
    ``ranks`` holds the group's global ranks in group rank order."""

    def __init__(self, handle, ranks):
        self._handle = handle   # slot in _C's communicator table; -1 on ranks outside the group
        self.ranks = list(ranks)

    def size(self):
        """The number of ranks in the group."""
        return len(self.ranks)

    def rank(self):
        """This process's rank in the group; -1 if it is not a member."""
        return self.ranks.index(get_rank()) if self._handle >= 0 else -1

    def __repr__(self):
        return f"<pydist.ProcessGroup ranks={self.ranks}>"


class GroupMember:
    """As ``torch.distributed.GroupMember``: ``WORLD`` is the default group (a :class:`ProcessGroup`,
    None before init_process_group), ``NON_GROUP_MEMBER`` the marker torch uses for a rank outside a
    group."""
    WORLD = None             # set by init_process_group
    NON_GROUP_MEMBER = -100


_world = None   # the default ProcessGroup
_default_timeout = -1.0   # seconds, from init_process_group; < 0: none
_subgroups = weakref.WeakSet()   # live groups from new_group, invalidated by destroy_process_group()


_DESTROYED = -2


def _group_handle(group, fn):
    """The _C handle for `group`, or -1 (with torch's warning) when this rank is not a member."""
    if group is None or group is GroupMember.WORLD:
        return 0
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"{fn}(): `group` must be a ProcessGroup from new_group() or None; "
                        f"got {type(group).__name__}")
    if group._handle == _DESTROYED:
        raise ValueError(f"{fn}(): `group` has been destroyed")
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
    if not timeout > 0:   # NaN too
        raise ValueError(f"{fn}(): `timeout` must be positive; got {timeout}")
    return float(timeout)


# ---------------------------------------------------------------------------------------------------
# Start-up and shut-down

def _launcher_size():
    """The job size the launcher announced in the environment, and who announced it. The first that
    is set decides, 1 included: `mpiexec -n 1` inside a Slurm allocation of 2 tasks is alone by choice
    (PMI_SIZE=1). Slurm's size is the srun step's (SLURM_STEP_NUM_TASKS), not the job's
    (SLURM_NTASKS, which a batch script and everything it runs see too)."""
    for var, who in (("OMPI_COMM_WORLD_SIZE", "Open MPI's mpiexec"), ("PMI_SIZE", "a PMI launcher (hydra, srun --mpi=pmi2)"),
                     ("SLURM_STEP_NUM_TASKS", "Slurm's srun")):
        value = os.environ.get(var, "")
        if value.isascii() and value.isdigit():   # (isdigit alone takes "²", which int refuses)
            return int(value), var, who
    return 1, None, None


_SLURM_FIX = ("run it as `srun --mpi=pmi2 ...`, or `export SLURM_MPI_TYPE=pmi2` before srun (a site can make "
              "it the default: MpiDefault=pmi2 in slurm.conf)")


def _srun_without_pmi(fn):
    """Why MPI_Init would leave this srun task alone, or None. MPICH finds the other tasks only through
    a PMI connection, which srun gives only when asked (--mpi=pmi2): under Slurm's default (--mpi=none)
    each task is a world of 1 and trains alone; under --mpi=pmix an MPICH built without PMIx does the
    same (MPICH 4) or aborts (MPICH 5). Said before MPI_Init, on every task, since MPI cannot say it."""
    tasks, var, _ = _launcher_size()
    if var != "SLURM_STEP_NUM_TASKS" or tasks <= 1 or "PMI_FD" in os.environ or "PMI_PORT" in os.environ:
        return None
    pmix = "PMIX_RANK" in os.environ
    if pmix and _libraries.speaks_pmix():
        return None
    task = os.environ.get("SLURM_PROCID", "?")
    return (f"{fn}(): this is task {task} of the {tasks} that srun started (SLURM_STEP_NUM_TASKS={tasks}), but srun "
            f"gave it no PMI connection that MPICH can use (srun --mpi={'pmix' if pmix else 'none'}), so MPICH "
            f"would run each task alone as rank 0 of 1, or abort. {_SLURM_FIX[0].upper()}{_SLURM_FIX[1:]}")


# A process made from a rank never uses the rank's MPI (DESIGN.md, "Semantics every path keeps"). A
# forked one holds a copy of it, which csrc/groups/child.c marks and refuses. A fresh interpreter (spawn,
# forkserver, subprocess) holds only the rank's environment, and with it the launcher's variables:
# MPI_Init there would join the job as the rank (with the connection still open: close_fds=False),
# or talk PMI to a closed descriptor, or to whatever file now has its number. So the process the
# launcher started records its connection in PYDIST_MPI_OWNER at import, and init refuses in a
# process that holds the same connection but is not that process. A nested mpiexec gives its ranks
# a connection of their own, and a plain singleton (no launcher variables) has nothing to protect.
_OWNER = "PYDIST_MPI_OWNER"   # "pid rank connection" of the process the launcher started


def _launcher_connection():
    """The launcher connection this process's MPI_Init would use: "fd6:<device>:<inode>" (hydra's
    PMI_FD; "fd6:none" when that descriptor is no socket here), "port<host:port>" (PMI_PORT), or ""."""
    fd = os.environ.get("PMI_FD")
    if fd is not None:
        try:
            st = os.fstat(int(fd))
            if stat.S_ISSOCK(st.st_mode):
                return f"fd{fd}:{st.st_dev}:{st.st_ino}"
        except (OSError, ValueError):
            pass
        return f"fd{fd}:none"
    port = os.environ.get("PMI_PORT")
    return f"port{port}" if port else ""


def _claim_launcher():
    """At import, in the process the launcher started: record its connection for its children."""
    connection = _launcher_connection()
    if not connection or connection.endswith(":none"):
        return
    owner = os.environ.get(_OWNER, "").split(" ")
    if len(owner) == 3 and owner[2] == connection:
        return   # inherited with its descriptor still open (close_fds=False): a child's, not ours
    os.environ[_OWNER] = f"{os.getpid()} {os.environ.get('PMI_RANK', '?')} {connection}"


def _child_reason(fn):
    """Why this process may not use MPI (it was made from a rank), or None."""
    rank = _C.parent_rank()
    if rank is not None:
        return (f"{fn}(): this is a child process (pid {os.getpid()}) of rank {rank}, made by fork: MPI "
                f"belongs to the parent, and a child cannot use it (communicate through the parent, or "
                f"start the work as an MPI job of its own)")
    if _C.is_initialized():
        return None
    connection = _launcher_connection()
    owner = os.environ.get(_OWNER, "").split(" ")
    ours = len(owner) == 3 and owner[0] == str(os.getpid())
    if connection.endswith(":none") or (len(owner) == 3 and not ours and owner[2] == connection):
        rank, pid = (owner[1], owner[0]) if len(owner) == 3 else (os.environ.get("PMI_RANK", "?"), "?")
        return (f"{fn}(): this is a child process (pid {os.getpid()}) of rank {rank} (pid {pid}), started "
                f"with its launcher's variables: MPI belongs to the parent, and MPI_Init here would join "
                f"the job as that rank (PMI_FD/PMI_PORT name the parent's connection); start the work "
                f"as an MPI job of its own")
    return None


_claim_launcher()


def _launcher_rank():
    """This process's rank as its launcher set it (hydra and srun: PMI_RANK; Open MPI's mpiexec:
    OMPI_COMM_WORLD_RANK; a PMIx server: PMIX_RANK), or "?"."""
    return next((os.environ[v] for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK") if v in os.environ), "?")


def _rank_prefix():
    try:
        return f"[rank{_C.get_rank(0)}]"
    except Exception:
        return f"[rank{_launcher_rank()}]"


# Echoes come within milliseconds; a program's own next interrupt (a test's interrupt_main, a person's
# second Ctrl-C) comes later and must still raise
SIGINT_ECHO_S = 0.2
_last_sigint = float("-inf")


def _keyboard_interrupt(signum, frame):
    """Python's own Ctrl-C (KeyboardInterrupt) less its echoes: under mpiexec one Ctrl-C comes to a rank
    up to three times within milliseconds (the terminal's, mpiexec's, a launcher's), and an echo landing
    between the first one's unwinding and the excepthook cut its report and abort short."""
    global _last_sigint
    now = time.monotonic()
    if now - _last_sigint < SIGINT_ECHO_S:
        return
    _last_sigint = now
    raise KeyboardInterrupt


def _excepthook(exc_type, exc, tb):
    """Print the traceback with a [rankN] prefix, then end the whole job with MPI_Abort.

    MPI_Finalize here would leave the other ranks blocked forever in their next collective.
    """
    prefix = _rank_prefix()
    # A child made from a rank prints its traceback and exits alone: the job is not its to end.
    aborting = _C.is_initialized() and _C.get_world_size(0) > 1 and _C.parent_rank() is None
    if aborting:
        # Ctrl-C comes to a rank more than once (the terminal's, mpiexec's, a watcher's): the next must not
        # cut this report and the abort after it short
        with contextlib.suppress(ValueError):   # (not the main thread)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    if issubclass(exc_type, KeyboardInterrupt) and tb is not None:
        # Ctrl-C reaches every rank at once: one line each, saying where it was, not R tracebacks
        frames = traceback.extract_tb(tb)
        last = ([f for f in frames if f.name != _keyboard_interrupt.__name__] or frames)[-1]   # not the handler
        text = f"KeyboardInterrupt in {last.name} ({os.path.basename(last.filename)}:{last.lineno})"
    else:
        text = "".join(traceback.format_exception(exc_type, exc, tb))
    text = "".join(f"{prefix}: {line}\n" for line in text.rstrip("\n").split("\n"))
    streams = [sys.stderr]
    if aborting and sys.__stderr__ is not None and sys.stderr is not sys.__stderr__:
        # A hook that called us captures sys.stderr to print it once we return (torch.distributed's
        # does, to prefix it), and MPI_Abort never returns: say it on the real stderr too.
        streams.append(sys.__stderr__)
    for stream in streams:
        stream.write(text)
        if aborting:
            interrupted = issubclass(exc_type, KeyboardInterrupt)
            stream.write(f"{prefix}: {'interrupted' if interrupted else 'unhandled exception'}, "
                         f"{_ending_words(interrupted)}\n")
        stream.flush()
    if aborting:
        _abort(1, f"{exc_type.__name__}: {exc}")


def _surviving():
    """Under python -m pydist.run --survive a failing rank ends alone (_abort), not the job."""
    return bool(os.environ.get("PYDIST_RUN_ATTEMPT_DIR")) and os.environ.get("PYDIST_SURVIVE") == "1"


def _ending_words(interrupted=False):
    """What this rank's end does to the job, for its last line."""
    if not _surviving():
        return "aborting the job (MPI_Abort)"
    # Ctrl-C ends the whole job anyway; anything else under --survive ends this rank alone
    return "ending this rank" if interrupted else \
        "ending this rank alone (pydist.run --survive: the job goes on without it where it can)"


def _abort(code, why=""):
    """MPI_Abort, after giving the launcher a moment to forward what this rank just printed (under
    load, hydra could otherwise kill the job before the traceback reaches the terminal). Under
    python -m pydist.run, the rank first records why (mpiexec kills its watcher before it could)."""
    if os.environ.get("PYDIST_RUN_ATTEMPT_DIR"):
        from . import run
        run.record_end(code, why)
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(0.2)
    if _surviving():
        # python -m pydist.run --survive: MPI_Abort would end every rank. The record just written tells
        # the others: the asynchronous strategies carry on without a worker, the rest end in turn.
        os._exit(code)
    _C.abort(code)   # returns only where MPI has not started (or a forked child's)


# How long a rank that failed before MPI started waits for the others in MPI's start-up, to abort them.
_START_TO_ABORT_S = 30.0
# Under pydist.run: how much longer than init's timeout a rank waits in MPI's start-up (the launcher's turn).
_LAUNCHER_FIRST_S = 15.0


def _abort_before_start(code):
    """python -m pydist, a rank that failed before MPI started in a job of several: the others wait for
    it in MPI's start-up, which has no deadline, so it joins them there and aborts the job (at most
    _START_TO_ABORT_S; then it exits, which ends the job too)."""
    size, _, _ = _launcher_size()
    if size > 1 and _C.parent_rank() is None and not os.environ.get("PYDIST_RUN_ATTEMPT_DIR"):
        sys.stderr.write(f"{_rank_prefix()}: failed before MPI started; ending the job from MPI's start-up\n")
        sys.stderr.flush()
        _C.start_and_abort(code, _START_TO_ABORT_S)


_atexit_registered = False


def _tell_the_launcher_init_began(seconds):
    """Under python -m pydist.run: mark rank-R.init in the attempt's folder, with the timeout, before MPI
    starts. MPI_Init waits for every rank with no deadline of its own; from the marks the launcher sees a
    rank that never arrives and ends the job once `seconds` (or 30 minutes) have passed."""
    folder, rank = os.environ.get("PYDIST_RUN_ATTEMPT_DIR"), _launcher_rank()
    if not folder or not rank.isascii() or not rank.isdigit():
        return
    try:   # O_EXCL | O_NOFOLLOW: a fresh file, never a link planted at the name
        fd = os.open(os.path.join(folder, f"rank-{int(rank)}.init"),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("none" if seconds is None or seconds < 0 else repr(float(seconds)))
    except OSError:
        pass   # no mark: the launcher only loses this deadline


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

    Child processes (``os.fork``, ``multiprocessing`` with any start method, ``subprocess``) never
    finalize or abort the parent's MPI, whatever way they exit; every call they make into pydist
    (this one included, and any collective, send or receive) raises ``DistError`` saying MPI belongs
    to the parent rank. A child that needs to communicate does it through its parent.

    Example (``mpiexec -n 2``)::

        >>> import pydist as dist
        >>> if not dist.is_initialized():             # once per process
        ...     dist.init_process_group(backend="mpi")
        >>> dist.get_rank(), dist.get_world_size()     # (0, 2) on rank 0, (1, 2) on rank 1
        (..., 2)
        >>> dist.init_process_group(backend="mpi")     # a second time
        Traceback (most recent call last):
            ...
        ValueError: init_process_group(): the default process group is already initialized;
        call destroy_process_group() before initializing it again
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
    reason = _child_reason(fn)
    if reason is not None:
        raise DistError(reason)
    reason = None if _C.is_initialized() else (_srun_without_pmi(fn) or _libraries.pairing_problem(fn))
    if reason is not None:
        raise DistError(reason)
    if _C.is_initialized():
        raise ValueError(f"{fn}(): the default process group is already initialized; "
                         "call destroy_process_group() before initializing it again")
    if not _atexit_registered:   # before init: MPI may have started even if init then fails
        atexit.register(_C.finalize)
        _atexit_registered = True
    table, problem = _path_table.rows_for_init()   # init gives every rank world rank 0's table
    if problem is None:
        _C.set_path_table(table)
    else:
        _C.path_table_unusable(problem)   # raised by init on every rank if this is world rank 0
    _tell_the_launcher_init_began(seconds)
    # MPI's start-up within the same timeout; under pydist.run a little later, so that its launcher,
    # which sees every rank's start (and names the ranks that never began), ends the attempt first
    startup = seconds + _LAUNCHER_FIRST_S if seconds > 0 and os.environ.get("PYDIST_RUN_DIR") else seconds
    my_rank, size, _level = _C.init(seconds, startup)
    announced, var, who = _launcher_size()
    if size == 1 and announced > 1:
        _C.destroy()
        fix = (_SLURM_FIX if var == "SLURM_STEP_NUM_TASKS" else
               f"launch it with the launcher of the MPI library it runs on ({_libraries.LIBMPI[0]}): "
               f"{_libraries.mpiexec()} -n {announced} python ..., or point PYDIST_LIBMPI at the launcher's library")
        raise DistError(
            f"{fn}(): this process was started as one of {announced} ({var}={announced}, set by {who}), "
            f"but MPI sees a world of 1: its MPI library and its launcher do not speak to each other; {fix}")
    if world_size != -1 and world_size != size:
        _C.destroy()
        raise ValueError(f"{fn}(): `world_size` = {world_size} does not match MPI's world size {size} "
                         f"(set by mpiexec -n); leave it at -1")
    if rank != -1 and rank != my_rank:
        _C.destroy()
        raise ValueError(f"{fn}(): `rank` = {rank} does not match MPI's rank {my_rank} "
                         f"(set by mpiexec); leave it at -1")
    global _default_timeout
    _default_timeout = seconds
    _world = ProcessGroup(0, range(size))
    GroupMember.WORLD = _world
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _excepthook
    if size > 1 and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        with contextlib.suppress(ValueError):   # (not the main thread: Python's own stays)
            signal.signal(signal.SIGINT, _keyboard_interrupt)
    for hook in _at_init:   # pydist/__init__.py's: PYDIST_TIMELINE=run.json starts the job's timeline
        hook()


def _set_default_timeout(seconds):
    """The session's timeout for every later call (the torch backend applies torch's with it)."""
    global _default_timeout
    _C.set_timeout(seconds)
    _default_timeout = seconds


def destroy_process_group(group=None):
    """Free `group`'s communicator; with ``group=None`` free every group and the default one (MPI stays
    up, so init_process_group may be called again)."""
    global _world
    if group is not None and group is not _world:
        if not isinstance(group, ProcessGroup):
            raise TypeError(f"destroy_process_group(): `group` must be a ProcessGroup or None; "
                            f"got {type(group).__name__}")
        if group._handle > 0:
            _C.destroy_group(group._handle)
        group._handle = _DESTROYED
        return
    for hook in _at_destroy:   # PYDIST_TIMELINE: the job's timeline ends with its group
        hook()
    _C.destroy()
    for g in _subgroups:   # their communicator slots may be reused by later groups
        g._handle = _DESTROYED
    _subgroups.clear()
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

    `dst` is a global rank even when `group` is given; sending to oneself is a ``ValueError``.
    Blocking: it returns once `tensor` may be written again, which for a small message may be before
    the receiver has received it.

    Example (``mpiexec -n 2``)::

        >>> x = np.array([1., -1.]) if dist.get_rank() == 0 else np.zeros(2)
        >>> if dist.get_rank() == 0:
        ...     dist.send(x, dst=1)
        ... else:
        ...     sender = dist.recv(x, src=0)     # returns the sender's rank, 0
        >>> x                                     # on both ranks now
        array([ 1., -1.])
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
    """Start sending `tensor` to `dst`; returns a Work. The array is kept alive until it completes.

    Example (``mpiexec -n 2``, each rank sending its rank to the other)::

        >>> peer = 1 - dist.get_rank()
        >>> mine, theirs = np.full(2, float(dist.get_rank())), np.zeros(2)
        >>> works = [dist.isend(mine, dst=peer), dist.irecv(theirs, src=peer)]
        >>> all(w.wait() for w in works)
        True
        >>> bool((theirs == peer).all())
        True
    """
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

    A small broadcast's root (up to 64 KiB on a group within one machine) returns without waiting for
    the other ranks, as ``MPI_Bcast``'s may; if their calls did not match, they raise ``ValueError`` at
    once and the root at a later call on the group, naming this broadcast (docs/semantics.md).

    Returns:
        None, or a Work when ``async_op=True`` (which never waits for another rank).

    Example (``mpiexec -n 2``)::

        >>> t = np.arange(3.) if dist.get_rank() == 0 else np.zeros(3)
        >>> dist.broadcast(t, src=0)
        >>> t                                # on both ranks
        array([0., 1., 2.])
    """
    handle = 0 if group is None else _group_handle(group, "broadcast")
    if handle < 0:
        return None
    return _C.broadcast(tensor, src, handle, async_op)


_ALGORITHMS = {"mpi": 0, "ring": 1, "shm": 2}   # all_reduce's `algorithm` -> _C's code (None: 3, automatic)


def _algorithm_code(algorithm):
    if not isinstance(algorithm, str):
        raise TypeError(f"all_reduce(): `algorithm` must be None, \"mpi\", \"ring\" or \"shm\"; "
                        f"got {type(algorithm).__name__}")
    code = _ALGORITHMS.get(algorithm)
    if code is None:
        raise ValueError(f"all_reduce(): `algorithm` must be None, \"mpi\", \"ring\" or \"shm\"; got {algorithm!r}")
    return code


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False, *, algorithm=None):
    """Reduce `tensor` across every rank of `group` with `op`; every rank gets the result in place.

    Example (``mpiexec -n 3``, ranks holding 1, 2 and -3)::

        >>> t = np.array([[1.], [2.], [-3.]][dist.get_rank()])
        >>> dist.all_reduce(t, op=dist.ReduceOp.SUM)
        >>> t                                       # on every rank
        array([0.])

    Args:
        algorithm: which implementation reduces (every member must pass the same one):

            - ``None`` (automatic): on a group whose ranks share one node, up to 64 KiB
              (``PYDIST_SHM_SMALL_BYTES``) pydist's small collectives in shared memory (as every
              collective there), and pydist's shared-memory all-reduce, in place, when every rank
              passes an array from :func:`empty`/:func:`zeros` of more than ``_C.SHM_AUTO_BYTES``
              (64 KiB) or any array of at least ``_C.SHM_AUTO_COPY_BYTES`` (32 MiB), and no rank calls
              it with ``async_op=True``; else, at 2 ranks that all block, pydist's ring (below: MPICH
              reduces with pydist's float ops, whose NaN is canonical, by recursive doubling, each rank
              reducing the whole buffer, where the ring reduces half on each), and MPI's otherwise
              (between 64 KiB and 32 MiB MPICH's all-reduce is about as fast as copying through
              shared memory).
            - ``"mpi"``: MPI's own all-reduce (MPICH picks its algorithm by size).
            - ``"shm"``: pydist's shared-memory all-reduce (each rank reduces 1/R of the elements of
              every rank's contribution in a segment the node's ranks share); arrays from
              :func:`empty` / :func:`zeros` on every rank are reduced in place with no copy at all. On
              a group spanning nodes it falls back to MPI's. With ``async_op=True`` on any rank the
              data goes through MPI's nonblocking all-reduce instead (the shm all-reduce needs every
              rank inside it at once, and an async call never waits). Every member must pass the same
              count, dtype and op (a mismatch is a ``ValueError`` on every rank).
            - ``"ring"``: pydist's ring (scatter-reduce, then all-gather around the ring of the
              group's ranks, 2(R-1) steps each moving about n/R elements to the next rank), which
              sends the least data per rank of any all-reduce (2(R-1)/R of the buffer) but pays R-1
              latencies twice: use it for large buffers (see benchmarks/collectives_sweep.py for where
              it overtakes MPI on a given machine), or to get exactly the same result as the training
              engine's ring. Every rank ends with bitwise the same array. With ``async_op=True`` the
              steps advance whenever this rank waits in pydist (any ``wait()``, ``is_completed()`` or
              blocking call).

    MIN and MAX on floats give every rank the same bits on every path: any NaN gives NaN (as
    ``np.minimum``/``np.maximum``; the canonical quiet NaN when ranks combine), ``MIN(-0.0, +0.0)``
    is ``-0.0`` and ``MAX`` is ``+0.0``, whatever the order.

    Returns:
        None, or a Work when ``async_op=True``; such a call never waits for another rank.
    """
    if algorithm is None:
        if group is None:
            return _C.all_reduce(tensor, op, 0, async_op)
        handle = _group_handle(group, "all_reduce")
        if handle < 0:
            return None
        return _C.all_reduce(tensor, op, handle, async_op)
    code = _algorithm_code(algorithm)
    handle = 0 if group is None else _group_handle(group, "all_reduce")
    if handle < 0:
        return None
    return _C.all_reduce(tensor, op, handle, async_op, code)


def _factory(fn, shape, dtype, group, zero):
    if _C.parent_rank() is not None:   # the segment is the parent's, and its allocator too
        raise DistError(_child_reason(fn))
    if group is not None:
        if _group_handle(group, fn) < 0:
            raise ValueError(f"{fn}(): this rank is not a member of `group`")
    elif not _C.is_initialized():
        raise ValueError(f"{fn}(): the default process group has not been initialized; "
                         "call pydist.init_process_group(backend=\"mpi\") first")
    if isinstance(shape, bool) or not isinstance(shape, (int, tuple, list)) and not hasattr(shape, "__index__"):
        raise TypeError(f"{fn}(): `shape` must be an int or a tuple of ints; got {type(shape).__name__}")
    dims = (shape,) if not isinstance(shape, (tuple, list)) else tuple(shape)
    for i, d in enumerate(dims):
        if isinstance(d, bool) or not hasattr(d, "__index__"):
            raise TypeError(f"{fn}(): `shape` must hold ints; got {type(d).__name__} at index {i}")
        if operator.index(d) < 0:
            raise ValueError(f"{fn}(): `shape` must hold non-negative sizes; got {d} at index {i}")
    return _C.shm_empty(tuple(operator.index(d) for d in dims), dtype, zero)


def empty(shape, dtype="float32", group=None):
    """A NumPy array (uninitialised) in this rank's part of pydist's shared-memory segment.

    ``all_reduce`` (``algorithm="shm"`` or automatic) of such arrays on every rank of a group whose
    ranks share a node reduces them in place: each rank sums its slice straight out of every rank's
    array and writes the result into all of them, with no copy in or out. They work with every other
    call as ordinary arrays. The memory stays valid for as long as the array lives, even after
    ``destroy_process_group()`` (a later session treats it as an ordinary array). Without a segment
    (``PYDIST_SHM_BYTES=0``, or one that could not be made) it is an ordinary array. ``group`` is
    checked (this rank must be a member); the memory is this rank's whatever the group.

    Example (``mpiexec -n 2``)::

        >>> g = dist.zeros(1 << 20)            # float32, in the segment
        >>> g += dist.get_rank() + 1
        >>> dist.all_reduce(g)                  # no copies
        >>> float(g.min()), float(g.max())      # 1 + 2 on both ranks
        (3.0, 3.0)
    """
    return _factory("empty", shape, dtype, group, False)


def zeros(shape, dtype="float32", group=None):
    """As :func:`empty`, filled with zeros."""
    return _factory("zeros", shape, dtype, group, True)


def reduce(tensor, dst, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce `tensor` across `group` into `tensor` on global rank `dst` (in place there).

    The other ranks' arrays are only read. Returns None, or a Work when ``async_op=True``.
    """
    handle = 0 if group is None else _group_handle(group, "reduce")
    if handle < 0:
        return None
    return _C.reduce(tensor, dst, op, handle, async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """Gather every rank's `input_tensor` into `output_tensor`, concatenated in group rank order.

    ``output_tensor.size == input_tensor.size * group size``; `input_tensor` may be this rank's own
    slice of `output_tensor`.
    """
    handle = 0 if group is None else _group_handle(group, "all_gather_into_tensor")
    if handle < 0:
        return None
    return _C.all_gather_into_tensor(output_tensor, input_tensor, handle, async_op)


_all_gather_base = all_gather_into_tensor   # torch's old name


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """``tensor_list[i]`` receives group rank i's `tensor`, on every rank (no copies).

    Example (``mpiexec -n 2``)::

        >>> out = [np.zeros(2), np.zeros(2)]
        >>> dist.all_gather(out, np.full(2, float(dist.get_rank())))
        >>> out                          # on both ranks
        [array([0., 0.]), array([1., 1.])]
    """
    handle = 0 if group is None else _group_handle(group, "all_gather")
    if handle < 0:
        return None
    return _C.all_gather(tensor_list, tensor, handle, async_op)


def gather(tensor, gather_list=None, dst=0, group=None, async_op=False):
    """On global rank `dst`, ``gather_list[i]`` receives group rank i's `tensor`.

    `gather_list` is required on `dst` and must be None elsewhere (``ValueError``).
    """
    handle = 0 if group is None else _group_handle(group, "gather")
    if handle < 0:
        return None
    return _C.gather(tensor, gather_list, dst, handle, async_op)


def scatter(tensor, scatter_list=None, src=0, group=None, async_op=False):
    """Group rank i receives ``scatter_list[i]`` of global rank `src` into `tensor`.

    `scatter_list` is required on `src` and must be None elsewhere (``ValueError``).
    """
    handle = 0 if group is None else _group_handle(group, "scatter")
    if handle < 0:
        return None
    return _C.scatter(tensor, scatter_list, src, handle, async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False):
    """Group rank i receives in `output` the reduction of every rank's ``input_list[i]``.

    MPI reduces one contiguous buffer, so `input_list` is copied into one first; use
    reduce_scatter_tensor to avoid that copy.
    """
    handle = 0 if group is None else _group_handle(group, "reduce_scatter")
    if handle < 0:
        return None
    return _C.reduce_scatter(output, input_list, op, handle, async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    """`input` holds group-size blocks of `output`'s size; group rank i receives the reduction of
    every rank's block i.

    Example (``mpiexec -n 2``)::

        >>> inp = np.arange(4.) * (dist.get_rank() + 1)   # rank 0: [0, 1, 2, 3], rank 1: [0, 2, 4, 6]
        >>> out = np.zeros(2)
        >>> dist.reduce_scatter_tensor(out, inp)
        >>> out.tolist() == [[0., 3.], [6., 9.]][dist.get_rank()]
        True
    """
    handle = 0 if group is None else _group_handle(group, "reduce_scatter_tensor")
    if handle < 0:
        return None
    return _C.reduce_scatter_tensor(output, input, op, handle, async_op)


_reduce_scatter_base = reduce_scatter_tensor   # torch's old name


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op=False):
    """Rank i's block j of `input` becomes rank j's block i of `output`; blocks are rows along
    dimension 0, equal unless split sizes (one int per rank) are given.

    The ranks of one call must all give split sizes, or all give none: without them a small message
    runs as a cached persistent request, which MPI does not match with another rank's nonblocking call.
    """
    handle = 0 if group is None else _group_handle(group, "all_to_all_single")
    if handle < 0:
        return None
    return _C.all_to_all_single(output, input, output_split_sizes, input_split_sizes, handle, async_op)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    """Rank i's ``input_tensor_list[j]`` becomes rank j's ``output_tensor_list[i]``."""
    handle = 0 if group is None else _group_handle(group, "all_to_all")
    if handle < 0:
        return None
    return _C.all_to_all(output_tensor_list, input_tensor_list, handle, async_op)


# ---------------------------------------------------------------------------------------------------
# Groups

def new_group(ranks=None, timeout=None, backend=None, pg_options=None, use_local_synchronization=False,
              group_desc=None, device_id=None):
    """A process group of the given global ranks (default: all). Every rank must call it, as in torch.

    On a rank that is not in `ranks`, the returned group is a placeholder: calls with it warn and
    return None, and ``get_rank(group)`` is -1. Group ranks follow global rank order. `timeout` (seconds
    or a timedelta) bounds every wait on the group instead of init_process_group's timeout.
    """
    fn = "new_group"
    world = get_world_size()
    if ranks is None:
        ranks = list(range(world))
    try:
        ranks = sorted(operator.index(r) for r in ranks)   # not int(): 0.7 is no rank
    except (TypeError, ValueError):
        raise TypeError(f"{fn}(): `ranks` must be a list of ints; got {ranks!r}") from None
    if len(set(ranks)) != len(ranks) or any(r < 0 or r >= world for r in ranks):
        raise ValueError(f"{fn}(): `ranks` must be distinct ranks in [0, {world}); got {ranks}")
    seconds = _seconds(timeout, fn)   # -1.0 for None: the session's
    group = ProcessGroup(_C.new_group(ranks), ranks)
    if group._handle > 0 and seconds > 0:
        _C.set_group_timeout(group._handle, seconds)
    _subgroups.add(group)
    return group


def _survivors_group(ranks):
    """A group of global `ranks` made by those ranks alone, the others having died (Trainer under
    PYDIST_SURVIVE). Collective over `ranks`."""
    ranks = sorted(ranks)
    group = ProcessGroup(_C.new_group(ranks, True), ranks)
    _subgroups.add(group)
    return group


def get_process_group_ranks(group, _fn="get_process_group_ranks"):
    """The global ranks of `group`, in group rank order."""
    if group is None or group is GroupMember.WORLD:
        return list(range(get_world_size()))
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"{_fn}(): `group` must be a ProcessGroup from new_group() or None; "
                        f"got {type(group).__name__}")
    return list(group.ranks)


def get_global_rank(group, group_rank):
    """The global rank of `group`'s rank `group_rank`."""
    ranks = get_process_group_ranks(group, "get_global_rank")
    if not 0 <= group_rank < len(ranks):
        raise ValueError(f"get_global_rank(): `group_rank` must be in [0, {len(ranks)}); got {group_rank}")
    return ranks[group_rank]


def get_group_rank(group, global_rank):
    """`global_rank`'s rank in `group` (``ValueError`` if it is not a member)."""
    ranks = get_process_group_ranks(group, "get_group_rank")
    if global_rank not in ranks:
        raise ValueError(f"get_group_rank(): global rank {global_rank} is not part of the group {ranks}")
    return ranks.index(global_rank)


# ---------------------------------------------------------------------------------------------------
# Batched point-to-point

class P2POp:
    """One point-to-point operation for batch_isend_irecv: ``P2POp(dist.isend, arr, peer)``."""

    def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
        if op not in (isend, irecv):
            raise ValueError("P2POp(): `op` must be pydist.isend or pydist.irecv")
        if peer is None and group_peer is None:
            raise ValueError("P2POp(): give `peer` (a global rank) or `group_peer`")
        if peer is None:
            peer = get_global_rank(group, group_peer)
        self.op, self.tensor, self.peer, self.group, self.tag = op, tensor, peer, group, tag

    def __repr__(self):
        return f"P2POp({self.op.__name__}, peer={self.peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list):
    """Start every operation of `p2p_op_list` and return their Work handles (wait on each)."""
    if not isinstance(p2p_op_list, (list, tuple)) or not p2p_op_list or \
            not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise ValueError("batch_isend_irecv(): `p2p_op_list` must be a non-empty list of P2POp")
    # Check every entry (array, peer, tag, group) before anything starts, so a bad entry cannot leave
    # half a batch posted: the first pass runs the real calls in _C's validate-only mode.
    old = _C.set_validate_only(True)
    try:
        for p in p2p_op_list:
            p.op(p.tensor, p.peer, group=p.group, tag=p.tag)
    finally:
        _C.set_validate_only(old)
    return [p.op(p.tensor, p.peer, group=p.group, tag=p.tag) for p in p2p_op_list]


# ---------------------------------------------------------------------------------------------------
# monitored_barrier

_MONITOR_TAG = 32700   # reserved for monitored_barrier's messages (MPI guarantees tags up to 32767)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """A barrier that names the ranks that did not arrive.

    Group rank 0 waits for every other rank's message; a rank still missing after `timeout` (default:
    init_process_group's, else 30 minutes) makes rank 0 raise ``DistError`` naming it (with
    ``wait_all_ranks=True``, naming all of them). Then rank 0 releases the others; a rank not released
    within `timeout` raises ``DistTimeoutError``. A `timeout` of 0 leaves no time: every rank of a group
    of two or more raises ``DistTimeoutError`` at once. The messages are torch's (gloo's): "Rank 1
    failed to pass monitoredBarrier", "Rank 0 timed out in monitoredBarrier", "Rank 2 successfully
    reached monitoredBarrier, but received errors while waiting for send/recv from rank 0".
    """
    import numpy as np
    fn = "monitored_barrier"
    handle = 0 if group is None else _group_handle(group, fn)
    if handle < 0:
        return None
    if timeout is None:
        seconds = _default_timeout if _default_timeout > 0 else 1800.0
    elif (timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout) == 0:
        seconds = 0.0   # torch's "no time": rank 0 gives up before it waits for anyone
    else:
        seconds = _seconds(timeout, fn)
    ranks = get_process_group_ranks(group)
    me = get_rank()
    token = np.zeros(1, np.uint8)
    if seconds == 0 and len(ranks) > 1:
        # No time at all: every rank gives up at once, and no message is left for a later barrier to take
        if me == ranks[0]:
            raise DistTimeoutError(f"{fn}(): Rank {me} timed out in monitoredBarrier after 0 ms (a timeout of 0); "
                                   "no ranks successfully processed in monitoredBarrier")
        raise DistTimeoutError(f"{fn}(): Rank {me} successfully reached monitoredBarrier, but received errors while "
                               f"waiting for send/recv from rank {ranks[0]}: a timeout of 0 leaves no time for it")
    if me != ranks[0]:
        _C.send(token, ranks[0], _MONITOR_TAG, handle)
        work = _C.irecv(np.zeros(1, np.uint8), ranks[0], _MONITOR_TAG, handle)
        try:
            work.wait(seconds)
        except DistTimeoutError:
            raise DistTimeoutError(
                f"{fn}(): Rank {me} successfully reached monitoredBarrier, but received errors while waiting for "
                f"send/recv from rank {ranks[0]}: rank {ranks[0]} did not release it within {seconds:g} s (another "
                f"rank may not have called monitored_barrier; rank {ranks[0]}'s error names it)") from None
        return None
    bufs = {r: np.zeros(1, np.uint8) for r in ranks[1:]}
    works = {r: _C.irecv(bufs[r], r, _MONITOR_TAG, handle) for r in ranks[1:]}
    deadline = time.monotonic() + seconds
    for r, w in works.items():
        try:
            w.wait(max(0.0, deadline - time.monotonic()))
        except DistTimeoutError:
            pass
    missing = [r for r, w in works.items() if not w.is_completed()]
    if missing:
        w = works = None   # the receives still pending are dropped, and so cancelled
        shown = missing if wait_all_ranks else missing[:1]
        who = ", ".join(str(r) for r in shown)
        raise DistError(f"{fn}(): Rank{'s' if len(shown) > 1 else ''} {who} failed to pass monitoredBarrier "
                        f"in {seconds:g} s")
    for r in ranks[1:]:
        _C.send(token, r, _MONITOR_TAG, handle)
    return None


# ---------------------------------------------------------------------------------------------------
# Object collectives: pickle over the array collectives. Unpickling runs arbitrary code: use these
# only between trusted peers (your own job's ranks), as torch's documentation warns.

def _to_bytes(obj):
    import numpy as np
    import pickle
    return np.frombuffer(pickle.dumps(obj), dtype=np.uint8)


def _pickled(objs):
    """(payloads, None), or (None, the exception) when an object cannot be pickled. The failure is
    announced to the other ranks as a size of -1 before anything else is sent: a rank that raised
    alone would leave the others waiting for it."""
    try:
        return [_to_bytes(o) for o in objs], None
    except Exception as e:   # PicklingError, TypeError, AttributeError, or what __reduce__ raises
        return None, e


def _raise_if_unpickled(fn, sizes, failed_ranks, error):
    """Every rank raises if any rank could not pickle its object: that rank its own error, the others
    a DistError naming it."""
    if error is not None:
        raise error
    if (sizes < 0).any():
        raise DistError(f"{fn}(): rank(s) {failed_ranks} could not pickle their object; nothing was sent")


def _from_bytes(buf):
    import pickle
    return pickle.loads(buf.tobytes())


def broadcast_object_list(object_list, src=0, group=None, device=None):
    """Broadcast the picklable objects of `object_list` from `src`; other ranks' list is filled in
    place (it must have the same length). Trusted peers only (pickle)."""
    import numpy as np
    handle = 0 if group is None else _group_handle(group, "broadcast_object_list")
    if handle < 0:
        return None
    is_src = get_rank() == src
    sizes = np.zeros(len(object_list), np.int64)
    payloads, error = _pickled(object_list) if is_src else ([], None)
    if is_src:
        sizes[:] = -1 if error is not None else [len(p) for p in payloads]
    _C.broadcast(sizes, src, handle, False)
    _raise_if_unpickled("broadcast_object_list", sizes, [src], error)
    data = np.concatenate(payloads) if is_src and payloads else np.zeros(int(sizes.sum()), np.uint8)
    _C.broadcast(data, src, handle, False)
    if not is_src:
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        for i in range(len(object_list)):
            object_list[i] = _from_bytes(data[offsets[i]:offsets[i + 1]])
    return None


def _gather_sizes(fn, obj, handle, group):
    """Pickle `obj` and learn every rank's payload size; every rank raises if any could not pickle."""
    import numpy as np
    size = get_world_size(group)
    payloads, error = _pickled([obj])
    payload = payloads[0] if error is None else np.zeros(0, np.uint8)
    sizes = np.zeros(size, np.int64)
    _C.all_gather_into_tensor(sizes, np.array([len(payload) if error is None else -1], np.int64), handle, False)
    ranks = get_process_group_ranks(group)
    _raise_if_unpickled(fn, sizes, [ranks[i] for i in np.flatnonzero(sizes < 0)], error)
    return payload, sizes


def all_gather_object(object_list, obj, group=None):
    """``object_list[i]`` becomes group rank i's `obj`, on every rank. Trusted peers only (pickle).

    Example (``mpiexec -n 2``)::

        >>> out = [None, None]
        >>> dist.all_gather_object(out, {"rank": dist.get_rank()})
        >>> out                          # on both ranks
        [{'rank': 0}, {'rank': 1}]
    """
    import numpy as np
    handle = 0 if group is None else _group_handle(group, "all_gather_object")
    if handle < 0:
        return None
    size = get_world_size(group)
    if len(object_list) != size:
        raise ValueError(f"all_gather_object(): `object_list` must have {size} entries; got {len(object_list)}")
    payload, sizes = _gather_sizes("all_gather_object", obj, handle, group)
    width = int(sizes.max()) if size else 0
    mine = np.zeros(width, np.uint8)
    mine[:len(payload)] = payload
    out = np.zeros(width * size, np.uint8)
    _C.all_gather_into_tensor(out, mine, handle, False)
    for i in range(size):
        object_list[i] = _from_bytes(out[i * width:i * width + int(sizes[i])])
    return None


def gather_object(obj, object_gather_list=None, dst=0, group=None):
    """On `dst`, ``object_gather_list[i]`` becomes group rank i's `obj`. Trusted peers only (pickle)."""
    import numpy as np
    handle = 0 if group is None else _group_handle(group, "gather_object")
    if handle < 0:
        return None
    size = get_world_size(group)
    is_dst = get_rank() == dst
    if is_dst and (object_gather_list is None or len(object_gather_list) != size):
        raise ValueError(f"gather_object(): `object_gather_list` must be a list of {size} entries on dst")
    if not is_dst and object_gather_list is not None:
        raise ValueError("gather_object(): `object_gather_list` must be None on ranks other than dst")
    payload, sizes = _gather_sizes("gather_object", obj, handle, group)
    width = int(sizes.max()) if size else 0
    mine = np.zeros(width, np.uint8)
    mine[:len(payload)] = payload
    outs = [np.zeros(width, np.uint8) for _ in range(size)] if is_dst else None
    _C.gather(mine, outs, dst, handle, False)
    if is_dst:
        for i in range(size):
            object_gather_list[i] = _from_bytes(outs[i][:int(sizes[i])])
    return None


def scatter_object_list(scatter_object_output_list, scatter_object_input_list=None, src=0, group=None):
    """Group rank i gets ``scatter_object_input_list[i]`` of `src` in
    ``scatter_object_output_list[0]``. Trusted peers only (pickle)."""
    import numpy as np
    handle = 0 if group is None else _group_handle(group, "scatter_object_list")
    if handle < 0:
        return None
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise ValueError("scatter_object_list(): `scatter_object_output_list` must be a list of at least 1 entry")
    size = get_world_size(group)
    is_src = get_rank() == src
    if is_src and (scatter_object_input_list is None or len(scatter_object_input_list) != size):
        raise ValueError(f"scatter_object_list(): `scatter_object_input_list` must have {size} entries on src")
    payloads, error = _pickled(scatter_object_input_list) if is_src else ([], None)
    sizes = np.zeros(size, np.int64)
    if is_src:
        sizes[:] = -1 if error is not None else [len(p) for p in payloads]
    _C.broadcast(sizes, src, handle, False)
    _raise_if_unpickled("scatter_object_list", sizes, [src], error)
    width = int(sizes.max()) if size else 0
    ins = None
    if is_src:
        ins = [np.zeros(width, np.uint8) for _ in range(size)]
        for i, p in enumerate(payloads):
            ins[i][:len(p)] = p
    mine = np.zeros(width, np.uint8)
    _C.scatter(mine, ins, src, handle, False)
    scatter_object_output_list[0] = _from_bytes(mine[:int(sizes[get_rank(group)])])
    return None


_calls_checked = False


def _check_calls():
    """PYDIST_DEBUG=DETAIL's check (pydist/debug.py) on every collective from now on: at import when it is
    set, and from pydist.torch for torch's TORCH_DISTRIBUTED_DEBUG=DETAIL. The package's names too."""
    global _calls_checked
    if _calls_checked:
        return
    from . import debug as _debug
    package = sys.modules[__name__.rpartition(".")[0]]
    for name in _debug.CHECKED:
        plain = globals()[name]
        globals()[name] = _debug.wrap(plain, _group_handle)
        if getattr(package, name, None) is plain:
            setattr(package, name, globals()[name])
    _calls_checked = True


if _env.read("PYDIST_DEBUG") == "detail":
    _check_calls()

if _env.read("PYDIST_WAIT") == "mpi":
    _C.set_wait_mode(_C.WAIT_MPI)
