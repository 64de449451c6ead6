"""Targets: the scalar a game explains, as a function of the model's outputs.

COCOA's contrastive corpus similarity (Lin et al., ICLR 2023) is `Similarity(mu_C - mu_F)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


def unit(e: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero)."""
    return e / np.maximum(np.linalg.norm(e, axis=-1, keepdims=True), 1e-12)


@dataclass(frozen=True)
class Similarity:
    """Similarity of embeddings to a direction: e [m, d] -> [m] (cosine when `normalize`)."""

    direction: np.ndarray  # [d]: mu_C - mu_F, mu_C, or the explicand's own (unit) embedding
    normalize: bool

    def __call__(self, e: np.ndarray) -> np.ndarray:
        e = np.asarray(e, dtype=np.float64)
        return (unit(e) if self.normalize else e) @ self.direction

    def torch(self, e: Any) -> Any:
        import torch

        d = torch.as_tensor(self.direction, dtype=e.dtype, device=e.device)
        if self.normalize:
            e = torch.nn.functional.normalize(e, dim=1, eps=1e-12)
        return e @ d
