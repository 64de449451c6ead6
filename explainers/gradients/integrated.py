"""Integrated gradients from static or sampled baselines, and re-calibrated path estimators.

Integrated gradients: Sundararajan, Taly & Yan (ICML 2017). Expected gradients: Erion et al.
(Nature MI 2021). Blur and uniform-noise baselines: Sturmfels, Lundberg & Lee (Distill 2020).
Re-calibration (`valid_ip`, `valid_ref`): Yang, Akhtar, Wen, Shah & Mian, "Re-calibrating Feature
Attributions for Model Interpretation" (ICLR 2023).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal

import numpy as np
import torch
from pydantic import Field

from explainers.estimators.budget import rows_per_call
from explainers.explanation import Caveat, ExplainResult, Explanation, OptionError
from explainers.games import (
    BudgetError,
    ExplainerError,
    NotDifferentiableError,
    check_deadline,
    has_deadline,
)
from explainers.games.absence import Absence, Kind, references
from explainers.options import EVERYWHERE, ExplainerOptions, applies
from explainers.trust import caveats
from models.base import Model, TextModel
from models.modality import Modality

VERSION = "1"

Method = Literal[
    "gausslegendre", "riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid"
]
Output = Literal["probability", "logit"]
Score = Callable[[torch.Tensor], torch.Tensor]  # [m, *input_shape] -> [m, k]
RANDOM_BASELINES = ("uniform", "gaussian", "expected")
# Baselines that are references of games/absence.py; the random ones are drawn here.
STATIC_BASELINES: dict[str, Kind] = {
    "zero": "zero",
    "constant": "value",
    "supplied": "value",
    "mean": "mean",
    "blur": "blur",
}


def require_gradients(model: Model) -> None:
    """Refuse models whose gradients we cannot take."""
    if isinstance(model, TextModel) or model.modality == Modality.TEXT:
        raise NotDifferentiableError(
            f"{model.name} is a text model: gradient explainers take tabular and image models"
        )
    if not model.differentiable:
        raise NotDifferentiableError(
            f"{model.name} is a black box without input gradients ({model.platform}); use shapley"
        )


def score_function(model: Model, output: Output) -> Score:
    """The differentiable scores: the model's outputs, or a classifier's logits.

    Classifiers end in a softmax (models/base.py); `logit` drops that last layer, which needs a
    `torch.nn.Sequential` whose last module is `torch.nn.Softmax`. Inputs move to the model's
    device (a no-op on the CPU); gradients flow back to them through the move.
    """
    module, device = model.torch_module(), model.device
    if output == "logit":
        if model.task != "classification":
            raise OptionError("output 'logit' applies to classifiers; this model is a regressor")
        if not (
            isinstance(module, torch.nn.Sequential) and isinstance(module[-1], torch.nn.Softmax)
        ):
            raise OptionError(
                f"{model.name}: logits need a Sequential module ending in Softmax; "
                "use output 'probability'"
            )
        module = module[:-1]
    net = module
    return lambda x: net(x.to(device)).reshape(x.shape[0], -1)


def quadrature(method: str, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Points alpha in [0, 1] and weights of the path integral (captum's rules).

    `riemann_trapezoid` uses the textbook weights (sum 1, spacing 1/(steps-1)); captum's variant
    weights the inner points 1/steps and sums to 1 - 1/steps. Computed once per rule and
    number of steps (no deadline check inside).
    """
    alphas, weights = _quadrature(method, steps)
    return alphas.copy(), weights.copy()


@functools.lru_cache(maxsize=64)
def _quadrature(method: str, steps: int) -> tuple[np.ndarray, np.ndarray]:
    if method == "gausslegendre":
        # scipy's nodes equal numpy's leggauss to 1e-14, in ms where leggauss solves a dense
        # eigenvalue problem holding the GIL (seconds at 1024 steps beside other threads)
        from scipy.special import roots_legendre

        x, w = roots_legendre(steps)
        return 0.5 * (1 + x), 0.5 * w
    if steps < 2 and method == "riemann_trapezoid":
        raise OptionError("riemann_trapezoid needs at least 2 steps")
    n = steps
    if method == "riemann_left":
        return np.linspace(0, 1 - 1 / n, n), np.full(n, 1 / n)
    if method == "riemann_right":
        return np.linspace(1 / n, 1, n), np.full(n, 1 / n)
    if method == "riemann_middle":
        return np.linspace(1 / (2 * n), 1 - 1 / (2 * n), n), np.full(n, 1 / n)
    if method == "riemann_trapezoid":
        w = np.full(n, 1 / (n - 1))
        w[[0, -1]] /= 2
        return np.linspace(0, 1, n), w
    raise OptionError(f"unknown integration method {method!r}")


SLICE_S = 0.1  # under a deadline or cancel check: passes of about this long (measured)
FIRST_SLICE = 16  # rows of the first such pass, before its rate is known


def spans(n: int, cap: int) -> Iterator[tuple[int, int]]:
    """Row ranges [start, stop) of at most `cap` rows. Under a deadline or a cancel check, of
    about SLICE_S seconds each (timed on the caller's work between two ranges), so that the
    check before each pass comes soon: an abandoned request stops within about SLICE_S
    instead of finishing a pass of `batch_size` rows (seconds on a large model)."""
    if not has_deadline():
        for start in range(0, n, cap):
            yield start, min(n, start + cap)
        return
    start, size = 0, min(cap, FIRST_SLICE)
    while start < n:
        stop = min(n, start + size)
        began = time.monotonic()
        yield start, stop
        took = max(time.monotonic() - began, 1e-6)
        size = max(1, min(cap, int(SLICE_S * (stop - start) / took)))
        start = stop


def input_gradients(
    score: Score, points: np.ndarray, target: int, batch_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """d score_target / d input at `points` [p, *shape]: (gradients [p, *shape], scores [p]).

    At most `batch_size` rows per forward and backward pass (about SLICE_S of them under a
    deadline: spans); the deadline (and cancellation) is checked before each."""
    grads = np.empty(points.shape, dtype=np.float64)
    scores = np.empty(points.shape[0], dtype=np.float64)
    for start, stop in spans(points.shape[0], batch_size):
        check_deadline()
        chunk = torch.tensor(points[start:stop], dtype=torch.float32)
        chunk.requires_grad_(True)
        with torch.enable_grad():
            out = score(chunk)[:, target]
            if not out.requires_grad:
                raise NotDifferentiableError("the model's output does not depend on its input")
            # Gradients w.r.t. the input only: the model's parameters never receive .grad.
            (grad,) = torch.autograd.grad(out.sum(), chunk)
        grads[start : start + chunk.shape[0]] = grad.cpu().numpy()
        scores[start : start + chunk.shape[0]] = out.detach().cpu().numpy()
    return grads, scores


def check_finite(values: np.ndarray, *scores: float) -> None:
    """Refuse NaN or infinite attributions or scores (an overflowing model or input)."""
    if not (np.all(np.isfinite(values)) and np.all(np.isfinite(scores))):
        raise ExplainerError("the model's outputs or gradients are not finite at these inputs")


def scores_at(score: Score, x: np.ndarray, batch_size: int) -> np.ndarray:
    """Scores [m, k] without gradients."""
    parts = []
    with torch.no_grad():  # not inference_mode: a TorchScript module could keep its tensors
        for start, stop in spans(x.shape[0], batch_size):
            check_deadline()
            chunk = torch.tensor(x[start:stop], dtype=torch.float32)
            parts.append(score(chunk).double().cpu().numpy())
    return np.concatenate(parts)


def path_chunks(
    x: np.ndarray, refs: np.ndarray, alphas: np.ndarray, batch_size: int
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Points r_b + alpha_a (x - r_b) of all paths, batch_size at a time: (b, a, points).

    points is [c, *shape]; memory stays O(batch_size x features) whatever the number of steps
    and references.
    """
    n, expand = len(refs) * len(alphas), (-1,) + (1,) * x.ndim
    for start in range(0, n, batch_size):
        idx = np.arange(start, min(n, start + batch_size))
        b, a = idx // len(alphas), idx % len(alphas)
        r = refs[b]
        yield b, a, r + alphas[a].reshape(expand) * (x[None] - r)


def integrated_gradients(
    score: Score,
    x: np.ndarray,
    baselines: np.ndarray,
    target: int,
    steps: int,
    method: str = "gausslegendre",
    batch_size: int = 1024,
) -> np.ndarray:
    """IG of one input x [*shape] averaged over baselines [b, *shape]: float64 [*shape]."""
    alphas, weights = quadrature(method, steps)
    expand = (-1,) + (1,) * x.ndim
    path = np.zeros(baselines.shape)  # [b, *shape]: weighted sum of gradients along each path
    for b, a, points in path_chunks(x, baselines, alphas, batch_size):
        grads, _ = input_gradients(score, points, target, batch_size)
        np.add.at(path, b, weights[a].reshape(expand) * grads)
    return np.asarray(((x[None] - baselines) * path).mean(axis=0))


def recalibrated(
    score: Score,
    x: np.ndarray,
    references: np.ndarray,
    target: int,
    k: int,
    variant: Literal["valid_ip", "valid_ref"],
    batch_size: int = 1024,
) -> np.ndarray:
    """Re-calibrated IG (Yang et al. 2023): keep only non-negative terms and average them.

    k points s = r + t (x - r), t in linspace(0, 1, k), on each reference r. valid_ip: one term
    per point, g(s) / k * (x - s) (the point itself is the local reference). valid_ref: one term
    per reference, its path integral sum_t g(s) / k * (x - r), as the reference code filters
    whole paths. Per feature, the attribution is the sum of the non-negative terms divided by
    their count (0 when none). [*shape], non-negative by construction.
    """
    t = np.linspace(0, 1, k) if k > 1 else np.ones(1)
    total, count = np.zeros(x.shape), np.zeros(x.shape)
    paths = np.zeros(references.shape)  # [b, *shape]: sum_t g(s_bt) / k (valid_ref)
    for b, _, points in path_chunks(x, references, t, batch_size):
        grads, _ = input_gradients(score, points, target, batch_size)
        if variant == "valid_ref":
            np.add.at(paths, b, grads / k)
            continue
        terms = grads / k * (x[None] - points)  # [c, *shape]
        keep = terms >= 0
        total += np.where(keep, terms, 0.0).sum(axis=0)
        count += keep.sum(axis=0)
    if variant == "valid_ref":
        terms = paths * (x[None] - references)  # [b, *shape]: one IG term per reference
        keep = terms >= 0
        total, count = np.where(keep, terms, 0.0).sum(axis=0), keep.sum(axis=0)
    return np.asarray(total / np.maximum(count, 1))


def data_range(model: Model, background: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Low and high values of the inputs: per feature for tabular models, one pair for images.

    From the background rows (the request's, else the model's) within the model's input_range;
    the input_range (else [0, 1]) when there are none.
    """
    bg = background if background is not None else model.background
    valid = model.input_range or (0.0, 1.0)
    if bg is None:
        return np.full(model.input_shape, valid[0]), np.full(model.input_shape, valid[1])
    bg = bg.astype(np.float64)
    if model.modality == Modality.IMAGE:
        low, high = np.full(model.input_shape, bg.min()), np.full(model.input_shape, bg.max())
    else:
        low, high = bg.min(axis=0), bg.max(axis=0)
    if model.input_range is not None:  # noise references never leave the declared range
        low, high = np.clip(low, *model.input_range), np.clip(high, *model.input_range)
    return low, high


# Where the options apply (explainers/options.py; echoed only there): the quadrature to the
# path estimator, each baseline's own parameter to that baseline
PATH = applies(when={"estimator": ["path"]})
BLUR = applies(when={"baseline": ["blur"]})
GAUSSIAN = applies(when={"baseline": ["gaussian"]})
VALUED = applies(when={"baseline": ["constant", "supplied"]})
Baseline = Literal[
    "zero", "constant", "mean", "blur", "uniform", "gaussian", "supplied", "expected", "mask", "pad"
]


class IntegratedGradientsOptions(ExplainerOptions):
    """Options of the `integrated-gradients` explainer."""

    baseline: Annotated[Baseline, EVERYWHERE] = Field(
        "zero",
        description="zero; constant (baseline_value, a number); mean of the background rows; "
        "blur (images: Gaussian blur of the input); uniform noise in the data range; gaussian "
        "noise around the input (IG-SG reference); supplied (baseline_value, one value per "
        "feature); expected: background rows (expected gradients). Text models (on the input "
        "embeddings): mask (the default there: every token's embedding replaced by the mask "
        "token's), pad, or zero",
    )
    baseline_value: Annotated[float | list[Any] | None, VALUED] = Field(
        None, description="constant: a number; supplied: one value per input feature"
    )
    estimator: Annotated[Literal["path", "valid_ip", "valid_ref"], EVERYWHERE] = Field(
        "path",
        description="path: integrated gradients (additive); valid_ip / valid_ref: the ICLR 2023 "
        "re-calibrated estimators (non-negative, not additive)",
    )
    steps: Annotated[int | None, EVERYWHERE] = Field(
        None, ge=1, le=1024, description="points per path; default 50 (path), 5 (valid_*)"
    )
    method: Annotated[Method, PATH] = Field(
        "gausslegendre", description="quadrature of the path (path only)"
    )
    n_baselines: Annotated[int | None, EVERYWHERE] = Field(
        None,
        ge=1,
        le=256,
        description="references drawn for uniform, gaussian and expected baselines; default 10",
    )
    blur_sigma: Annotated[float | None, BLUR] = Field(
        None, gt=0, le=100, description="blur: sigma in pixels; default min(H, W) / 4 (ours)"
    )
    noise_scale: Annotated[float, GAUSSIAN] = Field(
        0.15, gt=0, le=10, description="gaussian: sigma as a fraction of the data range"
    )
    output: Annotated[Output, EVERYWHERE] = Field(
        "probability",
        description="attribute the model's output (a class probability for classifiers) or, "
        "for classifiers ending in a softmax, the logit",
    )
    batch_size: Annotated[int, EVERYWHERE] = Field(
        1024,
        ge=1,
        le=65536,
        description="at most this many rows per forward/backward pass; fewer when the server's "
        "memory budget per model call (MAX_BATCH_BYTES) holds fewer",
    )


HOST_ARRAYS = 3  # float64 arrays of one path point held beside the model: point, gradient, term


def backward_rows(model: Model, cap: int) -> tuple[int, int]:
    """(rows per forward/backward pass, rows per forward pass) from the model's memory budget
    (MAX_BATCH_BYTES), at most `cap`; MemoryBudgetError (400) when one row cannot fit. The
    path points and their gradients are float64 arrays in host memory beside the model's own
    working memory: they count against the budget too."""
    host = HOST_ARRAYS * 8 * model.n_features
    cap = max(1, min(cap, model.max_batch_bytes // host)) if model.max_batch_bytes else cap
    return rows_per_call(model, backward=True, cap=cap), rows_per_call(model, cap=cap)


def make_baselines(
    model: Model,
    x: np.ndarray,
    options: IntegratedGradientsOptions,
    background: np.ndarray | None,
    rng: np.random.Generator,
) -> np.ndarray:
    """Baselines [b, *shape] of one input x [*shape]."""
    kind, shape = options.baseline, model.input_shape
    n = options.n_baselines or 10
    if kind in ("constant", "supplied"):
        if options.baseline_value is None:
            raise OptionError(f"baseline {kind!r} needs baseline_value")
        value = np.asarray(options.baseline_value, dtype=np.float64)
        if kind == "constant" and value.ndim != 0:
            raise OptionError("baseline 'constant' takes one number; use 'supplied' for a row")
        if kind == "supplied" and value.size != model.n_features:
            raise OptionError(f"baseline_value needs {model.n_features} values, got {value.size}")
        if not np.all(np.isfinite(value)):
            raise OptionError("baseline_value must be finite")
    if kind in ("mask", "pad"):
        raise OptionError(f"baseline {kind!r} applies to text models")
    static = STATIC_BASELINES.get(kind)
    if static is not None:
        absence = Absence(static, options.baseline_value, options.blur_sigma)
        return references(model, x, absence, background, "baseline")
    if kind == "expected":  # background rows drawn at random (expected gradients)
        bg = references(model, x, Absence("background"), background, "baseline")
        rows = rng.choice(len(bg), n, replace=n > len(bg))
        return bg[rows]
    low, high = data_range(model, background)
    if kind == "uniform":
        return rng.uniform(low, high, size=(n, *shape))
    sigma = options.noise_scale * (high - low)  # gaussian: IG-SG references, clipped to range
    return np.clip(x + rng.normal(size=(n, *shape)) * sigma, low, high)


def _instead(model: Model) -> str:
    """What to send when the baseline is out of the data (caveats.baseline_out_of_data)."""
    if model.modality == Modality.IMAGE:
        return 'send "baseline": "blur" (the input blurred) or "expected" (background images)'
    return (
        'send "baseline": "mean" (the background rows\' mean) or "expected" (background '
        "rows: expected gradients)"
    )


def resolve(options: IntegratedGradientsOptions) -> dict[str, Any]:
    """The options after defaults, as echoed in meta.parameters."""
    echo = options.echo()
    if echo["steps"] is None:
        echo["steps"] = 50 if options.estimator == "path" else 5
    random = options.baseline in RANDOM_BASELINES
    echo["n_baselines"] = (options.n_baselines or 10) if random else 1
    if options.n_baselines is not None and not random:
        raise OptionError(f"n_baselines applies to {list(RANDOM_BASELINES)} baselines")
    if options.baseline not in ("constant", "supplied") and options.baseline_value is not None:
        raise OptionError("baseline_value applies to the constant and supplied baselines")
    return echo


def pick_target(model: Model, target: int | None, scores: np.ndarray) -> int:
    """The output to explain: the request's, else the predicted class (or the single output)."""
    if target is None:
        return int(np.argmax(scores)) if model.task == "classification" else 0
    if not 0 <= target < model.n_outputs:
        raise OptionError(f"target out of range for {model.n_outputs} outputs")
    return target


def explain(
    model: Model,
    inputs: np.ndarray,
    *,
    options: IntegratedGradientsOptions,
    target: int | None = None,
    seed: int = 0,
    budget: int | None = None,
    background: np.ndarray | None = None,
) -> ExplainResult:
    """Integrated gradients (or a re-calibrated estimator) of each input for one output."""
    if isinstance(model, TextModel):  # on the input embeddings of a Hugging Face classifier
        from explainers.gradients.integrated_text import explain_text

        return explain_text(model, [str(t) for t in inputs], options, target, budget)
    require_gradients(model)
    echo = resolve(options)
    if options.baseline == "blur":
        echo["blur_sigma"] = options.blur_sigma or min(model.input_shape[-2:]) / 4
    steps, n_refs = echo["steps"], echo["n_baselines"]
    cost = n_refs * steps + n_refs + 1  # gradient rows, plus the baselines' and the input's scores
    if budget is not None and cost > budget:
        raise BudgetError(
            f"{n_refs} baseline(s) x {steps} steps cost {cost} model evaluations; budget {budget}"
        )
    score = score_function(model, options.output)
    rows, forward_rows = backward_rows(model, options.batch_size)  # before any model call
    rng = np.random.default_rng(seed)
    explanations = []
    for x in inputs.astype(np.float64):
        refs = make_baselines(model, x, options, background, rng)
        outs = scores_at(score, np.concatenate([x[None], refs]), forward_rows)
        out = pick_target(model, target, outs[0])
        if options.estimator == "path":
            attr = integrated_gradients(score, x, refs, out, steps, options.method, rows)
        else:
            attr = recalibrated(score, x, refs, out, steps, options.estimator, rows)
        base, full = float(outs[1:, out].mean()), float(outs[0, out])
        check_finite(attr, base, full)
        details: dict[str, Any] = {"completeness_gap": float(attr.sum()) + base - full}
        warnings: tuple[Caveat, ...] = ()
        if n_refs == 1:
            details["baseline"] = refs[0].reshape(-1).tolist()
            off = caveats.baseline_out_of_data(model, refs[0], background, _instead(model))
            warnings = () if off is None else (off,)
        explanations.append(
            Explanation(
                output_index=out,
                values=attr.reshape(-1),
                base_value=base,
                instance_output_value=full,
                exact=False,
                n_model_evals=cost,
                estimator=f"ig-{options.method}"
                if options.estimator == "path"
                else options.estimator,
                details=details,
                warnings=warnings,
            )
        )
    return ExplainResult(
        tuple(explanations),
        tuple(model.feature_names),
        echo,
        cost,
        additive=options.estimator == "path",
    )
