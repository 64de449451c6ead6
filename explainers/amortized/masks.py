"""Coalitions Salvage trains on: the Shapley-kernel sampler (sizes by the kernel estimator's
size distribution), the informed sampler (standardised current importances), uniform sizes
for the surrogate, always in complementary pairs."""

from __future__ import annotations

import torch

from explainers.estimators.kernel import size_distribution
from explainers.explanation import OptionError


def kernel_masks(n: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """Shapley-kernel coalitions: size k in 1..n-1 with p(k) ~ 1/(k(n-k)), then uniform. [m, n]"""
    if n < 2 or count == 0:
        return torch.rand(count, n, generator=gen) < 0.5
    weights = torch.from_numpy(size_distribution(n))  # the kernel estimator's size law
    sizes = torch.multinomial(weights, count, replacement=True, generator=gen) + 1
    ranks = torch.rand(count, n, generator=gen).argsort(dim=1).argsort(dim=1)
    return ranks < sizes[:, None]


def sample_masks(
    kind: str,
    n: int,
    batch: int,
    pairs: int,
    gen: torch.Generator,
    scores: torch.Tensor | None = None,
    beta: float = 1.0,
    informed_fraction: float = 0.5,
) -> torch.Tensor:
    """Coalitions [batch, 2 * pairs, n]; rows 2j and 2j+1 are complements.

    `scores` [batch, n]: current importances for the informed sampler.
    """
    if kind == "uniform":
        half = torch.rand(batch, pairs, n, generator=gen) < 0.5
    elif kind == "kernel" or scores is None:
        half = kernel_masks(n, batch * pairs, gen).reshape(batch, pairs, n)
    elif kind == "informed":
        n_inf = round(informed_fraction * pairs)
        # Standardised: centred, so about half the players are likelier present than absent
        # whatever the sign and offset of the current values.
        mean, std = scores.mean(dim=1, keepdim=True), scores.std(dim=1, keepdim=True)
        z = (scores - mean) / (std + 1e-8)
        prob = torch.sigmoid(beta * z)[:, None, :].expand(batch, n_inf, n)
        informed = torch.rand(batch, n_inf, n, generator=gen) < prob
        rest = kernel_masks(n, batch * (pairs - n_inf), gen).reshape(batch, pairs - n_inf, n)
        half = torch.cat([informed, rest], dim=1)
    else:
        raise OptionError(f"unknown sampler {kind!r}")
    return torch.stack([half, ~half], dim=2).reshape(batch, 2 * pairs, n)


def uniform_size_masks(n: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """Surrogate training masks: number of present players uniform in 0..n. [m, n]"""
    sizes = torch.randint(0, n + 1, (count,), generator=gen)
    ranks = torch.rand(count, n, generator=gen).argsort(dim=1).argsort(dim=1)
    return ranks < sizes[:, None]
