"""Value objects shared by every explainer family."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from explainers.games import ExplainerError


class OptionError(ExplainerError):
    """An option or input does not fit the model (wrong shape, unknown name, ...)."""


@dataclass(frozen=True)
class Span:
    """A player that is a piece of an input text: text == input[start:end]."""

    text: str
    start: int
    end: int


@dataclass(frozen=True)
class Caveat:
    """A reason to trust an answer less: `code` is stable (e.g. noisy_estimate), `message` says
    what was seen and what to do."""

    code: str
    message: str


@dataclass(frozen=True)
class Explanation:
    """Attributions for one instance and one output."""

    output_index: int
    values: np.ndarray  # [n_players]
    base_value: float
    instance_output_value: float
    exact: bool
    n_model_evals: int
    estimator: str
    error_std: np.ndarray | None = None
    interactions: dict[str, Any] | None = None  # {"index", "max_order", "values": {"0,1": v}}
    players: tuple[Span, ...] | None = None  # text: this instance's own players (words, tokens)
    details: dict[str, Any] | None = None  # explainer-specific outputs (JSON-ready)
    partial: bool = False  # an anytime estimate cut short by the deadline
    output_name: str | None = None  # the explained scalar when it is not one of the model's outputs
    # explainer-specific caveats (explainers/trust/caveats.py adds the generic ones:
    # noisy_estimate, flat_game, input_out_of_range)
    warnings: tuple[Caveat, ...] = ()

    @property
    def approximation_error(self) -> float:
        """Efficiency gap over every reported term (interactions included when present)."""
        total = (
            sum(self.interactions["values"].values())
            if self.interactions is not None
            else float(self.values.sum())
        )
        return abs(total + self.base_value - self.instance_output_value)


@dataclass(frozen=True)
class ExplainResult:
    """Explanations of a batch plus what the explainer resolved (echoed to the caller)."""

    explanations: tuple[Explanation, ...]
    player_names: tuple[str, ...]  # empty for text: each explanation carries its players
    parameters: dict[str, Any] = field(default_factory=dict)
    budget: int = 0  # per instance, after defaults
    additive: bool = True
    meta: dict[str, Any] = field(default_factory=dict)  # extra facts for the response meta
