"""pydist as a torch.distributed backend: ``import pydist.torch``, then
``torch.distributed.init_process_group(backend="pydist")`` under ``mpiexec``.

Every call goes to pydist's own collectives on the tensors' memory (``tensor.numpy()`` shares it):
torch's model, optimizer and DistributedDataParallel run over MPICH with no PyTorch source build.
torch stays optional: only this module imports it.

How it fits torch 2.13: ``Backend.register_backend("pydist", creator, extended_api=True,
devices=["cpu"])``; torch calls the creator for the default group and for every ``new_group`` with the
group's global ranks, and the creator returns a ``ProcessGroup`` subclass whose methods (``allreduce``,
``broadcast``, ``allgather``, ..., the names torch's Python front and its C++ trampoline call) run the
pydist call and return a ``Work``. Every torch group is a pydist group of its own (its communicator,
its shared-memory channel), one of the whole world included; only torch's default group is pydist's
default group. A blocking call (``async_op=False``) runs to the end in the
method. An asynchronous one (``async_op=True``, and every gradient bucket of
DistributedDataParallel, which waits on the Work's future from C++ where nothing of ours runs) goes to
the group's worker thread, which runs the group's asynchronous collectives in order and completes
their Works and futures by itself: the buckets' all-reduces overlap the backward pass. A blocking call
on the group waits for the worker's queue to empty first, so one group's collectives never run on two
threads at once. Point-to-point calls are pydist's own nonblocking ones.

Timeouts: torch's ``init_process_group(timeout=...)`` becomes pydist's session timeout, and each
``new_group``'s timeout (torch's default for it: 30 minutes) its own group's: a call that has not
completed by then raises ``pydist.DistTimeoutError`` (through the future, in DDP).
``torch.distributed.monitored_barrier``, which torch 2.13 refuses on every backend but gloo, is
replaced on import by one that runs pydist's monitored barrier on pydist groups.

Rendezvous: with no ``RANK`` in the environment (under ``mpiexec``, or a plain ``python script.py``,
a world of one), importing this module starts MPI
(``pydist.init_process_group``, every rank alike) and sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``
and ``MASTER_PORT`` from it (rank 0 picks a free port), so torch's default ``env://`` finds a real
TCPStore for code that uses one. ``init_method="pydist://"`` does the same without the environment.

Timeline (``pydist.timeline``): every pydist call shows as a "comm" span already, from whichever
thread makes it. While a timeline records, a gradient bucket's all-reduce (an asynchronous all-reduce
issued inside a backward pass: DDP's buckets, or a comm hook's) also shows as a "bucket all_reduce"
span (cat "torch", args ``bucket`` and ``bytes``) around its run on the group's worker thread, and the
backward pass as a "backward" span on the thread that ran it, from its first bucket to the end of its
autograd graph (an autograd callback, queued before DDP's own, which then waits for the buckets): the
buckets' all-reduces against the computation they overlap. ``bucket`` is the bucket's index from a
pydist comm hook, and otherwise the all-reduce's position in the backward pass (DDP launches its
buckets in index order). Not recording, none of this runs.

Tensors: CPU only. Non-contiguous tensors are copied into a contiguous one and back; tensors that
require grad are used through ``detach()``; bfloat16 is moved as raw 16-bit words and reduced by
pydist's own ops (widened to float32 for each pairwise step and rounded back to nearest even, as
float16 is). ``ReduceOp.PREMUL_SUM`` is refused (``ValueError``).
"""
import atexit
import collections
import datetime
import functools
import os
import socket
import sys
import threading
import time

import torch
import torch.distributed as tdist

from . import distributed as pd
from . import timeline as _timeline

__all__ = ["ProcessGroupPydist", "BACKEND", "monitored_barrier"]

#: The backend name, for ``torch.distributed.init_process_group(backend="pydist")``.
BACKEND = "pydist"

_OPS = [
    (tdist.ReduceOp.SUM, pd.ReduceOp.SUM), (tdist.ReduceOp.AVG, pd.ReduceOp.AVG),
    (tdist.ReduceOp.PRODUCT, pd.ReduceOp.PRODUCT), (tdist.ReduceOp.MIN, pd.ReduceOp.MIN),
    (tdist.ReduceOp.MAX, pd.ReduceOp.MAX), (tdist.ReduceOp.BAND, pd.ReduceOp.BAND),
    (tdist.ReduceOp.BOR, pd.ReduceOp.BOR), (tdist.ReduceOp.BXOR, pd.ReduceOp.BXOR),
]


# The fast path's lookup: a ReduceOp's hash is its kind (torch 2.13), the same for the enum value and
# for the options' ReduceOp object, which do not compare equal as dict keys. Unused if that ever changes.
_OP_BY_HASH = {hash(theirs): int(ours) for theirs, ours in _OPS}
if len(_OP_BY_HASH) != len(_OPS) or hash(tdist.AllreduceOptions().reduceOp) != hash(tdist.ReduceOp.SUM):
    _OP_BY_HASH = {}

# What tensor.numpy() takes as it is (bfloat16 is NumPy-less and goes the long way, through _Array).
_NUMPY_DTYPES = frozenset([torch.bool, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
                           torch.uint16, torch.uint32, torch.uint64, torch.float16, torch.float32,
                           torch.float64, torch.complex64, torch.complex128])


def _op(reduce_op, fn):
    for theirs, ours in _OPS:
        if reduce_op == theirs:
            return ours
    raise ValueError(f"{fn}(): the pydist backend does not support {reduce_op} (PREMUL_SUM); "
                     f"use SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR or BXOR")


class _Array:
    """A tensor's memory as a NumPy array: the tensor itself when contiguous, else a contiguous copy
    (written back by ``back()`` when the call wrote into it). bfloat16, which NumPy lacks, is its 16-bit
    words for the calls that only move it, and the bfloat16 tensor itself (pydist's C reads it as
    bfloat16) for reductions."""

    __slots__ = ("tensor", "copy", "array")

    def __init__(self, tensor, fn, reduce=False, arg="tensor"):
        self.copy = None
        if tensor.__class__ is torch.Tensor and tensor.is_cpu and tensor.is_contiguous() and \
                tensor.dtype is not torch.bfloat16 and not tensor.requires_grad:
            self.tensor, self.array = tensor, tensor.numpy()   # the common case, in a few hundred ns
            return
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{fn}(): `{arg}` must be a torch.Tensor; got {type(tensor).__name__}")
        if tensor.layout is not torch.strided:
            raise TypeError(f"{fn}(): `{arg}` is a {tensor.layout} tensor: the pydist backend takes sparse "
                            f"tensors in all_reduce with ReduceOp.SUM only (as gloo does); use tensor.to_dense()")
        if not tensor.is_cpu:
            raise TypeError(f"{fn}(): the pydist backend works on CPU tensors; `{arg}` is on {tensor.device}")
        self.tensor = tensor.detach()
        words = self.tensor.dtype == torch.bfloat16 and not reduce
        if words:
            self.tensor = self.tensor.view(torch.int16)
        self.copy = None if self.tensor.is_contiguous() else self.tensor.contiguous()
        flat = self.tensor if self.copy is None else self.copy
        self.array = flat if self.tensor.dtype == torch.bfloat16 else flat.numpy()

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
    """A call in progress as torch's Work: a pydist Work (point to point), or a collective queued on
    the group's worker thread, or a call already done (work None). On completion results are copied
    back into non-contiguous tensors and the torch Future completes with `result`."""

    def __init__(self, work, result, arrays=(), source=None):
        super().__init__()
        self._work = work
        self._result = result
        self._arrays = [a for a in arrays if a.copy is not None]   # those with results to copy back
        self._source = source      # receives: the sender's group rank, once complete
        self._future = None        # made when asked for (a blocking call's never is)
        self._base = None          # a queued call's: completed by the worker, self._future raises errors
        self._done = False
        self._error = None
        if work is None:
            self._finish()

    def _finish(self):
        for a in self._arrays:
            a.back()
        self._arrays = ()
        self._done = True
        if self._future is not None and self._base is None:
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
            if not self._done:
                self._finish()
        return True

    def is_completed(self):
        if not self._done and self._error is None and self._work.is_completed():
            try:
                self.wait()
            except Exception:
                pass   # failed: completed, and wait() raises it
        return self._done or self._error is not None

    def is_success(self):
        return self._done and self._error is None

    def exception(self):
        return self._error

    def result(self):
        return self._result

    def _result_or_raise(self, _base):
        if self._error is not None:
            raise self._error   # raised inside then(): the future fails where C++ (DDP) sees it
        return self._result

    def get_future(self):
        if self._future is not None:
            return self._future
        if isinstance(self._work, _Queued):
            # Completed by the worker thread (DDP waits on it from C++ while the backward pass goes on).
            with self._work.worker.lock:
                if not self._work.finished:
                    self._work.worker.handed_out_running += 1
                    self._base = torch.futures.Future()
                    self._future = self._base.then(self._result_or_raise)
                    return self._future
        self.wait()   # a pydist Work (or a queued call that has finished): complete it here
        self._future = torch.futures.Future()
        self._future.set_result(self._result)
        return self._future

    def _source_rank(self):
        if self._source is None:
            raise ValueError("source_rank(): only a receive's Work has a source rank")
        self.wait()
        return self._source()

    source_rank = _source_rank


class _Queued:
    """A collective on the group's worker thread: done when `event` is set, `error` if it failed."""

    __slots__ = ("run", "what", "worker", "event", "error", "finished")

    def __init__(self, run, what, worker):
        self.run, self.what, self.worker = run, what, worker
        self.event = threading.Event()
        self.error = None
        self.finished = False

    def wait(self, timeout=None):
        seconds = None if timeout is None else timeout.total_seconds()
        if not self.event.wait(seconds):
            raise pd.DistTimeoutError(f"{self.what}: wait(timeout={seconds:g} s) expired; the call "
                                      f"goes on (wait again to complete it)")
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self):
        return self.event.is_set()


class _Worker:
    """One thread per group that runs its asynchronous collectives in the order they were issued, so
    that they progress while the caller goes on (DDP's gradient buckets during the backward pass) and
    their Works and futures complete without the caller. A blocking call on the group first waits for
    the queue to empty: a group's collectives never run on two threads at once."""

    def __init__(self, name):
        self.lock = threading.Lock()
        self._ready = threading.Condition(self.lock)
        self._queue = collections.deque()
        self.pending = 0   # queued or running
        self.most_pending = 0         # the most calls queued or running at once
        self.handed_out_running = 0   # futures handed out before their call had finished
        self.thread = threading.Thread(target=self._loop, name=f"pydist-torch {name}", daemon=True)
        self.thread.start()
        atexit.register(self.drain)   # before MPI_Finalize (registered earlier, so run later)

    def submit(self, what, run, result, arrays):
        work = _Work(_Queued(run, what, self), result, arrays)
        with self.lock:
            self._queue.append(work)
            self.pending += 1
            self.most_pending = max(self.most_pending, self.pending)
            self._ready.notify_all()
        return work

    def drain(self):
        if pd._C.parent_rank() is not None:
            return   # a forked child: the thread that would empty the queue stayed in the parent
        with self.lock:
            while self.pending:
                self._ready.wait()

    def _loop(self):
        pd._C.timeline_thread_name(self.thread.name)   # its calls' track in a timeline
        while True:
            with self.lock:
                while not self._queue:
                    self._ready.wait()
                work = self._queue.popleft()
            queued = work._work
            try:
                queued.run()
                work._finish()
            except BaseException as e:   # the caller's wait (or DDP, through the future) raises it
                queued.error = work._error = e
            with self.lock:
                queued.finished = True
                base = work._base
                self.pending -= 1
                self._ready.notify_all()
            if base is not None:
                base.set_result(None)
            queued.event.set()


class ProcessGroupPydist(tdist.ProcessGroup):
    """torch's ProcessGroup over a pydist group: pydist's default group for torch's default group, and
    for every other torch group (one of the whole world included) a pydist group of its own, made
    members-only. Two torch groups never share one: each has its worker thread, and two threads on one
    pydist group (its communicator, its shared-memory channel) would mix their collectives."""

    def __init__(self, rank, size, global_ranks, default=False):
        super().__init__(rank, size)
        self._ranks = list(global_ranks)
        self._worker = None   # started at the first asynchronous collective
        self._backward = None   # recording a timeline: [graph task id, buckets so far, first bucket's clock]
        if default:
            self._group = None
        else:
            self._group = pd.ProcessGroup(pd._C.new_group(self._ranks, True), self._ranks)
            pd._subgroups.add(self._group)

    def shutdown(self):
        """torch's destroy_process_group: frees this group's own pydist group (not while its worker still
        runs calls: a collective some rank never joined must not lose its communicator). torch's
        default group leaves pydist's default group alone: MPI stays up for a later init."""
        if self._group is not None and self._group._handle > 0 and \
                (self._worker is None or not self._worker.pending):
            pd.destroy_process_group(self._group)

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

    def _issue(self, what, opts, run, result, arrays):
        """run() (the pydist calls, blocking) here when torch waits at once, returning one shared done
        Work (making a Work costs more than a small call); else on the group's worker thread."""
        if opts is not None and not opts.asyncOp:
            self._quiet()
            run()
            for a in arrays:
                a.back()
            return _DONE
        if self._worker is not None and threading.current_thread() is self._worker.thread:
            # Issued from a future's callback, which runs on this worker as it completes a call (torch's
            # PowerSGD hook all-reduces there and waits): queued, it would wait for the thread waiting
            # for it. It runs here, right after the call whose callback issued it, on every rank alike.
            run()
            return _Work(None, result, arrays)
        if self._worker is None:
            self._worker = _Worker(self.getGroupName() or str(self._ranks))
        return self._worker.submit(what, run, result, arrays)

    def _traced_bucket(self, run, nbytes, index=None):
        """run, recorded as a "bucket all_reduce" span when issued inside a backward pass (see the
        module's docstring), the pass itself as "backward" once its graph ends. Only while recording."""
        task = torch._C._current_graph_task_id()
        if task < 0:
            return run   # not from a backward pass: not a bucket
        b = self._backward
        if b is None or b[0] != task:
            b = self._backward = [task, 0, _timeline.clock()]
            torch.autograd.Variable._execution_engine.queue_callback(functools.partial(_backward_done, b))
        index = b[1] if index is None else index
        b[1] += 1

        def traced():
            t0 = _timeline.clock()
            try:
                run()
            finally:
                _timeline.event("bucket all_reduce", t0, _timeline.clock(), cat="torch", bucket=index, bytes=nbytes)
        return traced

    def _quiet(self):
        """Before a call that does not go through _issue: the worker's earlier collectives first."""
        if self._worker is not None and self._worker.pending:
            self._worker.drain()

    # collectives --------------------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        # The common blocking call on one plain tensor of the default group, straight to pydist's C
        # (a few us less than the general path: it is what torch.distributed.all_reduce(t) costs on
        # top of pydist).
        if opts is not None and not opts.asyncOp and len(tensors) == 1 and self._group is None and \
                (self._worker is None or not self._worker.pending) and not pd._calls_checked:
            t = tensors[0]
            if t.__class__ is torch.Tensor and t.dtype in _NUMPY_DTYPES and t.is_contiguous() and \
                    not t.requires_grad and t.is_cpu:
                op = _OP_BY_HASH.get(hash(opts.reduceOp))
                if op is not None:
                    pd._C.all_reduce(t.numpy(), op, 0, False)
                    return _DONE
        if any(t.layout is torch.sparse_coo for t in tensors):
            return self._sparse_allreduce(tensors, opts)
        op = _op(opts.reduceOp if opts is not None else tdist.ReduceOp.SUM, "all_reduce")
        arrays = [_Array(t, "all_reduce", reduce=True) for t in tensors]
        group = self._group

        def run():
            for a in arrays:
                pd.all_reduce(a.array, op, group=group)
        if _timeline._active is not None and (opts is None or opts.asyncOp) and tensors and \
                tensors[0].is_floating_point():   # a gradient bucket (DDP's map of used parameters is int)
            run = self._traced_bucket(run, sum(t.numel() * t.element_size() for t in tensors))
        return self._issue("all_reduce", opts, run, tensors, arrays)

    def _sparse_allreduce(self, tensors, opts):
        """The sum of sparse COO tensors, as gloo's: every rank's (indices, values) gathered, padded to
        the largest count, then coalesced (duplicates summed) into each tensor, in place. Every rank
        coalesces the same entries in the same rank order, so every rank gets bitwise the same sum."""
        if opts is not None and opts.reduceOp != tdist.ReduceOp.SUM:
            name = next((ours.name for theirs, ours in _OPS if opts.reduceOp == theirs), "PREMUL_SUM")
            raise ValueError(f"all_reduce(): sparse tensors are summed only (ReduceOp.SUM), as gloo does; "
                             f"got ReduceOp.{name}")
        for t in tensors:
            if t.layout is not torch.sparse_coo or not t.is_cpu:
                raise TypeError("all_reduce(): a list of sparse tensors must hold CPU sparse COO tensors only; "
                                f"got a {t.layout} tensor on {t.device}")
        group, size = self._group, len(self._ranks)

        def gathered(array, width):
            """Every rank's `array`, its last axis padded to `width`: (ranks, *array.shape[:-1], width)."""
            padded = torch.zeros(array.shape[:-1] + (width,), dtype=array.dtype)
            padded[..., :array.shape[-1]] = array
            out = torch.empty((size,) + tuple(padded.shape), dtype=array.dtype)
            pd.all_gather_into_tensor(_Array(out, "all_reduce").array.reshape(-1),
                                      _Array(padded, "all_reduce").array.reshape(-1), group=group)
            return out

        def run():
            for t in tensors:
                local = t.detach().coalesce()
                indices, values = local.indices(), local.values()
                nnz = torch.tensor([indices.shape[1]], dtype=torch.int64)
                counts_t = torch.empty(size, dtype=torch.int64)
                pd.all_gather_into_tensor(counts_t.numpy(), nnz.numpy(), group=group)
                counts = counts_t.tolist()
                all_indices = gathered(indices, max(counts))
                # values: nnz first; moved last to pad it, and back
                all_values = gathered(values.movedim(0, -1).contiguous(), max(counts)).movedim(-1, 1)
                idx = torch.cat([all_indices[r, :, :counts[r]] for r in range(size)], dim=1)
                val = torch.cat([all_values[r, :counts[r]] for r in range(size)], dim=0)
                total = torch.sparse_coo_tensor(idx, val, local.shape).coalesce()
                with torch.no_grad():
                    t.copy_(total)
        return self._issue("all_reduce", opts, run, tensors, [])

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        root = self._global(opts.rootRank if opts is not None else 0, "broadcast", "src")
        arrays = [_Array(t, "broadcast") for t in tensors]
        group = self._group

        def run():
            for a in arrays:
                pd.broadcast(a.array, root, group=group)
        return self._issue("broadcast", opts, run, tensors, arrays)

    def reduce(self, tensors, opts=None):
        op = _op(opts.reduceOp, "reduce")
        root = self._global(opts.rootRank, "reduce", "dst")
        arrays = [_Array(t, "reduce", reduce=True) for t in tensors]
        group = self._group

        def run():
            for a in arrays:
                pd.reduce(a.array, root, op, group=group)
        return self._issue("reduce", opts, run, tensors, arrays)

    def allgather(self, output_tensors, input_tensors, opts=None):
        (outs,), (inp,) = output_tensors, input_tensors
        src = _Array(inp, "all_gather", arg="tensor")
        dst = [_Array(t, "all_gather", arg="tensor_list") for t in outs]
        return self._issue("all_gather", opts, lambda: pd.all_gather([d.array for d in dst], src.array,
                                                                     group=self._group), output_tensors, dst)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """torch.distributed.all_gather_coalesced: output_lists[r][i] receives group rank r's
        input_list[i], for tensors of any shapes (each index one all-gather)."""
        if len(output_lists) != len(self._ranks):
            raise ValueError(f"all_gather_coalesced(): `output_tensor_lists` must hold one list per rank of the "
                             f"group ({len(self._ranks)}); got {len(output_lists)}")
        for outs in output_lists:
            if len(outs) != len(input_list):
                raise ValueError(f"all_gather_coalesced(): each list of `output_tensor_lists` must hold one tensor "
                                 f"per input tensor ({len(input_list)}); got {len(outs)}")
        src = [_Array(t, "all_gather_coalesced", arg="input_tensor_list") for t in input_list]
        dst = [[_Array(t, "all_gather_coalesced", arg="output_tensor_lists") for t in outs] for outs in output_lists]
        group = self._group

        def run():
            for i, s in enumerate(src):
                pd.all_gather([row[i].array for row in dst], s.array, group=group)
        return self._issue("all_gather_coalesced", opts, run, output_lists, [a for row in dst for a in row])

    def all_gather_single(self, output, input, opts=None):
        return self.all_gather_single_coalesced([output], [input], opts)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        # torch's functional all_gather_into_tensor (DTensor, tensor parallel, DCP) comes here, even for
        # one tensor: without it torch's own fallback looks for a C++ backend and fails.
        if len(outputs) != len(inputs):
            raise ValueError(f"all_gather_into_tensor_coalesced(): {len(outputs)} outputs for {len(inputs)} inputs")
        dst = [_Array(t, "all_gather_into_tensor", arg="output_tensor") for t in outputs]
        src = [_Array(t, "all_gather_into_tensor", arg="input_tensor") for t in inputs]

        def run():
            for d, s in zip(dst, src):
                pd.all_gather_into_tensor(d.array.reshape(-1), s.array.reshape(-1), group=self._group)
        return self._issue("all_gather_into_tensor", opts, run, outputs, dst)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_tensors, input_tensors, opts=None):
        root = self._global(opts.rootRank, "gather", "dst")
        (inp,) = input_tensors
        src = _Array(inp, "gather")
        dst = [_Array(t, "gather", arg="gather_list") for t in output_tensors[0]] if output_tensors else []
        return self._issue("gather", opts, lambda: pd.gather(src.array, [d.array for d in dst] if dst else None,
                                                             root, group=self._group), output_tensors, dst)

    def scatter(self, output_tensors, input_tensors, opts=None):
        root = self._global(opts.rootRank, "scatter", "src")
        (out,) = output_tensors
        dst = _Array(out, "scatter")
        src = [_Array(t, "scatter", arg="scatter_list") for t in input_tensors[0]] if input_tensors else []
        return self._issue("scatter", opts, lambda: pd.scatter(dst.array, [s.array for s in src] if src else None,
                                                               root, group=self._group), output_tensors, [dst])

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op = _op(opts.reduceOp, "reduce_scatter")
        (out,), (ins,) = output_tensors, input_tensors
        dst = _Array(out, "reduce_scatter", reduce=True, arg="output")
        src = [_Array(t, "reduce_scatter", reduce=True, arg="input_list") for t in ins]
        return self._issue("reduce_scatter", opts,
                           lambda: pd.reduce_scatter(dst.array, [s.array for s in src], op, group=self._group),
                           output_tensors, [dst])

    def reduce_scatter_single(self, output, input, opts=None):
        return self.reduce_scatter_single_coalesced([output], [input], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        # torch's functional reduce_scatter_tensor (DTensor's Partial -> Shard) comes here.
        if len(outputs) != len(inputs):
            raise ValueError(f"reduce_scatter_tensor_coalesced(): {len(outputs)} outputs for {len(inputs)} inputs")
        op = _op(opts.reduceOp if opts is not None else tdist.ReduceOp.SUM, "reduce_scatter_tensor")
        dst = [_Array(t, "reduce_scatter_tensor", reduce=True, arg="output") for t in outputs]
        src = [_Array(t, "reduce_scatter_tensor", reduce=True, arg="input") for t in inputs]

        def run():
            for d, s in zip(dst, src):
                pd.reduce_scatter_tensor(d.array.reshape(-1), s.array.reshape(-1), op, group=self._group)
        return self._issue("reduce_scatter_tensor", opts, run, outputs, dst)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        dst = _Array(output, "all_to_all_single", arg="output")
        src = _Array(input, "all_to_all_single", arg="input")
        # Split sizes count rows of dim 0, in torch and in pydist alike.
        out_splits, in_splits = list(output_split_sizes) or None, list(input_split_sizes) or None
        return self._issue("all_to_all_single", opts,
                           lambda: pd.all_to_all_single(dst.array, src.array, out_splits, in_splits,
                                                        group=self._group), [output], [dst])

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        # torch's blocks may differ in size: one all_to_all_single on flat copies, split sizes in elements
        dst = [_Array(t, "all_to_all", arg="output_tensor_list") for t in output_tensors]
        src = [_Array(t, "all_to_all", arg="input_tensor_list") for t in input_tensors]
        packed = _Packed(dst)
        flat_in = torch.cat([torch.from_numpy(s.array).reshape(-1) for s in src]) if src else None
        return self._issue("all_to_all", opts,
                           lambda: pd.all_to_all_single(packed.copy.numpy(), flat_in.numpy(),
                                                        [d.array.size for d in dst], [s.array.size for s in src],
                                                        group=self._group), output_tensors, [packed])

    def barrier(self, opts=None):
        return self._issue("barrier", opts, lambda: pd.barrier(group=self._group), [], [])

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """pydist's monitored barrier (torch's own front refuses every backend but gloo: see
        monitored_barrier below). `timeout`: a timedelta, or barrier options carrying one."""
        timeout = getattr(timeout, "timeout", timeout)
        if isinstance(timeout, datetime.timedelta) and timeout.total_seconds() < 0:
            timeout = None   # torch's "unset" (BarrierOptions' -1 ms); 0 is no time at all
        self._quiet()
        pd.monitored_barrier(group=self._group, timeout=timeout, wait_all_ranks=wait_all_ranks)

    # point to point -----------------------------------------------------------------------------

    def send(self, tensors, dst, tag=0):
        (t,) = tensors
        a = _Array(t, "send")
        return _Work(pd.isend(a.array, self._global(dst, "send", "dst"), group=self._group, tag=tag), tensors)

    def recv(self, tensors, src, tag=0):
        (t,) = tensors
        a = _Array(t, "recv")
        work = pd.irecv(a.array, self._global(src, "recv", "src"), group=self._group, tag=tag)
        return _Work(work, tensors, [a], source=lambda: src)

    def recv_anysource(self, tensors, tag=0):
        (t,) = tensors
        a = _Array(t, "recv")
        work = pd.irecv(a.array, None, group=self._group, tag=tag)
        return _Work(work, tensors, [a], source=lambda: self._ranks.index(work.source_rank()))


_DONE = _Work(None, [])


def _backward_done(b):
    """The autograd callback at the end of a backward pass that issued buckets (b: see _traced_bucket)."""
    _timeline.event("backward", b[2], _timeline.clock(), cat="torch", buckets=b[1])


# ---------------------------------------------------------------------------------------------------
# Creation and rendezvous

_default_groups_made = 0   # torch default groups made in this process (init_process_group calls)


def _create(options, backend_options=None):
    """torch's creator (extended_api): the default group (no ranks listed: the world) or a new_group.

    torch's first default group is pydist's default group. A later one (init_process_group again after
    destroy_process_group) is a communicator of its own, made members-only as a new_group is: the first
    may have been broken by a timed-out collective, and torch promises a working group after a new
    init. Every rank makes the same number of init calls, so every rank decides alike."""
    global _default_groups_made
    if not pd.is_initialized():
        pd.init_process_group(timeout=options.timeout)
    default = not options.global_ranks_in_group
    ranks = list(options.global_ranks_in_group) or list(range(pd.get_world_size()))
    fresh = not default or _default_groups_made > 0
    if default:
        _default_groups_made += 1
        if not fresh:
            _check_world(options.group_rank, options.group_size)
        # torch's init_process_group(timeout=...) bounds every pydist wait from now on (MPI was started
        # at import, before torch had a timeout to give).
        pd._set_default_timeout(options.timeout.total_seconds())
    if fresh:
        # Only the members get here (torch returns early on the others; all of them for a group of the
        # whole world): wait until all have arrived, through the store and with its timeout, before
        # MPI's blocking members-only creation.
        options.store.add("pydist_arrived", 1)
        deadline = time.monotonic() + options.timeout.total_seconds()
        while options.store.add("pydist_arrived", 0) < len(ranks):
            if time.monotonic() > deadline:
                raise pd.DistTimeoutError(f"new_group(): not every member of {ranks} arrived within "
                                          f"{options.timeout}")
            time.sleep(0.001)
    pg = ProcessGroupPydist(options.group_rank, options.group_size, ranks, default=not fresh)
    if default and fresh:
        try:
            _check_world(options.group_rank, options.group_size, pg._group)
        except ValueError:
            pd.destroy_process_group(pg._group)
            raise
    if not default:   # torch's new_group(timeout=...) (default: torch's 30 minutes) bounds this group's waits
        pd._C.set_group_timeout(pg._group._handle, options.timeout.total_seconds())
    return pg


def _check_world(torch_rank, torch_size, group=None):
    """The default group's rank and size as torch was told them (arguments, RANK and WORLD_SIZE, a
    store) must be MPI's, which every pydist call uses: processes that torch's spawn or torchrun
    started are each an MPI world of one, and would sum alone and return a wrong result without a
    word. Every rank gathers every rank's view (one all-gather over MPI's world), so a mismatch on any
    rank is the same ValueError on all of them and none goes on to wait for the others."""
    size = pd.get_world_size()
    views = [None] * size
    pd.all_gather_object(views, (torch_rank, torch_size), group=group)
    wrong = [(r, view) for r, view in enumerate(views) if view != (r, size)]
    if not wrong:
        return
    r, (told_rank, told_size) = wrong[0]
    alone = " (each process is an MPI world of one: processes started by torch's spawn, torchrun or by " \
        "hand share no MPI world)" if size == 1 and told_size > 1 else ""
    raise ValueError(
        f"init_process_group(backend=\"pydist\"): torch was told rank {told_rank} of {told_size} where MPI "
        f"started rank {r} of {size}{alone}; pydist's ranks are MPI's. Start the job with "
        f"mpiexec -n {told_size} (or python -m pydist.run -n {told_size}) and leave rank, world_size and "
        f"the store to pydist, or pass MPI's own")


_torch_monitored_barrier = tdist.monitored_barrier


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """``torch.distributed.monitored_barrier`` that also runs on pydist groups. torch 2.13's own
    refuses every backend but gloo before it reaches the group; importing pydist.torch puts this one
    in its place, and it hands every other group to torch's."""
    pg = tdist.distributed_c10d._get_default_group() if group is None or group is tdist.GroupMember.WORLD \
        else group
    if not isinstance(pg, ProcessGroupPydist):
        return _torch_monitored_barrier(group, timeout, wait_all_ranks)
    return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


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
    if "RANK" in os.environ or tdist.is_initialized() or pd._child_reason("import pydist.torch") is not None:
        return   # (a child made from a rank: its init_process_group raises why)
    if not pd.is_initialized():
        pd.init_process_group()
    address, port = _master()
    os.environ.setdefault("MASTER_ADDR", address)
    os.environ.setdefault("MASTER_PORT", str(port))
    os.environ["RANK"] = str(pd.get_rank())
    os.environ["WORLD_SIZE"] = str(pd.get_world_size())
    os.environ.setdefault("LOCAL_RANK", os.environ.get("MPI_LOCALRANKID", "0"))


# TORCH_DISTRIBUTED_DEBUG=DETAIL: torch wraps gloo's and NCCL's groups to compare every rank's call
# before it runs; a Python ProcessGroup such as ours is never wrapped, so pydist's own check
# (PYDIST_DEBUG=DETAIL, pydist/debug.py: the same fingerprint of operation, dtype, shape, root and op)
# does it, and a mismatch is a ValueError on every rank of the group.
if tdist.get_debug_level() == tdist.DebugLevel.DETAIL:
    pd._check_calls()
if getattr(tdist.monitored_barrier, "__module__", None) != __name__:   # not again on a reload
    tdist.monitored_barrier = tdist.distributed_c10d.monitored_barrier = monitored_barrier
if BACKEND.upper() not in tdist.Backend._plugins:
    tdist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
try:
    tdist.register_rendezvous_handler("pydist", _pydist_rendezvous)
except RuntimeError:
    pass   # imported again (a reload): registered already
_fill_env()

from . import torch_hooks as hooks   # noqa: E402 (pydist.torch.hooks: the compressors as DDP comm hooks)
hooks._GROUP_TYPE = ProcessGroupPydist
sys.modules[__name__ + ".hooks"] = hooks
