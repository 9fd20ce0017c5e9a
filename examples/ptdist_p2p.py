"""Point-to-point: rank 0 sends [1., -1.] to rank 1.

The first program of PyTorch's "Writing Distributed Applications with PyTorch" tutorial, on NumPy
arrays. Run it with two ranks:

    mpiexec.mpich -n 2 python examples/ptdist_p2p.py
"""
import numpy as np

import pydist as dist


def run(rank, size):
    tensor = np.zeros(2)
    if rank == 0:
        tensor[:] = [1.0, -1.0]
        dist.send(tensor, dst=1)          # blocking send to rank 1
    elif rank == 1:
        sender = dist.recv(tensor, src=0) # blocking receive, in place; returns the sender
        assert sender == 0
    print(f"Rank {rank} has data {tensor}", flush=True)


if __name__ == "__main__":
    dist.init_process_group(backend="mpi")
    if dist.get_world_size() < 2:
        raise SystemExit("ptdist_p2p.py needs 2 ranks: mpiexec.mpich -n 2 python examples/ptdist_p2p.py")
    run(dist.get_rank(), dist.get_world_size())
    dist.destroy_process_group()
