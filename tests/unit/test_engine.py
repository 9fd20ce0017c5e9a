"""The native engine at world size 1: gradients against finite differences, SGD against its formula,
errors, the data loader, and checkpoints that resume bit-identically. (PyTorch equality is in
test_engine_torch.py; R ranks x batch B == 1 rank x batch R*B is in tests/mpi/test_engine_dp.py.)"""
import errno
import gzip
import os
import pickle
import re
import signal
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest

import pydist as dist
from pydist import _C
from pydist.engine import (Conv2d, Flatten, Linear, MaxPool2d, Model, ReLU, Trainer, lenet5, load_fashion_mnist,
                           load_idx, mlp)
from unit_helpers import fit_resumed_at_step_7, simd_levels, subprocess_env

DATA = "/usr/share/datasets/fashion-mnist"


def engine_for(model, batch):
    e = _C.Engine(model.specs(), model.input_shape, batch)
    e.init_params(1)
    return e


def batch(model, n, seed=0, classes=None):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n,) + model.input_shape).astype(np.float32)
    y = rng.integers(0, classes or 3, n).astype(np.int32)
    return x, y


# One model per layer kind, small enough for finite differences; each ends in class scores.
GRAD_MODELS = {
    "linear": Model([Flatten(), Linear(12, 3)], input_shape=(3, 2, 2)),
    "linear+relu": Model([Flatten(), Linear(12, 7), ReLU(), Linear(7, 3)], input_shape=(3, 2, 2)),
    "conv": Model([Conv2d(2, 3, 3), Flatten(), Linear(3 * 4 * 4, 3)], input_shape=(2, 6, 6)),
    "conv-pad-stride": Model([Conv2d(2, 4, 3, stride=2, padding=1), Flatten(), Linear(4 * 4 * 4, 3)],
                             input_shape=(2, 7, 7)),
    "maxpool": Model([Conv2d(1, 2, 3, padding=1), MaxPool2d(2), Flatten(), Linear(2 * 3 * 3, 3)],
                     input_shape=(1, 6, 6)),
    "maxpool3": Model([Conv2d(1, 2, 3, padding=1), MaxPool2d(3), Flatten(), Linear(2 * 2 * 2, 3)],
                      input_shape=(1, 6, 6)),
    "relu": Model([Conv2d(1, 2, 3), ReLU(), Flatten(), Linear(2 * 4 * 4, 3)], input_shape=(1, 6, 6)),
}


def loss_at(engine, params, x, y):
    engine.params[:] = params
    return engine.loss_and_grad(x, y)[0]


@pytest.mark.parametrize("name", sorted(GRAD_MODELS))
def test_gradient_matches_finite_differences(name):
    model = GRAD_MODELS[name]
    e = engine_for(model, 5)
    x, y = batch(model, 5)
    p0 = e.params.copy()
    e.loss_and_grad(x, y)
    grad = e.grads.copy()
    rng = np.random.default_rng(7)
    # Per layer block: the derivative along a random direction, central differences in float32. The
    # step is small because max-pool and ReLU have kinks: a larger one crosses where the max switches.
    for w_off, w_n, b_off, b_n in e.layout:
        for off, n in ((w_off, w_n), (b_off, b_n)):
            if n == 0:
                continue
            v = np.zeros_like(p0)
            v[off:off + n] = rng.standard_normal(n).astype(np.float32)
            v /= np.linalg.norm(v)
            eps = 3e-4
            numeric = (loss_at(e, p0 + eps * v, x, y) - loss_at(e, p0 - eps * v, x, y)) / (2 * eps)
            analytic = float(grad @ v)
            assert abs(numeric - analytic) <= 2e-3 + 1e-2 * abs(analytic), (name, off, numeric, analytic)
    # And a few single coordinates, which catch a misplaced index that a direction could average out.
    for i in rng.choice(len(p0), size=min(8, len(p0)), replace=False):
        v = np.zeros_like(p0)
        v[i] = 1
        numeric = (loss_at(e, p0 + 3e-4 * v, x, y) - loss_at(e, p0 - 3e-4 * v, x, y)) / 6e-4
        assert abs(numeric - grad[i]) <= 2e-3 + 1e-2 * abs(grad[i]), (name, i, numeric, grad[i])


def relu_pool_reference(x, wc, bc, wl, bl, y, k):
    """Loss and gradients of 1x1 conv -> ReLU -> max-pool k -> flatten -> linear, unfused, in float64
    NumPy: the pooling takes the first maximum of the ReLU's output (torch's rule on ties)."""
    B, C, H, W = x.shape
    O, oh, ow = wc.shape[0], H // k, W // k
    z = np.einsum("oc,nchw->nohw", wc, x) + bc[None, :, None, None]
    r = np.maximum(z, 0)
    win = r[:, :, :oh * k, :ow * k].reshape(B, O, oh, k, ow, k).transpose(0, 1, 2, 4, 3, 5).reshape(B, O, oh, ow, k * k)
    arg = win.argmax(axis=-1)
    p = np.take_along_axis(win, arg[..., None], axis=-1)[..., 0]
    f = p.reshape(B, -1)
    logits = f @ wl.T + bl
    shifted = logits - logits.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -logp[np.arange(B), y].mean()
    dlogits = (np.exp(logp) - np.eye(wl.shape[0])[y]) / B
    dwl, dbl = dlogits.T @ f, dlogits.sum(axis=0)
    dp = (dlogits @ wl).reshape(p.shape)
    dwin = np.zeros_like(win)
    np.put_along_axis(dwin, arg[..., None], dp[..., None], axis=-1)
    dr = np.zeros_like(r)
    dr[:, :, :oh * k, :ow * k] = dwin.reshape(B, O, oh, ow, k, k).transpose(0, 1, 2, 4, 3, 5).reshape(B, O, oh * k, ow * k)
    dz = dr * (r > 0)
    dwc, dbc = np.einsum("nohw,nchw->oc", dz, x), dz.sum(axis=(0, 2, 3))
    return loss, np.concatenate([dwc.ravel(), dbc, dwl.ravel(), dbl])


# The model runs a ReLU followed by a max-pool as one pass (relu_maxpool_*; 2 x 2 windows in vectors of
# outputs, csrc/engine/pool2.c, and a general path). Shapes: 2 x 2 with rows shorter than a vector
# (LeNet's 14 and 5 outputs), one of 33 outputs (two vectors and a tail), inputs the windows leave
# uncovered, and a 3 x 3 window.
POOL_SHAPES = [(2, 8, 16), (2, 10, 12), (2, 28, 28), (2, 10, 10), (2, 4, 66), (2, 7, 9), (3, 9, 10)]


@pytest.mark.parametrize("k,h,w", POOL_SHAPES)
def test_relu_maxpool_fused_equals_unfused_numpy(k, h, w):
    B, C, O, classes = 3, 2, 3, 4
    oh, ow = h // k, w // k
    model = Model([Conv2d(C, O, 1), ReLU(), MaxPool2d(k), Flatten(), Linear(O * oh * ow, classes)],
                  input_shape=(C, h, w))
    e = engine_for(model, B)
    rng = np.random.default_rng(k * 100 + h)
    # Inputs on a grid of halves and small integer weights: the conv's outputs are exact, with ties
    # inside windows, windows entirely <= 0, and zeros (where the ReLU's and the pool's rules meet).
    x = (rng.integers(-4, 5, (B, C, h, w)) / 2).astype(np.float32)
    wc = np.array([[1, 0], [0, 1], [1, -1]], np.float32)
    bc = np.array([0, 0.5, -0.5], np.float32)
    wl = (rng.standard_normal((classes, O * oh * ow)) / 4).astype(np.float32)
    bl = rng.standard_normal(classes).astype(np.float32)
    y = rng.integers(0, classes, B).astype(np.int32)
    e.params[:] = np.concatenate([wc.ravel(), bc, wl.ravel(), bl])
    loss, _ = e.loss_and_grad(x.reshape(B, -1), y)
    ref_loss, ref_grads = relu_pool_reference(*(a.astype(np.float64) for a in (x, wc, bc, wl, bl)), y, k)
    assert abs(loss - ref_loss) < 1e-5, (loss, ref_loss)
    diff = np.abs(e.grads - ref_grads).max()
    print(f"relu+maxpool k={k} {h}x{w}: loss {loss:.6f} vs {ref_loss:.6f}, max gradient difference {diff:.2e}")
    np.testing.assert_allclose(e.grads, ref_grads, rtol=1e-5, atol=1e-6)
    conv_grads = e.grads[:O * C + O]
    assert np.abs(conv_grads).max() > 1e-3, "no gradient reached the conv: the comparison would be empty"


POOL_BUILDS_SCRIPT = r"""
import pickle, sys
import numpy as np
from pydist import _C
from pydist.engine import Conv2d, Flatten, Linear, MaxPool2d, Model, ReLU
out = []
for k, h, w in %r:
    for relu in (True, False):
        layers = [Conv2d(2, 3, 1)] + ([ReLU()] if relu else []) + [MaxPool2d(k), Flatten(),
                  Linear(3 * (h // k) * (w // k), 4)]
        model = Model(layers, input_shape=(2, h, w))
        e = _C.Engine(model.specs(), model.input_shape, 3)
        rng = np.random.default_rng(h * w)
        e.params[:] = rng.integers(-4, 5, e.params.size) / 8   # eighths: an exact forward pass
        x = (rng.integers(-4, 5, (3, 2 * h * w)) / 2).astype(np.float32)   # ties, and values <= 0
        x[0, ::7] = np.nan                                                 # NaNs win, as in torch
        e.loss_and_grad(x, rng.integers(0, 4, 3).astype(np.int32))
        out.append((e.forward(x), e.grads.copy()))
sys.stdout.buffer.write(pickle.dumps(out))
"""


def test_pool_builds_agree():
    # pool2.c has one build per instruction set (16, 8 and 4 lanes); PYDIST_SIMD caps which one runs,
    # with every other kernel (the convolution, the BLAS). The forward pass is exact (halves times
    # eighths), so every build must give its bits, ties and NaNs included; a gradient routed to another
    # input of a window would differ by a whole gradient, where the levels' sums differ in the last bits.
    script = POOL_BUILDS_SCRIPT % (POOL_SHAPES,)
    results = {}
    for simd in simd_levels():
        env = dict(subprocess_env(), PYDIST_SIMD=simd)
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=120)
        assert proc.returncode == 0, proc.stderr.decode()
        results[simd] = pickle.loads(proc.stdout)
    widest = results[simd_levels()[-1]]
    assert len(widest) == 2 * len(POOL_SHAPES)
    for simd, got in results.items():
        for (fwd, grads), (fwd_w, grads_w) in zip(got, widest):
            assert fwd.tobytes() == fwd_w.tobytes(), simd
            np.testing.assert_allclose(grads, grads_w, rtol=1e-5, atol=1e-6, err_msg=simd)


def test_loss_is_cross_entropy_of_forward():
    model = GRAD_MODELS["linear+relu"]
    e = engine_for(model, 4)
    x, y = batch(model, 4)
    logits = e.forward(x).astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss, correct = e.loss_and_grad(x, y)
    assert abs(loss - (-logp[np.arange(4), y].mean())) < 1e-6
    assert correct == int((logits.argmax(axis=1) == y).sum())


@pytest.mark.parametrize("momentum,dampening,weight_decay,nesterov",
                         [(0.0, 0.0, 0.0, False), (0.9, 0.0, 0.0, False), (0.9, 0.1, 1e-3, False),
                          (0.9, 0.0, 5e-4, True)])
def test_sgd_follows_torch_formula(momentum, dampening, weight_decay, nesterov):
    model = GRAD_MODELS["conv"]
    e = engine_for(model, 3)
    p = e.params.astype(np.float64)
    buf = None
    for step in range(3):
        x, y = batch(model, 3, seed=step)
        e.loss_and_grad(x, y)
        g = e.grads.astype(np.float64)
        e.sgd_step(0.1, momentum, dampening, weight_decay, nesterov)
        d = g + weight_decay * p
        if momentum:
            buf = d.copy() if buf is None else momentum * buf + (1 - dampening) * d
            d = d + momentum * buf if nesterov else buf
        p = p - 0.1 * d
        np.testing.assert_allclose(e.params, p, rtol=1e-5, atol=1e-6)
        p = e.params.astype(np.float64)  # follow the float32 trajectory, not a float64 one
    assert e.momentum_started == (momentum != 0)


def test_lenet5_and_mlp_shapes():
    assert lenet5().num_params == 61706            # torch's LeNet-5 of the tutorial
    assert mlp((256, 128)).num_params == 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10


def test_init_is_torch_default_range_and_seeded():
    model = lenet5()
    a, b, c = engine_for(model, 1), engine_for(model, 1), _C.Engine(model.specs(), model.input_shape, 1)
    c.init_params(2)
    assert np.array_equal(a.params, b.params) and not np.array_equal(a.params, c.params)
    for (w_off, w_n, b_off, b_n) in a.layout:
        if w_n:
            bound = 1 / np.sqrt(w_n // b_n)   # 1/sqrt(fan_in), torch's kaiming_uniform(a=sqrt(5))
            block = a.params[w_off:b_off + b_n]
            assert np.abs(block).max() <= bound and np.abs(block).max() > 0.9 * bound


# ---------------------------------------------------------------------------------------------------
# Errors

@pytest.mark.parametrize("layers,shape,match", [
    ([Linear(10, 3)], (1, 28, 28), "layer 0 .*flat input"),
    ([Flatten(), Linear(700, 10)], (1, 28, 28), "layer 1 .*784"),
    ([Conv2d(3, 4, 5), Flatten(), Linear(4, 2)], (1, 28, 28), "layer 0 .*conv2d"),
    ([Conv2d(1, 4, 9), Flatten(), Linear(4, 2)], (1, 5, 5), "layer 0 .*does not fit"),
    ([Conv2d(1, 2, 3)], (1, 28, 28), "last layer"),
])
def test_bad_architectures_raise_value_error(layers, shape, match):
    with pytest.raises(ValueError, match=match):
        Model(layers, input_shape=shape)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="kernel_size"):
        Conv2d(1, 2, 0)
    with pytest.raises(TypeError, match="layers"):
        Model(["relu"])
    model = GRAD_MODELS["linear"]
    e = engine_for(model, 4)
    x, y = batch(model, 4)
    with pytest.raises(ValueError, match="1 to 4 examples"):
        e.loss_and_grad(np.zeros((5, 3, 2, 2), np.float32), np.zeros(5, np.int32))
    with pytest.raises(ValueError, match="float32"):
        e.forward(x.astype(np.float64))
    with pytest.raises(ValueError, match="outside the model's 3 classes"):
        e.loss_and_grad(x, np.array([0, 1, 2, 3], np.int32))
    with pytest.raises(TypeError, match="ndarray"):
        e.forward([1.0, 2.0])
    perm = np.arange(4, dtype=np.int32)
    with pytest.raises(ValueError, match="entries of `perm`"):
        e.train_steps(x, y, perm, 0, 2, 4, -1, 0.1, 0.0, 0.0, 0.0, False)
    with pytest.raises(ValueError, match="not an example index"):
        e.train_steps(x, y, np.array([0, 1, 2, 9], np.int32), 0, 1, 4, -1, 0.1, 0.0, 0.0, 0.0, False)
    with pytest.raises(ValueError, match="batch_size"):
        Trainer(model, batch_size=0)
    with pytest.raises(ValueError, match="nesterov"):
        Trainer(model, momentum=0.0, nesterov=True)


# ---------------------------------------------------------------------------------------------------
# Data

def write_idx(path, magic, dims, payload, compress):
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in dims)
    opener = gzip.open if compress else open
    with opener(path, "wb") as f:
        f.write(header + payload)


@pytest.mark.parametrize("compress", [True, False])
def test_idx_loader_reads_gzip_and_raw(tmp_path, compress):
    pixels = np.arange(3 * 2 * 2, dtype=np.uint8).reshape(3, 2, 2) * 20
    labels = np.array([2, 0, 1], dtype=np.uint8)
    write_idx(tmp_path / "img", 0x803, (3, 2, 2), pixels.tobytes(), compress)
    write_idx(tmp_path / "lab", 0x801, (3,), labels.tobytes(), compress)
    x, y = load_idx(tmp_path / "img", tmp_path / "lab")
    assert x.shape == (3, 2, 2) and x.dtype == np.float32 and y.dtype == np.int32
    np.testing.assert_allclose(x, (pixels / 255.0 - 0.2860) / 0.3530, rtol=1e-6, atol=1e-6)
    assert y.tolist() == [2, 0, 1]


def test_idx_loader_errors_name_the_file(tmp_path):
    with pytest.raises(ValueError, match=r"cannot open .*missing.*dataset-fashion-mnist"):
        load_idx(tmp_path / "missing", tmp_path / "missing2")
    write_idx(tmp_path / "img", 0x803, (3, 2, 2), b"\x00" * 5, True)     # truncated
    write_idx(tmp_path / "lab", 0x801, (3,), b"\x00\x01\x02", True)
    with pytest.raises(ValueError, match=str(tmp_path / "img")):
        load_idx(tmp_path / "img", tmp_path / "lab")
    write_idx(tmp_path / "huge", 0x803, (1 << 28, 1 << 28, 1 << 28), b"", False)   # sizes that overflow
    with pytest.raises(ValueError, match="huge.*corrupt"):
        load_idx(tmp_path / "huge", tmp_path / "lab")
    write_idx(tmp_path / "img2", 0x801, (3,), b"\x00" * 3, False)          # labels where images belong
    with pytest.raises(ValueError, match=str(tmp_path / "img2")):
        load_idx(tmp_path / "img2", tmp_path / "lab")
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        load_fashion_mnist(tmp_path / "nowhere")


def test_fashion_mnist_is_installed_and_sane():
    (x, y), (tx, ty) = load_fashion_mnist()
    assert x.shape == (60000, 28, 28) and tx.shape == (10000, 28, 28)
    assert np.bincount(y).tolist() == [6000] * 10 and np.bincount(ty).tolist() == [1000] * 10
    assert abs(float(x.mean())) < 0.01 and abs(float(x.std()) - 1) < 0.01   # normalised with its own stats


def test_epoch_permutation_is_a_shared_reshuffle():
    a, b = _C.epoch_permutation(1000, 5, 0), _C.epoch_permutation(1000, 5, 0)
    c, d = _C.epoch_permutation(1000, 5, 1), _C.epoch_permutation(1000, 6, 0)
    assert np.array_equal(a, b) and sorted(a.tolist()) == list(range(1000))
    assert not np.array_equal(a, c) and not np.array_equal(a, d)


# ---------------------------------------------------------------------------------------------------
# Checkpoints

def small_data(n=640, seed=3):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, n).astype(np.int32)


def test_checkpoint_resume_is_bit_identical(tmp_path):
    x, y = small_data()
    kwargs = dict(lr=0.05, momentum=0.9, weight_decay=1e-4, batch_size=32, seed=11)
    straight = Trainer(lenet5(), **kwargs)
    straight.fit(x, y, epochs=3, progress=False)

    first = Trainer(lenet5(), **kwargs)
    first.fit(x, y, epochs=1, progress=False)
    first.train_steps(x, y, 1, 0, 7)          # and part of the next epoch
    first.step += 7
    first.save(tmp_path / "run.ckpt")
    # One file, no temporary left behind and no marker beside it: the file vouches for itself.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.ckpt"]

    resumed = Trainer(lenet5(), **dict(kwargs, seed=0)).load(tmp_path / "run.ckpt")
    assert (resumed.epoch, resumed.step, resumed.seed) == (1, 27, 11)
    resumed.fit(x, y, epochs=3, progress=False)
    assert np.array_equal(resumed.params, straight.params)
    assert np.array_equal(resumed.engine.momentum, straight.engine.momentum)


def test_progress_lines_without_tqdm_start_at_a_resumed_step_and_show_real_losses(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)    # `from tqdm import tqdm` raises ImportError
    x, y = small_data()                                # 640 examples / 32 = 20 steps per epoch
    fit_resumed_at_step_7(Trainer(mlp((32,)), batch_size=32, seed=1), x, y)
    err = capsys.readouterr().err
    assert "nan" not in err, err
    # A line at each 10% passed after the resumed step 7, each with the loss of the steps just run.
    done = [int(re.fullmatch(r"epoch 2/2: (\d+)/20 steps, loss \d+\.\d{4}", line).group(1))
            for line in err.splitlines()]
    assert done == [10, 13, 16, 19, 20], err


HEADER = 192   # csrc/engine/checkpoint.h: CheckpointHeader; then params, momentum, a CRC32


def test_checkpoint_refuses_another_model_and_damaged_files(tmp_path):
    x, y = small_data(64)
    t = Trainer(lenet5(), batch_size=8)
    t.fit(x, y, epochs=1, progress=False)      # momentum is not zero: a byte there counts too
    t.save(tmp_path / "a.ckpt")
    with pytest.raises(ValueError, match="model"):
        Trainer(mlp((32,)), batch_size=8).load(tmp_path / "a.ckpt")
    data = (tmp_path / "a.ckpt").read_bytes()
    n = t.engine.num_params
    assert len(data) == HEADER + 8 * n + 4

    def flipped(at):
        return data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1:]

    damaged = {
        "truncated": (data[: len(data) // 2], "truncated"),
        "no_crc": (data[:-4], "truncated"),
        "longer": (data + b"\0", "longer"),
        "param_byte": (flipped(HEADER + 4 * 1000 + 2), "damaged"),
        "momentum_byte": (flipped(HEADER + 4 * n + 4 * 7), "damaged"),
        "step_field": (flipped(16), "damaged"),      # the header is covered as well
        "crc_byte": (flipped(len(data) - 1), "damaged"),
        "version_1": (data[:4] + (1).to_bytes(4, "little") + data[8:], "format version 1;.*reads versions 2 to 5"),
        "not_ours": (b"\x89PNG" + data[4:], "not a pydist checkpoint"),
    }
    for name, (content, match) in damaged.items():
        (tmp_path / f"{name}.ckpt").write_bytes(content)
        other = Trainer(lenet5(), batch_size=8, seed=4)
        before = other.params.copy(), other.engine.momentum.copy(), other.step, other.epoch
        with pytest.raises(ValueError, match=f"{name}.ckpt.*{match}"):
            other.load(tmp_path / f"{name}.ckpt")
        # a damaged file changes nothing
        assert np.array_equal(other.params, before[0]) and np.array_equal(other.engine.momentum, before[1]), name
        assert (other.step, other.epoch) == before[2:], name
    with pytest.raises(ValueError, match="nothing.ckpt"):
        Trainer(lenet5(), batch_size=8).load(tmp_path / "nothing.ckpt")

    good = Trainer(lenet5(), batch_size=8, seed=4).load(tmp_path / "a.ckpt")   # and the intact file loads
    assert np.array_equal(good.params, t.params) and np.array_equal(good.engine.momentum, t.engine.momentum)

    # a version 2 file (before the compression state: a 56-byte header) still loads
    body = data[HEADER:-4]
    v2 = data[:4] + (2).to_bytes(4, "little") + data[8:56] + body
    (tmp_path / "v2.ckpt").write_bytes(v2 + zlib.crc32(v2).to_bytes(4, "little"))
    old = Trainer(lenet5(), batch_size=8, seed=4).load(tmp_path / "v2.ckpt")
    assert np.array_equal(old.params, t.params) and (old.step, old.epoch) == (t.step, t.epoch)
    # and a version 3 file (a 104-byte header: no position in the epoch, derived from the step count)
    v3 = data[:4] + (3).to_bytes(4, "little") + data[8:104] + body
    (tmp_path / "v3.ckpt").write_bytes(v3 + zlib.crc32(v3).to_bytes(4, "little"))
    old = Trainer(lenet5(), batch_size=8, seed=4).load(tmp_path / "v3.ckpt")
    assert np.array_equal(old.params, t.params) and (old.step, old.epoch) == (t.step, t.epoch)
    assert old.resumed_from is None and old.position(64) == 0
    # and a version 4 file (a 128-byte header: no model or strategy name, so neither is checked)
    v4 = data[:4] + (4).to_bytes(4, "little") + data[8:128] + body
    (tmp_path / "v4.ckpt").write_bytes(v4 + zlib.crc32(v4).to_bytes(4, "little"))
    old = Trainer(lenet5(), batch_size=8, seed=4).load(tmp_path / "v4.ckpt")
    assert np.array_equal(old.params, t.params) and old.resumed_from is not None


def test_checkpoint_records_model_and_strategy_and_refuses_another(tmp_path):
    """A checkpoint names the model and the strategy that saved it; a load into another model or
    another strategy is refused naming both, and the trainer is left as it was."""
    t = Trainer(mlp((8,)), batch_size=8, strategy="ring")
    t.save(tmp_path / "a.ckpt")
    data = (tmp_path / "a.ckpt").read_bytes()
    assert data[128:176].rstrip(b"\0") == b"mlp-8" and data[176:192].rstrip(b"\0") == b"ring"
    other = Trainer(mlp((8,)), batch_size=8, seed=5)   # allreduce
    before = other.params.copy()
    with pytest.raises(ValueError, match=r"a\.ckpt was saved by strategy ring \(model mlp-8\); this trainer's "
                                         r"strategy is allreduce \(model mlp-8\)"):
        other.load(tmp_path / "a.ckpt")
    assert np.array_equal(other.params, before)
    with pytest.raises(ValueError, match=r"different model \(model mlp-8, \d+ parameters.*this is model mlp-9, "):
        Trainer(mlp((9,)), batch_size=8, strategy="ring").load(tmp_path / "a.ckpt")
    assert Trainer(mlp((8,)), batch_size=8, strategy="ring").load(tmp_path / "a.ckpt").step == 0
    # strict=False takes another strategy's weights (to evaluate them, or train on another way); never
    # another model's
    taken = Trainer(mlp((8,)), batch_size=8, seed=5).load(tmp_path / "a.ckpt", strict=False)
    assert np.array_equal(taken.params, t.params)
    with pytest.raises(ValueError, match="different model"):
        Trainer(mlp((9,)), batch_size=8).load(tmp_path / "a.ckpt", strict=False)


def test_checkpoint_save_never_follows_a_planted_symlink(tmp_path):
    """The temporary was `<path>.tmp.<pid>`, opened with O_CREAT | O_TRUNC: a symlink planted at that
    name had save() overwrite the file it pointed to (issue 41). Now its name is random and it is created
    with O_EXCL | O_NOFOLLOW: a link at any name is passed over."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    path = tmp_path / "run.ckpt"
    os.symlink(victim, f"{path}.tmp.{os.getpid()}")
    t = Trainer(mlp((8,)), batch_size=8, seed=2)
    t.save(path)
    assert victim.read_bytes() == b"precious"
    assert not path.is_symlink() and np.array_equal(Trainer(mlp((8,)), batch_size=8).load(path).params, t.params)
    # a link planted at the checkpoint's own name is replaced by the rename, not written through
    path.unlink()
    os.symlink(victim, path)
    t.save(path)
    assert victim.read_bytes() == b"precious" and not path.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.ckpt", f"run.ckpt.tmp.{os.getpid()}", "victim.txt"]


def test_checkpoint_is_a_new_files_mode_under_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        Trainer(mlp((8,)), batch_size=8).save(tmp_path / "run.ckpt")
    finally:
        os.umask(old)
    assert (tmp_path / "run.ckpt").stat().st_mode & 0o777 == 0o640


def test_a_failed_checkpoint_write_keeps_the_previous_one(tmp_path):
    """A write that fails part way (here past RLIMIT_FSIZE, as a full disk would) is an OSError with the
    cause's errno; the checkpoint saved before is untouched and no temporary is left."""
    import resource
    path = tmp_path / "run.ckpt"
    t = Trainer(mlp((32,)), batch_size=8, seed=2)
    t.save(path)
    before = path.read_bytes()
    t.params[:] += 1.0
    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) // 2, limits[1]))
        with pytest.raises(OSError) as info:
            t.save(path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert info.value.errno == errno.EFBIG and "cannot write checkpoint" in str(info.value), info.value
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.ckpt"]
    t.save(path)   # and the next save, with room, goes through
    assert path.read_bytes() != before


def with_crc(data):
    return data[:-4] + zlib.crc32(data[:-4]).to_bytes(4, "little")


def test_crafted_checkpoint_headers_are_refused_before_any_allocation(tmp_path):
    """Headers with a valid CRC32 (crafted, not damaged) and fields save() never writes: a ValueError
    each, with nothing allocated on the word of a count, and the trainer as it was."""
    t = Trainer(mlp((8,)), batch_size=8, compression="topk:0.5")
    t.save(tmp_path / "a.ckpt")
    data = (tmp_path / "a.ckpt").read_bytes()

    def fields(*changes):   # (offset, value, bytes) of CheckpointHeader (csrc/engine/checkpoint.h)
        out = bytearray(data)
        for at, value, size in changes:
            out[at:at + size] = value.to_bytes(size, "little")
        return with_crc(bytes(out))

    RANKS, BYTES, NAME, MOMENTUM, STEP, SAMPLE, WORLD, MODEL, STRATEGY = 56, 64, 72, 48, 16, 104, 112, 128, 176
    crafted = {
        "state_huge": (fields((RANKS, 2**24, 8)), "truncated"),
        "state_wraps": (fields((RANKS, 2, 8), (BYTES, 2**63, 8)), "compression state's size"),   # 2 x 2^63: 0
        "state_terabyte": (fields((BYTES, 2**40, 8)), "truncated"),
        "state_without_ranks": (fields((RANKS, 0, 8)), "compression state's size"),
        "name_unprintable": (fields((NAME, 0xFF, 1)), "compressor, model or strategy name"),
        "model_unterminated": (fields((MODEL, int.from_bytes(b"m" * 48, "little"), 48)), "name"),
        "strategy_unprintable": (fields((STRATEGY + 3, 0x07, 1)), "name"),
        "strategy_other": (fields((STRATEGY, int.from_bytes(b"average", "little"), 16)), "strategy average"),
        "name_unterminated": (fields((NAME, int.from_bytes(b"x" * 32, "little"), 32)), "name"),
        "momentum_flag": (fields((MOMENTUM, 2, 8)), "momentum flag"),
        "step_negative": (fields((STEP, 2**63, 8)), "step"),
        "sample_negative": (fields((SAMPLE, 2**63 + 5, 8)), "position"),
        "world_zero": (fields((WORLD, 0, 8)), "position"),
    }
    for name, (content, match) in crafted.items():
        (tmp_path / f"{name}.ckpt").write_bytes(content)
        other = Trainer(mlp((8,)), batch_size=8, seed=4, compression="topk:0.5")
        before = other.params.copy(), other.engine.compression_state()
        with pytest.raises(ValueError, match=f"{name}.ckpt.*{match}"):
            other.load(tmp_path / f"{name}.ckpt")
        assert np.array_equal(other.params, before[0]) and other.engine.compression_state() == before[1], name
    assert Trainer(mlp((8,)), batch_size=8, compression="topk:0.5").load(tmp_path / "a.ckpt").step == 0


def test_a_checkpoint_path_that_is_no_file_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "fifo.ckpt")   # opened plainly, a FIFO with no writer blocks the open for ever
    for name in ("fifo.ckpt", "."):
        with pytest.raises(ValueError, match="not a regular file"):
            Trainer(mlp((8,)), batch_size=8).load(tmp_path / name)


def test_killed_run_keeps_its_last_checkpoint(tmp_path):
    """SIGKILL while training (and perhaps while saving): the checkpoint on disk still loads, and a
    resumed run finishes."""
    ckpt = tmp_path / "run.ckpt"
    cmd = [sys.executable, "-m", "pydist.train", "--model", "mlp", "--hidden", "64", "--epochs", "40",
           "--batch-size", "600", "--checkpoint", str(ckpt), "--metrics", "", "--plot", "", "--no-progress"]
    env = subprocess_env()   # the same pydist as this process (the AddressSanitizer build under ASan)
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not ckpt.exists() and time.monotonic() < deadline:   # the rename makes it appear whole
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert ckpt.exists(), proc.stdout.read().decode()
    t = Trainer(mlp((64,)), batch_size=600).load(ckpt)
    assert 1 <= t.epoch < 40
    cmd[cmd.index("--epochs") + 1] = str(t.epoch + 1)
    resumed = subprocess.run(cmd + ["--resume"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from" in resumed.stdout
    assert Trainer(mlp((64,)), batch_size=600).load(ckpt).epoch == t.epoch + 1


def test_a_refused_model_before_init_raises():
    """A model the engine refuses, built before init_process_group, is a ValueError: the half-made
    engine's dealloc once freed a communicator that was not MPI_COMM_NULL, and MPICH aborted the
    process for an MPI call before MPI_Init."""
    code = ("from pydist.engine import Model, Flatten, Linear\n"
            "try:\n    Model([Flatten(), Linear(100, 10)])\n"
            "except ValueError as e:\n    print('ValueError:', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ValueError: Engine(): layer 1 (linear 100 -> 10)" in proc.stdout, proc.stdout + proc.stderr
