#!/usr/bin/env python3
"""What the header round costs: every collective's per-call time on one machine, including the ones
that went straight to MPI before every call's header went through the shared-memory slots (gather,
scatter, the list forms). Mean of the slowest rank, float32 blocks of each size.

    mpiexec -n 2 python benchmarks/header_round.py
    PYTHONPATH=<another checkout> mpiexec -n 2 python benchmarks/header_round.py   # the same on other code

"""
import time

import numpy as np
import pydist as dist

dist.init_process_group(backend="mpi")
rank, size = dist.get_rank(), dist.get_world_size()


def bench(name, f, n_iter):
    for _ in range(50):
        f()
    dist.barrier()
    t = time.perf_counter()
    for _ in range(n_iter):
        f()
    el = np.array([(time.perf_counter() - t) / n_iter * 1e6])
    dist.all_reduce(el, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"{name:36s} {el[0]:9.2f} us", flush=True)


for nbytes in (8, 8192, 262144, 4 << 20):
    n = nbytes // 4
    it = 3000 if nbytes <= 8192 else 300 if nbytes <= 262144 else 20
    a = np.ones(n, np.float32)
    outs = [np.zeros(n, np.float32) for _ in range(size)]
    ins = [np.ones(n, np.float32) for _ in range(size)]
    big = np.zeros(n * size, np.float32)
    bigin = np.ones(n * size, np.float32)
    bench(f"gather {nbytes}", lambda: dist.gather(a, outs if rank == 0 else None, 0), it)
    bench(f"scatter {nbytes}", lambda: dist.scatter(a, ins if rank == 0 else None, 0), it)
    bench(f"all_gather list {nbytes}", lambda: dist.all_gather(outs, a), it)
    bench(f"all_to_all list {nbytes}", lambda: dist.all_to_all(outs, ins), it)
    bench(f"all_to_all_single {nbytes}x{size}", lambda: dist.all_to_all_single(big, bigin), it)
    bench(f"broadcast {nbytes}", lambda: dist.broadcast(a, 0), it)
    bench(f"all_gather_into_tensor {nbytes}", lambda: dist.all_gather_into_tensor(big, a), it)
    bench(f"reduce {nbytes}", lambda: dist.reduce(a, 0), it)
    bench(f"reduce_scatter_tensor {nbytes}", lambda: dist.reduce_scatter_tensor(a, bigin), it)
dist.destroy_process_group()
