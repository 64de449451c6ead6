"""A trained Salvage explainer at work: values for every class of a batch in one pass, and the
surrogate game it approximates (for checks against exact Shapley values)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from explainers.amortized.salvage.train import (
    Trained,
    centred,
    contributions,
    efficiency_projection,
    game_values,
    log_probs,
    masked,
)
from models.base import module_device


@dataclass(frozen=True)
class Amortized:
    """Explanations of a batch from one explainer pass (and one surrogate row per image)."""

    values: np.ndarray  # [m, n, C] after the efficiency projection, in the game's units
    base: np.ndarray  # [C] v(empty)
    full: np.ndarray  # [m, C] v(N) = the surrogate on the whole image
    surrogate_probs: np.ndarray  # [m, C]
    explainer_probs: np.ndarray | None  # [m, C] the explainer as a classifier (distribution)


def amortized(trained: Trained, x: np.ndarray) -> Amortized:
    """Values for every class of every image x [m, *input_shape]: one batched pass each, on
    the surrogate's device (the explainer's input moves to its own)."""
    opts = trained.options
    dev = module_device(trained.surrogate)
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(dev)
    empty_logp = torch.from_numpy(trained.empty_logp).to(dev)
    with torch.inference_mode():
        psi = contributions(trained.explainer, xt.to(module_device(trained.explainer)), opts)
        psi = psi.to(dev)
        full_logp = log_probs(trained.surrogate, xt)
        explainer_probs = None
        if opts.objective == "distribution":
            logits = centred(empty_logp)[None] + psi.sum(dim=1)
            explainer_probs = F.softmax(logits, dim=1).cpu().numpy()
        full = game_values(full_logp, opts.objective)
        empty = game_values(empty_logp, opts.objective)
        values = efficiency_projection(psi, full, empty[None])
    return Amortized(
        values.cpu().numpy().astype(np.float64),
        empty.cpu().numpy().astype(np.float64),
        full.cpu().numpy().astype(np.float64),
        full_logp.exp().cpu().numpy(),
        explainer_probs,
    )


def surrogate_game(trained: Trained, x: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """The game the explainer approximates, for one image: masks [m, n] -> values [m, C]."""
    dev = module_device(trained.surrogate)
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))[None].to(dev)
    groups = torch.from_numpy(trained.groups.copy()).to(dev)

    def game(masks: np.ndarray) -> np.ndarray:
        mt = torch.from_numpy(np.asarray(masks, dtype=bool))[None].to(dev)
        with torch.inference_mode():
            logp = log_probs(trained.surrogate, masked(xt, mt, groups))
            values = game_values(logp, trained.options.objective)
            return values.cpu().numpy().astype(np.float64)

    return game
