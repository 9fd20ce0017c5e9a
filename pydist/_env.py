"""pydist's own settings that Python reads from the environment (docs/reference/environment.md), parsed
strictly: unset or empty is the default, and any other value must be one the setting takes, in full, or
it is a ValueError naming the variable and what it takes, where the setting is first read. (The byte
counts and thread level that C reads are checked the same way by init_process_group, csrc/groups/group.c, and
listed by ``_C.mpi_info()["settings"]``.)

Not here: PYDIST_RUN_DIR, PYDIST_RUN_ATTEMPT_DIR and PYDIST_TIMELINE are paths, and PYDIST_MPI_OWNER is
pydist's own record, only ever compared whole.
"""
import os


def _choice(name, allowed):
    value = os.environ.get(name, "")
    if value == "":
        return None
    if value.lower() not in allowed:
        raise ValueError(f"{name} must be {' or '.join(allowed)} (any case), or unset; got {value!r}")
    return value.lower()


def _count(name, default, most):
    value = os.environ.get(name, "")
    if value == "":
        return default
    # ASCII digits alone: int() would also take "+3", " 3", "1_0" and other scripts' digits
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= most:
        raise ValueError(f"{name} must be a whole number from 1 to {most} (or unset: {default}); got {value!r}")
    return int(value)


def _flag(name):
    value = os.environ.get(name, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{name} must be 1 (on), 0 or unset (off); got {value!r}")
    return value == "1"


#: Each setting and how it is read: what read(name) returns.
READERS = {
    "PYDIST_WAIT": lambda: _choice("PYDIST_WAIT", ("mpi",)),                   # None: pydist's wait loop
    "PYDIST_DEBUG": lambda: _choice("PYDIST_DEBUG", ("off", "detail")),       # None: off
    "PYDIST_BLAS_THREADS": lambda: _count("PYDIST_BLAS_THREADS", 1, 1024),    # _C.set_blas_threads' range
    "PYDIST_SURVIVE": lambda: _flag("PYDIST_SURVIVE"),
}


def read(name):
    """The setting `name` as its reader parses it now; ValueError, naming it, when malformed."""
    return READERS[name]()
