"""The sklearn datasets the trained built-in models learn from, and their fixed splits."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Split:
    """A fixed train/test split: float32 inputs, float32 (regression) or int64 (class) targets."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    feature_names: tuple[str, ...]


def _load_dataset(dataset: str) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Inputs, targets and feature names of one sklearn dataset, in the models' input units."""
    from sklearn import datasets

    if dataset == "diabetes":
        bunch = datasets.load_diabetes(scaled=False)
        return (
            bunch.data.astype(np.float32),
            bunch.target.astype(np.float32),
            tuple(bunch.feature_names),
        )
    if dataset == "breast_cancer":
        bunch = datasets.load_breast_cancer()
        return (
            bunch.data.astype(np.float32),
            bunch.target.astype(np.int64),
            tuple(str(f) for f in bunch.feature_names),
        )
    if dataset == "digits":
        bunch = datasets.load_digits()
        x = (bunch.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
        names = tuple(f"pixel_{r}_{c}" for r in range(8) for c in range(8))
        return x, bunch.target.astype(np.int64), names
    raise ValueError(f"unknown dataset {dataset!r}")


def split_dataset(dataset: str, seed: int, test_fraction: float) -> Split:
    """A seeded permutation: the first `test_fraction` of it is the test split."""
    x, y, names = _load_dataset(dataset)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = round(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return Split(x[train], y[train], x[test], y[test], names)
