"""Synchronous SGD on LeNet-5 the way PyTorch's distributed tutorial writes it, over pydist.

A plain torch.distributed program: rank 0's initial weights are sent to every rank (send/recv), each
rank trains on its own shard of Fashion-MNIST, and after every backward pass the gradients are
averaged with one all_reduce per parameter. The only pydist-specific lines are the import and the
backend name (with gloo you would set MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE yourself):

    mpiexec.mpich -n 2 python examples/torch_lenet_sync_sgd.py [--epochs 1] [--limit 6000]

Data: the IDX files of Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist), or --data.
"""
import argparse
import gzip
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import pydist.torch  # noqa: F401  (registers the "pydist" backend)

BACKEND = "pydist"


def load_idx(path):
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def dataset(root, split, limit):
    prefix = "train" if split == "train" else "t10k"
    images = load_idx(os.path.join(root, f"{prefix}-images-idx3-ubyte.gz"))[:limit]
    labels = load_idx(os.path.join(root, f"{prefix}-labels-idx1-ubyte.gz"))[:limit]
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    return x, torch.from_numpy(labels.astype(np.int64))


class LeNet5(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(400, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def sync_initial_weights(model, rank, world_size):
    """Every rank starts from rank 0's weights: rank 0 sends each parameter to every other rank."""
    for param in model.parameters():
        if rank == 0:
            for other in range(1, world_size):
                dist.send(param.data, dst=other)
        else:
            dist.recv(param.data, src=0)


def sync_gradients(model, world_size):
    """The average of every rank's gradients, one all_reduce per parameter."""
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= world_size


def run(args):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234 + rank)   # different initial weights on purpose: rank 0's win below
    torch.set_num_threads(1)
    x, y = dataset(args.data, "train", args.limit)
    test_x, test_y = dataset(args.data, "test", args.limit)
    shard = torch.arange(rank, len(x), world_size)   # rank r takes samples r, r + R, ...
    model = LeNet5()
    sync_initial_weights(model, rank, world_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    g = torch.Generator().manual_seed(args.seed)     # the same shuffle on every rank
    start = time.perf_counter()
    losses = []
    for epoch in range(args.epochs):
        order = shard[torch.randperm(len(shard), generator=g)]
        total, batches = 0.0, 0
        for i in range(0, len(order) - args.batch + 1, args.batch):
            idx = order[i:i + args.batch]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            sync_gradients(model, world_size)
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        with torch.no_grad():
            accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
        losses.append(total / max(batches, 1))
        print(f"rank {rank} epoch {epoch}: loss {losses[-1]:.4f}, test accuracy {accuracy:.4f}, "
              f"{time.perf_counter() - start:.1f} s", flush=True)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.empty_like(weights) for _ in range(world_size)]
    dist.all_gather(everyone, weights)
    if rank == 0:
        same = all(torch.equal(everyone[0], w) for w in everyone)
        print(f"done: loss {losses[0]:.4f} in the first epoch, {losses[-1]:.4f} in the last, test accuracy "
              f"{accuracy:.4f}, weights identical on all {world_size} ranks: {same}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--limit", type=int, default=60000, help="use the first N training (and test) samples")
    parser.add_argument("--batch", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group(backend=BACKEND)
    run(args)
    dist.destroy_process_group()
