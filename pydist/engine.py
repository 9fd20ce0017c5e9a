"""The native training engine: models whose parameters live in one flat buffer, and a data-parallel
trainer whose whole step loop (forward, backward, gradient all-reduce, SGD update) runs in C.

    >>> import pydist as dist
    >>> from pydist.engine import Trainer, lenet5, load_fashion_mnist
    >>> dist.init_process_group(backend="mpi")          # under mpiexec -n R; without it: 1 rank
    >>> (x, y), (tx, ty) = load_fashion_mnist()
    >>> trainer = Trainer(lenet5(), lr=0.02, momentum=0.9, batch_size=64)
    >>> trainer.fit(x, y, epochs=5, test=(tx, ty))

Every rank holds the same weights: rank 0's initial weights are broadcast, each step each rank takes
its own disjoint part of a shared shuffle, the gradients are summed across ranks and divided by R,
and every rank applies the same update. R ranks with batch B therefore train exactly as one process
with batch R*B (tests/mpi/test_engine_dp.py checks it).
"""
import json
import math
import numbers
import os
import sys
import time
import warnings
from contextlib import nullcontext

import numpy as np

from . import _C
from . import _env
from . import distributed as dist
from . import run

__all__ = ["Linear", "Conv2d", "MaxPool2d", "ReLU", "Flatten", "Model", "lenet5", "mlp", "Trainer",
           "load_idx", "load_fashion_mnist", "DEFAULT_DATA_DIR", "STRATEGIES", "SCHEDULES", "layer_costs",
           "balanced_split", "step_flops"]

#: The folder :func:`load_fashion_mnist` reads by default, where Debian's ``dataset-fashion-mnist`` puts it.
DEFAULT_DATA_DIR = "/usr/share/datasets/fashion-mnist"   # Debian's dataset-fashion-mnist
_LINEAR, _CONV2D, _MAXPOOL2D, _RELU, _FLATTEN = range(5)  # csrc/engine/model.h LayerType


# ---------------------------------------------------------------------------------------------------
# Models

def _positive(name, **values):
    for key, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < (0 if key == "padding" else 1):
            raise ValueError(f"{name}: `{key}` must be a {'non-negative' if key == 'padding' else 'positive'} "
                             f"int, got {v!r}")


class Linear:
    """y = x W^T + b, W of shape (out_features, in_features), as torch.nn.Linear."""

    def __init__(self, in_features, out_features):
        _positive("Linear", in_features=in_features, out_features=out_features)
        self.in_features, self.out_features = in_features, out_features

    def spec(self):
        return (_LINEAR, self.in_features, self.out_features, 0, 0, 0)

    def __repr__(self):
        return f"Linear({self.in_features}, {self.out_features})"


class Conv2d:
    """2-D convolution, weight (out_channels, in_channels, k, k), as torch.nn.Conv2d (square kernel)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0):
        _positive("Conv2d", in_channels=in_channels, out_channels=out_channels, kernel_size=kernel_size,
                  stride=stride, padding=padding)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def spec(self):
        return (_CONV2D, self.in_channels, self.out_channels, self.kernel_size, self.stride, self.padding)

    def __repr__(self):
        return (f"Conv2d({self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding})")


class MaxPool2d:
    """Max pooling over k x k windows with stride k, as torch.nn.MaxPool2d(k)."""

    def __init__(self, kernel_size):
        _positive("MaxPool2d", kernel_size=kernel_size)
        self.kernel_size = kernel_size

    def spec(self):
        return (_MAXPOOL2D, 0, 0, self.kernel_size, self.kernel_size, 0)

    def __repr__(self):
        return f"MaxPool2d({self.kernel_size})"


class ReLU:
    """max(x, 0) elementwise, as torch.nn.ReLU."""

    def spec(self):
        return (_RELU, 0, 0, 0, 0, 0)

    def __repr__(self):
        return "ReLU()"


class Flatten:
    """(channels, height, width) to one vector per example, as torch.nn.Flatten."""

    def spec(self):
        return (_FLATTEN, 0, 0, 0, 0, 0)

    def __repr__(self):
        return "Flatten()"


class Model:
    """A list of layers applied in order to inputs of `input_shape` (channels, height, width), ending in
    class scores; the loss is log-softmax + negative log-likelihood (torch's cross_entropy)."""

    def __init__(self, layers, input_shape=(1, 28, 28), name="model"):
        layers = list(layers)
        bad = [l for l in layers if not hasattr(l, "spec")]
        if not layers or bad:
            raise TypeError(f"Model: layers must be a non-empty list of Linear, Conv2d, MaxPool2d, ReLU, Flatten; "
                            f"got {bad or layers!r}")
        if not isinstance(input_shape, (tuple, list)) or len(input_shape) != 3 or \
                not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in input_shape):
            raise ValueError(f"Model: input_shape must be (channels, height, width) of positive ints, "
                             f"got {input_shape!r}")
        self.layers, self.input_shape, self.name = layers, tuple(input_shape), name
        # Shape errors now, with the layer named; the check also counts the parameters.
        self.num_params = _C.Engine(self.specs(), self.input_shape, 1).num_params

    def specs(self):
        return [l.spec() for l in self.layers]

    def __repr__(self):
        inner = ",\n  ".join(repr(l) for l in self.layers)
        return f"Model({self.name}, input {self.input_shape}: [\n  {inner}\n])"


def lenet5(classes=10):
    """LeNet-5 of the classic tutorial, for 1 x 28 x 28 images: conv 6@5x5 pad 2, max-pool 2,
    conv 16@5x5, max-pool 2, fc 120, fc 84, fc classes, ReLU between (61,706 parameters)."""
    return Model([Conv2d(1, 6, 5, padding=2), ReLU(), MaxPool2d(2),
                  Conv2d(6, 16, 5), ReLU(), MaxPool2d(2), Flatten(),
                  Linear(16 * 5 * 5, 120), ReLU(), Linear(120, 84), ReLU(), Linear(84, classes)],
                 input_shape=(1, 28, 28), name="lenet5")


def mlp(hidden=(256, 128), classes=10, input_shape=(1, 28, 28)):
    """A multi-layer perceptron: Flatten, then Linear + ReLU per hidden width, then Linear to classes."""
    layers, width = [Flatten()], int(np.prod(input_shape))
    for h in hidden:
        layers += [Linear(width, h), ReLU()]
        width = h
    layers.append(Linear(width, classes))
    return Model(layers, input_shape=input_shape, name="mlp-" + "-".join(str(h) for h in hidden))


# ---------------------------------------------------------------------------------------------------
# Data

def load_idx(images_path, labels_path):
    """One IDX pair (gzip or raw) as (images float32 (n, rows, cols), normalised; labels int32 (n,))."""
    return _C.load_idx(os.fspath(images_path), os.fspath(labels_path))


def _find(folder, stem):
    for name in (stem + ".gz", stem, stem.replace("-idx", ".idx")):
        if os.path.exists(os.path.join(folder, name)):
            return os.path.join(folder, name)
    return os.path.join(folder, stem + ".gz")  # the error then names the file we wanted


def load_fashion_mnist(data_dir=None):
    """((train images, labels), (test images, labels)) from a folder of the four IDX files of
    Fashion-MNIST or MNIST, by default Debian's dataset-fashion-mnist."""
    folder = os.fspath(data_dir or DEFAULT_DATA_DIR)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"no data folder {folder}: install Debian's dataset-fashion-mnist "
                                f"(apt-get install -y dataset-fashion-mnist) or pass --data DIR with the four "
                                f"IDX files of Fashion-MNIST or MNIST")
    train = load_idx(_find(folder, "train-images-idx3-ubyte"), _find(folder, "train-labels-idx1-ubyte"))
    test = load_idx(_find(folder, "t10k-images-idx3-ubyte"), _find(folder, "t10k-labels-idx1-ubyte"))
    return train, test


# ---------------------------------------------------------------------------------------------------
# Strategies (csrc/strategies/): the options each takes, with their defaults

#: Every ``Trainer(strategy=...)``, mapped to the options it takes and their defaults (an option it
#: does not take is a ``ValueError``). The comments in pydist/engine.py say what each does.
STRATEGIES = {
    "allreduce": {},   # MPI's all-reduce of the gradients (the default)
    "ring": {},        # the same with our ring all-reduce
    "central": {},     # central storage: gradients to rank 0, which updates and sends the weights back
    "ps": {"servers": 1},   # the last `servers` ranks each own a shard of the weights and momentum
    "average": {"period": 4, "warmup": 0, "momentum_placement": "local"},   # local SGD, averaged every period
    "easgd": {"period": 4, "beta": 0.9},   # elastic averaging toward a center every period
    # Asynchronous (csrc/strategies/async.c): the last `servers` ranks hold the center, a shard each;
    # workers exchange with them every `window` steps and never wait for one another.
    "downpour": {"servers": 1, "window": 5, "deterministic": False},   # push the window's update, pull
    "adag": {"servers": 1, "window": 5, "deterministic": False},       # the same, the update / window
    "aeasgd": {"servers": 1, "window": 5, "beta": 0.9, "deterministic": False},   # asynchronous elastic
    "dynsgd": {"servers": 1, "window": 5, "deterministic": False},     # each push / (staleness + 1)
    # Model parallelism (csrc/strategies/pipeline.c): the layers split into `stages` (default: every
    # rank a stage) balanced by FLOPs unless `split` names the first layer of each stage after the first;
    # R = stages x replicas; each batch in `micro_batches`, scheduled "gpipe" or "1f1b".
    "pipeline": {"stages": None, "micro_batches": 4, "schedule": "1f1b", "split": None},
}
ASYNC = ("downpour", "adag", "aeasgd", "dynsgd")
# Every worker holds the whole model (all but the pipeline): the strategies benchmarks/strategies.py compares.
DATA_PARALLEL = tuple(s for s in STRATEGIES if s != "pipeline")
_PLACEMENTS = ("local", "average", "reset")   # csrc/strategies/strategy.h MomentumPlacement
#: The pipeline strategy's schedules (``Trainer(strategy="pipeline", schedule=...)``).
SCHEDULES = ("gpipe", "1f1b")                 # csrc/strategies/strategy.h PipelineSchedule
# The weights each strategy evaluates and checkpoints (Trainer.weights()).
EVALUATES = {"average": "the workers' average", "easgd": "the center", **{k: "the center" for k in ASYNC},
             "pipeline": "the stages' slices, gathered"}


def _strategy_options(strategy, given):
    """The strategy's options: its defaults, overridden by those given; an option it does not take is
    an error, never silently ignored."""
    if not isinstance(strategy, str) or strategy not in STRATEGIES:
        raise ValueError(f"Trainer: `strategy` must be one of {', '.join(STRATEGIES)}; got {strategy!r}")
    options = dict(STRATEGIES[strategy])
    for name, value in given.items():
        if value is None:
            continue
        if name not in options:
            takers = [k for k, v in STRATEGIES.items() if name in v]
            raise ValueError(f"Trainer: strategy {strategy!r} does not take `{name}` (only {', '.join(takers)} "
                             f"do{'es' if len(takers) == 1 else ''})")
        options[name] = value
    for name in ("servers", "period", "warmup", "window", "stages", "micro_batches"):
        if name in options and options[name] is not None:
            v, least = options[name], 0 if name == "warmup" else 1
            if not isinstance(v, numbers.Integral) or isinstance(v, bool) or not least <= v < 2**31:
                raise ValueError(f"Trainer: `{name}` must be an int >= {least}; got {v!r}")
            options[name] = int(v)
    if options.get("momentum_placement", "local") not in _PLACEMENTS:
        raise ValueError(f"Trainer: `momentum_placement` must be one of {', '.join(_PLACEMENTS)}; got "
                         f"{options['momentum_placement']!r}")
    if "beta" in options:
        b = options["beta"]
        if not isinstance(b, numbers.Real) or isinstance(b, bool) or not 0 <= b <= 1:
            raise ValueError(f"Trainer: `beta` must be a number in [0, 1]; got {b!r}")
        options["beta"] = float(b)
    if options.get("schedule", "gpipe") not in SCHEDULES:
        raise ValueError(f"Trainer: `schedule` must be one of {', '.join(SCHEDULES)}; got {options['schedule']!r}")
    if options.get("split") is not None:
        split = options["split"]
        if isinstance(split, (str, bytes)) or not hasattr(split, "__iter__") or not all(
                isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in split):
            raise ValueError(f"Trainer: `split` must be a list of layer indices (each stage's first layer after the "
                             f"first stage's); got {split!r}")
        options["split"] = [int(v) for v in split]
    if "deterministic" in options:
        if not isinstance(options["deterministic"], (bool, np.bool_)):
            raise ValueError(f"Trainer: `deterministic` must be a bool; got {options['deterministic']!r}")
        options["deterministic"] = bool(options["deterministic"])
    return options


def layer_costs(model):
    """Each layer's floating-point operations per example, forward and backward (multiply-adds count
    2). A Linear or Conv2d layer's backward computes its weights' gradient (as many operations as its
    forward) and, when a layer before it has parameters, its input's (as many again); another layer's
    backward costs what its forward does, and nothing before the first layer with parameters, whose
    input gradient nobody needs (the MLP's leading Flatten)."""
    flops = _C.Engine(model.specs(), model.input_shape, 1).layer_flops
    costs, params_before = [], False
    for f, spec in zip(flops, model.specs()):
        has_params = spec[0] in (_LINEAR, _CONV2D)
        backward = (2 if params_before else 1) * f if has_params else (f if params_before else 0)
        costs.append(f + backward)
        params_before = params_before or has_params
    return costs


def step_flops(model, batch):
    """Floating-point operations of one training step's forward and backward on `batch` examples
    (layer_costs summed; the update's few operations per parameter are left out)."""
    return sum(layer_costs(model)) * batch


def balanced_split(costs, stages):
    """The boundaries [0, b1, ..., len(costs)] of `stages` contiguous, non-empty groups of layers whose
    largest total cost is as small as it can be (a pipeline runs at the pace of its slowest stage);
    among those, the most even (the smallest sum of squared stage costs)."""
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"pipeline: {stages} stages for a model of {n} layers (each stage needs one)")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    # best[q][i]: (largest stage, sum of squares) of the best split of layers [0, i) into q stages;
    # cut[q][i]: where its last stage begins
    inf = (float("inf"), float("inf"))
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = (0.0, 0.0)
    for q in range(1, stages + 1):
        for i in range(q, n + 1):
            for j in range(q - 1, i):
                c = prefix[i] - prefix[j]
                cand = (max(best[q - 1][j][0], c), best[q - 1][j][1] + c * c)
                if cand < best[q][i]:
                    best[q][i], cut[q][i] = cand, j
    bounds, i = [n], n
    for q in range(stages, 0, -1):
        i = cut[q][i]
        bounds.append(i)
    return bounds[::-1]


# ---------------------------------------------------------------------------------------------------
# Trainer

class _Progress:
    """tqdm on rank 0 when it is installed, else a plain line every 10%. It starts at `initial` steps
    (a run resumed mid-epoch) and shows a loss only once `update` has a real one."""

    def __init__(self, total, desc, enabled, initial=0):
        self.total, self.desc, self.enabled, self.done = total, desc, enabled, initial
        self.next_tenth = initial * 10 // max(total, 1) + 1   # the plain line at the next 10% after `initial`
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm
                # A frame per update (one per chunk of steps, so a few a second at most), each with its loss.
                self.bar = tqdm(total=total, initial=initial, desc=desc, unit="step", leave=False, file=sys.stderr,
                                mininterval=0, miniters=1)
            except ImportError:
                pass

    def update(self, n, loss):
        self.done += n
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)   # drawn by update(): one frame
            self.bar.update(n)
        elif self.enabled and self.done * 10 >= self.next_tenth * self.total:
            print(f"{self.desc}: {self.done}/{self.total} steps, loss {loss:.4f}", file=sys.stderr, flush=True)
            self.next_tenth = self.done * 10 // self.total + 1

    def close(self):
        if self.bar is not None:
            self.bar.close()


def _append(path, text):
    """Append to the metrics file, never through a link planted at its name (O_NOFOLLOW: ELOOP)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    with os.fdopen(fd, "a") as f:
        f.write(text)


class Trainer:
    """Data-parallel SGD over the default process group (or `group`); alone when pydist is not
    initialized. `batch_size` is per worker: the global batch is batch_size x workers.

    SGD is torch.optim.SGD's: momentum, dampening, weight_decay, nesterov mean what they mean there.

    `strategy` says how the ranks cooperate (see STRATEGIES and docs/guides/strategies.md):
    "allreduce" (default), "ring", "central", "ps" (`servers`), "average" (`period`, `warmup`,
    `momentum_placement`), "easgd" (`period`, `beta`); asynchronous, with `servers`, `window` and
    `deterministic` (serve the workers in a fixed round-robin: bitwise repeatable): "downpour", "adag",
    "aeasgd" (also `beta`; with momentum its workers use Nesterov's, EAMSGD), "dynsgd". Model
    parallelism: "pipeline" (`stages`, default every rank; `micro_batches`, default 4; `schedule`
    "gpipe" or "1f1b"; `split`, the first layer of each later stage, else balanced by FLOPs): R =
    stages x replicas, `batch_size` is then per replica. An option the strategy does not take is a
    ValueError. `slow_rank`/`slow_ms` make one rank sleep `slow_ms` ms per step (a straggler).

    `compression` sends what the strategy sends compressed, in C, with error feedback (what one exchange
    does not send, a later one does): the gradients (allreduce, ring, central, ps), the pushed updates
    (downpour, adag, dynsgd), the weights' differences (average, easgd, aeasgd; average's warm-up steps
    go whole). "fp16" or "bf16" (16-bit values, summed in float32), "topk:R" (the fraction R of entries
    largest in magnitude), "sign" (one bit per entry and a scale per 256), "powersgd:K" (each weight
    matrix as a rank-K product; biases whole). None: no compression. The bytes each step sends are in
    the step's figures (`bytes_sent`); checkpoints keep every rank's residual.

    `survive` (the asynchronous strategies; default: PYDIST_SURVIVE=1, which `python -m pydist.run
    --survive` sets): a worker that dies during training ends nothing. Its servers hand its unfinished
    block to the others, and at the end of the chunk fit() goes on with the ranks left (a new group, every
    worker from the center, the smaller global batch): docs/guides/fault-tolerance.md.
    """

    def __init__(self, model, lr=0.02, momentum=0.9, weight_decay=0.0, dampening=0.0, nesterov=False,
                 batch_size=64, seed=0, group=None, blas_threads=None, strategy="allreduce", servers=None,
                 period=None, warmup=None, momentum_placement=None, beta=None, window=None, deterministic=None,
                 stages=None, micro_batches=None, schedule=None, split=None, slow_rank=None, slow_ms=None,
                 compression=None, survive=None):
        if not isinstance(model, Model):
            raise TypeError(f"Trainer: `model` must be a pydist.engine.Model, got {type(model).__name__}")
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"Trainer: `batch_size` must be a positive int, got {batch_size!r}")
        for name, v in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay),
                        ("dampening", dampening)):
            if not isinstance(v, numbers.Real) or isinstance(v, bool):
                raise TypeError(f"Trainer: `{name}` must be a real number, got {type(v).__name__}")
            if not math.isfinite(v):
                raise ValueError(f"Trainer: `{name}` must be finite, got {v!r}")
        if not lr > 0 or momentum < 0 or weight_decay < 0 or not 0 <= dampening <= 1:
            raise ValueError(f"Trainer: need lr > 0, momentum >= 0, weight_decay >= 0, 0 <= dampening <= 1; got "
                             f"lr={lr}, momentum={momentum}, weight_decay={weight_decay}, dampening={dampening}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Trainer: nesterov needs momentum > 0 and dampening 0 (as torch.optim.SGD)")
        options = _strategy_options(strategy, dict(servers=servers, period=period, warmup=warmup,
                                                   momentum_placement=momentum_placement, beta=beta,
                                                   window=window, deterministic=deterministic, stages=stages,
                                                   micro_batches=micro_batches, schedule=schedule, split=split))
        if compression is not None and not isinstance(compression, str):
            raise TypeError(f"Trainer: `compression` must be None or a str such as \"fp16\" or \"topk:0.01\"; got "
                            f"{type(compression).__name__}")
        # as the C side spells it (topk:0.10 is topk:0.1), the name a checkpoint's state is kept under
        self.compression = _C.Compressor(compression, 0).spec if compression else "none"
        if (slow_rank is None) != (slow_ms is None):
            raise ValueError("Trainer: `slow_rank` and `slow_ms` go together (one rank sleeps slow_ms per step)")
        self.model, self.batch_size, self.seed = model, batch_size, int(seed)
        self.strategy, self.options = strategy, options
        self.sgd = (float(lr), float(momentum), float(dampening), float(weight_decay), bool(nesterov))
        # One BLAS thread per rank unless asked: the ranks are the parallelism, and more threads than
        # cores make every rank wait for the slowest.
        _C.set_blas_threads(int(blas_threads or _env.read("PYDIST_BLAS_THREADS")))
        if dist.is_initialized():
            self.group = group
            self._handle = dist._group_handle(group, "Trainer") if group is not None else 0
            self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
            self._root = dist.get_global_rank(group, 0) if group is not None else 0  # holds the truth
        else:
            self.group, self._handle, self.rank, self.world, self._root = None, -1, 0, 1, 0
        if slow_rank is not None:
            for name, v, hi in (("slow_rank", slow_rank, self.world - 1), ("slow_ms", slow_ms, 3600000)):
                if not isinstance(v, numbers.Integral) or isinstance(v, bool) or not 0 <= v <= hi:
                    raise ValueError(f"Trainer: `{name}` must be an int in [0, {hi}]; got {v!r}")
        self.stages, self.split = 1, None
        if strategy == "pipeline":
            self.stages, self.split = self._pipeline_layout(options, batch_size)
        self.engine = _C.Engine(model.specs(), model.input_shape, batch_size)
        self.engine.name = model.name   # recorded in checkpoints, with the strategy: a load into another names both
        self.engine.init_params(self.seed)
        self._broadcast_state()
        self._slow_ms = int(slow_ms) if slow_rank == self.rank else 0
        if survive is None:
            survive = _env.read("PYDIST_SURVIVE") and strategy in ASYNC
        if survive and strategy not in ASYNC:
            raise ValueError(f"Trainer: `survive` is for the asynchronous strategies ({', '.join(ASYNC)}); "
                             f"{strategy!r} is restarted from its checkpoint by python -m pydist.run instead")
        if survive and self.world != (dist.get_world_size() if dist.is_initialized() else 1):
            raise ValueError("Trainer: `survive` needs the Trainer's group to be the whole world")
        self.survive = bool(survive)
        self._set_strategy()
        self.epoch, self.step, self.history = 0, 0, []
        # Where the current epoch's global sample order stands: at global step anchor[1] of epoch anchor[0]
        # it had reached example anchor[2], and every step since took one global batch. An epoch's end
        # and a loaded checkpoint set it; a checkpoint of format 3 or older (anchor None) derives it from
        # the step count, as they were written. `resumed_from`: the loaded checkpoint's position and layout.
        self._anchor, self._n, self.resumed_from = (0, 0, 0), None, None
        self.left_behind = []   # under `survive`: the world ranks training went on without, in order

    def _set_strategy(self):
        options, strategy = self.options, self.strategy
        self.engine.set_strategy(self._handle, strategy, options.get("servers", 0), options.get("period", 0),
                                 options.get("warmup", 0),
                                 _PLACEMENTS.index(options.get("momentum_placement", "local")),
                                 options.get("beta", 0.0), self._slow_ms,
                                 options.get("window", 0), int(options.get("deterministic", False)),
                                 self.stages if strategy == "pipeline" else 0, options.get("micro_batches", 0),
                                 SCHEDULES.index(options.get("schedule", "gpipe")), self.split, *self.sgd,
                                 self.compression)
        self.engine.strategy_survive(self.survive)
        self.workers, self.is_server = self.engine.workers, self.engine.is_server

    def _carry_on(self, n):
        """After a chunk under `survive`: if workers died during it, go on with the ranks left, from the
        center (every worker restarts from it, as after a resume), with the epoch's order re-anchored
        where it stands. Returns whether any died. Collective over the survivors."""
        info = self.engine.strategy_departed()
        if not info["dead"]:
            return False
        ranks = dist.get_process_group_ranks(self.group)
        dead = [ranks[r] for r in info["dead"]]
        if self.is_server and self.rank == self.workers:   # server 0: what it saw
            for r, at in sorted(info["noticed"].items()):
                ended = run.ended_at(ranks[r])
                late = f", {at - ended:.2f} s after it ended" if ended else ""
                print(f"pydist: worker rank {ranks[r]} died; its server noticed{late}", file=sys.stderr, flush=True)
            print(f"pydist: {info['regranted']} batches of unfinished blocks went to the workers left; "
                  f"{info['batches']} of the chunk's {info['call_batches']} batches were trained", file=sys.stderr,
                  flush=True)
        sample = self.position(n)
        _C.forget_ranks(dead)
        survivors = [r for r in ranks if r not in dead]
        self.group = dist._survivors_group(survivors)
        self._handle = dist._group_handle(self.group, "Trainer")
        self.rank, self.world = dist.get_rank(self.group), len(survivors)
        self._root = survivors[0]
        self._set_strategy()
        self.engine.params[:] = self.engine.strategy_weights()   # the center, from the servers
        self.engine.strategy_restore()
        self._anchor = (self.epoch, self.step, sample)
        self.left_behind += dead
        if self.rank == 0:   # the job's own word, which python -m pydist.run's verdict takes
            run.report(without=sorted(self.left_behind))
            print(f"pydist: training goes on with {self.workers} worker{'s' if self.workers != 1 else ''} (ranks {', '.join(map(str, survivors))}) "
                  f"from example {sample} of epoch {self.epoch + 1}", file=sys.stderr, flush=True)
        return True

    def _pipeline_layout(self, options, batch_size):
        """(stages, boundaries): the pipeline's stages and the layers each runs, checked on every rank alike."""
        stages = options["stages"] or self.world
        options["stages"] = stages
        layers = len(self.model.layers)
        if self.world % stages != 0:
            raise ValueError(f"Trainer: {stages} pipeline stages must divide the {self.world} ranks (ranks = stages x "
                             f"replicas)")
        if stages > layers:
            raise ValueError(f"Trainer: {stages} pipeline stages but the model has only {layers} layers")
        if batch_size % options["micro_batches"] != 0:
            raise ValueError(f"Trainer: the batch of {batch_size} does not divide into {options['micro_batches']} "
                             f"micro-batches")
        split = options["split"]
        if split is None:
            return stages, balanced_split(layer_costs(self.model), stages)
        bounds = [0, *split, layers]
        if len(split) != stages - 1 or any(b <= a for a, b in zip(bounds, bounds[1:])):
            raise ValueError(f"Trainer: `split` must name {stages - 1} increasing layer indices in [1, {layers - 1}] "
                             f"(the first layer of stages 1 to {stages - 1}); got {split}")
        return stages, bounds

    def pipeline_report(self):
        """Every rank's pipeline measurements (Engine.pipeline_stats: busy, idle and sync seconds, the
        activation memory it held) with its last step's timeline ("trace": (kind, micro-batch, start,
        end), kind 0 forward, 1 backward, 2 update), in rank order. Collective."""
        mine = self.engine.pipeline_stats()
        if mine is None:
            raise ValueError(f"Trainer.pipeline_report(): the strategy is {self.strategy!r}, not 'pipeline'")
        mine = dict(mine, rank=self.rank, trace=self.engine.pipeline_trace())
        if self.world == 1:
            return [mine]
        every = [None] * self.world
        dist.all_gather_object(every, mine, group=self.group)
        return every

    # The state that defines training: parameters, momentum. Rank 0's copy is the truth.
    def _broadcast_state(self):
        if self.world > 1:
            dist.broadcast(self.engine.params, self._root, group=self.group)
            dist.broadcast(self.engine.momentum, self._root, group=self.group)

    @property
    def params(self):
        """The flat float32 parameter buffer, every layer's weights and biases in order. It is a view,
        so writing to it changes the model."""
        return self.engine.params

    def steps_per_epoch(self, n):
        """Steps in an epoch of `n` examples: whole global batches (the rest is dropped, as
        DataLoader(drop_last=True) does)."""
        return n // (self.workers * self.batch_size)

    @property
    def global_batch(self):
        """Examples per step, all workers together (batch_size x workers)."""
        return self.workers * self.batch_size

    def position(self, n=None):
        """Examples of the current epoch's global order consumed so far (n: the training set's size, needed
        only after loading a checkpoint of format 3 or older); -1 when that cannot be known."""
        n = self._n if n is None else n
        if self._anchor is not None and self._anchor[0] == self.epoch:
            return self._anchor[2] + (self.step - self._anchor[1]) * self.global_batch
        if n is None:
            return -1
        return (self.step - self.epoch * self.steps_per_epoch(n)) * self.global_batch

    def weights(self):
        """The weights that count, as a new array on every rank: the replica, the workers' average
        ("average") or the center ("easgd" and the asynchronous strategies). Collective."""
        return self.engine.strategy_weights()

    def _sum(self, values):
        a = np.array(values, dtype=np.float64)
        if self.world > 1:
            dist.all_reduce(a, group=self.group)
        return a

    def evaluate(self, images, labels, batch_size=500):
        """Mean loss and accuracy on (images, labels), each rank scoring its own slice."""
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"Trainer.evaluate(): `batch_size` must be a positive int, got {batch_size!r}")
        images, labels = self._check_data(images, labels)
        n = len(labels)
        if n == 0:
            raise ValueError("Trainer.evaluate(): no examples to evaluate (got 0)")
        lo, hi = n * self.rank // self.world, n * (self.rank + 1) // self.world
        weights = self.weights()
        loss_sum, correct = self.engine.evaluate(images, labels, lo, hi, min(batch_size, self.batch_size), weights)
        loss_sum, correct = self._sum([loss_sum, correct])
        return {"loss": loss_sum / n, "accuracy": correct / n}

    def _check_data(self, images, labels):
        """(images float32 (n, pixels), labels int32 (n,)), C-contiguous, for the engine (which checks
        the shapes). Labels are checked before they are narrowed to int32, so a label that does not fit
        can never wrap around into a valid class."""
        images, labels = np.asarray(images), np.asarray(labels)
        if images.dtype.kind not in "biuf" or images.ndim < 1:
            raise TypeError(f"Trainer: `images` must be an array (n, ...) of real numbers; got "
                            f"{images.dtype} with shape {images.shape}")
        if labels.ndim != 1 or (labels.dtype.kind not in "iu" and labels.size > 0):
            raise TypeError(f"Trainer: `labels` must be a 1-D array of ints; got {labels.dtype} with shape "
                            f"{labels.shape}")
        if len(images) != len(labels):
            raise ValueError(f"Trainer: images ({len(images)}) and labels ({len(labels)}) differ in length")
        if labels.size > 0 and (labels.min() < 0 or labels.max() >= self.engine.classes):
            raise ValueError(f"Trainer: `labels` must be in [0, {self.engine.classes}); got values from "
                             f"{labels.min()} to {labels.max()}")
        images = np.ascontiguousarray(images, dtype=np.float32)
        labels = np.ascontiguousarray(labels, dtype=np.int32)
        return images.reshape(len(images), math.prod(images.shape[1:])), labels

    def train_steps(self, images, labels, epoch, first, last, sample=0, global_step=None):
        """Steps [first, last) of `epoch` counted from example `sample` of its order (no progress, no
        evaluation, and step/epoch are left as they are); `global_step`: the strategy's step count at
        `first` (default: as if every step of the epoch had been at this layout). Returns the C loop's stats."""
        images, labels = self._check_data(images, labels)
        perm = _C.epoch_permutation(len(labels), self.seed, epoch)[sample:]
        self._n = len(labels)
        self.engine.global_step = (epoch * self.steps_per_epoch(len(labels)) + first if global_step is None
                                   else global_step)
        return self.engine.train_steps(images, labels, perm, first, last, self.batch_size, self._handle, *self.sgd)

    def fit(self, images, labels, epochs, test=None, checkpoint=None, metrics=None, progress=True,
            chunk_steps=50, on_epoch=None, checkpoint_every=None):
        """Train until `epochs` epochs are complete (continuing from a loaded checkpoint). After each epoch:
        evaluation on `test` (images, labels), a line of metrics (also appended to the JSON-lines file
        `metrics` on rank 0), and a checkpoint at `checkpoint` (rank 0 writes it atomically); with
        `checkpoint_every` also after every that many steps (counted over the whole run). A checkpoint
        records where the epoch's order stopped, so a run resumed from it at another world size or batch
        goes on with the next unseen example."""
        if not isinstance(chunk_steps, int) or isinstance(chunk_steps, bool) or chunk_steps < 1:
            raise ValueError(f"Trainer.fit(): `chunk_steps` must be a positive int, got {chunk_steps!r}")
        if checkpoint_every is not None and (not isinstance(checkpoint_every, int) or
                                             isinstance(checkpoint_every, bool) or checkpoint_every < 1):
            raise ValueError(f"Trainer.fit(): `checkpoint_every` must be None or a positive int, got "
                             f"{checkpoint_every!r}")
        if checkpoint_every is not None and not checkpoint:
            raise ValueError("Trainer.fit(): `checkpoint_every` needs `checkpoint` (the file to write)")
        if test is not None and (not isinstance(test, (tuple, list)) or len(test) != 2):
            raise ValueError(f"Trainer.fit(): `test` must be a pair (images, labels) or None, "
                             f"got {type(test).__name__}")
        # Paths only (an int would be taken by open() as a file descriptor), checked on every rank.
        checkpoint = os.fspath(checkpoint) if checkpoint else None
        metrics = os.fspath(metrics) if metrics else None
        images, labels = self._check_data(images, labels)
        if metrics:
            self._on_root(lambda: _append(metrics, ""), f"open the metrics file {metrics}")
        steps = self.steps_per_epoch(len(labels))
        if steps < 1:
            raise ValueError(f"{len(labels)} examples are fewer than one global batch of "
                             f"{self.world} x {self.batch_size}")
        self._n = len(labels)
        # Under python -m pydist.run, rank 0 tells the launcher each step it reaches (the asynchronous
        # strategies' steps are counted where their chunks end: a worker's own are not the job's)
        live = self.strategy not in ASYNC
        with run.Reporting(lambda: self.engine.steps_done if live else self.step) if self.rank == 0 else nullcontext():
            history = self._fit(images, labels, epochs, test, checkpoint, metrics, progress, chunk_steps, on_epoch,
                                checkpoint_every)
        return history

    def _fit(self, images, labels, epochs, test, checkpoint, metrics, progress, chunk_steps, on_epoch,
             checkpoint_every):
        stage_before = self.engine.pipeline_stats()
        while self.epoch < epochs:
            sample = self.position(len(labels))   # > 0 after resuming mid-epoch
            if not 0 <= sample <= len(labels):
                raise ValueError(f"Trainer.fit(): the checkpoint stopped at example {sample} of epoch "
                                 f"{self.epoch + 1}'s order, outside these {len(labels)} examples")
            # The rest of the epoch's order, in whole global batches (a resume at another layout may
            # leave a different remainder, dropped as DataLoader(drop_last) does)
            perm, first, steps = self._order(len(labels), sample)
            epoch_started_at = sample
            bar = _Progress(steps, f"epoch {self.epoch + 1}/{epochs}", progress and self.rank == 0, first)
            # loss_sum, correct, steps, t_comp, t_sync, bytes_sent, messages, pushes, staleness_sum,
            # staleness_max, exchanges (Engine.train_steps)
            totals = np.zeros(11)
            started = time.perf_counter()
            at = first
            while at < steps:
                end = min(steps, at + chunk_steps)
                if checkpoint_every:   # chunks end at the checkpoints (an asynchronous chunk leaves nothing in flight)
                    end = min(end, at + checkpoint_every - self.step % checkpoint_every)
                self.engine.global_step = self.step
                out = self.engine.train_steps(images, labels, perm, at - first, end - first, self.batch_size,
                                              self._handle, *self.sgd)
                totals += out
                totals[9] = max(totals[9] - out[9], out[9])   # a maximum, not a sum
                self.step += end - at
                bar.update(end - at, out[0] / max(out[2], 1))
                at = end
                if self.survive and self._carry_on(len(labels)):   # the rest of the epoch in the new layout
                    perm, first, steps = self._order(len(labels), self.position(len(labels)))
                    at = first
                if checkpoint_every and self.step % checkpoint_every == 0 and at < steps:
                    self.save(checkpoint)
            seconds = time.perf_counter() - started
            used = self.position(len(labels)) - epoch_started_at
            bar.close()
            self.epoch += 1
            self._anchor = (self.epoch, self.step, 0)
            if self.is_server:
                totals[3:5] = 0   # Tcomp/Tsync are the workers' step times
            loss_sum, correct, nsteps, t_comp, t_sync, sent, messages, pushes, stale_sum, _, _ = self._sum(totals)
            most = totals[[5, 9]].copy()   # the busiest rank's bytes, the stalest push
            if self.world > 1:
                dist.all_reduce(most, op=dist.ReduceOp.MAX, group=self.group)
            ran = max(steps - first, 1)
            # A pipeline's loss is its last stages': its steps are counted on every stage
            scored = nsteps / self.stages
            record = {
                "epoch": self.epoch, "step": self.step, "world_size": self.world, "strategy": self.strategy,
                "evaluated": EVALUATES.get(self.strategy, "the replica"),
                "workers": self.workers, "batch_per_rank": self.batch_size,
                "train_loss": loss_sum / max(scored, 1),
                "train_accuracy": correct / max(scored * self.batch_size, 1),
                "samples_per_s": used / seconds,
                "t_comp_ms": t_comp / max(nsteps, 1) * 1e3, "t_sync_ms": t_sync / max(nsteps, 1) * 1e3,
                "bytes_per_step": sent / self.world / ran, "max_bytes_per_step": float(most[0]) / ran,
                "messages_per_step": messages / self.world / ran,
                "epoch_s": seconds,
            }
            if self.strategy in ASYNC:
                servers = self.world - self.workers
                record.update(
                    staleness_mean=stale_sum / max(pushes, 1), staleness_max=int(most[1]),
                    pushes_per_worker=pushes / servers / self.workers,
                    # the workers' time spent exchanging with the servers (or waiting for them)
                    wait_share=t_sync / max(t_comp + t_sync, 1e-12))
            if self.strategy == "pipeline":
                record.update(self._bubble(stage_before))
                stage_before = self.engine.pipeline_stats()
            if test is not None:
                ev = self.evaluate(*test)
                record.update(test_loss=ev["loss"], test_accuracy=ev["accuracy"])
            self.history.append(record)
            if checkpoint:
                self.save(checkpoint)
            if self.rank == 0:
                if metrics:
                    _append(metrics, json.dumps(record) + "\n")
                if progress:
                    print(_epoch_line(record), flush=True)
            if on_epoch is not None:
                on_epoch(record)
        return self.history

    def _order(self, n, sample):
        """The rest of the current epoch's order from example `sample`, in whole global batches (a resume
        at another layout may leave a different remainder, dropped as DataLoader(drop_last) does), with
        the epoch's first and last step in this layout; anchors the position there."""
        perm = _C.epoch_permutation(n, self.seed, self.epoch)[sample:]
        first = sample // self.global_batch
        steps = first + (n - sample) // self.global_batch
        self._anchor = (self.epoch, self.step - first, sample - first * self.global_batch)
        return perm, first, steps

    def _bubble(self, before):
        """The epoch's pipeline bubble (the stages' idle share of their busy + idle time, averaged over
        ranks) beside the schedule's theory (P - 1) / (M + P - 1), and the most activation memory a
        stage held. Collective."""
        now = self.engine.pipeline_stats()
        busy, idle = now["busy_s"] - before["busy_s"], now["idle_s"] - before["idle_s"]
        a = np.array([idle / max(busy + idle, 1e-12), now["peak_slots"] * now["slot_bytes"]], dtype=np.float64)
        peak = a[1:].copy()
        if self.world > 1:
            dist.all_reduce(a, group=self.group)
            dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=self.group)
        P, M = self.stages, self.options["micro_batches"]
        return {"bubble": a[0] / self.world, "bubble_theory": (P - 1) / (M + P - 1),
                "peak_activation_kib": float(peak[0]) / 1024}

    def _on_root(self, action, what):
        """Run `action` on rank 0 only, and raise on every rank if it failed there: a rank that raised
        alone would leave the others waiting for it in their next collective."""
        ok, error = np.ones(1, np.int64), None
        if self.rank == 0:
            try:
                action()
            except Exception as e:  # any failure: the other ranks must hear of it
                ok[0], error = 0, e
        if self.world > 1:
            dist.broadcast(ok, self._root, group=self.group)
        if error is not None:
            raise error
        if ok[0] != 1:
            raise OSError(f"rank 0 could not {what}")

    def save(self, path):
        """Rank 0 writes parameters, momentum and position atomically (a temporary file, then rename;
        the file ends in a CRC32, so load() refuses it if damaged); every rank returns once it is on
        disk, or raises if rank 0 could not write it."""
        path = os.fspath(path)
        state = self.engine.strategy_state()   # collective: the average, the center, the servers' momentum
        # every rank's compression state (its error-feedback residual), gathered to rank 0 in rank order
        mine = self.engine.compression_state()
        extra = ()
        if mine is not None:
            mine = np.frombuffer(mine, np.uint8)
            every = [np.empty_like(mine) for _ in range(self.world)] if self.rank == 0 else None
            if self.world > 1:
                dist.gather(mine, every, dst=self._root, group=self.group)
            elif every is not None:
                every[0][:] = mine
            if self.rank == 0:
                extra = (np.concatenate(every).tobytes(), self.compression, self.world)
        where = (self.position(), self.world, self.global_batch)
        self._on_root(lambda: self.engine.save(path, self.step, self.epoch, self.seed, *where, *state, *extra),
                      f"write the checkpoint {path}")
        if self.rank == 0:   # to python -m pydist.run, if it started the job
            run.report(checkpoint=os.path.abspath(path), checkpoint_step=self.step)

    def load(self, path, strict=True):
        """Continue from a checkpoint: rank 0 reads it and every rank gets its state. A file that is
        truncated, damaged (CRC32), of another format version or of another model is a ValueError
        (another model's names both), and leaves the trainer as it was. So is one another strategy saved,
        unless `strict=False`: then its weights and momentum (what that strategy evaluates: the center,
        the average) are taken into this one, to evaluate them or to train on another way. The checkpoint may come from another world size or batch size:
        training goes on from the next example of the epoch's order that it had not used
        (`resumed_from` says where and from which layout)."""
        path = os.fspath(path)
        # loaded, step, epoch, seed, momentum_started, bytes of each rank's compression state to take,
        # and where the epoch's order stopped with the layout that saved it (-1: a file of format 3 or older)
        state = np.zeros(9, dtype=np.int64)
        error, compression = None, None
        if self.rank == 0:
            try:
                step, epoch, seed, compression, where = self.engine.load(path, bool(strict))
                state[:5] = (1, step, epoch, seed, self.engine.momentum_started)
                state[5] = self._compression_fits(compression, path)
                state[6:] = where if where is not None else (-1, -1, -1)
            except Exception as e:  # any failure: the other ranks must hear of it (below)
                error = e
        if self.world > 1:
            dist.broadcast(state, self._root, group=self.group)
            if state[0] != 1:   # every rank raises rank 0's reason, not just that it failed
                text = np.zeros(1024, np.uint8)
                if error is not None:
                    said = str(error).encode("utf-8", "replace")[:1023]
                    text[:len(said)] = np.frombuffer(said, np.uint8)
                dist.broadcast(text, self._root, group=self.group)
                error = error or ValueError(text.tobytes().rstrip(b"\0").decode("utf-8", "replace") or
                                            f"rank 0 could not load the checkpoint {path}")
        if error is not None:
            raise error
        self._broadcast_state()
        self.engine.strategy_restore()
        self.engine.momentum_started = bool(state[4])
        self.step, self.epoch, self.seed = int(state[1]), int(state[2]), int(state[3])
        sample, world, batch = (int(v) for v in state[6:])
        self._anchor = (self.epoch, self.step, sample) if sample >= 0 else None
        self.resumed_from = ({"epoch": self.epoch, "step": self.step, "sample": sample, "world_size": world,
                              "global_batch": batch} if sample >= 0 else None)
        if state[5] > 0:   # each rank takes back its own residual: the run continues bit for bit
            mine = np.empty(int(state[5]), np.uint8)
            blocks = None
            if self.rank == 0:
                blocks = list(np.frombuffer(compression[2], np.uint8).reshape(self.world, -1))
            if self.world > 1:
                dist.scatter(mine, blocks, src=self._root, group=self.group)
            else:
                mine[:] = blocks[0]
            self.engine.set_compression_state(mine.tobytes())
        return self

    def _compression_fits(self, saved, path):
        """Bytes of each rank's saved compression state to restore (rank 0, after engine.load): 0 when the
        checkpoint has none, or it was saved with another compressor or world size (then the residuals
        start from zero, with a warning: what they held is lost, not the weights)."""
        if saved is None:
            return 0
        name, ranks, data = saved
        mine = self.engine.compression_state()
        if mine is not None and name == self.compression and ranks == self.world and len(data) == ranks * len(mine):
            return len(mine)
        warnings.warn(f"{path} holds the compression state of '{name}' on {ranks} ranks; this run has "
                      f"'{self.compression}' on {self.world}: its residuals start from zero", stacklevel=3)
        return 0


def _epoch_line(r):
    test = f", test loss {r['test_loss']:.4f}, test accuracy {r['test_accuracy']:.4f}" if "test_loss" in r else ""
    return (f"epoch {r['epoch']}: train loss {r['train_loss']:.4f}{test}, {r['samples_per_s']:.0f} samples/s, "
            f"Tcomp {r['t_comp_ms']:.2f} ms, Tsync {r['t_sync_ms']:.2f} ms, "
            f"{r['bytes_per_step'] / 1024:.0f} KiB in {r['messages_per_step']:.1f} messages per step per rank" + (
                f", bubble {100 * r['bubble']:.0f}% (theory {100 * r['bubble_theory']:.0f}%), activations held "
                f"{r['peak_activation_kib']:.0f} KiB at most" if "bubble" in r else "") + (
                f", staleness mean {r['staleness_mean']:.2f} max {r['staleness_max']}, "
                f"{r['pushes_per_worker']:.0f} pushes per worker, {100 * r['wait_share']:.0f}% waiting"
                if "staleness_mean" in r else ""))
