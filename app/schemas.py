"""Request and response bodies of the explain contract (API.md): explain requests (the shared
fields, each explainer's own, the echo rule), explain answers, the explainer catalog. The Open
Inference Protocol bodies (model metadata, inference) are app/oip_schemas.py's."""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model

from explainers.registry import ExplainerSpec

# Each explanation echoes its instance (`data`) when the instance has at most this many numbers:
# every table row, text, digit, MNIST (784) and CIFAR (3x32x32 = 3,072) image, and 1x64x64
# (4,096) still come back as sent, as shap's Explanation.data; 4,096 numbers are at most about
# 90 KB of JSON. Larger images (3x64x64 is 12,288, 3x224x224 150,528: 1+ MB) answer
# `data: null` with a `data_digest` unless the request asks for them with `return_inputs`.
ECHO_LIMIT = 4096


def _utf8(value: str) -> str:
    """Refuse lone UTF-16 surrogates ("\\ud800" is valid JSON): they are no UTF-8 text, and
    hashing, logging or echoing them fails (a 500) further on."""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            where = exc.start
            raise ValueError(f"character {where} is a lone UTF-16 surrogate, not text") from None
    return value


Utf8 = Annotated[str, AfterValidator(_utf8)]  # a string that encodes as UTF-8


def _more_numbers_than(instance: Any, limit: int) -> bool:
    """Whether a nested list (or a {feature: value} row) holds more than `limit` numbers; texts
    and scalars count one. Stops counting past the limit."""
    count, todo = 0, [instance]
    while todo:
        x = todo.pop()
        if isinstance(x, list):
            todo.extend(x)
        elif isinstance(x, dict):
            todo.extend(x.values())
        else:
            count += 1
            if count > limit:
                return True
    return False


def echoed(instance: Any, asked: bool) -> tuple[Any, dict[str, Any] | None]:
    """An explanation's `data` and `data_digest`: the instance as sent, or (more than
    ECHO_LIMIT numbers, not asked for) null and its shape, size and float32 sha256."""
    if asked or isinstance(instance, str) or not _more_numbers_than(instance, ECHO_LIMIT):
        return instance, None
    import hashlib

    import numpy as np

    try:
        values = np.asarray(
            list(instance.values()) if isinstance(instance, dict) else instance, dtype=np.float32
        )
    except (TypeError, ValueError):  # ragged or not numbers: validation refused it before
        return instance, None
    digest = hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()
    return None, {"shape": list(values.shape), "size": int(values.size), "sha256": digest}


class ExplainRequestBase(BaseModel):
    """Fields every explain request shares; `parameters` is the explainer's own options."""

    model_config = ConfigDict(extra="forbid", strict=True)
    inputs: list[Any] = Field(
        ...,
        min_length=1,
        description="instances: rows as lists or {feature: value}; images as nested lists; "
        "texts as strings",
    )
    target: int | str | list[int | str] | None = Field(
        None,
        description="output index or name; a list of them, or \"all\": one explanation per "
        "output asked for, in that order, for each instance (output_index says which); "
        "default (one rule for every route): a binary classifier's positive class (the "
        "second output), a multi-class classifier's predicted class, a regressor's output",
    )
    seed: int = Field(0, ge=0, le=2**32 - 1)
    budget: int | None = Field(
        None, ge=1, description="model evaluations per instance (background rows included)"
    )
    background: list[Any] | None = Field(
        None,
        description="background rows for the background masker; default: the model's "
        "(not for text models)",
    )
    id: Utf8 | None = Field(None, max_length=200, description="request id, echoed back")
    timeout_ms: int | None = Field(
        None,
        ge=1,
        le=3_600_000,
        description="time limit from arrival: 504 when it passes, or for the sampled Shapley "
        "estimators (permutation, kernel) the anytime estimate of the rounds completed so far "
        "(meta.partial true, not cached); default: the server's DEFAULT_TIMEOUT_MS (60 s)",
    )
    return_inputs: bool = Field(
        False,
        description=f"echo every instance in its explanations' `data`; by default an instance "
        f"of more than {ECHO_LIMIT} numbers (an image larger than 1x64x64) answers data null "
        "and data_digest (its shape, size and sha256) instead",
    )


def spec_fields(spec: ExplainerSpec) -> tuple[str, ...]:
    """Names of the explainer's own top-level request fields."""
    return tuple(spec.fields.model_fields) if spec.fields is not None else ()


@functools.cache
def parameters_model(spec: ExplainerSpec) -> type[BaseModel]:
    """The explainer's options plus `evaluate`: faithfulness figures attached to the answer."""
    from explainers.trust.evaluation import EvaluateOptions, Metric

    if "evaluate" in spec.options.model_fields:
        return spec.options
    return create_model(
        spec.options.__name__.removesuffix("Options") + "Parameters",
        __base__=spec.options,
        evaluate=(
            list[Metric] | EvaluateOptions | None,
            Field(
                None,
                description="metric names, or evaluation options: each explanation gets "
                "details.evaluation (deletion/insertion AUC, MuFidelity, sensitivity)",
            ),
        ),
        allow_out_of_range=(
            bool,
            Field(
                False,
                description="explain inputs outside the model's declared input_range with an "
                "input_out_of_range warning instead of answering 400",
            ),
        ),
    )


def request_model(spec: ExplainerSpec) -> type[ExplainRequestBase]:
    """The request body of one explainer: the shared fields, its own fields, its options."""
    name = "".join(part.capitalize() for part in spec.name.replace("-", "_").split("_"))
    own: dict[str, Any] = {}
    if spec.fields is not None:
        own = {k: (f.annotation, f) for k, f in spec.fields.model_fields.items()}
    if not spec.uses_inputs:
        own["inputs"] = (
            None,
            Field(
                None,
                description=f"not used: a {spec.name} request describes one instance "
                f"with its own fields ({', '.join(spec_fields(spec))})",
            ),
        )
    return create_model(
        f"{name}ExplainRequest",
        __base__=ExplainRequestBase,
        parameters=(parameters_model(spec), Field(default_factory=parameters_model(spec))),
        **own,
    )


class PlayerOut(BaseModel):
    """A piece of an input text that is one player: text == input[start:end]."""
    model_config = ConfigDict(strict=True)  # JSON true is not 1, "1" is not 1

    text: str
    start: int = Field(..., description="character offset of the first character")
    end: int = Field(..., description="character offset after the last character")


class WarningOut(BaseModel):
    code: str
    message: str


class ExplanationOut(BaseModel):
    model_config = ConfigDict(strict=True)  # JSON true is not 1, "1" is not 1
    output_index: int
    output_name: str
    data: Any = Field(
        ...,
        description="the instance as sent; null when the explainer's own fields carry it, or "
        f"when it has more than {ECHO_LIMIT} numbers and the request did not ask for "
        "return_inputs (data_digest then says which instance it was)",
    )
    data_digest: dict[str, Any] | None = Field(
        None,
        description="only when data is left out: {shape, size, sha256}, sha256 the hex digest of "
        "the instance as float32 bytes in C order "
        "(hashlib.sha256(np.asarray(x, np.float32).tobytes()).hexdigest())",
    )
    values: list[float] = Field(..., description="one value per player")
    base_value: float
    instance_output_value: float
    approximation_error: float = Field(
        ..., description="|sum(values) + base_value - instance_output_value|"
    )
    error_std: list[float] | None = Field(None, description="standard error per value (sampled)")
    interactions: dict[str, Any] | None = None
    players: list[PlayerOut] | None = Field(
        None, description="text models: this instance's players (words or tokens), in order"
    )
    details: dict[str, Any] | None = Field(
        None, description="explainer-specific outputs (a baseline, a ranking, spans, ...)"
    )
    warnings: list[WarningOut] = Field(
        default_factory=list,
        description="reasons to trust this explanation less (empty when there are none): "
        "noisy_estimate, flat_game, input_out_of_range, estimator_fallback, "
        "baseline_not_reached, not_converged, prior_misfit, partition_truncated, "
        "deprecated_name (an old option value was answered under its new name)",
    )
    exact: bool
    estimator: str
    n_model_evals: int = Field(
        ...,
        description="model evaluations this explanation added (with several targets an "
        "instance's outputs share evaluations: the first pays for what they share)",
    )


class ExplainMeta(BaseModel):
    model_config = ConfigDict(strict=True)  # JSON true is not 1, "1" is not 1
    explainer: str
    explainer_version: str
    seed: int
    budget: int = Field(..., description="model evaluations per instance, after defaults")
    n_model_evals: int = Field(..., description="model evaluations spent, all instances")
    n_instances: int = Field(..., description="instances explained (explanations / targets)")
    exact: bool
    additive: bool
    compute_ms: float
    cache: Literal["hit", "miss", "bypass"]
    partial: bool = Field(
        False, description="true when timeout_ms cut a sampling estimator short (fewer samples)"
    )
    parameters: dict[str, Any]
    precision: dict[str, Any] | None = Field(
        None,
        description="with parameters.target_se: {target_se, reached (every instance), "
        "max_error_std (the worst instance, explained output), rounds (the most)}; each "
        "explanation's details.precision has its own",
    )
    background_audit: dict[str, Any] | None = Field(
        None,
        description="when the request sends its own background: KS and Wald tests of model "
        "outputs on it against the model's reference data (Fool SHAP, ICLR 2023)",
    )
    evaluation: dict[str, Any] | None = Field(
        None,
        description="with parameters.evaluate: its parameters after defaults, n_model_evals and "
        "compute_ms; the figures are in each explanation's details.evaluation",
    )
    corpus: dict[str, Any] | None = Field(
        None, description="cocoa: the corpus used (size, source, embedding cache status)"
    )
    foil: dict[str, Any] | None = Field(
        None, description="cocoa: the foil used (size, source, embedding cache status)"
    )
    targets: dict[str, Any] | None = Field(
        None,
        description="with a target list or \"all\": output_indices and output_names in the "
        "order of each instance's explanations; budget \"shared\" (one game per instance "
        "gave every output: budget and n_model_evals cover them together) or \"per target\" "
        "(each output was explained on its own, with up to budget model evaluations each; "
        "coalitions already evaluated for an earlier output are not paid again)",
    )
    forward_passes: dict[str, int] | None = Field(
        None, description="attribot: forward passes per model (target and proxy)"
    )


class ExplainData(BaseModel):
    model_config = ConfigDict(strict=True)  # JSON true is not 1, "1" is not 1
    feature_names: list[str] = Field(
        ...,
        description="player names (features or patches); empty for text models, whose players "
        "differ per instance (see each explanation's players)",
    )
    output_names: list[str]
    explanations: list[ExplanationOut]


class ExplainResponse(BaseModel):
    """An explain answer: what the service hands its callers (routes, evaluate, audits, plots)."""

    model_config = ConfigDict(strict=True)  # JSON true is not 1, "1" is not 1
    model_name: str
    model_version: str
    id: str
    meta: ExplainMeta
    data: ExplainData

    def to_json(self) -> str:
        """The JSON, made once: json.dumps' layout (app/cache.py splices a request's id and
        meta.cache into stored answers), the fields that were set (meta keys an explainer did
        not give stay out); ValueError on NaN or infinity, which JSON lacks."""
        return json.dumps(self.model_dump(exclude_unset=True), allow_nan=False)


class ExplainerInfo(BaseModel):
    name: str
    version: str
    modalities: list[str]
    description: str
    reference: str
    options_schema: dict[str, Any]
