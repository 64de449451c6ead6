"""AutoGnothi for a small image CNN (digits-cnn): a side network on the frozen classifier's
feature maps outputs patch Shapley values; a library experiment beside Salvage.

AutoGnothi (Wang et al., "Gnothi Seauton: Empowering Faithful Self-Interpretability in
Black-Box Transformers", ICLR 2025) with FastSHAP's objective (Jethani et al., ICLR 2022). The
frozen classifier (an nn.Sequential) is run once per image and every 4-D activation is
average-pooled to the patch grid; the side network projects each level to `width` channels and
climbs them as a ladder of 3x3 convolutions, then outputs per patch, per class values. The game
is `shapley`'s image game and Salvage's with `surrogate_epochs = 0`: the classifier's
probabilities with absent patches zeroed. Coalitions are drawn from the Shapley kernel at every
step (the model is cheap) and paired with complements; the loss is n * mean squared error of
v(empty) + sum_{i in S} phi_i against v(S), phi efficiency-projected. Not served by the API.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from explainers.amortized.masks import sample_masks
from explainers.amortized.salvage.train import efficiency_projection, masked
from explainers.explanation import OptionError
from explainers.games.deadlines import check_deadline
from explainers.games.masked import patch_groups
from models.base import Model, weights_hash
from models.modality import Modality


class ImageTrainOptions(BaseModel):
    """Training configuration (ours, sized for CPUs)."""

    model_config = ConfigDict(extra="forbid")
    patch_size: int = Field(2, ge=1, le=64)
    epochs: int = Field(40, ge=1, le=1000)
    pairs: int = Field(8, ge=1, le=256, description="kernel coalitions (and complements) per image")
    batch_size: int = Field(128, ge=1, le=4096)
    lr: float = Field(2e-3, gt=0, le=1)
    width: int = Field(64, ge=8, le=512)
    rows: int | None = Field(None, ge=4, description="training images (default all)")
    seed: int = Field(0, ge=0, le=2**32 - 1)


def levels(
    module: nn.Module, x: torch.Tensor, grid: tuple[int, int]
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One pass of an nn.Sequential: the input and its activations after each ReLU or pooling
    while they are feature maps, average-pooled to the patch grid, and the output."""
    if not isinstance(module, nn.Sequential):
        raise OptionError("the image side network reads an nn.Sequential's feature maps")
    out = [nn.functional.adaptive_avg_pool2d(x, grid)]
    with torch.no_grad():
        for layer in module:
            x = layer(x)
            if x.dim() == 4 and isinstance(layer, (nn.ReLU, nn.MaxPool2d)):
                out.append(nn.functional.adaptive_avg_pool2d(x, grid))
    return out, x


class ImageSideNet(nn.Module):
    """Pooled levels [b, c_l, r, k] -> values [b, r * k patches, n_classes]."""

    def __init__(self, channels: list[int], n_classes: int, width: int) -> None:
        super().__init__()
        self.channels, self.n_classes, self.width = channels, n_classes, width
        self.down = nn.ModuleList(nn.Conv2d(c, width, 1) for c in channels)
        self.ladder = nn.ModuleList(
            nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.ReLU()) for _ in channels
        )
        self.head = nn.Conv2d(width, n_classes, 1)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        side = torch.zeros_like(self.down[0](feats[0]))
        for down, step, f in zip(self.down, self.ladder, feats, strict=True):
            side = step(side + down(f))
        out = self.head(side)  # [b, C, r, k]
        return out.flatten(2).transpose(1, 2)  # [b, r * k, C], row-major patches


def _values(
    net: ImageSideNet, feats: list[torch.Tensor], full: torch.Tensor, empty: torch.Tensor
) -> torch.Tensor:
    raw = net(feats)
    raw = raw - raw.mean(dim=-1, keepdim=True)  # probabilities add up to 1 in every coalition
    return efficiency_projection(raw, full, empty[None])


def train(
    model: Model, options: ImageTrainOptions, data: np.ndarray | None = None
) -> tuple[ImageSideNet, dict[str, Any]]:
    """A side network for a frozen image classifier; the model's weights are checked unchanged."""
    opts = options
    if model.modality != Modality.IMAGE or model.task != "classification":
        raise OptionError("the image side network explains image classifiers")
    before = weights_hash(model.torch_module())
    data = model.reference if data is None else data
    if data is None:
        raise OptionError(f"model {model.name!r} has no reference images")
    rng = np.random.default_rng(opts.seed)
    x_all = torch.from_numpy(np.asarray(data, dtype=np.float32)[rng.permutation(len(data))])
    x_all = x_all[: opts.rows].reshape(-1, *model.input_shape)
    if x_all.dim() == 3:
        x_all = x_all[:, None]
    groups_np, _ = patch_groups(model.input_shape, opts.patch_size)
    groups = torch.from_numpy(groups_np.copy())
    n = int(groups_np.max()) + 1
    grid = (-(-x_all.shape[2] // opts.patch_size), -(-x_all.shape[3] // opts.patch_size))
    start = time.perf_counter()
    module = model.torch_module()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(opts.seed)
        gen = torch.Generator().manual_seed(opts.seed)
        with torch.no_grad():
            feats_all, full_all = levels(module, x_all, grid)
            empty = module(torch.zeros(1, *x_all.shape[1:]))[0]
        net = ImageSideNet([f.shape[1] for f in feats_all], full_all.shape[1], opts.width)
        optimiser = torch.optim.Adam(net.parameters(), lr=opts.lr)
        rows = 0
        for _ in range(opts.epochs):
            for idx in torch.randperm(len(x_all), generator=gen).split(opts.batch_size):
                check_deadline()  # between training steps (each calls the classifier)
                masks = sample_masks("kernel", n, len(idx), opts.pairs, gen)  # [b, 2p, n]
                with torch.no_grad():
                    target = module(masked(x_all[idx], masks, groups)).reshape(
                        len(idx), masks.shape[1], -1
                    )
                rows += target.shape[0] * target.shape[1]
                phi = _values(net, [f[idx] for f in feats_all], full_all[idx], empty)
                pred = empty[None, None] + masks.to(phi.dtype) @ phi
                loss = n * nn.functional.mse_loss(pred, target)
                optimiser.zero_grad(set_to_none=True)
                loss.backward()
                optimiser.step()
    net.eval()
    if weights_hash(module) != before:  # cannot happen: nothing optimises the model
        raise RuntimeError("the frozen model's weights changed during training")
    metrics = {
        "train_images": len(x_all),
        "model_rows": rows,
        "train_seconds": round(time.perf_counter() - start, 3),
        "model_weights": before,
    }
    return net, metrics


def amortized(model: Model, net: ImageSideNet, x: np.ndarray, patch_size: int = 2) -> np.ndarray:
    """Patch values [m, n, C] of images x: one classifier pass, the side network."""
    xt = torch.from_numpy(np.asarray(x, dtype=np.float32)).reshape(-1, *model.input_shape)
    if xt.dim() == 3:
        xt = xt[:, None]
    grid = (-(-xt.shape[2] // patch_size), -(-xt.shape[3] // patch_size))
    with torch.inference_mode():
        feats, full = levels(model.torch_module(), xt, grid)
        empty = model.torch_module()(torch.zeros(1, *xt.shape[1:]))[0]
        return _values(net, feats, full, empty).numpy().astype(np.float64)
