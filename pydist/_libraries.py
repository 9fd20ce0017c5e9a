"""Load the libraries pydist._C was linked to from PyPI packages, before pydist._C itself.

A build that took MPICH or OpenBLAS from PyPI (buildsys/pydist_backend.py) links to libmpi.so.12 and
libscipy_openblas.so by name, with no run path: the build environment they sat in is gone, and a path
baked into the wheel would not survive `auditwheel repair`. Loading them here, from wherever pip put
the `mpich` and `scipy-openblas32` packages, satisfies the extension's needs by name, and takes them
before any other libmpi.so.12 the system's loader would find (a Debian MPICH), so that libmpi and the
mpiexec beside it always come from the same MPICH.
"""
import ctypes
import importlib.metadata
import shutil
from pathlib import Path

# What each PyPI package provides, and where in its files.
_LIBRARY = {"mpich": "lib/libmpi.so.12", "scipy-openblas32": "lib/libscipy_openblas.so"}


def _installed_file(dist_name, suffix):
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(f"pydist was built against PyPI's {dist_name}, which is not installed here: "
                          f"`pip install {dist_name}`, or rebuild pydist") from None
    name = suffix.rsplit("/", 1)[-1]
    for f in dist.files or []:   # RECORD's names are relative to site-packages: ../../libmpi.so.12
        if f.name == name:
            path = Path(dist.locate_file(f)).resolve()
            if path.as_posix().endswith(suffix):
                return path
    raise ImportError(f"pydist: the installed {dist_name} {dist.version} has no {suffix}")


def load():
    try:
        from . import _build_config
    except ImportError:   # built before _build_config existed: nothing to load
        return
    for name in _build_config.PYPI_LIBRARIES:
        ctypes.CDLL(str(_installed_file(name, _LIBRARY[name])))


def mpiexec():
    """The launcher that matches the MPI library pydist runs on: the mpich package's own mpiexec (a
    full path) when the build took MPICH from PyPI, else MPICH's on PATH (Debian calls it
    mpiexec.mpich; a plain mpiexec may be another MPI's)."""
    try:
        from . import _build_config
    except ImportError:
        _build_config = None
    if _build_config is not None and "mpich" in _build_config.PYPI_LIBRARIES:
        return str(_installed_file("mpich", "bin/mpiexec"))
    return "mpiexec.mpich" if shutil.which("mpiexec.mpich") or not shutil.which("mpiexec") else "mpiexec"
