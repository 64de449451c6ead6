"""COCOA benchmark on digits-encoder: insertion and deletion AUCs, the paper's protocol at 8x8.

    .venv/bin/python bench/cocoa_bench.py [--quick] [--out bench/out]

Lin et al. (ICLR 2023), scripts/attribute.py and eval.py, scaled to sklearn's digits: for each
digit class, corpus = 100 random training images of that class, foil = 1,500 random training
images of other classes (the training split has fewer: all of them, about 1,210, are used),
explicands = 25 test images of the class. Attribution targets: COCOA (contrastive corpus
similarity), the explicand's similarity to itself (label-free, the explicand-centric target the
paper compares against) and a random ordering. Base methods: integrated gradients (50 steps,
per pixel) and KernelSHAP over 2x2 patches (16 players, 2,080 coalitions); both remove features
towards a Gaussian blur of the image (sigma 1 pixel), as the paper blurs.

Insertion and deletion curves go over the 64 pixels in order of attribution (patch values are
shared by a patch's 4 pixels; ties broken at random), from the blurred image to the image and
back, one pixel per step (65 points). AUC by the trapezoid over the fraction of pixels. Curves
are measured on (i) the contrastive corpus similarity with a freshly drawn evaluation foil and
(ii) the corpus-majority probability: digits-cnn's probability of the class it predicts most
often on the corpus. Higher insertion and lower deletion AUCs are better.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from scipy.ndimage import gaussian_filter  # noqa: E402

torch.set_num_threads(1)

from app.settings import Settings  # noqa: E402
from explainers import cocoa  # noqa: E402
from models.builtin.encoders import load_digits_encoder  # noqa: E402
from models.builtin.trained import dataset_split, load_digits_cnn  # noqa: E402

SEED = 123  # the paper's default seed


def blur(x: np.ndarray) -> np.ndarray:
    return gaussian_filter(x.astype(np.float64), sigma=[0, 1.0, 1.0]).astype(np.float32)


def curves(x: np.ndarray, order: np.ndarray, score: Any) -> tuple[np.ndarray, np.ndarray]:
    """Insertion and deletion curves (65 points) of score over pixels in `order`."""
    base = blur(x).reshape(-1)
    flat = x.reshape(-1)
    n = flat.size
    ins, dele = [], []
    for k in range(n + 1):
        keep = np.zeros(n, dtype=bool)
        keep[order[:k]] = True
        ins.append(np.where(keep, flat, base))
        dele.append(np.where(keep, base, flat))
    rows = np.stack(ins + dele).reshape(-1, *x.shape)
    values = score(rows)
    return values[: n + 1], values[n + 1 :]


def auc(curve: np.ndarray) -> float:
    return float(np.trapezoid(curve, dx=1.0 / (len(curve) - 1)))


def pixel_order(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Pixels by attribution, descending; patch values spread to their pixels; random ties."""
    if values.size == 16:  # 2x2 patches of an 8x8 image
        grid = values.reshape(4, 4)
        values = np.kron(grid, np.ones((2, 2))).reshape(-1)
    jitter = rng.random(values.size) * 1e-12
    return np.lexsort((jitter, -values))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="3 classes, 5 explicands each")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args()
    model_dir = Settings().model_dir
    enc = load_digits_encoder(model_dir)
    clf = load_digits_cnn(model_dir)
    split = dataset_split("digits-cnn")
    rng = np.random.default_rng(SEED)
    classes = [0, 3, 7] if args.quick else list(range(10))
    per_class = 5 if args.quick else 25
    methods = [
        ("integrated_gradients", {"method": "integrated_gradients", "steps": 50}),
        ("kernel_shap_2x2", {"method": "shapley", "estimator": "kernel", "patch_size": 2}),
    ]
    rows: list[dict[str, Any]] = []
    timing: dict[str, list[float]] = {}
    for c in classes:
        same = np.flatnonzero(split.y_train == c)
        other = np.flatnonzero(split.y_train != c)
        corpus = split.x_train[rng.choice(same, 100, replace=False)]
        foil_idx = rng.choice(other, min(1500, len(other)), replace=False)
        foil = split.x_train[foil_idx]
        eval_foil = split.x_train[rng.permutation(other)[: len(foil_idx)]]  # a fresh draw
        explicands = split.x_test[rng.choice(np.flatnonzero(split.y_test == c), per_class, False)]
        majority = int(np.bincount(clf.predict(corpus).argmax(axis=1), minlength=10).argmax())
        mu_c, _ = cocoa.mean_embedding(enc, corpus, True)
        mu_e, _ = cocoa.mean_embedding(enc, eval_foil, True)
        eval_target = cocoa.Target(mu_c - mu_e, True)

        def contrastive(batch: np.ndarray, t: cocoa.Target = eval_target) -> np.ndarray:
            return t(enc.predict(batch))

        def majority_prob(batch: np.ndarray, k: int = majority) -> np.ndarray:
            return clf.predict(batch)[:, k].astype(np.float64)

        for base_name, opts in methods:
            explained: dict[str, list[np.ndarray]] = {}
            for target in ("contrastive", "explicand"):
                start = time.perf_counter()
                res = cocoa.explain(
                    enc,
                    explicands,
                    options=cocoa.CocoaOptions(objective=target, baseline="blur", **opts),
                    corpus=corpus.tolist(),
                    foil=foil.tolist(),
                    seed=SEED,
                )
                elapsed = (time.perf_counter() - start) / len(explicands)
                timing.setdefault(f"{base_name}/{target}", []).append(elapsed)
                explained[target] = [e.values for e in res.explanations]
            explained["random"] = [rng.standard_normal(64) for _ in explicands]
            for target, values in explained.items():
                for i, (x, v) in enumerate(zip(explicands, values, strict=True)):
                    order = pixel_order(v, rng)
                    row: dict[str, Any] = {"class": c, "i": i, "base": base_name, "target": target}
                    for metric, fn in (
                        ("contrastive", contrastive),
                        ("majority_prob", majority_prob),
                    ):
                        ins, dele = curves(x, order, fn)
                        row[f"{metric}_insertion"] = auc(ins)
                        row[f"{metric}_deletion"] = auc(dele)
                    rows.append(row)
        print(f"class {c}: corpus majority class {majority}", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cocoa_bench.json").write_text(json.dumps({"rows": rows, "timing": timing}))
    metrics = [
        "contrastive_insertion",
        "contrastive_deletion",
        "majority_prob_insertion",
        "majority_prob_deletion",
    ]
    print(f"\n{len(classes)} classes x {per_class} explicands; mean (standard error)")
    print("| base | target | " + " | ".join(metrics) + " |")
    print("|---|---|" + "---|" * len(metrics))
    for base_name, _ in methods:
        for target in ("contrastive", "explicand", "random"):
            sel = [r for r in rows if r["base"] == base_name and r["target"] == target]
            cells = []
            for m in metrics:
                v = np.array([r[m] for r in sel])
                cells.append(f"{v.mean():.3f} ({v.std(ddof=1) / np.sqrt(len(v)):.3f})")
            name = {"contrastive": "COCOA", "explicand": "explicand similarity"}.get(target, target)
            print(f"| {base_name} | {name} | " + " | ".join(cells) + " |")
    print("\nseconds per explanation (mean over classes):")
    for key, values in timing.items():
        print(f"  {key}: {np.mean(values) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
