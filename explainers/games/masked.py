"""Masked-model games: what "absent" means for a model's input features.

Interventional game (Janzing et al. 2020; shap's Independent masker):
v_x(S) = mean_b f(x_S, b_{N\\S}) over reference rows b; one reference row is a fixed baseline.
Players may group features (image patches, superpixels); a player's mask covers its whole group.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from explainers.games import hierarchy
from explainers.games.deadlines import check_deadline
from explainers.games.hierarchy import Hierarchy

# Bytes of the masked rows [c, r, d] one chunk builds in host memory (models/device.py's
# HOST_BYTES: the games import no torch, so the figure is repeated here).
HOST_BYTES = 256 << 20
PATCH_GRID = 16  # default patches: at most this many along the longer side


def default_patch_size(input_shape: tuple[int, ...]) -> int:
    """Side of the default square patches: max(2, ceil(max(H, W) / 16)), so at most 16 x 16 =
    256 players, which the default budget (2n + 2048 coalitions) estimates usably; 8x8 digits
    keep patch 2."""
    return max(2, math.ceil(max(input_shape[-2], input_shape[-1]) / PATCH_GRID))


def patch_groups(input_shape: tuple[int, ...], patch_size: int) -> tuple[np.ndarray, list[str]]:
    """Player index of every flattened feature for square patches over the last two axes
    (edge patches are smaller where the side does not divide)."""
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


def centres(pixel_players: np.ndarray) -> np.ndarray:
    """(row, col) centroid of each player of an [H, W] player map. [n, 2] float64"""
    h, w = pixel_players.shape
    flat = pixel_players.reshape(-1)
    n = int(flat.max()) + 1
    count = np.bincount(flat, minlength=n).astype(np.float64)
    rows = np.repeat(np.arange(h, dtype=np.float64), w)
    cols = np.tile(np.arange(w, dtype=np.float64), h)
    return np.stack(
        [np.bincount(flat, rows, n) / count, np.bincount(flat, cols, n) / count], axis=1
    )


def spatial_hierarchy(pixel_players: np.ndarray) -> Hierarchy:
    """A balanced binary hierarchy of image players by position, for Owen values."""
    return hierarchy.spatial(centres(pixel_players))


class MaskedModelGame:
    """v(S) = mean over reference rows of f(x on S's features, reference elsewhere). [m, k]

    Coalitions are evaluated in chunks of at most `max_rows` model rows and HOST_BYTES of
    masked inputs; the deadline and cancel check runs between chunks. `hierarchy`: a nested
    tuple of player indices (image players by position) for the partition estimator, or None.
    """

    def __init__(
        self,
        predict: Callable[[np.ndarray], np.ndarray],
        x: np.ndarray,
        references: np.ndarray,
        groups: np.ndarray | None = None,
        max_rows: int = 1 << 16,
        dtype: str = "float32",  # the model's input dtype (float64 for e.g. LightGBM)
        hierarchy: Hierarchy | None = None,
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
        self.hierarchy = hierarchy

    def chunk(self) -> int:
        """Coalitions per model call: max_rows rows and HOST_BYTES of rows [c, r, d]."""
        r = self.rows_per_coalition
        row_bytes = max(1, self.x.shape[0] * self.x.itemsize)
        return max(1, min(self.max_rows // r, HOST_BYTES // (r * row_bytes)))

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        masks = np.asarray(masks, dtype=bool)
        r, step = self.rows_per_coalition, self.chunk()
        parts = []
        for start in range(0, masks.shape[0], step):
            check_deadline()
            # C order: indexing columns yields a Fortran-ordered array, np.where then builds
            # the rows in that order and predict pays for a second, contiguous copy.
            chunk = np.ascontiguousarray(masks[start : start + step][:, self.groups])  # [c, d]
            rows = np.where(chunk[:, None, :], self.x, self.references)  # [c, r, d]
            out = self.predict(rows.reshape(-1, *self.input_shape))
            parts.append(out.reshape(chunk.shape[0], r, -1).mean(axis=1, dtype=np.float64))
        return np.concatenate(parts)
