"""Load the libraries pydist._C was linked to from PyPI packages, before pydist._C itself.

A build that took MPICH or OpenBLAS from PyPI (buildsys/pydist_backend.py) links to libmpi.so.12 and
libscipy_openblas.so by name, with no run path: the build environment they sat in is gone, and a path
baked into the wheel would not survive `auditwheel repair`. Loading them here, from wherever pip put
the `mpich` and `scipy-openblas32` packages, satisfies the extension's needs by name, and takes them
before any other libmpi.so.12 the system's loader would find (a Debian MPICH), so that libmpi and the
mpiexec beside it always come from the same MPICH.

The MPI library is chosen at run time, as mpi4py's wheels choose theirs: pydist._C names no MPI
library (setup.py links it to none); its MPI_* calls bind to the library loaded here, globally, before
it. Any library of MPICH's ABI (libmpi.so.12: MPICH 3.1 and later, Intel MPI, MVAPICH, Cray MPICH)
serves the same build. Which one, the first that applies (`python -m pydist --version` says):
  1. ``PYDIST_LIBMPI=/path/to/libmpi.so.12``, the user's choice;
  2. the launcher's own: a rank that hydra started (its parent is PREFIX/bin/hydra_pmi_proxy) takes
     PREFIX/lib/libmpi.so.12 (or libmpich.so.12), so that each MPICH's or Intel MPI's mpiexec runs
     the same installed pydist on its own library;
  3. the library the build was made against: PyPI's mpich package, or the file setup.py recorded;
  4. where that is gone (a wheel on another machine), mpi4py's search: the interpreter's prefixes'
     lib/ (a venv with PyPI's mpich or impi-rt), then the system loader's libmpi.so.12, libmpich.so.12.
A library of another ABI (Open MPI's libmpi.so.40, the MPI-5 standard ABI) is refused at import.
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


def _launcher_prefix():
    """PREFIX when this process was started by PREFIX/bin/hydra_pmi_proxy (MPICH's and Intel MPI's
    launchers start every rank from one), else None."""
    if "PMI_RANK" not in os.environ and "PMI_FD" not in os.environ:
        return None
    try:
        exe = os.readlink(f"/proc/{os.getppid()}/exe")
    except OSError:
        return None
    if not os.path.basename(exe).startswith("hydra_pmi_proxy"):
        return None
    bindir = os.path.dirname(exe)
    return os.path.dirname(bindir) if os.path.basename(bindir) == "bin" else None


def _site_prefixes():
    import site
    import sys
    prefixes = [sys.exec_prefix] if sys.exec_prefix != sys.base_exec_prefix else []
    if site.ENABLE_USER_SITE:
        prefixes.append(os.path.abspath(site.USER_BASE))
    return prefixes + [p for p in (sys.base_exec_prefix,) if p != "/usr"]


_NAMES = ("libmpi.so.12", "libmpich.so.12")   # MPICH's ABI: the library's name in each distribution


def libmpi_choice():
    """(the MPI library to load: a path, or a name for the system loader to find; why that one)."""
    chosen = os.environ.get("PYDIST_LIBMPI", "")
    if chosen:
        if not os.path.isfile(chosen):
            raise ImportError(f"pydist: PYDIST_LIBMPI={chosen!r} is no file: point it at an MPI library "
                              f"of MPICH's ABI (libmpi.so.12), or unset it")
        return os.path.abspath(chosen), "PYDIST_LIBMPI chose it"
    prefix = _launcher_prefix()
    for name in _NAMES if prefix else ():
        if os.path.isfile(os.path.join(prefix, "lib", name)):
            return os.path.join(prefix, "lib", name), f"the launcher's own ({prefix}/bin/hydra_pmi_proxy started this process)"
    if "mpich" in _pypi_libraries():
        return str(_installed_file("mpich", _LIBRARY["mpich"])), "the build's (PyPI's mpich)"
    try:
        from . import _build_config
        built = getattr(_build_config, "LIBMPI", None)
    except ImportError:
        built = None
    if built and os.path.isfile(built):
        return built, "the build's"
    for prefix in _site_prefixes():
        for name in _NAMES:
            if os.path.isfile(os.path.join(prefix, "lib", name)):
                return os.path.join(prefix, "lib", name), f"found in {prefix}/lib" + (
                    f" (the build's {built} is gone)" if built else "")
    for name in _NAMES:   # the first name the system's loader finds (ldconfig's cache, LD_LIBRARY_PATH)
        if _loadable(name):
            return name, "the system loader's" + (f" (the build's {built} is gone)" if built else "")
    return _NAMES[0], "the system loader's"


def _loadable(name):
    import ctypes
    try:
        ctypes.CDLL(name, os.RTLD_LOCAL | os.RTLD_LAZY)
        return True
    except OSError:
        return False


# What import loaded: (path, why, the version's first line, the whole version), for --version and errors.
LIBMPI = None


def _version_string(lib):
    import ctypes
    buf, length = ctypes.create_string_buffer(8192), ctypes.c_int()   # MPI_MAX_LIBRARY_VERSION_STRING
    lib.MPI_Get_library_version(buf, ctypes.byref(length))
    return buf.value.decode("utf-8", "replace")


def _refuse_other_abis(lib, path, why):
    """Its version string, or ImportError unless `lib` is of MPICH's ABI (what pydist._C was compiled
    for: integer handles, MPICH's constants). MPI_Get_library_version may be called before MPI_Init."""
    import ctypes
    if not hasattr(lib, "MPI_Get_library_version"):
        raise ImportError(f"pydist: {path} ({why}) is no MPI library: it has no MPI_Get_library_version. Point "
                          f"PYDIST_LIBMPI at an MPI library of MPICH's ABI (libmpi.so.12), or unset it")
    if hasattr(lib, "ompi_mpi_comm_world"):
        kind = "Open MPI's"
    else:
        kind = None
        abi_version = getattr(lib, "MPI_Abi_get_version", None)
        if abi_version is not None:   # MPI 5's standard ABI (libmpi_abi.so) answers with major >= 1
            major, minor = ctypes.c_int(0), ctypes.c_int(0)
            if abi_version(ctypes.byref(major), ctypes.byref(minor)) == 0 and major.value > 0:
                kind = f"the MPI standard ABI {major.value}.{minor.value}"
    version = _version_string(lib)
    first = version.strip().splitlines()[0] if version.strip() else "(no version)"
    if kind is None and not any(mark in version for mark in ("MPICH", "Intel(R) MPI", "MVAPICH")):
        kind = "an unknown ABI"
    if kind is not None:
        raise ImportError(f"pydist: {path} ({first}; {why}) is of {kind}, not MPICH's: pydist runs on a library "
                          f"of MPICH's ABI (libmpi.so.12: MPICH, Intel MPI, MVAPICH, Cray MPICH). Point "
                          f"PYDIST_LIBMPI at one, or unset it")
    return version


def speaks_pmix():
    """Whether the MPI library loaded was built to talk to a PMIx server (srun --mpi=pmix): MPICH's
    version string carries its configure line."""
    return LIBMPI is not None and "pmix" in LIBMPI[3].lower()


def _load_impi_libfabric(lib, path):
    """Intel MPI opens libfabric itself, by name: from its own folder, as mpi4py does, where the user
    did not say otherwise (I_MPI_OFI_LIBRARY_INTERNAL=0, or I_MPI_FABRICS=shm needs none)."""
    import ctypes
    internal = os.environ.get("I_MPI_OFI_LIBRARY_INTERNAL", "").lower() not in ("0", "no", "off", "false", "disable")
    if not hasattr(lib, "I_MPI_Check_image_status") or not internal or os.environ.get("I_MPI_FABRICS") == "shm":
        return
    libdir = os.path.dirname(os.path.realpath(path))
    root = os.path.dirname(libdir)
    for sub in (("opt", "mpi", "libfabric", "lib"), ("libfabric", "lib"), ("libfabric",), ("lib", "libfabric"), ("lib",)):
        fabric = os.path.join(root, *sub, "libfabric.so.1")
        if os.path.isfile(fabric):
            prov = os.path.join(os.path.dirname(fabric), "prov")
            os.environ.setdefault("FI_PROVIDER_PATH", prov if os.path.isdir(prov) else os.path.dirname(fabric))
            ctypes.CDLL(fabric, os.RTLD_GLOBAL)
            return


def _file_of(function):
    """The file a loaded function came from (dladdr), or None."""
    import ctypes

    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]
    info = DlInfo()
    if not ctypes.CDLL(None).dladdr(ctypes.cast(function, ctypes.c_void_p), ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.fsdecode(info.dli_fname)


def load():
    """Load the MPI library (globally: pydist._C's MPI calls bind to it) and the PyPI libraries the
    build took; before pydist._C itself."""
    import ctypes
    global LIBMPI
    path, why = libmpi_choice()
    try:
        lib = ctypes.CDLL(path, os.RTLD_GLOBAL | os.RTLD_NOW)
    except OSError as e:
        raise ImportError(f"pydist: cannot load the MPI library {path} ({why}): {e}. Install MPICH "
                          f"(apt-get install -y mpich, or pip install mpich), or point PYDIST_LIBMPI at "
                          f"a libmpi.so.12") from None
    version = _refuse_other_abis(lib, path, why)
    _load_impi_libfabric(lib, path)
    LIBMPI = (_file_of(lib.MPI_Init) or path, why, version.strip().splitlines()[0] if version.strip() else "(no version)",
              version)
    for name in _pypi_libraries():
        if name != "mpich":
            ctypes.CDLL(str(_installed_file(name, _LIBRARY[name])))


def _mpich_tool(name):
    """MPICH's `name` (mpiexec, mpicc) from the MPICH pydist runs on: the mpich package's own (a full
    path) when the build took MPICH from PyPI, else the one on PATH (Debian calls it name.mpich; a
    plain name may be another MPI's)."""
    import shutil
    if LIBMPI is not None and LIBMPI[1] != "the build's":
        # the library was chosen at run time: its own MPICH's tool, where it has one beside it
        tool = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(LIBMPI[0]))), "bin", name)
        if os.path.isfile(tool) and os.access(tool, os.X_OK):
            return tool
    return f"{name}.mpich" if shutil.which(f"{name}.mpich") or not shutil.which(name) else name


def mpiexec():
    """The launcher that matches the MPI library pydist runs on."""
    return _mpich_tool("mpiexec")


def mpicc():
    """The compiler wrapper of that same MPICH, for C programs that run beside pydist under mpiexec()
    (benchmarks/collectives_raw.c): one built with another MPICH's would load the wrong libmpi."""
    return _mpich_tool("mpicc")
