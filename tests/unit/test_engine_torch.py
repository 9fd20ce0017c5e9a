"""The engine equals PyTorch: forward, backward and SGD updates of LeNet-5 and the MLP on the same
weights and batch, to 1e-5. Needs torch (scripts/setup.sh --test installs the CPU build); the suite
sets PYDIST_REQUIRE_PEERS=1, so there a missing torch fails instead of skipping."""
import os

import numpy as np
import pytest

from pydist import _C
from pydist.engine import Conv2d, Flatten, Linear, MaxPool2d, ReLU, lenet5, load_fashion_mnist, mlp

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
