"""The engine equals PyTorch: forward, backward and SGD updates of LeNet-5 and the MLP on the same
weights and batch, to 1e-5. Needs torch (scripts/setup.sh --test installs the CPU build); the suite
sets PYDIST_REQUIRE_PEERS=1, so there a missing torch fails instead of skipping."""
import os

import numpy as np
import pytest

from pydist import _C
from pydist.engine import Conv2d, Flatten, Linear, MaxPool2d, Model, ReLU, lenet5, load_fashion_mnist, mlp

if os.environ.get("PYDIST_REQUIRE_PEERS") == "1":
    import torch
else:
    torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402


def torch_model(model):
    layers = []
    for l in model.layers:
        if isinstance(l, Linear):
            layers.append(torch.nn.Linear(l.in_features, l.out_features))
        elif isinstance(l, Conv2d):
            layers.append(torch.nn.Conv2d(l.in_channels, l.out_channels, l.kernel_size, l.stride, l.padding))
        elif isinstance(l, MaxPool2d):
            layers.append(torch.nn.MaxPool2d(l.kernel_size))
        elif isinstance(l, ReLU):
            layers.append(torch.nn.ReLU())
        elif isinstance(l, Flatten):
            layers.append(torch.nn.Flatten())
    return torch.nn.Sequential(*layers)


def flat_grads(net):
    return torch.cat([p.grad.reshape(-1) for p in net.parameters()]).numpy()


def close(ours, theirs, what):
    # 1e-5 relative to the size of the values compared (float32 sums in another order differ in the
    # last bits), never looser than 1e-5 absolute for values of order one.
    scale = max(1.0, float(np.abs(theirs).max()))
    diff = float(np.abs(np.asarray(ours, np.float64) - np.asarray(theirs, np.float64)).max())
    assert diff <= 1e-5 * scale, f"{what}: max difference {diff:.3g} (scale {scale:.3g})"


@pytest.fixture(scope="module")
def real_batch():
    (x, y), _ = load_fashion_mnist()
    return x[:64].reshape(64, 1, 28, 28).copy(), y[:64].copy()


@pytest.mark.parametrize("make", [lenet5, lambda: mlp((256, 128))], ids=["lenet5", "mlp"])
def test_forward_backward_and_updates_equal_torch(make, real_batch):
    torch.set_num_threads(1)
    model = make()
    x, y = real_batch
    e = _C.Engine(model.specs(), model.input_shape, len(y))
    e.init_params(3)
    net = torch_model(model)
    torch.nn.utils.vector_to_parameters(torch.from_numpy(e.params.copy()), net.parameters())
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)

    tx, ty = torch.from_numpy(x), torch.from_numpy(y).long()
    close(e.forward(x), net(tx).detach().numpy(), "logits")
    for step in range(3):   # the first update starts the momentum buffer; later ones use it
        loss, _ = e.loss_and_grad(x, y)
        opt.zero_grad()
        tloss = F.cross_entropy(net(tx), ty)
        tloss.backward()
        close([loss], [tloss.item()], f"loss at step {step}")
        close(e.grads, flat_grads(net), f"gradients at step {step}")
        e.sgd_step(0.05, 0.9, 0.0, 5e-4, False)
        opt.step()
        theirs = torch.nn.utils.parameters_to_vector(net.parameters()).detach().numpy()
        close(e.params, theirs, f"weights after update {step + 1}")
        # Continue from identical weights, so each step compares one step, not an accumulated drift.
        torch.nn.utils.vector_to_parameters(torch.from_numpy(e.params.copy()), net.parameters())


def test_layout_is_torch_parameters_order():
    model = lenet5()
    e = _C.Engine(model.specs(), model.input_shape, 1)
    shapes = [tuple(p.shape) for p in torch_model(model).parameters()]
    sizes = []
    for w_off, w_n, b_off, b_n in e.layout:
        if w_n:
            sizes += [w_n, b_n]
    assert sizes == [int(np.prod(s)) for s in shapes]


# Convolutions of many shapes against torch in float64: the direct kernels (csrc/engine/conv_direct.c:
# stride 1, pad <= k - 1, k <= 7) at tile edges (output widths about 16 and 32, channel counts about
# the blocks of 4, 8, 12 and 16), and im2col + GEMM for the rest (stride 2, pad >= k).
CONV_SHAPES = [  # (in_c, out_c, k, pad, stride, h, w, batch)
    (1, 6, 5, 2, 1, 28, 28, 3), (6, 16, 5, 0, 1, 14, 14, 2), (3, 4, 3, 1, 1, 17, 15, 2),
    (2, 12, 3, 0, 1, 18, 34, 1), (5, 9, 7, 3, 1, 9, 40, 2), (4, 17, 1, 0, 1, 5, 16, 3),
    (2, 33, 2, 1, 1, 8, 33, 1), (7, 3, 4, 2, 1, 6, 50, 2), (3, 20, 6, 5, 1, 7, 7, 2),
    (2, 5, 3, 1, 2, 11, 12, 2), (3, 4, 2, 2, 1, 5, 5, 2),
]


@pytest.mark.parametrize("shape", CONV_SHAPES, ids=lambda s: "c{}-o{}-k{}-p{}-s{}-{}x{}-b{}".format(*s))
def test_convolution_shapes_equal_torch_float64(shape):
    in_c, out_c, k, pad, stride, h, w, batch = shape
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    model = Model([Conv2d(in_c, out_c, k, stride=stride, padding=pad), Flatten(), Linear(out_c * oh * ow, 3)],
                  input_shape=(in_c, h, w))
    e = _C.Engine(model.specs(), model.input_shape, batch)
    e.init_params(5)
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal((batch, in_c * h * w)).astype(np.float32)
    y = rng.integers(0, 3, batch).astype(np.int32)
    net = torch_model(model).double()
    torch.nn.utils.vector_to_parameters(torch.from_numpy(e.params.astype(np.float64)), net.parameters())
    tx = torch.from_numpy(x.astype(np.float64)).reshape(batch, in_c, h, w)
    close(e.forward(x), net(tx).detach().numpy(), "logits")
    loss, _ = e.loss_and_grad(x, y)
    tloss = F.cross_entropy(net(tx), torch.from_numpy(y).long())
    tloss.backward()
    close([loss], [tloss.item()], "loss")
    close(e.grads, flat_grads(net), "gradients")
