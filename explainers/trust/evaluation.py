"""Faithfulness and stability of attributions, for any model (tabular, image, text) and explainer.

Deletion and insertion curves: Petsiuk, Das & Saenko (RISE, BMVC 2018), as in COCOA (Lin et
al. 2023); MuFidelity: Bhatt, Weller & Moura (IJCAI 2020); max-sensitivity: Yeh et al. (NeurIPS
2019). The metrics only need a removal game v(coalition) over the explanation's players, so they
apply to every explainer whose values are one number per player.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field

from explainers.explanation import ExplainResult, Explanation, OptionError, Span
from explainers.games import Game, GameRecorder
from explainers.games.absence import Absence, Kind, references
from explainers.games.deadlines import check_deadline
from explainers.games.masked import MaskedModelGame, patch_groups
from explainers.games.text import TextGame
from explainers.options import EVERYWHERE, ExplainerOptions, applies
from models.base import Model, TextModel
from models.modality import Modality

Metric = Literal["deletion", "insertion", "mufidelity", "sensitivity"]
METRICS: tuple[Metric, ...] = ("deletion", "insertion", "mufidelity", "sensitivity")
Removal = Literal["auto", "zero", "mean", "blur", "background", "value", "delete", "mask"]
# perturbed inputs [p, *shape] and the output index -> their attributions [p, n_players]
Rerun = Callable[[np.ndarray, int], np.ndarray]


# Where the options apply (explainers/options.py; echoed only there, never an error): by the
# removal as resolved (auto -> mean, zero or delete) and by the metrics asked for
VALUE_REMOVAL = applies(when={"removal": ["value"]})
BLUR_REMOVAL = applies(Modality.IMAGE, when={"removal": ["blur"]})
MUFIDELITY = applies(when={"metrics": ["mufidelity"]})
SENSITIVITY = applies(when={"metrics": ["sensitivity"]})


class EvaluateOptions(ExplainerOptions):
    """What to measure and how players are removed; defaults are ours unless noted. Strict like
    every explainer's options (`steps: "3"` is a 422)."""
    metrics: Annotated[list[Metric], EVERYWHERE] = Field(
        default_factory=lambda: list(METRICS), min_length=1, description="figures to compute"
    )
    removal: Annotated[Removal, EVERYWHERE] = Field(
        "auto",
        description="what a removed player becomes: zero; mean (of the background rows); blur "
        "(images); background (average over the background rows); value (removal_value); "
        "delete or mask (text). auto: mean for tabular, zero for images, delete for text",
    )
    removal_value: Annotated[float | list[Any] | None, VALUE_REMOVAL] = Field(
        None, description="removal 'value': a number or one value per input feature"
    )
    blur_sigma: Annotated[float | None, BLUR_REMOVAL] = Field(
        None, gt=0, le=100, description="removal 'blur': sigma in pixels; default min(H, W) / 4"
    )
    steps: Annotated[int, EVERYWHERE] = Field(
        50, ge=2, le=1000, description="points of the deletion/insertion curves"
    )
    n_subsets: Annotated[int, MUFIDELITY] = Field(
        128, ge=3, le=10000, description="MuFidelity: random subsets"
    )
    subset_fraction: Annotated[float, MUFIDELITY] = Field(
        0.2, gt=0, lt=1, description="MuFidelity: fraction of the players removed per subset"
    )
    n_perturbations: Annotated[int, SENSITIVITY] = Field(
        3, ge=1, le=32, description="sensitivity: perturbed inputs, each explained again"
    )
    radius: Annotated[float, SENSITIVITY] = Field(
        0.02,
        gt=0,
        le=10,
        description="sensitivity: uniform noise in [-radius, radius], in input units for images "
        "and in units of each feature's background standard deviation for tabular models",
    )
    curves: Annotated[bool, EVERYWHERE] = Field(
        False, description="also return the deletion and insertion curves"
    )


def auc(fractions: np.ndarray, scores: np.ndarray) -> float:
    """Trapezoid area under a curve over the fraction of players in [0, 1]."""
    return float(np.trapezoid(scores, fractions))


def curve_points(n_players: int, steps: int) -> np.ndarray:
    """How many players are removed (or inserted) at each point: 0..n, at most steps + 1 points."""
    if n_players <= steps:
        return np.arange(n_players + 1)
    return np.unique(np.round(np.linspace(0, n_players, steps + 1)).astype(int))


def faithfulness(
    game: Game,
    values: np.ndarray,
    output: int,
    options: EvaluateOptions,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """Deletion/insertion AUC and MuFidelity of `values` [n] on `game` (masks -> [m, k]).

    Deletion removes the players in order of decreasing attribution (lower area is better);
    insertion adds them to the empty coalition in that order (higher is better). MuFidelity is
    the Pearson correlation, over random subsets S, of sum_{i in S} values_i and
    v(all) - v(all without S).
    """
    n = len(values)
    want = set(options.metrics)
    order = np.argsort(-values, kind="stable")
    ks = curve_points(n, options.steps)
    blocks: dict[str, np.ndarray] = {"full": np.ones((1, n), dtype=bool)}
    ranks = np.empty(n, dtype=int)
    ranks[order] = np.arange(n)
    if "deletion" in want:
        blocks["deletion"] = ranks[None, :] >= ks[:, None]  # top k removed
    if "insertion" in want:
        blocks["insertion"] = ranks[None, :] < ks[:, None]  # top k present
    subsets = None
    if "mufidelity" in want:
        size = min(n, max(1, round(options.subset_fraction * n)))
        subsets = np.zeros((options.n_subsets, n), dtype=bool)
        for row in subsets:
            row[rng.choice(n, size, replace=False)] = True
        blocks["mufidelity"] = ~subsets
    masks = np.concatenate(list(blocks.values()))
    recorder = GameRecorder(game, n)  # meters the game: cancel, deadline, model rows
    # every mask as given, in one call: the curves' shared ends are paid for as before
    out = recorder.shape_out(recorder.evaluate_distinct(masks))
    out = out[:, output] if out.ndim == 2 else out
    figures: dict[str, Any] = {}
    start = 1
    full = float(out[0])
    fractions = ks / n
    for name, block in list(blocks.items())[1:]:
        scores = out[start : start + len(block)]
        start += len(block)
        if name in ("deletion", "insertion"):
            figures[f"{name}_auc"] = auc(fractions, scores)
            if options.curves:
                figures[f"{name}_curve"] = {
                    "fraction": fractions.tolist(),
                    "score": scores.tolist(),
                }
        else:
            drops = full - scores
            sums = subsets.astype(np.float64) @ values  # type: ignore[union-attr]
            ok = np.std(drops) > 0 and np.std(sums) > 0
            figures["mufidelity"] = float(np.corrcoef(sums, drops)[0, 1]) if ok else None
    if {"deletion", "insertion"} <= want:
        figures["insertion_minus_deletion"] = figures["insertion_auc"] - figures["deletion_auc"]
    figures["n_model_evals"] = recorder.n_evaluations
    return figures


def max_sensitivity(
    rerun: Rerun,
    output: int,
    x: np.ndarray,
    values: np.ndarray,
    scale: np.ndarray,
    options: EvaluateOptions,
    rng: np.random.Generator,
) -> dict[str, float]:
    """max and mean over perturbed inputs of ||phi(x + noise) - phi(x)|| / ||phi(x)||."""
    noise = rng.uniform(-options.radius, options.radius, (options.n_perturbations, *x.shape))
    perturbed = (x[None] + noise * scale).astype(np.float32)
    again = np.asarray(rerun(perturbed, output), dtype=np.float64).reshape(len(perturbed), -1)
    norm = float(np.linalg.norm(values)) or 1.0
    ratios = np.linalg.norm(again - values[None], axis=1) / norm
    return {"max": float(ratios.max()), "mean": float(ratios.mean())}


def player_groups(model: Model, n_values: int, patch_size: int | None) -> np.ndarray:
    """Player index of every input feature: one feature each, or image patches."""
    if n_values == model.n_features:
        return np.arange(model.n_features)
    if model.modality == Modality.IMAGE and patch_size is not None:
        groups, names = patch_groups(model.input_shape, patch_size)
        if len(names) == n_values:
            return groups
    hint = " (image patches: give patch_size)" if model.modality == Modality.IMAGE else ""
    raise OptionError(
        f"{n_values} attributions do not match the model's {model.n_features} features{hint}"
    )


REMOVALS: dict[str, Kind] = {
    "zero": "zero",
    "blur": "blur",
    "value": "value",
    "mean": "mean",
    "background": "background",
}


def removal_references(
    model: Model, x: np.ndarray, options: EvaluateOptions, background: np.ndarray | None
) -> tuple[np.ndarray, str]:
    """Reference rows [r, *shape] that removed features take, and the resolved removal name."""
    removal = options.removal
    if removal == "auto":
        removal = "zero" if model.modality == Modality.IMAGE else "mean"
    if removal in ("delete", "mask"):
        raise OptionError(f"removal {removal!r} applies to text models")
    if removal == "value" and options.removal_value is None:
        raise OptionError("removal 'value' needs removal_value")
    absence = Absence(REMOVALS[removal], options.removal_value, options.blur_sigma)
    rows = references(model, x, absence, background, "removal")
    return rows.astype(np.float32), removal


def _text_game(model: TextModel, text: str, players: Sequence[Span], removal: str) -> TextGame:
    if removal == "auto":
        removal = "delete"
    if removal not in ("delete", "mask"):
        raise OptionError("text models remove words by 'delete' or 'mask'")
    return TextGame(model.predict_texts, text, players, removal, model.mask_token)


def evaluate(
    model: Model,
    inputs: np.ndarray | Sequence[Any],
    explanations: Sequence[Explanation],
    options: EvaluateOptions,
    *,
    seed: int = 0,
    background: np.ndarray | None = None,
    patch_size: int | None = None,
    rerun: Rerun | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Figures per explanation, and what was resolved (for the response meta)."""
    if len(inputs) != len(explanations):
        raise OptionError("evaluation needs one explanation per model input")
    if "sensitivity" in options.metrics:
        if rerun is None:
            raise OptionError("sensitivity re-runs an explainer: name one to evaluate with")
        if isinstance(model, TextModel):
            raise OptionError("sensitivity adds numeric noise: not for text models")
    rng = np.random.default_rng(seed)
    figures: list[dict[str, Any]] = []
    resolved: str = options.removal
    scale: np.ndarray | float = 1.0
    if model.modality != Modality.IMAGE and not isinstance(model, TextModel):
        bg = background if background is not None else model.background
        if bg is not None:
            std = bg.astype(np.float64).std(axis=0)
            scale = np.where(std > 0, std, 1.0)
    for x, e in zip(inputs, explanations, strict=True):
        check_deadline()
        values = np.asarray(e.values, dtype=np.float64)
        game: Game
        if isinstance(model, TextModel):
            if e.players is None:
                raise OptionError("text explanations need their players (spans)")
            if len(values) != len(e.players):
                raise OptionError(
                    f"{len(values)} attributions for a text of {len(e.players)} players"
                )
            game = _text_game(model, str(x), e.players, options.removal)
            resolved = "delete" if options.removal == "auto" else options.removal
        else:
            x = np.asarray(x, dtype=np.float32).reshape(model.input_shape)
            groups = player_groups(model, len(values), patch_size)
            refs, resolved = removal_references(model, x, options, background)
            game = MaskedModelGame(model.predict, x, refs, groups, model.batch_size)
        one = faithfulness(game, values, e.output_index, options, rng)
        if "sensitivity" in options.metrics and rerun is not None:
            one["sensitivity"] = max_sensitivity(
                rerun, e.output_index, x, values, np.asarray(scale), options, rng
            )
        figures.append(one)
    echo = {**options.echo(model.modality, values={"removal": resolved}), "removal": resolved}
    if "blur_sigma" in echo:
        echo["blur_sigma"] = options.blur_sigma or min(model.input_shape[-2:]) / 4
    return figures, echo


def evaluate_result(
    model: Model,
    inputs: np.ndarray | Sequence[Any],
    result: ExplainResult,
    options: EvaluateOptions,
    *,
    seed: int = 0,
    background: np.ndarray | None = None,
    rerun: Rerun | None = None,
) -> ExplainResult:
    """`result` with figures in each explanation's details["evaluation"] and meta["evaluation"]."""
    start = time.perf_counter()
    patch_size = result.parameters.get("patch_size")
    figures, echo = evaluate(
        model,
        inputs,
        result.explanations,
        options,
        seed=seed,
        background=background,
        patch_size=patch_size if isinstance(patch_size, int) else None,
        rerun=rerun,
    )
    explanations = tuple(
        replace(e, details={**(e.details or {}), "evaluation": f})
        for e, f in zip(result.explanations, figures, strict=True)
    )
    meta = {
        "parameters": echo,
        "n_model_evals": sum(f["n_model_evals"] for f in figures),
        "compute_ms": round((time.perf_counter() - start) * 1000, 3),
    }
    return replace(result, explanations=explanations, meta={**result.meta, "evaluation": meta})
