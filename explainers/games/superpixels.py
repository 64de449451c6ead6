"""Superpixel players of an image: SLIC segments (Achanta et al. 2012, "SLIC superpixels
compared to state-of-the-art superpixel methods"; scikit-image's `slic`), as LIME and shap's
image examples use them, and their run-length code for the answer's details.

The segmentation is the instance's own (players differ per instance, as a text's words do);
SLIC starts from a regular grid of centres and has no random step, so one image always gives
the same segments.
"""

from __future__ import annotations

from typing import Any

import numpy as np

COMPACTNESS = 10.0  # scikit-image's default, for colours on Lab's 0-100 scale


def slic_players(x: np.ndarray, n_segments: int) -> np.ndarray:
    """Player of every pixel of image x ([C, H, W] channels first, or [H, W]): about
    `n_segments` connected SLIC superpixels, numbered 0..n-1 in the order SLIC seeds them
    (row-major). [H, W] int64

    The image is scaled to [0, 1] by its own range first (models read inputs on any scale);
    three channels are taken as RGB and segmented in Lab, others on Lab's 0-100 lightness scale,
    so one compactness suits both.
    """
    from skimage.segmentation import slic

    image = np.asarray(x, dtype=np.float64)
    height, width = image.shape[-2:]
    hwc = np.moveaxis(image.reshape(-1, height, width), 0, -1)  # [H, W, C]
    low, high = float(hwc.min()), float(hwc.max())
    scaled = (hwc - low) / (high - low) if high > low else np.zeros_like(hwc)
    rgb = hwc.shape[-1] == 3
    labels = slic(
        scaled if rgb else scaled * 100.0,
        n_segments=n_segments,
        compactness=COMPACTNESS,
        start_label=0,
        channel_axis=-1,
        convert2lab=rgb,
        enforce_connectivity=True,
    )
    _, dense = np.unique(labels, return_inverse=True)  # 0..n-1 without gaps
    return dense.reshape(height, width).astype(np.int64)


def feature_groups(pixel_players: np.ndarray, input_shape: tuple[int, ...]) -> np.ndarray:
    """Player of every flattened input feature: the channels share their pixel's. [d]"""
    return np.ascontiguousarray(np.broadcast_to(pixel_players, input_shape)).reshape(-1)


def encode(pixel_players: np.ndarray) -> dict[str, Any]:
    """{"shape": [H, W], "rle": [player, count, player, count, ...]}: runs of equal players in
    row-major order over H x W (details.segments)."""
    flat = np.asarray(pixel_players, dtype=np.int64).reshape(-1)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(flat)) + 1])
    counts = np.diff(np.concatenate([starts, [flat.size]]))
    runs = np.empty(2 * len(starts), dtype=np.int64)
    runs[0::2], runs[1::2] = flat[starts], counts
    return {"shape": list(pixel_players.shape), "rle": runs.tolist()}


def decode(segments: dict[str, Any]) -> np.ndarray:
    """The [H, W] player map of `encode`'s output."""
    runs = np.asarray(segments["rle"], dtype=np.int64).reshape(-1, 2)
    return np.repeat(runs[:, 0], runs[:, 1]).reshape(segments["shape"])


__all__ = ["decode", "encode", "feature_groups", "slic_players"]
