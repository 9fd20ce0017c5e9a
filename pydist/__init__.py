"""pydist: torch.distributed semantics on NumPy arrays, over MPI (MPICH), with a C core.

    import pydist as dist
    dist.init_process_group(backend="mpi")
    dist.all_reduce(array)            # in place, summed over every rank

Run with ``mpiexec -n 4 python script.py``.
"""
from .distributed import *  # noqa: F401,F403
from .distributed import __all__  # noqa: F401

__version__ = "0.1.0"
