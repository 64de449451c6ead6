"""The explainer catalog: one line per explainer family, checked for duplicate names."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel

from explainers import attribot, cocoa, rankshap
from explainers.amortized.autognothi import explainer as autognothi
from explainers.amortized.salvage import explainer as salvage
from explainers.amortized.training import Training
from explainers.context import LEARNED_BASELINE, Explainer, ExplainRequest, Pin
from explainers.explanation import ExplainResult, OptionError
from explainers.games import ExplainerError
from explainers.gradients import integrated as gradients
from explainers.gradients import uni
from explainers.gradients.integrated_text import hook_of
from explainers.shapley import explainer as shapley
from explainers.sufficient import explainer as sufficient
from models.base import Model
from models.modality import Modality


class UnknownExplainerError(ExplainerError, KeyError):
    """No explainer is registered under that name."""

    status = 404
    code = "unknown_explainer"

    def public_message(self) -> str:
        return str(self.args[0])


class Need(StrEnum):
    """A capability a model needs beyond its modality (models declare theirs once)."""

    DIFFERENTIABLE = "differentiable"  # input gradients of torch weights
    CLASSIFIER = "classifier"
    HIDDEN_STATES = "hidden_states"  # a text classifier whose encoder AutoGnothi reads


TABULAR, IMAGE, TEXT = Modality.TABULAR, Modality.IMAGE, Modality.TEXT
ARRAYS_AND_TEXT = (TABULAR, IMAGE, TEXT)


@dataclass(frozen=True)
class LibraryExplainer:
    """A family's library function as an Explainer: the one place that turns the typed request
    into its keyword arguments, `explain(model, inputs, *, options, target, seed, budget,
    background, **fields)`, with `context=` the run context when it takes one (AttriBoT's own
    `context` field is its prompt's context: it takes no run context)."""

    function: Callable[..., ExplainResult]
    takes_context: bool = False

    def __call__(self, request: ExplainRequest) -> ExplainResult:
        kwargs: dict[str, Any] = {
            "options": request.options,
            "target": request.target,
            "seed": request.seed,
            "budget": request.budget,
            "background": request.background,
            **request.fields,
        }
        if self.takes_context:
            kwargs["context"] = request.context
        return self.function(request.model, request.inputs, **kwargs)


@dataclass(frozen=True)
class ExplainerSpec:
    name: str
    version: str
    modalities: tuple[Modality, ...]
    options: type[BaseModel]
    run: Callable[..., ExplainResult]  # the library function (see LibraryExplainer)
    description: str
    reference: str
    # Top-level request fields of this explainer (API.md: `query`/`documents` for RankSHAP,
    # `corpus`/`foil` for COCOA, ...): a pydantic model whose fields join the request body and
    # reach `run` as keyword arguments (ExplainRequest.fields).
    fields: type[BaseModel] | None = None
    # False when the explainer's own fields describe the instance (one per request) and the
    # common `inputs` list is not used; a batch audit's instances are then dicts of those fields.
    uses_inputs: bool = True
    # Capabilities a model needs beyond its modality. The catalog of a model lists exactly the
    # explainers it satisfies.
    needs: tuple[Need, ...] = ()
    # True when `run` takes `context=` (explainers/context.py: a store, artifacts, baselines).
    uses_context: bool = False
    # Binds the options to stored state before the cache key is made: a learned baseline's
    # values, the trained artifact that answers (raises NotTrainedError when none is).
    pin: Pin | None = None
    # An amortized explainer's training, declared once: the job kind that trains its artifacts
    # (named in the 409 before training) and everything that job runs (app/jobs/training.py).
    training: Training | None = None
    # True when, without a target, the explainer explains the model's own decision (the
    # predicted class: sufficient subsets keep it); the service's default target (a binary
    # classifier's positive class) then does not apply.
    explains_decision: bool = False
    # True when each instance's explanation is the same whether it is asked alone or with
    # others in one request (same seed): a batch is then computed as one request and each row
    # cached as its own answer (app/batch.py); tests/app/test_audit_batch.py checks the claim
    # for shapley, the one explainer that makes it (a batch's rows against each row alone).
    rows_independent: bool = False

    @property
    def train_job(self) -> str | None:
        """The job kind that trains this explainer's artifacts, if it is trained."""
        return None if self.training is None else self.training.job

    @property
    def explainer(self) -> Explainer:
        """This explainer as the one protocol: a typed request in, a result out."""
        return LibraryExplainer(self.run, self.uses_context)

    def explain(self, request: ExplainRequest) -> ExplainResult:
        """The answer to one request."""
        return self.explainer(request)


class UnsupportedModelError(ExplainerError):
    """The explainer cannot serve this model (its modality or a missing capability)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code
        self.status = 422 if code == "not_differentiable" else 400


def unsupported(spec: ExplainerSpec, model: Model) -> UnsupportedModelError | None:
    """Why `spec` cannot answer for `model`, or None when every valid request gets an answer."""
    if model.modality not in spec.modalities:
        return UnsupportedModelError(
            f"explainer {spec.name!r} does not support {model.modality} models",
            "unsupported_modality",
        )
    if Need.DIFFERENTIABLE in spec.needs and model.modality == Modality.TEXT and not hook_of(model):
        return UnsupportedModelError(
            f"{spec.name} on a text model needs its input embeddings (a Hugging Face text "
            f"classifier); {model.name} does not expose them: use shapley",
            "not_differentiable",
        )
    if Need.DIFFERENTIABLE in spec.needs and not model.differentiable:
        return UnsupportedModelError(
            f"{spec.name} needs input gradients; {model.name} is a black box without them "
            f"({model.platform}): use shapley",
            "not_differentiable",
        )
    if Need.HIDDEN_STATES in spec.needs and model.task == "classification":
        try:  # AutoGnothi trains beside a BERT encoder whose hidden states it reads
            autognothi.check_model(model)
        except OptionError as exc:
            return UnsupportedModelError(str(exc), "unsupported_model")
    if Need.CLASSIFIER in spec.needs and model.task != "classification":
        return UnsupportedModelError(
            f"{spec.name} explains classifiers; {model.name} is a {model.task} model",
            "needs_classifier",
        )
    return None


def catalog(model: Model) -> list[str]:
    """Names of the explainers that answer a valid request for `model`."""
    return [spec.name for spec in EXPLAINERS if unsupported(spec, model) is None]


EXPLAINERS: tuple[ExplainerSpec, ...] = (
    ExplainerSpec(
        "shapley",
        shapley.VERSION,
        ARRAYS_AND_TEXT,
        shapley.ShapleyOptions,
        shapley.explain,
        "Shapley values of features, image patches or words: exact, permutation or KernelSHAP",
        "Lundberg & Lee 2017; Castro et al. 2009; Musco & Witter 2025",
        pin=LEARNED_BASELINE,
        rows_independent=True,
    ),
    ExplainerSpec(
        "integrated-gradients",
        gradients.VERSION,
        ARRAYS_AND_TEXT,
        gradients.IntegratedGradientsOptions,
        gradients.explain,
        "Integrated gradients from zero, constant, mean, blur, noise, supplied or background "
        "(expected gradients) baselines; re-calibrated estimators valid_ip and valid_ref",
        "Sundararajan et al. 2017; Erion et al. 2021; Sturmfels et al. 2020; Yang et al. 2023",
        needs=(Need.DIFFERENTIABLE,),
    ),
    ExplainerSpec(
        "uni",
        uni.VERSION,
        ARRAYS_AND_TEXT,
        uni.UniOptions,
        uni.explain,
        "UNI: integrated gradients from an unlearning-matched baseline (one ascent step on a "
        "copy of the weights, PGD in an epsilon ball); returns the baseline",
        "Choi, Duplessis & Belongie, ICLR 2025",
        needs=(Need.DIFFERENTIABLE, Need.CLASSIFIER),
    ),
    ExplainerSpec(
        "rankshap",
        rankshap.VERSION,
        (Modality.RANKER,),
        rankshap.RankShapOptions,
        rankshap.explain,
        "RankSHAP: Shapley values of terms for a ranker's ranking of documents, NDCG as the game",
        "Chowdhury, Zick & Allan, ICLR 2025",
        fields=rankshap.RankShapFields,
        uses_inputs=False,
    ),
    ExplainerSpec(
        "cocoa",
        cocoa.VERSION,
        (Modality.ENCODER,),
        cocoa.CocoaOptions,
        cocoa.explain,
        "COCOA: attributions of an encoder's contrastive corpus similarity (corpus vs foil), "
        "by Shapley values of patches or words, or integrated gradients",
        "Lin, Chen, Kim & Lee, ICLR 2023",
        fields=cocoa.CocoaFields,
        uses_context=True,
    ),
    ExplainerSpec(
        "salvage",
        salvage.VERSION,
        (Modality.IMAGE,),
        salvage.SalvageOptions,
        salvage.explain,
        "Salvage: a trained explainer network gives Shapley values of image patches in one "
        "forward pass (train it with a train-salvage job)",
        "Naouar et al., ICLR 2025; Covert, Kim & Lee, ICLR 2023; Jethani et al., ICLR 2022",
        needs=(Need.DIFFERENTIABLE, Need.CLASSIFIER),
        uses_context=True,
        pin=salvage.PIN,
        training=salvage.TRAINING,
    ),
    ExplainerSpec(
        "autognothi",
        autognothi.VERSION,
        (Modality.TEXT,),
        autognothi.AutoGnothiOptions,
        autognothi.explain,
        "AutoGnothi: a side network beside the frozen text classifier gives word Shapley values "
        "in one forward pass (train it with a train-autognothi job)",
        "Wang et al., ICLR 2025; Jethani et al., ICLR 2022 (FastSHAP)",
        needs=(Need.CLASSIFIER, Need.HIDDEN_STATES),
        uses_context=True,
        pin=autognothi.PIN,
        training=autognothi.TRAINING,
    ),
    ExplainerSpec(
        "attribot",
        attribot.VERSION,
        (Modality.LM,),
        attribot.AttriBoTOptions,
        attribot.explain,
        "AttriBoT: leave-one-out context attribution of a language model's response (exact LOO, "
        "KV-cache reuse, hierarchical, proxy model, proxy pruning) and ContextCite",
        "Liu, Kandpal & Raffel, ICLR 2025; Cohen-Wang et al. 2024 (ContextCite)",
        fields=attribot.AttriBoTFields,
        uses_inputs=False,
    ),
    ExplainerSpec(
        "sufficient-subset",
        sufficient.VERSION,
        ARRAYS_AND_TEXT,
        sufficient.SufficientOptions,
        sufficient.explain,
        "A minimal sufficient subset of features, patches or words: kept alone (the rest absent "
        "as in Shapley), the model keeps its class; exact search or a pruned attribution order",
        "Carter et al. 2019 (Sufficient Input Subsets); Ribeiro et al. 2018 (Anchors); SST, "
        "ICLR 2025",
        needs=(Need.CLASSIFIER,),
        pin=LEARNED_BASELINE,
        explains_decision=True,
    ),
)


def _index(specs: tuple[ExplainerSpec, ...]) -> dict[str, ExplainerSpec]:
    index = {spec.name: spec for spec in specs}
    if len(index) != len(specs):
        raise ValueError("duplicate explainer names")
    for spec in specs:
        if spec.uses_context and spec.fields is not None and "context" in spec.fields.model_fields:
            raise ValueError(f"{spec.name}: a request field named context hides the run context")
    return index


_BY_NAME = _index(EXPLAINERS)


def get_explainer(name: str) -> ExplainerSpec:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnknownExplainerError(
            f"unknown explainer {name!r}; known: {sorted(_BY_NAME)}"
        ) from None
