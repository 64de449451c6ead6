"""The `autognothi` explainer: word Shapley values of a text classifier in one forward pass.

AutoGnothi: Wang et al., "Gnothi Seauton: Empowering Faithful Self-Interpretability in
Black-Box Transformers" (ICLR 2025), with FastSHAP's objective (Jethani et al., ICLR 2022): a
side network trained beside the frozen model (a train-autognothi job,
explainers/amortized/autognothi/train.py) reads the encoder's hidden states of the one pass that
also gives the prediction, and outputs the words' Shapley values for `shapley`'s text game (words
deleted), efficiency-projected. An input longer than every training sentence, or most of whose
words never appear in training, is answered with the warning `outside_training_range`
(explainers/amortized/autognothi/train.py TrainingRange). Artifacts are stored like Salvage's
(explainers/amortized/salvage/explainer.py): per model version and configuration hash, in the
database every process shares, never used for another model version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import numpy as np
import torch
from pydantic import Field

from explainers.amortized.autognothi.net import SideNet, empty_texts, encode, runner, word_values
from explainers.amortized.autognothi.train import (
    UNKNOWN_RANGE,
    AutoGnothiTrainOptions,
    Trained,
    TrainingRange,
    data_digest,
    train,
)
from explainers.amortized.progress import Progress
from explainers.amortized.store import ArtifactInfo, ArtifactStore
from explainers.amortized.training import CannotTrain, Training
from explainers.context import Artifacts, NotTrainedError, Pin, RunContext
from explainers.explanation import Caveat, ExplainResult, Explanation, OptionError
from explainers.games.deadlines import check_deadline
from explainers.games.text import text_games, word_spans
from explainers.options import EVERYWHERE, ExplainerOptions
from models.base import Model, TextModel

VERSION = "1"
KIND = "autognothi"  # the artifact kind in the model store
TRAIN_JOB = "train-autognothi"
EMPTY_CACHE = 4096  # remembered v(empty) strings per artifact
CHUNK = 16  # texts per encoder pass: 16 x 7 levels x 256 tokens x 384 floats = 44 MB at most


class AutoGnothiStore(ArtifactStore[Trained]):
    """AutoGnothi artifacts: Salvage's store (database, local cache, atomic folders) with the
    side network's state dict as the weights."""

    kind: ClassVar[str] = KIND
    label: ClassVar[str] = "AutoGnothi"

    def _state(self, trained: Trained) -> dict[str, Any]:
        net = trained.net
        state = {
            "net": net.state_dict(),
            "shape": torch.tensor([net.levels, net.dim, net.n_classes]),
        }
        if trained.range is not None:
            state["range"] = trained.range.state()
        return state

    def _build(self, model: Model, info: ArtifactInfo, state: dict[str, Any]) -> Trained:
        opts = AutoGnothiTrainOptions(**info.config)
        levels, dim, n_classes = (int(v) for v in state["shape"])
        net = SideNet(levels, dim, n_classes, opts.width, opts.heads)
        net.load_state_dict(state["net"])
        net.eval()
        span = TrainingRange.from_state(state["range"]) if "range" in state else None
        return Trained(net, opts, info.metrics, info.history, info.data_id, span)


def store_of(artifacts: Artifacts) -> AutoGnothiStore:
    """The AutoGnothi artifacts of a run context's artifact store (`root/autognothi/`)."""
    return AutoGnothiStore.within(artifacts)


class AutoGnothiOptions(ExplainerOptions):
    """Options of the `autognothi` explainer: which trained side network answers."""

    artifact: Annotated[str | None, EVERYWHERE] = Field(
        None,
        max_length=64,
        description="id of a trained side network (a train-autognothi job's summary.artifact); "
        "default: the newest one for this model version",
    )


def _pin(model: Model, options: AutoGnothiOptions, context: RunContext) -> AutoGnothiOptions:
    """Name the artifact that answers (part of the cache key); NotTrainedError when none is."""
    store = store_of(context.need_artifacts(KIND))
    found = [
        info
        for info in store.list(model.name, model.version)
        if options.artifact is None or info.id == options.artifact
    ]
    if not found:
        which = f" {options.artifact!r}" if options.artifact else ""
        raise NotTrainedError(
            f"no trained AutoGnothi side network{which} for model {model.name!r} version "
            f"{model.version}"
        )
    return options.model_copy(update={"artifact": found[0].id})


PIN = Pin(_pin)


def check_model(model: Model) -> TextModel:
    """The model, if AutoGnothi can train beside it (OptionError otherwise)."""
    if not isinstance(model, TextModel) or model.task != "classification":
        raise OptionError("AutoGnothi explains text classifiers")
    runner(model)  # a BERT encoder whose hidden states can be read
    return model


def check_texts(texts: Any) -> list[str]:
    """Training sentences sent with a job: at least 2 strings, each with a word."""
    if not isinstance(texts, list) or len(texts) < 2:
        raise OptionError("inputs: at least 2 training sentences")
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not word_spans(text):
            raise OptionError(f"inputs[{i}]: a sentence with at least one word")
    return texts


def trained_artifact(
    model: TextModel,
    options: AutoGnothiTrainOptions,
    artifacts: Artifacts,
    texts: list[str] | None = None,
    progress: Progress | None = None,
) -> ArtifactInfo | None:
    """The stored artifact of this configuration: the one already trained for this model
    version (training is seeded; its history goes to `progress`), else a new one trained and
    stored. None when `progress` stops the training."""
    store = store_of(artifacts)
    data_id = "vader" if texts is None else data_digest(texts)
    info = store.info(model.name, model.version, options.digest(data_id))
    if info is not None:
        for record in info.history:
            if progress is not None:
                progress(dict(record))
        return info
    trained = train(model, options, texts, progress)
    return None if trained is None else store.save(model, trained)


def _trainable(model: Model) -> TextModel:
    try:
        return check_model(model)
    except OptionError as exc:
        raise CannotTrain(str(exc), "unsupported_model") from None


def _check_inputs(model: Model, inputs: Any) -> None:
    if inputs is not None:
        check_texts(inputs)


def _results(options: AutoGnothiTrainOptions) -> int:
    """The targets' record, one per epoch, then the artifact."""
    return options.epochs + 2


def _train(
    model: Model,
    options: AutoGnothiTrainOptions,
    artifacts: Artifacts,
    texts: list[str] | None,
    progress: Progress,
) -> ArtifactInfo | None:
    if not isinstance(model, TextModel):  # checked before: check_model
        raise CannotTrain("AutoGnothi explains text classifiers", "unsupported_model")
    return trained_artifact(model, options, artifacts, texts, progress)


TRAINING = Training(TRAIN_JOB, AutoGnothiTrainOptions, _trainable, _check_inputs, _results, _train)


@dataclass(frozen=True)
class Amortized:
    """Explanations of a batch of texts from one encoder pass and the side network."""

    values: list[np.ndarray]  # per text [n_words, C], efficiency-projected
    full: np.ndarray  # [m, C] v(N): the model's probabilities
    empty: np.ndarray  # [m, C] v(empty): every word deleted
    tokens: list[int]  # per text its encoder tokens ([CLS] and [SEP] included)


def amortized(model: TextModel, trained: Trained, texts: list[str]) -> Amortized:
    """Word values for every class of every text: one encoder pass over the texts and the side
    network. v(empty), the text with every word deleted (its punctuation: few distinct
    strings), is remembered per artifact; new ones take a pass of their own (a few tokens)."""
    empties = empty_texts(model, texts)
    missing = [t for t in dict.fromkeys(empties) if (model.version, t) not in trained.empty]
    if missing:
        check_deadline()
        probs = np.asarray(model.predict_texts(missing), dtype=np.float32)
        if len(trained.empty) > EMPTY_CACHE:
            trained.empty.clear()
        trained.empty.update({(model.version, t): p for t, p in zip(missing, probs, strict=True)})
    empty = torch.from_numpy(np.stack([trained.empty[(model.version, t)] for t in empties]))
    values: list[np.ndarray] = []
    full, tokens = [], []
    for start in range(0, len(texts), CHUNK):  # bounds the hidden states kept: [b, 7, t, 384]
        check_deadline()  # between encoder passes: a client gone or a deadline passed stops
        enc = encode(model, texts[start : start + CHUNK])
        with torch.inference_mode():
            phi = word_values(trained.net, enc, enc.probs, empty[start : start + CHUNK]).numpy()
        n_words = enc.word_mask.sum(dim=1).tolist()
        values += [phi[i, : int(n)].astype(np.float64) for i, n in enumerate(n_words)]
        full.append(enc.probs.numpy())
        tokens += [int(n) for n in enc.token_mask.sum(dim=1).tolist()]
    return Amortized(
        values, np.concatenate(full).astype(np.float64), empty.numpy().astype(np.float64), tokens
    )


def range_warnings(trained: Trained, words: list[str], n_tokens: int) -> tuple[Caveat, ...]:
    """`outside_training_range` when the input is beyond what the side network was trained on
    (or the artifact does not say what that was)."""
    if trained.range is None:
        return (UNKNOWN_RANGE,)
    found = trained.range.outside(words, n_tokens)
    return () if found is None else (found,)


def explain(
    model: Model,
    inputs: np.ndarray,
    *,
    options: AutoGnothiOptions,
    target: int | None = None,
    seed: int = 0,
    budget: int | None = None,
    background: np.ndarray | None = None,
    context: RunContext | None = None,
) -> ExplainResult:
    """Word Shapley values from a trained side network (options pinned to an artifact)."""
    del seed, budget  # deterministic, and the cost is fixed: one pass
    if background is not None:
        raise OptionError("autognothi takes no background: absent words are deleted")
    if not isinstance(model, TextModel):
        raise OptionError("autognothi explains text classifiers")
    if target is not None and not 0 <= target < model.n_outputs:
        raise OptionError(f"target out of range for {model.n_outputs} outputs")
    trained = AutoGnothiStore.load_pinned(model, options.artifact, context)
    texts = [str(x) for x in inputs]
    games = text_games(model, texts)  # OptionError for a text without words
    out = amortized(model, trained, texts)
    explanations = []
    for i, game in enumerate(games):
        c = int(np.argmax(out.full[i])) if target is None else target
        explanations.append(
            Explanation(
                output_index=c,
                values=out.values[i][:, c],
                base_value=float(out.empty[i, c]),
                instance_output_value=float(out.full[i, c]),
                exact=False,
                n_model_evals=1,  # the one encoder pass (v(empty) of its punctuation: cached)
                estimator="autognothi",
                players=game.pieces,
                details={"probabilities": out.full[i].tolist(), "units": "probability"},
                warnings=range_warnings(trained, [p.text for p in game.pieces], out.tokens[i]),
            )
        )
    echo = {**options.echo(), "training": trained.options.model_dump(mode="json")}
    return ExplainResult(tuple(explanations), (), echo, 1, True)


__all__ = [
    "PIN",
    "TRAINING",
    "TRAIN_JOB",
    "AutoGnothiOptions",
    "AutoGnothiStore",
    "AutoGnothiTrainOptions",
    "amortized",
    "check_model",
    "check_texts",
    "explain",
    "range_warnings",
    "store_of",
    "trained_artifact",
]
