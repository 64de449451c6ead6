"""Peer check on a built-in model: our exact Shapley values equal shap's ExactExplainer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import shap

from explainers import shapley_values
from explainers.games.masked import MaskedModelGame
from models.registry import ModelRegistry


def test_exact_equals_shap_exact_on_diabetes(model_dir: Path) -> None:
    model = ModelRegistry(model_dir).get("diabetes-mlp")
    assert model.background is not None
    background = model.background[:50]
    explicands = model.background[50:55]

    def f(x: np.ndarray) -> np.ndarray:
        return model.predict(x)[:, 0]

    peer = shap.ExactExplainer(f, shap.maskers.Independent(background, max_samples=50))(explicands)
    for i, x in enumerate(explicands):
        ours = shapley_values(MaskedModelGame(model.predict, x, background), 10, estimator="exact")
        assert ours.exact and ours.n_evaluations == 1024 * 50
        # float32 outputs of ~150 (ulp 1.5e-5) batched differently by shap and by us
        atol = 1e-6 * abs(peer.base_values[i])
        np.testing.assert_allclose(ours.values[:, 0], peer.values[i], rtol=1e-5, atol=atol)
        np.testing.assert_allclose(ours.base_value[0], peer.base_values[i], rtol=1e-5, atol=atol)
