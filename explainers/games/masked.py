"""Masked-model games: what "absent" means for a model's input features.

Interventional game (Janzing et al. 2020; shap's Independent masker):
v_x(S) = mean_b f(x_S, b_{N\\S}) over reference rows b; one reference row is a fixed baseline.
Players may group features (image patches); a player's mask covers its whole group.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def patch_groups(input_shape: tuple[int, ...], patch_size: int) -> tuple[np.ndarray, list[str]]:
    """Player index of every flattened feature for square patches over the last two axes."""
    if patch_size < 1:
        raise ValueError("patch_size must be at least 1")
    height, width = input_shape[-2], input_shape[-1]
    rows = -(-height // patch_size)
    cols = -(-width // patch_size)
    r = np.arange(height)[:, None] // patch_size
    c = np.arange(width)[None, :] // patch_size
    grid = np.broadcast_to(r * cols + c, input_shape)  # channels share their patch
    names = [f"patch_{i}_{j}" for i in range(rows) for j in range(cols)]
    return np.ascontiguousarray(grid).reshape(-1), names


class MaskedModelGame:
    """v(S) = mean over reference rows of f(x on S's features, reference elsewhere). [m, k]"""

    def __init__(
        self,
        predict: Callable[[np.ndarray], np.ndarray],
        x: np.ndarray,
        references: np.ndarray,
        groups: np.ndarray | None = None,
        max_rows: int = 1 << 16,
        dtype: str = "float32",  # the model's input dtype (float64 for e.g. LightGBM)
    ) -> None:
        self.predict = predict
        self.input_shape = x.shape
        self.x = np.asarray(x, dtype=dtype).reshape(-1)  # [d]
        self.references = np.asarray(references, dtype=dtype).reshape(
            -1, self.x.shape[0]
        )  # [r, d]
        self.groups = np.arange(self.x.shape[0]) if groups is None else groups
        self.n_players = int(self.groups.max()) + 1
        self.rows_per_coalition = self.references.shape[0]
        self.max_rows = max_rows

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        # C order: indexing columns yields a Fortran-ordered array, np.where then builds the
        # rows in that order and predict pays for a second, contiguous copy.
        features = np.ascontiguousarray(np.asarray(masks, dtype=bool)[:, self.groups])  # [m, d]
        r = self.rows_per_coalition
        step = max(1, self.max_rows // r)
        parts = []
        for start in range(0, features.shape[0], step):
            chunk = features[start : start + step]
            rows = np.where(chunk[:, None, :], self.x, self.references)  # [c, r, d]
            out = self.predict(rows.reshape(-1, *self.input_shape))
            parts.append(out.reshape(chunk.shape[0], r, -1).mean(axis=1, dtype=np.float64))
        return np.concatenate(parts)
