"""What an explainer gets from whoever runs it: one typed request, one run context, never
module globals.

Every explainer is an `Explainer`: an `ExplainRequest` in (model, inputs, options, target, seed,
budget, background, the explainer's own request fields, the run context), an `ExplainResult`
out. A family's plain library function keeps its keyword form
(`explain(model, inputs, *, options, target, seed, budget, background, ...)`); the registry
adapts it to the request once (explainers/registry.py, `LibraryExplainer`).

The service (or a library user) builds a `RunContext` per app: a key-value store (COCOA caches
corpus and foil mean embeddings in it), where trained explainers live (Salvage, AutoGnothi), and
how a learned baseline's values are found (Ren et al. 2023: a learn-baseline job's result).
Explainers declare what they use on their registry line (`ExplainerSpec.uses_context`,
`ExplainerSpec.pin`); the service has no case for any one of them. Deadlines and cancel checks
travel as before, scoped to a run (explainers/games/deadlines.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from explainers.games import ExplainerError

if TYPE_CHECKING:  # the context itself needs no torch
    import numpy as np
    from pydantic import BaseModel

    from explainers.explanation import ExplainResult
    from models.base import Model
    from models.store import ModelStore


class KeyValueStore(Protocol):
    """A string cache (the service's Redis or in-process cache); may raise when unreachable."""

    def get(self, key: str) -> str | None: ...

    def set(self, key: str, value: str) -> None: ...


@dataclass(frozen=True)
class Artifacts:
    """Where trained explainers live: `db` (shared by every process), cached under
    `root/<kind>/`, or under `root/<kind>/` alone without a database."""

    root: Path
    db: ModelStore | None = None

    def folder(self, kind: str) -> Path:
        return self.root / kind


# A learned baseline's values by reference (model, ref) -> values: raises when there is none
# for this model version (the service: a succeeded learn-baseline job of the model).
BaselineLookup = Callable[["Model", str], Any]


class NotTrainedError(ExplainerError):
    """No trained artifact fits the model version and the requested configuration."""


class NoContextError(ExplainerError):
    """The explainer needs something the run context does not hold."""


@dataclass(frozen=True)
class RunContext:
    """What one app offers its explainers; every field optional (a bare library call)."""

    store: KeyValueStore | None = None
    artifacts: Artifacts | None = None
    baselines: BaselineLookup | None = None

    def need_artifacts(self, who: str) -> Artifacts:
        if self.artifacts is None:
            raise NoContextError(f"{who} needs a run context with an artifact store")
        return self.artifacts


@dataclass(frozen=True)
class Pin:
    """Binds an explainer's options to stored state before the cache key is made (the trained
    artifact that answers, a learned baseline's values), so that new state never serves stale
    answers. `bind` may read stores (I/O); `applies` says without I/O whether it would."""

    bind: Callable[[Model, Any, RunContext], Any]
    applies: Callable[[Any], bool] = lambda options: True


def _uses_learned_baseline(options: Any) -> bool:
    masker = getattr(options, "masker", None)
    return masker is not None and getattr(masker, "ref", None) is not None


def _bind_learned_baseline(model: Model, options: Any, context: RunContext) -> Any:
    """`masker.ref` (a learn-baseline job id) -> `masker.value`, the learned values."""
    masker = options.masker
    if context.baselines is None:
        raise NoContextError(f"no learned baselines here: masker.ref {masker.ref!r}")
    values = context.baselines(model, masker.ref)
    return options.model_copy(update={"masker": masker.model_copy(update={"value": values})})


# The removal-based explainers whose `masker` may name a learned baseline (explainers/masking.py).
LEARNED_BASELINE = Pin(_bind_learned_baseline, _uses_learned_baseline)


@dataclass(frozen=True)
class ExplainRequest:
    """One explain call: the same fields for every explainer (DESIGN.md 4.15)."""

    model: Model
    inputs: np.ndarray  # the model's native rows (float32 [m, *shape], or str [m]); may be empty
    options: BaseModel  # the explainer's options (its ExplainerSpec.options), pinned
    target: int | tuple[int, ...] | None = None  # a tuple: several outputs, in the order asked
    seed: int = 0
    budget: int | None = None  # model evaluations per instance; None: the explainer's default
    background: np.ndarray | None = None  # rows [r, *shape] the request sent
    fields: Mapping[str, Any] = field(default_factory=dict)  # the explainer's own request fields
    context: RunContext | None = None  # what the app offers (ExplainerSpec.uses_context)


class Explainer(Protocol):
    """Anything that answers an ExplainRequest with an ExplainResult."""

    def __call__(self, request: ExplainRequest) -> ExplainResult: ...

__all__ = [
    "LEARNED_BASELINE",
    "Artifacts",
    "BaselineLookup",
    "ExplainRequest",
    "Explainer",
    "KeyValueStore",
    "NoContextError",
    "NotTrainedError",
    "Pin",
    "RunContext",
]
