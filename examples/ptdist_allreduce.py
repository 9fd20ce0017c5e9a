"""All-reduce: three ranks hold 1, 2 and -3; after a SUM all-reduce every rank holds 0.

The second program of PyTorch's distributed tutorial, on NumPy arrays. Run it with three ranks:

    mpiexec.mpich -n 3 python examples/ptdist_allreduce.py

(Any number of ranks works: rank r holds [1, 2, -3][r % 3].)
"""
import numpy as np

import pydist as dist


def run(rank, size):
    tensor = np.array([[1.0], [2.0], [-3.0]][rank % 3])
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)   # in place, on every rank
    print(f"Rank {rank} has data {tensor[0]}", flush=True)


if __name__ == "__main__":
    dist.init_process_group(backend="mpi")
    run(dist.get_rank(), dist.get_world_size())
    dist.destroy_process_group()
