"""python -m pydist.run: start a job with MPICH's mpiexec, and when a rank dies, start it again from the
newest checkpoint (an elastic launcher, as torchrun's agent is for torch, over MPI).

    python -m pydist.run -n 3 --max-restarts 3 -- -m pydist.train --checkpoint run.ckpt --resume-if-present \\
        --checkpoint-every 50
    python -m pydist.run -n 4 --min-ranks 2 --hosts a:2,b:2 -- train.py --epochs 10

After `--` comes the program each rank runs: `-m MODULE ARGS` or `SCRIPT.py ARGS` (with this Python), or
any command. The program resumes from its checkpoint when it starts (pydist.train: --checkpoint with
--resume-if-present; a script: Trainer.load when the file exists, or its own state: the guide "When a rank
dies", docs/guides/fault-tolerance.md).

When a rank dies (an exception, a non-zero exit, a signal, SIGKILL, or a host that stops answering,
which its peers name), mpiexec ends the job and the launcher says which rank, on which host, why, and how
many steps were lost since the newest checkpoint, then starts the job again, up to --max-restarts times.
A rank that fails before it begins init_process_group ends the attempt at once (the others would wait for
it in MPI's start-up). What a restart would only repeat is not restarted: a usage error (exit status 2),
or every rank failing the same way (the same status and last line: a missing file, a checkpoint of
another model).
A rank that fails twice running on the same host is left out, and a host that no longer answers (with
--hosts) is dropped: the job goes on at fewer ranks, down to --min-ranks. It exits with the job's status:
0 once a run finishes (every rank's program ended with status 0, whatever mpiexec's own status), else
the failed rank's (128 + N for a signal N). Ctrl-C ends every rank (SIGINT to mpiexec, SIGTERM 10 s
later) and says in one line which checkpoint and records it kept; exit status 130.

--survive (for the asynchronous strategies: downpour, adag, aeasgd, dynsgd; needs hydra's mpiexec, MPICH's
or Intel MPI's, since Open MPI's ends the whole job when a rank dies): mpiexec runs with
-disable-auto-cleanup, so a worker's end does not end the job; the watcher records it and exits with a
status rather than the signal, the servers learn of it from that record within a second, hand its
unfinished block to the other workers, and the job finishes without it (exit status 0). The job needs
its servers and its program: what training did not go on without fails the job as it would without
--survive (restarted, then given up with the failed rank's status): a server's death, any rank's in
another strategy, and a failure outside training (rank 0's script raising after fit(), a worker's after
the last training call). A rank that dies outside any collective (after the last one) costs the
survivors 3 s at exit, never a hang. The verdict comes from this launch's records and the job's own
word: it finished without the dead ranks when every rank's end is recorded, every other rank ended
cleanly, and training reported going on without each of them.

The run's folder (--run-dir, or a temporary pydist-run-* one) holds the ranks' records and rank 0's
progress; it is cleared after a clean finish (the temporary one removed) and kept, and named, after a
failure. A --run-dir is cleared of an earlier launch's records when a launch starts, and refused while
another launcher uses it. With --hosts, a host that does not share the folder makes its own, and its
watchers remove it after their rank ends cleanly; the launcher then learns only from mpiexec and its own
host's records, so name a --run-dir on a shared file system (--survive needs one: the ranks read each
other's records).

Each rank runs under a small watcher (this module, --watch), the process mpiexec starts: it runs the
rank as its child, notes how the child ended (status, signal, its last line on stderr), and passes the
status on. The watcher dies with its rank's job and the rank with its watcher. Ranks find the run's
folder in PYDIST_RUN_DIR and the attempt in PYDIST_RESTART (0 the first time); Trainer.fit reports its
step and checkpoints there (report() below, which a script of one's own may call too).
"""
import argparse
import collections
import contextlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from . import _files

PROGRESS = "progress.json"   # in PYDIST_RUN_DIR: the newest step and checkpoint (rank 0 writes it)


def report(**fields):
    """Tell the launcher how far the job is (rank 0: `step`, and after a checkpoint `checkpoint`, its
    path, and `checkpoint_step`). Nothing when not started by python -m pydist.run."""
    folder = os.environ.get("PYDIST_RUN_DIR")
    if not folder:
        return
    path = os.path.join(folder, PROGRESS)
    with _reporting:   # the training loop and Reporting's thread both report
        try:
            with open(path) as f:
                state = json.load(f)
        except (OSError, ValueError):
            state = {}
        # the furthest step of this attempt (a new one starts again from its checkpoint)
        same_attempt = (state.get("restart") == os.environ.get("PYDIST_RESTART") and
                        state.get("run_id") == os.environ.get("PYDIST_RUN_ID"))
        if not same_attempt:
            state = {}
        step = max(fields.get("step", 0), fields.get("checkpoint_step", 0), state.get("step", 0))
        state.update(fields, step=step, time=time.time(), restart=os.environ.get("PYDIST_RESTART"),
                     run_id=os.environ.get("PYDIST_RUN_ID"))
        write_json(path, state)   # the launcher reads a whole file or the previous one


_reporting = threading.Lock()


class Reporting:
    """While open, report(step=read()) whenever the step read moves, every `interval` seconds, from a
    thread of its own (the training loop holds no GIL while it computes). Nothing when not launched."""
    def __init__(self, read, interval=0.2):
        self.read, self.interval = read, interval
        self.stop, self.thread = threading.Event(), None

    def _loop(self):
        last = None
        while not self.stop.wait(self.interval):
            step = self.read()
            if step != last:
                report(step=step)
                last = step

    def __enter__(self):
        if os.environ.get("PYDIST_RUN_DIR"):
            self.thread = threading.Thread(target=self._loop, daemon=True, name="pydist.run progress")
            self.thread.start()
        return self

    def __exit__(self, *exc):
        if self.thread is not None:
            self.stop.set()
            self.thread.join()


def write_json(path, value):
    """Write `value` to `path` whole or not at all, never through a link planted there (_files.replacing)."""
    with _files.replacing(path) as f:
        json.dump(value, f)


def _read_json(path, limit=1 << 20):
    """A JSON object from a file of ours, or None when it is missing, unreadable, too big (a planted or
    damaged file), not JSON, or not an object. Never follows a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)
        value = json.loads(data, parse_constant=lambda name: None) if len(data) <= limit else None
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _count(value):
    """A step count from a record: an int >= 0 (not a bool), else None."""
    return value if type(value) is int and 0 <= value < 1 << 62 else None


def _finite(value):
    """A time from a record: a finite float, or an int a float holds (not a bool)."""
    return (type(value) is float and math.isfinite(value)) or (type(value) is int and abs(value) < 1 << 53)


def read_progress(folder, run_id=None):
    """The job's progress as rank 0 last reported it (report()), validated: a dict with `step` (and, once
    a checkpoint was written, `checkpoint`, a path, and `checkpoint_step`; under --survive, once training
    went on without some ranks, `without`, their world ranks), `restart` and `run_id`; {}
    when there is no report, or one that is malformed, or (with `run_id`) one of another launch."""
    state = _read_json(os.path.join(folder, PROGRESS))
    if state is None or (run_id is not None and state.get("run_id") != run_id):
        return {}
    out = {}
    for key in ("restart", "run_id"):
        if isinstance(state.get(key), str):
            out[key] = state[key]
    if _count(state.get("step")) is not None:
        out["step"] = state["step"]
    without = state.get("without")
    if isinstance(without, list) and len(without) < 1 << 20 and all(_count(r) is not None for r in without):
        out["without"] = without   # --survive: the world ranks the job says it went on without
    if _count(state.get("checkpoint_step")) is not None and isinstance(state.get("checkpoint"), str):
        out["checkpoint_step"], out["checkpoint"] = state["checkpoint_step"], state["checkpoint"][:4096]
    return out


def read_record(folder, rank, run_id=None):
    """What rank `rank`'s watcher recorded of its end (rank, host, pid, started, ended, status, signal,
    last_line, dead_peer_pid), validated; None when there is no record, a malformed one, or (with
    `run_id`) one of another launch."""
    rec = _read_json(os.path.join(folder, f"rank-{rank}.json"))
    if rec is None or type(rec.get("rank")) is not int or rec["rank"] != rank or (run_id is not None and rec.get("run_id") != run_id):
        return None
    if not (type(rec.get("status")) is int and 0 <= rec["status"] < 256 and _finite(rec.get("ended"))):
        return None
    optional = {"host": (lambda v: isinstance(v, str), "?"), "pid": (lambda v: _count(v) is not None, 0),
                "started": (_finite, rec["ended"]), "last_line": (lambda v: isinstance(v, str), ""),
                "signal": (lambda v: v is None or (type(v) is int and 0 < v < 128), None),
                "dead_peer_pid": (lambda v: v is None or _count(v) is not None, None)}
    for key, (ok, default) in optional.items():
        if key in rec and not ok(rec[key]):
            return None
        rec.setdefault(key, default)
    rec["last_line"] = rec["last_line"][-1000:]
    return rec


# ---------------------------------------------------------------------------------------------------
# The watcher: one per rank, started by mpiexec

def ended_at(rank):
    """When world rank `rank` of this attempt ended, as its watcher recorded it (time.time()); None when
    there is no record (not under python -m pydist.run, or not yet written)."""
    folder = os.environ.get("PYDIST_RUN_ATTEMPT_DIR")
    rec = read_record(folder, rank, os.environ.get("PYDIST_RUN_ID")) if folder else None
    return rec["ended"] if rec is not None else None


def _die_with_parent():
    """In the child: receive SIGKILL when the watcher dies (Linux), so no rank outlives its job."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _ignore_usr1_and_die_with_parent():
    """--survive: hydra (-disable-auto-cleanup) sends SIGUSR1 to the ranks left when one dies; the
    watchers' records are how they learn it, and Python's default for SIGUSR1 would end them."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    _die_with_parent()


def _write_record(folder, record):
    write_json(os.path.join(folder, f"rank-{record['rank']}.json"), dict(record, run_id=os.environ.get("PYDIST_RUN_ID")))


def _pmi_rank():
    value = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMIX_RANK", "0")))
    return int(value) if value.isascii() and value.isdigit() and len(value) < 10 else 0


def _started():
    """When this rank's watcher started it (PYDIST_RUN_STARTED), or now when that is missing or malformed:
    record_end runs on the way to MPI_Abort and must not raise."""
    try:
        value = float(os.environ.get("PYDIST_RUN_STARTED", ""))
    except ValueError:
        return time.time()
    return value if math.isfinite(value) else time.time()


def record_end(status, why):
    """In a rank that is about to end the job (MPI_Abort: mpiexec then kills every watcher at once):
    write what its watcher would have."""
    folder = os.environ["PYDIST_RUN_ATTEMPT_DIR"]
    try:
        _write_record(folder, {"rank": _pmi_rank(), "host": socket.gethostname(), "pid": os.getpid(),
                               "started": _started(),
                               "ended": time.time(), "status": status, "signal": None, "last_line": why})
    except OSError:
        pass


LAUNCHER_MARK = "launcher"   # in the run's folder: the launcher's host and pid (a watcher that cannot see it
                             # runs on a host that does not share the folder)


def _attempt_folder(folder):
    """The attempt's folder as this watcher's host sees it: made here (private to the user) when this host
    does not have it (a host of --hosts that does not share the launcher's /tmp). Returns whether the
    launcher can read it (its mark is in the run's folder), and so whether this watcher must clean up."""
    shared = os.path.exists(os.path.join(os.path.dirname(os.path.abspath(folder)), LAUNCHER_MARK))
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return shared


def _remove_local(folder, rank):
    """A host that does not share the run's folder: remove what this watcher wrote there, and the folders
    once empty (another rank of this host may still be using them)."""
    for name in (f"rank-{rank}.json", f"rank-{rank}.pid", f"rank-{rank}.init"):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(folder, name))
    for path in (folder, os.path.dirname(os.path.abspath(folder))):
        with contextlib.suppress(OSError):
            os.rmdir(path)


def watch(folder, command):
    rank = _pmi_rank()
    started = time.time()
    shared = _attempt_folder(folder)
    # The watcher never starts MPI: the launcher's connection (PMI_FD, inherited) is the child's to claim
    env = {k: v for k, v in os.environ.items() if k != "PYDIST_MPI_OWNER"}
    env.update(PYDIST_RUN_ATTEMPT_DIR=folder, PYDIST_RUN_STARTED=repr(started))
    from . import _libraries
    if _libraries.LIBMPI is not None and _libraries.LIBMPI[1].startswith("the launcher's own"):
        # hydra started this watcher, not the rank: the rank takes the library the watcher took as its own
        env.setdefault("PYDIST_LIBMPI", _libraries.LIBMPI[0])
    survive = os.environ.get("PYDIST_SURVIVE") == "1"
    child = subprocess.Popen(command, close_fds=False, stderr=subprocess.PIPE, env=env,
                             preexec_fn=_ignore_usr1_and_die_with_parent if survive else _die_with_parent)
    with _files.replacing(os.path.join(folder, f"rank-{rank}.pid")) as f:
        f.write(f"{child.pid} {socket.gethostname()}\n")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        if sig == signal.SIGUSR1 and survive:   # hydra's word that a rank died, which the records carry
            signal.signal(sig, signal.SIG_IGN)
        else:
            signal.signal(sig, lambda s, _frame: child.send_signal(s))
    last = collections.deque(maxlen=1)
    dead_peer = []

    def copy_stderr():   # the rank's stderr goes on to mpiexec's; its last line says why it ended
        err = sys.stderr.buffer
        for line in child.stderr:
            err.write(line)
            err.flush()
            if line.strip():
                text = line.decode(errors="replace").strip()
                last.append(text)
                # UCX's cross-memory attach aborts the reader of a sender that has died: a consequence
                match = re.search(r"process_vm_readv\(pid=(\d+).*No such process", text)
                if match:
                    dead_peer.append(int(match.group(1)))
    copier = threading.Thread(target=copy_stderr, daemon=True)
    copier.start()
    status = child.wait()
    ended = time.time()   # (before the wait for its last line: the launcher blames the earliest end)
    copier.join(timeout=0.5)
    record = {"rank": rank, "host": socket.gethostname(), "pid": child.pid, "started": started, "ended": ended,
              "status": status if status >= 0 else 128 - status, "signal": -status if status < 0 else None,
              "last_line": last[0] if last else "", "dead_peer_pid": dead_peer[0] if dead_peer else None}
    if read_record(folder, rank, os.environ.get("PYDIST_RUN_ID")) is None:   # the rank's own (record_end) says more
        _write_record(folder, record)
    if not shared:   # no launcher reads this host's records: keep them only to explain a failure
        if status == 0:
            _remove_local(folder, rank)
        else:
            print(f"pydist.run: rank {rank}'s record is kept in {socket.gethostname()}:{folder}", file=sys.stderr,
                  flush=True)
    if status != 0:
        # A rank that died because another did (a message from the dead one) must not end the job
        # before the first one's watcher has written its record: mpiexec then kills every watcher.
        time.sleep(0.5)
    if status < 0 and os.environ.get("PYDIST_SURVIVE") == "1":
        return record["status"]   # a status, not a signal: hydra -disable-auto-cleanup leaves the others running
    if status < 0:   # end as the rank did, so that mpiexec sees and says what it would have without us
        try:
            signal.signal(-status, signal.SIG_DFL)
        except (OSError, ValueError):   # SIGKILL and SIGSTOP keep their default
            pass
        os.kill(os.getpid(), -status)
    return record["status"]


# ---------------------------------------------------------------------------------------------------
# The launcher

def parse_hosts(text, n):
    """[(host, slots)] from "a:2,b,c:1" (a host without :K has 1 slot); None: this machine, n slots."""
    if text is None:
        return [("localhost", n)]
    out = []
    for item in text.split(","):
        name, _, slots = item.strip().partition(":")
        if not name or (slots and (not slots.isdigit() or int(slots) < 1)):
            raise ValueError(f"--hosts: '{item}' is not HOST or HOST:SLOTS")
        out.append((name, int(slots or 1)))
    return out


def describe(record):
    if record.get("signal"):
        try:
            name = signal.Signals(record["signal"]).name
        except ValueError:
            name = f"signal {record['signal']}"
        why = f"was killed by signal {record['signal']} ({name})"
    else:
        why = f"exited with status {record['status']}"
    if record.get("last_line"):
        why += f": {record['last_line'][-300:]}"
    return why


def first_failure(folder, ranks, run_id=None):
    """The rank whose end came first among those that did not finish cleanly (its watcher's record),
    or None when no watcher recorded a failure (mpiexec itself failed, or killed them all)."""
    failed = [rec for rec in records(folder, ranks, run_id) if rec["status"] != 0]
    # A rank that UCX ended because its peer had died (dead_peer_pid) is never the cause, however the
    # two watchers' ends were ordered (both within a few ms of the death)
    causes = [rec for rec in failed if not rec.get("dead_peer_pid")] or failed
    first = min(causes, key=lambda rec: rec["ended"]) if causes else None
    # MPI fails a rank whose peer has just been killed, and that rank can record its end a few ms before
    # the killed one's watcher wakes to record its death: a death by a signal that soon after a
    # communication error is its cause. (A rank killed because another aborted ends 0.2 s or more after
    # it: _abort waits that long after recording its end.)
    if first is not None and first.get("signal") is None and re.search(r"\bDist\w*Error\b", first["last_line"]):
        killed = [rec for rec in causes if rec.get("signal") and 0 <= rec["ended"] - first["ended"] < PEER_DEATH_S]
        if killed:
            return min(killed, key=lambda rec: rec["ended"])
    return first


PEER_DEATH_S = 0.1   # first_failure: a signal death this soon after a communication error caused it


def records(folder, ranks, run_id=None):
    """This launch's records of the ranks' ends in the attempt's folder, in rank order (a rank without a
    valid one is left out)."""
    found = (read_record(folder, r, run_id) for r in range(ranks))
    return [rec for rec in found if rec is not None]


def is_open_mpi(mpiexec):
    """Whether the mpiexec command line starts Open MPI's launcher (prterun, orterun, or a wrapper of
    one in their folder) rather than hydra (MPICH's and Intel MPI's), whose options differ."""
    path = shutil.which(mpiexec[0]) if mpiexec else None
    if path is None:
        return False
    real = os.path.realpath(path)
    if os.path.basename(real) in ("prterun", "orterun", "prte"):
        return True
    if os.path.basename(real) == "mpiexec.hydra":
        return False
    folder = os.path.dirname(path)
    return not os.path.exists(os.path.join(folder, "hydra_pmi_proxy")) and \
        any(os.path.exists(os.path.join(folder, name)) for name in ("prterun", "orterun"))


def host_option(mpiexec):
    """The option that places ranks on hosts: Open MPI's --host, hydra's -hosts (the same HOST:N list)."""
    return "--host" if is_open_mpi(mpiexec) else "-hosts"


def probe_host(mpiexec, host, timeout):
    """Whether `host` still answers: mpiexec can start `true` on it within `timeout` seconds."""
    try:
        return subprocess.run([*mpiexec, host_option(mpiexec), host, "-n", "1", "true"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=timeout).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def rank_command(program):
    if program[0] == "-m" or program[0].endswith(".py"):
        return [sys.executable, *program]
    return program


SURVIVE_ALONE_S = 20.0   # --survive: how long ranks may run on after every other rank has ended, one failed
EARLY_GRACE_S = 3.0      # a rank that failed before init: how long the others may take to fail alike
INTERRUPT_GRACE_S = 10.0   # Ctrl-C: how long the ranks have to end on their SIGINT before SIGTERM


def _init_timeout(text):
    """The timeout a rank-R.init mark carries (its init_process_group's), or 30 minutes (torch's default)."""
    try:
        value = float(text)
    except ValueError:
        return 1800.0
    return value if 0 < value < 1800 else 1800.0


def _kill_rank(folder, rank):
    """SIGKILL world rank `rank` of this attempt if it runs on this host (its watcher's rank-R.pid)."""
    try:
        with open(os.path.join(folder, f"rank-{rank}.pid")) as f:
            pid, host = f.read(200).split()
        if host == socket.gethostname() and pid.isdigit() and int(pid) > 1:
            os.kill(int(pid), signal.SIGKILL)
    except (OSError, ValueError):
        pass


def _end(proc, grace=0.0):
    """End mpiexec: after `grace` seconds, SIGTERM (hydra ends its ranks), and SIGKILL 10 s later."""
    for sig, wait in ((None, grace), (signal.SIGTERM, 10.0), (signal.SIGKILL, None)):
        if sig is not None:
            with contextlib.suppress(OSError):
                proc.send_signal(sig)
        if wait is None:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            pass


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True   # EPERM: alive, another user's
    return True


def say(text):
    print(f"pydist.run: {text}", flush=True)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--watch"]:   # inside mpiexec: one rank's watcher
        folder, sep = argv[1], argv[2]
        if sep != "--":
            raise SystemExit("pydist.run --watch FOLDER -- COMMAND")
        return watch(folder, argv[3:])
    if "--" not in argv and not {"-h", "--help"} & set(argv):
        print(__doc__.strip(), file=sys.stderr)
        print("\npython -m pydist.run: the program to run goes after `--`", file=sys.stderr)
        return 2
    at = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(prog="python -m pydist.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, required=True, help="ranks to start")
    ap.add_argument("--min-ranks", type=int, default=None, help="go on at no fewer ranks than this (default -n)")
    ap.add_argument("--max-restarts", type=int, default=3, help="restarts after a failure (default 3)")
    ap.add_argument("--hosts", default=None, help="HOST[:SLOTS],... for mpiexec (default: this machine)")
    ap.add_argument("--mpiexec", default=None,
                    help="the mpiexec command line to start each run with, options included (default: the "
                         "mpiexec of the MPICH pydist runs on)")
    ap.add_argument("--run-dir", default=None, help="folder for the ranks' reports (default: a temporary one)")
    ap.add_argument("--survive", action="store_true",
                    help="the asynchronous strategies carry on without a worker that dies while training runs "
                         "(mpiexec -disable-auto-cleanup; PYDIST_SURVIVE=1 for the ranks); a server's death, "
                         "or a failure training did not go on without (rank 0's script after fit()), still "
                         "fails the job and restarts it")
    ap.add_argument("--probe-timeout", type=float, default=20.0,
                    help="seconds a host gets to answer before a restart (with --hosts; default 20)")
    args = ap.parse_args(argv[:at])
    program = argv[at + 1:]
    if not program:
        ap.error("no program after `--`")
    min_ranks = args.n if args.min_ranks is None else args.min_ranks
    if args.n < 1 or not 1 <= min_ranks <= args.n or args.max_restarts < 0:
        ap.error("need -n >= 1, 1 <= --min-ranks <= -n and --max-restarts >= 0")
    try:
        hosts = parse_hosts(args.hosts, args.n)
    except ValueError as e:
        ap.error(str(e))
    if sum(s for _, s in hosts) < args.n:
        ap.error(f"--hosts has {sum(s for _, s in hosts)} slots for {args.n} ranks")
    if args.mpiexec:
        mpiexec = shlex.split(args.mpiexec)
    else:
        from . import _libraries
        mpiexec = [_libraries.mpiexec()]
    if args.survive and is_open_mpi(mpiexec):
        ap.error(f"--survive needs hydra's mpiexec (MPICH's or Intel MPI's), whose -disable-auto-cleanup "
                 f"lets the others run on when a rank ends; {mpiexec[0]} is Open MPI's, which ends the whole "
                 f"job when a rank dies: leave out --survive there (a failure then restarts the job)")
    return Launcher(args, hosts, mpiexec, rank_command(program), min_ranks).run()


class Launcher:
    def __init__(self, args, hosts, mpiexec, command, min_ranks):
        self.args, self.hosts, self.mpiexec, self.command, self.min_ranks = args, hosts, mpiexec, command, min_ranks
        self.world = args.n
        self.run_id = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}"   # tags this launch's records
        self.own_folder = args.run_dir is None   # a temporary folder of ours, removed after a clean finish
        self.folder = tempfile.mkdtemp(prefix="pydist-run-") if self.own_folder else args.run_dir
        if not self.own_folder:
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            self.claim()
        # the watchers that see this mark share the folder with the launcher (_attempt_folder)
        write_json(os.path.join(self.folder, LAUNCHER_MARK), {"host": socket.gethostname(), "pid": os.getpid(),
                                                              "run_id": self.run_id})

    def claim(self):
        """A --run-dir of the user's: refuse one another launcher is using now, and clear what an earlier
        launch left there (its attempts' records and progress), so that only this launch's are read."""
        other = _read_json(os.path.join(self.folder, LAUNCHER_MARK)) or {}
        if other.get("host") == socket.gethostname() and (_count(other.get("pid")) or 0) > 0 and _alive(other["pid"]):
            raise SystemExit(f"python -m pydist.run: --run-dir {self.folder} is in use by the launcher with pid "
                             f"{other['pid']}; name another folder")
        self.clear()

    def clear(self):
        """Remove what a launch writes in the run's folder (attempt-N/, progress.json, the mark)."""
        for name in os.listdir(self.folder):
            path = os.path.join(self.folder, name)
            if re.fullmatch(r"attempt-\d+", name) and not os.path.islink(path) and os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            elif name in (PROGRESS, LAUNCHER_MARK) or name.startswith(f".{PROGRESS}."):
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def finish(self, status):
        """After a clean finish the run's records go (the whole folder when it was a temporary one); after a
        failure they stay, and the launcher says where."""
        if status == 0:
            if self.own_folder:
                shutil.rmtree(self.folder, ignore_errors=True)
            else:
                self.clear()
        else:
            if not self.own_folder:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.folder, LAUNCHER_MARK))
            say(f"the ranks' records are kept in {self.folder}")
        return status

    def placement(self):
        """mpiexec's -hosts (Open MPI's --host) for self.world ranks over the hosts left, in order ([] on
        this machine)."""
        if self.args.hosts is None:
            return []
        used, left = [], self.world
        for name, slots in self.hosts:
            if left > 0:
                used.append(f"{name}:{min(slots, left)}")
                left -= min(slots, left)
        return [host_option(self.mpiexec), ",".join(used)]

    def start(self, attempt):
        folder = os.path.join(self.folder, f"attempt-{attempt}")
        os.mkdir(folder, 0o700)   # fresh: claim() cleared the folder
        env = dict(os.environ, PYDIST_RUN_DIR=self.folder, PYDIST_RESTART=str(attempt), PYDIST_RUN_ID=self.run_id)
        survive = []
        if self.args.survive:
            env["PYDIST_SURVIVE"] = "1"
            survive = ["-disable-auto-cleanup"]   # hydra: a rank's end does not end the others
            # UCX's cross-memory attach (cma: a large message between ranks of one host, read from the
            # sender's memory by process_vm_readv) is a fatal error once that sender has died, which ends
            # the reader too; UCX's shared-memory copy is not
            env.setdefault("UCX_TLS", "^cma")
        cmd = [*self.mpiexec, *survive, *self.placement(), "-n", str(self.world), sys.executable, "-m", "pydist.run",
               "--watch", folder, "--", *self.command]
        where = "this machine" if self.args.hosts is None else self.placement()[1]
        say(f"{'starting' if attempt == 0 else 'restarting'} {self.world} rank(s) on {where}" +
            (f" (attempt {attempt + 1})" if attempt else ""))
        began = time.monotonic()
        self.stuck, self.stuck_why, self.ended_early = [], "", False
        proc = subprocess.Popen(cmd, env=env)
        try:
            while True:
                try:
                    rc = proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if not self.stuck:
                    self.watch_for_stuck(folder, proc)
        except KeyboardInterrupt:
            self.interrupt(proc, folder)
            raise
        except BaseException:
            _end(proc)
            raise
        return rc, folder, time.monotonic() - began

    def interrupt(self, proc, folder):
        """Ctrl-C (or SIGINT) on the launcher: end every rank. mpiexec gets SIGINT, as from a terminal (a
        rank may catch KeyboardInterrupt to save its state), INTERRUPT_GRACE_S to end the job, then
        SIGTERM; a rank of this host still running with no record of its end is killed."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # a second Ctrl-C must not cut this short
        with contextlib.suppress(OSError):
            proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=INTERRUPT_GRACE_S)
        ended = {rec["rank"] for rec in records(folder, self.world, self.run_id)}
        for r in range(self.world):
            if r not in ended:
                _kill_rank(folder, r)
        _end(proc)

    def interrupted(self):
        """After interrupt(): one line saying what was kept, and exit status 130 (as a shell gives SIGINT)."""
        progress = read_progress(self.folder, self.run_id)
        kept = (f"the newest checkpoint, step {progress['checkpoint_step']} ({progress['checkpoint']}), and "
                if progress.get("checkpoint_step") is not None else "no checkpoint (none was written); ")
        say(f"interrupted: every rank ended; kept {kept}the ranks' records in {self.folder}")
        if not self.own_folder:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.folder, LAUNCHER_MARK))
        return 130

    def watch_for_stuck(self, folder, proc):
        """While mpiexec runs: end the job when a rank is known never to arrive, where nothing else would.
        - At start-up, MPI_Init waits for every rank with no deadline: once one rank has marked that it
          began init_process_group (rank-R.init) and a rank has not marked it within the first mark's
          timeout (30 minutes when it has none), that rank is stuck before it.
        - A rank that failed before it began init_process_group (its record, and no mark) leaves the
          others waiting in MPI's start-up, which hydra does not end: the attempt ends at once, and the
          verdict is that rank's failure.
        - Under --survive (hydra's -disable-auto-cleanup), ranks that never end keep the job alive after
          every other rank has ended: once a rank has failed and the ranks still running have been the
          only ones left for SURVIVE_ALONE_S, they are stuck (waiting for ranks that are gone)."""
        now = time.time()
        marks = {}
        for r in range(self.world):
            try:
                with open(os.path.join(folder, f"rank-{r}.init"), "rb") as f:
                    text = f.read(64).decode("ascii", "replace")
                marks[r] = (os.stat(os.path.join(folder, f"rank-{r}.init")).st_mtime, _init_timeout(text))
            except OSError:
                pass
        if marks and len(marks) < self.world:
            first, timeout = min(marks.values())
            if now - first > timeout:
                missing = [r for r in range(self.world) if r not in marks]
                say(f"rank(s) {', '.join(map(str, missing))} never began init_process_group, {now - first:.0f} s "
                    f"after the first rank did (its timeout {timeout:g} s): ending the attempt")
                self.stuck, self.stuck_why = missing, "it never began init_process_group"
        ended = None   # the ranks' records, read at most once a poll, and only while something needs them
        if not self.stuck and not self.ended_early and len(marks) < self.world:   # (every rank marked: none early)
            ended = records(folder, self.world, self.run_id)
            early = [rec for rec in ended if rec["status"] != 0 and rec["rank"] not in marks]
            # (a second first: the ranks that fail the same way record it too, for the verdict)
            if early and len(ended) < self.world and now - min(rec["ended"] for rec in early) > EARLY_GRACE_S:
                self.ended_early = True
                say(f"rank {early[0]['rank']} ended before it began init_process_group; the other ranks would "
                    f"wait for it in MPI's start-up: ending the attempt")
                done = {rec["rank"] for rec in ended}
                for r in range(self.world):
                    if r not in done:
                        _kill_rank(folder, r)
                threading.Thread(target=_end, args=(proc, 10.0), daemon=True).start()
        if self.args.survive and not self.stuck:
            ended = ended if ended is not None else records(folder, self.world, self.run_id)
            if ended and len(ended) < self.world and any(rec["status"] != 0 for rec in ended):
                alone = now - max(rec["ended"] for rec in ended)
                if alone > SURVIVE_ALONE_S:
                    done = {rec["rank"] for rec in ended}
                    self.stuck = [r for r in range(self.world) if r not in done]
                    self.stuck_why = "it was still running after every other rank had ended"
                    say(f"rank(s) {', '.join(map(str, self.stuck))} still running {alone:.0f} s after every other "
                        f"rank ended, one with a failure (waiting for ranks that are gone): ending the attempt")
        if self.stuck:
            # the stuck ranks first (the launcher blames the earliest end), then every other rank of this host
            order = self.stuck + [r for r in range(self.world) if r not in self.stuck]
            for r in order:
                _kill_rank(folder, r)
            threading.Thread(target=_end, args=(proc, 10.0), daemon=True).start()

    def leave_out(self, host):
        """One slot fewer on `host` (a rank kept failing there): the job goes on at one rank fewer."""
        self.hosts = [(h, s - 1 if h == host else s) for h, s in self.hosts]
        self.hosts = [(h, s) for h, s in self.hosts if s > 0]

    def run(self):
        try:
            return self.finish(self.attempts())
        except KeyboardInterrupt:
            return self.interrupted()
        except BaseException:
            self.finish(1)
            raise

    def attempts(self):
        failed_before = None   # (host, rank) that failed the attempt before, if one did
        restarts, lost_total = 0, 0
        attempt = 0
        while True:
            rc, folder, seconds = self.start(attempt)
            progress = read_progress(self.folder, self.run_id)
            if progress.get("restart") != str(attempt):
                progress = {}   # rank 0 has not reported in this attempt yet
            ended = records(folder, self.world, self.run_id)
            gone = [rec for rec in ended if rec["status"] != 0]
            # Finished: mpiexec and every rank say so, or every rank's program ended with status 0 and only
            # mpiexec says otherwise. Under --survive the ranks leave without MPI_Finalize
            # (csrc/session/session.c), and hydra may then count a rank whose PMI connection closed after it
            # was reaped as failed (a raw status of 1, printed as "Hangup (signal 1)"): a restart would only
            # repeat finished work.
            if not gone and (rc == 0 or len(ended) == self.world):
                if rc != 0:
                    say(f"every rank ended with status 0 and mpiexec exited with status {rc} all the same" +
                        (" (under --survive ranks leave without MPI_Finalize, which hydra may count as a "
                         "failure)" if self.args.survive else "") + "; the job's work is done")
                say(f"finished: {self.world} rank(s), {restarts} restart(s)" +
                    (f", {lost_total} step(s) recomputed" if restarts else ""))
                return 0
            # --survive: the job finished without some ranks when every rank's end is recorded, every rank
            # left ended cleanly (hydra's status is then the dead ones'), and the job itself said it went on
            # without each of them (the Trainer's report): rank 0's program failing outside training, or a
            # worker after the last training call, is a failure of the job, not one it carried on through
            carried = set(progress.get("without", ()))
            if self.args.survive and gone and len(ended) == self.world and len(gone) < self.world and \
                    all(rec["rank"] in carried for rec in gone):
                for rec in gone:
                    say(f"rank {rec['rank']} (host {rec['host']}, pid {rec['pid']}) {describe(rec)}, "
                        f"{rec['ended'] - rec['started']:.1f} s into the run; the job carried on without it")
                say(f"finished: {self.world - len(gone)} of {self.world} rank(s) to the end, {restarts} restart(s)")
                return 0
            not_carried = self.args.survive and gone and len(gone) < self.world
            failure = first_failure(folder, self.world, self.run_id)
            stuck = [rec for rec in ended if rec["rank"] in self.stuck]
            if stuck:   # the others' ends (timeouts, the launcher's kill) follow from it
                failure = stuck[0]
            if failure is None:
                say(f"mpiexec exited with status {rc} and no rank recorded why (mpiexec itself, or a host "
                    f"that stopped answering)")
                status = rc
            else:
                why = (f"never arrived ({self.stuck_why}): the launcher ended it" if failure["rank"] in self.stuck
                       else describe(failure))
                say(f"rank {failure['rank']} (host {failure['host']}, pid {failure['pid']}) {why}, "
                    f"{failure['ended'] - failure['started']:.1f} s into the run")
                status = failure["status"]
                if not_carried and failure["rank"] not in carried and failure["rank"] not in self.stuck:
                    say(f"training did not go on without rank {failure['rank']} (--survive carries on only "
                        f"without workers that die while training runs): the job failed")
            lost = None
            if "step" in progress:
                ckpt = progress.get("checkpoint_step")
                lost = progress["step"] - (ckpt if ckpt is not None else 0)
                lost_total += lost
                say(f"the job had reached step {progress['step']}; its newest checkpoint is " +
                    (f"step {ckpt} ({progress.get('checkpoint')}): {lost} step(s) lost" if ckpt is not None
                     else f"none: {lost} step(s) lost"))
            if restarts >= self.args.max_restarts:
                say(f"giving up after {restarts} restart(s) (--max-restarts {self.args.max_restarts}); exit status "
                    f"{status}")
                return status
            # A failure of the program itself, which a restart would only repeat and no host caused: a usage
            # error (exit status 2, argparse's), or the same end (status and last line) on every rank of the
            # attempt, none by a signal (a rank killed, or hanging, makes its peers fail alike after it).
            own = [rec for rec in gone if rec["rank"] not in self.stuck]
            if failure is not None and failure in own and failure["status"] == 2 and failure.get("signal") is None:
                say("giving up: exit status 2 is a usage error (the program's arguments), which a restart "
                    "repeats; exit status 2")
                return status
            ends = {(rec["status"], rec.get("signal"), rec.get("last_line")) for rec in own}
            if len(own) == self.world >= 2 and len(ends) == 1 and own[0].get("signal") is None and \
                    own[0].get("last_line"):
                say(f"giving up: all {len(own)} ranks failed the same way, the program's own failure, which a "
                    f"restart repeats; exit status {status}")
                return status
            # Who takes part next: a rank that failed twice running on one host is left out, and a host
            # that does not answer is dropped.
            key = (failure["host"], failure["rank"]) if failure is not None else None
            if key is not None and key == failed_before:
                self.leave_out(failure["host"] if self.args.hosts is not None else "localhost")
                say(f"rank {failure['rank']} failed twice running on host {failure['host']}: leaving it out")
                key = None
            failed_before = key
            if self.args.hosts is not None:
                for host, _ in list(self.hosts):
                    if not probe_host(self.mpiexec, host, self.args.probe_timeout):
                        self.hosts = [(h, s) for h, s in self.hosts if h != host]
                        say(f"host {host} does not answer: dropping it")
            slots = sum(s for _, s in self.hosts)
            new_world = min(self.world, slots)
            if new_world < self.min_ranks:
                say(f"only {slots} rank(s) left, fewer than --min-ranks {self.min_ranks}: giving up; exit status "
                    f"{status}")
                return status
            if new_world != self.world:
                say(f"going on at {new_world} rank(s) (was {self.world})")
            self.world = new_world
            restarts += 1
            attempt += 1
            say(f"restart {restarts} of at most {self.args.max_restarts}" +
                (f", from {progress['checkpoint']} (step {progress['checkpoint_step']})"
                 if progress.get("checkpoint_step") is not None else ", from the start (no checkpoint yet)"))


if __name__ == "__main__":
    sys.exit(main())
