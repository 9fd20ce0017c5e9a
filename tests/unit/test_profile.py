"""The per-layer profile (pydist/profile.py, Engine.profile): it times the engine's real passes, so the
gradient it leaves is a step's, and its FLOP counts add up to the step's."""
import subprocess
import sys

import numpy as np
import pytest

from pydist import _C
from pydist.engine import lenet5, mlp, step_flops
from pydist.profile import profile, table
from unit_helpers import subprocess_env


def test_profile_times_the_real_step_and_leaves_its_gradient():
    model = lenet5()
    e = _C.Engine(model.specs(), model.input_shape, 32)
    e.init_params(1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 784), dtype=np.float32)
    y = rng.integers(0, 10, 32, dtype=np.int32)
    forward, backward, loss = e.profile(x, y, 3)
    profiled = e.grads.copy()
    e.loss_and_grad(x, y)
    assert np.array_equal(profiled, e.grads)
    assert len(forward) == len(backward) == len(model.specs()) and loss > 0
    convs = [i for i, s in enumerate(model.specs()) if s[0] == 1]
    assert all(forward[i] > 0 and backward[i] > 0 for i in convs)
    # a ReLU that feeds a max-pool runs inside it: its own slots stay empty
    assert forward[1] == 0 and backward[1] == 0 and forward[2] > 0


@pytest.mark.parametrize("model", [lenet5(), mlp((64, 32))], ids=["lenet5", "mlp"])
def test_profile_flops_add_up_to_the_step(model):
    rows = profile(model, 16, reps=2)
    assert [r["name"] for r in rows][-1] == "loss" and len(rows) == len(model.specs()) + 1
    assert sum(r["forward_flops"] + r["backward_flops"] for r in rows) == step_flops(model, 16)
    text = table(rows, 100.0, "title")
    assert "% of the 100 GFLOP/s peak" in text and ("conv2d 1->6 5x5 pad 2" in text) == (model.name == "lenet5")


def test_profile_refuses_bad_arguments():
    model = lenet5()
    e = _C.Engine(model.specs(), model.input_shape, 4)
    x, y = np.zeros((4, 784), np.float32), np.zeros(4, np.int32)
    with pytest.raises(ValueError, match="reps"):
        e.profile(x, y, 0)
    with pytest.raises(ValueError, match="x"):
        e.profile(np.zeros((5, 784), np.float32), np.zeros(5, np.int32), 1)


def test_train_profile_prints_the_table_without_mpi():
    cmd = [sys.executable, "-m", "pydist.train", "--profile", "--model", "mlp", "--hidden", "32", "--batch-size", "8"]
    proc = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "OpenBLAS" in proc.stdout and "mlp-32, batch 8" in proc.stdout and "linear 784->32" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "pydist.profile", "--reps", "0"], env=subprocess_env(),
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "must be positive" in bad.stderr
