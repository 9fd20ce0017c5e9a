"""Load the libraries pydist._C was linked to from PyPI packages, before pydist._C itself.

A build that took MPICH or OpenBLAS from PyPI (buildsys/pydist_backend.py) links to libmpi.so.12 and
libscipy_openblas.so by name, with no run path: the build environment they sat in is gone, and a path
baked into the wheel would not survive `auditwheel repair`. Loading them here, from wherever pip put
the `mpich` and `scipy-openblas32` packages, satisfies the extension's needs by name, and takes them
before any other libmpi.so.12 the system's loader would find (a Debian MPICH), so that libmpi and the
mpiexec beside it always come from the same MPICH.
"""
import os
from pathlib import Path

# What each PyPI package provides, and where in its files.
_LIBRARY = {"mpich": "lib/libmpi.so.12", "scipy-openblas32": "lib/libscipy_openblas.so"}


def _installed_file(dist_name, suffix):
    import importlib.metadata   # here, as ctypes and shutil: 18 ms of every `import pydist` otherwise
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


def _pypi_libraries():
    try:
        from . import _build_config
    except ImportError:   # built before _build_config existed: nothing from PyPI
        return []
    return _build_config.PYPI_LIBRARIES


# OpenBLAS picks its kernels from the CPU model it reads at load time, and an OpenBLAS older than the
# CPU does not know the model: Debian 12's 0.3.21 on a Xeon of model 207 (Emerald Rapids) falls back to
# its generic "Prescott" kernels, 34 GFLOP/s for a float32 GEMM where its SkylakeX kernels reach 160.
# The instruction sets the CPU reports settle which kernels can run, so the engine's OpenBLAS is told
# the family by name (OPENBLAS_CORETYPE) unless the user set one. Newer CPUs of a family run the same
# float32 kernels (OpenBLAS' Cooperlake and SapphireRapids use SkylakeX's sgemm; Zen uses Haswell's).
# PYDIST_SIMD, the cap on every vector kernel of pydist's (csrc/core/simd.h), caps the BLAS's family too:
# sse2 takes Prescott's (SSE3, the oldest family OpenBLAS builds for x86-64).
_CORE_BY_FLAGS = (("SKYLAKEX", {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}),
                  ("HASWELL", {"avx2", "fma"}))


def blas_coretype(cpuinfo="/proc/cpuinfo", simd=None):
    """The OPENBLAS_CORETYPE for this CPU's instruction sets, capped at the level PYDIST_SIMD (or `simd`)
    names; None where there is no file, or no cap and none of ours. A PYDIST_SIMD that names no level
    is left to pydist._C's import, which refuses it."""
    simd = os.environ.get("PYDIST_SIMD") if simd is None else simd
    if simd == "sse2":
        return "PRESCOTT"
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return None
    families = _CORE_BY_FLAGS[1:] if simd == "avx2" else _CORE_BY_FLAGS
    return next((core for core, needs in families if needs <= set(flags)), None)


def load():
    import ctypes
    for name in _pypi_libraries():
        ctypes.CDLL(str(_installed_file(name, _LIBRARY[name])))


def _mpich_tool(name):
    """MPICH's `name` (mpiexec, mpicc) from the MPICH pydist runs on: the mpich package's own (a full
    path) when the build took MPICH from PyPI, else the one on PATH (Debian calls it name.mpich; a
    plain name may be another MPI's)."""
    import shutil
    if "mpich" in _pypi_libraries():
        return str(_installed_file("mpich", f"bin/{name}"))
    return f"{name}.mpich" if shutil.which(f"{name}.mpich") or not shutil.which(name) else name


def mpiexec():
    """The launcher that matches the MPI library pydist runs on."""
    return _mpich_tool("mpiexec")


def mpicc():
    """The compiler wrapper of that same MPICH, for C programs that run beside pydist under mpiexec()
    (benchmarks/collectives_raw.c): one built with another MPICH's would load the wrong libmpi."""
    return _mpich_tool("mpicc")
