"""Fixtures shared by the explainer tests: digits-cnn from the model cache, and a tiny
AutoGnothi side network trained on sentiment-minilm (one per test module)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from explainers.amortized.autognothi import train as autognothi_train
from models.base import Model
from models.builtin.trained import load_digits_cnn
from tests.explainers.autognothi_setup import TINY


@pytest.fixture(scope="session")
def digits(model_dir: Path) -> Model:
    return load_digits_cnn(model_dir)


@pytest.fixture(scope="module")
def tiny(text_model: Any, one_torch_thread: None) -> autognothi_train.Trained:
    """A side network trained with TINY (seeded: the same network in every module)."""
    out = autognothi_train.train(text_model, autognothi_train.AutoGnothiTrainOptions(**TINY))
    assert out is not None
    return out
