"""UNI: unlearning-based baselines for path attributions.

Choi, Duplessis & Belongie, "Unlearning-based Neural Interpretations" (ICLR 2025). Three stages
per input x and class c: (1) one gradient-ascent step on the cross-entropy of c on a copy of the
weights (the copy "forgets" x); (2) projected gradient descent in an epsilon ball around x for x'
whose output under the ORIGINAL weights matches the unlearned model's output on x (KL);
(3) integrated gradients from x' to x. The paper gives no hyperparameter values: every default
here is ours (METHODS.md section 2).
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from explainers.explanation import ExplainResult, Explanation, OptionError
from explainers.games import BudgetError
from explainers.gradients import (
    Method,
    Output,
    check_finite,
    integrated_gradients,
    pick_target,
    require_gradients,
    score_function,
    scores_at,
)
from models.base import Model

VERSION = "1"
_TINY = 1e-12


class UniOptions(BaseModel):
    """Options of the `uni` explainer; all defaults are ours (the paper gives none)."""

    model_config = ConfigDict(extra="forbid")
    unlearning_steps: int = Field(1, ge=1, le=100, description="gradient-ascent steps on the copy")
    unlearning_rule: Literal["normalized", "sgd"] = Field(
        "normalized",
        description="sgd: theta + eta * grad (the paper's rule); normalized: a step of length "
        "eta * ||theta|| along the gradient (ours: robust to saturated softmax outputs)",
    )
    unlearning_lr: float = Field(
        0.01, gt=0, le=1e6, description="eta: SGD rate, or relative step length (normalized)"
    )
    epsilon: float = Field(
        8 / 255, gt=0, le=1e6, description="radius of the ball around the input (see epsilon_units)"
    )
    epsilon_units: Literal["auto", "input", "std"] = Field(
        "auto",
        description="input: epsilon in input units; std: per feature, times the background's "
        "standard deviation; auto: input for images and for tabular models without background "
        "rows, std otherwise",
    )
    norm: Literal["linf", "l2"] = Field("linf", description="norm of the ball")
    pgd_steps: int = Field(10, ge=0, le=1000, description="projected gradient steps T")
    pgd_step_size: float | None = Field(
        None, gt=0, description="PGD step alpha, in the units of epsilon; default epsilon / 4"
    )
    clip_min: float | None = Field(
        None, description="lowest valid input value; default: the model's input_range"
    )
    clip_max: float | None = Field(
        None, description="highest valid input value; default: the model's input_range"
    )
    ig_steps: int = Field(16, ge=1, le=1024, description="Riemann steps B from x' to x")
    method: Method = Field(
        "riemann_right", description="quadrature of the path; the paper's sum is riemann_right"
    )
    output: Output = Field(
        "probability", description="attribute the class probability or (softmax models) logit"
    )


def _log_probs(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """log softmax: from the logits when the module ends in Softmax, else log of its output."""
    if isinstance(module, torch.nn.Sequential) and isinstance(module[-1], torch.nn.Softmax):
        return torch.log_softmax(module[:-1](x).reshape(x.shape[0], -1), dim=1)
    return torch.log(module(x).reshape(x.shape[0], -1).clamp_min(_TINY))


def unlearned_output(
    module: torch.nn.Module, x: torch.Tensor, target: int, options: UniOptions
) -> torch.Tensor:
    """Stage 1: log-probabilities on x [1, *shape] of a copy after gradient ascent on CE.

    `sgd`: theta += eta * grad. `normalized` (ours): theta += eta * ||theta|| * grad / ||grad||,
    a step of relative length eta; a confident model's cross-entropy gradient is tiny
    (1 - p ~ 1e-9 on digits-cnn), so a fixed SGD rate barely moves it.
    """
    twin = copy.deepcopy(module)  # the caller's weights are never touched
    params = [p for p in twin.parameters() if p.is_floating_point()]
    for p in params:
        p.requires_grad_(True)
    for _ in range(options.unlearning_steps):
        with torch.enable_grad():
            loss = -_log_probs(twin, x)[0, target]  # cross-entropy of the class
            grads = torch.autograd.grad(loss, params, allow_unused=True)
        pairs = [(p, g) for p, g in zip(params, grads, strict=True) if g is not None]
        scale = options.unlearning_lr
        if options.unlearning_rule == "normalized":
            g_norm = torch.cat([g.double().reshape(-1) for _, g in pairs]).norm()
            p_norm = torch.cat([p.detach().double().reshape(-1) for p, _ in pairs]).norm()
            scale *= float(p_norm / g_norm.clamp_min(_TINY))
        with torch.no_grad():
            for p, g in pairs:
                p.add_(g, alpha=scale)  # ascent: forget x
    with torch.no_grad():
        return _log_probs(twin, x).detach()


def _project(delta: torch.Tensor, eps: torch.Tensor, norm: str) -> torch.Tensor:
    """Into the ball: |delta_i| <= eps_i (linf), or ||delta / eps||_2 <= 1 (l2, scaled units)."""
    if norm == "linf":
        return torch.maximum(torch.minimum(delta, eps), -eps)
    scaled = delta / eps
    length = scaled.norm()
    return delta if length <= 1 else delta / length


def match_baseline(
    module: torch.nn.Module,
    x: torch.Tensor,
    target_logp: torch.Tensor,
    eps: torch.Tensor,
    options: UniOptions,
) -> tuple[torch.Tensor, list[float]]:
    """Stage 2: PGD from x for x' in the ball minimising KL(F(x; unlearned) || F(x'; original))."""
    step = eps * (options.pgd_step_size / options.epsilon if options.pgd_step_size else 0.25)
    q = target_logp.exp()
    xp, best = x.clone(), x.clone()
    kls: list[float] = []
    for _ in range(options.pgd_steps + 1):
        xp.requires_grad_(True)
        with torch.enable_grad():
            kl = (q * (target_logp - _log_probs(module, xp))).sum()
            (grad,) = torch.autograd.grad(kl, xp)  # input only: no .grad on the weights
        kls.append(float(kl.detach()))
        if len(kls) > 1 and kls[-1] <= min(kls[1:]):  # the best iterate after the start
            best = xp.detach()
        if len(kls) > options.pgd_steps:
            break
        with torch.no_grad():
            if options.norm == "linf":
                move = step * grad.sign()
            else:
                g = grad * eps  # steepest descent in the scaled units
                move = step * g / g.norm().clamp_min(_TINY)
            xp = x + _project(xp.detach() - move - x, eps, options.norm)
            if options.clip_min is not None or options.clip_max is not None:
                xp = xp.clamp(options.clip_min, options.clip_max)
    return best, kls


def _epsilon(model: Model, options: UniOptions, background: np.ndarray | None) -> np.ndarray:
    """Per-feature radius [*shape]."""
    units = options.epsilon_units
    bg = background if background is not None else model.background
    if units == "auto":  # per-feature scales need background rows; without them, input units
        units = "input" if model.modality == "image" or bg is None else "std"
    if units == "input":
        return np.full(model.input_shape, options.epsilon)
    if bg is None:
        raise OptionError("epsilon_units 'std' needs background rows; send a background")
    std = bg.astype(np.float64).std(axis=0)
    return options.epsilon * np.where(std > 0, std, 1.0)


def explain(
    model: Model,
    inputs: np.ndarray,
    *,
    options: UniOptions,
    target: int | None = None,
    seed: int = 0,
    budget: int | None = None,
    background: np.ndarray | None = None,
) -> ExplainResult:
    """UNI attributions of each input for one class (the predicted one by default)."""
    require_gradients(model)
    if model.task != "classification":
        raise OptionError("UNI unlearns a class (cross-entropy): it needs a classifier")
    if model.input_range is not None:  # the baseline stays a valid input unless told otherwise
        low, high = model.input_range
        options = options.model_copy(
            update={
                "clip_min": low if options.clip_min is None else options.clip_min,
                "clip_max": high if options.clip_max is None else options.clip_max,
            }
        )
    if (
        options.clip_min is not None
        and options.clip_max is not None
        and options.clip_min > options.clip_max
    ):
        raise OptionError("clip_min must not exceed clip_max")
    cost = options.unlearning_steps + 1 + options.pgd_steps + 1 + options.ig_steps + 2
    if budget is not None and cost > budget:
        raise BudgetError(f"UNI with these options costs {cost} model evaluations; budget {budget}")
    eps = _epsilon(model, options, background)
    score = score_function(model, options.output)
    echo: dict[str, Any] = options.model_dump()
    echo["pgd_step_size"] = options.pgd_step_size or options.epsilon / 4
    no_rows = background is None and model.background is None
    echo["epsilon_units"] = (
        options.epsilon_units
        if options.epsilon_units != "auto"
        else ("input" if model.modality == "image" or no_rows else "std")
    )
    eps_t = torch.tensor(eps, dtype=torch.float32)[None]
    explanations = []
    for row in inputs.astype(np.float32):
        x = torch.from_numpy(row[None].copy())  # [1, *shape]
        out = pick_target(model, target, model.predict(row[None])[0])
        unlearned = unlearned_output(model.module, x, out, options)
        xp, kls = match_baseline(model.module, x, unlearned, eps_t, options)
        baseline = xp[0].numpy().astype(np.float64)
        attr = integrated_gradients(
            score, row.astype(np.float64), baseline[None], out, options.ig_steps, options.method
        )
        s = scores_at(score, np.stack([row.astype(np.float64), baseline]), 2)
        full, base = float(s[0, out]), float(s[1, out])
        check_finite(attr, base, full, *kls)
        gap = float(attr.sum()) + base - full
        explanations.append(
            Explanation(
                output_index=out,
                values=attr.reshape(-1),
                base_value=base,
                instance_output_value=full,
                exact=False,
                n_model_evals=cost,
                estimator=f"uni-ig-{options.method}",
                details={
                    "baseline": baseline.reshape(-1).tolist(),
                    "completeness_gap": gap,
                    "unlearned_probability": float(unlearned[0, out].exp()),
                    "kl_start": kls[0],
                    "kl_baseline": min(kls[1:]) if len(kls) > 1 else kls[0],
                    "distance_linf": float(np.abs(baseline - row).max()),
                },
            )
        )
    return ExplainResult(tuple(explanations), tuple(model.feature_names), echo, cost, True)
