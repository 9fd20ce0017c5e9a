"""Data-parallel training on Fashion-MNIST (or MNIST) with the native engine: the command line.

    mpiexec -n 2 python -m pydist.train --model lenet5 --epochs 5
    python -m pydist.train --model mlp --hidden 256 128 --epochs 3          # one process
    mpiexec -n 2 python -m pydist.train --checkpoint run.ckpt --resume      # continue a run
    python -m pydist.run -n 2 -- -m pydist.train --checkpoint run.ckpt --resume-if-present   # elastic
    mpiexec -n 4 python -m pydist.train --strategy ps --servers 1           # another way to cooperate
    mpiexec -n 4 python -m pydist.train --strategy pipeline --stages 2 --micro-batches 8   # 2 stages x 2 replicas

--strategy: allreduce (default), ring, central, ps [--servers S], average [--period K --warmup W
--momentum-placement local|average|reset], easgd [--period K --beta B]; asynchronous, with [--servers S
--window W --deterministic]: downpour, adag, aeasgd [--beta B], dynsgd. An option the strategy does not
take is an error. Model parallelism: pipeline [--stages P (default: every rank) --micro-batches M
--schedule gpipe|1f1b --split i j ...] splits the layers into P stages (balanced by FLOPs unless --split
names the first layer of stages 1 .. P-1) on R = P x replicas ranks; --batch-size is then per replica.
--slow-rank r --slow-ms t makes rank r sleep t ms per step (a straggler).

--batch-size is per rank (the global batch is R times it). Rank 0 prints a progress bar and one line
per epoch, appends the metrics to --metrics (JSON lines) and, when matplotlib is installed, draws
the loss and accuracy curves into --plot. --checkpoint is written atomically after every epoch (and
every --checkpoint-every steps); --resume continues from it at any world size. A run never loses a
checkpoint without being told: --resume of a file that is not there is an error (--resume-if-present
starts afresh then, as a relaunched job's first attempt must), and a fresh run refuses to replace an
existing --checkpoint unless --overwrite says so. Rank 0's file decides, on every rank alike.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

from . import _files
from . import distributed as dist
from .engine import DEFAULT_DATA_DIR, EVALUATES, STRATEGIES, Trainer, lenet5, load_fashion_mnist, mlp


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m pydist.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("lenet5", "mlp"), default="lenet5")
    ap.add_argument("--hidden", type=int, nargs="+", default=[256, 128], help="MLP hidden widths (default 256 128)")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=64, help="per rank (default 64)")
    ap.add_argument("--lr", type=float, default=0.02, help="default 0.02: 0.894 test accuracy after 5 epochs at 2 x 64")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--nesterov", action="store_true")
    ap.add_argument("--seed", type=int, default=0, help="initial weights and data order (default 0)")
    ap.add_argument("--data", default=None, help=f"folder of the IDX files (default {DEFAULT_DATA_DIR})")
    ap.add_argument("--checkpoint", default=None, help="checkpoint file, written after every epoch")
    ap.add_argument("--checkpoint-every", type=int, default=None, metavar="STEPS",
                    help="also write --checkpoint after every STEPS steps (counted over the whole run)")
    ap.add_argument("--resume", action="store_true",
                    help="continue from --checkpoint (it must exist), at any world size: with the next example "
                         "of the epoch's order that it had not used")
    ap.add_argument("--resume-if-present", action="store_true",
                    help="continue from --checkpoint if it exists, else start afresh (python -m pydist.run's "
                         "relaunches)")
    ap.add_argument("--overwrite", action="store_true",
                    help="start afresh even though --checkpoint exists, replacing it")
    ap.add_argument("--metrics", default="metrics.jsonl", help="JSON-lines file of per-epoch metrics ('' for none)")
    ap.add_argument("--plot", default="curves.png", help="PNG of the curves, if matplotlib is installed ('' for none)")
    ap.add_argument("--blas-threads", type=int, default=None, help="OpenBLAS threads per rank (default 1)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar and epoch lines")
    ap.add_argument("--profile", action="store_true",
                    help="print the model's per-layer time and GFLOP/s at --batch-size on one core and exit "
                         "(python -m pydist.profile)")
    st = ap.add_argument_group("strategy (how the ranks cooperate; docs/guides/strategies.md)")
    st.add_argument("--strategy", choices=tuple(STRATEGIES), default="allreduce")
    st.add_argument("--servers", type=int, default=None,
                    help="ps and the asynchronous strategies: dedicated server ranks (default 1)")
    st.add_argument("--period", type=int, default=None, help="average, easgd: steps between exchanges (default 4)")
    st.add_argument("--warmup", type=int, default=None, help="average: synchronous steps first (default 0)")
    st.add_argument("--momentum-placement", choices=("local", "average", "reset"), default=None,
                    help="average: momentum at an averaging step (default local)")
    st.add_argument("--beta", type=float, default=None,
                    help="easgd, aeasgd: moving rate, alpha = beta / workers (default 0.9)")
    st.add_argument("--window", type=int, default=None,
                    help="downpour, adag, aeasgd, dynsgd: a worker's steps between exchanges (default 5)")
    st.add_argument("--deterministic", action="store_true", default=None,
                    help="asynchronous: servers serve workers in a fixed round-robin (a bitwise repeatable run)")
    st.add_argument("--stages", type=int, default=None, help="pipeline: stages (default: every rank a stage)")
    st.add_argument("--micro-batches", type=int, default=None,
                    help="pipeline: micro-batches per batch (default 4; must divide --batch-size)")
    st.add_argument("--schedule", choices=("gpipe", "1f1b"), default=None, help="pipeline: the schedule (default 1f1b)")
    st.add_argument("--split", type=int, nargs="+", default=None,
                    help="pipeline: the first layer of stages 1 .. P-1 (default: balanced by FLOPs)")
    st.add_argument("--compression", default=None,
                    help="what the strategy sends, compressed with error feedback: fp16, bf16, topk:R (fraction "
                         "R of entries), sign, powersgd:K (rank K); every strategy but pipeline (default none)")
    st.add_argument("--slow-rank", type=int, default=None, help="this rank sleeps --slow-ms per step (a straggler)")
    st.add_argument("--slow-ms", type=int, default=None)
    args = ap.parse_args(argv)
    for name in ("servers", "period", "warmup", "momentum_placement", "beta", "window", "deterministic", "stages",
                 "micro_batches", "schedule", "split"):
        if getattr(args, name) is not None and name not in STRATEGIES[args.strategy]:
            ap.error(f"--{name.replace('_', '-')} does not apply to --strategy {args.strategy}")
    if (args.slow_rank is None) != (args.slow_ms is None):
        ap.error("--slow-rank and --slow-ms go together")
    if args.epochs < 0 or args.batch_size < 1:
        ap.error("--epochs must be >= 0 and --batch-size >= 1")
    resumes = [name for name in ("resume", "resume_if_present", "overwrite") if getattr(args, name)]
    if resumes and not args.checkpoint:
        ap.error(f"--{resumes[0].replace('_', '-')} needs --checkpoint")
    if len(resumes) > 1:
        ap.error("--resume, --resume-if-present and --overwrite exclude each other")
    if args.checkpoint_every is not None and (args.checkpoint_every < 1 or not args.checkpoint):
        ap.error("--checkpoint-every needs --checkpoint and a number of steps >= 1")
    if args.compression:
        try:   # the compressor's own parser, so that these words and the Trainer's never differ
            dist._C.Compressor(args.compression, 0)
        except ValueError as e:
            ap.error(f"--compression: {str(e).removeprefix('Compressor(): ')}")
    return args


SERIES = {"train": "tab:blue", "test": "tab:orange"}   # one colour per series, the same in both panels


def figure(history):
    """The loss and accuracy curves of `history` (the per-epoch records of Trainer.fit or the metrics
    file) as a matplotlib Figure: train and test each in their own colour, ticks at whole epochs."""
    from matplotlib.figure import Figure   # no pyplot: no global state, no GUI backend
    from matplotlib.ticker import MaxNLocator

    epochs = [r["epoch"] for r in history]
    fig = Figure(figsize=(10, 4))
    ax_loss, ax_acc = fig.subplots(1, 2)
    for name, color in SERIES.items():
        if history and all(f"{name}_loss" in r for r in history):
            ax_loss.plot(epochs, [r[f"{name}_loss"] for r in history], "o-", color=color, label=name)
            ax_acc.plot(epochs, [r[f"{name}_accuracy"] for r in history], "o-", color=color, label=name)
    for ax, what in ((ax_loss, "loss"), (ax_acc, "accuracy")):
        ax.set(xlabel="epoch", ylabel=what, title=what)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        if len(set(epochs)) == 1:                      # one point: a unit-wide view around it, not 0.1
            ax.set_xlim(epochs[0] - 0.5, epochs[0] + 0.5)
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot(history, path):
    """figure(history) into a PNG; returns False when matplotlib is not installed."""
    try:
        fig = figure(history)
    except ImportError:
        return False
    with _files.replacing(path, "wb") as f:   # never a write through a link planted at the name
        fig.savefig(f, dpi=100, format="png")
    return True


def read_metrics(path):
    """The records of a metrics file, one per epoch (the last one written wins), in epoch order."""
    by_epoch = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                by_epoch[record["epoch"]] = record
    return [by_epoch[e] for e in sorted(by_epoch)]


def resumed_where(trainer):
    """Where a loaded checkpoint left the epoch's order, and the layout it was saved at, if not this one."""
    r = trainer.resumed_from
    if r is None:
        return ""
    line = f" (example {r['sample']} of epoch {r['epoch'] + 1}'s order"
    if (r["world_size"], r["global_batch"]) != (trainer.world, trainer.global_batch):
        line += (f"; saved at {r['world_size']} rank(s), a global batch of {r['global_batch']}; now "
                 f"{trainer.world}, {trainer.global_batch}")
    return line + ")"


def checkpoint_on_rank0(path):
    """Whether rank 0 has the checkpoint: it alone looks, and reads it (Trainer.load sends its state), so a
    rank whose host does not have the file resumes with the others rather than from scratch."""
    found = np.array([dist.get_rank() == 0 and os.path.exists(path)], np.int32)
    dist.broadcast(found, src=0)
    return bool(found[0])


def main(argv=None):
    args = parse_args(argv)
    model = lenet5() if args.model == "lenet5" else mlp(tuple(args.hidden))
    if args.profile:   # one process, no MPI: where the step's time goes
        from . import profile
        print(profile.report(model, [args.batch_size]), flush=True)
        return
    dist.init_process_group(backend="mpi")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        (images, labels), test = load_fashion_mnist(args.data)
        unreadable = ""
    except (OSError, ValueError) as e:   # no folder, a missing, truncated or foreign file
        unreadable = str(e)
    # Decided alike: one node without the data set must not leave the others waiting in training
    said = [None] * world
    dist.all_gather_object(said, unreadable)
    failed = [r for r in range(world) if said[r]]
    if failed:
        if rank == 0:
            where = f" (on rank {failed[0]}{' and others' if len(failed) > 1 else ''})" if failed != [0] else ""
            print(f"python -m pydist.train: error: {said[failed[0]]}{where}", file=sys.stderr, flush=True)
        dist.destroy_process_group()
        return 2
    trainer = Trainer(model, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay,
                      nesterov=args.nesterov, batch_size=args.batch_size, seed=args.seed,
                      blas_threads=args.blas_threads, strategy=args.strategy, servers=args.servers,
                      period=args.period, warmup=args.warmup, momentum_placement=args.momentum_placement,
                      beta=args.beta, window=args.window, deterministic=args.deterministic, stages=args.stages,
                      micro_batches=args.micro_batches, schedule=args.schedule, split=args.split,
                      compression=args.compression, slow_rank=args.slow_rank, slow_ms=args.slow_ms)
    found = checkpoint_on_rank0(args.checkpoint) if args.checkpoint else False
    refused = (f"--resume: there is no checkpoint at {args.checkpoint} (on rank 0); --resume-if-present starts "
               f"afresh when there is none" if args.resume and not found else
               f"{args.checkpoint} exists (on rank 0): --resume continues from it, --overwrite starts afresh and "
               f"replaces it" if found and not (args.resume or args.resume_if_present or args.overwrite) else None)
    if refused:   # decided from rank 0's answer: every rank leaves alike, before anything is written
        if rank == 0:
            print(f"python -m pydist.train: error: {refused}", file=sys.stderr, flush=True)
        dist.destroy_process_group()
        return 2
    if found and not args.overwrite:
        try:
            trainer.load(args.checkpoint)
        except ValueError as e:   # another model or strategy, a damaged file: the same on every rank, and
            if rank == 0:         # no retry can help (pydist.run does not restart exit status 2)
                print(f"python -m pydist.train: error: cannot resume: {e}", file=sys.stderr, flush=True)
            dist.destroy_process_group()
            return 2
        if rank == 0:
            print(f"resumed from {args.checkpoint} at epoch {trainer.epoch}, step {trainer.step}"
                  + resumed_where(trainer), flush=True)
    elif rank == 0 and args.metrics and os.path.exists(args.metrics):
        os.remove(args.metrics)  # a fresh run starts a fresh file; a resumed one appends
    if rank == 0 and not args.no_progress:
        print(f"{model.name}: {model.num_params} parameters, strategy {args.strategy} (evaluating "
              f"{EVALUATES.get(args.strategy, 'the replica')}), {world} rank(s) "
              f"({trainer.workers} {'replica(s)' if args.strategy == 'pipeline' else 'computing'}) x batch "
              f"{args.batch_size}, "
              f"{len(labels)} training and {len(test[1])} test examples, "
              f"{trainer.steps_per_epoch(len(labels))} steps per epoch", flush=True)
        if args.strategy == "pipeline":
            o = trainer.options
            stages = ", ".join(f"{a}-{b - 1}" for a, b in zip(trainer.split, trainer.split[1:]))
            print(f"pipeline: {o['stages']} stages (layers {stages}) x {world // o['stages']} replica(s), "
                  f"{o['micro_batches']} micro-batches of {args.batch_size // o['micro_batches']}, schedule "
                  f"{o['schedule']}", flush=True)
    started = time.perf_counter()
    history = trainer.fit(images, labels, args.epochs, test=test, checkpoint=args.checkpoint,
                          metrics=args.metrics or None, progress=not args.no_progress,
                          checkpoint_every=args.checkpoint_every)
    if trainer.rank == 0 and history:   # (the first rank left, if rank 0 died under --survive)
        last = history[-1]
        summary = {"final_test_accuracy": last.get("test_accuracy"), "seconds": time.perf_counter() - started,
                   "mean_samples_per_s": sum(r["samples_per_s"] for r in history) / len(history)}
        print("summary " + json.dumps(summary), flush=True)
        # A resumed run's file holds the epochs before the resume too: plot the whole run.
        whole = read_metrics(args.metrics) if args.metrics else trainer.history
        if args.plot and plot(whole, args.plot):
            print(f"curves: {args.plot}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
