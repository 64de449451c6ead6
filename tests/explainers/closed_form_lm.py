"""A causal language model in closed form (models/lm_protocol.py), for tests that need no torch."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np


class ClosedFormLM:
    """A causal LM stand-in (models/lm_protocol.py) whose response log-likelihood is a fixed
    function of the prompt's words: ℓ = -|response| + 0.1 Σ w(word) (+1 for a word pair)."""

    name = "closed-form"
    max_tokens = 10_000

    def __init__(self, reply: str | None = None) -> None:
        self.vocab: dict[str, int] = {}
        self.passes = 0
        self.reply = reply  # what `generate` answers, whatever the prompt

    @property
    def tokenizer(self) -> Any:
        return self  # `decode` is all AttriBoT reads of a tokenizer

    def encode(self, text: str, *, bos: bool) -> list[int]:
        ids = [self.vocab.setdefault(word, len(self.vocab) + 1) for word in text.split()]
        return [0, *ids] if bos else ids

    def decode(self, ids: Sequence[int]) -> str:
        words = {i: w for w, i in self.vocab.items()}
        return " ".join(words[i] for i in ids if i)

    def generate(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        if self.reply is None:
            raise AssertionError("no reply: send the response")
        return self.encode(self.reply, bos=False)[:max_new_tokens]

    def value(self, prompt: list[int], response: list[int]) -> float:
        words = {i: w for w, i in self.vocab.items()}
        present = [words[i] for i in prompt if i]
        weight = sum((zlib.crc32(w.encode()) % 97) / 97 - 0.5 for w in present)
        pair = 1.0 if {"Zorblat", "harbour."} <= set(present) else 0.0
        return -len(response) + 0.1 * weight + pair

    def response_log_likelihood(
        self,
        prompts: Sequence[list[int]],
        response: list[int],
        *,
        prefix: Any = None,
        batch_size: int = 8,
    ) -> tuple[np.ndarray, int, int]:
        self.passes += len(prompts)
        ll = np.array([self.value(p, response) for p in prompts])
        return ll, len(prompts), sum(len(p) + len(response) for p in prompts)

    def full_pass(self, prompt: list[int], response: list[int]) -> tuple[float, Any]:
        self.passes += 1
        return self.value(prompt, response), None
