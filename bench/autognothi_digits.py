"""AutoGnothi's side network vs Salvage's explainer vs KernelSHAP on digits-cnn (16 patches).

AutoGnothi: Wang et al., "Gnothi Seauton: Empowering Faithful Self-Interpretability in Black-Box
Transformers" (ICLR 2025), here on a CNN's feature maps (a library experiment). One game for
all: the classifier's probabilities with absent 2x2 patches zeroed (`shapley`'s image game;
Salvage with `surrogate_epochs = 0`, squared objective, kernel sampler: FastSHAP on the
classifier). AutoGnothi's side network reads the frozen classifier's feature maps
(explainers/amortized/autognothi/image.py); Salvage's explainer reads the image. Same epochs,
coalition pairs and training images. Ground truth: exact Shapley values (2^16 coalitions) of the
predicted class on test images. Pearson pooled over every patch of every image, mean per-image
Pearson, relative L2 error (mean over images), time per image one at a time, one torch thread.

    .venv/bin/python -m bench.autognothi_digits [--images 25] [--epochs 40]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.settings import Settings
from explainers.amortized.autognothi import image as autognothi_image
from explainers.amortized.autognothi.train import pearson
from explainers.amortized.salvage import inference as salvage_inference
from explainers.amortized.salvage import train as salvage
from explainers.shapley.explainer import shapley_values
from models.base import weights_hash
from models.builtin.trained import dataset_split, load_digits_cnn


def scores(ours: list[np.ndarray], truth: list[np.ndarray]) -> dict[str, float]:
    a, b = np.concatenate(ours), np.concatenate(truth)
    rel = [np.linalg.norm(x - y) / np.linalg.norm(y) for x, y in zip(ours, truth, strict=True)]
    per = [pearson(x, y) for x, y in zip(ours, truth, strict=True)]
    return {"pearson": pearson(a, b), "per_image": float(np.mean(per)), "rel": float(np.mean(rel))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=25)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_digits_cnn(Path(Settings().model_dir))
    before = weights_hash(model.torch_module())
    opts = autognothi_image.ImageTrainOptions(epochs=args.epochs, seed=args.seed)
    net, metrics = autognothi_image.train(model, opts)
    sv_opts = salvage.SalvageTrainOptions(
        objective="squared", sampler="kernel", surrogate_epochs=0,
        explainer_epochs=args.epochs, seed=args.seed,
    )  # fmt: skip
    start = time.perf_counter()
    trained = salvage.train(model, sv_opts)
    assert trained is not None
    sv_seconds = time.perf_counter() - start
    assert weights_hash(model.torch_module()) == before
    x = dataset_split("digits-cnn").x_test[: args.images]
    exact, classes = [], []
    for image in x:
        game = salvage_inference.surrogate_game(trained, image)  # the classifier, zeroed patches
        est = shapley_values(game, 16, estimator="exact")
        c = int(np.argmax(est.full_value))
        exact.append(est.values[:, c])
        classes.append(c)
    rows: dict[str, dict[str, Any]] = {}
    ours, times = [], []
    for image, c in zip(x, classes, strict=True):
        t = time.perf_counter()
        ours.append(autognothi_image.amortized(model, net, image[None])[0, :, c])
        times.append(time.perf_counter() - t)
    rows["autognothi (side net)"] = {**scores(ours, exact), "ms": 1000 * np.median(times),
                                     "train_s": metrics["train_seconds"]}  # fmt: skip
    theirs, times = [], []
    for image, c in zip(x, classes, strict=True):
        t = time.perf_counter()
        theirs.append(salvage_inference.amortized(trained, image[None]).values[0, :, c])
        times.append(time.perf_counter() - t)
    rows["salvage squared/kernel"] = {**scores(theirs, exact), "ms": 1000 * np.median(times),
                                      "train_s": round(sv_seconds, 1)}  # fmt: skip
    for budget in (64, 128, 256):
        est_values, times = [], []
        for j, (image, c) in enumerate(zip(x, classes, strict=True)):
            game = salvage_inference.surrogate_game(trained, image)
            t = time.perf_counter()
            est = shapley_values(game, 16, estimator="kernel", budget=budget, seed=j)
            times.append(time.perf_counter() - t)
            est_values.append(est.values[:, c])
        rows[f"KernelSHAP {budget}"] = {**scores(est_values, exact),
                                        "ms": 1000 * np.median(times), "train_s": 0}  # fmt: skip
    print(f"digits-cnn, {len(x)} test images, 16 patches, epochs {args.epochs}, seed {args.seed};"
          f" classifier weights {before} unchanged")  # fmt: skip
    print(
        f"{'method':<24}{'pearson':>9}{'per-image':>11}{'rel. L2':>9}{'ms/image':>10}{'train s':>9}"
    )
    for name, r in rows.items():
        print(f"{name:<24}{r['pearson']:>9.3f}{r['per_image']:>11.3f}{r['rel']:>9.3f}"
              f"{r['ms']:>10.2f}{r['train_s']:>9}")  # fmt: skip


if __name__ == "__main__":
    main()
