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


def mpi_env(timeout):
    env = dict(os.environ)
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
