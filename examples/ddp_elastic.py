"""Torch DDP over pydist that survives a dead rank: run it under pydist's elastic launcher.

    python -m pydist.run -n 3 --max-restarts 2 -- examples/ddp_elastic.py --checkpoint ddp.ckpt
    mpiexec.mpich -n 3 python examples/ddp_elastic.py --checkpoint ddp.ckpt    # the same, no restarts

When a rank dies, `python -m pydist.run` starts the same command again. The script then has to pick
up where its newest checkpoint stands, and that is all it has to do (README, "When a rank dies"):

1. The data order is a function of (seed, epoch) alone, as DistributedSampler's is: one permutation
   of the training set per epoch, the same on every rank, and rank r takes its slice of each global
   batch of R x B examples. So "where the epoch stands" is one number, the examples of its order used.
2. Every --checkpoint-every steps rank 0 writes model, optimizer (momentum), step, epoch and that
   position to a temporary file and os.replace()s it over the checkpoint: the file is always a whole
   checkpoint, the newest or the one before.
3. At start rank 0 reads the checkpoint if it has one and sends it to every rank (broadcast_object_list:
   another host need not have the file), before wrapping the model in DDP, and all go on from the
   position it names. At the same world size the run then ends with the same bits
   as one that never stopped (tests/unit/test_run_ddp.py); at another, it goes on with the next
   unseen example of the epoch.
4. Rank 0 calls pydist.run.report() after each step and each checkpoint, so the launcher can say how
   many steps a failure cost (outside the launcher it does nothing).

--out FILE: rank 0 saves the final weights, all parameters flattened in order, as a float32 .npy.
Data: Fashion-MNIST through pydist.engine.load_fashion_mnist (Debian's dataset-fashion-mnist), the
first --limit training examples.
"""
import argparse
import datetime
import os
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import pydist.torch  # noqa: F401  (registers the "pydist" backend; under mpiexec it also starts MPI)
from pydist.engine import load_fashion_mnist
from pydist.run import report


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", default="ddp.ckpt", help="the checkpoint file (default ddp.ckpt)")
    ap.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints (default 50)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--limit", type=int, default=60000, help="train on the first N examples (default all)")
    ap.add_argument("--batch-size", type=int, default=32, help="per rank (default 32)")
    ap.add_argument("--hidden", type=int, default=64, help="the MLP's hidden width (default 64)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0, help="initial weights and data order (default 0)")
    ap.add_argument("--data", default=None, help="folder of the IDX files (default pydist's)")
    ap.add_argument("--out", default=None, help="rank 0 saves the final weights here (.npy)")
    args = ap.parse_args(argv)
    if args.checkpoint_every < 1:
        ap.error(f"--checkpoint-every must be at least 1; got {args.checkpoint_every}")
    return args


def epoch_order(n, seed, epoch):
    """The epoch's permutation of range(n): the same on every rank, at every world size."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))


def save_checkpoint(path, model, optimizer, step, epoch, position, world, batch):
    """Rank 0 only. A temporary file, flushed to disk, then renamed over `path`: a reader (or a restart
    after a kill in the middle of this) finds the whole previous checkpoint or the whole new one."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "epoch": epoch,
             "position": position, "world_size": world, "batch_size": batch}
    # mkstemp: a fresh file in the target folder (O_EXCL), never a link planted at a predictable name
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:   # a full disk: the previous checkpoint stays, and no partial file
        os.unlink(tmp)
        raise
    report(step=step, checkpoint=path, checkpoint_step=step)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)   # the ranks are the parallelism
    dist.init_process_group("pydist", timeout=datetime.timedelta(seconds=120))
    rank, world, B = dist.get_rank(), dist.get_world_size(), args.batch_size

    (train_x, train_y), _ = load_fashion_mnist(args.data)
    images = torch.from_numpy(train_x[:args.limit]).reshape(-1, 28 * 28)   # float32 (n, 784)
    labels = torch.from_numpy(train_y[:args.limit]).long()                  # int64 (n,)
    n = len(labels)

    torch.manual_seed(args.seed)   # DDP sends rank 0's initial weights to every rank anyway
    model = nn.Sequential(nn.Linear(28 * 28, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    # Resume, before DDP wraps the model: rank 0 reads the checkpoint and sends it to every rank (another
    # host may not have the file, and ranks that started from different weights would diverge).
    step, epoch, position = 0, 0, 0
    state = [torch.load(args.checkpoint, map_location="cpu", weights_only=True)
             if rank == 0 and os.path.exists(args.checkpoint) else None]
    dist.broadcast_object_list(state, src=0)
    state = state[0]
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, epoch, position = state["step"], state["epoch"], state["position"]
        if position + world * B > n:   # what is left of that epoch is less than a global batch
            epoch, position = epoch + 1, 0
        if rank == 0:
            same = state["world_size"] == world and state["batch_size"] == B
            print(f"resumed from {args.checkpoint} at epoch {epoch}, step {step} (example {position} of epoch "
                  f"{epoch + 1}'s order)" + ("" if same else f"; saved at {state['world_size']} rank(s) x batch "
                                             f"{state['batch_size']}, so not bitwise an uninterrupted run's"),
                  flush=True)
    ddp = nn.parallel.DistributedDataParallel(model)

    started = time.perf_counter()
    while epoch < args.epochs:
        order = epoch_order(n, args.seed, epoch)
        loss_sum = torch.zeros(2, dtype=torch.float64)   # [sum of this rank's losses, steps] since start
        while position + world * B <= n:   # the last partial global batch is dropped
            mine = order[position + rank * B:position + (rank + 1) * B]
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(images[mine]), labels[mine])
            loss.backward()            # DDP all-reduces and averages the gradients here
            optimizer.step()
            loss_sum += torch.tensor([loss.item(), 1.0], dtype=torch.float64)
            position += world * B
            step += 1
            if rank == 0:
                report(step=step)
                if step % args.checkpoint_every == 0:
                    save_checkpoint(args.checkpoint, model, optimizer, step, epoch, position, world, B)
        dist.all_reduce(loss_sum)
        if rank == 0:
            print(f"epoch {epoch + 1}: step {step}, mean loss {loss_sum[0] / max(loss_sum[1], 1):.4f} over "
                  f"{int(loss_sum[1]) // world} step(s), {time.perf_counter() - started:.1f} s", flush=True)
        epoch, position = epoch + 1, 0

    if rank == 0:
        save_checkpoint(args.checkpoint, model, optimizer, step, epoch, position, world, B)
        if args.out:
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            np.save(args.out, flat.numpy())
        print(f"done: {step} steps at {world} rank(s)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
