"""What AttriBoT needs of a causal language model, as a protocol (no torch imported here)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np


class LanguageModelProtocol(Protocol):
    """A causal LM by token ids: summed response log-likelihoods, greedy generation.

    models.builtin.lm.LanguageModel implements it; tests may pass a small fake. `prefix` is the
    implementation's own key/value cache (models.builtin.lm.PrefixCache), returned by `full_pass`.
    """

    @property
    def name(self) -> str: ...

    @property
    def max_tokens(self) -> int:
        """Prompt + response tokens the model accepts."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The tokenizer (transformers); `decode` is the way to read ids back."""
        ...

    def encode(self, text: str, *, bos: bool) -> list[int]:
        """Token ids of `text`, after BOS when `bos` and the model uses one."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids."""
        ...

    def generate(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        """Greedy continuation of `prompt`, without the EOS token."""
        ...

    def response_log_likelihood(
        self,
        prompts: Sequence[list[int]],
        response: list[int],
        *,
        prefix: Any = None,
        batch_size: int = ...,
    ) -> tuple[np.ndarray, int, int]:
        """Σ_t log p(response_t | prompt, response_<t) per prompt, float64 [m]; forward passes
        (sequences run) and tokens computed."""
        ...

    def full_pass(self, prompt: list[int], response: list[int]) -> tuple[float, Any]:
        """ℓ(response | prompt) and the sequence's keys/values for prefix reuse."""
        ...
