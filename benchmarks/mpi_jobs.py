"""What the benchmark drivers share: the environment MPICH jobs run in, and running one job under a
hard timeout. The same settings as tests/run_mpi.py, so benchmarks and tests run MPICH alike."""
import os
import shutil
import signal
import subprocess
import sys

from pydist import _libraries as pydist_libraries

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIEXEC = shutil.which(pydist_libraries.mpiexec())   # the one matching pydist's libmpi


def library_path():
    """LD_LIBRARY_PATH's head when PYDIST_LIBMPI chose pydist's MPI library (pydist/_libraries.py): a
    folder where both of MPICH's ABI names, libmpich.so.12 (Debian's, which collectives_raw and mpi4py
    built with mpicc.mpich ask for) and libmpi.so.12, lead to it. So the raw-C baseline and mpi4py run
    on the library pydist runs on, which is what makes them a baseline. The folder also links every
    other file beside the library: the library finds its own (PyPI's MPICH its libfabric and UCX, Intel
    MPI its libfabric) from $ORIGIN, which is this folder when it is loaded through it. None when the
    build's library runs."""
    chosen = os.environ.get("PYDIST_LIBMPI")
    if not chosen or pydist_libraries.LIBMPI is None:
        return None
    target = os.path.realpath(pydist_libraries.LIBMPI[0])
    beside = os.path.dirname(target)
    links = os.path.join(ROOT, "benchmarks", ".build", "libmpi", target.strip(os.sep).replace(os.sep, "-"))
    os.makedirs(links, exist_ok=True)
    wanted = {name: os.path.join(beside, name) for name in os.listdir(beside)}
    if pydist_libraries.LIBMPI[4] == "mpich":   # (Open MPI's programs ask for libmpi.so.40, beside it)
        wanted.update({"libmpich.so.12": target, "libmpi.so.12": target})
    for name, to in wanted.items():
        link = os.path.join(links, name)
        if not (os.path.islink(link) and os.readlink(link) == to):
            if os.path.lexists(link):
                os.unlink(link)
            os.symlink(to, link)
    return links


def mpi_env(timeout):
    env = dict(os.environ)
    head = library_path()
    if head:
        env["LD_LIBRARY_PATH"] = head + (os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env["MPIEXEC_TIMEOUT"] = str(int(timeout))  # hydra kills the job itself if it hangs
    env["UCX_ERROR_SIGNALS"] = ""
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize < 64 << 20:
            env["UCX_TLS"] = "^posix"  # UCX's shared-memory segments would not fit
    except OSError:
        env["UCX_TLS"] = "^posix"
    return env


def run(cmd, timeout, who, env=None):
    """Run `cmd` (an mpiexec job) from the repository root, with the variables in `env` set over
    mpi_env's; returns (exit status, output). A job that outlives `timeout` is killed with every rank
    it started and ends the benchmark with its output."""
    # Own session, so a timeout can kill mpiexec and every rank it started, not only mpiexec.
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**mpi_env(timeout), **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout + 10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        shown = " ".join(cmd[:8]) + (" ..." if len(cmd) > 8 else "")
        sys.exit(f"{who}: {shown}\ndid not finish within {timeout + 10:.0f} s and was killed; its output:\n{output}")
    return proc.returncode, output
