"""Interventional TreeSHAP over HTTP vs shap's own, and vs the model-agnostic path (issue 25).

    .venv/bin/python bench/tree_interventional_bench.py [--repeats 3] [--exact-all] [--out DIR]

One process. The service runs in-process behind FastAPI's TestClient (real routes, multipart
registration, JSON; no socket) on a temporary model folder and SQLite database. Every request
sends `Cache-Control: no-cache`. torch, BLAS/OpenMP, XGBoost and LightGBM get one thread each
(shap's tree code is single-threaded).

Models, fitted on pandas DataFrames (the booster stores the column names), seeds fixed, 200
trees of depth 4, saved with `save_model` and registered with every field declared:
XGBoost and LightGBM regressors on sklearn's diabetes (10 features) and three-class
classifiers on sklearn's wine (13 features). Data split 80/20 with seed 0: the explicands are
the first 20 test rows, the background the first 100 training rows.

For each model (classifiers: class 1's margin, log-odds):
- ours: `shapley` with `background` = the 100 rows, default options (auto -> estimator tree,
  masker interventional); compute time (meta.compute_ms) and wall time, median of --repeats;
- shap: `shap.TreeExplainer(estimator, data=Independent(bg, max_samples=100),
  feature_perturbation="interventional").shap_values(x)` on the fitted sklearn-API estimator,
  construction included, median of --repeats; max |ours - shap| over all 20 x n values;
- the model-agnostic path on the same rows and background: `estimator: "kernel"` at its
  default budget (one run), and `estimator: "exact"` (every coalition, the model's own predict;
  one run; on diabetes only, 2^10 coalitions, unless --exact-all): max |value - ours| and time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

torch.set_num_threads(1)
threadpool_limits(limits=1)

import lightgbm as lgb  # noqa: E402
import shap  # noqa: E402
import xgboost as xgb  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from sklearn.datasets import load_diabetes, load_wine  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

from app.main import create_app  # noqa: E402
from app.settings import Settings  # noqa: E402
from models.registry import ModelRegistry  # noqa: E402

warnings.filterwarnings("ignore")
NO_CACHE = {"Cache-Control": "no-cache"}
TREES, DEPTH, ROWS, BACKGROUND = 200, 4, 20, 100


def fitted(library: str, data: str) -> tuple[Any, bytes, dict[str, str], np.ndarray, np.ndarray]:
    """(estimator, saved file, registration form, explicands, background)."""
    loader = load_diabetes if data == "diabetes" else load_wine
    x, y = loader(return_X_y=True, as_frame=True)
    x_train, x_test, y_train, _ = train_test_split(x, y, test_size=0.2, random_state=0)
    regression = data == "diabetes"
    common: dict[str, Any] = {"n_estimators": TREES, "max_depth": DEPTH, "random_state": 0,
                              "n_jobs": 1}  # fmt: skip
    est: Any
    if library == "xgboost":
        est = (xgb.XGBRegressor if regression else xgb.XGBClassifier)(**common)
    else:
        est = (lgb.LGBMRegressor if regression else lgb.LGBMClassifier)(verbose=-1, **common)
    est.fit(x_train, y_train)
    booster = est.get_booster() if library == "xgboost" else est.booster_
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("m.json" if library == "xgboost" else "m.txt")
        booster.save_model(str(path))
        raw = path.read_bytes()
    outputs = ["progression"] if regression else ["class_0", "class_1", "class_2"]
    form = {
        "name": f"{data}-{library}",
        "format": library,
        "modality": "tabular",
        "input_shape": json.dumps([x.shape[1]]),
        "output_names": json.dumps(outputs),
        "feature_names": json.dumps(list(x.columns)),
        "task": "regression" if regression else "classification",
    }
    rows = np.asarray(x_test.values[:ROWS], np.float64)
    bg = np.asarray(x_train.values[:BACKGROUND], np.float64)
    return est, raw, form, rows, bg


def explain(client: TestClient, name: str, body: dict[str, Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    r = client.post(f"/v2/models/{name}/explain/shapley", json=body, headers=NO_CACHE)
    wall = 1000 * (time.perf_counter() - t0)
    assert r.status_code == 200, r.text
    return r.json(), wall


def values_of(answer: Any) -> np.ndarray:
    return np.array([e["values"] for e in answer["data"]["explanations"]])


def run_model(
    client: TestClient, library: str, data: str, repeats: int, exact: bool
) -> dict[str, Any]:
    est, raw, form, x, bg = fitted(library, data)
    r = client.post("/v2/repository/models", data=form, files={"file": ("m", raw)})
    assert r.status_code == 201, r.text
    name, target = form["name"], 0 if data == "diabetes" else 1
    body = {"inputs": x.tolist(), "background": bg.tolist(), "target": target}
    ours_ms, wall_ms = [], []
    for _ in range(repeats):
        answer, wall = explain(client, name, body)
        ours_ms.append(float(answer["meta"]["compute_ms"]))
        wall_ms.append(wall)
    params = answer["meta"]["parameters"]
    assert params["estimator"] == "tree" and params["masker"]["type"] == "interventional"
    ours = values_of(answer)
    gap = max(abs(sum(e["values"]) + e["base_value"] - e["instance_output_value"])
              for e in answer["data"]["explanations"])  # fmt: skip
    shap_ms = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        explainer = shap.TreeExplainer(
            est, data=shap.maskers.Independent(bg, max_samples=len(bg)),
            feature_perturbation="interventional",
        )  # fmt: skip
        sv = np.asarray(explainer.shap_values(x, check_additivity=False))
        shap_ms.append(1000 * (time.perf_counter() - t0))
    truth = sv if sv.ndim == 2 else sv[:, :, target]
    off = np.abs(ours - truth).max(axis=1)
    out: dict[str, Any] = {
        "model": f"{library} {data}",
        "features": x.shape[1],
        "largest_value": float(np.abs(ours).max()),
        "vs_shap": float(off.max()),
        "rows_off_shap": int((off > 1e-6).sum()),  # rows differing from shap by more than 1e-6
        "efficiency_gap": float(gap),
        "ours_compute_ms": statistics.median(ours_ms),
        "ours_wall_ms": statistics.median(wall_ms),
        "shap_ms": statistics.median(shap_ms),
    }
    agnostic = [("kernel", {"estimator": "kernel"}, None)]
    if exact or x.shape[1] <= 10:
        budget = 2 ** x.shape[1] * len(bg) + len(bg)
        agnostic.append(("exact", {"estimator": "exact"}, budget))
    for label, parameters, budget in agnostic:
        request = {**body, "parameters": parameters, **({"budget": budget} if budget else {})}
        answer, wall = explain(client, name, request)
        e0 = answer["data"]["explanations"][0]
        out[label] = {
            "compute_ms": float(answer["meta"]["compute_ms"]),
            "wall_ms": wall,
            "max_error": float(np.abs(values_of(answer) - ours).max()),
            "model_rows": int(e0["n_model_evals"]),
            "estimator": e0["estimator"],
        }
    return out


def fmt(v: float, digits: int = 1) -> str:
    return f"{v:,.{digits}f}"


def table(results: list[dict[str, Any]]) -> str:
    head = (
        "| model | n | max \\|ours - shap\\| (rows > 1e-6) | largest \\|value\\| | efficiency gap "
        "| ours compute ms | ours wall ms | shap ms | kernel ms (rows/instance) | kernel max error "
        "vs exact | **kernel / ours** | exact ms | exact max \\|diff\\| | exact / ours |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        k, e = r["kernel"], r.get("exact")
        ours = r["ours_compute_ms"]
        lines.append(
            f"| {r['model']} | {r['features']} | {r['vs_shap']:.1e} ({r['rows_off_shap']}) | "
            f"{r['largest_value']:.3g} | "
            f"{r['efficiency_gap']:.1e} | {fmt(ours)} | {fmt(r['ours_wall_ms'])} | "
            f"{fmt(r['shap_ms'])} | {fmt(k['compute_ms'], 0)} ({k['model_rows']:,}) | "
            f"{k['max_error']:.1e} | **{k['compute_ms'] / ours:,.0f}x** | "
            + (
                f"{fmt(e['compute_ms'], 0)} | {e['max_error']:.1e} | "
                f"{e['compute_ms'] / ours:,.0f}x |"
                if e
                else "- | - | - |"
            )
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--exact-all", action="store_true", help="exact on wine too (minutes)")
    ap.add_argument("--out", type=Path, default=None, help="write results.json here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            model_dir=Path(tmp) / "models",
            user_model_dir=Path(tmp) / "user",
            redis_url=None,
            database_url=f"sqlite:///{Path(tmp) / 'jobs.db'}",
            load_models_on_start=False,
        )
        results = []
        with TestClient(create_app(settings, ModelRegistry(Path(tmp) / "models"))) as client:
            for library in ("xgboost", "lightgbm"):
                for data in ("diabetes", "wine"):
                    results.append(run_model(client, library, data, args.repeats,
                                             args.exact_all))  # fmt: skip
                    print(json.dumps(results[-1]), flush=True)
    versions = f"shap {shap.__version__}, xgboost {xgb.__version__}, lightgbm {lgb.__version__}"
    print(f"\n{versions}; {ROWS} rows x {BACKGROUND} background rows, {TREES} trees of depth "
          f"{DEPTH}\n")  # fmt: skip
    print(table(results))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
