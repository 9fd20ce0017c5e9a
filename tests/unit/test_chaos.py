"""The fault-injection soak of python -m pydist.run (tests/chaos.py, issue 41 part 3): its checks on
their own (each must be able to fail), then a bounded soak of 10 scenarios from a fixed seed, one of
each fault kind, that must end with no failure.

The soak runs every scenario in a private mount namespace (root, or unprivileged user namespaces);
where the machine has neither it is SKIPPED with a reason that starts "NOT RUN (chaos)", so that it
shows in pytest's summary (-rs) and is never mistaken for a pass.
"""
import os
import re
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import chaos  # noqa: E402
from unit_helpers import subprocess_env  # noqa: E402

SEED, RUNS = 40, 10   # every fault kind once; sync and async, both hosts layouts, with and without --survive


def test_a_scenarios_line_gives_it_back_and_a_bad_one_is_refused():
    for spec in chaos.scenarios(60, 1):
        assert chaos.parse_spec(chaos.format_spec(spec)) == spec
    assert chaos.parse_spec("strategy=ring n=3 fault=kill rank=2 at=40") == dict(
        chaos.DEFAULTS, strategy="ring", n=3, fault="kill", rank=2, at=40)
    for line, word in (("color=red", "color=red"), ("n=two", "n='two'"), ("fault=flood", "fault must be"),
                       ("strategy=adag n=2", "n=2 ranks for adag"), ("n=2 rank=2", "rank must be"),
                       ("fault=kill at=init", "at=init is for fault=hang")):
        with pytest.raises(ValueError, match=re.escape(word)):
            chaos.parse_spec(line)


def test_every_fault_kind_comes_once_in_each_stretch():
    specs = chaos.scenarios(3 * len(chaos.FAULTS), 7)
    for i in range(0, len(specs), len(chaos.FAULTS)):
        assert sorted(s["fault"] for s in specs[i:i + len(chaos.FAULTS)]) == sorted(chaos.FAULTS)
    bounded = [s["fault"] for s in chaos.scenarios(RUNS, SEED)]
    assert set(bounded) == set(chaos.FAULTS), bounded


@pytest.mark.parametrize("line, hits, verdicts, status", [
    ("strategy=allreduce n=3 fault=kill rank=1 restarts=1", [[0, None]], {"restarted"}, 0),
    ("strategy=allreduce n=3 fault=kill rank=1 restarts=0", [[0, None]], {"gave up"}, 137),
    ("strategy=ring n=2 fault=exit code=42 rank=1 restarts=0", [[0, None]], {"gave up"}, 42),
    # the same rank failing again is left out, and -n is --min-ranks: given up before --max-restarts
    ("strategy=allreduce n=3 fault=kill rank=1 restarts=3 repeat=always", [[0, None], [1, None]], {"gave up"}, 137),
    ("strategy=ring n=3 fault=hang rank=1 restarts=3 repeat=always", [[0, None], [1, None], [2, None]],
     {"gave up"}, None),
    ("strategy=allreduce n=2 fault=kill rank=1", [], {"finished"}, 0),   # the job ended before step `at`
    ("strategy=allreduce n=2 fault=stop stop=2 rank=1", [[0, None]], {"finished"}, 0),
    # --survive: a worker that dies during training (the server mid-call) is carried on without ...
    ("strategy=adag n=3 survive=1 fault=raise rank=1", [[0, True]], {"carried on"}, 0),
    # ... one between calls may also end the job; the server's death always does
    ("strategy=adag n=3 survive=1 fault=raise rank=1 restarts=0", [[0, False]], {"carried on", "gave up"}, None),
    ("strategy=adag n=3 survive=1 fault=raise rank=1 restarts=0", [[0, None]], {"carried on", "gave up"}, None),
    ("strategy=adag n=3 survive=1 fault=raise rank=1 restarts=3 repeat=always", [[0, False], [1, True]],
     {"carried on", "restarted+carried on"}, 0),
    ("strategy=adag n=3 survive=1 fault=kill rank=2", [[0, True]], {"restarted"}, 0),
    ("strategy=downpour n=3 survive=0 fault=kill rank=0", [[0, True]], {"restarted"}, 0),
    # what a restart would only repeat is given up at once, whatever --max-restarts says
    ("strategy=allreduce n=3 fault=usage restarts=3", [[0, None]], {"gave up"}, 2),
    ("strategy=adag n=3 survive=1 fault=same restarts=3", [[0, None]], {"gave up"}, 1),
    # a failure after training is the job's, --survive or not: restarted (the resumed job has nothing left)
    ("strategy=adag n=3 survive=1 fault=after rank=1 restarts=1", [[0, False]], {"restarted"}, 0),
    ("strategy=ring n=2 fault=after rank=0 restarts=0", [[0, False]], {"gave up"}, 1),
    ("strategy=ring n=2 fault=interrupt at=50", [[0, None]], {"interrupted"}, 130),
    ("strategy=ring n=2 fault=interrupt at=5000", [], {"finished"}, 0),
])
def test_expected_verdicts_follow_the_launchers_rules(line, hits, verdicts, status):
    assert chaos.expected(chaos.parse_spec(line), {"hits": hits}) == (verdicts, status)


RESTARTED = """pydist.run: starting 3 rank(s) on this machine
[rank0]: pydist.DistTimeoutError: the training step's communication timed out after 10.001 s
pydist.run: rank 0 (host vm, pid 21332) exited with status 1: DistTimeoutError: the training step's \
communication timed out after 10.001 s (timeout 10.000 s), 11.5 s into the run
pydist.run: restart 1 of at most 1, from /w/run.ckpt (step 300)
pydist.run: restarting 3 rank(s) on this machine (attempt 2)
pydist.run: finished: 3 rank(s), 1 restart(s), 0 step(s) recomputed
"""
CARRIED_ON = """pydist.run: starting 3 rank(s) on chaos-h1:2,chaos-h2:1
pydist.run: rank 1 (host chaos-h1, pid 26235) exited with status 3, 1.0 s into the run; the job carried on \
without it
pydist.run: finished: 2 of 3 rank(s) to the end, 0 restart(s)
"""


def test_the_launchers_words_are_read():
    assert chaos.verdict(0, RESTARTED) == "restarted" and chaos.verdict(0, CARRIED_ON) == "carried on"
    assert chaos.verdict(0, "pydist.run: finished: 2 rank(s), 0 restart(s)\n") == "finished"
    gave_up = "pydist.run: giving up after 0 restart(s) (--max-restarts 0); exit status 137"
    assert chaos.verdict(137, gave_up) == "gave up"
    assert chaos.verdict(1, "Traceback ...") == "failed"
    # carried on, but with none of the ranks left to finish: no verdict the rules allow
    nobody = CARRIED_ON.replace("finished: 2 of 3", "finished: 0 of 3")
    assert chaos.verdict(0, nobody) == "finished with 0 rank(s) left after 1 carried on without"
    assert chaos.blamed(RESTARTED)[0][0][0] == 0 and chaos.blamed(RESTARTED)[1] == []
    hang = chaos.parse_spec("strategy=ring n=3 fault=hang rank=2")
    assert chaos.check_blame(hang, {"hits": [[0, None]]}, RESTARTED) == []
    # a launcher that names another fault (a stale record, say) is caught
    kill = chaos.parse_spec("strategy=ring n=3 fault=kill rank=1")
    assert chaos.check_blame(kill, {"hits": [[0, None]]}, RESTARTED)[0][0] == "verdict"
    exit3 = chaos.parse_spec("strategy=adag n=3 survive=1 fault=exit code=3 rank=1")
    assert chaos.check_blame(exit3, {"hits": [[0, True]]}, CARRIED_ON) == []
    # Ctrl-C: one line of the launcher's naming what it kept, and no traceback of its own
    interrupted = ("pydist.run: starting 2 rank(s) on this machine\n[rank0]: KeyboardInterrupt in _fit (engine.py:1)\n"
                   "pydist.run: interrupted: every rank ended; kept no checkpoint (none was written); the ranks' "
                   "records in /tmp/pydist-run-x\n")
    assert chaos.verdict(130, interrupted) == "interrupted" and chaos.verdict(130, "Traceback") == "failed"
    ctrl_c = chaos.parse_spec("strategy=ring n=2 fault=interrupt at=50")
    assert chaos.check_blame(ctrl_c, {"hits": [[0, None]]}, interrupted) == []
    assert chaos.check_blame(ctrl_c, {"hits": [[0, None]]}, interrupted + "Traceback (most recent call last):\n")
    # a failure every rank had alike, restarted, is a wrong verdict
    usage = chaos.parse_spec("strategy=ring n=2 fault=usage")
    said = ("pydist.run: starting 2 rank(s) on this machine\n"
            "pydist.run: rank 0 (host vm, pid 5) exited with status 2, 1.0 s into the run\n")
    assert chaos.check_blame(usage, {"hits": [[0, None]]}, said) == []
    restarted = said + "pydist.run: restarting 2 rank(s) on this machine (attempt 2)\n"
    assert "was restarted" in chaos.check_blame(usage, {"hits": [[0, None]]}, restarted)[-1][1]


def test_a_death_is_placed_against_the_servers_training_calls():
    events = [{"ev": "call", "t": 10.0}, {"ev": "end", "t": 10.5}, {"ev": "call", "t": 10.6}]
    assert chaos.in_call(events, 10.2) is True
    assert chaos.in_call(events, 10.55) is False      # between calls
    assert chaos.in_call(events, 10.4995) is None      # too close to the end to say
    assert chaos.in_call(events, 11.0) is True         # in a call that never ended
    assert chaos.in_call(events, 9.0) is False
    # a call the server ended going on without nobody: the worker had sent its DONE before it died
    ended = [{"ev": "call", "t": 10.0}, {"ev": "end", "t": 10.5, "without": 0}]
    assert chaos.in_call(ended, 10.2) is False
    went_on = [{"ev": "call", "t": 10.0}, {"ev": "end", "t": 10.5, "without": 1}]
    assert chaos.in_call(went_on, 10.2) is True


def write_checkpoint(path, step):
    """A checkpoint of the soak's model, as a world-size-1 Trainer writes it, at `step`."""
    from pydist.engine import Trainer
    t = Trainer(chaos.model(), batch_size=chaos.BATCH, seed=1)
    t.step = step
    t.save(path)
    return t


def saved_events(work, *steps):
    os.makedirs(work / "events", exist_ok=True)
    log = chaos.Events(str(work), 0, 0)
    for step in steps:
        log("saved", step=step)


def test_a_torn_lost_or_different_checkpoint_is_caught(tmp_path):
    work, clean = tmp_path / "work", tmp_path / "clean"
    (work / "ckpt").mkdir(parents=True)
    clean.mkdir()
    spec = chaos.parse_spec("strategy=allreduce n=2")
    path = work / "ckpt" / "run.ckpt"
    trainer = write_checkpoint(path, 50)
    saved_events(work, 25, 50)
    (clean / "step-50.ckpt").write_bytes(path.read_bytes())
    assert chaos.check_checkpoint(spec, str(work), str(clean), "gave up") == []
    # the job said it finished, but the checkpoint is not the last epoch's
    assert "finished but its checkpoint is at epoch 0" in chaos.check_checkpoint(spec, str(work), str(clean),
                                                                                 "finished")[0][1]
    # another step than the newest finished one: lost
    write_checkpoint(path, 25)
    assert "lost: the newest is step 25's" in chaos.check_checkpoint(spec, str(work), str(clean), "gave up")[0][1]
    # weights other than the clean run's at that step
    trainer.params[0] += 1.0
    trainer.step = 50
    trainer.save(path)
    assert "differ from the clean run's" in chaos.check_checkpoint(spec, str(work), str(clean), "gave up")[0][1]
    # torn: a byte short
    data = path.read_bytes()
    path.write_bytes(data[:-1])
    assert chaos.check_checkpoint(spec, str(work), str(clean), "gave up")[0][1].startswith("torn")
    path.unlink()
    assert chaos.check_checkpoint(spec, str(work), str(clean), "gave up")[0][1].startswith("lost: none")
    # no checkpoint was ever finished: none is owed
    (work / "events" / "a0-r0.jsonl").unlink()
    assert chaos.check_checkpoint(spec, str(work), str(clean), "gave up") == []


def test_leftovers_are_found(tmp_path):
    work, tmp, shm = tmp_path / "work", tmp_path / "tmp", tmp_path / "shm"
    for d in (work / "ckpt", tmp, shm):
        d.mkdir(parents=True)
    args = (str(work), str(tmp))
    assert chaos.check_leftovers(*args, "finished", "", [], shm=str(shm)) == []
    (tmp / "pydist-run-abc").mkdir()
    named = f"pydist.run: giving up; its folder {tmp / 'pydist-run-abc'} is kept"
    assert chaos.check_leftovers(*args, "gave up", named, [], shm=str(shm)) == []   # kept and named
    (shm / "mpich_shm_1").write_bytes(b"")
    (work / "ckpt" / "run.ckpt.tmp.77").write_bytes(b"")
    [(kind, why)] = chaos.check_leftovers(*args, "finished", "", [(5, "python -m pydist.run --watch")],
                                          shm=str(shm))
    assert kind == "leftover"
    for part in ("processes 5 python", "mpich_shm_1", "beside the checkpoint: run.ckpt.tmp.77",
                 "$TMPDIR: pydist-run-abc"):
        assert part in why, why
    [(_, why)] = chaos.check_leftovers(*args, "gave up", "", [], shm=str(shm))
    assert "kept after the failure but not named" in why, why


NAMESPACE, REASON = chaos.namespace_prefix()


@pytest.mark.skipif(NAMESPACE is None, reason=f"NOT RUN (chaos): {REASON}")
def test_a_bounded_soak_finds_nothing(tmp_path):
    specs = chaos.scenarios(RUNS, SEED)
    # a hang guard: every scenario's own bound plus its checks, and a clean reference run for each
    limit = sum(chaos.bound_s(s) + 60 for s in specs) + 60 * len(specs)
    proc = subprocess.run([sys.executable, chaos.HERE, "--runs", str(RUNS), "--seed", str(SEED), "--base",
                           str(tmp_path)], capture_output=True, text=True, timeout=limit, env=subprocess_env())
    assert proc.returncode == 0 and f"runs {RUNS} in" in proc.stdout and "failed runs 0" in proc.stdout, \
        proc.stdout + proc.stderr
