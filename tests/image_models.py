"""RGB image models as users bring them, built by the tests with fixed seeds (random weights).

`rgb_cnn`: a small strided CNN for C×H×W inputs (any size). `resnet18`: a ResNet-18-sized
network (BasicBlock, [2, 2, 2, 2], 64-512 channels, 11.2M parameters; He et al. 2016) written
here because torchvision does not import beside the pinned torch. Both end in softmax, as the
service's image classifiers do, and are saved as TorchScript with `torchscript_bytes`.
"""

from __future__ import annotations

import io
import json

import numpy as np
import torch
from torch import nn


class _Softmax(nn.Module):
    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.body(x), dim=1)


def rgb_cnn(
    channels: int = 3, size: int = 64, classes: int = 5, width: int = 16, seed: int = 0
) -> nn.Module:
    """Strided 3×3 convolutions down to about 8×8, global average pooling, a linear head."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU()]
    side, c = size, width
    while side > 8:
        layers += [nn.Conv2d(c, 2 * c, 3, stride=2, padding=1), nn.ReLU()]
        side, c = -(-side // 2), 2 * c
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, classes)]
    return _Softmax(nn.Sequential(*layers)).eval()


class _Block(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.down: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.down = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.down(x))


def resnet18(classes: int = 5, seed: int = 0) -> nn.Module:
    """ResNet-18's layout for 3-channel images of any size (224×224 as ImageNet's)."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    ]
    c = 64
    for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [_Block(c, width, stride), _Block(width, width, 1)]
        c = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, classes)]
    return _Softmax(nn.Sequential(*layers)).eval()


def torchscript_bytes(module: nn.Module) -> bytes:
    """The module scripted and saved as `torch.jit.save` writes it."""
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(module), buf)
    return buf.getvalue()


def images(n: int, channels: int = 3, size: int = 64, seed: int = 0) -> np.ndarray:
    """Smooth random images in [0, 1], float32 [n, C, H, W]: blobs, not white noise, so that
    blur and superpixels have structure to work on."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    out = np.zeros((n, channels, size, size), dtype=np.float32)
    for i in range(n):
        for _ in range(6):
            cy, cx, r = rng.uniform(0.1, 0.9), rng.uniform(0.1, 0.9), rng.uniform(0.05, 0.3)
            blob = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r**2))
            out[i] += blob[None] * rng.uniform(0, 1, size=(channels, 1, 1))
    return np.clip(out / max(out.max(), 1e-6), 0, 1).astype(np.float32)


def image_form(name: str, channels: int, size: int, classes: int = 5) -> dict[str, str]:
    """The registration form of a C×H×W image classifier (TorchScript upload)."""
    return {
        "name": name,
        "modality": "image",
        "input_shape": json.dumps([channels, size, size]),
        "output_names": json.dumps([f"class_{i}" for i in range(classes)]),
        "task": "classification",
        "input_range": json.dumps([0, 1]),
    }
