"""AutoGnothi's image side network on digits-cnn (a library experiment beside Salvage): the
classifier's weights unchanged, efficiency, patch players, seeded training, and agreement with
exact patch Shapley values above an untrained network's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from explainers.amortized.autognothi import image as autognothi_image
from explainers.explanation import OptionError
from explainers.games.masked import MaskedModelGame, patch_groups
from explainers.shapley.explainer import shapley_values
from models.base import Model, weights_hash
from models.builtin.trained import dataset_split

TINY = {"rows": 64, "epochs": 2, "batch_size": 32, "pairs": 2, "seed": 3}


# One torch thread, as in the service's job workers: much faster on a shared CPU.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_tiny_training_is_seeded_efficient_and_leaves_the_model(digits: Model) -> None:
    before = weights_hash(digits.module)
    net, metrics = autognothi_image.train(digits, autognothi_image.ImageTrainOptions(**TINY))
    again, _ = autognothi_image.train(digits, autognothi_image.ImageTrainOptions(**TINY))
    assert weights_hash(digits.module) == before == metrics["model_weights"]
    x = dataset_split("digits-cnn").x_test[:3]
    values = autognothi_image.amortized(digits, net, x)
    assert values.shape == (3, 16, 10)
    np.testing.assert_allclose(
        values, autognothi_image.amortized(digits, again, x), rtol=1e-5, atol=1e-6
    )
    full = digits.predict(x)
    empty = digits.predict(np.zeros_like(x[:1]))
    np.testing.assert_allclose(values.sum(axis=1), full - empty, rtol=1e-5, atol=1e-6)
    with pytest.raises(OptionError):
        autognothi_image.train(
            dataclasses.replace(digits, modality="tabular"),
            autognothi_image.ImageTrainOptions(**TINY),
        )


def test_trained_side_network_tracks_exact_shapley(digits: Model) -> None:
    opts = autognothi_image.ImageTrainOptions(rows=400, epochs=15, seed=0)
    net, _ = autognothi_image.train(digits, opts)
    torch.manual_seed(0)
    untrained = autognothi_image.ImageSideNet(net.channels, 10, net.width).eval()
    x = dataset_split("digits-cnn").x_test[:4]
    ours, base = (autognothi_image.amortized(digits, n, x) for n in (net, untrained))
    references = np.zeros((1, 64), dtype=np.float32)  # absent patches zeroed
    groups, _ = patch_groups(digits.input_shape, 2)
    trained_r, untrained_r = [], []
    for j, image in enumerate(x):
        game = MaskedModelGame(digits.predict, image, references, groups, 4096)
        exact = shapley_values(game, 16, estimator="exact")
        c = int(np.argmax(exact.full_value))
        trained_r.append(np.corrcoef(exact.values[:, c], ours[j, :, c])[0, 1])
        untrained_r.append(np.corrcoef(exact.values[:, c], base[j, :, c])[0, 1])
    assert np.mean(trained_r) > 0.7, trained_r
    assert np.mean(trained_r) > np.mean(untrained_r) + 0.2, (trained_r, untrained_r)
