"""A sampled-estimator audit end to end: a registered ONNX MLP (scikit-learn's breast-cancer
MLPClassifier through skl2onnx, 30 features, a 50-row background CSV), explained with the
default `estimator: auto`, side by side in one run with

  (a) the synchronous route, one row a request (a dashboard's way) and 100 rows a request;
  (b) the audit through xai.Client: submit, wait, download every result;
  (c) shap.KernelExplainer in process on an onnxruntime session of the same file, the same 50
      background rows, at the number of coalitions the service used per row.

Also which fit `auto` chose per row (details.auto) in the audit and the synchronous answers,
and the values' agreement with (c) (differences in units of the service's error_std). The
server is the real `python -m app` at its defaults (tree_audit_bench's start_server).

Run:  .venv/bin/python bench/sampled_audit_bench.py [--rows 200] [--model-dir DIR]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.tree_audit_bench import server_env, start_server  # noqa: E402

BACKGROUND_ROWS = 50


def model_and_data() -> tuple[bytes, np.ndarray, np.ndarray, list[str]]:
    """The ONNX bytes, background rows, explicands (held-out rows) and feature names."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    data = load_breast_cancer()
    x = data.data.astype(np.float32)
    x_train, x_test, y_train, _ = train_test_split(x, data.target, test_size=0.5, random_state=0)
    pipe = make_pipeline(
        StandardScaler(), MLPClassifier(hidden_layer_sizes=(32, 32), max_iter=2000, random_state=0)
    ).fit(x_train, y_train)
    onnx = convert_sklearn(
        pipe,
        initial_types=[("input", FloatTensorType([None, x.shape[1]]))],
        options={id(pipe.steps[-1][1]): {"zipmap": False}},
    )
    names = [n.replace(" ", "_") for n in data.feature_names]
    return onnx.SerializeToString(), x_train[:BACKGROUND_ROWS], x_test, names


def register(url: str, name: str, onnx: bytes, background: np.ndarray, names: list[str]) -> None:
    import httpx

    csv = ",".join(names) + "\n" + "\n".join(",".join(map(repr, map(float, r))) for r in background)
    with httpx.Client(base_url=url, timeout=600) as http:
        r = http.post(
            "/v2/repository/models",
            data={
                "name": name,
                "format": "onnx",
                "onnx_output": "probabilities",
                "task": "classification",
                "feature_names": json.dumps(names),
                "output_names": json.dumps(["malignant", "benign"]),
            },
            files={"file": ("mlp.onnx", onnx), "background": ("background.csv", csv.encode())},
        )
    if r.status_code >= 300:
        raise RuntimeError(f"registration answered {r.status_code}: {r.text[:500]}")


def fits(explanations: list[dict[str, Any]]) -> dict[str, int]:
    """How many answers each fit gave (details.auto.chosen, else the estimator)."""
    chosen = [
        ((e.get("details") or {}).get("auto") or {}).get("chosen") or e["estimator"]
        for e in explanations
    ]
    return dict(collections.Counter(chosen))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=Path("/tmp/sampled_audit_bench.json"))
    args = parser.parse_args()
    import httpx
    import onnxruntime as ort
    import shap

    from xai import Client

    onnx, background, explicands, names = model_and_data()
    rows = explicands[: args.rows]
    tmp = Path(tempfile.mkdtemp(prefix="sampled-audit-bench-"))
    env_args = argparse.Namespace(database_url=None, model_dir=args.model_dir, redis=None)
    server = start_server(server_env(env_args, tmp), tmp, 0)
    report: dict[str, Any] = {"rows": len(rows), "loadavg_start": list(os.getloadavg())}
    try:
        name = f"onnx-mlp-{uuid.uuid4().hex[:6]}"
        register(server.url, name, onnx, background, names)
        url = f"/v2/models/{name}/explain/shapley"
        nocache = {"cache-control": "no-cache"}
        with httpx.Client(base_url=server.url, timeout=600) as http:
            t = time.perf_counter()
            alone = [
                http.post(url, json={"inputs": [r.tolist()]}, headers=nocache).json() for r in rows
            ]
            sync_one = time.perf_counter() - t
            t = time.perf_counter()
            for start in range(0, len(rows), 100):
                batch = rows[start : start + 100].tolist()
                r = http.post(url, json={"inputs": batch}, headers=nocache)
                assert r.status_code == 200, r.text
            sync_100 = time.perf_counter() - t
        t = time.perf_counter()
        audit = Client(server.url).audit(name, rows, progress=False)
        audited = time.perf_counter() - t
        explained = [r["explanation"] for r in audit.results]
        per_row = [a["data"]["explanations"][0] for a in alone]
        coalitions = round(float(np.median([e["n_model_evals"] for e in explained]))) // len(
            background
        )
        session = ort.InferenceSession(onnx, providers=["CPUExecutionProvider"])
        out = session.get_outputs()[-1].name

        def predict(x: np.ndarray) -> Any:
            return session.run([out], {"input": x.astype(np.float32)})[0]

        t = time.perf_counter()
        kernel = shap.KernelExplainer(predict, background)
        ref = kernel.shap_values(rows, nsamples=coalitions, silent=True)
        shap_s = time.perf_counter() - t
        ref = np.asarray(ref)
        ref = ref[..., 1] if ref.ndim == 3 else ref[1]  # the positive class (benign)
        values = np.array([e["values"] for e in explained])
        std = np.array([e["error_std"] or [np.nan] * len(names) for e in explained])
        z = np.abs(values - ref) / np.sqrt(std**2 + 1e-12)
        n = len(rows)
        report.update(
            coalitions_per_row=coalitions,
            rows_per_s={
                "sync one row a request": n / sync_one,
                "sync 100 rows a request": n / sync_100,
                "audit": n / audited,
                "shap KernelExplainer": n / shap_s,
            },
            audit_fits=fits(explained),
            sync_one_row_fits=fits(per_row),
            audit_status=audit.status["status"],
            audit_cache_hits=(audit.status.get("summary") or {}).get("cache_hits"),
            output_explained=sorted({e["output_index"] for e in explained}),
            median_abs_diff_in_error_std=float(np.nanmedian(z)),
            loadavg_end=list(os.getloadavg()),
        )
    finally:
        server.stop()
    rates = report["rows_per_s"]
    print(f"{len(rows)} rows, {report['coalitions_per_row']} coalitions a row (auto's budget)")
    for k, v in rates.items():
        print(f"  {k:26s} {v:8.1f} rows/s")
    print(f"  audit / sync one row       {rates['audit'] / rates['sync one row a request']:.2f}")
    print(f"  audit / sync 100 rows      {rates['audit'] / rates['sync 100 rows a request']:.2f}")
    print(f"  audit / shap Kernel        {rates['audit'] / rates['shap KernelExplainer']:.2f}")
    print(f"  audit cache hits: {report['audit_cache_hits']} (the sync requests sent no-cache)")
    print(f"  fits: audit {report['audit_fits']}, sync one row {report['sync_one_row_fits']}")
    print(f"  |ours - shap| / error_std, median: {report['median_abs_diff_in_error_std']:.2f}")
    print(f"  load {report['loadavg_start']} -> {report['loadavg_end']}")
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
