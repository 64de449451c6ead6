"""The trained built-in family (diabetes-mlp, breast-cancer-mlp, digits-cnn): deterministic
trainers on sklearn datasets, cached on disk after the first build. The catalog of every built-in
model is models/catalog.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.base import Model, UnknownModelError
from models.builtin.datasets import Split, split_dataset
from models.builtin.training import (
    cached_training,
    config_digest,
    seeded_training,
    training_background,
)
from models.modality import Modality

SEED = 0
TEST_FRACTION = 0.25
# Bump when the training code changes what a config produces, so old caches are not reused.
_CODE_VERSION = 1


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines the trained weights; its digest names the cache files."""

    name: str
    dataset: str
    hidden: tuple[int, ...]
    epochs: int
    lr: float
    weight_decay: float
    seed: int = SEED
    test_fraction: float = TEST_FRACTION
    code_version: int = _CODE_VERSION

    def digest(self) -> str:
        """Short content hash of the config."""
        return config_digest(self)


class Affine(nn.Module):
    """Fixed elementwise `x * scale + shift`; buffers, so training never moves them."""

    scale: torch.Tensor
    shift: torch.Tensor

    def __init__(self, size: int) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(size))
        self.register_buffer("shift", torch.zeros(size))

    def set(self, scale: np.ndarray, shift: np.ndarray) -> None:
        """Overwrite the buffers (float32)."""
        with torch.no_grad():
            self.scale.copy_(torch.as_tensor(scale, dtype=torch.float32))
            self.shift.copy_(torch.as_tensor(shift, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.shift


def dataset_split(name: str) -> Split:
    """The train/test split a built-in model is trained and evaluated on."""
    cfg = _spec(name).config
    return split_dataset(cfg.dataset, cfg.seed, cfg.test_fraction)


def _standardiser(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scale, shift) of the Affine that standardises the columns of x."""
    x64 = x.astype(np.float64)
    mean, std = x64.mean(axis=0), x64.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return 1.0 / std, -mean / std


def _mlp(n_in: int, hidden: tuple[int, ...], n_out: int) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(n_in, width), nn.ReLU()]
        n_in = width
    return [*layers, nn.Linear(n_in, n_out)]


def _build_diabetes(cfg: TrainConfig) -> nn.Sequential:
    return nn.Sequential(Affine(10), *_mlp(10, cfg.hidden, 1), Affine(1))


def _build_breast_cancer(cfg: TrainConfig) -> nn.Sequential:
    return nn.Sequential(Affine(30), *_mlp(30, cfg.hidden, 2), nn.Softmax(dim=1))


def _build_digits(cfg: TrainConfig) -> nn.Sequential:
    c1, c2, fc = cfg.hidden
    return nn.Sequential(
        nn.Conv2d(1, c1, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),  # [m, c1, 4, 4]: pooling early keeps training cheap on a CPU
        nn.Conv2d(c1, c2, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(c2 * 16, fc),
        nn.ReLU(),
        nn.Linear(fc, 10),
        nn.Softmax(dim=1),
    )


def _full_batch_adam(
    net: nn.Module, loss_fn: Callable[[torch.Tensor], torch.Tensor], x: np.ndarray, cfg: TrainConfig
) -> None:
    """Full-batch Adam: no shuffling, so the only randomness is the (seeded) initialisation."""
    inputs = torch.from_numpy(x)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    net.train()
    for _ in range(cfg.epochs):
        opt.zero_grad(set_to_none=True)
        loss_fn(net(inputs)).backward()
        opt.step()


def _fit_regressor(module: nn.Sequential, split: Split, cfg: TrainConfig) -> None:
    """Fit on the standardised target; the last Affine maps back to original units."""
    first, last = module[0], module[-1]
    assert isinstance(first, Affine) and isinstance(last, Affine)
    first.set(*_standardiser(split.x_train))
    y = split.y_train.astype(np.float64)
    y_mean, y_std = y.mean(), y.std()
    target = torch.from_numpy(((y - y_mean) / y_std).astype(np.float32)).unsqueeze(1)
    _full_batch_adam(module[:-1], lambda out: F.mse_loss(out, target), split.x_train, cfg)
    last.set(np.array([y_std]), np.array([y_mean]))


def _fit_classifier(module: nn.Sequential, split: Split, cfg: TrainConfig) -> None:
    """Fit the logits (everything before the softmax) with cross-entropy."""
    first = module[0]
    if isinstance(first, Affine):
        first.set(*_standardiser(split.x_train))
    labels = torch.from_numpy(split.y_train)
    _full_batch_adam(module[:-1], lambda out: F.cross_entropy(out, labels), split.x_train, cfg)


def _predict(module: nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return module(torch.from_numpy(x)).numpy()


def _metrics(module: nn.Module, split: Split, task: str) -> dict[str, float]:
    """Train and held-out R^2 (regression) or accuracy (classification)."""
    out: dict[str, float] = {}
    for part, x, y in (
        ("train", split.x_train, split.y_train),
        ("test", split.x_test, split.y_test),
    ):
        pred = _predict(module, x)
        if task == "regression":
            resid = ((y - pred[:, 0]) ** 2).sum(dtype=np.float64)
            total = ((y - y.mean(dtype=np.float64)) ** 2).sum(dtype=np.float64)
            out[f"{part}_r2"] = float(1.0 - resid / total)
        else:
            out[f"{part}_accuracy"] = float((pred.argmax(axis=1) == y).mean())
    return out


@dataclass(frozen=True)
class _Spec:
    config: TrainConfig
    modality: str
    task: str
    output_names: tuple[str, ...]
    description: str
    build: Callable[[TrainConfig], nn.Sequential]
    fit: Callable[[nn.Sequential, Split, TrainConfig], None]
    batch_size: int = 65536


_SPECS: dict[str, _Spec] = {
    spec.config.name: spec
    for spec in (
        _Spec(
            # Strong L2: on 332 training rows an unregularised MLP overfits (test R^2 < 0.2).
            TrainConfig(
                "diabetes-mlp", "diabetes", hidden=(16,), epochs=300, lr=3e-3, weight_decay=0.1
            ),
            "tabular",
            "regression",
            ("progression",),
            "sklearn load_diabetes(scaled=False): raw features, target in original units",
            _build_diabetes,
            _fit_regressor,
        ),
        _Spec(
            TrainConfig(
                "breast-cancer-mlp",
                "breast_cancer",
                hidden=(32,),
                epochs=200,
                lr=3e-3,
                weight_decay=1e-4,
            ),
            "tabular",
            "classification",
            ("malignant", "benign"),
            "sklearn load_breast_cancer: raw features, classes 0 = malignant, 1 = benign",
            _build_breast_cancer,
            _fit_classifier,
        ),
        _Spec(
            TrainConfig(
                "digits-cnn", "digits", hidden=(16, 32, 64), epochs=60, lr=1e-2, weight_decay=0.0
            ),
            "image",
            "classification",
            tuple(str(d) for d in range(10)),
            "sklearn load_digits: 8x8 images, pixel values / 16 in [0, 1]",
            _build_digits,
            _fit_classifier,
            batch_size=16384,
        ),
    )
}


def _spec(name: str) -> _Spec:
    try:
        return _SPECS[name]
    except KeyError:
        raise UnknownModelError(name) from None


def _train(spec: _Spec, split: Split) -> tuple[nn.Sequential, dict[str, Any]]:
    """Seeded build and fit; the caller's global torch RNG state is left untouched."""

    def fit() -> nn.Sequential:
        module = spec.build(spec.config)
        spec.fit(module, split, spec.config)
        return module

    return seeded_training(
        spec.config.seed, spec.config.epochs, split, fit, lambda m: _metrics(m, split, spec.task)
    )


def load_builtin(name: str, cache_dir: Path) -> Model:
    """Load a built-in model from `cache_dir`, training and caching it first if needed."""
    spec = _spec(name)
    cfg = spec.config
    split = dataset_split(name)
    module, metrics = cached_training(
        cache_dir,
        cfg.name,
        cfg.digest(),
        lambda: spec.build(cfg),
        lambda: _train(spec, split),
    )
    return Model(
        name=cfg.name,
        modality=Modality(spec.modality),
        task=spec.task,
        input_shape=tuple(split.x_train.shape[1:]),
        feature_names=split.feature_names,
        output_names=spec.output_names,
        module=module,
        **training_background(split, cfg.seed),
        batch_size=spec.batch_size,
        reference=split.x_train,
        input_range=(0.0, 1.0) if spec.modality == "image" else None,
        info={
            "dataset": spec.description,
            "seed": cfg.seed,
            "config": asdict(cfg),
            "config_hash": cfg.digest(),
            "training": metrics,
        },
    )


def load_diabetes_mlp(cache_dir: Path) -> Model:
    """MLP regressor of diabetes progression (10 raw features, original target units)."""
    return load_builtin("diabetes-mlp", cache_dir)


def load_breast_cancer_mlp(cache_dir: Path) -> Model:
    """MLP classifier of breast cancer (30 raw features; P(malignant), P(benign))."""
    return load_builtin("breast-cancer-mlp", cache_dir)


def load_digits_cnn(cache_dir: Path) -> Model:
    """Small CNN on 8x8 digits ([1, 8, 8] in [0, 1]; 10 class probabilities)."""
    return load_builtin("digits-cnn", cache_dir)
