"""Patch groups and the masked-model (interventional / baseline) game."""

from __future__ import annotations

import numpy as np
import pytest

from explainers import shapley_values
from explainers.games.masked import MaskedModelGame, patch_groups
from tests.explainers.shapley_oracles import float32_exact


def test_patch_groups_dividing() -> None:
    groups, names = patch_groups((1, 8, 8), 2)
    assert groups.shape == (64,)
    assert len(names) == 16 == groups.max() + 1
    assert len(set(names)) == 16
    np.testing.assert_array_equal(np.bincount(groups), np.full(16, 4))
    grid = groups.reshape(8, 8)
    for player in range(16):
        rows, cols = np.nonzero(grid == player)
        # one 2x2 block, row-major patch order
        assert rows.max() - rows.min() == 1 and cols.max() - cols.min() == 1
        assert (rows.min() // 2, cols.min() // 2) == divmod(player, 4)


def test_patch_groups_channels_share_patches() -> None:
    groups, names = patch_groups((3, 8, 8), 2)
    assert groups.shape == (3 * 64,) and len(names) == 16
    np.testing.assert_array_equal(np.bincount(groups), np.full(16, 12))
    per_channel = groups.reshape(3, 64)
    np.testing.assert_array_equal(per_channel[0], per_channel[1])
    np.testing.assert_array_equal(per_channel[0], per_channel[2])


@pytest.mark.parametrize(
    ("shape", "patch", "players"),
    [
        ((1, 7, 7), 3, 9),
        ((1, 5, 9), 4, 6),
        ((2, 6, 6), 4, 4),
        ((1, 10, 3), 2, 10),
        ((1, 8, 8), 8, 1),
        ((1, 8, 8), 11, 1),  # larger than the image
        ((8, 8), 3, 9),  # no channel axis
    ],
)
def test_patch_groups_non_dividing_cover_every_pixel(shape, patch: int, players: int) -> None:
    groups, names = patch_groups(shape, patch)
    assert groups.shape == (int(np.prod(shape)),)
    assert len(names) == players
    counts = np.bincount(groups, minlength=players)
    assert counts.shape == (players,) and np.all(counts > 0)  # every player owns pixels
    assert counts.sum() == groups.size  # every pixel belongs to exactly one player
    assert counts.max() <= patch * patch * (shape[0] if len(shape) == 3 else 1)


def test_patch_groups_rejects_bad_size() -> None:
    with pytest.raises(ValueError):
        patch_groups((1, 8, 8), 0)


def nonlinear_model(d: int, k: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(d, k))

    def predict(batch: np.ndarray) -> np.ndarray:
        flat = batch.reshape(batch.shape[0], -1).astype(np.float64)
        return np.tanh(flat @ w) + 0.1 * flat[:, :1] ** 2

    return predict


def random_masks(m: int, n: int, seed: int) -> np.ndarray:
    masks = np.random.default_rng(seed).random((m, n)) < 0.5
    masks[0], masks[1] = False, True  # empty and full coalitions included
    return masks


def test_single_reference_is_a_baseline_game() -> None:
    rng = np.random.default_rng(0)
    d = 6
    x, b = float32_exact(rng, (d,)), float32_exact(rng, (d,))
    predict = nonlinear_model(d, 3)
    game = MaskedModelGame(predict, x, b[None, :])
    assert game.rows_per_coalition == 1 and game.n_players == d
    masks = random_masks(40, d, seed=1)
    expected = predict(x * masks + b * (1 - masks))
    np.testing.assert_allclose(game(masks), expected, atol=1e-12)
    # a reference without the batch axis means the same
    np.testing.assert_allclose(MaskedModelGame(predict, x, b)(masks), expected, atol=1e-12)


def test_image_game_upsamples_patch_masks() -> None:
    rng = np.random.default_rng(2)
    shape = (2, 6, 6)
    x = float32_exact(rng, shape)
    baseline = np.zeros((1, *shape))
    groups, names = patch_groups(shape, 3)
    predict = nonlinear_model(int(np.prod(shape)), 2)
    game = MaskedModelGame(predict, x, baseline, groups)
    assert game.n_players == len(names) == 4
    masks = random_masks(16, 4, seed=3)
    pixel_masks = masks[:, groups].reshape(-1, *shape)
    expected = predict(x[None] * pixel_masks)
    np.testing.assert_allclose(game(masks), expected, atol=1e-12)


def test_background_game_is_the_mean_over_references() -> None:
    rng = np.random.default_rng(4)
    d, rows = 5, 7
    x, refs = float32_exact(rng, (d,)), float32_exact(rng, (rows, d))
    predict = nonlinear_model(d, 2)
    masks = random_masks(30, d, seed=5)
    expected = np.mean([predict(x * masks + ref * (1 - masks)) for ref in refs], axis=0)  # [m, k]
    game = MaskedModelGame(predict, x, refs)
    assert game.rows_per_coalition == rows
    np.testing.assert_allclose(game(masks), expected, atol=1e-12)
    # chunking the model calls (max_rows not a multiple of the references) changes nothing
    chunked = MaskedModelGame(predict, x, refs, max_rows=10)
    np.testing.assert_allclose(chunked(masks), expected, atol=1e-12)
    tiny = MaskedModelGame(predict, x, refs, max_rows=3)  # fewer rows than references
    np.testing.assert_allclose(tiny(masks), expected, atol=1e-12)


def test_linear_image_model_patch_shapley() -> None:
    """f = <w, x>: a patch's Shapley value is the sum of w (x - b) over its pixels."""
    rng = np.random.default_rng(6)
    shape = (1, 8, 8)
    x, baseline = float32_exact(rng, shape), float32_exact(rng, shape)
    w = rng.normal(size=64)

    def predict(batch: np.ndarray) -> np.ndarray:
        return batch.reshape(batch.shape[0], -1).astype(np.float64) @ w

    groups, names = patch_groups(shape, 2)
    game = MaskedModelGame(predict, x, baseline[None], groups)
    est = shapley_values(game, len(names), estimator="exact")
    assert est.exact and est.n_evaluations == 1 << 16
    expected = np.bincount(groups, weights=w * (x - baseline).reshape(-1), minlength=16)
    np.testing.assert_allclose(est.values[:, 0], expected, atol=1e-9)
