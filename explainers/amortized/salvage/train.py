"""Salvage: amortized Shapley explainers for image classifiers that answer in one forward pass.

Naouar et al. (ICLR 2025), "Salvage: Shapley-distribution Approximation Learning Via
Attribution Guided Exploration for Explainable Image Classification", built on ViT-Shapley
(Covert, Kim & Lee, ICLR 2023) and FastSHAP (Jethani et al., ICLR 2022).

Two networks are trained on a classifier f:
1. a surrogate g, a fine-tuned copy of f that accepts inputs whose absent patches are zeroed,
   trained with KL(f(x) || g(x_S)) over masks with a uniformly drawn number of players; the
   game explained is v(S) = g(x_S);
2. an explainer psi(x) in R^{n x C}: per patch, per class contributions. With the
   `distribution` objective (Salvage) they parameterise the class distribution on masked
   inputs, p(.|x_S) = softmax(phi_0 + sum_{i in S} psi_i), trained with
   KL(g_T(x_S) || softmax((phi_0 + sum_{i in S} psi_i) / T)), where g_T ~ g^(1/T) is the
   surrogate's distribution at temperature T: the temperature acts on the target and on the
   prediction alike, so it reweights classes in the loss (T > 1 lifts the unlikely ones) and
   the network cannot scale it away; values are in centred log-probability units at any T.
   With the `squared` objective (FastSHAP / ViT-Shapley) psi regresses the probabilities
   g(x_S) with n * mean squared error after the additive efficiency projection.
Coalitions: the Shapley-kernel sampler, or "informed" sampling (a product distribution
P(i in S) = sigmoid(beta * z_i), z = the current explainer's values for the predicted class,
standardised: centred and divided by their standard deviation over the players) mixed with
the Shapley-kernel sampler; every mask is paired with its complement, so informed pairs hold
one likely and one unlikely coalition. The informed
sampler's exact form, the temperature's role and the full-coalition term are our
reconstruction (the paper's code was not available).
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from explainers.amortized.masks import sample_masks, uniform_size_masks
from explainers.amortized.progress import Progress, Recorder
from explainers.explanation import OptionError
from explainers.games.deadlines import check_deadline
from explainers.games.masked import patch_groups
from models.base import Model
from models.modality import Modality

EPS = 1e-7  # probability clip before logs (float32)
TRAINING_VERSION = "2"  # 2: centred informed sampler, temperature on the target (issue 15)


class SalvageTrainOptions(BaseModel):
    """Training configuration of a Salvage artifact; defaults are ours (sized for CPUs)."""

    model_config = ConfigDict(extra="forbid")
    objective: Literal["distribution", "squared"] = Field(
        "distribution",
        description="distribution: KL between the class distribution the contributions "
        "parameterise and the surrogate's (Salvage); squared: FastSHAP-style squared error on "
        "probabilities",
    )
    sampler: Literal["informed", "kernel", "uniform"] = Field(
        "informed",
        description="informed: attribution-guided coalitions mixed with the Shapley kernel; "
        "kernel: Shapley-kernel sizes; uniform: every player present with probability 1/2",
    )
    patch_size: int = Field(2, ge=1, le=64, description="side of a square patch (one player)")
    surrogate_epochs: int = Field(
        8, ge=0, le=1000, description="0: the classifier itself is the game (zeroed patches)"
    )
    explainer_epochs: int = Field(40, ge=1, le=1000)
    pairs: int = Field(8, ge=1, le=256, description="mask/complement pairs per image and step")
    batch_size: int = Field(128, ge=1, le=4096, description="images per step")
    lr: float = Field(2e-3, gt=0, le=1, description="explainer Adam learning rate")
    surrogate_lr: float = Field(5e-4, gt=0, le=1)
    hidden: int = Field(256, ge=8, le=4096, description="width of the explainer's head")
    temperature: float = Field(
        1.0,
        gt=0,
        le=100,
        description="distribution objective: temperature T of the target and the prediction "
        "in the KL loss (T > 1 weighs unlikely classes more); values stay in centred "
        "log-probabilities",
    )
    beta: float = Field(1.0, ge=0, le=100, description="informed sampler sharpness")
    informed_fraction: float = Field(
        0.5, ge=0, le=1, description="share of informed pairs (the rest: Shapley kernel)"
    )
    rows: int | None = Field(
        None, ge=4, description="training images from the model's reference data (default all)"
    )
    held_out: float = Field(0.1, gt=0, lt=1, description="share of images kept for metrics")
    seed: int = Field(0, ge=0, le=2**32 - 1)

    def digest(self, data_id: str = "reference") -> str:
        """Hash of the configuration and the training data: an artifact's id within a model
        version."""
        # The training code's version too: a retrained configuration never reuses an artifact
        # that older code trained.
        config = [self.model_dump(mode="json"), data_id, TRAINING_VERSION]
        text = json.dumps(config, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


class ExplainerNet(nn.Module):
    """x [m, c, h, w] -> raw contributions [m, n_players, n_classes] (row-major patches)."""

    def __init__(
        self, input_shape: tuple[int, ...], patch_size: int, n_classes: int, hidden: int
    ) -> None:
        super().__init__()
        channels, height, width = self.chw = _chw(input_shape)
        self.rows, self.cols = -(-height // patch_size), -(-width // patch_size)
        self.n_classes = n_classes
        self.trunk = nn.Sequential(
            nn.Conv2d(channels, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d((self.rows, self.cols)),  # one cell per patch
            nn.Flatten(),
        )
        n = self.rows * self.cols
        self.head = nn.Sequential(
            nn.Linear(64 * n, hidden), nn.ReLU(), nn.Linear(hidden, n * n_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.head(self.trunk(x.reshape(x.shape[0], *self.chw)))
        return out.reshape(x.shape[0], self.rows * self.cols, self.n_classes)


def _chw(input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(input_shape) == 2:
        return (1, input_shape[0], input_shape[1])
    if len(input_shape) == 3:
        return (input_shape[0], input_shape[1], input_shape[2])
    raise OptionError(f"Salvage needs image inputs [h, w] or [c, h, w], got {input_shape}")


def log_probs(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Log class probabilities of a classifier whose last layer is a softmax. [m, C]"""
    if isinstance(net, nn.Sequential) and isinstance(net[-1], nn.Softmax):
        return F.log_softmax(net[:-1](x), dim=1)
    return torch.log(net(x).clamp_min(EPS))


def centred(logp: torch.Tensor) -> torch.Tensor:
    """Centred log-ratio: log-probabilities minus their mean over classes (softmax-invariant)."""
    return logp - logp.mean(dim=-1, keepdim=True)


# ------------------------------------------------------------------------------ samplers


# ------------------------------------------------------------------------------ training


@dataclass(frozen=True)
class Trained:
    """A trained surrogate and explainer with what they need to explain."""

    surrogate: nn.Module  # eval mode; outputs class probabilities
    explainer: ExplainerNet  # eval mode
    groups: np.ndarray  # player of each flattened input feature [d]
    empty_logp: np.ndarray  # log g(0): surrogate log-probabilities with no player [C]
    options: SalvageTrainOptions
    metrics: dict[str, Any] = field(default_factory=dict)
    history: tuple[dict[str, Any], ...] = ()
    data_id: str = "reference"  # or the SHA-256 of the images it was given

    @property
    def id(self) -> str:
        return self.options.digest(self.data_id)


def masked(x: torch.Tensor, masks: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """x [b, *s] and masks [b, m, n] -> inputs with absent patches zeroed [b * m, *s]."""
    b, m = masks.shape[:2]
    keep = masks[:, :, groups].reshape(b, m, *x.shape[1:])
    return (x[:, None] * keep).reshape(b * m, *x.shape[1:])


def efficiency_projection(
    values: torch.Tensor, full: torch.Tensor, empty: torch.Tensor
) -> torch.Tensor:
    """phi_i += (v(N) - v(0) - sum_j phi_j) / n so that the values add up. values [b, n, C]"""
    gap = full - empty - values.sum(dim=1)  # [b, C]
    return values + gap[:, None, :] / values.shape[1]


def contributions(net: ExplainerNet, x: torch.Tensor, opts: SalvageTrainOptions) -> torch.Tensor:
    """Raw contributions in the game's units: centred log-probabilities or probabilities."""
    raw = net(x)
    return centred(raw) if opts.objective == "distribution" else raw


def game_values(logp: torch.Tensor, objective: str) -> torch.Tensor:
    return centred(logp) if objective == "distribution" else logp.exp()


def _loss(
    psi: torch.Tensor,
    masks: torch.Tensor,
    target_logp: torch.Tensor,
    full_logp: torch.Tensor,
    empty_logp: torch.Tensor,
    objective: str,
    temperature: float = 1.0,
) -> torch.Tensor:
    """psi [b, n, C]; masks [b, m, n]; surrogate log-probs on the masks [b, m, C], full [b, C]."""
    m = masks.to(psi.dtype)
    if objective == "distribution":  # KL(g_T(x_S) || softmax((phi_0 + sum psi) / T)), S = N too
        logits = centred(empty_logp)[None, None] + m @ psi  # [b, m, C]
        full = centred(empty_logp)[None] + psi.sum(dim=1)  # [b, C]
        logits = torch.cat([logits, full[:, None]], dim=1) / temperature
        target = torch.cat([target_logp, full_logp[:, None]], dim=1)
        target = F.log_softmax(target / temperature, dim=-1)  # g^(1/T), renormalised
        kl = (target.exp() * (target - F.log_softmax(logits, dim=-1))).sum(dim=-1)
        return kl.mean()
    empty = empty_logp.exp()
    phi = efficiency_projection(psi, full_logp.exp(), empty[None])
    pred = empty[None, None] + m @ phi
    return psi.shape[1] * F.mse_loss(pred, target_logp.exp())


def train(
    model: Model,
    options: SalvageTrainOptions,
    data: np.ndarray | None = None,
    progress: Progress | None = None,
    surrogate: nn.Module | None = None,
) -> Trained | None:
    """Train a surrogate and an explainer for an image classifier; None if `progress` stops it.

    `data` [m, *input_shape] defaults to the model's reference data (its training split).
    `surrogate`: one already trained on this data (ablations of the explainer share it).
    """
    opts = options
    if model.modality != Modality.IMAGE or model.task != "classification":
        raise OptionError("Salvage explains image classifiers")
    if not model.differentiable or next(model.torch_module().parameters(), None) is None:
        raise OptionError(f"model {model.name!r} has no trainable weights to fine-tune")
    data_id = "reference"
    if data is None:
        data = model.reference if model.reference is not None else model.background
    else:
        data_id = hashlib.sha256(np.ascontiguousarray(data, dtype=np.float32).tobytes()).hexdigest()
    if data is None or len(data) < 4:
        raise OptionError(f"model {model.name!r} has no reference images to train on")
    rng = np.random.default_rng(opts.seed)
    x_all = np.asarray(data, dtype=np.float32)[rng.permutation(len(data))][: opts.rows]
    n_val = max(1, round(len(x_all) * opts.held_out))
    # Training runs where the classifier's weights are; random draws stay on the CPU's
    # generator, so every device sees the same masks and batches.
    dev = model.device
    x_val = torch.from_numpy(x_all[:n_val]).to(dev)
    x_train = torch.from_numpy(x_all[n_val:]).to(dev)
    groups_np, _ = patch_groups(model.input_shape, opts.patch_size)
    groups = torch.from_numpy(groups_np.copy()).to(dev)
    n = int(groups_np.max()) + 1
    report = Recorder(progress)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(opts.seed)
        gen = torch.Generator().manual_seed(opts.seed)
        teacher = model.torch_module()
        with torch.no_grad():
            f_train, f_val = log_probs(teacher, x_train), log_probs(teacher, x_val)
        given = surrogate is not None
        surrogate = copy.deepcopy(teacher if surrogate is None else surrogate)
        surrogate.train().requires_grad_(True)
        opt = torch.optim.Adam(surrogate.parameters(), lr=opts.surrogate_lr)
        for epoch in range(0 if given else opts.surrogate_epochs):
            losses = []
            for idx in torch.randperm(len(x_train), generator=gen).split(opts.batch_size):
                check_deadline()  # a cancelled job (or a server shutting down) stops here
                masks = uniform_size_masks(n, len(idx) * 2, gen).reshape(len(idx), 2, n).to(dev)
                out = log_probs(surrogate, masked(x_train[idx], masks, groups))
                target = f_train[idx].repeat_interleave(2, dim=0)
                loss = (target.exp() * (target - out)).sum(dim=1).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                losses.append(loss.item())
            if not report({"phase": "surrogate", "epoch": epoch, "loss": float(np.mean(losses))}):
                return None
        surrogate.eval()
        for p in surrogate.parameters():
            p.requires_grad_(False)

        with torch.no_grad():
            empty_logp = log_probs(surrogate, torch.zeros(1, *model.input_shape, device=dev))[0]
            g_train = log_probs(surrogate, x_train)
            g_val = log_probs(surrogate, x_val)
        explainer = ExplainerNet(model.input_shape, opts.patch_size, model.n_outputs, opts.hidden)
        explainer.to(dev)  # initialised on the CPU (same weights everywhere), then moved
        opt = torch.optim.Adam(explainer.parameters(), lr=opts.lr)
        predicted = f_train.argmax(dim=1)
        for epoch in range(opts.explainer_epochs):
            explainer.train()
            losses = []
            for idx in torch.randperm(len(x_train), generator=gen).split(opts.batch_size):
                check_deadline()
                psi = contributions(explainer, x_train[idx], opts)
                scores = psi.detach()[torch.arange(len(idx), device=dev), :, predicted[idx]]
                masks = sample_masks(
                    opts.sampler, n, len(idx), opts.pairs, gen, scores.cpu(), opts.beta,
                    opts.informed_fraction,
                ).to(dev)  # fmt: skip
                with torch.no_grad():
                    target = log_probs(surrogate, masked(x_train[idx], masks, groups))
                target = target.reshape(len(idx), masks.shape[1], -1)
                loss = _loss(
                    psi, masks, target, g_train[idx], empty_logp, opts.objective, opts.temperature
                )
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                losses.append(loss.item())
            explainer.eval()
            record = {"phase": "explainer", "epoch": epoch, "loss": float(np.mean(losses))}
            record.update(
                _held_out(explainer, surrogate, x_val, f_val, g_val, empty_logp, groups, opts)
            )
            if not report(record):
                return None
    explainer.eval()
    metrics = {
        **{k: v for k, v in report.history[-1].items() if k.startswith("held_out")},
        "train_rows": len(x_train),
        "held_out_rows": len(x_val),
        "n_players": n,
        "train_seconds": report.seconds(),
        "torch_threads": torch.get_num_threads(),
        "device": str(dev),
    }
    return Trained(
        surrogate,
        explainer,
        groups_np,
        empty_logp.cpu().numpy(),
        opts,
        metrics,
        tuple(report.history),
        data_id,
    )


def _held_out(
    explainer: ExplainerNet,
    surrogate: nn.Module,
    x: torch.Tensor,
    f_logp: torch.Tensor,
    g_logp: torch.Tensor,
    empty_logp: torch.Tensor,
    groups: torch.Tensor,
    opts: SalvageTrainOptions,
) -> dict[str, float]:
    """Held-out loss on fixed Shapley-kernel masks; for the distribution objective also
    KL(classifier || explainer as a classifier) and top-1 agreement on full inputs."""
    n = int(groups.max()) + 1
    gen = torch.Generator().manual_seed(12345)
    with torch.no_grad():
        psi = contributions(explainer, x, opts)
        masks = sample_masks("kernel", n, len(x), 4, gen).to(x.device)
        target = log_probs(surrogate, masked(x, masks, groups)).reshape(len(x), 8, -1)
        loss = _loss(psi, masks, target, g_logp, empty_logp, opts.objective, opts.temperature)
        out = {"held_out_loss": float(loss)}
        if opts.objective == "distribution":
            logp = F.log_softmax(centred(empty_logp)[None] + psi.sum(dim=1), dim=1)
            out["held_out_kl"] = float((f_logp.exp() * (f_logp - logp)).sum(dim=1).mean())
            out["held_out_agreement"] = float((logp.argmax(1) == f_logp.argmax(1)).float().mean())
        out["held_out_surrogate_kl"] = float((f_logp.exp() * (f_logp - g_logp)).sum(dim=1).mean())
    return out
