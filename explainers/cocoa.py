"""COCOA: contrastive corpus attribution for explaining representations.

Lin, Chen, Kim & Lee, "Contrastive Corpus Attribution for Explaining Representations" (ICLR 2023).
The explained scalar of an explicand x is its contrastive corpus similarity
s(x) = mean_c sim(f(x), f(c)) - mean_o sim(f(x), f(o)) over a corpus C and a foil F, computed as
f(x) . (mu_C - mu_F) with mu the mean (unit-normalised for cosine) corpus and foil embeddings.
Any attribution method applies to s: Shapley values of patches or words through our estimators,
or integrated gradients (Sundararajan et al. 2017; explainers/gradients/integrated.py, tested equal
to captum's) for differentiable encoders.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from explainers.context import KeyValueStore, RunContext
from explainers.estimators.budget import default_budget
from explainers.estimators.library import shapley_values_chosen
from explainers.estimators.registry import (
    Ask,
    EstimatorChoice,
    SamplerName,
    canonical_estimator,
    choose,
)
from explainers.explanation import ExplainResult, Explanation, OptionError, Span
from explainers.games.absence import Absence, is_image, references
from explainers.games.deadlines import check_deadline
from explainers.games.masked import MaskedModelGame, patch_groups
from explainers.games.targets import Similarity as Target
from explainers.games.targets import unit as _unit
from explainers.games.text import TextGame, token_spans, word_spans
from explainers.options import ARRAYS, EVERYWHERE, TEXTS, ExplainerOptions, applies
from explainers.shapley.runs import pick
from models.base import Model, TextModel
from models.modality import Modality

VERSION = "2"  # 2: one blur for every explainer (edges repeated; images only)
MAX_SET = 5000  # rows in a corpus or foil
log = logging.getLogger(__name__)

# Where the options apply (explainers/options.py): by the encoder's inputs (texts, images or
# rows), by the method, and foil_size only to foil 'auto' (the request's foil, passed as a value)
SHAPLEY = applies(when={"method": ["shapley"]})
SHAPLEY_ARRAYS = applies(Modality.TABULAR, Modality.IMAGE, when={"method": ["shapley"]})
GRADIENTS = applies(when={"method": ["integrated_gradients"]})
AUTO_FOIL = applies(when={"foil": ["auto"]})


class CocoaFields(BaseModel):
    """COCOA's own request fields: the corpus and the foil (the explicands are `inputs`)."""

    corpus: list[Any] = Field(
        ...,
        min_length=1,
        max_length=MAX_SET,
        description="inputs of the model (rows, images or texts) that define the concept",
    )
    foil: list[Any] | Literal["auto"] = Field(
        "auto",
        description="inputs to contrast with, or 'auto': a seeded sample of the model's "
        "reference pool that excludes the corpus",
    )


class CocoaOptions(ExplainerOptions):
    """Options of the `cocoa` explainer."""
    objective: Annotated[Literal["contrastive", "corpus", "explicand"], EVERYWHERE] = Field(
        "contrastive",
        description="contrastive: corpus minus foil similarity (COCOA); corpus: corpus "
        "similarity only; explicand: similarity to the explicand's own embedding (label-free, "
        "for comparison)",
    )
    similarity: Annotated[Literal["cosine", "dot"], EVERYWHERE] = Field(
        "cosine", description="similarity of embeddings"
    )
    method: Annotated[Literal["shapley", "integrated_gradients"], EVERYWHERE] = Field(
        "shapley",
        description="shapley: patches or words through our estimators; integrated_gradients: "
        "per input feature, differentiable (non-text) encoders only",
    )
    foil_size: Annotated[int, AUTO_FOIL] = Field(
        1500, ge=1, le=MAX_SET, description="foil='auto': rows sampled (paper: 1500)"
    )
    estimator: Annotated[EstimatorChoice, SHAPLEY] = Field(
        "auto",
        description="shapley: exact when 2^n coalitions fit the budget, else KernelSHAP; "
        "regression: surrogate_kernel's old name, accepted for this release only",
    )
    sampler: Annotated[SamplerName, SHAPLEY] = Field("kernel", description="kernel sampler")
    patch_size: Annotated[int, SHAPLEY_ARRAYS] = Field(
        2, ge=1, le=64, description="images, shapley: side of a patch"
    )
    baseline: Annotated[Literal["zero", "blur", "mean"], ARRAYS] = Field(
        "zero",
        description="arrays: value of an absent patch (shapley) or the path start "
        "(integrated_gradients): zeros, a Gaussian blur of the input, or the mean of the "
        "model's background [ours: zero; the paper blurs large images]",
    )
    blur_sigma: Annotated[float, ARRAYS] = Field(
        1.0, gt=0, le=16, description="baseline='blur': sigma in pixels"
    )
    steps: Annotated[int, GRADIENTS] = Field(
        50, ge=2, le=1000, description="integrated_gradients: path points"
    )
    players: Annotated[Literal["words", "tokens"], TEXTS] = Field(
        "words", description="texts: the players"
    )
    absence: Annotated[Literal["delete", "mask"], TEXTS] = Field(
        "delete", description="texts: an absent word is deleted or replaced by the mask token"
    )


def _digest(model: Model, rows: np.ndarray) -> str:
    h = hashlib.sha256(f"{model.name}\0{model.version}\0".encode())
    if rows.dtype.kind == "U":
        h.update(json.dumps(rows.tolist()).encode())
    else:
        h.update(str(rows.shape).encode() + np.ascontiguousarray(rows).tobytes())
    return h.hexdigest()


def rows_of(model: Model, items: Sequence[Any], where: str) -> np.ndarray:
    """JSON rows -> the model's native rows (str [m] for text, float32 [m, *shape])."""
    if isinstance(model, TextModel):
        for i, t in enumerate(items):
            if not isinstance(t, str) or not t.strip() or len(t) > model.max_chars or "\x00" in t:
                raise OptionError(
                    f"{where}[{i}]: expected a non-empty string of at most {model.max_chars} "
                    "characters"
                )
        return np.array(list(items), dtype=str)
    out = []
    for i, item in enumerate(items):
        if isinstance(item, bool) or (isinstance(item, list) and _has_bool(item)):
            raise OptionError(f"{where}[{i}]: expected numbers")
        try:
            arr = np.asarray(item, dtype=np.float64)
        except (TypeError, ValueError):
            raise OptionError(f"{where}[{i}]: expected numbers in a regular nested list") from None
        if arr.size != model.n_features or not np.all(np.isfinite(arr)):
            raise OptionError(
                f"{where}[{i}]: expected {model.n_features} finite numbers (shape "
                f"{list(model.input_shape)}), got {arr.size}"
            )
        out.append(arr.astype(np.float32).reshape(model.input_shape))
    return np.stack(out)


def _has_bool(item: Any) -> bool:
    return isinstance(item, bool) or (isinstance(item, list) and any(_has_bool(v) for v in item))


def _embed(model: Model, rows: np.ndarray) -> np.ndarray:
    """Embeddings, batched. float64 [m, d]"""
    step = max(1, model.batch_size)
    parts = []
    for s in range(0, len(rows), step):
        check_deadline()  # a corpus of many rows: cancel and deadline seen between batches
        parts.append(model.predict(rows[s : s + step]))
    return np.concatenate(parts).astype(np.float64)


def mean_embedding(
    model: Model, rows: np.ndarray, normalize: bool, store: KeyValueStore | None = None
) -> tuple[np.ndarray, str]:
    """Mean (unit-normalised first when `normalize`) embedding of rows, and the cache status."""
    key = f"cocoa:mean:v1:{int(normalize)}:{_digest(model, rows)}"
    if store is not None:
        try:
            hit = store.get(key)
        except Exception as exc:  # a cache outage only costs time: compute it instead
            log.warning("embedding cache unavailable: %s", exc)
            hit, store = None, None
        if hit is not None:
            return np.array(json.loads(hit), dtype=np.float64), "hit"
    e = _embed(model, rows)
    mean = (_unit(e) if normalize else e).mean(axis=0)
    if store is None:
        return mean, "none"
    try:
        store.set(key, json.dumps(mean.tolist()))
    except Exception as exc:  # best effort, as above
        log.warning("embedding cache unavailable: %s", exc)
        return mean, "none"
    return mean, "miss"


def pairwise_score(
    model: Model, x: np.ndarray, corpus: np.ndarray, foil: np.ndarray, similarity: str
) -> np.ndarray:
    """s(x) from every explicand-corpus and explicand-foil pair (the definition; slow). [m]"""
    ex, ec, ef = _embed(model, x), _embed(model, corpus), _embed(model, foil)
    if similarity == "cosine":
        ex, ec, ef = _unit(ex), _unit(ec), _unit(ef)
    return (ex @ ec.T).mean(axis=1) - (ex @ ef.T).mean(axis=1)


def _auto_foil(model: Model, corpus: np.ndarray, size: int, seed: int) -> np.ndarray:
    pool = model.reference
    if pool is None:
        raise OptionError(f"{model.name} has no reference pool for foil='auto'; send a foil")
    taken = {_digest(model, corpus[i : i + 1]) for i in range(len(corpus))}
    keep = [i for i in range(len(pool)) if _digest(model, pool[i : i + 1]) not in taken]
    if not keep:
        raise OptionError("the corpus holds the whole reference pool; send a foil")
    rng = np.random.default_rng(seed)
    pick = rng.choice(np.array(keep), size=min(size, len(keep)), replace=False)
    return pool[np.sort(pick)]


def _baseline(model: Model, x: np.ndarray, options: CocoaOptions) -> np.ndarray:
    """The reference input for absent features (games/absence.py). float32 [*shape]"""
    absence = Absence(options.baseline, sigma=options.blur_sigma)
    return references(model, x, absence, None, "baseline")[0].astype(np.float32)


def _integrated_gradients(
    model: Model, x: np.ndarray, baseline: np.ndarray, target: Target, steps: int
) -> np.ndarray:
    """IG of target(f(.)) from baseline to x per input feature (explainers/gradients/integrated.py,
    Gauss-Legendre as captum's default). Inputs move to the model's device (a no-op on the
    CPU); gradients flow back to them through the move. float64 [n_features]"""
    from explainers.gradients.integrated import backward_rows, integrated_gradients

    module, device = model.torch_module(), model.device

    def score(inp: Any) -> Any:  # [m, *shape] -> [m, 1], on the model's device
        return target.torch(module(inp.to(device)).reshape(inp.shape[0], -1))[:, None]

    x64 = np.asarray(x, dtype=np.float64)
    base = np.asarray(baseline, dtype=np.float64)[None]
    rows = backward_rows(model, model.batch_size)[0]  # backward passes, from MAX_BATCH_BYTES
    values = integrated_gradients(score, x64, base, 0, steps, "gausslegendre", rows)
    return values.reshape(-1)


def _check(model: Model, options: CocoaOptions, target: int | None, background: Any) -> None:
    if model.modality != Modality.ENCODER:
        raise OptionError(f"cocoa explains encoders; {model.name!r} is a {model.modality} model")
    if target is not None:
        raise OptionError("cocoa explains a similarity of embeddings; target does not apply")
    if background is not None:
        raise OptionError("cocoa takes no background; use parameters.baseline")
    is_text = isinstance(model, TextModel)
    if is_text and options.method == "integrated_gradients":
        raise OptionError("integrated_gradients needs an encoder of arrays; use method='shapley'")
    options.check_applies(inputs_of(model), noun="encoders")


def inputs_of(model: Model) -> Modality:
    """What an encoder embeds (which options apply): texts, images or rows."""
    if isinstance(model, TextModel):
        return Modality.TEXT
    return Modality.IMAGE if is_image(model) else Modality.TABULAR


def explain(
    model: Model,
    inputs: np.ndarray,
    *,
    options: CocoaOptions,
    corpus: list[Any],
    foil: list[Any] | str = "auto",
    target: int | None = None,
    seed: int = 0,
    budget: int | None = None,
    background: np.ndarray | None = None,
    context: RunContext | None = None,
) -> ExplainResult:
    """COCOA attributions of explicands `inputs` (the model's native rows); corpus and foil
    mean embeddings are cached in `context.store` when there is one."""
    _check(model, options, target, background)
    store = None if context is None else context.store
    normalize = options.similarity == "cosine"
    corpus_rows = rows_of(model, corpus, "corpus")
    if foil == "auto":
        foil_rows = _auto_foil(model, corpus_rows, options.foil_size, seed)
        foil_echo = {"source": "auto", "rows": len(foil_rows), "seed": seed}
    elif isinstance(foil, list) and foil:
        foil_rows = rows_of(model, foil, "foil")
        foil_echo = {"source": "request", "rows": len(foil_rows)}
    else:
        raise OptionError("foil must be a non-empty list of inputs or 'auto'")
    mu_c, c_status = mean_embedding(model, corpus_rows, normalize, store)
    mu_f, f_status = mean_embedding(model, foil_rows, normalize, store)
    contrast = Target(mu_c - mu_f, normalize)
    explanations = []
    names: tuple[str, ...] = ()
    for x in inputs:
        check_deadline()
        e_x = _embed(model, np.asarray(x)[None])  # [1, d]
        if options.objective == "contrastive":
            tgt = contrast
        elif options.objective == "corpus":
            tgt = Target(mu_c, normalize)
        else:
            tgt = Target((_unit(e_x) if normalize else e_x)[0], normalize)
        details = {
            "objective": options.objective,
            "contrastive_similarity": float(contrast(e_x)[0]),
            "corpus_similarity": float(Target(mu_c, normalize)(e_x)[0]),
            "foil_similarity": float(Target(mu_f, normalize)(e_x)[0]),
        }
        if options.method == "integrated_gradients":
            base = _baseline(model, x, options)
            values = _integrated_gradients(model, x, base, tgt, options.steps)
            f_base, f_x = float(tgt(_embed(model, base[None]))[0]), float(tgt(e_x)[0])
            steps = options.steps + 2
            ig = Explanation(0, values, f_base, f_x, False, steps, "integrated_gradients")
            name = f"{options.objective} similarity"
            explanations.append(replace(ig, details=details, output_name=name))
            names = tuple(model.feature_names)
            continue
        explanation, names = _shapley_one(model, x, tgt, options, budget, seed, details)
        explanations.append(explanation)
    n_max = max(len(e.values) for e in explanations)
    if budget is None:
        budget = (
            options.steps + 2
            if options.method == "integrated_gradients"
            else default_budget(n_max, 1, options.estimator)
        )
    echo = options.echo(inputs_of(model), values={"foil": "auto" if foil == "auto" else "sent"})
    if "estimator" in echo:
        echo["estimator"] = canonical_estimator(options.estimator)  # an old name: the new one
    meta = {
        "corpus": {"rows": len(corpus_rows), "embedding_cache": c_status},
        "foil": {**foil_echo, "embedding_cache": f_status},
    }
    additive = options.method == "shapley"
    return ExplainResult(tuple(explanations), names, echo, budget, additive, meta)


def _shapley_one(
    model: Model,
    x: np.ndarray,
    tgt: Target,
    options: CocoaOptions,
    budget: int | None,
    seed: int,
    details: dict[str, Any],
) -> tuple[Explanation, tuple[str, ...]]:
    """Shapley values of the explicand's patches (arrays) or words/tokens (texts) for tgt."""
    scored: Callable[[Any], np.ndarray]
    names: tuple[str, ...] = ()
    players: tuple[Span, ...] | None = None
    if isinstance(model, TextModel):
        text = str(x)
        pieces = (
            word_spans(text)
            if options.players == "words"
            else token_spans(text, model.token_spans(text))
        )
        if not pieces:
            raise OptionError(f"an explicand has no {options.players} to explain")

        def scored(texts: Any) -> np.ndarray:
            return tgt(model.predict(list(texts)))[:, None]

        game: Any = TextGame(scored, text, pieces, options.absence, model.mask_token)
        n, players = len(pieces), tuple(pieces)
    else:
        groups, patch_names = (
            patch_groups(model.input_shape, options.patch_size)
            if len(model.input_shape) >= 2
            else (np.arange(model.n_features), list(model.feature_names))
        )

        def scored(rows: Any) -> np.ndarray:
            return tgt(model.predict(rows))[:, None]

        ref = _baseline(model, x, options)[None]
        game = MaskedModelGame(scored, x, ref, groups, model.rows_per_pass())
        n, names = len(patch_names), tuple(patch_names)
    b = default_budget(n, 1, options.estimator) if budget is None else budget
    choice = choose(Ask(), options.estimator, n, b, 1)  # before any model call
    est, how = shapley_values_chosen(game, n, seed=seed, sampler=options.sampler, choice=choice)
    est = replace(est, values=np.asarray(est.values).reshape(n, -1))  # [n, 1] for pick
    if how is not None:  # auto: what it measured and why it chose (details.auto)
        details = {**details, "auto": how}
    explanation = pick(est, model, 0)
    name = f"{options.objective} similarity"
    return replace(explanation, players=players, details=details, output_name=name), names


__all__ = [
    "CocoaFields",
    "CocoaOptions",
    "KeyValueStore",
    "explain",
    "mean_embedding",
    "pairwise_score",
]
