"""Hostile and faulty model files for the model worker sandbox (models/sandbox/).

Each is a real file of its format: TorchScript modules that write or read host files, spin or
allocate far past the worker's memory, and booster files that crash their library natively
(an XGBoost split index past the features on a branch the registration's test pass does not
reach; a truncated LightGBM file). The upload checks (models/adapters/torchscript_check.py,
models/adapters/booster_check.py) refuse most of them; the sandbox tests let them through
(SandboxConfig.skip_file_checks) to show that the sandbox holds without the checks.
"""

from __future__ import annotations

import io
import json

import numpy as np
import torch
from torch import nn

from tests.byom_models import lightgbm_model, xgboost_model


def scripted_bytes(module: nn.Module) -> bytes:
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(module), buf)
    return buf.getvalue()


class Writer(nn.Module):
    """Fills the first 8 bytes of `path` with 'A' (torch.from_file with shared=True maps the
    file writable), then a softmax of a linear layer."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.lin = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.from_file(self.path, True, 8, dtype=torch.uint8).fill_(65)
        return torch.softmax(self.lin(x), dim=1) + t.to(torch.float32).sum() * 0.0


class Reader(nn.Module):
    """Returns the first bytes of `path` as its 'outputs' (torch.from_file, shared=False)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.from_file(self.path, False, 2, dtype=torch.uint8).to(torch.float32)
        return t.reshape(1, 2).expand(x.shape[0], 2) + x[:, :2] * 0


class Slow(nn.Module):
    """A classifier that computes for minutes when its first input is over 0.5."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x[0, 0] > 0.5):
            a = torch.ones(256, 256)
            for _ in range(1_000_000):
                a = torch.tanh(a @ a)
            x = x + a.sum() * 0
        return torch.softmax(self.lin(x), dim=1)


class Hungry(nn.Module):
    """A classifier that allocates 16 GiB when its first input is over 0.5."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x[0, 0] > 0.5):
            big = torch.ones(1 << 32)
            x = x + big[:1].sum() * 0
        return torch.softmax(self.lin(x), dim=1)


def mlp(seed: int = 0, n: int = 3, k: int = 2) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(n, 16), nn.Tanh(), nn.Linear(16, k), nn.Softmax(dim=1))


def form(name: str, n: int = 3, k: int = 2) -> dict[str, str]:
    return {
        "name": name,
        "modality": "tabular",
        "task": "classification",
        "input_shape": json.dumps([n]),
        "output_names": json.dumps([f"c{i}" for i in range(k)]),
        "feature_names": json.dumps([f"f{i}" for i in range(n)]),
        "format": "torchscript",
    }


def _path(tree: dict, row: np.ndarray) -> list[int]:
    left, right = tree["left_children"], tree["right_children"]
    index, cond = tree["split_indices"], tree["split_conditions"]
    node, seen = 0, []
    while left[node] != -1:
        seen.append(node)
        value = float(np.float32(row[index[node]]))
        node = left[node] if value < cond[node] else right[node]
    return seen


def poisoned_xgboost() -> tuple[bytes, dict[str, str], np.ndarray, np.ndarray]:
    """(file, form, a row that crashes XGBoost, a row that does not): the first tree's first
    split off the all-zeros path (the registration's test pass) reads feature 10^9."""
    um = xgboost_model("xgb-poisoned")
    doc = json.loads(um.file)
    tree = doc["learner"]["gradient_booster"]["model"]["trees"][0]
    safe = _path(tree, np.zeros(len(um.rows[0])))
    rows = np.asarray(um.rows, dtype=np.float64)
    for row in rows:
        hit = [n for n in _path(tree, row) if n not in safe]
        if hit:
            tree["split_indices"][hit[0]] = 1_000_000_000
            return json.dumps(doc).encode(), um.form, row, np.zeros_like(row)
    raise AssertionError("every row takes the all-zeros path")


def truncated_lightgbm() -> tuple[bytes, dict[str, str]]:
    """A LightGBM text file cut in half (LightGBM aborts reading it: SIGABRT)."""
    um = lightgbm_model("lgbm-truncated")
    assert um.file is not None
    return um.file[: len(um.file) // 2], um.form
