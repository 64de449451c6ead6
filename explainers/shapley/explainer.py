"""Shapley values of models: the library entry point and the `shapley` explainer family.

Shapley (1953); KernelSHAP: Lundberg & Lee (2017); permutation sampling: Castro et al. (2009).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field

from explainers.estimators import interactions
from explainers.estimators.budget import default_budget
from explainers.estimators.library import shapley_values
from explainers.estimators.registry import (
    ESTIMATORS,
    EstimatorName,
    SamplerName,
    canonical_estimator,
    choose_estimator,
)
from explainers.estimators.tree import InterventionalUnavailable
from explainers.explanation import Caveat, ExplainResult, Explanation, OptionError, Span
from explainers.games import ExplainerError, Game, superpixels
from explainers.games import text as text_game
from explainers.games.masked import MaskedModelGame, patch_groups, spatial_hierarchy
from explainers.games.masked import default_patch_size as patch_default
from explainers.masking import MaskerOptions, default_masker, resolve
from explainers.masking import masker_references as _references  # noqa: F401  (tests' path)
from explainers.options import ARRAYS, EVERYWHERE, TEXTS, ExplainerOptions, applies
from explainers.shapley import runs
from explainers.shapley import trees as shapley_trees
from explainers.trust import audit
from models.base import Model, TextModel
from models.modality import Modality

# 4: image defaults: patches of max(2, ceil(max(H, W) / 16)), blur above 32 px, superpixels
# (3: tree models with background rows: interventional TreeSHAP; 2: sampling rounds)
VERSION = "4"

# Where the options apply beyond every model (explainers/options.py): an image's players are
# patches or superpixels, a text's words or tokens; patch_size and n_segments are for one kind
# of image player each; interaction orders for interaction indices; the audit rows are in the
# cache key, too long to echo.
PLAYERS = applies(Modality.IMAGE, Modality.TEXT)
PATCHES = applies(Modality.IMAGE, when={"players": ["patches"]}, strict=True)
SUPERPIXELS = applies(Modality.IMAGE, when={"players": ["superpixels"]}, strict=True)
INTERACTION_ORDER = applies(when={"index": ["SII", "k-SII", "STII", "FSII", "FBII"]})
API_ONLY = applies(when={"index": ["API"]})
NOT_ECHOED = applies(echoed=False)


class ShapleyOptions(ExplainerOptions):
    """Options of the `shapley` explainer."""
    estimator: Annotated[Literal["auto", EstimatorName, "svarm", "tree"], EVERYWHERE] = Field(
        "auto",
        description="auto: TreeSHAP for tree models (XGBoost, LightGBM) where it applies; else "
        "exact when 2^n coalitions fit the budget, else gp below 3n coalitions and from 3n "
        "KernelSHAP's coalitions fitted by kernel or gp, whichever is predicted more accurate at "
        "equal wall time from the model's measured cost (details.auto; AUTO_COST=0: kernel) "
        "(SV), or the index's default sampler; svarm is for interaction indices only; "
        "tree: exact TreeSHAP (path-dependent; interventional with background rows); "
        "partition: Owen values over a hierarchy of players (image patches by position, words "
        "in order; shap's PartitionExplainer), never chosen by auto; surrogate_kernel: "
        "cubic-surrogate-adjusted KernelSHAP (inspired by Witter et al. 2025, not their "
        "unbiased estimator); regression: its old name, accepted for this release only "
        "(answered and echoed as surrogate_kernel, with a deprecated_name warning); msr: "
        "Witter et al. (2025)'s Tree MSR, an XGBoost surrogate's exact Shapley values plus an "
        "unbiased Monte Carlo estimate of the residual (cross-fitted: error_std is the "
        "residual's Monte Carlo error), never chosen by auto",
    )
    output: Annotated[Literal["auto", "prediction", "margin"], ARRAYS] = Field(
        "auto",
        description="the explained output space: prediction (class probabilities, or the "
        "regression output) or margin (tree models' raw score: log-odds for classifiers, log for "
        "log-link regressors; meta.parameters.output_space says which); auto: margin for tree "
        "models, prediction otherwise",
    )
    index: Annotated[
        Literal["SV", "SII", "k-SII", "STII", "FSII", "FBII", "API"], EVERYWHERE
    ] = Field(
        "SV",
        description="SV: Shapley values; API: aggregated positive interactions (not additive); "
        "otherwise an interaction index up to max_order",
    )
    api_variant: Annotated[Literal["chain", "moebius"], API_ONLY] = Field(
        "chain", description="API rule: positive pairwise chain terms, or positive Möbius shares"
    )
    max_order: Annotated[int, INTERACTION_ORDER] = Field(
        2, ge=1, le=4, description="highest interaction order (not for SV)"
    )
    sampler: Annotated[SamplerName, EVERYWHERE] = Field(
        "kernel", description="coalition sampler of the kernel estimator"
    )
    masker: Annotated[MaskerOptions | None, ARRAYS] = Field(
        None,
        description="default: background for tabular models (and whenever a request sends "
        "one); for images blur when a side exceeds 32 px, else a zero baseline",
    )
    patch_size: Annotated[int | None, PATCHES] = Field(
        None,
        ge=1,
        le=512,
        description="image players 'patches': side of a square patch (edge patches smaller); "
        "default max(2, ceil(max(H, W) / 16)): at most 16 x 16 patches; echoed as resolved",
    )
    n_segments: Annotated[int, SUPERPIXELS] = Field(
        100,
        ge=8,
        le=1024,
        description="image players 'superpixels': about this many SLIC superpixels",
    )
    return_baseline: Annotated[bool, ARRAYS] = Field(
        False,
        description="baseline and blur maskers: each explanation's details.baseline is the "
        "reference row, in the input's shape (meta.parameters echoes only its digest)",
    )
    audit_reference: Annotated[list[Any] | None, NOT_ECHOED] = Field(
        None,
        min_length=2,
        max_length=audit.MAX_REFERENCE_ROWS,
        description="with a request background: rows (as inputs) of the data the background "
        "should represent, for meta.background_audit; default: the model's training split",
    )
    players: Annotated[
        Literal["auto", "words", "tokens", "patches", "superpixels"], PLAYERS
    ] = Field(
        "auto",
        description="text models: the words (punctuation stays in place; auto) or the "
        "tokenizer's tokens; image models: square patches (auto) or SLIC superpixels of each "
        "image (details.segments: the segmentation, run-length encoded); echoed as resolved",
    )
    absence: Annotated[Literal["delete", "mask"], TEXTS] = Field(
        "delete",
        description="text models: an absent player is deleted, or replaced by the model's mask "
        "token",
    )
    target_se: Annotated[float | None, EVERYWHERE] = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="sampled Shapley values (index SV): sample in rounds until every error_std "
        "of the explained output is at most this, or the budget is spent (meta.precision); "
        "without a budget, a generous one (64x the default, at most MAX_BUDGET)",
    )


@dataclass(frozen=True)
class _Plan:
    """Per instance a game and its text players; the player names; the values resolved for the
    echo (they also decide which options apply: players 'auto' -> 'patches'); per instance the
    details an explanation carries (superpixel segments, the baseline)."""

    games: list[tuple[Game, int, tuple[Span, ...] | None]]  # (game, n_players, text players)
    names: tuple[str, ...]
    resolved: dict[str, Any]
    budget: int  # per instance, after defaults
    cost: int  # model rows per coalition
    details: tuple[dict[str, Any] | None, ...] = ()  # per instance; empty: none


HIERARCHY_UP_TO = 4096  # players: a spatial hierarchy for every game (else only for partition)


def _image_players(
    model: Model, inputs: np.ndarray, options: ShapleyOptions, players: str
) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[str], dict[str, Any]]:
    """Per instance (feature groups [d], pixel players [H, W]), the player names and the values
    resolved for the echo."""
    shape = tuple(model.input_shape)
    height, width = shape[-2], shape[-1]
    if players == "superpixels":
        maps = [superpixels.slic_players(x, options.n_segments) for x in inputs]
        groups = [(superpixels.feature_groups(m, shape), m) for m in maps]
        most = max(int(m.max()) + 1 for m in maps)
        names = [f"superpixel_{i}" for i in range(most)]
        return groups, names, {"players": players}
    size = options.patch_size or patch_default(shape)
    flat, names = patch_groups(shape, size)
    pixel = flat[: height * width].reshape(height, width)  # channel 0's: every channel's
    return [(flat, pixel)] * len(inputs), names, {"players": players, "patch_size": size}


def _array_plan(
    model: Model,
    inputs: np.ndarray,
    options: ShapleyOptions,
    budget: int | None,
    background: np.ndarray | None,
) -> _Plan:
    """Tabular and image models: masked-model games over features, patches or superpixels."""
    image = model.modality == Modality.IMAGE
    players = "patches" if options.players == "auto" else options.players
    if image and players not in ("patches", "superpixels"):
        raise OptionError(f"players {players!r} apply to text models; images take patches or "
                          "superpixels")  # fmt: skip
    options.check_applies(model.modality, values={"players": players})
    masking = resolve(model, options.masker or default_masker(model, background), background)
    if options.return_baseline and masking.rows is not None and masking.kind == "background":
        raise OptionError(
            "return_baseline applies to the baseline and blur maskers (background rows are "
            "the request's or the model's own)"
        )
    resolved: dict[str, Any] = {}
    if image:
        per_instance, names, resolved = _image_players(model, inputs, options, players)
    else:
        flat = np.arange(model.n_features)
        per_instance, names = [(flat, flat)] * len(inputs), list(model.feature_names)
    n_players, cost = len(names), masking.cost
    if budget is None:
        budget = default_budget(n_players, cost, options.estimator, options.target_se is not None)
    space = shapley_trees.output_space(model, options.output)
    predict = model.tree.margin if space == "margin" and model.tree is not None else model.predict
    rows_per_pass = model.rows_per_pass()
    games: list[tuple[Game, int, tuple[Span, ...] | None]] = []
    details: list[dict[str, Any] | None] = []
    trees: dict[int, Any] = {}
    for x, (groups, pixel) in zip(inputs, per_instance, strict=True):
        refs = masking.references(model, x)
        n = int(groups.max()) + 1
        tree = None
        if image and (n <= HIERARCHY_UP_TO or options.estimator == "partition"):
            if id(pixel) not in trees:  # patches: one map, one hierarchy for every instance
                trees[id(pixel)] = spatial_hierarchy(pixel)
            tree = trees[id(pixel)]
        game = MaskedModelGame(predict, x, refs, groups, rows_per_pass, model.input_dtype, tree)
        games.append((game, n, None))
        extra: dict[str, Any] = {}
        if resolved.get("players") == "superpixels":
            extra["segments"] = superpixels.encode(pixel)
        if options.return_baseline:
            extra["baseline"] = refs[0].astype(np.float64).tolist()
        details.append(extra or None)
    resolved.update(masker=masking.echo, output=space, **shapley_trees.space_label(model, space))
    return _Plan(games, tuple(names), resolved, budget, cost, tuple(details))


def _text_plan(
    model: TextModel, inputs: np.ndarray, options: ShapleyOptions, budget: int | None
) -> _Plan:
    """Text models: one game per text over its own words or tokens; the budget fits the longest."""
    options.check_applies(model.modality)
    players = "words" if options.players == "auto" else options.players
    if players not in ("words", "tokens"):
        raise OptionError(f"players {players!r} apply to image models; texts take words or "
                          "tokens")  # fmt: skip
    games: list[tuple[Game, int, tuple[Span, ...] | None]] = [
        (game, game.n_players, game.pieces)
        for game in text_game.text_games(model, inputs, players, options.absence)
    ]
    longest = max(n for _, n, _ in games)
    if budget is None:
        budget = default_budget(longest, 1, options.estimator, options.target_se is not None)
    resolved: dict[str, Any] = {"players": players}
    if options.absence == "mask":
        resolved["mask_token"] = model.mask_token
    return _Plan(games, (), resolved, budget, 1)


def explain(
    model: Model,
    inputs: np.ndarray,
    *,
    options: ShapleyOptions,
    target: int | tuple[int, ...] | None = None,
    seed: int = 0,
    budget: int | None = None,
    background: np.ndarray | None = None,
) -> ExplainResult:
    """Shapley explanations of `inputs` (model.predict's rows: arrays, or texts) for one output,
    or with a tuple `target` for each of several (instance-major: x0's outputs, then x1's)."""
    reference = _audit_reference(model, options, background)  # fail before any model call
    caveats: tuple[Caveat, ...] = ()
    if model.tree is not None or options.estimator == "tree" or options.output == "margin":
        space = shapley_trees.output_space(model, options.output)
        masker = None if options.masker is None else options.masker.type
        mode, reason = shapley_trees.tree_mode(
            model, space, options.index, options.max_order, masker, background is not None
        )
        if options.estimator == "tree" and reason is not None:
            raise OptionError(reason)
        if options.estimator in ("auto", "tree") and mode is not None:
            try:
                return _tree_result(
                    model, inputs, options, target, mode, background, seed, reference
                )
            except InterventionalUnavailable as exc:  # found out by computing: said, fallen back
                if options.estimator == "tree":
                    raise
                reason = str(exc)
        if model.tree is not None and options.estimator == "auto" and reason is not None:
            caveats = (Caveat("estimator_fallback", f"not TreeSHAP: {reason}"),)
    if isinstance(model, TextModel):
        if background is not None:
            raise OptionError("text models take no background: absent words are deleted or masked")
        plan = _text_plan(model, inputs, options, budget)
    else:
        plan = _array_plan(model, inputs, options, budget, background)
    if options.target_se is not None and options.index != "SV":
        raise OptionError("target_se applies to Shapley values (index SV)")
    sizes = [(game, n) for game, n, _ in plan.games]
    if options.index == "SV":  # the estimator, once per request, before any model call
        chosen = runs.choices(options, model, sizes, plan.budget)
    explain_one = {"SV": runs.shapley_one, "API": runs.api_one}.get(
        options.index, runs.interactions_one
    )
    if any(not 0 <= t < model.n_outputs for t in runs.wanted(target) if t is not None):
        raise OptionError(f"target out of range for {model.n_outputs} outputs")
    if options.index != "SV":  # interaction indices and API: after the target's check
        chosen = runs.choices(options, model, sizes, plan.budget)
    run = runs.Run(options, plan.budget, seed, model, target, chosen)
    explanations = []
    extras = plan.details or (None,) * len(plan.games)
    for (game, n_players, players), extra in zip(plan.games, extras, strict=True):
        for explanation in explain_one(game, n_players, run):
            if not 0 <= explanation.output_index < model.n_outputs:
                raise OptionError(f"target out of range for {model.n_outputs} outputs")
            details = explanation.details
            if extra:
                details = {**(details or {}), **extra}
            explanations.append(
                replace(
                    explanation,
                    players=players,
                    warnings=explanation.warnings + caveats,
                    details=details,
                )
            )
    resolved = {"players": plan.resolved.get("players")}  # players 'auto' as resolved
    echo = {**options.echo(model.modality, values=resolved), **plan.resolved}
    echo["estimator"] = canonical_estimator(options.estimator)  # an old name: the new one
    additive = options.index in interactions.EFFICIENT
    meta: dict[str, Any] = {}
    if isinstance(target, tuple):  # SV and API: every output from one estimate per instance
        meta["targets"] = {"budget": "shared" if options.index in ("SV", "API") else "per target"}
    if background is not None:
        outputs = sorted({e.output_index for e in explanations})
        meta["background_audit"] = _audit(model, background, outputs, seed, reference)
    if options.target_se is not None:
        meta["precision"] = _precision(options.target_se, explanations)
    return ExplainResult(tuple(explanations), plan.names, echo, plan.budget, additive, meta)


def _tree_result(
    model: Model,
    inputs: np.ndarray,
    options: ShapleyOptions,
    target: int | tuple[int, ...] | None,
    mode: str,
    background: np.ndarray | None,
    seed: int,
    reference: np.ndarray | None,
) -> ExplainResult:
    """Exact TreeSHAP: path-dependent by the booster's own library (the raw margin), or
    interventional against background rows by shap (the margin or the prediction)."""
    space = shapley_trees.output_space(model, options.output)
    rows, masker = None, shapley_trees.PATH_DEPENDENT
    if mode == "interventional":
        rows, masker = shapley_trees.interventional_rows(model, background)
    explanations = shapley_trees.tree_explanations(
        model, inputs, options.index, target, space, rows
    )
    # TreeSHAP samples nothing and masks with no baseline: sampler and return_baseline are
    # left out of its echo (the one rule here beyond the options' own declarations)
    echo = options.echo(model.modality, drop={"sampler", "return_baseline"})
    echo.update(estimator="tree", output=space, masker=masker)
    echo.update(shapley_trees.space_label(model, space))
    meta: dict[str, Any] = {}
    if background is not None:
        outputs = sorted({e.output_index for e in explanations})
        meta["background_audit"] = _audit(model, background, outputs, seed, reference)
    return ExplainResult(
        tuple(explanations),
        tuple(model.feature_names),
        echo,
        budget=1 if rows is None else len(rows) + 1,
        additive=options.index == "SV",
        meta=meta,
    )


def _audit_reference(
    model: Model, options: ShapleyOptions, background: np.ndarray | None
) -> np.ndarray | None:
    """The request's parameters.audit_reference as rows, checked (None when not sent)."""
    if options.audit_reference is None:
        return None
    if background is None:
        raise OptionError(
            "audit_reference is the data a request background is audited against; "
            "send a background too"
        )
    return audit.reference_rows(model, options.audit_reference)


def _audit(
    model: Model,
    background: np.ndarray,
    outputs: list[int],
    seed: int,
    reference: np.ndarray | None = None,
) -> dict[str, Any] | None:
    """Fool-SHAP tests of a supplied background against reference data (Holm-corrected over
    every test of every explained output): `reference` (parameters.audit_reference), else the
    model's training split, else its default background."""
    source = f"parameters.audit_reference ({0 if reference is None else len(reference)} rows)"
    if reference is None:
        reference = model.reference if model.reference is not None else model.background
        source = "training split" if model.reference is not None else "model background"
    if reference is None:
        return None
    f_bg, f_ref = model.predict(background), model.predict(reference)
    result = audit.audit_outputs(
        f_bg[:, outputs], f_ref[:, outputs], np.random.default_rng(seed), output_indices=outputs
    )
    return {**result, "n_model_evals": len(background) + len(reference), "reference": source}


def _precision(target_se: float, explanations: list[Explanation]) -> dict[str, Any]:
    """meta.precision: the worst instance (each explanation has its own in details)."""
    each = [e.details["precision"] for e in explanations if e.details and "precision" in e.details]
    return {
        "target_se": target_se,
        "reached": all(p["reached"] for p in each),
        "max_error_std": max((p["max_error_std"] for p in each), default=0.0),
        "rounds": max((p["rounds"] for p in each), default=0),
    }


__all__ = [
    "ESTIMATORS",
    "ExplainerError",
    "ShapleyOptions",
    "choose_estimator",
    "explain",
    "shapley_values",
]
