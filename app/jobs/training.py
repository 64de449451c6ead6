"""The training job kinds: learned baselines (Ren et al. 2023) and every trained explainer
(Salvage, Naouar et al. 2025; AutoGnothi, Wang et al. 2025), run from the training its registry
line declares (explainers/amortized/training.py): validation at submission, the run (one task;
its results are progress records), the summary."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.errors import ApiError, InvalidInput, Unprocessable, from_library
from app.inputs import to_array
from app.jobs.context import JobContext, cancelled, store_results
from app.jobs.store import Job, JobStore
from app.service import ExplainService
from explainers.amortized.training import CannotTrain, Training
from explainers.explanation import OptionError
from explainers.registry import ExplainerSpec
from models.base import Model, TextModel
from models.modality import Modality

if TYPE_CHECKING:
    from app.jobs.routes import JobRequest
    from explainers.amortized.store import ArtifactInfo


class LearnBaselineOptions(BaseModel):
    """Learned baseline values (Ren et al., ICLR 2023); defaults: the paper's, except rows,
    iterations and sample_num, which are smaller so a job takes seconds [ours]."""

    model_config = ConfigDict(extra="forbid")
    rows: int = Field(8, ge=1, le=1000, description="explicands from the reference data")
    iterations: int = Field(50, ge=1, le=5000)
    lr: float = Field(0.05, gt=0, le=10, description="step in standardised feature units")
    sample_num: int = Field(20, ge=1, le=1000, description="contexts per feature and order")
    low_order: float = Field(0.5, gt=0, le=1)
    deviation: float = Field(0.3, gt=0, le=5, description="clamp box: mean +- deviation*std")
    init: Literal["mean", "zero"] = "mean"
    seed: int = Field(0, ge=0)
    labels: list[int] | None = Field(
        None,
        description="true class of each explicand (the paper's target: log-odds of the label); "
        "default: the class the model predicts",
    )


Opts = TypeVar("Opts", bound=BaseModel)


def _checked(
    svc: ExplainService,
    body: JobRequest,
    kind: str,
    check: Callable[[Model], object],
    options: type[Opts],
) -> tuple[Model, Opts]:
    """The job's model, if `check` accepts it, and its parameters as `options`; in this order:
    422 for unknown fields, 404 for an unknown model, `check`'s error, 422 for bad parameters."""
    if body.model_extra:
        raise Unprocessable(f"unknown fields for {kind}: {sorted(body.model_extra)}")
    model = svc.model(body.model)
    check(model)
    try:
        return model, options(**body.parameters)
    except ValidationError as exc:
        raise Unprocessable(f"invalid parameters: {exc.errors()[0]['msg']}") from None


def _progress(ctx: JobContext, job: Job) -> Callable[[dict[str, Any]], bool]:
    """A trainer's progress callback: each record is the job's next result; False once the
    job is cancelled or the server shuts down (the trainer stops; an unfinished job is
    trained again at the next start)."""
    count = 0

    def progress(record: dict[str, Any]) -> bool:
        nonlocal count
        store_results(ctx, job.id, {count: record})
        count += 1
        return not (ctx.service.stopping.is_set() or cancelled(ctx, job.id))

    return progress


def _add_artifact(ctx: JobContext, job: Job, info: ArtifactInfo) -> None:
    """The job's last result: the stored artifact that answers."""
    result = {"artifact": info.id, "model_version": info.model_version, "config": info.config}
    store_results(ctx, job.id, {job.total - 1: {**result, "metrics": info.metrics}})


def _artifact_summary(store: JobStore, job: Job, method: str, *config: str) -> dict[str, Any]:
    """A training job's summary: its artifact (with the `config` fields named), the metrics,
    and how to explain with it."""
    result = store.all_results(job.id)[-1]
    return {
        "artifact": result["artifact"],
        "model_version": result["model_version"],
        **{key: result["config"][key] for key in config},
        "metrics": result["metrics"],
        "explain": f"POST /v2/models/{job.model}/explain/{method} with "
        f'{{"parameters": {{"artifact": "{result["artifact"]}"}}}}',
    }


def _learnable(model: Model) -> None:
    if model.modality != Modality.TABULAR:
        raise ApiError("learned baselines are for tabular models", code="unsupported_modality")
    if not model.differentiable:
        raise Unprocessable(
            f"model {model.name!r} is a black box ({model.platform}): a learned baseline needs "
            "input gradients",
            code="not_differentiable",
        )


def validate_learning(svc: ExplainService, body: JobRequest) -> dict[str, Any]:
    model, options = _checked(svc, body, "learn-baseline", _learnable, LearnBaselineOptions)
    if body.inputs is not None:
        to_array(model, body.inputs, "inputs")
    if options.labels is not None:
        data = model.reference if model.reference is not None else model.background
        available = len(data) if data is not None else 0
        rows = len(body.inputs) if body.inputs is not None else min(options.rows, available)
        if model.task != "classification":
            raise Unprocessable("labels apply to classifiers")
        if len(options.labels) != rows or not all(0 <= c < model.n_outputs for c in options.labels):
            raise Unprocessable(
                f"labels: one class in [0, {model.n_outputs}) per explicand ({rows})"
            )
    return {"parameters": options.model_dump(), "inputs": body.inputs}


def run_learn_baseline(ctx: JobContext, job: Job, todo: list[int]) -> None:
    """Learn baseline values (Ren et al. 2023) for a model; one result, the baseline."""
    if not todo:
        return
    import torch

    from explainers.gradients.learned_baseline import learn_baseline, low_order_objective

    model = ctx.service.model(job.model)
    opts = job.request["parameters"]
    data = model.reference if model.reference is not None else model.background
    if data is None:
        raise ValueError(f"model {model.name!r} has no reference data to learn from")
    x = np.asarray(job.request.get("inputs") or data[: opts["rows"]], dtype=np.float32)
    logodds = model.task == "classification"
    if opts.get("labels") is not None:  # the paper's target: log-odds of the true label
        target = np.asarray(opts["labels"], dtype=np.int64)
    elif logodds:
        target = model.predict(x).argmax(axis=1)
    else:
        target = np.zeros(len(x), dtype=np.int64)
    learned = learn_baseline(
        model.torch_module(),
        x.reshape(len(x), -1),
        target,
        data.reshape(len(data), -1),
        logodds=logodds,
        init=opts["init"],
        lr=opts["lr"],
        iterations=opts["iterations"],
        sample_num=opts["sample_num"],
        low_order=opts["low_order"],
        deviation=opts["deviation"],
        seed=opts["seed"],
    )

    def objective(b: np.ndarray) -> float:  # fixed contexts, comparable across baselines
        with torch.no_grad():
            return float(
                low_order_objective(
                    model.torch_module(),
                    torch.as_tensor(x.reshape(len(x), -1)),
                    torch.as_tensor(target),
                    torch.as_tensor(b, dtype=torch.float32),
                    logodds=logodds,
                    sample_num=opts["sample_num"],
                    low_order=opts["low_order"],
                    generator=torch.Generator().manual_seed(opts["seed"] + 7),
                )
            )

    store_results(
        ctx,
        job.id,
        {
            0: {
                "model_version": model.version,
                "target": "labels" if opts.get("labels") is not None else "predicted",
                "baseline": learned.baseline.tolist(),
                "lower": learned.lower.tolist(),
                "upper": learned.upper.tolist(),
                "objective": {
                    "zero": objective(np.zeros(model.n_features)),
                    "mean": objective(data.reshape(len(data), -1).mean(axis=0)),
                    "learned": objective(learned.baseline),
                    "training": list(learned.objective),
                },
            }
        },
    )


def summarise_learned(store: JobStore, job: Job) -> dict[str, Any]:
    result = store.all_results(job.id)[0]
    return {
        "baseline_ref": job.id,
        "model_version": result["model_version"],
        "target": result.get("target", "predicted"),  # whose log-odds: predicted or labels
        "objective": result["objective"],
    }


def validate_training(spec: ExplainerSpec, svc: ExplainService, body: JobRequest) -> dict[str, Any]:
    """A trained explainer's job (its spec's `training`): the model it trains beside (400 with
    the declaration's code), the training options (422), the inputs, if sent (400
    invalid_input)."""
    training = _training_of(spec)

    def trainable(model: Model) -> None:
        try:
            training.check_model(model)
        except CannotTrain as exc:
            raise from_library(exc) from None

    model, options = _checked(svc, body, training.job, trainable, training.options)
    if body.inputs is not None and not isinstance(model, TextModel):
        to_array(model, body.inputs, "inputs")
    try:
        training.check_inputs(model, body.inputs)
    except OptionError as exc:
        raise InvalidInput(str(exc)) from None
    return {"parameters": options.model_dump(mode="json"), "inputs": body.inputs}


def training_total(spec: ExplainerSpec, body: JobRequest) -> int:
    """The results a training job stores: its progress records, then the artifact."""
    training = _training_of(spec)
    return training.total(training.options(**body.parameters))


def run_training(spec: ExplainerSpec, ctx: JobContext, job: Job, todo: list[int]) -> None:
    """Train the explainer beside the job's model; one result per progress record, the last
    one names the stored artifact (reused when this configuration was trained for this model
    version: training is seeded)."""
    if not todo:
        return
    training = _training_of(spec)
    model = training.check_model(ctx.service.model(job.model))
    options = training.options(**job.request["parameters"])
    artifacts = ctx.service.context.need_artifacts(spec.name)
    inputs = job.request.get("inputs")
    info = training.train(model, options, artifacts, inputs, _progress(ctx, job))
    if info is None:  # cancelled
        return
    _add_artifact(ctx, job, info)


def summarise_training(spec: ExplainerSpec, store: JobStore, job: Job) -> dict[str, Any]:
    return _artifact_summary(store, job, spec.name, *_training_of(spec).summary)


def _training_of(spec: ExplainerSpec) -> Training:
    if spec.training is None:
        raise ValueError(f"{spec.name} is not trained")
    return spec.training
