"""The span-removal game of a language model: v(removed spans) = ℓ(response | prompt without them).

ℓ = Σ_t log p(y_t | prompt, y_<t) of a fixed response (AttriBoT, Liu et al. ICLR 2025;
ContextCite, Cohen-Wang et al. 2024). Players are sets of context sentences (a sentence, or a
paragraph's sentences). A batch shares the KV cache of the base prompt's pass (exact).
`SpanGame` evaluates removals; `SpanMaskGame` is the same game over coalition masks, for the
estimators (leave-one-out, ContextCite's surrogate), each through a recorder.
No torch here: the language model does the tensor work.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from explainers.explanation import OptionError
from explainers.games.sentences import ContextTree
from models.lm_protocol import LanguageModelProtocol as LanguageModel

PLACEHOLDER = re.compile(r"\{(context|query)\}")


@dataclass
class Prompting:
    """What the games of one explanation share: the prompt, the response and the accounting."""

    tree: ContextTree
    query: str
    template: str
    response: str
    kv_cache: bool
    batch_size: int
    passes: dict[str, int] = field(default_factory=dict)  # forward passes per model
    computed: dict[str, int] = field(default_factory=dict)  # tokens run per model
    tokens: dict[str, list[int]] = field(default_factory=dict)  # response ids per model

    def prompt(self, lm: LanguageModel, removed: frozenset[int]) -> list[int]:
        context = self.tree.without(removed)
        values = {"context": context, "query": self.query}
        text = PLACEHOLDER.sub(lambda m: values[m.group(1)], self.template)
        return [int(i) for i in lm.encode(text, bos=True)]

    def response_ids(self, lm: LanguageModel) -> list[int]:
        if lm.name not in self.tokens:  # tokenizers differ: the text is re-encoded per model
            self.tokens[lm.name] = [int(i) for i in lm.encode(self.response, bos=False)]
        return self.tokens[lm.name]

    def count(self, lm: LanguageModel, n: int, tokens: int) -> None:
        self.passes[lm.name] = self.passes.get(lm.name, 0) + n
        self.computed[lm.name] = self.computed.get(lm.name, 0) + tokens


@dataclass(frozen=True)
class SpanGame:
    """v(removed) = ℓ(response | prompt with the `removed` sentences left out) under `lm`."""

    lm: LanguageModel
    shared: Prompting

    def evaluate(
        self, base: frozenset[int], removals: Sequence[frozenset[int]], skip_unchanged: bool = True
    ) -> tuple[float, np.ndarray]:
        """(v(base), v(base ∪ r) per r) [m]: one reference pass, then the batch on its cache.

        With `skip_unchanged`, a removal that leaves the prompt as it is costs no pass.
        """
        lm, shared = self.lm, self.shared
        response = shared.response_ids(lm)
        prompt = shared.prompt(lm, base)
        prompts = [shared.prompt(lm, base | r) for r in removals]
        for p in (prompt, *prompts):
            if len(p) + len(response) > lm.max_tokens:
                raise OptionError(
                    f"prompt and response take {len(p) + len(response)} tokens of "
                    f"{lm.name}; at most {lm.max_tokens}"
                )
        full, prefix = self._reference(prompt, response)
        todo = [k for k, p in enumerate(prompts) if p != prompt or not skip_unchanged]
        values = np.full(len(removals), full)
        if todo:
            ll, n, tokens = lm.response_log_likelihood(
                [prompts[k] for k in todo], response, prefix=prefix, batch_size=shared.batch_size
            )
            values[todo] = ll
            shared.count(lm, n, tokens)
        return full, values

    def _reference(self, prompt: list[int], response: list[int]) -> tuple[float, Any]:
        """ℓ of the base prompt, and its keys/values when the KV cache is on."""
        self.shared.count(self.lm, 1, len(prompt) + len(response))
        if self.shared.kv_cache:
            return self.lm.full_pass(prompt, response)
        return float(self.lm.response_log_likelihood([prompt], response)[0][0]), None


@dataclass(frozen=True)
class SpanMaskGame:
    """The span game as a coalition game: v(masks [m, n], True = unit present) [m] = ℓ with the
    absent units' sentences (and the `base` sentences) left out. One reference pass (of the
    base prompt) per call; a mask that leaves that prompt as it is (every unit present, or only
    empty units absent) costs no pass."""

    game: SpanGame
    units: tuple[frozenset[int], ...]  # the sentences of each player
    base: frozenset[int] = frozenset()  # sentences removed whatever the mask

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        masks = np.atleast_2d(np.asarray(masks, dtype=bool))
        removals = [
            frozenset[int]().union(*(self.units[j] for j in np.flatnonzero(~row)))
            for row in masks
        ]
        return self.game.evaluate(self.base, removals)[1]


__all__ = ["LanguageModel", "Prompting", "SpanGame", "SpanMaskGame"]
