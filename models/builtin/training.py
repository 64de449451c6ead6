"""Train once, then load from disk: the cache of the built-in models (models/builtin/trained.py) and
digits-sst (models/builtin/sst.py). A config's digest names `<name>-<digest>.pt` (the state dict)
and `.json` (the training metrics); one process trains under a file lock while the others wait, a
corrupt file is deleted and the model retrained, and training is seeded, so every process and
machine builds the same weights."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from filelock import FileLock
from torch import nn

from models.builtin.datasets import Split

log = logging.getLogger(__name__)

M = TypeVar("M", bound=nn.Module)  # a trained network
BACKGROUND_ROWS = 100


def config_digest(cfg: Any) -> str:
    """Short content hash of a training config (a dataclass): names its cache files."""
    text = json.dumps(asdict(cfg), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Write via a temporary file and rename, so readers never see a partial file."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def seeded_training(
    seed: int,
    epochs: int,
    split: Split,
    fit: Callable[[], M],
    metrics: Callable[[M], dict[str, float]],
) -> tuple[M, dict[str, Any]]:
    """`fit()` (build and train) under `seed` with the caller's global torch RNG state left
    untouched; the module in eval mode and its metrics with the run's size, time and torch."""
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = fit()
    module.eval()
    out: dict[str, Any] = metrics(module)
    out.update(
        train_rows=len(split.x_train),
        test_rows=len(split.x_test),
        epochs=epochs,
        train_seconds=round(time.perf_counter() - start, 3),
        torch=torch.__version__,
    )
    return module, out


def _read_cache(
    name: str, build: Callable[[], M], weights: Path, meta: Path
) -> tuple[M, dict[str, Any]] | None:
    """The cached module (`build()`, loaded, eval mode) and training metrics, or None to
    (re)train.

    None when either file is missing. A file that cannot be read or parsed, or weights that do
    not fit the model's architecture, count as corrupt: a warning names the file, both files
    are deleted, and None is returned so that the caller retrains. Call under the file lock.
    """
    if not (weights.exists() and meta.exists()):
        return None
    bad, reason = meta, ""
    try:
        metrics = json.loads(meta.read_text())
        if not isinstance(metrics, dict):
            raise ValueError(f"expected a JSON object, got {type(metrics).__name__}")
        bad = weights
        state = torch.load(weights, map_location="cpu", weights_only=True)
        if not isinstance(state, dict):
            raise ValueError(f"expected a state_dict, got {type(state).__name__}")
        with torch.random.fork_rng(devices=[]):  # the init is overwritten; keep the caller's RNG
            module = build()
        module.load_state_dict(state)  # strict: missing, unexpected or misshapen tensors raise
        if not all(torch.isfinite(t).all() for t in module.state_dict().values()):
            raise ValueError("non-finite values in the weights")
    except Exception as exc:  # any failure to read the cache means: rebuild it
        reason = f"{type(exc).__name__}: {exc}"
    else:
        module.eval()
        return module, metrics
    log.warning(
        "corrupt model cache file %s (%s); deleting it and rebuilding %s",
        bad,
        reason[:500],
        name,
    )
    weights.unlink(missing_ok=True)
    meta.unlink(missing_ok=True)
    return None


def cached_training(
    cache_dir: Path,
    name: str,
    digest: str,
    build: Callable[[], M],
    train: Callable[[], tuple[M, dict[str, Any]]],
) -> tuple[M, dict[str, Any]]:
    """The module of `cache_dir/<name>-<digest>.pt` (its metrics: the `.json`), trained by `train()`
    and cached at first load, or again when the cache is corrupt; one process trains, the
    others wait on the file lock."""
    stem = f"{name}-{digest}"
    weights, meta = cache_dir / f"{stem}.pt", cache_dir / f"{stem}.json"
    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(cache_dir / f"{stem}.lock"):
        cached = _read_cache(name, build, weights, meta)
        if cached is None:
            trained, metrics = train()
            _atomic_write(meta, lambda p: p.write_text(json.dumps(metrics, indent=2)))
            _atomic_write(weights, lambda p: torch.save(trained.state_dict(), p))
            cached = _read_cache(name, build, weights, meta)
            if cached is None:
                raise RuntimeError(f"model cache {weights} is unreadable right after training")
    return cached


def training_background(split: Split, seed: int) -> dict[str, Any]:
    """`Model`'s background and background_info: rows of the training split."""
    rows = np.random.default_rng(seed).choice(len(split.x_train), BACKGROUND_ROWS, replace=False)
    return {
        "background": np.ascontiguousarray(split.x_train[rows]),
        "background_info": {
            "rows": BACKGROUND_ROWS,
            "source": "training split",
            "seed": seed,
            "description": f"{BACKGROUND_ROWS} rows drawn without replacement from the "
            "training split",
        },
    }


__all__ = [
    "BACKGROUND_ROWS",
    "cached_training",
    "config_digest",
    "seeded_training",
    "training_background",
]
