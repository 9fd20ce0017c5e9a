"""Choose the MPI library a job runs on, load it, and import the build of pydist._C that matches it.

pydist._C names no MPI library (setup.py links it to none): its MPI_* calls bind to the library loaded
here, globally, before it, as mpi4py's wheels bind theirs. It is built once per MPI ABI
(csrc/core/mpi_calls.h), as pydist/_C_<abi>*.so:
  mpich     MPICH's ABI, libmpi.so.12: MPICH 4 and 5, Intel MPI, MVAPICH, Cray MPICH
  openmpi   Open MPI's, libmpi.so.40: Open MPI 4.1 and 5.0
  standard  the MPI-5 standard ABI, libmpi_abi.so.1: MPICH 5 (Open MPI 6 will have it)
Which library, the first that applies (`python -m pydist --version` says):
  1. one this process has loaded already (mpi4py imported first): adopted, never a second beside it;
  2. ``PYDIST_LIBMPI=/path/to/libmpi.so.N``, the user's choice, where the launcher can start it;
  3. the launcher's own: a rank that hydra started (its parent is PREFIX/bin/hydra_pmi_proxy) takes
     PREFIX/lib/libmpi.so.12, one that Open MPI's mpiexec started (its parent is prted, orted, or
     the launcher itself) the libmpi.so.40 of that Open MPI;
  4. the library the build was made against: PyPI's mpich package, or the file setup.py recorded;
  5. where that is gone (a wheel on another machine), mpi4py's search: the interpreter's prefixes'
     lib/ (a venv with PyPI's mpich or impi-rt), then the system loader's libmpi.so.12, libmpich.so.12,
     libmpi.so.40.
The library is classified by the symbols it exports (Open MPI's ompi_mpi_comm_world, the standard
ABI's MPI_Abi_get_version) and its version string. A launcher that cannot start its ranks (Open MPI's
mpiexec with an MPICH library, hydra with Open MPI's) is refused by init_process_group, before MPI
starts, with the command that works (pairing_problem).

The libraries a build took from PyPI packages (MPICH, OpenBLAS: buildsys/pydist_backend.py) are
loaded from wherever pip put them, with no run path: the build environment they sat in is gone, and a
path baked into the wheel would not survive `auditwheel repair`.
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
    return _build_config("PYPI_LIBRARIES", [])


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


# The MPI ABIs pydist._C is built for (csrc/core/mpi_calls.h), and their libraries' file names.
ABI_NAMES = {"mpich": ("libmpi.so.12", "libmpich.so.12"), "openmpi": ("libmpi.so.40",),
             "standard": ("libmpi_abi.so.1",)}
ABI_KIND = {"mpich": "MPICH's ABI (MPICH, Intel MPI, MVAPICH)", "openmpi": "Open MPI's ABI",
            "standard": "the MPI-5 standard ABI"}
_NAMES = ABI_NAMES["mpich"] + ABI_NAMES["openmpi"]   # searched for, in this order, where nothing else chose
_ALL_NAMES = _NAMES + ABI_NAMES["standard"]


def launcher():
    """(family, variable) of the launcher that started this process, from what it set in the
    environment: ("openmpi", "OMPI_COMM_WORLD_SIZE") for Open MPI's mpiexec/mpirun, ("pmi", ...) for
    a PMI launcher (hydra: MPICH's and Intel MPI's mpiexec; srun --mpi=pmi2), ("pmix", "PMIX_RANK")
    for srun --mpi=pmix or another PMIx server, (None, None) for a process started alone."""
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        return "openmpi", "OMPI_COMM_WORLD_SIZE"
    for var in ("PMI_FD", "PMI_PORT", "PMI_RANK"):
        if var in os.environ:
            return "pmi", var
    if "PMIX_RANK" in os.environ:
        return "pmix", "PMIX_RANK"
    return None, None


_LAUNCHER_NAME = {"openmpi": "Open MPI's mpiexec", "pmi": "a PMI launcher (hydra: MPICH's or Intel MPI's mpiexec; "
                  "srun --mpi=pmi2)", "pmix": "a PMIx launcher (srun --mpi=pmix)"}
# The launcher processes whose children are ranks: hydra's proxy, and Open MPI's daemons (5.0: prted,
# or prterun itself for a job on its own host; 4.1: orted, or orterun).
_HYDRA = ("hydra_pmi_proxy",)
_OPEN_MPI_DAEMONS = ("prted", "prterun", "prte", "orted", "orterun", "mpirun", "mpiexec")


def _parent_libraries(pid):
    """The folders of the shared objects process `pid` has mapped, in the order they appear."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            paths = [line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6]
    except OSError:
        return []
    return list(dict.fromkeys(os.path.dirname(p) for p in paths if p.startswith("/") and ".so" in p))


def _launcher_library():
    """(path, why) of the MPI library of the launcher that started this process, or None: a rank
    whose parent is PREFIX/bin/hydra_pmi_proxy takes PREFIX/lib/libmpi.so.12 (or libmpich.so.12); one
    whose parent is an Open MPI daemon takes the libmpi.so.40 of that Open MPI (PREFIX/lib, or beside
    the daemon's own Open MPI libraries: Debian keeps them in /usr/lib/<arch>)."""
    family, _ = launcher()
    if family not in ("openmpi", "pmi"):
        return None
    ppid = os.getppid()
    try:
        exe = os.readlink(f"/proc/{ppid}/exe")
    except OSError:
        return None
    name = os.path.basename(exe)
    bindir = os.path.dirname(exe)
    prefix = os.path.dirname(bindir) if os.path.basename(bindir) == "bin" else None
    if family == "pmi" and name.startswith(_HYDRA) and prefix:
        names, folders = ABI_NAMES["mpich"], [os.path.join(prefix, "lib")]
    elif family == "openmpi" and name.split(".")[0] in _OPEN_MPI_DAEMONS:
        names = ABI_NAMES["openmpi"]
        folders = ([os.path.join(prefix, "lib"), os.path.join(prefix, "lib64")] if prefix else []) + \
            [d for d in _parent_libraries(ppid) if os.path.basename(d) != "openmpi"]
    else:
        return None
    for folder in folders:
        for lib in names:
            if os.path.isfile(os.path.join(folder, lib)):
                return os.path.join(folder, lib), f"the launcher's own ({exe} started this process)"
    return None


def _site_prefixes():
    import site
    import sys
    prefixes = [sys.exec_prefix] if sys.exec_prefix != sys.base_exec_prefix else []
    if site.ENABLE_USER_SITE:
        prefixes.append(os.path.abspath(site.USER_BASE))
    return prefixes + [p for p in (sys.base_exec_prefix,) if p != "/usr"]


def loaded_libmpi():
    """The MPI library this process has loaded already (mpi4py imported before pydist), or None."""
    try:
        with open("/proc/self/maps") as f:
            paths = [line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6]
    except OSError:
        return None
    # (the mapped file is the library's own: libmpich.so.12.2.2 for libmpich.so.12)
    return next((p for p in paths if any(os.path.basename(p) == n or os.path.basename(p).startswith(n + ".")
                                         for n in _ALL_NAMES)), None)


def _build_config(name, default=None):
    try:
        from . import _build_config
    except ImportError:   # built before _build_config existed
        return default
    return getattr(_build_config, name, default)


def libmpi_choice():
    """(the MPI library to load: a path, or a name for the system loader to find; why that one)."""
    chosen = os.environ.get("PYDIST_LIBMPI", "")
    loaded = loaded_libmpi()
    if loaded:
        # Never a second libmpi beside it: its symbols would mix with the other's
        if chosen and os.path.realpath(chosen) != os.path.realpath(loaded):
            raise ImportError(f"pydist: PYDIST_LIBMPI={chosen!r}, but this process has loaded the MPI library "
                              f"{loaded} already (imported before pydist: mpi4py?), and two MPI libraries cannot "
                              f"share one process: unset PYDIST_LIBMPI, or point it at {loaded}")
        return loaded, "loaded in this process already (before pydist: mpi4py?)"
    if chosen:   # (init_process_group checks it against the launcher: pairing_problem)
        if not os.path.isfile(chosen):
            raise ImportError(f"pydist: PYDIST_LIBMPI={chosen!r} is no file: point it at an MPI library "
                              f"({', '.join(_ALL_NAMES)}), or unset it")
        return os.path.abspath(chosen), "PYDIST_LIBMPI chose it"
    own = _launcher_library()
    if own is not None:
        return own
    if "mpich" in _pypi_libraries():
        return str(_installed_file("mpich", _LIBRARY["mpich"])), "the build's (PyPI's mpich)"
    built = _build_config("LIBMPI")
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


# What import loaded: (path, why, the version's first line, the whole version, the ABI), for --version
# and errors.
LIBMPI = None


def _version_string(lib):
    import ctypes
    buf, length = ctypes.create_string_buffer(8192), ctypes.c_int()   # MPI_MAX_LIBRARY_VERSION_STRING
    lib.MPI_Get_library_version(buf, ctypes.byref(length))
    return buf.value.decode("utf-8", "replace")


def classify(lib, path, why):
    """(the ABI of `lib`: "mpich", "openmpi" or "standard"; its version string), from the symbols it
    exports (MPI_Get_library_version may be called before MPI_Init), or ImportError for a library of
    none of them."""
    import ctypes
    if not hasattr(lib, "MPI_Get_library_version"):
        raise ImportError(f"pydist: {path} ({why}) is no MPI library: it has no MPI_Get_library_version. Point "
                          f"PYDIST_LIBMPI at an MPI library ({', '.join(_ALL_NAMES)}), or unset it")
    version = _version_string(lib)
    if hasattr(lib, "ompi_mpi_comm_world"):
        return "openmpi", version
    abi_version = getattr(lib, "MPI_Abi_get_version", None)
    if abi_version is not None:   # MPI 5's standard ABI (libmpi_abi.so) answers with major >= 1
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        if abi_version(ctypes.byref(major), ctypes.byref(minor)) == 0 and major.value > 0:
            return "standard", version
    if any(mark in version for mark in ("MPICH", "Intel(R) MPI", "MVAPICH")):
        return "mpich", version
    first = version.strip().splitlines()[0] if version.strip() else "(no version)"
    raise ImportError(f"pydist: {path} ({first}; {why}) is of an ABI pydist does not know: it runs on "
                      f"{', '.join(ABI_KIND.values())}. Point PYDIST_LIBMPI at one, or unset it")


def pairing_problem(fn):
    """Why the launcher that started this process cannot start ranks of the library loaded (Open MPI's
    mpiexec with an MPICH library, hydra with Open MPI's: each rank would run alone, or abort), with
    the command that works; None where they fit. Said by init_process_group before MPI starts."""
    family, var = launcher()
    # (A PMIx server alone, srun --mpi=pmix, is init_process_group's Slurm check's to judge.)
    fits = {"openmpi": ("openmpi",), "pmi": ("mpich", "standard")}.get(family)
    n = os.environ.get("OMPI_COMM_WORLD_SIZE" if family == "openmpi" else "PMI_SIZE", "N")
    if LIBMPI is None or fits is None or LIBMPI[4] in fits or n == "1":   # (one rank alone is alone anyway)
        return None
    path, why, first, _, abi = LIBMPI
    tool = mpiexec_for(path, abi)
    fix = f"start it with that library's own launcher ({tool or 'its mpiexec'} -n {n} python ...), or "
    if abi == "openmpi" and "SLURM_STEP_NUM_TASKS" in os.environ:   # srun --mpi=pmi2: Open MPI speaks PMIx
        fix = f"run it as `srun --mpi=pmix ...` (Open MPI speaks PMIx, not PMI-2), or "
    if why.startswith("PYDIST_LIBMPI"):
        fix += "unset PYDIST_LIBMPI to run on the launcher's own library"
    else:
        fix += (f"point PYDIST_LIBMPI at a library of the launcher's MPI (if no launcher started this process, "
                f"{var} is left over in the environment: unset it)")
    return (f"{fn}(): this process was started by {_LAUNCHER_NAME[family]} ({var}={os.environ.get(var, '')}), but "
            f"the MPI library chosen, {path} ({first}; {why}), is of {ABI_KIND[abi]}, which that launcher cannot "
            f"start: each rank would run alone as rank 0 of 1, or abort; {fix}")


def speaks_pmix():
    """Whether the MPI library loaded talks to a PMIx server (srun --mpi=pmix): Open MPI always; MPICH
    where its configure line (in its version string) says so."""
    return LIBMPI is not None and (LIBMPI[4] == "openmpi" or "pmix" in LIBMPI[3].lower())


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
    build took, before pydist._C itself; the ABI of the library loaded (which build of pydist._C
    matches it)."""
    import ctypes
    global LIBMPI
    path, why = libmpi_choice()
    # RTLD_GLOBAL also for one loaded already: mpi4py's extension loaded it for itself alone
    mode = os.RTLD_GLOBAL | os.RTLD_NOW | (os.RTLD_NOLOAD if why.startswith("loaded") else 0)
    try:
        lib = ctypes.CDLL(path, mode)
    except OSError as e:
        raise ImportError(f"pydist: cannot load the MPI library {path} ({why}): {e}. Install an MPI (Debian/"
                          f"Ubuntu: apt-get install -y mpich, or openmpi-bin; or pip install mpich), or point "
                          f"PYDIST_LIBMPI at its libmpi") from None
    abi, version = classify(lib, path, why)
    first = version.strip().splitlines()[0] if version.strip() else "(no version)"
    init = getattr(lib, "MPI_Init", None)   # (where a library lacks it, importing pydist._C says so)
    LIBMPI = ((_file_of(init) if init is not None else None) or path, why, first, version, abi)
    _load_impi_libfabric(lib, path)
    for name in _pypi_libraries():
        if name != "mpich":
            ctypes.CDLL(str(_installed_file(name, _LIBRARY[name])))
    return abi


def import_build(abi):
    """pydist._C: the build for `abi` (pydist/_C_<abi>*.so), imported under the name pydist._C."""
    import importlib.machinery
    import importlib.util
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    files = [os.path.join(here, f"_C_{abi}{suffix}") for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    path = next((f for f in files if os.path.isfile(f)), None)
    if path is None:
        built = _build_config("ABIS", [])
        raise ImportError(f"pydist: the MPI library {LIBMPI[0]} ({LIBMPI[2]}; {LIBMPI[1]}) is of {ABI_KIND[abi]}, "
                          f"and this pydist has no build for it (it has {', '.join(built) or 'none'}): reinstall "
                          f"pydist where pip can fetch that ABI's headers, or run on a library of "
                          f"{' or '.join(ABI_KIND[a] for a in built) or 'another ABI'}")
    loader = importlib.machinery.ExtensionFileLoader("pydist._C", path)
    spec = importlib.util.spec_from_file_location("pydist._C", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules["pydist._C"] = module
    try:
        loader.exec_module(module)
    except BaseException:
        del sys.modules["pydist._C"]
        raise
    setattr(sys.modules[__package__], "_C", module)   # as the import system does for a submodule
    return module


def mpiexec_for(path, abi):
    """The launcher of the MPI whose library is `path` (of `abi`): the mpiexec beside it (PREFIX/bin for
    PREFIX/lib, or PREFIX/lib/<arch>; Debian names it mpiexec.mpich or mpiexec.openmpi), or None."""
    if not path or not os.path.isabs(path):
        return None
    family = "openmpi" if abi == "openmpi" else "mpich"
    folder = os.path.dirname(os.path.realpath(path))
    for _ in range(3):
        folder = os.path.dirname(folder)
        for name in (f"mpiexec.{family}", "mpiexec"):
            tool = os.path.join(folder, "bin", name)
            if os.path.isfile(tool) and os.access(tool, os.X_OK):
                return tool
    return None


def _tool(name):
    """MPI's `name` (mpiexec, mpicc) of the MPI pydist runs on: the one beside its library (PyPI's
    mpich package's, a prefix's bin/, Debian's name.mpich or name.openmpi in /usr/bin), else the one on
    PATH (Debian calls it name.mpich; a plain name may be another MPI's)."""
    import shutil
    if LIBMPI is not None:
        beside = mpiexec_for(LIBMPI[0], LIBMPI[4])
        tool = beside and os.path.join(os.path.dirname(beside), os.path.basename(beside).replace("mpiexec", name))
        if tool and os.path.isfile(tool) and os.access(tool, os.X_OK):
            return tool
    family = "openmpi" if LIBMPI is not None and LIBMPI[4] == "openmpi" else "mpich"
    return f"{name}.{family}" if shutil.which(f"{name}.{family}") or not shutil.which(name) else name


def mpiexec():
    """The launcher that matches the MPI library pydist runs on."""
    return _tool("mpiexec")


def mpicc():
    """The compiler wrapper of that same MPI, for C programs that run beside pydist under mpiexec()
    (benchmarks/collectives_raw.c): one built with another MPI's would load the wrong libmpi."""
    return _tool("mpicc")
