"""digits-sst: a digits classifier trained to output its own sufficient subset with its prediction.

Sufficient subset training (SST; Bassan, Eliav, Gur & Katz, "Explain Yourself, Briefly!
Self-Explaining Neural Networks with Concise Sufficient Reasons", ICLR 2025): besides the class,
the network outputs a subset of its input's players, trained with a dual objective so that the
prediction on the subset-only input (the subset's pixels kept, every other pixel absent) is the
prediction on the full input, plus a sparsity term that keeps the subset small.

Players and absence are those of `sufficient-subset` on digits-cnn by default: 2x2 patches of the
8x8 image (16 players, numbered row by row: patch (i, j) is 4 i + j) and a zero baseline. The
subset is a selector head's logits > 0, one forward pass; the hard 0/1 mask is trained with a
straight-through estimator (hard forward, sigmoid gradient), the sparsity weight warmed up from 0
so that the selector does not collapse to the empty subset before the classifier can use it.
The forward pass is an ordinary classifier's (10 class probabilities), so every explainer runs
on it; `own_subset` reads the selector.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.base import Model, ModelError
from models.datasets import Split, split_dataset
from models.training import cached_training, config_digest, seeded_training, training_background

NAME = "digits-sst"
PATCH = 2  # side of a player's square patch, as sufficient-subset's default patch_size
GRID = 4  # 8x8 pixels / 2x2 patches: 4x4 players
N_PLAYERS = GRID * GRID
_CODE_VERSION = 1  # bump when the training code changes what a config produces


@dataclass(frozen=True)
class SSTConfig:
    """Everything that determines the trained weights; its digest names the cache files."""

    name: str = NAME
    dataset: str = "digits"
    epochs: int = 300  # full-batch Adam steps (about a minute on one CPU thread)
    lr: float = 3e-3
    sparsity: float = 1.0  # weight of the mean selection probability in the loss
    warmup: float = 0.5  # share of the epochs over which the sparsity weight rises from 0
    selector_bias: float = 2.0  # initial selector logit: every patch kept at the start
    seed: int = 0
    test_fraction: float = 0.25  # the built-in family's split (models/builtin.py)
    code_version: int = _CODE_VERSION

    def digest(self) -> str:
        """Short content hash of the config."""
        return config_digest(self)


def _trunk(out: int) -> nn.Sequential:
    """digits-cnn's convolutional trunk up to the 4x4 grid (one cell per 2x2 patch)."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),  # [m, 16, 4, 4]
        nn.Conv2d(16, out, 3, padding=1),
        nn.ReLU(),
    )


class SSTNet(nn.Module):
    """Classifier and subset selector: forward -> class probabilities [m, 10]."""

    def __init__(self, selector_bias: float = 0.0) -> None:
        super().__init__()
        self.classifier = nn.Sequential(
            _trunk(32), nn.Flatten(), nn.Linear(32 * 16, 64), nn.ReLU(), nn.Linear(64, 10)
        )
        head = nn.Conv2d(32, 1, 1)  # one logit per grid cell, i.e. per patch
        assert head.bias is not None  # Conv2d's default bias=True
        nn.init.constant_(head.bias, selector_bias)
        self.selector = nn.Sequential(_trunk(32), head, nn.Flatten())  # [m, 16]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.classifier(x), dim=1)

    def selection_logits(self, x: torch.Tensor) -> torch.Tensor:
        """[m, 1, 8, 8] -> [m, 16]: > 0 keeps the patch (players numbered 4 i + j)."""
        return self.selector(x)

    def own_subset(self, x: torch.Tensor) -> torch.Tensor:
        """The network's own sufficient subset of x: bool [m, 16]."""
        return self.selection_logits(x) > 0


def pixel_mask(players: torch.Tensor) -> torch.Tensor:
    """[m, 16] per-patch values -> [m, 1, 8, 8] per pixel."""
    grid = players.reshape(-1, 1, GRID, GRID)
    return grid.repeat_interleave(PATCH, dim=2).repeat_interleave(PATCH, dim=3)


def subset_input(x: np.ndarray, subset: np.ndarray) -> np.ndarray:
    """x [m, 1, 8, 8] with the patches outside subset (bool [m, 16]) absent (zero)."""
    mask = pixel_mask(torch.from_numpy(np.asarray(subset, dtype=np.float32))).numpy()
    return (np.asarray(x, dtype=np.float32).reshape(-1, 1, 8, 8) * mask).astype(np.float32)


def has_own_subset(model: Model) -> bool:
    """Whether the model outputs its own sufficient subset (an SST model: `own_subset`)."""
    return isinstance(model.module, SSTNet)


def own_subset(model: Model, x: np.ndarray) -> np.ndarray:
    """digits-sst's own subset of each image: x [m, 1, 8, 8] -> bool [m, 16], one forward pass
    of the selector; the same players as sufficient-subset with patch_size 2."""
    net = model.module
    if not isinstance(net, SSTNet):  # has_own_subset, spelled out for the type checker
        raise ModelError(f"model {model.name!r} does not output its own sufficient subset")
    rows = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32).reshape(-1, 1, 8, 8))
    device = next(net.parameters()).device
    with torch.no_grad():
        return net.own_subset(rows.to(device)).cpu().numpy()


def _fit(net: SSTNet, split: Split, cfg: SSTConfig) -> None:
    """Full-batch Adam on cross-entropy (full input, true class) + cross-entropy of the
    subset-only input against the full input's predicted class + sparsity * mean selection."""
    x, y = torch.from_numpy(split.x_train), torch.from_numpy(split.y_train)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    net.train()
    for epoch in range(cfg.epochs):
        opt.zero_grad(set_to_none=True)
        logits = net.classifier(x)
        soft = torch.sigmoid(net.selection_logits(x))  # [m, 16]
        hard = (soft > 0.5).to(soft.dtype)
        straight = hard + soft - soft.detach()  # hard forward, sigmoid gradient
        kept = net.classifier(x * pixel_mask(straight))
        weight = cfg.sparsity * min(1.0, epoch / max(1.0, cfg.warmup * cfg.epochs))
        loss = (
            F.cross_entropy(logits, y)
            + F.cross_entropy(kept, logits.argmax(dim=1).detach())
            + weight * soft.mean()
        )
        loss.backward()
        opt.step()
    net.eval()


def _metrics(net: SSTNet, split: Split) -> dict[str, float]:
    """Accuracy, and on the test split the own subsets' mean size and faithfulness."""
    with torch.no_grad():
        train = net(torch.from_numpy(split.x_train)).argmax(dim=1).numpy()
        xt = torch.from_numpy(split.x_test)
        test = net(xt).argmax(dim=1).numpy()
        subset = net.own_subset(xt)
        kept = net(xt * pixel_mask(subset.float())).argmax(dim=1).numpy()
    return {
        "train_accuracy": float((train == split.y_train).mean()),
        "test_accuracy": float((test == split.y_test).mean()),
        "test_subset_size": float(subset.sum(dim=1).float().mean()),
        "test_faithfulness": float((kept == test).mean()),
    }


def train_sst(cfg: SSTConfig, split: Split) -> tuple[SSTNet, dict[str, Any]]:
    """Seeded build and fit; the caller's global torch RNG state is left untouched."""

    def fit() -> SSTNet:
        net = SSTNet(cfg.selector_bias)
        _fit(net, split, cfg)
        return net

    return seeded_training(cfg.seed, cfg.epochs, split, fit, lambda net: _metrics(net, split))


def cache_paths(cache_dir: Path, cfg: SSTConfig | None = None) -> tuple[Path, Path]:
    """(weights, metrics) files of a config in the model cache."""
    cfg = cfg or SSTConfig()
    stem = f"{cfg.name}-{cfg.digest()}"
    return cache_dir / f"{stem}.pt", cache_dir / f"{stem}.json"


def load_digits_sst(cache_dir: Path, cfg: SSTConfig | None = None) -> Model:
    """digits-sst ([1, 8, 8] in [0, 1]; 10 class probabilities; `own_subset`), trained at
    first load and cached in cache_dir."""
    cfg = cfg or SSTConfig()
    split = split_dataset(cfg.dataset, cfg.seed, cfg.test_fraction)
    net, metrics = cached_training(
        cache_dir, cfg.name, cfg.digest(), SSTNet, lambda: train_sst(cfg, split)
    )
    return Model(
        name=cfg.name,
        modality="image",
        task="classification",
        input_shape=tuple(split.x_train.shape[1:]),
        feature_names=split.feature_names,
        output_names=tuple(str(d) for d in range(10)),
        module=net,
        **training_background(split, cfg.seed),
        batch_size=16384,
        reference=split.x_train,
        input_range=(0.0, 1.0),
        info={
            "dataset": "sklearn load_digits: 8x8 images, pixel values / 16 in [0, 1]",
            "seed": cfg.seed,
            "config": asdict(cfg),
            "config_hash": cfg.digest(),
            "training": metrics,
            "sufficient_subset": {
                "method": "SST (Bassan et al., ICLR 2025)",
                "players": f"{PATCH}x{PATCH} patches, numbered row by row ({N_PLAYERS})",
                "absence": "zero baseline",
            },
        },
    )


__all__ = [
    "N_PLAYERS",
    "SSTConfig",
    "SSTNet",
    "has_own_subset",
    "load_digits_sst",
    "own_subset",
    "pixel_mask",
    "subset_input",
    "train_sst",
]
