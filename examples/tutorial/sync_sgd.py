# run: mpiexec -n 2 python sync_sgd.py
"""Synchronous SGD by hand: a small MLP on Fashion-MNIST in NumPy, its gradients averaged with all_reduce.

Every rank starts from rank 0's weights, trains on its own part of the data, and after every backward
pass the gradients are averaged over the ranks, so every rank applies the same update and the weights
stay identical. Run it with any number of ranks:

    mpiexec.mpich -n 2 python examples/tutorial/sync_sgd.py
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # one BLAS thread per rank: the ranks are the parallelism

import time

import numpy as np

import pydist as dist
from pydist.engine import load_fashion_mnist

SEED, EPOCHS, BATCH, LR = 2, 5, 64, 0.1     # BATCH is per rank: a global batch of 64 x R


def init_params(rng):
    """A 784-64-10 MLP: weights drawn at random, biases zero."""
    return {"w1": rng.normal(0, 784 ** -0.5, (784, 64)).astype(np.float32), "b1": np.zeros(64, np.float32),
            "w2": rng.normal(0, 64 ** -0.5, (64, 10)).astype(np.float32), "b2": np.zeros(10, np.float32)}


def predict(p, x):
    """The class scores (logits) and the hidden layer's activations."""
    h = np.maximum(x @ p["w1"] + p["b1"], 0)                      # ReLU
    return h @ p["w2"] + p["b2"], h


def forward_backward(p, x, y):
    """The mean cross-entropy loss on (x, y) and its gradient with respect to every parameter."""
    logits, h = predict(p, x)
    prob = np.exp(logits - logits.max(axis=1, keepdims=True))
    prob /= prob.sum(axis=1, keepdims=True)                        # softmax
    rows = np.arange(len(y))
    loss = -np.log(prob[rows, y]).mean()
    d = prob
    d[rows, y] -= 1
    d /= len(y)                                                   # d loss / d logits
    dh = (d @ p["w2"].T) * (h > 0)
    return loss, {"w1": x.T @ dh, "b1": dh.sum(0), "w2": h.T @ d, "b2": d.sum(0)}


def average_gradients(grads):
    """Every rank ends with the mean of all ranks' gradients: summed by all_reduce, divided by R."""
    size = dist.get_world_size()
    for g in grads.values():
        dist.all_reduce(g, op=dist.ReduceOp.SUM)                   # in place, on every rank
        g /= size


def main():
    dist.init_process_group(backend="mpi")
    rank, size = dist.get_rank(), dist.get_world_size()

    # The data: the first 8,000 training examples, of which rank r takes r, r + R, r + 2R, ...
    (images, labels), (test_images, test_labels) = load_fashion_mnist()   # /usr/share/datasets/fashion-mnist
    x, y = images[:8000].reshape(-1, 784)[rank::size], labels[:8000][rank::size]

    # The model: each rank draws its own weights, then rank 0's replace them everywhere.
    rng = np.random.default_rng(SEED + rank)
    params = init_params(rng)
    for value in params.values():
        dist.broadcast(value, src=0)

    started = time.perf_counter()
    for epoch in range(1, EPOCHS + 1):
        order = rng.permutation(len(y))                           # each rank shuffles its own part
        losses = []
        for i in range(0, len(order) - BATCH + 1, BATCH):
            batch = order[i:i + BATCH]
            loss, grads = forward_backward(params, x[batch], y[batch])
            average_gradients(grads)
            for name in params:
                params[name] -= LR * grads[name]                   # the same update on every rank
            losses.append(loss)
        mean = np.array([np.mean(losses)])                        # this rank's mean loss of the epoch ...
        dist.all_reduce(mean)                                     # ... averaged over the ranks
        if rank == 0:
            print(f"epoch {epoch}: loss {mean[0] / size:.2f} ({time.perf_counter() - started:.1f} s)", flush=True)

    # Every rank scores the same test examples with its own copy of the weights ...
    logits, _ = predict(params, test_images[:2000].reshape(-1, 784))
    accuracy = (logits.argmax(axis=1) == test_labels[:2000]).mean()
    # ... and the copies are the same to the last bit: gather them all and compare.
    flat = np.concatenate([v.ravel() for v in params.values()])
    everyone = [np.empty_like(flat) for _ in range(size)]
    dist.all_gather(everyone, flat)
    same = all(np.array_equal(everyone[0], w) for w in everyone)
    print(f"rank {rank}: test accuracy {accuracy:.2f}, weights identical on all {size} ranks: {same}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
