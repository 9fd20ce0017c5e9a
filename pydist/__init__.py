"""pydist: torch.distributed semantics on NumPy arrays, over MPI (MPICH), with a C core::

    import pydist as dist
    dist.init_process_group(backend="mpi")
    dist.all_reduce(array)            # in place, summed over every rank

Run with ``mpiexec -n 4 python script.py``.
"""


def _refuse_an_unbuilt_source_folder():
    """`python -m pydist` or `import pydist` inside pydist's checkout imports this folder, not the installed
    package; without an in-place build it has no extension, and the import would fail deep inside with
    words about something else. Say so in one sentence, as NumPy does."""
    import glob
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    top = os.path.dirname(here)
    if (not glob.glob(os.path.join(here, "_C_*.so")) and os.path.isfile(os.path.join(top, "setup.py"))
            and os.path.isdir(os.path.join(top, "csrc"))):
        raise ImportError(f"pydist: {top} is pydist's source folder, which has no build, and Python imports "
                          f"pydist from it rather than the installed one: run from another folder, or build "
                          f"here first (python setup.py build_ext --inplace)")


_refuse_an_unbuilt_source_folder()

from .distributed import *  # noqa: E402,F401,F403
from .distributed import __all__  # noqa: E402,F401

__version__ = "0.1.0"


def _timeline_from_env():
    from . import timeline
    timeline._from_env()   # PYDIST_TIMELINE=run.json: the job's timeline starts with the world group


def _timeline_stop():
    import sys
    timeline = sys.modules.get(__name__ + ".timeline")   # (never started if never imported)
    if timeline is not None and timeline._active is not None:
        timeline.stop()   # PYDIST_TIMELINE: the job's timeline ends with its group


from . import distributed as _distributed  # noqa: E402
_distributed._at_init.append(_timeline_from_env)
_distributed._at_destroy.append(_timeline_stop)

def __getattr__(name):
    # dist.timeline("run.json") records a region (pydist/timeline.py, a callable module), imported on
    # first use so that `python -m pydist.timeline` runs it fresh
    if name == "timeline":
        import importlib
        return importlib.import_module(".timeline", __name__)
    raise AttributeError(f"module 'pydist' has no attribute {name!r}")
