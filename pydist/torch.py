"""pydist as a torch.distributed backend: ``import pydist.torch``, then
``torch.distributed.init_process_group(backend="pydist")`` under ``mpiexec``.

Every call goes to pydist's own collectives on the tensors' memory (``tensor.numpy()`` shares it):
torch's model, optimizer and DistributedDataParallel run over MPICH with no PyTorch source build.
torch stays optional: only this module imports it.

How it fits torch 2.13: ``Backend.register_backend("pydist", creator, extended_api=True,
devices=["cpu"])``; torch calls the creator for the default group and for every ``new_group`` with the
group's global ranks, and the creator returns a ``ProcessGroup`` subclass whose methods (``allreduce``,
``broadcast``, ``allgather``, ..., the names torch's Python front and its C++ trampoline call) run the
pydist call and return a ``Work``. A Work completes in ``wait()``, ``is_completed()`` or
``get_future()``: DistributedDataParallel waits on the future from C++, where nothing of ours runs, so
``get_future()`` completes the call first (the gradient all-reduce of a bucket then runs when DDP
asks for its future, right after starting it).

Rendezvous: with no ``RANK`` in the environment (under ``mpiexec``, or a plain ``python script.py``,
a world of one), importing this module starts MPI
(``pydist.init_process_group``, every rank alike) and sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``
and ``MASTER_PORT`` from it (rank 0 picks a free port), so torch's default ``env://`` finds a real
TCPStore for code that uses one. ``init_method="pydist://"`` does the same without the environment.

Tensors: CPU only. Non-contiguous tensors are copied into a contiguous one and back; tensors that
require grad are used through ``detach()``; bfloat16 is moved as raw 16-bit words (broadcast,
gathers, scatters, all-to-all, send/recv); reducing it is refused (``TypeError``), as is
``ReduceOp.PREMUL_SUM``.
"""
import datetime
import os
import socket
import time

import torch
import torch.distributed as tdist

from . import distributed as pd

__all__ = ["ProcessGroupPydist", "BACKEND"]

BACKEND = "pydist"

_OPS = [
    (tdist.ReduceOp.SUM, pd.ReduceOp.SUM), (tdist.ReduceOp.AVG, pd.ReduceOp.AVG),
    (tdist.ReduceOp.PRODUCT, pd.ReduceOp.PRODUCT), (tdist.ReduceOp.MIN, pd.ReduceOp.MIN),
    (tdist.ReduceOp.MAX, pd.ReduceOp.MAX), (tdist.ReduceOp.BAND, pd.ReduceOp.BAND),
    (tdist.ReduceOp.BOR, pd.ReduceOp.BOR), (tdist.ReduceOp.BXOR, pd.ReduceOp.BXOR),
]


def _op(reduce_op, fn):
    for theirs, ours in _OPS:
        if reduce_op == theirs:
            return ours
    raise ValueError(f"{fn}(): the pydist backend does not support {reduce_op} (PREMUL_SUM); "
                     f"use SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR or BXOR")


class _Array:
    """A tensor's memory as a NumPy array: the tensor itself when contiguous, else a contiguous copy
    (written back by ``back()`` when the call wrote into it)."""

    __slots__ = ("tensor", "copy", "array")

    def __init__(self, tensor, fn, reduce=False, arg="tensor"):
        self.copy = None
        if tensor.__class__ is torch.Tensor and tensor.is_cpu and tensor.is_contiguous() and \
                tensor.dtype is not torch.bfloat16 and not tensor.requires_grad:
            self.tensor, self.array = tensor, tensor.numpy()   # the common case, in a few hundred ns
            return
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{fn}(): `{arg}` must be a torch.Tensor; got {type(tensor).__name__}")
        if not tensor.is_cpu:
            raise TypeError(f"{fn}(): the pydist backend works on CPU tensors; `{arg}` is on {tensor.device}")
        self.tensor = tensor.detach()
        if self.tensor.dtype == torch.bfloat16:
            if reduce:
                raise TypeError(f"{fn}(): the pydist backend cannot reduce bfloat16 tensors yet "
                                f"(it moves them as raw 16-bit words)")
            self.tensor = self.tensor.view(torch.int16)
        self.copy = None if self.tensor.is_contiguous() else self.tensor.contiguous()
        self.array = (self.tensor if self.copy is None else self.copy).numpy()

    def back(self):
        if self.copy is not None:
            self.tensor.copy_(self.copy)


class _Packed:
    """Several arrays' results received into one flat tensor, unpacked into them by ``back()``."""

    def __init__(self, arrays):
        self.arrays = arrays
        dtype = torch.from_numpy(arrays[0].array).dtype if arrays else torch.float32
        self.copy = torch.empty(sum(a.array.size for a in arrays), dtype=dtype)

    def back(self):
        start = 0
        for a in self.arrays:
            a.array.reshape(-1)[...] = self.copy[start:start + a.array.size].numpy()
            start += a.array.size
            a.back()


class _Work(tdist._Work):
    """A pydist Work (or a call already done) as torch's Work: results copied back into non-contiguous
    tensors on completion, and a torch Future that completes with `result`."""

    def __init__(self, work, result, arrays=(), source=None):
        super().__init__()
        self._work = work
        self._result = result
        self._arrays = arrays
        self._source = source      # receives: the sender's group rank, once complete
        self._future = None        # made when asked for (a blocking call never is)
        self._done = False
        self._error = None
        if work is None:
            self._finish()

    def _finish(self):
        for a in self._arrays:
            a.back()
        self._arrays = ()
        self._done = True
        if self._future is not None:
            self._future.set_result(self._result)

    def wait(self, timeout=datetime.timedelta(0)):
        if self._error is not None:
            raise self._error
        if not self._done:
            try:
                if timeout and timeout.total_seconds() > 0:
                    self._work.wait(timeout=timeout)
                else:
                    self._work.wait()
            except pd.DistTimeoutError:
                raise
            except Exception as e:   # the call failed: every later wait raises it again
                self._error = e
                raise
            self._finish()
        return True

    def is_completed(self):
        if not self._done and self._error is None and self._work.is_completed():
            self.wait()
        return self._done or self._error is not None

    def is_success(self):
        return self._done and self._error is None

    def exception(self):
        return self._error

    def result(self):
        return self._result

    def get_future(self):
        # DistributedDataParallel waits on this future from C++: complete the call now. An error
        # raises here (a future failed with set_exception is not seen by C++).
        self.wait()
        if self._future is None:
            self._future = torch.futures.Future()
            self._future.set_result(self._result)
        return self._future

    def _source_rank(self):
        if self._source is None:
            raise ValueError("source_rank(): only a receive's Work has a source rank")
        self.wait()
        return self._source()

    source_rank = _source_rank


class ProcessGroupPydist(tdist.ProcessGroup):
    """torch's ProcessGroup over a pydist group (the world, or a sub-group made members-only)."""

    def __init__(self, rank, size, global_ranks):
        super().__init__(rank, size)
        self._ranks = list(global_ranks)
        if len(self._ranks) == pd.get_world_size():
            self._group = None
        else:
            self._group = pd.ProcessGroup(pd._C.new_group(self._ranks, True), self._ranks)
            pd._subgroups.add(self._group)

    # names and sizes ---------------------------------------------------------------------------

    def getBackendName(self):
        return BACKEND

    def setGroupName(self, name):
        self._group_name = name

    def getGroupName(self):
        return getattr(self, "_group_name", "")

    def _global(self, group_rank, fn, arg):
        if not 0 <= group_rank < len(self._ranks):
            raise ValueError(f"{fn}(): `{arg}` must be a group rank in [0, {len(self._ranks)}); got {group_rank}")
        return self._ranks[group_rank]

    def _work(self, work, result, arrays=(), source=None):
        return _Work(work, result, [a for a in arrays if a.copy is not None], source)

    def _done(self, result, arrays):
        """A call already run to the end (a blocking one: torch waits on its Work, then drops it): its
        results copied back, and one shared completed Work (making a Work costs more than the call)."""
        for a in arrays:
            a.back()
        return _DONE

    # collectives --------------------------------------------------------------------------------

    def _each(self, tensors, arrays, opts, call):
        """call(array, async_op) on every tensor's array: to the end here when torch waits at once."""
        if opts is not None and not opts.asyncOp:
            for a in arrays:
                call(a.array, False)
            return self._done(tensors, arrays)
        return self._work(_All([call(a.array, True) for a in arrays]), tensors, arrays)

    def allreduce(self, tensors, opts=None):
        op = _op(opts.reduceOp if opts is not None else tdist.ReduceOp.SUM, "all_reduce")
        arrays = [_Array(t, "all_reduce", reduce=True) for t in tensors]
        return self._each(tensors, arrays, opts,
                          lambda a, async_op: pd.all_reduce(a, op, group=self._group, async_op=async_op))

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        root = self._global(opts.rootRank if opts is not None else 0, "broadcast", "src")
        arrays = [_Array(t, "broadcast") for t in tensors]
        return self._each(tensors, arrays, opts,
                          lambda a, async_op: pd.broadcast(a, root, group=self._group, async_op=async_op))

    def reduce(self, tensors, opts=None):
        op = _op(opts.reduceOp, "reduce")
        root = self._global(opts.rootRank, "reduce", "dst")
        arrays = [_Array(t, "reduce", reduce=True) for t in tensors]
        return self._each(tensors, arrays, opts,
                          lambda a, async_op: pd.reduce(a, root, op, group=self._group, async_op=async_op))

    def allgather(self, output_tensors, input_tensors, opts=None):
        (outs,), (inp,) = output_tensors, input_tensors
        src = _Array(inp, "all_gather", arg="tensor")
        dst = [_Array(t, "all_gather", arg="tensor_list") for t in outs]
        work = pd.all_gather([d.array for d in dst], src.array, group=self._group, async_op=True)
        return self._work(work, output_tensors, dst)

    def all_gather_single(self, output, input, opts=None):
        dst, src = _Array(output, "all_gather_into_tensor", arg="output_tensor"), \
            _Array(input, "all_gather_into_tensor", arg="input_tensor")
        work = pd.all_gather_into_tensor(dst.array.reshape(-1), src.array.reshape(-1), group=self._group,
                                         async_op=True)
        return self._work(work, [output], [dst])

    _allgather_base = all_gather_single

    def gather(self, output_tensors, input_tensors, opts=None):
        root = self._global(opts.rootRank, "gather", "dst")
        (inp,) = input_tensors
        src = _Array(inp, "gather")
        dst = [_Array(t, "gather", arg="gather_list") for t in output_tensors[0]] if output_tensors else []
        work = pd.gather(src.array, [d.array for d in dst] if dst else None, root, group=self._group,
                         async_op=True)
        return self._work(work, output_tensors, dst)

    def scatter(self, output_tensors, input_tensors, opts=None):
        root = self._global(opts.rootRank, "scatter", "src")
        (out,) = output_tensors
        dst = _Array(out, "scatter")
        src = [_Array(t, "scatter", arg="scatter_list") for t in input_tensors[0]] if input_tensors else []
        work = pd.scatter(dst.array, [s.array for s in src] if src else None, root, group=self._group,
                          async_op=True)
        return self._work(work, output_tensors, [dst])

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op = _op(opts.reduceOp, "reduce_scatter")
        (out,), (ins,) = output_tensors, input_tensors
        dst = _Array(out, "reduce_scatter", reduce=True, arg="output")
        src = [_Array(t, "reduce_scatter", reduce=True, arg="input_list") for t in ins]
        work = pd.reduce_scatter(dst.array, [s.array for s in src], op, group=self._group, async_op=True)
        return self._work(work, output_tensors, [dst])

    def reduce_scatter_single(self, output, input, opts=None):
        op = _op(opts.reduceOp, "reduce_scatter_tensor")
        dst = _Array(output, "reduce_scatter_tensor", reduce=True, arg="output")
        src = _Array(input, "reduce_scatter_tensor", reduce=True, arg="input")
        work = pd.reduce_scatter_tensor(dst.array.reshape(-1), src.array.reshape(-1), op, group=self._group,
                                        async_op=True)
        return self._work(work, [output], [dst])

    _reduce_scatter_base = reduce_scatter_single

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        dst = _Array(output, "all_to_all_single", arg="output")
        src = _Array(input, "all_to_all_single", arg="input")
        # Split sizes count rows of dim 0, in torch and in pydist alike.
        work = pd.all_to_all_single(dst.array, src.array, list(output_split_sizes) or None,
                                    list(input_split_sizes) or None, group=self._group, async_op=True)
        return self._work(work, [output], [dst])

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        # torch's blocks may differ in size: one all_to_all_single on flat copies, split sizes in elements
        dst = [_Array(t, "all_to_all", arg="output_tensor_list") for t in output_tensors]
        src = [_Array(t, "all_to_all", arg="input_tensor_list") for t in input_tensors]
        packed = _Packed(dst)
        flat_in = torch.cat([torch.from_numpy(s.array).reshape(-1) for s in src]) if src else None
        work = pd.all_to_all_single(packed.copy.numpy(), flat_in.numpy(), [d.array.size for d in dst],
                                    [s.array.size for s in src], group=self._group, async_op=True)
        return self._work(work, output_tensors, [packed])

    def barrier(self, opts=None):
        return self._work(pd.barrier(group=self._group, async_op=True), [])

    def monitored_barrier(self, opts=None, wait_all_ranks=False):
        timeout = getattr(opts, "timeout", None)
        pd.monitored_barrier(group=self._group, timeout=timeout, wait_all_ranks=wait_all_ranks)

    # point to point -----------------------------------------------------------------------------

    def send(self, tensors, dst, tag=0):
        (t,) = tensors
        a = _Array(t, "send")
        return self._work(pd.isend(a.array, self._global(dst, "send", "dst"), group=self._group, tag=tag), tensors)

    def recv(self, tensors, src, tag=0):
        (t,) = tensors
        a = _Array(t, "recv")
        work = pd.irecv(a.array, self._global(src, "recv", "src"), group=self._group, tag=tag)
        return self._work(work, tensors, [a], source=lambda: src)

    def recv_anysource(self, tensors, tag=0):
        (t,) = tensors
        a = _Array(t, "recv")
        work = pd.irecv(a.array, None, group=self._group, tag=tag)
        return self._work(work, tensors, [a], source=lambda: self._ranks.index(work.source_rank()))


_DONE = _Work(None, [])


class _All:
    """Several pydist Works as one."""

    def __init__(self, works):
        self.works = works

    def wait(self, timeout=None):
        for w in self.works:
            w.wait() if timeout is None else w.wait(timeout=timeout)
        return True

    def is_completed(self):
        return all(w.is_completed() for w in self.works)


# ---------------------------------------------------------------------------------------------------
# Creation and rendezvous

def _create(options, backend_options=None):
    """torch's creator (extended_api): the default group (no ranks listed: the world) or a new_group."""
    if not pd.is_initialized():
        pd.init_process_group(timeout=options.timeout)
    ranks = list(options.global_ranks_in_group) or list(range(pd.get_world_size()))
    if len(ranks) < pd.get_world_size():
        # Only the members get here (torch returns early on the others): wait until all have arrived,
        # through the store and with its timeout, before MPI's blocking members-only creation.
        options.store.add("pydist_arrived", 1)
        deadline = time.monotonic() + options.timeout.total_seconds()
        while options.store.add("pydist_arrived", 0) < options.group_size:
            if time.monotonic() > deadline:
                raise pd.DistTimeoutError(f"new_group(): not every member of {ranks} arrived within "
                                          f"{options.timeout}")
            time.sleep(0.001)
    return ProcessGroupPydist(options.group_rank, options.group_size, ranks)


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _master():
    """(address, port) of rank 0, agreed over MPI: the loopback when every rank runs on rank 0's host."""
    host = socket.gethostname()
    info = [host, _free_port()] if pd.get_rank() == 0 else [None, None]
    pd.broadcast_object_list(info, 0)
    hosts = [None] * pd.get_world_size()
    pd.all_gather_object(hosts, host)
    address = "127.0.0.1" if all(h == info[0] for h in hosts) else socket.gethostbyname(info[0])
    return address, info[1]


def _pydist_rendezvous(url, timeout=datetime.timedelta(minutes=30), **kwargs):
    """init_method="pydist://": rank and size from MPI, and a TCPStore hosted by rank 0."""
    if not pd.is_initialized():
        pd.init_process_group()
    address, port = _master()
    rank, size = pd.get_rank(), pd.get_world_size()
    store = tdist.TCPStore(address, port, size, rank == 0, timeout, wait_for_workers=False)
    yield store, rank, size


def _fill_env():
    """With no RANK set (under mpiexec, or a plain `python script.py`: a world of one): MPI's rank and
    size, and rank 0's address and a free port, for torch's default env:// rendezvous."""
    if "RANK" in os.environ or tdist.is_initialized():
        return
    if not pd.is_initialized():
        pd.init_process_group()
    address, port = _master()
    os.environ.setdefault("MASTER_ADDR", address)
    os.environ.setdefault("MASTER_PORT", str(port))
    os.environ["RANK"] = str(pd.get_rank())
    os.environ["WORLD_SIZE"] = str(pd.get_world_size())
    os.environ.setdefault("LOCAL_RANK", os.environ.get("MPI_LOCALRANKID", "0"))


if BACKEND.upper() not in tdist.Backend._plugins:
    tdist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
try:
    tdist.register_rendezvous_handler("pydist", _pydist_rendezvous)
except RuntimeError:
    pass   # imported again (a reload): registered already
_fill_env()
