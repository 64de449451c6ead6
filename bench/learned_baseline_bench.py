"""Low-order marginal-effect objective (Ren et al. 2023) for zero, mean and learned baselines
on the built-in tabular models; classifiers explain the predicted class and the true label.
Run: .venv/bin/python bench/learned_baseline_bench.py"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.settings import Settings
from explainers.gradients.learned_baseline import learn_baseline, low_order_objective
from models.builtin.trained import dataset_split
from models.registry import ModelRegistry


def objective(
    module: torch.nn.Module,
    x: np.ndarray,
    t: np.ndarray,
    b: np.ndarray,
    logodds: bool,
    samples: int,
) -> float:
    with torch.no_grad():
        return float(
            low_order_objective(
                module,
                torch.as_tensor(x),
                torch.as_tensor(t),
                torch.as_tensor(b, dtype=torch.float32),
                logodds=logodds,
                sample_num=samples,
                low_order=0.5,
                generator=torch.Generator().manual_seed(123),
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    torch.set_num_threads(1)
    registry = ModelRegistry(Settings().model_dir)
    print(f"rows={args.rows} iterations={args.iterations} samples={args.samples} lr={args.lr}")
    print(
        f"{'model':20s} {'target':9s} {'zero':>10s} {'mean':>10s} {'learned':>10s} {'seconds':>8s}"
    )
    for name in ["diabetes-mlp", "breast-cancer-mlp"]:
        model = registry.get(name)
        assert model.reference is not None
        split = dataset_split(name)
        x = split.x_test[: args.rows]
        logodds = model.task == "classification"
        targets = {"output": np.zeros(len(x), dtype=np.int64)}
        if logodds:
            targets = {
                "predicted": model.predict(x).argmax(axis=1),
                "label": split.y_test[: args.rows].astype(np.int64),
            }
        for kind, t in targets.items():
            start = time.perf_counter()
            learned = learn_baseline(
                model.torch_module(),
                x,
                t,
                model.reference,
                logodds=logodds,
                lr=args.lr,
                iterations=args.iterations,
                sample_num=args.samples,
            )
            took = time.perf_counter() - start
            row = [
                objective(model.torch_module(), x, t, b, logodds, args.samples)
                for b in (
                    np.zeros(model.n_features),
                    model.reference.mean(axis=0),
                    learned.baseline,
                )
            ]
            print(f"{name:20s} {kind:9s} {row[0]:10.3f} {row[1]:10.3f} {row[2]:10.3f} {took:8.1f}")


if __name__ == "__main__":
    main()
