"""A trained Salvage explainer at work: values for every class of a batch in one pass, and the
surrogate game it approximates (for checks against exact Shapley values)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from explainers.salvage import (
    Trained,
    centred,
    contributions,
    efficiency_projection,
    game_values,
    log_probs,
    masked,
)


@dataclass(frozen=True)
class Amortized:
    """Explanations of a batch from one explainer pass (and one surrogate row per image)."""

    values: np.ndarray  # [m, n, C] after the efficiency projection, in the game's units
    base: np.ndarray  # [C] v(empty)
    full: np.ndarray  # [m, C] v(N) = the surrogate on the whole image
    surrogate_probs: np.ndarray  # [m, C]
    explainer_probs: np.ndarray | None  # [m, C] the explainer as a classifier (distribution)


def amortized(trained: Trained, x: np.ndarray) -> Amortized:
    """Values for every class of every image x [m, *input_shape]: one batched pass each."""
    opts = trained.options
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    empty_logp = torch.from_numpy(trained.empty_logp)
    with torch.inference_mode():
        psi = contributions(trained.explainer, xt, opts)
        full_logp = log_probs(trained.surrogate, xt)
        explainer_probs = None
        if opts.objective == "distribution":
            logits = centred(empty_logp)[None] + psi.sum(dim=1)
            explainer_probs = F.softmax(logits, dim=1).numpy()
        full = game_values(full_logp, opts.objective)
        empty = game_values(empty_logp, opts.objective)
        values = efficiency_projection(psi, full, empty[None])
    return Amortized(
        values.numpy().astype(np.float64),
        empty.numpy().astype(np.float64),
        full.numpy().astype(np.float64),
        full_logp.exp().numpy(),
        explainer_probs,
    )


def surrogate_game(trained: Trained, x: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """The game the explainer approximates, for one image: masks [m, n] -> values [m, C]."""
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))[None]
    groups = torch.from_numpy(trained.groups.copy())

    def game(masks: np.ndarray) -> np.ndarray:
        mt = torch.from_numpy(np.asarray(masks, dtype=bool))[None]
        with torch.inference_mode():
            logp = log_probs(trained.surrogate, masked(xt, mt, groups))
            return game_values(logp, trained.options.objective).numpy().astype(np.float64)

    return game
