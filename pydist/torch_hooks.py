"""pydist's gradient compressors as DDP communication hooks (``pydist.torch.hooks``).

Each hook compresses a DDP gradient bucket in C (pydist/_C.Compressor over csrc/compress/: the same
compressors as ``Trainer(compression=...)``), sums it over a pydist group with error feedback (what a
step does not send, a later step does), and averages it, as DDP expects::

    import pydist.torch
    from pydist.torch import hooks
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(None, hooks.powersgd(rank=4))   # state: None (the default group) or a group

The hooks: ``fp16()`` and ``bf16()`` (16-bit values, summed in float32: torch's fp16_compress_hook sums
in 16 bits), ``topk(ratio)``, ``sign()`` and ``powersgd(rank)`` (each weight matrix of the bucket as a
rank-K product, one power iteration warm-started from the last step's Q; vectors whole). ``state`` is
the torch process group to sum over, None for the default one; it must be a pydist group (a group of
``backend="pydist"``). The sum runs on that group's worker thread, so buckets overlap the backward pass.
Each bucket keeps its own residual, for the life of the hook.
"""
import math

import numpy as np
import torch
import torch.distributed as tdist

from . import _C
from . import timeline as _timeline

# pydist.torch's ProcessGroupPydist, set by pydist.torch as it imports this module (pydist.torch.hooks): this
# module sits below it
_GROUP_TYPE = None


def _pydist_group(state, hook):
    """The torch process group the hook sums over: a ProcessGroupPydist."""
    group = tdist.group.WORLD if state is None else state
    if _GROUP_TYPE is None or not isinstance(group, _GROUP_TYPE):
        raise ValueError(f"pydist.torch.hooks.{hook}: `state` must be None or a process group of backend "
                         f"\"pydist\" (the compressors sum over pydist); got {type(group).__name__}")
    return group


class _Hook:
    """A DDP comm hook: hook(state, bucket) -> Future[Tensor], the bucket's average over the group."""

    def __init__(self, spec):
        _C.Compressor(spec, 0)   # a malformed spec fails here, not at the first backward pass
        self.spec = spec
        self._compressors = {}   # (group, bucket index) -> (its layout, its Compressor and residual)
        self.__name__ = self.__qualname__ = f"pydist_{spec.split(':')[0]}_hook"   # DDP logs it

    def _compressor(self, group, bucket, n):
        """The bucket's Compressor. DDP rebuilds its buckets after the first iteration (another order of
        the gradients in a bucket): a bucket whose layout changed starts again with a zero residual."""
        # each weight's gradient, where it lies in the bucket's buffer (DDP orders a bucket its own way)
        base, size = bucket.buffer().data_ptr(), bucket.buffer().element_size()
        matrices = tuple(sorted(((g.data_ptr() - base) // size, g.shape[0], g.numel() // g.shape[0])
                                for g in bucket.gradients() if g.dim() >= 2 and g.is_contiguous()))
        key = (id(group), bucket.index())
        layout, z = self._compressors.get(key, (None, None))
        if layout != (n, matrices):
            z = _C.Compressor(self.spec, n, matrices)
            self._compressors[key] = ((n, matrices), z)
        return z

    def __call__(self, state, bucket):
        group = _pydist_group(state, self.__name__)
        tensor = bucket.buffer()
        if tensor.dtype != torch.float32 or not tensor.is_contiguous() or tensor.device.type != "cpu":
            raise ValueError(f"pydist.torch.hooks: compresses float32 CPU gradients; got {tensor.dtype} on "
                             f"{tensor.device}")
        z = self._compressor(group, bucket, tensor.numel())
        handle = 0 if group._group is None else group._group._handle
        size = group.size()
        array = tensor.numpy()

        def run():
            z.allreduce_sum(array, handle, False)
            np.divide(array, np.float32(size), out=array)   # DDP's buckets hold the mean
        if _timeline._active is not None:
            run = group._traced_bucket(run, array.nbytes, bucket.index())
        return group._issue(f"{self.__name__} (bucket {bucket.index()})", None, run, tensor, ()).get_future()


def fp16():
    """Gradients as float16 (saturating at +-65504; the residual keeps the rest), summed in float32."""
    return _Hook("fp16")


def bf16():
    """Gradients as bfloat16, summed in float32."""
    return _Hook("bf16")


def topk(ratio):
    """The fraction `ratio` (0 < ratio <= 1) of each bucket's entries largest in magnitude."""
    if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not 0 < ratio <= 1 or \
            not math.isfinite(ratio):
        raise ValueError(f"pydist.torch.hooks.topk(): `ratio` must be in (0, 1]; got {ratio!r}")
    return _Hook(f"topk:{float(ratio)!r}")


def sign():
    """One bit per entry and a scale per 256 entries (their mean magnitude)."""
    return _Hook("sign")


def powersgd(rank=1):
    """PowerSGD (Vogels et al. 2019) of rank `rank`: each weight matrix in a bucket as P Q^T."""
    if not isinstance(rank, (int, np.integer)) or isinstance(rank, bool) or rank < 1:
        raise ValueError(f"pydist.torch.hooks.powersgd(): `rank` must be a positive int; got {rank!r}")
    return _Hook(f"powersgd:{int(rank)}")
