"""Minimal sufficient subsets vs Shapley's top-k vs Anchors (alibi) on digits-cnn and
breast-cancer-mlp: subset size, precision on held-out data, time, model rows.

One absence distribution for all: absent players take the values of a reference row (digits: 2x2
patches from training images; breast cancer: features from training rows). The search sees the
model's 100-row background (digits: its first 20 images); precision is measured on held-out test
rows never explained or searched with: the share of them that, with the subset's players set to
the instance's values, keep the predicted class.

- sufficient (argmax): the explainer's default criterion (the mean probability keeps the class);
- sufficient (precision >= 0.95): `min_precision=0.95`, Anchors' default threshold;
- Shapley top-k: the shortest prefix of the same Shapley order that meets the criterion (no
  pruning; the order is the explainer's own `order_values`, the same game and budget);
- Anchors: alibi's AnchorTabular (quartile predicates) / AnchorImage (segments = the same 2x2
  patches, background images as the absence), threshold 0.95; its size is the number of
  features / patches in the anchor, its precision measured like ours (the anchor's features kept
  at the instance's values) and as alibi reports it (its own sampling).

alibi 0.9.6 pins numpy<2 and pandas<3, so it runs in a virtualenv of its own, .peers/alibi (no
torch, no tensorflow): `python bench/sufficient_bench.py --setup-alibi` creates it; the models
go there as ONNX graphs (onnxruntime). Without it the Anchors rows are skipped with the reason.

    .venv/bin/python bench/sufficient_bench.py [--n-digits 10] [--n-tabular 20]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ALIBI_VENV = ROOT / ".peers" / "alibi"
# spacy 3.7 (an alibi dependency) imports click, which typer >= 0.2x no longer brings.
ALIBI_PINS = ["alibi==0.9.6", "onnxruntime==1.32.0", "click==8.5.1"]
THRESHOLD = 0.95


# ---- the Anchors side: runs under .peers/alibi/bin/python (numpy < 2, no torch) ----


def _patches(image: np.ndarray, size: int = 2) -> np.ndarray:
    h, w = image.shape[:2]
    cols = -(-w // size)
    return (np.arange(h)[:, None] // size) * cols + np.arange(w)[None, :] // size


def anchors_peer(job: Path, out: Path) -> None:
    import onnxruntime as ort
    from alibi.explainers import AnchorImage, AnchorTabular

    data = np.load(job)
    sess = ort.InferenceSession(str(data["onnx"]), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    shape = tuple(int(s) for s in data["input_shape"])

    calls = [0]

    def predict(x: np.ndarray) -> np.ndarray:
        rows = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, *shape)
        calls[0] += len(rows)
        return np.asarray(sess.run(None, {name: rows})[0])

    results = []
    if str(data["modality"]) == "tabular":
        names = [str(n) for n in data["feature_names"]]
        explainer = AnchorTabular(lambda x: predict(x), names, seed=0)
        explainer.fit(data["train"], disc_perc=(25, 50, 75))
        for x in data["inputs"]:
            start, calls[0] = time.perf_counter(), 0
            exp = explainer.explain(x, threshold=THRESHOLD)
            results.append(
                {
                    "features": sorted(int(i) for i in exp.raw["feature"]),
                    "anchor": list(exp.anchor),
                    "alibi_precision": float(exp.precision),
                    "seconds": time.perf_counter() - start,
                    "evals": calls[0],
                }
            )
    else:
        hwc = (shape[1], shape[2], shape[0])
        background = np.transpose(data["train"], (0, 2, 3, 1))  # [r, H, W, C]
        explainer = AnchorImage(
            lambda imgs: predict(np.transpose(imgs, (0, 3, 1, 2))),
            hwc,
            segmentation_fn=lambda img: _patches(img),
            images_background=background,
            seed=0,
        )
        for x in data["inputs"]:
            start, calls[0] = time.perf_counter(), 0
            exp = explainer.explain(np.transpose(x, (1, 2, 0)), threshold=THRESHOLD, p_sample=0.5)
            results.append(
                {
                    "features": sorted(int(i) for i in exp.raw["feature"]),
                    "alibi_precision": float(exp.precision),
                    "seconds": time.perf_counter() - start,
                    "evals": calls[0],
                }
            )
    out.write_text(json.dumps(results))


def setup_alibi() -> None:
    """The isolated virtualenv for alibi (torch and tensorflow refused by constraints)."""
    if not (ALIBI_VENV / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(ALIBI_VENV)], check=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("torch<0\ntensorflow<0\n")
    pip = [str(ALIBI_VENV / "bin" / "python"), "-m", "pip", "install", "-q", "-c", f.name]
    subprocess.run([*pip, *ALIBI_PINS], check=True)


def alibi_ready() -> str | None:
    """None when the alibi peer can run, else why not."""
    python = ALIBI_VENV / "bin" / "python"
    if not python.exists():
        return f"{ALIBI_VENV} missing: run bench/sufficient_bench.py --setup-alibi"
    probe = subprocess.run(
        [str(python), "-c", "import alibi.explainers, onnxruntime"],
        capture_output=True,
        text=True,
    )
    return None if probe.returncode == 0 else probe.stderr.strip().splitlines()[-1]


# ---- our side ----


def _held_out_precision(
    model: Any, x: np.ndarray, keep: np.ndarray, refs: np.ndarray, c: int
) -> float:
    """Share of reference rows that keep class c with the `keep` features (flat bool) from x."""
    flat = x.reshape(-1)
    rows = np.where(keep, flat, refs.reshape(len(refs), -1)).reshape(-1, *model.input_shape)
    return float(np.mean(np.argmax(model.predict(rows), axis=1) == c))


def _keeps(
    model: Any, x: np.ndarray, keep: np.ndarray, refs: np.ndarray, c: int, prec: float
) -> bool:
    """The search criterion on `refs`: the mean probability keeps c (and precision >= prec)."""
    rows = np.where(keep, x.reshape(-1), refs.reshape(len(refs), -1))
    probs = model.predict(rows.reshape(-1, *model.input_shape))
    share = float(np.mean(np.argmax(probs, axis=1) == c))
    return bool(np.argmax(probs.mean(axis=0)) == c) and share >= prec - 1e-12


def run_model(name: str, n: int, anchors: bool, out: dict[str, Any]) -> None:
    from app.settings import Settings
    from explainers.games.masked import patch_groups
    from explainers.shapley.explainer import MaskerOptions
    from explainers.sufficient.explainer import SufficientOptions, explain
    from models.builtin.trained import dataset_split, load_builtin

    model = load_builtin(name, Settings().model_dir)
    split = dataset_split(name)
    xs = split.x_test[:n]
    if model.modality == "image":
        search_refs = model.background[:20]  # type: ignore[index]
        held_out = split.x_test[100:300]
        groups, _ = patch_groups(model.input_shape, 2)
    else:
        search_refs = model.background
        held_out = split.x_test[n:]
        groups = np.arange(model.n_features)
    assert search_refs is not None
    masker = MaskerOptions(type="background")
    rows: dict[str, list[dict[str, Any]]] = {}
    for label, prec in (("argmax", 0.0), ("precision>=0.95", THRESHOLD)):
        opts = SufficientOptions(masker=masker, min_precision=prec or None, search="greedy")
        start = time.perf_counter()
        res = explain(model, xs, options=opts, background=search_refs)
        seconds = (time.perf_counter() - start) / n
        ours, topk = [], []
        for x, e in zip(xs, res.explanations, strict=True):
            d = e.details
            assert d is not None and d["verified"]
            c = d["class"]
            keep = np.isin(groups, d["subset"])
            ours.append(
                {
                    "size": d["size"],
                    "precision": _held_out_precision(model, x, keep, held_out, c),
                    "evals": e.n_model_evals,
                    "seconds": seconds,
                }
            )
            order = np.argsort(-np.asarray(d["order_values"]), kind="stable")
            for k in range(len(order) + 1):  # the shortest sufficient prefix (no pruning)
                keep_k = np.isin(groups, order[:k])
                if _keeps(model, x, keep_k, search_refs, c, prec):
                    break
            topk.append(
                {"size": k, "precision": _held_out_precision(model, x, keep_k, held_out, c)}
            )
        rows[f"sufficient ({label})"] = ours
        rows[f"Shapley top-k ({label})"] = topk
    if anchors:
        rows["Anchors (alibi, threshold 0.95)"] = _anchors(model, xs, split, groups, held_out)
    out[name] = {
        "n_instances": n,
        "n_players": int(groups.max()) + 1,
        "search_references": len(search_refs),
        "held_out_references": len(held_out),
        "methods": {k: _summary(v) for k, v in rows.items()},
    }


def _anchors(
    model: Any, xs: np.ndarray, split: Any, groups: np.ndarray, held_out: np.ndarray
) -> list[dict[str, Any]]:
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = Path(tmp) / "model.onnx"
        torch.onnx.export(
            model.torch_module(), (torch.zeros(1, *model.input_shape),), str(onnx_path),
            input_names=["x"], output_names=["p"],
            dynamic_axes={"x": {0: "n"}, "p": {0: "n"}}, dynamo=False,
        )  # fmt: skip
        train = model.background if model.modality == "image" else split.x_train
        np.savez(
            Path(tmp) / "job.npz",
            onnx=str(onnx_path),
            input_shape=np.array(model.input_shape),
            modality=model.modality,
            feature_names=np.array(model.feature_names),
            train=np.asarray(train, np.float32),
            inputs=np.asarray(xs, np.float32),
        )
        result = Path(tmp) / "out.json"
        subprocess.run(
            [str(ALIBI_VENV / "bin" / "python"), __file__, "--anchors-peer", tmp],
            check=True,
            cwd=ROOT,
        )
        found = json.loads(result.read_text())
    rows = []
    for x, a in zip(xs, found, strict=True):
        c = int(np.argmax(model.predict(x[None])))
        keep = np.isin(groups, a["features"])
        rows.append(
            {
                "size": len(a["features"]),
                "precision": _held_out_precision(model, x, keep, held_out, c),
                "alibi_precision": a["alibi_precision"],
                "seconds": a["seconds"],
                "evals": a["evals"],
            }
        )
    return rows


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in rows[0]:
        vals = np.array([r[key] for r in rows], dtype=np.float64)
        out[key] = round(float(vals.mean()), 4)
    out["share_precision>=0.95"] = round(
        float(np.mean([r["precision"] >= THRESHOLD for r in rows])), 3
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-digits", type=int, default=10)
    parser.add_argument("--n-tabular", type=int, default=20)
    parser.add_argument("--setup-alibi", action="store_true")
    parser.add_argument("--anchors-peer", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "sufficient.json"))
    args = parser.parse_args()
    if args.anchors_peer:
        anchors_peer(Path(args.anchors_peer) / "job.npz", Path(args.anchors_peer) / "out.json")
        return
    if args.setup_alibi:
        setup_alibi()
    import torch

    torch.set_num_threads(1)
    why_not = alibi_ready()
    if why_not:
        print(f"Anchors skipped: {why_not}")
    out: dict[str, Any] = {"alibi": why_not or "0.9.6"}
    run_model("breast-cancer-mlp", args.n_tabular, why_not is None, out)
    run_model("digits-cnn", args.n_digits, why_not is None, out)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    for model, res in out.items():
        if model == "alibi":
            continue
        print(f"\n{model}: {res['n_instances']} instances, {res['n_players']} players")
        print(
            f"{'method':34} {'size':>5} {'precision':>9} {'>=0.95':>6} {'own prec.':>9} "
            f"{'s/inst':>6} {'model rows':>10}"
        )
        for method, s in res["methods"].items():
            own = s.get("alibi_precision")
            print(
                f"{method:34} {s['size']:5.2f} {s['precision']:9.3f} "
                f"{s['share_precision>=0.95']:6.2f} {'' if own is None else f'{own:.3f}':>9} "
                f"{s.get('seconds', float('nan')):6.2f} {s.get('evals', float('nan')):10.0f}"
            )


if __name__ == "__main__":
    main()
