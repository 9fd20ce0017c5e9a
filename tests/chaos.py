"""A fault-injection soak of the elastic launcher, python -m pydist.run (issue 41, part 3).

    python tests/chaos.py --runs 30 --seed 7          # 30 random scenarios; each prints its spec
    python tests/chaos.py --spec 'strategy=allreduce n=3 ... fault=kill rank=1 at=120'   # one, again
    python tests/chaos.py --runs 10 --seed 7 --only fault=hang,stop survive=1            # a subset

Each scenario runs a small job (this file's --job mode: pydist.engine.Trainer on synthetic data, a few
seconds, with checkpoint_every) under `python -m pydist.run`, injects one fault at a random moment, and
checks what came of it:
  - the launcher ends within a bound (else: a hang);
  - its verdict (finished, restarted, carried on, restarted+carried on, gave up) and exit status follow
    from what happened, by the rules of pydist/run.py's docstring (expected(), below), and in every
    attempt the fault reached, the launcher names it (the rank, and how it ended);
  - the newest checkpoint loads, and for the synchronous strategies (bitwise repeatable) holds the very
    weights and momentum a clean run of the same job writes at that step; once one was written, one is
    always there (never torn, never lost);
  - nothing is left: in /dev/shm, in the run's own $TMPDIR (no pydist-run-* folder after a success; after
    a failure the launcher keeps it and names it), beside the checkpoint, or as a live process.

Faults (`fault=`), each at step `at` of the job (counted over the whole run, both fit() calls):
  kill      SIGKILL to rank `rank` (the watcher's rank-R.pid), from outside
  stop      SIGSTOP to it for `stop` seconds, then SIGCONT (shorter than the job's timeout: harmless)
  exit      the rank calls os._exit(`code`) from inside (a crash)
  raise     the rank raises an exception from inside its training call (a signal handler raises it)
  hang      the rank never arrives: it stops taking part (sleeps in a signal handler inside its training
            call, or before init_process_group with at=init); the others' waits end at the job's timeout
  diskfull  the checkpoint folder fills up: it is a 1 MiB tmpfs mounted for the run, and a filler file
            takes all of it; with repeat=once it is deleted as soon as a rank has ended, as an operator
            would free the space
  usage     every rank leaves with exit status 2 after init_process_group, as a refused command line does
            (pydist.train's --resume of another model's checkpoint): the launcher gives up at once
  same      every rank fails the same way before init_process_group (a missing input file): the
            launcher gives up at once, with no restart and no host left out
  after     the rank raises once its training is over (after its last fit()): under --survive too, a
            failure of the job (training never went on without it), restarted from the last checkpoint
  interrupt Ctrl-C: SIGINT to the launcher's whole process group, as a terminal sends it: every rank
            ends, the launcher names what it kept in one line and exits with status 130
`repeat=always` makes the fault come back in every attempt (the launcher must give up). The rest of a
line: the strategy (synchronous: allreduce, ring, central; asynchronous, one server: downpour, adag,
aeasgd, dynsgd), n ranks (2-4), fits (fit() once, or twice: to epoch 3, then on to 6), survive
(--survive), hosts (1: this machine; 2: simulated hosts), restarts (--max-restarts), rundir (temp: the
launcher's own; fresh: --run-dir; reused: a --run-dir holding what an earlier run left there).

Isolation: every scenario runs in a private mount namespace (`unshare --mount`: as root, or else as the
mapped root of a user namespace) with its own tmpfs on /dev/shm, so what it leaves there is its own and
no other job on the machine can blur the count; its own $TMPDIR; this process as the child subreaper, so
any process the run leaves behind is found. Simulated hosts (`hosts=2`): hydra's ssh launcher is given a
wrapper (`-launcher-exec`) that runs each host's proxy in a UTS and IPC namespace of its own, under the
host's name: one hydra proxy and one MPICH node per host, UCX over TCP between them, each rank recorded on
its host, with no network set-up shared with other jobs (scripts/cluster.sh's namespaces are
machine-wide); its finalize guard is preloaded as there (UCX over TCP may hang in MPI_Finalize).

Modes used inside: --job (a rank's program), --scenario (one run, inside its namespace; prints a
CHAOS-RESULT line). The job's ground truth (when its training calls ran, when a fault fired, which
checkpoints it finished) goes to events files the checks read, never to the launcher's own records.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
from pydist import run  # noqa: E402  (the launcher's own constants: stdlib only, no MPI)

# ---------------------------------------------------------------------------------------------------
# The job: an MLP on synthetic 8x8 "images", small enough that a run takes seconds on 2 busy cores

EXAMPLES, BATCH, HIDDEN, EPOCHS, FIRST_FIT_EPOCHS = 4096, 8, 32, 6, 3
EVERY = {"sync": 25, "async": 40}   # checkpoint_every (steps)
SLOW_MS = {"sync": 1, "async": 2}   # the faulty rank's pace (ms per step)
TIMEOUT_S = 10.0     # the job's init_process_group(timeout=): a wait that long means a rank is missing
SYNC = ("allreduce", "ring", "central")            # bitwise repeatable: checkpoints compared to a clean run's
ASYNC = ("downpour", "adag", "aeasgd", "dynsgd")   # one server (the last rank); --survive carries on
FAULTS = ("kill", "stop", "exit", "raise", "hang", "diskfull", "usage", "same", "after", "interrupt")
EVERY_RANK = ("usage", "same")   # faults of every rank at once (the spec's rank is 0)
DISK_BYTES = 1 << 20


def workers(strategy, n):
    return n - 1 if strategy in ASYNC else n


def total_steps(strategy, n):
    return EPOCHS * (EXAMPLES // (workers(strategy, n) * BATCH))


def synthetic_data():
    """The same (images, labels) on every rank: labels from a fixed linear map of the images."""
    import numpy as np
    rng = np.random.default_rng(41)
    x = rng.standard_normal((EXAMPLES, 1, 8, 8)).astype(np.float32)
    labels = (x.reshape(EXAMPLES, 64) @ rng.standard_normal((64, 10))).argmax(1).astype(np.int32)
    return x, labels


def model():
    from pydist.engine import mlp
    return mlp((HIDDEN,), input_shape=(1, 8, 8))


# ---------------------------------------------------------------------------------------------------
# Scenarios: one line of key=value, enough to run it again alone

DEFAULTS = {"strategy": "allreduce", "n": 2, "fits": 1, "survive": 0, "hosts": 1, "restarts": 1,
            "rundir": "fresh", "fault": "none", "rank": 0, "at": 1, "stop": 0.0, "code": 0, "repeat": "once"}
CHOICES = {"strategy": SYNC + ASYNC, "fits": (1, 2), "survive": (0, 1), "hosts": (1, 2),
           "rundir": ("temp", "fresh", "reused"), "fault": ("none",) + FAULTS, "repeat": ("once", "always")}


def parse_spec(text):
    """A scenario from its line (fields left out take DEFAULTS); ValueError names a bad field."""
    spec = dict(DEFAULTS)
    for item in text.split():
        key, sep, value = item.partition("=")
        if not sep or key not in DEFAULTS:
            raise ValueError(f"spec: '{item}' is not one of {', '.join(f'{k}=' for k in DEFAULTS)}")
        if key == "at" and value == "init":
            spec[key] = value
            continue
        try:
            spec[key] = type(DEFAULTS[key])(value)
        except ValueError:
            raise ValueError(f"spec: {key}={value!r} is not a {type(DEFAULTS[key]).__name__}") from None
        if key in CHOICES and spec[key] not in CHOICES[key]:
            raise ValueError(f"spec: {key} must be one of {CHOICES[key]}; got {value!r}")
    n, strategy = spec["n"], spec["strategy"]
    if not (3 if strategy in ASYNC else 2) <= n <= 4:
        raise ValueError(f"spec: n={n} ranks for {strategy} (2-4, and 3-4 for the asynchronous: 2 workers at least)")
    if not 0 <= spec["rank"] < n or spec["restarts"] < 0:
        raise ValueError(f"spec: rank must be in [0, {n}) and restarts >= 0")
    if spec["at"] == "init" and spec["fault"] != "hang":
        raise ValueError("spec: at=init is for fault=hang (a rank that never arrives at init)")
    return spec


def format_spec(spec):
    return " ".join(f"{k}={spec[k]}" for k in DEFAULTS)


def random_spec(rng, fault):
    strategy = rng.choice(SYNC + ASYNC)
    n = rng.randint(3 if strategy in ASYNC else 2, 4)
    spec = dict(DEFAULTS, strategy=strategy, n=n, fits=rng.choice((1, 2)), survive=rng.choice((0, 1)),
                hosts=rng.choice((1, 2)), restarts=rng.choice((0, 1, 1, 2, 3)),
                rundir=rng.choice(CHOICES["rundir"]), fault=fault, rank=rng.randrange(n),
                at=rng.randrange(1, total_steps(strategy, n)), repeat="always" if rng.random() < 0.2 else "once")
    if fault == "stop":
        spec["stop"] = round(rng.uniform(0.5, TIMEOUT_S / 4), 1)
        spec["repeat"] = "once"
    if fault == "exit":
        spec["code"] = rng.choice((3, 7, 42, 99))
    if fault == "hang" and rng.random() < 0.25:
        spec["at"] = "init"
    if fault in ("diskfull", "none") + EVERY_RANK:
        spec["rank"] = 0   # rank 0 writes the checkpoints; the others' faults are every rank's
    return spec


def scenarios(runs, seed):
    """`runs` scenarios from `seed`; the faults go round a shuffled list of every kind (each kind once
    in any FAULTS-long stretch), the rest of each scenario at random."""
    rng = random.Random(seed)
    kinds = list(FAULTS)
    out = []
    for i in range(runs):
        if i % len(kinds) == 0:
            rng.shuffle(kinds)
        out.append(random_spec(rng, kinds[i % len(kinds)]))
    return out


def matches(spec, only):
    """Whether `spec` passes --only's KEY=V1,V2 filters."""
    return all(str(spec[k]) in values for k, values in only.items())


# ---------------------------------------------------------------------------------------------------
# --job: a rank's program under python -m pydist.run (the spec in CHAOS_SPEC, files in CHAOS_WORK)

class Events:
    """This rank's ground truth for the checks, one JSON line per event (time.time() in "t")."""

    def __init__(self, work, attempt, rank):
        os.makedirs(os.path.join(work, "events"), exist_ok=True)
        self.path = os.path.join(work, "events", f"a{attempt}-r{rank}.jsonl")

    def __call__(self, what, **fields):
        # One write to a file opened for appending: whole lines from any thread, and from a signal
        # handler that interrupts this very call (a lock would deadlock there)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(dict(fields, ev=what, t=time.time())) + "\n").encode())
        finally:
            os.close(fd)


def read_events(work, attempt, rank):
    try:
        with open(os.path.join(work, "events", f"a{attempt}-r{rank}.jsonl")) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    except OSError:
        return []


class LoggedEngine:
    """The Trainer's _C.Engine seen through a window: each train_steps call is logged (its start and
    end), so the checks know whether a fault fell inside one. Everything else passes straight on."""

    def __init__(self, engine, log):
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "_log", log)

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def __setattr__(self, name, value):
        setattr(self._engine, name, value)

    def train_steps(self, *args):
        self._log("call", step=self._engine.global_step)
        try:
            return self._engine.train_steps(*args)
        finally:   # with how many workers the call went on without (an asynchronous server's word)
            self._log("end", step=self._engine.global_step, without=len(self._engine.strategy_departed()["dead"]))


def job():
    spec, work = parse_spec(os.environ["CHAOS_SPEC"]), os.environ["CHAOS_WORK"]
    attempt = int(os.environ.get("PYDIST_RESTART", "0"))
    fault_here = spec["repeat"] == "always" or attempt == 0
    inside = fault_here and spec["fault"] in ("exit", "raise", "hang")
    if inside and spec["at"] == "init" and int(os.environ.get("PMI_RANK", "-1")) == spec["rank"]:
        Events(work, attempt, spec["rank"])("fault")
        while True:   # never arrives: the others' init_process_group(timeout=) ends their wait
            time.sleep(3600)
    if fault_here and spec["fault"] == "same":   # every rank, before MPI: the input a job cannot do without
        Events(work, attempt, int(os.environ.get("PMI_RANK", "0")))("fault")
        raise FileNotFoundError(2, "No such file or directory", "/chaos/train-images.idx")
    import pydist as dist
    from pydist.engine import Trainer
    dist.init_process_group(timeout=TIMEOUT_S)
    rank = dist.get_rank()
    if fault_here and spec["fault"] == "usage":   # every rank alike, as a refused command line leaves
        Events(work, attempt, rank)("fault")
        if rank == 0:
            print("chaos.py --job: error: --resume: the checkpoint is another model's", file=sys.stderr, flush=True)
        dist.destroy_process_group()
        # (not sys.exit: between simulated hosts the finalize guard ends a hung MPI_Finalize with status 0,
        # which would hide the 2; scripts/cluster_finalize_guard.c)
        sys.stdout.flush()
        os._exit(2)
    log = Events(work, attempt, rank)
    # The rank the fault is for is paced (a sleep per step: no CPU, no change to the numbers), so that a
    # fault from inside or outside can land in the middle of its training calls
    trainer = Trainer(model(), lr=0.01, batch_size=BATCH, seed=1, strategy=spec["strategy"], slow_rank=spec["rank"],
                      slow_ms=SLOW_MS["async" if spec["strategy"] in ASYNC else "sync"])
    engine = trainer.engine = LoggedEngine(trainer.engine, log)
    keep = os.environ.get("CHAOS_KEEP")   # a clean run: every checkpoint copied, for the checks
    save = trainer.save

    def save_and_log(path):
        log("save", step=trainer.step)
        save(path)
        log("saved", step=trainer.step)
        if keep and trainer.rank == 0:
            shutil.copyfile(path, os.path.join(keep, f"step-{trainer.step}.ckpt"))
    trainer.save = save_and_log
    checkpoint = os.path.join(work, "ckpt", "run.ckpt")
    if os.path.exists(checkpoint):
        trainer.load(checkpoint)
        log("loaded", step=trainer.step)
    if inside and rank == spec["rank"]:
        arm(spec, engine, log)
    if rank == 0:   # the step, for the faults made from outside ("at" step K)
        tick(engine, os.path.join(work, f"step-a{attempt}"))
    x, y = synthetic_data()
    every = EVERY["async" if spec["strategy"] in ASYNC else "sync"]
    for epochs in ((FIRST_FIT_EPOCHS, EPOCHS) if spec["fits"] == 2 else (EPOCHS,)):
        trainer.fit(x, y, epochs, checkpoint=checkpoint, checkpoint_every=every, progress=False)
        log("fitted", step=trainer.step, epochs=epochs)
    if fault_here and spec["fault"] == "after" and rank == spec["rank"]:
        log("fault")
        raise RuntimeError("chaos: an exception after training")
    dist.destroy_process_group()


def arm(spec, engine, log):
    """Make this rank's fault happen at step spec["at"], from a thread of its own. An asynchronous
    worker's fault waits for the start of a training call (1-4 of its own steps into it): a worker
    that dies there is one --survive carries on without."""
    kind, at = spec["fault"], spec["at"]
    async_worker = spec["strategy"] in ASYNC and spec["rank"] < spec["n"] - 1

    def fire(signum=None, frame=None):
        log("fault")
        if kind == "exit":
            os._exit(spec["code"])
        if kind == "raise":
            raise RuntimeError(f"chaos: an exception injected at step {at}")
        while True:   # hang: this rank never takes part again
            time.sleep(3600)

    def watch():
        while True:
            done, base = engine.steps_done, engine.global_step
            if done >= at and (not async_worker or 1 <= done - base <= 4):
                if kind == "exit":
                    fire()
                os.kill(os.getpid(), signal.SIGUSR2)   # the main thread runs fire() inside its wait
                return
            time.sleep(0.001)
    signal.signal(signal.SIGUSR2, fire)
    threading.Thread(target=watch, daemon=True).start()


def tick(engine, path):
    """Rank 0 writes its step to `path` whenever it moves (every 10 ms at most)."""
    def loop():
        last = None
        while True:
            step = engine.steps_done
            if step != last:
                tmp = f"{path}.tmp"
                with open(tmp, "w") as f:
                    f.write(str(step))
                os.replace(tmp, path)
                last = step
            time.sleep(0.01)
    threading.Thread(target=loop, daemon=True).start()


def read_step(work, attempt):
    try:
        with open(os.path.join(work, f"step-a{attempt}")) as f:
            return int(f.read() or -1)
    except (OSError, ValueError):
        return -1


# ---------------------------------------------------------------------------------------------------
# --scenario: one run, inside its own mount namespace

def bound_s(spec):
    """How long the launcher may take, all attempts together: over 3x a quiet machine's time."""
    attempt = 25 + (TIMEOUT_S if spec["fault"] == "hang" else 0) + spec["stop"]
    if spec["fault"] == "hang" and spec["survive"]:   # the launcher ends ranks left running alone after that
        attempt += run.SURVIVE_ALONE_S
    if spec["fault"] == "interrupt":   # the ranks' time to end on their SIGINT
        attempt += run.INTERRUPT_GRACE_S
    return 30 + (spec["restarts"] + 1) * attempt


def mount_tmpfs(path, size):
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=1777", "chaos", path], check=True,
                   capture_output=True)


def set_subreaper():
    """Orphans of the run become this process's children, so none can hide from the leftover check."""
    import ctypes
    if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:   # PR_SET_CHILD_SUBREAPER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def descendants(pid=None):
    """Live (not zombie) processes below `pid` (default: this one): [(pid, command line)]."""
    out, todo = [], [pid or os.getpid()]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(c) for c in f.read().split()]
            except OSError:
                continue
            for kid in kids:
                todo.append(kid)
                if not exited(kid):
                    try:
                        with open(f"/proc/{kid}/cmdline", "rb") as f:
                            out.append((kid, f.read().replace(b"\0", b" ").decode(errors="replace").strip()))
                    except OSError:
                        pass
    return out


def exited(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


def kill_all(processes):
    if not processes:
        return
    for pid, _ in processes:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:   # it ended meanwhile
            pass
    time.sleep(0.2)
    reap()


def reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


HOST_LAUNCH = """#!/bin/sh
# hydra's ssh launcher calls: launch -x HOST COMMAND...; run COMMAND as a remote shell would, under HOST's
# name, in UTS and IPC namespaces of its own (UCX then sees another machine: no shared memory between hosts)
while [ "$1" = -x ] || [ "$1" = -q ]; do shift; done
host=$1; shift
exec unshare --uts --ipc -- /bin/sh -c 'hostname "$1" && exec /bin/sh -c "$2"' sh "$host" "$*"
"""


def stale_run_dir(folder, n):
    """What an earlier run leaves in its --run-dir (pydist/run.py's files): its progress, finished, and
    the record of a rank that was killed in its first attempt."""
    os.makedirs(os.path.join(folder, "attempt-0"))
    now = time.time()
    with open(os.path.join(folder, "progress.json"), "w") as f:
        json.dump({"step": 90, "time": now - 600, "restart": "0", "checkpoint": "/nonexistent/old.ckpt",
                   "checkpoint_step": 75, "finished": True}, f)
    rec = {"rank": n - 1, "host": "localhost", "pid": 1, "started": now - 700, "ended": now - 650, "status": 137,
           "signal": 9, "last_line": "", "dead_peer_pid": None}
    with open(os.path.join(folder, "attempt-0", f"rank-{n - 1}.json"), "w") as f:
        json.dump(rec, f)


def launcher_command(spec, work, run_dir):
    cmd = [sys.executable, "-m", "pydist.run", "-n", str(spec["n"]), "--max-restarts", str(spec["restarts"])]
    if spec["survive"]:
        cmd.append("--survive")
    if spec["hosts"] == 2:
        launch = os.path.join(work, "launch")
        with open(launch, "w") as f:
            f.write(HOST_LAUNCH)
        os.chmod(launch, 0o755)
        # UCX over TCP (between hosts) hangs in MPI_Finalize in one job in a few (openucx/ucx#8738): the
        # guard scripts/cluster.sh preloads for the same reason ends such a rank after 5 s, with status 0
        guard = os.path.join(work, "finalize_guard.so")
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", guard,
                        os.path.join(ROOT, "scripts", "cluster_finalize_guard.c"), "-ldl", "-lpthread"], check=True)
        first = (spec["n"] + 1) // 2
        cmd += ["--hosts", f"chaos-h1:{first},chaos-h2:{spec['n'] - first}",
                "--mpiexec", f"{shutil.which('mpiexec.mpich') or 'mpiexec'} -launcher ssh -launcher-exec {launch} "
                             f"-genv LD_PRELOAD {guard}"]
    elif os.environ.get("CHAOS_MPIEXEC"):   # --mpiexec: another MPI's launcher (one host)
        cmd += ["--mpiexec", os.environ["CHAOS_MPIEXEC"]]
    if run_dir is not None:
        cmd += ["--run-dir", run_dir]
    return cmd + ["--", HERE, "--job"]


class Outside:
    """The faults made from outside the job: a signal to a rank, a full checkpoint folder. step() is
    called every few ms while the launcher runs; `done` lists what was done, with times."""

    def __init__(self, spec, work, run_dirs):
        self.spec, self.work, self.run_dirs = spec, work, run_dirs
        self.done, self.fired_in, self.cont_at, self.filler = [], set(), None, None
        self.launcher = None   # its pid: a Ctrl-C goes to its process group

    def attempt_dir(self, attempt):
        for folder in self.run_dirs():
            path = os.path.join(folder, f"attempt-{attempt}")
            if os.path.isdir(path):
                return path
        return None

    def current_attempt(self):
        a = 0
        while self.attempt_dir(a + 1) is not None:
            a += 1
        return a

    def step(self):
        spec, kind = self.spec, self.spec["fault"]
        if self.cont_at is not None and time.monotonic() >= self.cont_at:
            self.signal(self.stopped, signal.SIGCONT, "cont")
            self.cont_at = None
        if kind == "diskfull" and self.filler and spec["repeat"] == "once" and self.a_rank_ended(0):
            os.unlink(self.filler)   # the operator frees the space; the restart can write again
            self.done.append({"what": "freed", "t": time.time()})
            self.filler = None
        if kind not in ("kill", "stop", "diskfull", "interrupt"):
            return
        attempt = self.current_attempt()
        if attempt in self.fired_in or (attempt > 0 and spec["repeat"] == "once"):
            return
        if read_step(self.work, attempt) < spec["at"]:
            return
        if kind == "diskfull":
            self.fired_in.add(attempt)
            if self.filler is None:
                self.fill()
            return
        if kind == "interrupt":   # as a terminal's Ctrl-C: to every process of the launcher's group
            self.fired_in.add(attempt)
            try:
                os.killpg(self.launcher, signal.SIGINT)
                delivered = True
            except ProcessLookupError:
                delivered = False
            self.done.append({"what": "interrupt", "t": time.time(), "attempt": attempt, "delivered": delivered})
            return
        pid = self.rank_pid(attempt)
        if pid is None:
            return
        self.fired_in.add(attempt)
        if kind == "kill":
            self.signal(pid, signal.SIGKILL, "kill", attempt)
        else:
            if self.signal(pid, signal.SIGSTOP, "stop", attempt):
                self.stopped, self.cont_at = pid, time.monotonic() + spec["stop"]

    def rank_pid(self, attempt):
        folder = self.attempt_dir(attempt)
        try:
            with open(os.path.join(folder, f"rank-{self.spec['rank']}.pid")) as f:
                return int(f.read().split()[0])
        except (TypeError, OSError, ValueError, IndexError):
            return None

    def signal(self, pid, sig, what, attempt=None):
        """Send `sig` to a rank still running; whether it was delivered goes into `done`."""
        alive = not exited(pid)
        if alive:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                alive = False
        self.done.append({"what": what, "t": time.time(), "attempt": attempt, "pid": pid, "delivered": alive})
        return alive

    def fill(self):
        self.done.append({"what": "filled", "t": time.time(), "delivered": True})   # (a save may meet it already)
        self.filler = os.path.join(self.work, "ckpt", "filler")
        with open(self.filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass

    def a_rank_ended(self, attempt):
        folder = self.attempt_dir(attempt)
        return folder is not None and any(name.startswith("rank-") and name.endswith(".json")
                                          for name in os.listdir(folder)) or self.attempt_dir(attempt + 1)


def run_scenario(spec, folder, clean, keep):
    """Run `spec` in `folder` (its work, tmp and run folders), check it, and return the result."""
    work, tmp = os.path.join(folder, "work"), os.path.join(folder, "tmp")
    for path in (work, tmp, os.path.join(work, "ckpt")):
        os.makedirs(path, exist_ok=True)
    mount_tmpfs("/dev/shm", "512m")   # this namespace's own: all it holds afterwards, the run left
    mount_tmpfs(os.path.join(work, "ckpt"), DISK_BYTES)
    set_subreaper()
    run_dir = None if spec["rundir"] == "temp" else os.path.join(folder, "run")
    if spec["rundir"] == "reused":
        stale_run_dir(run_dir, spec["n"])

    def run_dirs():
        if run_dir is not None:
            return [run_dir]
        return sorted(os.path.join(tmp, d) for d in os.listdir(tmp) if d.startswith("pydist-run-"))

    bound = bound_s(spec)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_", "MPIR_", "PYDIST_"))}
    env.update(PYTHONPATH=ROOT, TMPDIR=tmp, UCX_ERROR_SIGNALS="", MPIEXEC_TIMEOUT=str(int(bound)),
               CHAOS_SPEC=format_spec(spec), CHAOS_WORK=work)
    if keep:
        env["CHAOS_KEEP"] = keep
    log_path = os.path.join(folder, "launcher.log")
    outside = Outside(spec, work, run_dirs)
    started = time.monotonic()
    with open(log_path, "w") as log:
        # (SIGINT as a terminal leaves it: this soak may run in the background, where the shell ignores it)
        launcher = subprocess.Popen(launcher_command(spec, work, run_dir), cwd=work, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        outside.launcher = launcher.pid
        hung = False
        while launcher.poll() is None:
            if time.monotonic() - started > bound:
                hung = True
                break
            outside.step()
            time.sleep(0.01)
    seconds = time.monotonic() - started
    if outside.cont_at is not None:
        outside.signal(outside.stopped, signal.SIGCONT, "cont")
    if outside.filler:
        os.unlink(outside.filler)
    result = {"spec": format_spec(spec), "seconds": round(seconds, 1), "bound": bound, "failures": [],
              "folder": folder}
    with open(log_path, errors="replace") as f:
        output = f.read().replace("\0", "")   # (Open MPI's launcher ends its messages with a NUL byte)
    if hung:
        alive = descendants()
        result["failures"].append(("hang", f"the launcher had not ended after {bound:.0f} s; still running: "
                                   + "; ".join(f"{pid} {cmd[:100]}" for pid, cmd in alive)))
        kill_all(alive)
        launcher.wait()
        reap()
        happened = what_happened(spec, work, outside.done)
        result.update(got="hang", rc=None, want=sorted(expected(spec, happened)[0]), happened=happened)
        return result
    strays = stray_processes()   # first: nothing may write the checkpoint while it is checked
    got = verdict(launcher.returncode, output)
    happened = what_happened(spec, work, outside.done)
    want, rc = expected(spec, happened)
    if spec["hosts"] == 2 and "finished" in want and teardown_restart(output):
        want = want | {"restarted"}
    result.update(got=got, rc=launcher.returncode, want=sorted(want), want_rc=rc, happened=happened)
    if got not in want or (rc is not None and launcher.returncode != rc):
        result["failures"].append(("verdict", f"expected {' or '.join(sorted(want))}"
                                   + (f" (exit status {rc})" if rc is not None else "")
                                   + f", got {got} (exit status {launcher.returncode})"))
    result["failures"] += check_blame(spec, happened, output)
    result["failures"] += check_checkpoint(spec, work, clean, got)
    result["failures"] += check_leftovers(work, tmp, got, output, strays)
    return result


# ---------------------------------------------------------------------------------------------------
# The checks

def teardown_restart(output):
    """Between simulated hosts, an attempt that had trained to the end and then lost a rank in MPI's
    teardown: UCX over TCP hung in MPI_Finalize, the finalize guard ended that rank with status 0 without
    PMI's goodbye, and hydra killed the others (openucx/ucx#8738; the guard's own words say so). The
    launcher, told nothing by any rank, restarts it from the last checkpoint with 0 steps lost: a harness
    artifact, not a fault of the job's."""
    lost_none = re.search(r"its newest checkpoint is step \d+ [^\n]*: 0 step\(s\) lost", output)
    recomputed_none = re.search(r"^pydist\.run: finished: .* 1 restart\(s\), 0 step\(s\) recomputed$", output, re.M)
    return ("cluster finalize guard: MPI_Finalize did not return" in output and "no rank recorded why" in output
            and lost_none is not None and recomputed_none is not None)


def verdict(rc, output):
    """What the launcher said came of the job: finished, restarted, carried on, restarted+carried on,
    gave up, interrupted (or failed: a non-zero exit without its giving up)."""
    if rc == 130 and "pydist.run: interrupted: every rank ended; kept " in output:
        return "interrupted"
    if rc != 0:
        return "gave up" if "giving up" in output else "failed"
    restarts = re.findall(r"finished: .*?(\d+) restart\(s\)", output)
    restarted = bool(restarts) and int(restarts[-1]) > 0
    carried = output.count("the job carried on without it")
    if carried:
        # every rank but those it carried on without must have come to the end
        ended = re.findall(r"finished: (\d+) of (\d+) rank\(s\) to the end", output)
        if not ended or int(ended[-1][0]) != int(ended[-1][1]) - carried:
            return f"finished with {ended[-1][0] if ended else '?'} rank(s) left after {carried} carried on without"
        return "restarted+carried on" if restarted else "carried on"
    return "restarted" if restarted else "finished"


def blamed(output):
    """The ranks the launcher named for each attempt: [[(rank, what it said), ...] per attempt]."""
    parts = re.split(r"^pydist\.run: (?:starting|restarting) .*$", output, flags=re.M)[1:]
    return [[(int(r), why) for r, why in re.findall(r"^pydist\.run: rank (\d+) \(host [^,]+, pid \d+\) (.*)$", p, re.M)]
            for p in parts]


def check_blame(spec, happened, output):
    """In every attempt the fault reached, the launcher names it: the faulty rank and how it ended (a
    hang: the timeout it caused; a full disk: the checkpoint it could not write)."""
    kind, rank = spec["fault"], spec["rank"]
    said = blamed(output)
    failures = []
    for attempt in sorted({a for a, _ in happened["hits"]}):
        lines = said[attempt] if attempt < len(said) else []
        if kind == "kill":
            ok = any(r == rank and "killed by signal 9" in why for r, why in lines)
        elif kind == "exit":
            ok = any(r == rank and f"exited with status {spec['code']}" in why for r, why in lines)
        elif kind == "raise":
            ok = any(r == rank and "RuntimeError: chaos" in why for r, why in lines)
        elif kind == "usage":
            ok = any("exited with status 2" in why for _, why in lines)
        elif kind == "same":
            ok = any("FileNotFoundError" in why and "train-images.idx" in why for _, why in lines)
        elif kind == "after":
            ok = any(r == rank and "chaos: an exception after training" in why for r, why in lines)
        elif kind == "interrupt":   # no rank to blame: one line naming what was kept, no traceback of its own
            said = re.findall(r"^pydist\.run: interrupted: every rank ended; kept .*$", output, re.M)
            ok = len(said) == 1 and not re.search(r"^Traceback", output, re.M)
            lines = said or lines
        elif kind == "hang":
            # the timeout it caused, or the launcher's word that it never arrived (before init, or left
            # running alone under --survive)
            ok = any("timed out" in why or (r == rank and "never arrived" in why) for r, why in lines)
        else:   # rank 0's own error, or another rank's word that rank 0 could not write it
            ok = any("No space left on device" in why or "could not write the checkpoint" in why for _, why in lines)
        if not ok and kind != "stop":
            failures.append(("verdict", f"attempt {attempt + 1}: the launcher did not name the {kind} of rank {rank}; "
                             f"it said: {lines or 'nothing of a rank'}"))
    if kind in EVERY_RANK and "restarting" in output:
        failures.append(("verdict", "a failure every rank had alike was restarted (a restart repeats it)"))
    return failures


def what_happened(spec, work, outside):
    """The fault as it came about: [attempt, in_call] each time it reached a rank (a signal to a live
    rank, a fault event in the job, a checkpoint begun on the full disk), in_call saying whether the
    server (the asynchronous strategies' last rank) was in a training call then, when --survive can carry
    on without a worker (None: too close to say, or not asynchronous)."""
    kind, rank = spec["fault"], spec["rank"]
    folder = os.path.join(work, "events")
    attempts = sorted({int(name[1:].split("-")[0]) for name in os.listdir(folder)}) if os.path.isdir(folder) else []
    hits = []   # (attempt, time)
    if kind in ("exit", "raise", "hang", "after"):
        hits = [(a, ev["t"]) for a in attempts for ev in read_events(work, a, rank) if ev["ev"] == "fault"]
    elif kind in EVERY_RANK:   # once an attempt, whichever rank met it first
        firsts = {}
        for a in attempts:
            for r in range(spec["n"]):
                for ev in read_events(work, a, r):
                    if ev["ev"] == "fault":
                        firsts[a] = min(firsts.get(a, ev["t"]), ev["t"])
        hits = sorted(firsts.items())
    elif kind == "interrupt":
        hits = [(d["attempt"], d["t"]) for d in outside if d["what"] == "interrupt" and d["delivered"]]
    elif kind in ("kill", "stop"):
        hits = [(d["attempt"], d["t"]) for d in outside if d["what"] == kind and d["delivered"]]
    elif kind == "diskfull":
        filled = [d["t"] for d in outside if d["what"] == "filled"]
        freed = [d["t"] for d in outside if d["what"] == "freed"] or [float("inf")]
        for a in attempts:   # a checkpoint that never finished, begun before the space was freed (the
            events = read_events(work, a, 0)   # filling may start while one is being written)
            finished = {ev["step"] for ev in events if ev["ev"] == "saved"}
            hits += [(a, ev["t"]) for ev in events if ev["ev"] == "save" and ev["step"] not in finished
                     and filled and ev["t"] < freed[0]][:1]
    server = spec["n"] - 1
    return {"hits": [[a, in_call(read_events(work, a, server), t) if spec["strategy"] in ASYNC else None]
                     for a, t in hits]}


def in_call(events, t, margin=0.001):
    """Whether time `t` fell inside one of these training calls ("a worker that dies during training
    ends nothing"), or in one that never ended; None when within `margin` seconds of a call's end or
    start (the times come from different processes); False when between calls. A server's call that
    ended going on without nobody counts as between calls: the worker had sent its last message of the
    call (its DONE) before it died, so to the others it died after the call (the server ends a call only
    on every worker's DONE or noticed death)."""
    start = None
    for ev in events:
        if ev["ev"] == "call":
            start = ev["t"]
        elif ev["ev"] == "end" and start is not None:
            if start - margin <= t <= ev["t"] + margin:
                if ev.get("without") == 0:
                    return False
                return True if start + margin < t < ev["t"] - margin else None
            start = None
    if start is None or t < start - margin:
        return False
    return True if t > start + margin else None


def expected(spec, happened):
    """({acceptable verdicts}, exit status or None) for what happened, by pydist/run.py's docstring:
    a dead rank ends the job and the launcher restarts it from the newest checkpoint, up to
    --max-restarts (then it gives up with the failed rank's status); a rank that failed twice running on
    one host is left out, and at fewer ranks than --min-ranks (-n here) it gives up; under --survive an
    asynchronous strategy carries on without a worker that died during training (exit status 0), and may
    without one that died between training calls (else that is restarted); a
    rank stopped for less than the job's timeout costs nothing."""
    kind = spec["fault"]
    if kind in ("none", "stop"):
        return {"finished"}, 0
    if kind in EVERY_RANK + ("interrupt",):   # the first attempt meets it (or the job ended before Ctrl-C came)
        if not happened["hits"]:
            return {"finished"}, 0
        return ({"interrupted"}, 130) if kind == "interrupt" else ({"gave up"}, 2 if kind == "usage" else 1)
    status = {"kill": 128 + signal.SIGKILL, "exit": spec["code"], "raise": 1, "after": 1}.get(kind)
    worker = spec["strategy"] in ASYNC and spec["rank"] < spec["n"] - 1
    survivable = spec["survive"] and worker and kind in ("kill", "exit", "raise")
    outcomes = set()

    def follow(hits, restarts):   # each outcome the rules allow, one fault after the other
        if not hits:
            if spec["repeat"] == "once" or not restarts:
                outcomes.add(("restarted" if restarts else "finished", 0))
                return
            hits = [[None, None]]   # repeat=always: the attempt after a restart meets it again, anywhere
        (_, mid_call), rest = hits[0], hits[1:]
        if survivable:   # during training: carried on; between calls the server may learn of it first too
            outcomes.add(("restarted+carried on" if restarts else "carried on", 0))
            if mid_call:
                return
        # an attempt failed: given up at --max-restarts, or when its rank failed again (left out, and -n
        # is --min-ranks; a hang or a full disk may be blamed on another rank each time)
        if restarts >= spec["restarts"] or (spec["repeat"] == "always" and restarts):
            outcomes.add(("gave up", status))
        if restarts < spec["restarts"]:
            follow(rest, restarts + 1)
    follow(happened["hits"], 0)
    statuses = {rc for _, rc in outcomes}
    return {v for v, _ in outcomes}, statuses.pop() if len(statuses) == 1 else None


def load(path):
    """(step, epoch, params, momentum) of a checkpoint, read by a Trainer at world size 1."""
    from pydist.engine import Trainer
    t = Trainer(model(), batch_size=BATCH).load(path, strict=False)   # (whichever strategy saved it)
    return t.step, t.epoch, t.params.copy(), t.engine.momentum.copy()


def check_checkpoint(spec, work, clean, got):
    """The newest checkpoint: there once one was finished, whole (it loads: CRC32), at the step of the
    last one finished or later, and, for a synchronous strategy, the clean run's weights at that step."""
    path = os.path.join(work, "ckpt", "run.ckpt")
    finished = [ev["step"] for name in sorted(os.listdir(os.path.join(work, "events")))
                for ev in read_events(work, *map(int, re.findall(r"\d+", name))) if ev["ev"] == "saved"] \
        if os.path.isdir(os.path.join(work, "events")) else []
    if not os.path.exists(path):
        return [("checkpoint", f"lost: none at {path}, after step {max(finished)}'s was finished")] if finished else []
    try:
        step, epoch, params, momentum = load(path)
    except ValueError as e:
        return [("checkpoint", f"torn: {e}")]
    if finished and step < max(finished):
        return [("checkpoint", f"lost: the newest is step {step}'s; step {max(finished)}'s was finished")]
    if got in ("finished", "restarted", "carried on") and epoch != EPOCHS:
        return [("checkpoint", f"the job finished but its checkpoint is at epoch {epoch} (step {step})")]
    if spec["strategy"] not in SYNC or clean is None:
        return []
    reference = os.path.join(clean, f"step-{step}.ckpt")
    if not os.path.exists(reference):
        return [("checkpoint", f"step {step}: a clean run writes no checkpoint there")]
    _, _, want_params, want_momentum = load(reference)
    if params.tobytes() != want_params.tobytes() or momentum.tobytes() != want_momentum.tobytes():
        return [("checkpoint", f"step {step}: weights differ from the clean run's at that step")]
    return []


def stray_processes(grace=5.0):
    """The run's processes still alive `grace` seconds after the launcher ended (then killed)."""
    deadline = time.monotonic() + grace
    while descendants() and time.monotonic() < deadline:
        reap()
        time.sleep(0.05)
    alive = descendants()
    kill_all(alive)
    return alive


def check_leftovers(work, tmp, got, output, strays, shm="/dev/shm"):
    """Nothing left behind: processes (`strays`), /dev/shm (this namespace's own), files beside the
    checkpoint, anything in $TMPDIR but the launcher's folder after a failure, which it must then name."""
    found = []
    if strays:
        found.append(f"processes {'; '.join(f'{pid} {cmd[:80]}' for pid, cmd in strays)}")
    if os.listdir(shm):
        found.append(f"{shm}: {', '.join(sorted(os.listdir(shm)))}")
    beside = sorted(set(os.listdir(os.path.join(work, "ckpt"))) - {"run.ckpt"})
    if beside:
        found.append(f"beside the checkpoint: {', '.join(beside)}")
    in_tmp = sorted(os.listdir(tmp))
    runs = [d for d in in_tmp if d.startswith("pydist-run-")]
    if got in ("gave up", "interrupted"):
        unnamed = [d for d in runs if os.path.join(tmp, d) not in output]
        if unnamed:
            found.append(f"$TMPDIR: {', '.join(unnamed)} kept after the failure but not named in the output")
        in_tmp = [d for d in in_tmp if d not in runs]
    if in_tmp:
        found.append(f"$TMPDIR: {', '.join(in_tmp)}")
    return [("leftover", "; ".join(found))] if found else []


# ---------------------------------------------------------------------------------------------------
# The soak: clean references, each scenario in its namespace, the totals

def namespace_prefix():
    """(how to run a command in a private mount namespace here, None), or (None, why not): as root,
    or as the mapped root of a user namespace where unprivileged user namespaces are allowed."""
    why = ""
    for prefix in (["unshare", "--mount", "--propagation", "private", "--"],
                   ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private", "--"]):
        try:
            probe = subprocess.run([*prefix, "sh", "-c", "mount -t tmpfs -o size=1m chaos /mnt"], capture_output=True,
                                   text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            why = str(e)
            continue
        if probe.returncode == 0:
            return prefix, None
        why = probe.stderr.strip()
    return None, f"no private mount namespace with a tmpfs (root, or unprivileged user namespaces): {why}"


def run_in_namespace(prefix, spec, folder, clean=None, keep=None):
    cmd = [*prefix, sys.executable, HERE, "--scenario", format_spec(spec), "--folder", folder]
    cmd += ["--clean", clean] if clean else []
    cmd += ["--keep-checkpoints", keep] if keep else []
    limit = bound_s(spec) + 60   # the scenario's own bound, then the checks
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired as e:
        return {"spec": format_spec(spec), "seconds": limit, "got": "hang", "folder": folder,
                "failures": [("hang", f"the scenario itself had not ended after {limit:.0f} s: {e.stderr!r:.300}")]}
    for line in proc.stdout.splitlines():
        if line.startswith("CHAOS-RESULT "):
            return json.loads(line[len("CHAOS-RESULT "):])
    return {"spec": format_spec(spec), "seconds": 0, "got": "error", "folder": folder,
            "failures": [("harness", f"no result (exit status {proc.returncode}): {proc.stderr[-2000:]}")]}


def clean_reference(prefix, spec, base, cache):
    """The checkpoints a clean run of `spec`'s job writes (a folder of step-S.ckpt), run once per job
    (strategy, ranks, hosts) and kept for the soak; None for the strategies not compared bitwise."""
    if spec["strategy"] not in SYNC:
        return None
    key = f"{spec['strategy']}-n{spec['n']}-h{spec['hosts']}"
    if key not in cache:
        keep = os.path.join(base, "clean", key)
        os.makedirs(keep)
        clean = dict(DEFAULTS, strategy=spec["strategy"], n=spec["n"], hosts=spec["hosts"], fits=1, restarts=0)
        result = run_in_namespace(prefix, clean, os.path.join(base, "clean", key + "-run"), keep=keep)
        ok = not result["failures"] and os.listdir(keep)
        print(f"  clean reference {key}: {'ok' if ok else 'FAILED'} in {result['seconds']} s"
              + ("" if ok else f": {result['failures']} ({result['folder']})"), flush=True)
        cache[key] = keep if ok else None
    return cache[key]


def describe(happened):
    """The fault as it came about, in a few words."""
    if happened is None:
        return "unknown"
    if not happened["hits"]:
        return "fault not reached"
    where = {True: " mid-call", False: " between calls", None: ""}
    return "fault in attempt " + ", ".join(f"{a + 1}{where[c]}" for a, c in happened["hits"])


KINDS = ("hang", "verdict", "checkpoint", "leftover", "harness")


def soak(specs, base, keep=False):
    prefix, why = namespace_prefix()
    if prefix is None:
        raise SystemExit(f"chaos.py: {why}")
    cache, failed = {}, []
    counts = dict.fromkeys(KINDS, 0)
    started = time.monotonic()
    for i, spec in enumerate(specs, 1):
        clean = clean_reference(prefix, spec, base, cache)
        folder = os.path.join(base, f"run-{i:04d}")
        result = run_in_namespace(prefix, spec, folder, clean=clean)
        kinds = {kind for kind, _ in result["failures"]}
        for kind in kinds:
            counts[kind] += 1
        want = " or ".join(result.get("want", ["?"]))
        print(f"[{i}/{len(specs)}] {'FAIL' if kinds else 'ok  '} {result['seconds']:6.1f} s  expected {want}, "
              f"got {result['got']} ({describe(result.get('happened'))})  | {result['spec']}", flush=True)
        for kind, why in result["failures"]:
            print(f"      {kind}: {why}", flush=True)
        if kinds:
            failed.append((result["spec"], sorted(kinds), result["folder"]))
        elif not keep:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"\nruns {len(specs)} in {time.monotonic() - started:.0f} s: hangs {counts['hang']}, wrong verdicts "
          f"{counts['verdict']}, torn/lost checkpoints {counts['checkpoint']}, leftovers {counts['leftover']}, "
          f"harness errors {counts['harness']}; failed runs {len(failed)}")
    for spec, kinds, folder in failed:
        print(f"  {','.join(kinds)}: --spec '{spec}'   ({folder})")
    return 1 if failed else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, help="random scenarios to run")
    ap.add_argument("--seed", type=int, default=0, help="of the random scenarios (default 0)")
    ap.add_argument("--spec", action="append", default=[], help="a scenario's line, run as given (repeatable)")
    ap.add_argument("--only", nargs="+", default=[], metavar="KEY=V1,V2",
                    help="keep only the random scenarios whose KEY is one of the values")
    ap.add_argument("--base", default=None, help="folder for the runs (default: a new temporary one)")
    ap.add_argument("--list", action="store_true", help="print the scenarios' lines and run nothing")
    ap.add_argument("--keep", action="store_true", help="keep every run's folder (default: the failed runs' only)")
    ap.add_argument("--mpiexec", default=None, metavar="CMD",
                    help="the launcher pydist.run starts the job with (another MPI's, e.g. Open MPI's mpiexec "
                         "with its settings in the environment); single-host scenarios only (hosts=1)")
    ap.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--scenario", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    ap.add_argument("--clean", help=argparse.SUPPRESS)
    ap.add_argument("--keep-checkpoints", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.job:
        return job()
    if args.scenario:
        result = run_scenario(parse_spec(args.scenario), args.folder, args.clean, args.keep_checkpoints)
        print("CHAOS-RESULT " + json.dumps(result), flush=True)
        return 0
    try:
        specs = [parse_spec(s) for s in args.spec]
        only = {}
        for item in args.only:
            key, sep, values = item.partition("=")
            if not sep or key not in DEFAULTS:
                raise ValueError(f"--only: '{item}' is not KEY=V1,V2 with KEY one of {', '.join(DEFAULTS)}")
            only[key] = set(values.split(","))
    except ValueError as e:
        ap.error(str(e))
    if args.runs:
        specs += [s for s in scenarios(args.runs, args.seed) if matches(s, only)]
    if not specs:
        ap.error("nothing to run: give --runs N (and --seed S) or --spec LINE")
    if args.mpiexec:
        if any(s["hosts"] != 1 for s in specs):
            ap.error("--mpiexec runs single-host scenarios only: add --only hosts=1")
        os.environ["CHAOS_MPIEXEC"] = args.mpiexec   # to each scenario's process (its environment)
    if args.list:
        print("\n".join(format_spec(s) for s in specs))
        return 0
    base = args.base or tempfile.mkdtemp(prefix="pydist-chaos-")
    os.makedirs(base, exist_ok=True)
    print(f"chaos: {len(specs)} run(s) in {base}", flush=True)
    status = soak(specs, base, args.keep)
    if status == 0 and args.base is None and not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
