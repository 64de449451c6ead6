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
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import numpy as np
import torch
from pydantic import Field

from explainers.explanation import Caveat, ExplainResult, Explanation, OptionError
from explainers.games import BudgetError, check_deadline
from explainers.gradients.integrated import (
    Method,
    Output,
    backward_rows,
    check_finite,
    integrated_gradients,
    pick_target,
    require_gradients,
    score_function,
    scores_at,
)
from explainers.options import ARRAYS, EVERYWHERE, ExplainerOptions
from models.base import Model, TextModel
from models.modality import Modality

VERSION = "2"
_TINY = 1e-12


class UniOptions(ExplainerOptions):
    """Options of the `uni` explainer; all defaults are ours (the paper gives none)."""

    unlearning_steps: Annotated[int, EVERYWHERE] = Field(
        1, ge=1, le=1000, description="most gradient-ascent steps on the copy"
    )
    unlearning_rule: Annotated[Literal["line_search", "normalized", "sgd"], EVERYWHERE] = Field(
        "line_search",
        description="sgd: theta + eta * grad (the paper's rule); normalized (ours): a step of "
        "length eta * ||theta|| along the gradient, robust to saturated softmax outputs; "
        "line_search (ours): the normalized step, its length searched from eta up so that "
        "the class probability falls to unlearning_target",
    )
    unlearning_lr: Annotated[float, EVERYWHERE] = Field(
        0.002,
        gt=0,
        le=1e6,
        description="eta: SGD rate, relative step length (normalized) or the first length "
        "tried (line_search)",
    )
    unlearning_target: Annotated[float | None, EVERYWHERE] = Field(
        0.1,
        ge=0,
        lt=1,
        description="stop the ascent once the copy's class probability is at most this share of "
        "the input's (ours); null: always take unlearning_steps (one step: the paper)",
    )
    epsilon: Annotated[float | None, EVERYWHERE] = Field(
        None,
        gt=0,
        le=1e6,
        description="radius of the ball per feature (see epsilon_units); l2 bounds the "
        "root-mean-square change, ||(x' - x) / epsilon||_2 <= sqrt(features); default 0.15 in "
        "input units, 1 in std units (ours)",
    )
    epsilon_units: Annotated[Literal["auto", "input", "std"], EVERYWHERE] = Field(
        "auto",
        description="input: epsilon in input units; std: per feature, times the background's "
        "standard deviation; auto: input for images and for tabular models without background "
        "rows, std otherwise",
    )
    norm: Annotated[Literal["linf", "l2"], EVERYWHERE] = Field("l2", description="norm of the ball")
    pgd_steps: Annotated[int, EVERYWHERE] = Field(
        20, ge=0, le=1000, description="projected gradient steps T"
    )
    pgd_step_size: Annotated[float | None, EVERYWHERE] = Field(
        None, gt=0, description="PGD step alpha, in the units of epsilon; default epsilon / 4"
    )
    min_match: Annotated[float, EVERYWHERE] = Field(
        0.75,
        ge=0,
        le=1,
        description="share of the copy's drop in the class probability the baseline must reach; "
        "below it the explanation warns baseline_not_reached",
    )
    clip_min: Annotated[float | None, ARRAYS] = Field(  # text: embeddings have no range
        None, description="lowest valid input value; default: the model's input_range"
    )
    clip_max: Annotated[float | None, ARRAYS] = Field(
        None, description="highest valid input value; default: the model's input_range"
    )
    ig_steps: Annotated[int, EVERYWHERE] = Field(
        16, ge=1, le=1024, description="Riemann steps B from x' to x"
    )
    method: Annotated[Method, EVERYWHERE] = Field(
        "riemann_right", description="quadrature of the path; the paper's sum is riemann_right"
    )
    output: Annotated[Output, EVERYWHERE] = Field(
        "probability", description="attribute the class probability or (softmax models) logit"
    )


def _log_probs(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """log softmax: from the logits when the module ends in Softmax, else log of its output."""
    if isinstance(module, torch.nn.Sequential) and isinstance(module[-1], torch.nn.Softmax):
        return torch.log_softmax(module[:-1](x).reshape(x.shape[0], -1), dim=1)
    return torch.log(module(x).reshape(x.shape[0], -1).clamp_min(_TINY))


def unlearned_output(
    module: torch.nn.Module, x: torch.Tensor, target: int, options: UniOptions
) -> tuple[torch.Tensor, int, bool]:
    """Stage 1: log-probabilities on x [1, *shape] of a copy after gradient ascent on CE.

    `sgd`: theta += eta * grad (the paper). `normalized` (ours): theta += eta * ||theta|| *
    grad / ||grad||, a step of relative length eta; a confident model's cross-entropy gradient
    is tiny (1 - p ~ 1e-9 on digits-cnn), so a fixed SGD rate barely moves it. `line_search`
    (ours): the normalised step whose length puts the class probability at unlearning_target x
    the input's (doubling from eta, then bisection; forward passes only). The other rules stop
    once the probability is that low. Returns (log-probs [1, k], model evaluations, reached).
    """
    twin = copy.deepcopy(module)  # the caller's weights are never touched
    params = [p for p in twin.parameters() if p.is_floating_point()]
    for p in params:
        p.requires_grad_(True)
    with torch.no_grad():
        start = float(_log_probs(module, x)[0, target])
    goal = None if options.unlearning_target is None else start + np.log(options.unlearning_target)
    evals = 0
    for step in range(options.unlearning_steps + 1):
        check_deadline()
        with torch.enable_grad():
            logp = _log_probs(twin, x)
            evals += 1
            if goal is not None and float(logp[0, target].detach()) <= goal:
                return logp.detach(), evals, True
            if step == options.unlearning_steps:
                return logp.detach(), evals, goal is None
            loss = -logp[0, target]  # cross-entropy of the class
            grads = torch.autograd.grad(loss, params, allow_unused=True)
        pairs = [(p, g) for p, g in zip(params, grads, strict=True) if g is not None]
        if not pairs:  # no weights to unlearn with (a module of constants)
            return logp.detach(), evals, goal is None
        if options.unlearning_rule == "sgd":
            with torch.no_grad():
                for p, g in pairs:
                    p.add_(g, alpha=options.unlearning_lr)  # ascent: forget x
            continue
        g_norm = torch.cat([g.double().reshape(-1) for _, g in pairs]).norm()
        p_norm = torch.cat([p.detach().double().reshape(-1) for p, _ in pairs]).norm()
        unit = float(p_norm / g_norm.clamp_min(_TINY))  # gradient x unit: length ||theta||
        if options.unlearning_rule == "normalized" or goal is None:
            with torch.no_grad():
                for p, g in pairs:
                    p.add_(g, alpha=options.unlearning_lr * unit)
            continue
        evals += _line_search(twin, x, target, pairs, unit, goal, options.unlearning_lr)
    raise AssertionError("unreachable")  # pragma: no cover


_DOUBLINGS, _BISECTIONS = 12, 8


def _line_search(
    twin: torch.nn.Module,
    x: torch.Tensor,
    target: int,
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]],
    unit: float,
    goal: float,
    eta: float,
) -> int:
    """Move the copy's weights to theta + eta * unit * grad, eta the shortest (within a factor
    2^(1/2^8)) that brings the log-probability to `goal`, or the largest tried (eta * 2^12).
    Returns the forward passes spent."""
    origin = [p.detach().clone() for p, _ in pairs]

    def logp_at(length: float) -> float:
        check_deadline()
        with torch.no_grad():
            for (p, g), p0 in zip(pairs, origin, strict=True):
                p.copy_(p0 + length * unit * g)
            return float(_log_probs(twin, x)[0, target])

    evals, low, high = 0, 0.0, eta
    while True:
        evals += 1
        if logp_at(high) <= goal or evals > _DOUBLINGS:
            break
        low, high = high, 2 * high
    if low > 0 and evals <= _DOUBLINGS:  # reached: bisect (geometrically) for the shortest
        for _ in range(_BISECTIONS):
            mid = float(np.sqrt(low * high))
            evals += 1
            if logp_at(mid) <= goal:
                high = mid
            else:
                low = mid
        evals += 1
        logp_at(high)
    return evals


def _project(u: torch.Tensor, norm: str) -> torch.Tensor:
    """Into the ball in scaled units u = delta / eps: |u_i| <= 1 (linf), ||u||_2 <= sqrt(d)."""
    if norm == "linf":
        return u.clamp(-1.0, 1.0)
    radius = float(np.sqrt(u.numel()))
    length = float(u.norm())
    return u if length <= radius else u * (radius / length)


def match_baseline(
    module: torch.nn.Module,
    x: torch.Tensor,
    target_logp: torch.Tensor,
    eps: torch.Tensor,
    options: UniOptions,
) -> tuple[torch.Tensor, list[float]]:
    """Stage 2: PGD from x for x' in the ball minimising KL(F(x; unlearned) || F(x'; original)).

    Steps are taken in scaled units u = (x' - x) / eps: sign steps of alpha / epsilon (linf), or
    steps of length sqrt(d) alpha / epsilon along the gradient (l2), then projection and clipping.
    """
    epsilon = options.epsilon or 1.0  # resolved by the caller
    step = options.pgd_step_size / epsilon if options.pgd_step_size else 0.25
    q = target_logp.exp()
    xp, best = x.clone(), x.clone()
    kls: list[float] = []
    for _ in range(options.pgd_steps + 1):
        check_deadline()
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
            g = grad * eps  # the gradient in scaled units
            if options.norm == "linf":
                move = step * g.sign()
            else:
                move = step * float(np.sqrt(g.numel())) * g / g.norm().clamp_min(_TINY)
            u = _project((xp.detach() - x) / eps - move, options.norm)
            xp = x + u * eps
            if options.clip_min is not None or options.clip_max is not None:
                xp = xp.clamp(options.clip_min, options.clip_max)
    return best, kls


def _resolve_ball(
    model: Model, options: UniOptions, background: np.ndarray | None
) -> tuple[UniOptions, np.ndarray]:
    """Options with epsilon_units and epsilon resolved, and the per-feature radius [*shape]."""
    units = options.epsilon_units
    bg = background if background is not None else model.background
    if units == "auto":  # per-feature scales need background rows; without them, input units
        units = "input" if model.modality == Modality.IMAGE or bg is None else "std"
    epsilon = options.epsilon or (0.15 if units == "input" else 1.0)
    options = options.model_copy(update={"epsilon_units": units, "epsilon": epsilon})
    if units == "input":
        return options, np.full(model.input_shape, epsilon)
    if bg is None:
        raise OptionError("epsilon_units 'std' needs background rows; send a background")
    std = bg.astype(np.float64).std(axis=0)
    return options, epsilon * np.where(std > 0, std, 1.0)


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
    if isinstance(model, TextModel):  # on the input embeddings of a Hugging Face classifier
        from explainers.gradients.uni_text import explain_text_uni

        return explain_text_uni(model, [str(t) for t in inputs], options, target, budget)
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
    search = 1 + _DOUBLINGS + _BISECTIONS + 1 if options.unlearning_rule == "line_search" else 0
    cost = (
        options.unlearning_steps * (1 + search) + 1 + options.pgd_steps + 1 + options.ig_steps + 2
    )
    if budget is not None and cost > budget:
        raise BudgetError(f"UNI with these options costs {cost} model evaluations; budget {budget}")
    options, eps = _resolve_ball(model, options, background)
    score = score_function(model, options.output)
    echo: dict[str, Any] = options.echo()
    echo["pgd_step_size"] = options.pgd_step_size or echo["epsilon"] / 4
    device = model.device  # the copy, the PGD search and IG run where the weights are
    module = model.torch_module()
    rows, _ = backward_rows(model, 1024)  # MemoryBudgetError (400) before any model call
    eps_t = torch.tensor(eps, dtype=torch.float32, device=device)[None]
    explanations = []
    for row in inputs.astype(np.float32):
        check_deadline()  # between rows: withdrawn work stops before the next one
        x = torch.from_numpy(row[None].copy()).to(device)  # [1, *shape]
        out = pick_target(model, target, model.predict(row[None])[0])
        unlearned, unlearning_evals, unlearned_ok = unlearned_output(module, x, out, options)
        xp, kls = match_baseline(module, x, unlearned, eps_t, options)
        baseline = xp[0].cpu().numpy().astype(np.float64)
        attr = integrated_gradients(
            score,
            row.astype(np.float64),
            baseline[None],
            out,
            options.ig_steps,
            options.method,
            rows,
        )
        s = scores_at(score, np.stack([row.astype(np.float64), baseline]), 2)
        full, base = float(s[0, out]), float(s[1, out])
        with torch.no_grad():  # class probabilities: the input, the baseline, the unlearned copy
            p_x, p_base = _log_probs(module, torch.cat([x, xp]))[:, out].exp().tolist()
        p_copy = float(unlearned[0, out].exp())
        check_finite(attr, base, full, *kls)
        gap = float(attr.sum()) + base - full
        share = (p_x - p_base) / (p_x - p_copy) if p_x - p_copy > _TINY else 0.0
        warnings = _caveats(options, unlearned_ok, p_x, p_copy, p_base, share)
        explanations.append(
            Explanation(
                output_index=out,
                values=attr.reshape(-1),
                base_value=base,
                instance_output_value=full,
                exact=False,
                n_model_evals=unlearning_evals + options.pgd_steps + 1 + options.ig_steps + 2,
                estimator=f"uni-ig-{options.method}",
                details={
                    "baseline": baseline.reshape(-1).tolist(),
                    "completeness_gap": gap,
                    "probability_input": p_x,
                    "probability_baseline": p_base,
                    "unlearned_probability": p_copy,
                    "match_share": share,
                    "kl_start": kls[0],
                    "kl_final": min(kls[1:]) if len(kls) > 1 else kls[0],
                    "distance_linf": float(np.abs(baseline - row).max()),
                    "distance_rms": float(np.sqrt(np.mean((baseline - row) ** 2))),
                },
                warnings=warnings,
            )
        )
    return ExplainResult(tuple(explanations), tuple(model.feature_names), echo, cost, True)


def _caveats(
    options: UniOptions, unlearned_ok: bool, p_x: float, p_copy: float, p_base: float, share: float
) -> tuple[Caveat, ...]:
    """not_converged: the copy did not unlearn; baseline_not_reached: the match fell short."""
    found = []
    if not unlearned_ok:
        found.append(
            Caveat(
                "not_converged",
                f"unlearning stopped after {options.unlearning_steps} steps with the class "
                f"probability at {p_copy:.3g} (input {p_x:.3g}; goal "
                f"{options.unlearning_target} x the input's): raise unlearning_steps or "
                "unlearning_lr",
            )
        )
    if share < options.min_match:
        found.append(
            Caveat(
                "baseline_not_reached",
                f"the baseline's class probability is {p_base:.3g} where the unlearned model "
                f"gives {p_copy:.3g} (input {p_x:.3g}): it covers {share:.0%} of that drop, "
                f"under min_match {options.min_match:.0%}; the attributions explain little of "
                "the output: widen epsilon or add pgd_steps",
            )
        )
    return tuple(found)
