"""Learned baseline values (Ren et al. 2023): the clamp box holds and the objective falls."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from explainers.learned_baseline import learn_baseline


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
