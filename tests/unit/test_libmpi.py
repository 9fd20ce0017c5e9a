"""The MPI library is chosen at run time (pydist/_libraries.py): one loaded already, PYDIST_LIBMPI, the
launcher's own, the build's. It is classified by what it exports (MPICH's ABI, Open MPI's, the MPI-5
standard ABI), and the build of pydist._C for that ABI is imported; none of the builds is linked to an
MPI library. A library of no known ABI, or one its launcher cannot start, is refused at import with a
message that names it. (scripts/test_libraries.sh runs the core multi-rank tests on MPICH 5, Intel MPI,
the standard ABI, Open MPI 4.1 and 5.0 with this same install.)

The libraries of other ABIs are stand-ins compiled here: a few exported names are all the checks read.
"""
import os
import shutil
import subprocess
import sys

import pytest

from pydist import _build_config, _libraries
from unit_helpers import run_script as run

VERSION = "import runpy, sys; sys.argv = ['pydist', '--version']; runpy.run_module('pydist', run_name='__main__')"


def compile_library(tmp_path, name, source):
    c = tmp_path / f"{name}.c"
    c.write_text(source)
    out = tmp_path / f"{name}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(c)], check=True, timeout=60)
    return str(out)


def version_function(text):
    return ('#include <string.h>\n'
            f'int MPI_Get_library_version(char *v, int *n) {{ strcpy(v, "{text}"); *n = (int)strlen(v); return 0; }}\n')


def builds():
    """{abi: file} of the builds of pydist._C beside the package."""
    here = os.path.dirname(_libraries.__file__)
    return {abi: os.path.join(here, f) for abi in _libraries.ABI_NAMES for f in os.listdir(here)
            if f.startswith(f"_C_{abi}.") and f.endswith(".so")}


def test_every_abi_has_a_build_and_none_names_an_mpi_library():
    # one build per ABI, each binding its MPI calls to whichever library import loaded
    assert sorted(builds()) == sorted(_build_config.ABIS) == sorted(_libraries.ABI_NAMES), (builds(), _build_config.ABIS)
    assert sys.modules["pydist._C"].__file__ == builds()[_libraries.LIBMPI[4]]
    for abi, path in builds().items():
        dynamic = subprocess.run(["objdump", "-p", path], capture_output=True, text=True, check=True).stdout
        needed = [line.split()[1] for line in dynamic.splitlines() if line.split()[:1] == ["NEEDED"]]
        assert needed and not [n for n in needed if "mpi" in n], (abi, needed)
        undefined = subprocess.run(["nm", "-D", "--undefined-only", path], capture_output=True, text=True,
                                   check=True).stdout
        assert "MPI_Init" in undefined, abi
        # the large-count calls where the ABI has them (Open MPI before 6 has none)
        assert ("MPI_Isend_c" in undefined) == (abi != "openmpi"), abi


def test_only_the_files_that_see_mpi_are_built_per_abi():
    # the engine, the kernels and the compressors are compiled once and linked into every build
    top = os.path.join(os.path.dirname(_libraries.__file__), "..")
    sys.path.insert(0, os.path.join(top, "buildsys"))
    try:
        import pydist_backend
    finally:
        sys.path.pop(0)
    mpi, shared = ([os.path.relpath(f, top) for f in files] for files in pydist_backend.mpi_sources(os.path.join(top, "csrc")))
    assert "csrc/engine/conv_direct_avx2.c" in shared and "csrc/core/kernels.c" in shared, shared
    assert "csrc/ops/collectives.c" in mpi and "csrc/paths/algorithms/ring.c" in mpi, mpi
    for f in shared:
        with open(os.path.join(top, f)) as source:
            text = source.read()
        assert "mpi_calls.h" not in text and "base.h" not in text, f


def test_the_build_recorded_its_library_and_import_loaded_it():
    assert os.path.isfile(_build_config.LIBMPI), _build_config.LIBMPI
    path, why, first, whole, abi = _libraries.LIBMPI
    assert os.path.samefile(path, _build_config.LIBMPI) and why == "the build's", _libraries.LIBMPI
    assert first == whole.strip().splitlines()[0] and "MPICH" in first
    assert abi == "mpich" == _build_config.MPI_ABI == sys.modules["pydist._C"].mpi_info()["abi"]


def test_version_names_the_library_that_runs():
    proc = run(VERSION)
    assert proc.returncode == 0, proc.stderr
    assert f"library {_build_config.LIBMPI}, MPICH's ABI (MPICH, Intel MPI, MVAPICH): the build's" in proc.stdout, \
        proc.stdout
    # the user's choice, named as such (the same file under another name: a link to it)
    proc = run(VERSION, PYDIST_LIBMPI=_build_config.LIBMPI)
    assert proc.returncode == 0, proc.stderr
    assert "PYDIST_LIBMPI chose it" in proc.stdout, proc.stdout


def test_a_rank_takes_its_launchers_library(tmp_path):
    # hydra starts every rank from PREFIX/bin/hydra_pmi_proxy: PREFIX/lib/libmpi.so.12 is the launcher's
    # MPI. Here the "proxy" is a copy of sh, and the library a link to the build's own.
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib").mkdir()
    shutil.copy("/bin/sh", tmp_path / "bin" / "hydra_pmi_proxy")
    os.symlink(_build_config.LIBMPI, tmp_path / "lib" / "libmpi.so.12")
    script = f"{sys.executable} -c \"{VERSION}\""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PYDIST_LIBMPI"))}
    kind = "MPICH's ABI (MPICH, Intel MPI, MVAPICH)"
    for pmi, expected in (({"PMI_RANK": "0"}, f"library {tmp_path}/lib/libmpi.so.12, {kind}: the launcher's own"),
                          ({}, f"library {_build_config.LIBMPI}, {kind}: the build's")):   # not a rank: not the launcher's
        proc = subprocess.run([str(tmp_path / "bin" / "hydra_pmi_proxy"), "-c", script], capture_output=True,
                              text=True, timeout=120, env=dict(env, **pmi))
        assert proc.returncode == 0, proc.stderr
        assert expected in proc.stdout, proc.stdout


def test_a_rank_of_open_mpis_launcher_takes_that_open_mpis_library(tmp_path):
    # Open MPI starts a rank from its daemon (prted, orted) or, on the launcher's own host, from the
    # launcher (prterun, orterun): that Open MPI's libmpi.so.40 is in PREFIX/lib, or beside the Open MPI
    # libraries the launcher has loaded (Debian: /usr/lib/<arch>, with the launcher in /usr/bin).
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib").mkdir()
    shutil.copy("/bin/sh", tmp_path / "bin" / "prterun")
    library = compile_library(tmp_path, "libompi", version_function("Open MPI v5.0.11") + "int ompi_mpi_comm_world;\n")
    os.rename(library, tmp_path / "lib" / "libmpi.so.40")
    # (_libraries.py alone: importing pydist would load the stand-in)
    script = (f"{sys.executable} -c \"import importlib.util as u; s = u.spec_from_file_location('l', "
              f"'{_libraries.__file__}'); l = u.module_from_spec(s); s.loader.exec_module(l); "
              f"print(*l._launcher_library(), sep='|')\"")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PYDIST_LIBMPI"))}
    proc = subprocess.run([str(tmp_path / "bin" / "prterun"), "-c", script], capture_output=True, text=True,
                          timeout=120, env=dict(env, OMPI_COMM_WORLD_SIZE="2"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{tmp_path}/lib/libmpi.so.40|the launcher's own ({tmp_path}/bin/prterun started " \
        "this process)", proc.stdout


@pytest.mark.parametrize("case", ["MPICH", "Intel MPI", "Open MPI", "standard ABI"])
def test_each_abi_is_told_by_what_its_library_exports(tmp_path, case):
    source, abi = {"MPICH": (version_function("MPICH Version: 4.0.2"), "mpich"),
                   "Intel MPI": (version_function("Intel(R) MPI Library 2021.16"), "mpich"),
                   "Open MPI": (version_function("Open MPI v4.1.4") + "int ompi_mpi_comm_world;\n", "openmpi"),
                   # MPICH 5's libmpi.so.12 has MPI_Abi_get_version too, and answers 0 there
                   "standard ABI": (version_function("MPICH Version: 5.0.2") +
                                    "int MPI_Abi_get_version(int *a, int *b) { *a = 1; *b = 0; return 0; }\n",
                                    "standard")}[case]
    path = compile_library(tmp_path, "libmpi_x", source)
    import ctypes
    assert _libraries.classify(ctypes.CDLL(path), path, "a test")[0] == abi
    plain = compile_library(tmp_path, "libmpi_y", version_function("MPICH Version: 5.0.2") +
                            "int MPI_Abi_get_version(int *a, int *b) { *a = 0; *b = 0; return 0; }\n")
    assert _libraries.classify(ctypes.CDLL(plain), plain, "a test")[0] == "mpich"


@pytest.mark.parametrize("case", ["no file", "no MPI", "unknown"])
def test_a_library_of_no_known_abi_is_refused_at_import(tmp_path, case):
    if case == "no file":
        path, expected = str(tmp_path / "libmpi.so.12"), "is no file"
    elif case == "no MPI":
        path, expected = compile_library(tmp_path, "libnothing", "int f(void) { return 1; }\n"), "is no MPI library"
    else:
        path, expected = compile_library(tmp_path, "libother", version_function("Some MPI 1.0")), "of an ABI pydist does not know"
    proc = run("import pydist", PYDIST_LIBMPI=path)
    assert proc.returncode != 0, proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: pydist: ") and expected in last and "PYDIST_LIBMPI" in last, proc.stderr


@pytest.mark.parametrize("case", ["hydra and Open MPI", "Open MPI's launcher and MPICH", "a variable left over"])
def test_a_launcher_that_cannot_start_the_library_is_refused_with_the_fix(tmp_path, case):
    # refused by init_process_group before MPI starts (import still works: python -m pydist --version)
    if case == "hydra and Open MPI":
        # (the real Open MPI: scripts/test_libraries.sh; a stand-in cannot be imported with)
        env, expected = dict(PMI_RANK="0", PMI_SIZE="2"), None
    elif case == "Open MPI's launcher and MPICH":
        env, expected = dict(PYDIST_LIBMPI=_build_config.LIBMPI, OMPI_COMM_WORLD_SIZE="2"), (
            "started by Open MPI's mpiexec (OMPI_COMM_WORLD_SIZE=2)", "is of MPICH's ABI",
            f"{_libraries.mpiexec()} -n 2 python ...", "unset PYDIST_LIBMPI")
    else:   # nothing chose a library: the build's MPICH, and Open MPI's variable from some other job
        env, expected = dict(OMPI_COMM_WORLD_SIZE="4"), (
            "the build's", "OMPI_COMM_WORLD_SIZE is left over in the environment: unset it")
    script = ("import pydist as dist\n"
              "try:\n"
              "    dist.init_process_group()\n"
              "except dist.DistError as e:\n"
              "    print(e); print(dist.is_initialized())\n")
    proc = run(script, **env)
    assert proc.returncode == 0, proc.stderr
    if expected is None:   # MPICH's library under a PMI launcher: fits, nothing said
        assert "cannot start" not in proc.stdout, proc.stdout
        return
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == "False" and all(e in lines[0] for e in expected), proc.stdout


def test_an_mpi_library_loaded_before_pydist_is_adopted_never_a_second(tmp_path):
    # mpi4py imported first has loaded its libmpi (for itself alone): pydist takes that one, globally
    script = ("import ctypes, os\n"
              f"ctypes.CDLL({_build_config.LIBMPI!r}, os.RTLD_LOCAL)\n"
              "import pydist, pydist._libraries as l\n"
              "print(l.LIBMPI[1]); pydist.init_process_group(); print(pydist.get_world_size())\n")
    proc = run(script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["loaded in this process already (before pydist: mpi4py?)", "1"], proc.stdout
    other = compile_library(tmp_path, "libmpich_other", version_function("MPICH Version: 4.0.2"))
    proc = run(script, PYDIST_LIBMPI=other)
    assert proc.returncode != 0, proc.stdout
    assert "two MPI libraries cannot share one process" in proc.stderr.strip().splitlines()[-1], proc.stderr


def test_a_library_without_a_call_pydist_makes_is_refused_by_name(tmp_path):
    # of MPICH's family by its version, but missing the calls: the loader's "undefined symbol", reworded
    path = compile_library(tmp_path, "libmpich_old", version_function("MPICH Version: 3.0.4") +
                           "int MPI_Init(int *c, char ***v) { return 0; }\n")
    proc = run("import pydist", PYDIST_LIBMPI=path)
    assert proc.returncode != 0, proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert f"the MPI library {path} (MPICH Version: 3.0.4; PYDIST_LIBMPI chose it) lacks MPI_" in last, proc.stderr


def test_the_build_records_the_librarys_run_time_name(tmp_path):
    # what setup.py writes to _build_config.LIBMPI: the link line's libNAME.so (a -dev package's link)
    # resolved to the library's own name (its SONAME) in that folder, the file every machine has
    sys.path.insert(0, os.path.join(os.path.dirname(_libraries.__file__), "..", "buildsys"))
    try:
        import pydist_backend
    finally:
        sys.path.pop(0)
    lib = tmp_path / "lib"
    lib.mkdir()
    c = tmp_path / "x.c"
    c.write_text("int MPI_Init(int *c, char ***v) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libmpich.so.12", "-o", str(lib / "libmpich.so.12.2.2"),
                    str(c)], check=True, timeout=60)
    os.symlink("libmpich.so.12.2.2", lib / "libmpich.so.12")
    os.symlink("libmpich.so.12", lib / "libmpich.so")
    flags = {"library_dirs": [str(lib)], "libraries": ["mpich", "pthread"]}
    assert pydist_backend.libmpi_file(flags) == str(lib / "libmpich.so.12")
    # where binutils is missing (gcc without the objdump name, as in Debian unstable's minimal root)
    real_run = pydist_backend._run
    pydist_backend._run = lambda cmd: None if cmd[0] == "objdump" else real_run(cmd)
    try:
        assert pydist_backend.libmpi_file(flags) == str(lib / "libmpich.so.12")
    finally:
        pydist_backend._run = real_run
    assert pydist_backend.libmpi_file({"library_dirs": [str(lib)], "libraries": ["pthread"]}) is None
    # Debian unstable's pkg-config names a folder holding only a link to the -dev link one level up
    (lib / "mpich").mkdir()
    os.symlink("../libmpich.so", lib / "mpich" / "libmpich.so")
    for objdump in (True, False):
        pydist_backend._run = real_run if objdump else (lambda cmd: None if cmd[0] == "objdump" else real_run(cmd))
        try:
            flags = {"library_dirs": [str(lib / "mpich")], "libraries": ["mpich"]}
            assert pydist_backend.libmpi_file(flags) == str(lib / "libmpich.so.12"), objdump
        finally:
            pydist_backend._run = real_run


def test_where_the_builds_library_is_gone_the_search_finds_one():
    # a wheel on another machine: the recorded file is missing there. The environment's lib/ first
    # (none in this venv), then the system loader's names: Debian has libmpich.so.12, not libmpi.so.12.
    script = ("from pydist import _libraries, _build_config\n"
              "_build_config.LIBMPI = '/gone/libmpich.so.12'\n"
              "_libraries.loaded_libmpi = lambda: None\n"   # (this process loaded the build's at import)
              "print(*_libraries.libmpi_choice(), sep='|')\n")
    proc = run(script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "libmpich.so.12|the system loader's (the build's /gone/libmpich.so.12 is gone)", proc.stdout
