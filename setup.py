"""Build pydist._C against MPICH.

MPICH is found by itself: an ``MPICC`` variable (a path to mpicc) wins; otherwise ``pkg-config mpich``;
otherwise ``mpicc.mpich -show`` / ``mpicc -show``. Without MPICH the build stops with one line saying
what to install. The training engine needs a CBLAS and zlib, found the same way: ``pkg-config openblas``
(Debian: libopenblas-dev) and ``pkg-config zlib`` (zlib1g-dev). ``PYDIST_ASAN=1`` builds with AddressSanitizer (the test suite does this once).
"""
import glob
import os
import shlex
import shutil
import subprocess
import sys

import numpy
from setuptools import Extension, setup

MISSING_MPI = ("pydist: MPICH was not found; install it first (Debian/Ubuntu: "
               "`apt-get install -y mpich libmpich-dev`), or set MPICC to the mpicc of an MPICH install")
MISSING_BLAS = ("pydist: OpenBLAS was not found (`pkg-config openblas`); install it first (Debian/Ubuntu: "
                "`apt-get install -y libopenblas-dev`)")
MISSING_ZLIB = ("pydist: zlib was not found (`pkg-config zlib`); install it first (Debian/Ubuntu: "
                "`apt-get install -y zlib1g-dev`)")


def _run(cmd):
    try:
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _from_show(mpicc):
    """Split `mpicc -show` into include dirs, library dirs, libraries and extra link args."""
    out = _run([mpicc, "-show"])
    if not out:
        return None
    flags = {"include_dirs": [], "library_dirs": [], "libraries": [], "extra_link_args": []}
    for tok in shlex.split(out)[1:]:  # the first word is the compiler itself
        if tok.startswith("-I"):
            flags["include_dirs"].append(tok[2:])
        elif tok.startswith("-L"):
            flags["library_dirs"].append(tok[2:])
        elif tok.startswith("-l"):
            flags["libraries"].append(tok[2:])
        elif tok.startswith("-Wl,"):
            flags["extra_link_args"].append(tok)
    return flags if flags["libraries"] else None


def _from_pkg_config(name):
    pkg_config = os.environ.get("PKG_CONFIG", "pkg-config")
    cflags = _run([pkg_config, "--cflags", name])
    libs = _run([pkg_config, "--libs", name])
    if cflags is None or libs is None:
        return None
    flags = {"include_dirs": [], "library_dirs": [], "libraries": [], "extra_link_args": []}
    for tok in shlex.split(cflags):
        if tok.startswith("-I"):
            flags["include_dirs"].append(tok[2:])
    for tok in shlex.split(libs):
        if tok.startswith("-L"):
            flags["library_dirs"].append(tok[2:])
        elif tok.startswith("-l"):
            flags["libraries"].append(tok[2:])
        else:
            flags["extra_link_args"].append(tok)
    return flags if flags["libraries"] else None


def find_mpich():
    if os.environ.get("MPICC"):
        found = _from_show(os.environ["MPICC"])
        if found is None:
            sys.exit(f"pydist: MPICC={os.environ['MPICC']} does not answer `-show`; point it at MPICH's mpicc")
        return found
    found = _from_pkg_config("mpich")
    if found is None:
        for cc in ("mpicc.mpich", "mpicc"):
            if shutil.which(cc):
                found = _from_show(cc)
                if found:
                    break
    if found is None:
        sys.exit(MISSING_MPI)
    return found


def merge(*found):
    flags = {"include_dirs": [], "library_dirs": [], "libraries": [], "extra_link_args": []}
    for f in found:
        for key in flags:
            flags[key] += [v for v in f[key] if v not in flags[key]]
    return flags


def extension():
    mpich = find_mpich()
    blas, zlib = _from_pkg_config("openblas"), _from_pkg_config("zlib")
    if blas is None:
        sys.exit(MISSING_BLAS)
    if zlib is None:
        sys.exit(MISSING_ZLIB)
    mpi = merge(mpich, blas, zlib)
    # -O3: GCC's vectorizer with its normal cost model (at -O2 it skips any loop that needs a remainder,
    # which is most of the engine's kernels); it never reorders float arithmetic, so results are unchanged.
    compile_args = ["-O3", "-Wall", "-Wextra", "-fvisibility=hidden", "-std=c11"]
    link_args = list(mpi["extra_link_args"])
    if os.environ.get("PYDIST_ASAN") == "1":
        compile_args += ["-fsanitize=address", "-fno-omit-frame-pointer", "-g"]
        link_args += ["-fsanitize=address"]
    return Extension(
        "pydist._C",
        sources=sorted(glob.glob("csrc/*.c") + glob.glob("csrc/*/*.c")),
        depends=glob.glob("csrc/*.h") + glob.glob("csrc/*/*.h"),
        include_dirs=[numpy.get_include(), "csrc"] + mpi["include_dirs"],
        library_dirs=mpi["library_dirs"],
        libraries=mpi["libraries"],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
        define_macros=[("_GNU_SOURCE", None)],
    )


setup(ext_modules=[extension()])
