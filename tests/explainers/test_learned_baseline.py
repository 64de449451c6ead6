"""Learned baseline values (Ren et al. 2023): the clamp box holds and the objective falls."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from explainers.gradients.learned_baseline import _value, learn_baseline


def toy_classifier(d: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(d, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2), torch.nn.Softmax(dim=1)
    ).eval()


@pytest.mark.parametrize("init", ["mean", "zero"])
def test_box_and_objective(init: str) -> None:
    d = 6
    module = toy_classifier(d, seed=0)
    rng = np.random.default_rng(0)
    data = (rng.normal(size=(200, d)) * np.arange(1, d + 1) + 3).astype(np.float32)
    x = data[:8]
    with torch.no_grad():
        target = module(torch.as_tensor(x)).argmax(dim=1).numpy()
    before = [p.detach().clone() for p in module.parameters()]
    res = learn_baseline(
        module, x, target, data, init=init, lr=0.5, iterations=40, sample_num=20, seed=1
    )
    assert np.all(res.baseline >= res.lower - 1e-5) and np.all(res.baseline <= res.upper + 1e-5)
    np.testing.assert_allclose(res.lower, data.mean(0) - 0.3 * data.std(0), rtol=1e-5)
    assert res.objective[-1] < res.objective[0]
    for p, q in zip(module.parameters(), before, strict=True):  # the model is left untouched
        assert torch.equal(p, q) and p.requires_grad


def test_regression_output_objective_falls() -> None:
    d = 4
    torch.manual_seed(3)
    module = torch.nn.Sequential(torch.nn.Linear(d, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    data = np.random.default_rng(1).normal(size=(100, d)).astype(np.float32)
    res = learn_baseline(
        module,
        data[:5],
        np.zeros(5, dtype=np.int64),
        data,
        logodds=False,
        lr=0.5,
        iterations=30,
        sample_num=20,
    )
    assert res.objective[-1] < res.objective[0]


def test_logodds_from_logits_in_float64() -> None:
    """v = logit_y - logsumexp of the other logits, also where float32 probabilities are 1."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(3, 3)
    module = torch.nn.Sequential(linear, torch.nn.Softmax(dim=1)).eval()
    x = torch.tensor([[0.1, 0.2, 0.3], [300.0, -200.0, 100.0], [-400.0, 250.0, 50.0]])
    target = torch.tensor([0, 1, 2])
    with torch.no_grad():
        logits = linear(x).double()
        got = _value(module, x, target, logodds=True)
    others = [[j for j in range(3) if j != t] for t in target.tolist()]
    want = [
        float(logits[i, t] - torch.logsumexp(logits[i, others[i]], dim=0))
        for i, t in enumerate(target.tolist())
    ]
    assert got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10)
    assert np.abs(want).max() > 17  # beyond what float32 probabilities (1 - 6e-8) can express


def test_confident_rows_do_not_saturate() -> None:
    """Two masked rows the model is sure about keep different values (a clip made them equal)."""
    module = torch.nn.Sequential(torch.nn.Linear(1, 2), torch.nn.Softmax(dim=1)).eval()
    with torch.no_grad():
        module[0].weight.copy_(torch.tensor([[1.0], [-1.0]]))
        module[0].bias.zero_()
    x = torch.tensor([[20.0], [30.0]])  # log-odds 40 and 60: p = 1 in float32
    with torch.no_grad():
        v = _value(module, x, torch.tensor([0, 0]), logodds=True)
    np.testing.assert_allclose(v.numpy(), [40.0, 60.0], rtol=1e-6)


def test_true_labels_change_the_objective() -> None:
    """The target is the caller's: log-odds of the true label or of the predicted class (three
    classes: with two, the log-odds of the other class is minus this one and |effects| agree)."""
    d = 4
    torch.manual_seed(2)
    module = torch.nn.Sequential(torch.nn.Linear(d, 3), torch.nn.Softmax(dim=1)).eval()
    data = np.random.default_rng(2).normal(size=(50, d)).astype(np.float32)
    x = data[:6]
    with torch.no_grad():
        predicted = module(torch.as_tensor(x)).argmax(dim=1).numpy()
    kw = {"iterations": 1, "sample_num": 10, "seed": 0}
    mine = learn_baseline(module, x, predicted, data, **kw)  # type: ignore[arg-type]
    other = learn_baseline(module, x, (predicted + 1) % 3, data, **kw)  # type: ignore[arg-type]
    assert mine.objective[0] != pytest.approx(other.objective[0], rel=1e-3)
