"""Shared set-up for the world-size-1 tests (plain pytest, no mpiexec).

- UCX_ERROR_SIGNALS is emptied before MPI starts, so UCX leaves Python's fault handler in place
  and a crash shows a Python traceback (DESIGN.md).
- One default process group for the whole session (`process_group`, autouse). A test that destroys
  it or re-initialises it with other arguments asks for `restore_group`, which puts back a plain
  `init_process_group(backend="mpi")` afterwards, whatever the test left behind.
- Ctrl-C reaches Python: a shell without job control starts a background command (`cmd &`, `nohup`)
  with SIGINT ignored, and then `_thread.interrupt_main()` does nothing, so the tests of Ctrl-C
  during a wait would wait forever. Python's own handler is put back.
- A watchdog per test: a library bug that makes a wait never return ends the run with every
  thread's traceback (faulthandler) instead of hanging CI. Tests that exercise a wait which may
  never finish use their own short timeouts, so the watchdog is only the last resort.
"""
import faulthandler
import os
import signal

import pytest

os.environ.setdefault("UCX_ERROR_SIGNALS", "")
os.environ.setdefault("PYDIST_TUNE", "off")   # jobs take the built-in paths, whatever this machine has measured
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pydist as dist  # noqa: E402
from unit_helpers import init_default, reset_group  # noqa: E402

# Longer than any test's own timeouts (test_build's pip install: 600 s + 120 s), so that these fire
# first and name what hung; and over 3x the slowest test (test_train_compare_quick, 80 s quiet).
WATCHDOG_S = 900


@pytest.fixture(scope="session", autouse=True)
def process_group():
    if not dist.is_initialized():
        init_default()
    yield
    if _watchdog_file is not None:
        _watchdog_file.close()


@pytest.fixture
def restore_group():
    """For tests that destroy or re-initialise the default group: restore a plain one afterwards."""
    yield
    reset_group()


_watchdog_file = None


def _uncaptured_stderr(config):
    """A file on the terminal's stderr even while pytest captures fd 2, so the dump is seen."""
    global _watchdog_file
    if _watchdog_file is None:
        fd = 2
        capman = config.pluginmanager.getplugin("capturemanager")
        try:  # pytest keeps the original fd 2 here while it captures (an internal: fall back to 2)
            fd = capman._global_capturing.err.targetfd_save
        except AttributeError:
            pass
        _watchdog_file = os.fdopen(os.dup(fd), "w")
    return _watchdog_file


@pytest.fixture(autouse=True)
def watchdog(request):
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True, file=_uncaptured_stderr(request.config))
    yield
    faulthandler.cancel_dump_traceback_later()
