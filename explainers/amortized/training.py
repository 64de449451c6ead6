"""How an amortized explainer trains, declared once on its registry line (`ExplainerSpec.training`).

A job runner (app/jobs/training.py) needs nothing else to train any of them: check the model,
parse the options, check the training inputs a job sent, count the results the job stores (its
progress records, then the artifact), and train or find the stored artifact of that
configuration. Salvage (Naouar et al., ICLR 2025) and AutoGnothi (Wang et al., ICLR 2025).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from explainers.games import ExplainerError

if TYPE_CHECKING:
    from explainers.amortized.progress import Progress
    from explainers.amortized.store import ArtifactInfo
    from explainers.context import Artifacts
    from models.base import Model


class CannotTrain(ExplainerError):
    """This explainer cannot train beside that model (400, with its own code)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Training:
    """One amortized explainer's training: what a job of kind `job` runs."""

    job: str  # the job kind, e.g. "train-salvage" (named in the 409 before training)
    options: type[BaseModel]  # the job's parameters
    check_model: Callable[[Model], Model]  # the model if it can train beside it, else CannotTrain
    # Training inputs sent with a job (None: the model's own data); OptionError when unusable
    check_inputs: Callable[[Model, Any], None]
    total: Callable[[Any], int]  # options -> results the job stores (progress, then artifact)
    # (model, options, artifacts, inputs, progress) -> the stored artifact of this
    # configuration (trained now, or before: its history replayed to `progress`); None when
    # `progress` stopped the training
    train: Callable[[Model, Any, Artifacts, Any, Progress], ArtifactInfo | None]
    summary: tuple[str, ...] = ()  # the artifact's config fields a job summary names


__all__ = ["CannotTrain", "Training"]
