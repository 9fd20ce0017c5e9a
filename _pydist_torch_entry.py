"""torch's entry point into pydist (pyproject.toml: the "torch.backends" entry-point group, which
``import torch`` loads): ``torch.distributed.init_process_group("pydist")`` works in a script that never
imports pydist.

What ``import torch`` pays for it: this file and two dictionary entries. It starts no MPI and imports
nothing of pydist (not even the package: pydist/__init__.py loads the C extension and libmpi). The
pydist side comes in when a job asks for it:
- the backend's creator imports pydist.torch, whose creator it then is;
- torch's env:// rendezvous with RANK, WORLD_SIZE, MASTER_ADDR or MASTER_PORT unset, under an MPI
  launcher (MPICH's hydra, Intel MPI's, Open MPI's, Slurm's srun with PMI-2 or PMIx) or for
  init_process_group("pydist") itself, imports pydist.torch first, which fills them in from MPI (rank
  0's address and a free port), as ``import pydist.torch`` does: a plain ``python script.py`` is then a
  world of one, and a launcher pydist cannot run under gets pydist's own diagnosis rather than
  "environment variable RANK expected". Everywhere else (gloo outside a launcher) env:// is torch's own,
  untouched.
TORCH_DEVICE_BACKEND_AUTOLOAD=0 (torch's switch for every such entry point) turns this off."""
import os
import sys


def _create(options, backend_options=None):
    import pydist.torch
    return pydist.torch._create(options, backend_options)


# The rank each MPI launcher gives its processes: hydra (MPICH, Intel MPI) and srun --mpi=pmi2; Open
# MPI's mpiexec; srun --mpi=pmix
LAUNCHER_RANKS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def _under_mpi_launcher():
    return any(k in os.environ for k in LAUNCHER_RANKS)


def _asked_for_pydist():
    """Whether init_process_group(backend="pydist"...) is the caller: torch does not tell a rendezvous
    handler the backend, so it is read from torch's frame (absent or another: no)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "init_process_group" and "backend" in frame.f_locals:
            return "pydist" in str(frame.f_locals["backend"]).lower()
        frame = frame.f_back
    return False


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
        unset = not all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
        if unset and (_under_mpi_launcher() or _asked_for_pydist()):
            import pydist.torch  # noqa: F401  (fills them in from MPI)
        return torch_env(url, *args, **kwargs)

    env_filled_in_from_mpi.pydist_fills_in = True
    handlers["env"] = env_filled_in_from_mpi
