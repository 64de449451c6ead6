"""SST built-ins (digits-sst: SST's shared-trunk network; digits-sst-twin: our variant with an
independent selector CNN) vs the post-hoc search of `sufficient-subset` on digits-cnn and on
both: accuracy, subset size, faithfulness, precision and time per explanation, on the digits
test split (449 held-out images), and each SST model's first-start training time.

Players and absence are sufficient-subset's defaults on digits: 2x2 patches (16 players), a zero
baseline. For every subset:

- faithfulness: the share of images whose model keeps its class on the subset-only input (the
  model itself is asked; the post-hoc search verifies this by construction);
- random places: the same number of patches as the own subset, at random places (a shuffled
  mask per image, seed 0): does the mask head, not the count, make the subset sufficient?
- precision: the share of the model's 100 background rows (training images) that, filling the
  absent patches instead of zeros, keep the class (Anchors' precision under another absence);
- digits-cnn on SST's subsets: the share of images where digits-cnn keeps its own class on
  the SST model's subset-only input (does the subset carry the digit, or only a code that
  the SST model learnt to read?).

Time per explanation: own subset = one mask-head pass (plus one forward pass to verify); search =
`explainers.sufficient.explainer.explain` per image (greedy, Shapley order, default budget;
`--exact` adds the exact search over all 2^16 coalitions, the minimum size). `--seeds K` also
retrains both designs at seeds 1..K (not cached) and reports each seed's accuracy, mean size,
faithfulness and training time: the spread a seed gives.

    .venv/bin/python bench/sst_bench.py [--n 30] [--exact] [--seeds 0]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _keeps(model: Any, x: np.ndarray, subset: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """bool [m]: the model keeps `classes` on x with the patches outside subset zeroed."""
    from models.builtin.sst import subset_input

    return np.argmax(model.predict(subset_input(x, subset)), axis=1) == classes


def _precision(model: Any, x: np.ndarray, subset: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """float [m]: share of background rows that, filling the absent patches, keep the class."""
    import torch

    from models.builtin.sst import pixel_mask

    refs = np.asarray(model.background, np.float32)  # [r, 1, 8, 8]
    out = np.empty(len(x))
    for i in range(len(x)):
        keep = pixel_mask(torch.from_numpy(subset[i : i + 1].astype(np.float32))).numpy()
        rows = np.where(keep > 0, x[i : i + 1], refs)
        out[i] = np.mean(np.argmax(model.predict(rows), axis=1) == classes[i])
    return out


def _search(
    model: Any, xs: np.ndarray, search: Literal["greedy", "exact"]
) -> tuple[np.ndarray, float, int]:
    """(subsets bool [m, 16], seconds per image, model rows) of the post-hoc search."""
    from explainers.sufficient.explainer import SufficientOptions, explain

    subsets = np.zeros((len(xs), 16), bool)
    rows = 0
    start = time.perf_counter()
    for i, x in enumerate(xs):
        res = explain(model, x[None], options=SufficientOptions(search=search), seed=0)
        d = res.explanations[0].details
        assert d is not None and d["verified"], d
        subsets[i, d["subset"]] = True
        rows += res.explanations[0].n_model_evals
    return subsets, (time.perf_counter() - start) / len(xs), rows


def _row(model: Any, xs: np.ndarray, subsets: np.ndarray, per_s: float) -> dict[str, Any]:
    classes = np.argmax(model.predict(xs), axis=1)
    sizes = subsets.sum(axis=1)
    rng = np.random.default_rng(0)
    shuffled = np.array([rng.permutation(row) for row in subsets])
    return {
        "images": len(xs),
        "mean_size": float(sizes.mean()),
        "size_histogram": np.bincount(sizes, minlength=17).tolist(),
        "faithfulness": float(_keeps(model, xs, subsets, classes).mean()),
        "random_places": float(_keeps(model, xs, shuffled, classes).mean()),
        "precision": float(_precision(model, xs, subsets, classes).mean()),
        "s_per_explanation": per_s,
    }


def _seeds(k: int) -> dict[str, Any]:
    """Both designs retrained at seeds 1..k (the built-ins are seed 0): test-split figures."""
    from models.builtin.datasets import split_dataset
    from models.builtin.sst import TWIN, SSTConfig, train_sst

    out: dict[str, Any] = {}
    for base in (SSTConfig(), TWIN):
        rows = []
        for seed in range(1, k + 1):
            cfg = replace(base, seed=seed)
            split = split_dataset(cfg.dataset, 0, cfg.test_fraction)  # the built-ins' split
            _, metrics = train_sst(cfg, split)
            rows.append({"seed": seed, **{key: metrics[key] for key in _SEED_KEYS}})
            print(f"{base.name} seed {seed}: {rows[-1]}", flush=True)
        out[f"{base.name} retrained"] = rows
    return out


_SEED_KEYS = ("test_accuracy", "test_subset_size", "test_faithfulness", "train_seconds")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=30, help="test images for the post-hoc search")
    parser.add_argument("--exact", action="store_true", help="also the exact (minimum) search")
    parser.add_argument("--seeds", type=int, default=0, help="also retrain at seeds 1..K")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "sst.json"))
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    from app.settings import Settings
    from models.builtin.sst import load_digits_sst, load_digits_sst_twin, own_subset
    from models.builtin.trained import dataset_split, load_digits_cnn

    cache = Settings().model_dir
    cnn = load_digits_cnn(cache)
    ssts = (load_digits_sst(cache), load_digits_sst_twin(cache))
    split = dataset_split("digits-cnn")
    x, y = split.x_test, split.y_test
    out: dict[str, Any] = {"test_images": len(x)}
    for m in (cnn, *ssts):
        out[f"accuracy {m.name}"] = float((np.argmax(m.predict(x), axis=1) == y).mean())
    cnn_class = np.argmax(cnn.predict(x), axis=1)
    xs = x[: args.n]
    for sst in ssts:
        out[f"first-start training seconds {sst.name}"] = sst.info["training"]["train_seconds"]
        own = own_subset(sst, x)  # batched; time below is per single image
        start = time.perf_counter()
        for i in range(len(x)):
            own_subset(sst, x[i : i + 1])
        per_own = (time.perf_counter() - start) / len(x)
        out[f"{sst.name} own subset (all test images)"] = _row(sst, x, own, per_own)
        agree = np.argmax(sst.predict(x), axis=1) == cnn_class
        out[f"digits-cnn keeps its class on {sst.name}'s own subsets"] = float(
            _keeps(cnn, x[agree], own[agree], cnn_class[agree]).mean()
        )
        out[f"{sst.name} own subset (first {args.n})"] = _row(sst, xs, own[: args.n], per_own)
        print(f"{sst.name}: {out[f'{sst.name} own subset (all test images)']}", flush=True)
    searches: tuple[Literal["greedy", "exact"], ...] = (
        ("greedy", "exact") if args.exact else ("greedy",)
    )
    for search in searches:
        for m in (cnn, *ssts):
            subsets, per_s, rows = _search(m, xs, search)
            row = _row(m, xs, subsets, per_s)
            row["model_rows"] = rows
            out[f"{search} search on {m.name} (first {args.n})"] = row
            print(f"{search} search on {m.name}: {row}", flush=True)
    if args.seeds:
        out.update(_seeds(args.seeds))

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    for key, value in out.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
