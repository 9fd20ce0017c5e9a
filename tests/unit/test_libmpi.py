"""The MPI library is chosen at run time (pydist/_libraries.py): PYDIST_LIBMPI, else the launcher's own,
else the build's. pydist._C is linked to none, and a library of another ABI is refused at import with a
message that names it. (scripts/test_libraries.sh runs the core multi-rank tests on PyPI's MPICH 5 and
Intel MPI with this same build.)

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


def test_the_extension_names_no_mpi_library():
    # one build for every library of MPICH's ABI: the MPI calls bind to whichever import loaded
    dynamic = subprocess.run(["objdump", "-p", _libraries.__file__.replace("_libraries.py", "") + os.path.basename(
        sys.modules["pydist._C"].__file__)], capture_output=True, text=True, check=True).stdout
    needed = [line.split()[1] for line in dynamic.splitlines() if line.split()[:1] == ["NEEDED"]]
    assert needed and not [n for n in needed if "mpi" in n], needed
    assert "MPI_Init" in subprocess.run(["nm", "-D", "--undefined-only", sys.modules["pydist._C"].__file__],
                                        capture_output=True, text=True, check=True).stdout


def test_the_build_recorded_its_library_and_import_loaded_it():
    assert os.path.isfile(_build_config.LIBMPI), _build_config.LIBMPI
    path, why, first, whole = _libraries.LIBMPI
    assert os.path.samefile(path, _build_config.LIBMPI) and why == "the build's", _libraries.LIBMPI
    assert first == whole.strip().splitlines()[0] and "MPICH" in first


def test_version_names_the_library_that_runs():
    proc = run(VERSION)
    assert proc.returncode == 0, proc.stderr
    assert f"library {_build_config.LIBMPI}, the build's" in proc.stdout, proc.stdout
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
    for pmi, expected in (({"PMI_RANK": "0"}, f"library {tmp_path}/lib/libmpi.so.12, the launcher's own"),
                          ({}, f"library {_build_config.LIBMPI}, the build's")):   # not a rank: not the launcher's
        proc = subprocess.run([str(tmp_path / "bin" / "hydra_pmi_proxy"), "-c", script], capture_output=True,
                              text=True, timeout=120, env=dict(env, **pmi))
        assert proc.returncode == 0, proc.stderr
        assert expected in proc.stdout, proc.stdout


@pytest.mark.parametrize("case", ["no file", "no MPI", "Open MPI", "standard ABI", "unknown"])
def test_a_library_of_another_abi_is_refused_at_import(tmp_path, case):
    if case == "no file":
        path, expected = str(tmp_path / "libmpi.so.12"), "is no file"
    elif case == "no MPI":
        path, expected = compile_library(tmp_path, "libnothing", "int f(void) { return 1; }\n"), "is no MPI library"
    elif case == "Open MPI":
        path = compile_library(tmp_path, "libompi", version_function("Open MPI v4.1.4") + "int ompi_mpi_comm_world;\n")
        expected = "(Open MPI v4.1.4; PYDIST_LIBMPI chose it) is of Open MPI's, not MPICH's"
    elif case == "standard ABI":
        path = compile_library(tmp_path, "libmpi_abi", version_function("MPICH Version: 5.0.2") +
                               "int MPI_Abi_get_version(int *a, int *b) { *a = 1; *b = 0; return 0; }\n")
        expected = "is of the MPI standard ABI 1.0, not MPICH's"
    else:
        path, expected = compile_library(tmp_path, "libother", version_function("Some MPI 1.0")), "of an unknown ABI"
    proc = run("import pydist", PYDIST_LIBMPI=path)
    assert proc.returncode != 0, proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: pydist: ") and expected in last and "PYDIST_LIBMPI" in last, proc.stderr


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
              "print(*_libraries.libmpi_choice(), sep='|')\n")
    proc = run(script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "libmpich.so.12|the system loader's (the build's /gone/libmpich.so.12 is gone)", proc.stdout
