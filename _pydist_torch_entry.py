"""torch's entry point into pydist (pyproject.toml: the "torch.backends" entry-point group, which
``import torch`` loads): ``torch.distributed.init_process_group("pydist")`` works in a script that never
imports pydist.

What ``import torch`` pays for it: this file and two dictionary entries. It starts no MPI and imports
nothing of pydist (not even the package: pydist/__init__.py loads the C extension and libmpi). The
pydist side comes in when a job asks for it:
- the backend's creator imports pydist.torch, whose creator it then is;
- torch's env:// rendezvous, under an MPI launcher (PMI_RANK in the environment: MPICH's hydra, Intel
  MPI's, Slurm's srun --mpi=pmi2) with RANK, WORLD_SIZE, MASTER_ADDR or MASTER_PORT unset, imports
  pydist.torch first, which fills them in from MPI (rank 0's address and a free port), as
  ``import pydist.torch`` does. Everywhere else env:// is torch's own, untouched.
TORCH_DEVICE_BACKEND_AUTOLOAD=0 (torch's switch for every such entry point) turns this off."""
import os
import sys


def _create(options, backend_options=None):
    import pydist.torch
    return pydist.torch._create(options, backend_options)


def _under_mpi_launcher():
    return "PMI_RANK" in os.environ


def register():
    import torch.distributed as tdist
    if not tdist.is_available():
        return
    if "PYDIST" not in tdist.Backend._plugins:
        tdist.Backend.register_backend("pydist", _create, extended_api=True, devices=["cpu"])
    handlers = sys.modules["torch.distributed.rendezvous"]._rendezvous_handlers
    torch_env = handlers.get("env")
    if torch_env is None or getattr(torch_env, "pydist_fills_in", False):
        return

    def env_filled_in_from_mpi(url, *args, **kwargs):
        if _under_mpi_launcher() and not all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                                         "MASTER_PORT")):
            import pydist.torch  # noqa: F401  (fills them in from MPI)
        return torch_env(url, *args, **kwargs)

    env_filled_in_from_mpi.pydist_fills_in = True
    handlers["env"] = env_filled_in_from_mpi
