"""The evaluate service: POST /v2/models/{model}/evaluate's (its route: app/routes.py) and the
`parameters.evaluate` hook of every explain route.

Faithfulness (deletion/insertion AUC, MuFidelity) and stability (max-sensitivity) of
attributions; the science is explainers/trust/evaluation.py.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.errors import ApiError, InvalidInput, PayloadTooLarge, from_library
from app.inputs import default_target, resolve_target, to_array
from app.schemas import request_model, spec_fields
from explainers.context import RunContext
from explainers.explanation import ExplainResult, Explanation
from explainers.games import ExplainerError
from explainers.games.text import text_games
from explainers.registry import ExplainerSpec
from explainers.trust.evaluation import EvaluateOptions, Metric, evaluate
from explainers.trust.evaluation import evaluate_result as _evaluate_result
from models.base import Model, ModelError, TextModel

if TYPE_CHECKING:
    from app.service import ExplainService, Prepared


def as_options(value: list[Metric] | EvaluateOptions | None) -> EvaluateOptions | None:
    """`parameters.evaluate` is a list of metric names or the full options object."""
    if value is None or isinstance(value, EvaluateOptions):
        return value
    return EvaluateOptions(metrics=list(dict.fromkeys(value)))


def split_evaluate(spec: ExplainerSpec, params: Any) -> tuple[Any, EvaluateOptions | None]:
    """The explainer's own options (unset fields kept unset) and `parameters.evaluate`."""
    if "evaluate" in spec.options.model_fields or "evaluate" not in type(params).model_fields:
        return params, None
    evaluate = as_options(params.evaluate)
    if evaluate is not None and not spec.uses_inputs:
        raise InvalidInput(f"{spec.name} explains its own fields, not model inputs: no evaluate")
    own = spec.options.model_construct(
        params.model_fields_set - {"evaluate", "allow_out_of_range"},
        **{k: getattr(params, k) for k in spec.options.model_fields},
    )
    return own, evaluate


def attach_evaluation(p: Prepared, result: ExplainResult, context: RunContext) -> ExplainResult:
    """Figures for a computed explanation (the explain hook); sensitivity re-runs its explainer."""
    spec, req = p.spec, p.req
    if p.evaluate is None:
        return result

    def rerun(xs: np.ndarray, out: int) -> np.ndarray:
        again = spec.explain(replace(p.request(context), inputs=xs, target=out))
        return np.stack([e.values for e in again.explanations])

    return _evaluate_result(
        p.model,
        p.inputs,
        result,
        p.evaluate,
        seed=req.seed,
        background=p.background,
        rerun=rerun,
    )


class ExplainerCall(BaseModel):
    """An explain request to run first; its attributions are evaluated."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., description="explainer name, as in GET /v2/explainers")
    parameters: dict[str, Any] = Field(default_factory=dict, description="its options")
    budget: int | None = Field(None, ge=1)


class EvaluateRequest(BaseModel):
    """Inputs plus their attributions, or an explainer to compute them."""

    model_config = ConfigDict(extra="forbid")
    inputs: list[Any] = Field(..., min_length=1, description="instances, as for explain")
    attributions: list[list[float]] | None = Field(
        None,
        description="one row per input: a value per feature (pixel), per image patch "
        "(give patch_size) or per word of a text (see players)",
    )
    explainer: ExplainerCall | None = Field(None, description="instead of attributions")
    target: int | str | None = Field(
        None, description="the output the attributions explain; default: the predicted class"
    )
    patch_size: int | None = Field(None, ge=1, le=64, description="image patch attributions")
    players: Literal["words", "tokens"] = Field(
        "words", description="text attributions: one value per word or per token"
    )
    background: list[Any] | None = Field(None, description="rows for mean/background removal")
    seed: int = Field(0, ge=0, le=2**32 - 1)
    evaluation: EvaluateOptions = Field(default_factory=EvaluateOptions)
    id: str | None = Field(None, max_length=200)


class EvaluationOut(BaseModel):
    output_index: int
    deletion_auc: float | None = Field(None, description="lower is better")
    insertion_auc: float | None = Field(None, description="higher is better")
    insertion_minus_deletion: float | None = None
    mufidelity: float | None = Field(None, description="Pearson correlation, 1 is best")
    sensitivity: dict[str, float] | None = Field(None, description="max and mean, lower is better")
    deletion_curve: dict[str, list[float]] | None = None
    insertion_curve: dict[str, list[float]] | None = None
    n_model_evals: int


class EvaluateResponse(BaseModel):
    model_name: str
    model_version: str
    id: str
    meta: dict[str, Any] = Field(
        ..., description="parameters (after defaults), n_model_evals, compute_ms, explain meta"
    )
    evaluations: list[EvaluationOut]


def _supplied(
    model: Model, inputs: np.ndarray, body: EvaluateRequest
) -> tuple[list[Explanation], int | None]:
    rows = body.attributions or []
    if len(rows) != len(inputs):
        raise InvalidInput(f"attributions need one row per input ({len(inputs)})")
    target = resolve_target(model, body.target)
    if body.target is None:
        target = default_target(model)
    if target is None:
        predicted = model.predict(inputs)
        outs = [int(np.argmax(r)) if model.task == "classification" else 0 for r in predicted]
    else:
        outs = [target] * len(inputs)
    players: list[Any] = [None] * len(inputs)
    if isinstance(model, TextModel):
        games = text_games(model, inputs, body.players)
        players = [g.pieces for g in games]
    values = [np.asarray(r, dtype=np.float64) for r in rows]
    if not all(np.all(np.isfinite(v)) for v in values):
        raise InvalidInput("attributions must be finite numbers")
    return [
        Explanation(out, v, 0.0, 0.0, False, 0, "supplied", players=ps)
        for out, v, ps in zip(outs, values, players, strict=True)
    ], body.patch_size


def run_evaluation(svc: ExplainService, name: str, body: EvaluateRequest) -> dict[str, Any]:
    start = time.perf_counter()
    model = svc.model(name)
    if (body.attributions is None) == (body.explainer is None):
        raise InvalidInput("send either attributions or explainer", code="invalid_input")
    if len(body.inputs) > svc.settings.max_instances:
        raise PayloadTooLarge(f"at most {svc.settings.max_instances} instances per request")
    options = body.evaluation
    if body.explainer is not None:
        spec = svc.explainer(model, body.explainer.name)
        if spec_fields(spec):
            raise InvalidInput(f"{spec.name} takes its own fields; evaluate it via explain")
        raw = {
            "inputs": body.inputs,
            "target": body.target,
            "seed": body.seed,
            "budget": body.explainer.budget,
            "background": body.background,
            "parameters": {**body.explainer.parameters, "evaluate": options.model_dump()},
        }
        try:
            req = request_model(spec).model_validate(raw)
        except ValidationError as exc:
            raise ApiError(
                f"explainer: {exc.errors()[0]['msg']}", code="validation_error"
            ).with_status(422) from None
        from app.service import Outcome  # app.service imports this module

        # Bounded as an explain request is: timeout_ms, else the server's DEFAULT_TIMEOUT_MS.
        prepared = svc.prepare(
            name,
            spec.name,
            req,
            use_cache=False,
            default_timeout_ms=svc.settings.default_timeout_ms,
        )
        outcome = prepared if isinstance(prepared, Outcome) else svc.compute(prepared)
        answer = outcome.response
        figures = [
            {"output_index": e.output_index, **(e.details or {})["evaluation"]}
            for e in answer.data.explanations
        ]
        info = dict(answer.meta.evaluation or {})
        info["explainer"] = answer.meta.model_dump(exclude_unset=True, exclude={"evaluation"})
    else:
        inputs = to_array(model, body.inputs, "inputs")
        background = None if body.background is None else to_array(model, body.background, "bg")
        if "metrics" not in options.model_fields_set:  # nothing to re-run: no sensitivity
            options = options.model_copy(
                update={"metrics": ["deletion", "insertion", "mufidelity"]}
            )
        try:
            explanations, patch = _supplied(model, inputs, body)
            raw_figures, echo = evaluate(
                model,
                inputs,
                explanations,
                options,
                seed=body.seed,
                background=background,
                patch_size=patch,
            )
        except (ExplainerError, ModelError) as exc:
            raise from_library(exc) from exc
        figures = [
            {"output_index": e.output_index, **f}
            for e, f in zip(explanations, raw_figures, strict=True)
        ]
        info = {"parameters": echo, "explainer": None}
    info["n_model_evals"] = sum(f["n_model_evals"] for f in figures)
    info["compute_ms"] = round((time.perf_counter() - start) * 1000, 3)
    return {
        "model_name": model.name,
        "model_version": model.version,
        "id": body.id or uuid.uuid4().hex,
        "meta": info,
        "evaluations": figures,
    }
