"""python -m pydist script.py [args...]: run a script so that a failure on any rank ends the job.

An exception or a non-zero sys.exit() on one rank prints a [rankN]-prefixed message and calls
MPI_Abort, so mpiexec ends every rank within a second instead of leaving them waiting in their next
collective. (init_process_group installs the same hook for exceptions; this also covers sys.exit, and
errors before init: such a rank joins MPI's start-up, where the others wait for it, and aborts the job
from there, within 30 s.)

    mpiexec.mpich -n 4 python -m pydist train.py --epochs 5

python -m pydist --version: pydist's version, and the MPI and BLAS it was built with and runs on.
"""
import os
import runpy
import sys

from . import _C
from .distributed import _abort, _abort_before_start, _ending_words, _excepthook, _rank_prefix


def version():
    from . import __version__, _build_config
    from ._libraries import LIBMPI
    mpi = _C.mpi_info()["library_version"].strip().splitlines()[0]
    from .profile import simd_summary
    from ._libraries import ABI_KIND
    built = ", ".join(getattr(_build_config, "ABIS", []))
    return (f"pydist {__version__}\n  built with MPI from {_build_config.MPI}, for the ABIs {built}\n"
            f"  running on {mpi}\n"
            f"    library {LIBMPI[0]}, {ABI_KIND[LIBMPI[4]]}: {LIBMPI[1]} (PYDIST_LIBMPI=/path/to/libmpi.so "
            f"picks another)\n"
            f"  BLAS from {_build_config.BLAS}, running its {_C.blas_core()} kernels\n  zlib from {_build_config.ZLIB}\n"
            f"  vector kernels: {simd_summary()}")


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--version":
        print(version())
        return 0
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) >= 2 else 2
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code != 0:
            if not isinstance(e.code, int):
                sys.stderr.write(f"{_rank_prefix()}: {e.code}\n")
            sys.stderr.write(f"{_rank_prefix()}: exited with status {code}, {_ending_words()}\n")
            _abort(code, f"sys.exit({e.code!r})")
            _abort_before_start(code)   # (returns only where MPI never started: a job of one)
        raise
    except BaseException:
        _excepthook(*sys.exc_info())
        _C.abort(1)   # returns where MPI never started: the others wait for this rank in its start-up
        _abort_before_start(1)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
