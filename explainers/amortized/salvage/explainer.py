"""Salvage artifacts in the model store, and the `salvage` explainer that answers from them.

An artifact is a trained surrogate and explainer (explainers/amortized/salvage/train.py) of one
model version and training configuration, kept by the generic artifact store
(explainers/amortized/store.py): the surrogate's and the explainer's state dicts and log g(0).
Naouar et al. (ICLR 2025).
"""

from __future__ import annotations

import copy
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field

from explainers.amortized.progress import Progress
from explainers.amortized.salvage import inference as salvage_inference
from explainers.amortized.salvage import train as salvage
from explainers.amortized.store import ArtifactInfo, ArtifactStore
from explainers.amortized.training import CannotTrain, Training
from explainers.context import Artifacts, NotTrainedError, Pin, RunContext
from explainers.explanation import ExplainResult, Explanation, OptionError
from explainers.games.deadlines import check_deadline
from explainers.games.masked import patch_groups
from explainers.options import EVERYWHERE, ExplainerOptions
from models.base import Model
from models.modality import Modality

VERSION = "1"
KIND = "salvage"  # the artifact kind in the model store


class SalvageStore(ArtifactStore[salvage.Trained]):
    """Salvage artifacts: the surrogate's and the explainer's state dicts and log g(0)."""

    kind: ClassVar[str] = KIND
    label: ClassVar[str] = "Salvage"

    def _state(self, trained: salvage.Trained) -> dict[str, Any]:
        return {
            "surrogate": {k: v.cpu() for k, v in trained.surrogate.state_dict().items()},
            "explainer": {k: v.cpu() for k, v in trained.explainer.state_dict().items()},
            "empty_logp": torch.from_numpy(trained.empty_logp),
        }

    def _build(self, model: Model, info: ArtifactInfo, state: dict[str, Any]) -> salvage.Trained:
        opts = salvage.SalvageTrainOptions(**info.config)
        surrogate = copy.deepcopy(model.torch_module())
        surrogate.load_state_dict(state["surrogate"])
        surrogate.eval()
        explainer = salvage.ExplainerNet(
            model.input_shape, opts.patch_size, model.n_outputs, opts.hidden
        )
        explainer.load_state_dict(state["explainer"])
        explainer.to(model.device).eval()  # beside the surrogate (a copy of the model's module)
        groups, _ = patch_groups(model.input_shape, opts.patch_size)
        return salvage.Trained(
            surrogate,
            explainer,
            groups,
            state["empty_logp"].numpy(),
            opts,
            info.metrics,
            info.history,
            info.data_id,
        )


class SalvageOptions(ExplainerOptions):
    """Options of the `salvage` explainer: which trained artifact answers."""

    artifact: Annotated[str | None, EVERYWHERE] = Field(
        None,
        max_length=64,
        description="id of a trained artifact (a train-salvage job's summary.artifact); "
        "default: the newest one for this model version that matches objective and sampler",
    )
    objective: Annotated[Literal["distribution", "squared"] | None, EVERYWHERE] = Field(
        None, description="pick the newest artifact trained with this objective"
    )
    sampler: Annotated[Literal["informed", "kernel", "uniform"] | None, EVERYWHERE] = Field(
        None, description="pick the newest artifact trained with this sampler"
    )

    def pinned(self, store: SalvageStore, model: Model) -> SalvageOptions:
        """These options bound to the artifact they select (raises NotTrainedError)."""
        candidates = [
            info
            for info in store.list(model.name, model.version)
            if (self.artifact is None or info.id == self.artifact)
            and (self.objective is None or info.config["objective"] == self.objective)
            and (self.sampler is None or info.config["sampler"] == self.sampler)
        ]
        if not candidates:
            wanted = {k: v for k, v in self.model_dump().items() if v is not None}
            raise NotTrainedError(
                f"no trained Salvage explainer for model {model.name!r} version "
                f"{model.version}{f' matching {wanted}' if wanted else ''}"
            )
        chosen = candidates[0]
        return self.model_copy(
            update={
                "artifact": chosen.id,
                "objective": chosen.config["objective"],
                "sampler": chosen.config["sampler"],
            }
        )


def _pin(model: Model, options: SalvageOptions, context: RunContext) -> SalvageOptions:
    return options.pinned(SalvageStore.within(context.need_artifacts("salvage")), model)


PIN = Pin(_pin)  # every request names its artifact: part of the cache key


def explain(
    model: Model,
    inputs: np.ndarray,
    *,
    options: SalvageOptions,
    target: int | None = None,
    seed: int = 0,
    budget: int | None = None,
    background: np.ndarray | None = None,
    context: RunContext | None = None,
) -> ExplainResult:
    """Values from a trained explainer (options pinned to an artifact of `context`'s store):
    one explainer pass and one surrogate row per image."""
    del seed, budget  # deterministic, and the cost is fixed
    if background is not None:
        raise OptionError("salvage takes no background: absent patches are zeroed")
    trained = SalvageStore.load_pinned(model, options.artifact, context)
    check_deadline()  # loading may have taken a while; the pass itself is one model call
    out = salvage_inference.amortized(trained, inputs)
    if target is not None and not 0 <= target < model.n_outputs:
        raise OptionError(f"target out of range for {model.n_outputs} outputs")
    explanations = []
    for j in range(len(inputs)):
        c = int(np.argmax(out.surrogate_probs[j])) if target is None else target
        details: dict[str, Any] = {
            "surrogate_probabilities": out.surrogate_probs[j].tolist(),
            "units": "centred log-probability"
            if trained.options.objective == "distribution"
            else "probability",
        }
        if out.explainer_probs is not None:
            details["explainer_probabilities"] = out.explainer_probs[j].tolist()
            details["explainer_class"] = int(np.argmax(out.explainer_probs[j]))
        explanations.append(
            Explanation(
                output_index=c,
                values=out.values[j, :, c],
                base_value=float(out.base[c]),
                instance_output_value=float(out.full[j, c]),
                exact=False,
                n_model_evals=1,
                estimator=f"salvage-{trained.options.objective}",
                details=details,
            )
        )
    _, names = patch_groups(model.input_shape, trained.options.patch_size)
    echo = {**options.echo(), "training": trained.options.model_dump(mode="json")}
    return ExplainResult(tuple(explanations), tuple(names), echo, 1, True)


def check_model(model: Model) -> Model:
    """The model, if Salvage can train on it (CannotTrain otherwise)."""
    if model.modality != Modality.IMAGE or model.task != "classification":
        raise CannotTrain("Salvage trains on image classifiers", "unsupported_modality")
    if not model.differentiable or next(model.torch_module().parameters(), None) is None:
        raise CannotTrain(
            f"model {model.name!r} has no trainable torch weights to fine-tune (a black box?)",
            "not_differentiable",
        )
    return model


def check_inputs(model: Model, inputs: Any) -> None:
    """Training images come from the job's inputs, else the model's reference or background."""
    if inputs is None and model.reference is None and model.background is None:
        raise OptionError(f"model {model.name!r} has no reference images; send inputs")


def trained_artifact(
    model: Model,
    options: salvage.SalvageTrainOptions,
    artifacts: Artifacts,
    inputs: Any = None,
    progress: Progress | None = None,
) -> ArtifactInfo | None:
    """The stored artifact of this configuration: the one already trained on the model's own
    images for this model version (training is seeded; its history goes to `progress`), else
    a new one trained (on `inputs`, images as nested lists, when sent) and stored. None when
    `progress` stops the training."""
    store = SalvageStore.within(artifacts)
    info = None if inputs else store.info(model.name, model.version, options.digest())
    if info is not None:
        for record in info.history:
            if progress is not None:
                progress(dict(record))
        return info
    data = None if not inputs else np.asarray(inputs, dtype=np.float32)
    if data is not None:
        data = data.reshape(len(data), *model.input_shape)
    trained = salvage.train(model, options, data, progress)
    return None if trained is None else store.save(model, trained)


def _epochs(options: salvage.SalvageTrainOptions) -> int:
    """One result per epoch, then the artifact."""
    return options.surrogate_epochs + options.explainer_epochs + 1


TRAINING = Training(
    "train-salvage",
    salvage.SalvageTrainOptions,
    check_model,
    check_inputs,
    _epochs,
    trained_artifact,
    summary=("objective", "sampler"),
)


__all__ = [
    "PIN",
    "TRAINING",
    "NotTrainedError",
    "SalvageOptions",
    "SalvageStore",
    "explain",
]
