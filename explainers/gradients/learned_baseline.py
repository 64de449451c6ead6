"""Learned baseline values: an absence state that leaves little low-order signal behind.

Ren, Zhou, Chen & Zhang (ICLR 2023), "Can We Faithfully Represent Absence States to Compute
Shapley Values on a DNN?". The baseline b (one value per feature, shared by all samples) is
learned by gradient descent on L(b) = mean_x sum_i sum_m |E_S[v(S + i) - v(S)]|, the low-order
(m < low_order * n) marginal effects of each feature i over contexts S that keep every other
feature with probability m / n; then b is clamped into mean +- deviation * std of the data.
v is the log-odds of the explained class (classifiers) or the output itself (regressors).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from explainers.games.deadlines import check_deadline
from models.base import module_device

EPS = 1e-16  # the paper's clip, for modules whose logits we cannot take (float64)


@dataclass(frozen=True)
class LearnedBaseline:
    baseline: np.ndarray  # [d]
    objective: tuple[float, ...]  # L(b) on fixed contexts: before and after training
    lower: np.ndarray  # clamp box [d]
    upper: np.ndarray


def _value(
    module: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, logodds: bool
) -> torch.Tensor:
    """v per row [m], float64: the target output, or its log-odds log p / (1 - p).

    The log-odds come from the logits, logit_y - logsumexp_{j != y} logit_j, in float64 (as
    the reference code): probabilities rounded to float32 saturate at 1 - 6e-8, and a clip
    there flattens every confident masked row to the same value.
    """
    if not logodds:
        return module(x).gather(1, target[:, None])[:, 0].double()
    if isinstance(module, torch.nn.Sequential) and isinstance(module[-1], torch.nn.Softmax):
        logits = module[:-1](x).reshape(x.shape[0], -1).double()
        picked = logits.gather(1, target[:, None])[:, 0]
        others = logits.scatter(1, target[:, None], float("-inf"))
        return picked - torch.logsumexp(others, dim=1)
    p = module(x).double().gather(1, target[:, None])[:, 0].clamp(EPS, 1 - EPS)
    return torch.log(p) - torch.log1p(-p)


def low_order_objective(
    module: torch.nn.Module,
    x: torch.Tensor,
    target: torch.Tensor,
    baseline: torch.Tensor,
    *,
    logodds: bool,
    sample_num: int,
    low_order: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """L(b) for explicands x [N, d] with targets [N]; differentiable in `baseline` [d].

    Computed on the module's device (the tensors move there; the value stays there); the
    contexts come from `generator` on the CPU, so every device draws the same ones.
    """
    dev = module_device(module)
    x, target, baseline = x.to(dev), target.to(dev), baseline.to(dev)
    n_rows, d = x.shape
    orders = range(max(1, int(low_order * d)))
    total = torch.zeros((), dtype=torch.float64, device=dev)
    for i in range(d):
        for m in orders:
            keep = (torch.rand(n_rows, sample_num, d, generator=generator) < m / d).to(dev)
            keep[:, :, i] = False
            with_i = keep.clone()
            with_i[:, :, i] = True
            rows = torch.cat([keep, with_i]).reshape(-1, d)  # [2 N s, d] masks
            xs = x.repeat(2, 1).repeat_interleave(sample_num, 0)
            masked = torch.where(rows, xs, baseline)
            v = _value(module, masked, target.repeat(2).repeat_interleave(sample_num), logodds)
            v = v.reshape(2, n_rows, sample_num)
            total = total + (v[1] - v[0]).mean(dim=1).abs().mean()
    return total


def learn_baseline(
    module: torch.nn.Module,
    x: np.ndarray,
    target: np.ndarray,
    data: np.ndarray,
    *,
    logodds: bool = True,
    init: str = "mean",
    lr: float = 0.01,
    iterations: int = 300,
    sample_num: int = 100,
    low_order: float = 0.5,
    deviation: float = 0.3,
    seed: int = 0,
) -> LearnedBaseline:
    """Learn b on explicands x [N, d] (targets [N]); `data` [R, d] sets init and clamp box.

    Steps are taken in standardised units, b = mean + std * z, so one learning rate suits
    features of any scale (the paper's tabular data were standardised) [ours].
    """
    mean = torch.as_tensor(data.mean(axis=0), dtype=torch.float32)
    std = torch.as_tensor(data.std(axis=0), dtype=torch.float32).clamp_min(1e-12)
    start = torch.zeros_like(mean) if init == "mean" else -mean / std
    z = start.clamp(-deviation, deviation).requires_grad_(True)
    xt = torch.as_tensor(x, dtype=torch.float32)
    tt = torch.as_tensor(target, dtype=torch.int64)
    objective = partial(
        low_order_objective,
        module,
        xt,
        tt,
        logodds=logodds,
        sample_num=sample_num,
        low_order=low_order,
    )

    def fixed_objective() -> float:  # the same contexts every time, so values compare
        gen = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            return float(objective(mean + std * z, generator=gen))

    history = [fixed_objective()]
    gen = torch.Generator().manual_seed(seed)
    optimiser = torch.optim.SGD([z], lr=lr)
    frozen = [p for p in module.parameters() if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    try:
        for _ in range(iterations):
            check_deadline()  # a cancelled learn-baseline job stops between steps
            optimiser.zero_grad()
            loss = objective(mean + std * z, generator=gen)
            loss.backward()
            optimiser.step()
            with torch.no_grad():
                z.clamp_(-deviation, deviation)
        history.append(fixed_objective())
    finally:
        for p in frozen:
            p.requires_grad_(True)
    baseline = (mean + std * z).detach().numpy().copy()
    box = (mean - deviation * std).numpy(), (mean + deviation * std).numpy()
    return LearnedBaseline(baseline, tuple(history), box[0], box[1])
