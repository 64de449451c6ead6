"""Bring your own model: registered XGBoost, LightGBM and ONNX models vs shap; ONNX vs torch.

    .venv/bin/python bench/byom_bench.py [--only trees|mlp|throughput] [--repeats 5] [--out DIR]

One process. The service runs in-process behind FastAPI's TestClient (real routes, real
registration over multipart, real JSON; no socket): `app.main.create_app` on a temporary model
folder and SQLite database, no built-in models. Every request sends `Cache-Control: no-cache`.
torch, BLAS/OpenMP, onnxruntime, XGBoost and LightGBM get one thread each, in the service and in
the peers. Data: sklearn's diabetes (442 rows, 10 features), split 80/20 with seed 0; the
explicands are the first test rows, backgrounds the first training rows.

Parts (see docs/benchmarks.md, "Bring your own model"):
1. trees: XGBoost (200 trees, depth 4) and LightGBM (200 trees, depth 4) regressors registered
   from their own files with a stored 100-row background. estimator tree over HTTP vs
   shap.TreeExplainer (path-dependent, raw margin) on the same booster, on the rows as sent and
   rounded to float32 (what the service fed boosters before they read float64), and vs an
   independent enumeration of the path-dependent game over all 2^10 coalitions (shap's parse
   of the trees, our traversal);
   compute time of estimator tree vs estimator kernel (default budget, the stored background)
   on the same rows and route, the kernel's answer against enumerating its game with the
   library's own predict.
2. mlp: StandardScaler + MLPRegressor, and + MLPClassifier (diabetes above its median), exported
   by skl2onnx, registered over HTTP, explained by estimator exact with 20 background rows sent
   in the request, vs shap.ExactExplainer on an onnxruntime session of the same file with
   shap.maskers.Independent(background, max_samples=20).
3. throughput: that ONNX regressor's rows/s on masked rows (all 2^10 coalitions of an explicand
   over the 20 background rows, tiled to the batch size) vs the same weights in a float32 torch
   nn.Sequential, and through the service's model adapter (Model.predict on the ONNX session).
   torch's large batches depend on glibc's allocator; compare a run with
   MALLOC_MMAP_THRESHOLD_=2000000000 MALLOC_TRIM_THRESHOLD_=2000000000 in the environment.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
import onnxruntime as ort  # noqa: E402
import shap  # noqa: E402
import xgboost as xgb  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from sklearn.datasets import load_diabetes  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from sklearn.neural_network import MLPClassifier, MLPRegressor  # noqa: E402
from sklearn.pipeline import Pipeline, make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

from app.main import create_app  # noqa: E402
from app.settings import Settings  # noqa: E402
from models.registry import ModelRegistry  # noqa: E402

warnings.filterwarnings("ignore", category=UserWarning)
NO_CACHE = {"Cache-Control": "no-cache"}
HIDDEN = (32, 16)


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def fmt(x: float, digits: int = 2) -> str:
    return f"{x:,.{digits}f}"


def print_table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    print(f"\n{title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")


# --------------------------------------------------------------------------------------------
# Data, the service, registration


def diabetes() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    data = load_diabetes()
    x_train, x_test, y_train, y_test = train_test_split(
        data.data, data.target, test_size=0.2, random_state=0
    )
    return x_train, x_test, y_train, y_test, list(data.feature_names)


@contextmanager
def service() -> Iterator[TestClient]:
    """The real app on a temporary folder and database, no built-in models."""
    with tempfile.TemporaryDirectory(prefix="byom-bench-") as tmp:
        root = Path(tmp)
        settings = Settings(
            model_dir=root / "models",
            user_model_dir=root / "user",
            redis_url=None,
            database_url=f"sqlite:///{root / 'service.db'}",
            load_models_on_start=False,
            load_background_models=False,
            torch_threads=1,
            explain_workers=1,
        )
        registry = ModelRegistry(root / "models", builtins=())
        with TestClient(create_app(settings, registry)) as client:
            yield client


def csv_background(rows: np.ndarray, names: list[str]) -> bytes:
    buf = io.StringIO()
    np.savetxt(buf, rows, delimiter=",", header=",".join(names), comments="", fmt="%.17g")
    return buf.getvalue().encode()


def register(
    client: TestClient,
    name: str,
    data: bytes,
    names: list[str],
    outputs: list[str],
    task: str,
    background: bytes | None = None,
    **extra: str,
) -> dict[str, Any]:
    form = {
        "name": name,
        "modality": "tabular",
        "input_shape": json.dumps([len(names)]),
        "output_names": json.dumps(outputs),
        "feature_names": json.dumps(names),
        "task": task,
        **extra,
    }
    files: dict[str, tuple[str, bytes]] = {"file": (name, data)}
    if background is not None:
        files["background"] = ("background.csv", background)
    r = client.post("/v2/repository/models", data=form, files=files)
    if r.status_code != 201:
        raise SystemExit(f"registering {name} failed: {r.status_code} {r.text}")
    return dict(r.json())


def explain(client: TestClient, model: str, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """One shapley request; the answer and its wall seconds (client side)."""
    start = time.perf_counter()
    r = client.post(f"/v2/models/{model}/explain/shapley", json=body, headers=NO_CACHE)
    wall = time.perf_counter() - start
    if r.status_code != 200:
        raise SystemExit(f"explain {model} {body.get('parameters')}: {r.status_code} {r.text}")
    return dict(r.json()), wall


def values_of(answer: dict[str, Any]) -> np.ndarray:
    return np.array([e["values"] for e in answer["data"]["explanations"]], dtype=np.float64)


def bases_of(answer: dict[str, Any]) -> np.ndarray:
    return np.array([e["base_value"] for e in answer["data"]["explanations"]], dtype=np.float64)


# --------------------------------------------------------------------------------------------
# 1. TreeSHAP


def tree_models(x: np.ndarray, y: np.ndarray) -> dict[str, tuple[Any, bytes, str]]:
    """name -> (the library's booster, its file bytes, format)."""
    xg = xgb.XGBRegressor(
        n_estimators=200, max_depth=4, learning_rate=0.05, random_state=0, n_jobs=1
    ).fit(x, y)
    xg_booster = xg.get_booster()
    lg = lgb.LGBMRegressor(
        n_estimators=200,
        max_depth=4,
        num_leaves=16,
        learning_rate=0.05,
        min_child_samples=10,
        random_state=0,
        n_jobs=1,
        verbose=-1,
    ).fit(x, y)
    lg_booster = lg.booster_
    return {
        "xgboost": (xg_booster, bytes(xg_booster.save_raw(raw_format="json")), "xgboost"),
        "lightgbm": (lg_booster, lg_booster.model_to_string().encode(), "lightgbm"),
    }


def f32(x: np.ndarray) -> np.ndarray:
    """Rows rounded to float32: what the service fed boosters before they read float64."""
    return x.astype(np.float32).astype(np.float64)


def library_margin(booster: Any) -> Callable[[np.ndarray], np.ndarray]:
    if isinstance(booster, xgb.Booster):
        return lambda z: np.asarray(booster.inplace_predict(z, predict_type="margin"))
    return lambda z: np.asarray(booster.predict(z, raw_score=True))


N_FEATURES = 10
MASKS = ((np.arange(1 << N_FEATURES)[:, None] >> np.arange(N_FEATURES)) & 1).astype(bool)


def shapley_from_game(v: np.ndarray) -> np.ndarray:
    """Shapley values from a game's value on every coalition (v[bitmask], [2^n]). [n]"""
    n = N_FEATURES
    sizes = MASKS.sum(axis=1)
    weight = np.array(
        [
            math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n) if s < n else 0.0
            for s in range(n + 1)
        ]
    )
    phi = np.empty(n)
    for i in range(n):
        without = np.flatnonzero(~MASKS[:, i])
        phi[i] = np.sum(weight[sizes[without]] * (v[without | (1 << i)] - v[without]))
    return phi


def interventional_game(
    f: Callable[[np.ndarray], np.ndarray], x: np.ndarray, background: np.ndarray
) -> np.ndarray:
    """v(S) = mean over the background of f(x on S, background elsewhere). [2^n]"""
    masked = np.where(MASKS[:, None, :], x, background[None]).reshape(-1, x.shape[0])
    return np.asarray(f(masked), dtype=np.float64).reshape(MASKS.shape[0], -1).mean(axis=1)


def _down(tree: Any, x: np.ndarray, node: int, w: np.ndarray) -> np.ndarray:
    """Expected leaf value below `node` for every coalition, reached with weights w. [2^n]"""
    lo, hi = tree.children_left[node], tree.children_right[node]
    if lo < 0:
        return w * tree.values[node, 0]
    f, cover = tree.features[node], tree.node_sample_weight
    goes_left = bool(x[f] <= tree.thresholds[node])
    known = MASKS[:, f]  # in the coalition: follow x; else split by the children's cover
    w_lo = np.where(known, w * goes_left, w * (cover[lo] / cover[node]))
    w_hi = np.where(known, w * (not goes_left), w * (cover[hi] / cover[node]))
    return _down(tree, x, lo, w_lo) + _down(tree, x, hi, w_hi)


def path_dependent_game(ensemble: Any, x: np.ndarray) -> np.ndarray:
    """v(S) = E[margin | x_S] by the trees' cover (TreeSHAP's game, Lundberg et al. 2020,
    Alg. 1), on shap's parsed trees (x <= threshold goes left), for all coalitions. [2^n]"""
    total = np.full(MASKS.shape[0], float(np.ravel(ensemble.base_offset)[0]))
    for tree in ensemble.trees:
        total += _down(tree, x, 0, np.ones(MASKS.shape[0]))
    return total


def bench_trees(client: TestClient, args: argparse.Namespace) -> dict[str, Any]:
    x_train, x_test, y_train, _, names = diabetes()
    rows = x_test[: args.rows]
    background = x_train[:100]
    inputs = rows.tolist()
    out: dict[str, Any] = {}
    for lib, (booster, data, fmt_) in tree_models(x_train, y_train).items():
        margin = library_margin(booster)
        name = f"diabetes-{lib}"
        register(
            client,
            name,
            data,
            names,
            ["progression"],
            "regression",
            csv_background(background, names),
            format=fmt_,
        )
        tree_body = {"inputs": inputs, "parameters": {"estimator": "tree"}}
        kernel_body = {"inputs": inputs, "parameters": {"estimator": "kernel"}}
        tree_answer, _ = explain(client, name, tree_body)  # warm-up
        kernel_answer, _ = explain(client, name, kernel_body)
        # Peer: shap.TreeExplainer on the same booster, path-dependent (no data), raw margin;
        # on the rows as sent (float64, what boosters read) and rounded to float32 (what other
        # models read; LightGBM's float64 thresholds tell them apart).
        peer = shap.TreeExplainer(booster)
        peer_values = np.asarray(peer.shap_values(rows), dtype=np.float64)
        peer_values32 = np.asarray(peer.shap_values(f32(rows)), dtype=np.float64)
        peer_base = float(np.ravel(peer.expected_value)[0])
        ours = values_of(tree_answer)
        # Independent references by enumerating all 2^10 coalitions: the path-dependent game
        # on shap's parse of the trees, and the kernel's game (the stored background) with the
        # library's own predict, both on the values the service computes with.
        path_values = np.array(
            [shapley_from_game(path_dependent_game(peer.model, x)) for x in rows]
        )
        inter_values = np.array(
            [shapley_from_game(interventional_game(margin, x, background)) for x in rows]
        )
        diff_rows = np.abs(ours - peer_values).max(axis=1)
        timings: dict[str, dict[str, list[float]]] = {
            k: {"compute_ms": [], "wall_ms": []} for k in ("tree", "kernel", "shap_tree")
        }
        for _ in range(args.repeats):  # interleaved
            for key, body in (("tree", tree_body), ("kernel", kernel_body)):
                answer, wall = explain(client, name, body)
                timings[key]["compute_ms"].append(float(answer["meta"]["compute_ms"]))
                timings[key]["wall_ms"].append(1000 * wall)
            start = time.perf_counter()
            peer.shap_values(rows)
            ms = 1000 * (time.perf_counter() - start)
            timings["shap_tree"]["compute_ms"].append(ms)
            timings["shap_tree"]["wall_ms"].append(ms)
        med = {k: {m: median(v) for m, v in t.items()} for k, t in timings.items()}
        out[lib] = {
            "max_abs_diff_vs_shap_tree": float(np.max(np.abs(ours - peer_values))),
            "max_abs_diff_vs_shap_tree_float32_rows": float(np.max(np.abs(ours - peer_values32))),
            "max_abs_diff_vs_path_dependent_enumeration": float(np.max(np.abs(ours - path_values))),
            "rows_over_1e-4": [int(i) for i in np.flatnonzero(diff_rows > 1e-4)],
            "instance_output_vs_library_float64": float(
                np.max(
                    np.abs(
                        [e["instance_output_value"] for e in tree_answer["data"]["explanations"]]
                        - (peer_values.sum(axis=1) + peer_base)
                    )
                )
            ),
            "base_value_diff": float(np.max(np.abs(bases_of(tree_answer) - peer_base))),
            "max_abs_value": float(np.max(np.abs(peer_values))),
            "tree_exact": tree_answer["meta"]["exact"],
            "tree_evals": tree_answer["meta"]["n_model_evals"],
            "kernel_evals": kernel_answer["meta"]["n_model_evals"],
            "kernel_budget": kernel_answer["meta"]["budget"],
            "kernel_exact": kernel_answer["meta"]["exact"],
            "kernel_masker": kernel_answer["meta"]["parameters"].get("masker"),
            "kernel_max_abs_diff_vs_enumeration": float(
                np.max(np.abs(values_of(kernel_answer) - inter_values))
            ),
            "median_ms": med,
            "kernel_over_tree_compute": med["kernel"]["compute_ms"] / med["tree"]["compute_ms"],
            "kernel_over_tree_wall": med["kernel"]["wall_ms"] / med["tree"]["wall_ms"],
            "runs": timings,
        }
    print_table(
        f"1. TreeSHAP ({args.rows} rows per request, medians of {args.repeats} interleaved "
        "repetitions)",
        [
            "model",
            "max abs diff vs shap.TreeExplainer (rows as sent)",
            "same, rows rounded to float32",
            "vs enumerated path-dependent game",
            "max abs value",
            "tree compute ms",
            "tree wall ms",
            "kernel compute ms",
            "kernel wall ms",
            "kernel/tree compute",
            "kernel/tree wall",
            "shap TreeExplainer ms",
            "kernel rows",
            "kernel vs enumeration",
        ],
        [
            [
                lib,
                f"{r['max_abs_diff_vs_shap_tree']:.2e}",
                f"{r['max_abs_diff_vs_shap_tree_float32_rows']:.2e}",
                f"{r['max_abs_diff_vs_path_dependent_enumeration']:.2e}",
                fmt(r["max_abs_value"]),
                fmt(r["median_ms"]["tree"]["compute_ms"]),
                fmt(r["median_ms"]["tree"]["wall_ms"]),
                fmt(r["median_ms"]["kernel"]["compute_ms"], 0),
                fmt(r["median_ms"]["kernel"]["wall_ms"], 0),
                f"**{r['kernel_over_tree_compute']:,.0f}x**",
                f"{r['kernel_over_tree_wall']:,.0f}x",
                fmt(r["median_ms"]["shap_tree"]["compute_ms"]),
                f"{r['kernel_evals']:,}",
                f"{r['kernel_max_abs_diff_vs_enumeration']:.2e}",
            ]
            for lib, r in out.items()
        ],
    )
    return out


# --------------------------------------------------------------------------------------------
# 2. ONNX MLP, exact


def mlp_pipelines(x: np.ndarray, y: np.ndarray) -> dict[str, Pipeline]:
    reg = make_pipeline(
        StandardScaler(), MLPRegressor(hidden_layer_sizes=HIDDEN, max_iter=3000, random_state=0)
    ).fit(x, y)
    clf = make_pipeline(
        StandardScaler(), MLPClassifier(hidden_layer_sizes=HIDDEN, max_iter=3000, random_state=0)
    ).fit(x, (y > np.median(y)).astype(np.int64))
    return {"regressor": reg, "classifier": clf}


def to_onnx(pipe: Pipeline, n_features: int) -> bytes:
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    options = {id(pipe.steps[-1][1]): {"zipmap": False}} if hasattr(pipe, "classes_") else None
    model = convert_sklearn(
        pipe, initial_types=[("input", FloatTensorType([None, n_features]))], options=options
    )
    return bytes(model.SerializeToString())


def ort_session(data: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def bench_mlp(client: TestClient, args: argparse.Namespace) -> dict[str, Any]:
    x_train, x_test, y_train, _, names = diabetes()
    rows, background = x_test[: args.rows], x_train[:20]
    out: dict[str, Any] = {}
    for kind, pipe in mlp_pipelines(x_train, y_train).items():
        data = to_onnx(pipe, len(names))
        name = f"diabetes-onnx-{kind}"
        classifier = kind == "classifier"
        extra = {"format": "onnx", **({"onnx_output": "probabilities"} if classifier else {})}
        outputs = ["low", "high"] if classifier else ["progression"]
        task = "classification" if classifier else "regression"
        register(client, name, data, names, outputs, task, None, **extra)
        target = 1 if classifier else 0
        body = {
            "inputs": rows.tolist(),
            "background": background.tolist(),
            "target": target,
            "parameters": {"estimator": "exact"},
        }
        explain(client, name, body)  # warm-up
        session = ort_session(data)
        output = "probabilities" if classifier else session.get_outputs()[0].name

        def f(z: np.ndarray, session: ort.InferenceSession = session, output: str = output) -> Any:
            return session.run([output], {"input": z.astype(np.float32)})[0]

        peer = shap.ExactExplainer(f, shap.maskers.Independent(background, max_samples=20))
        peer(rows[:2])  # warm-up
        ours_ms, wall_ms, shap_ms = [], [], []
        answer: dict[str, Any] = {}
        peer_out: Any = None
        for _ in range(args.repeats):
            answer, wall = explain(client, name, body)
            ours_ms.append(float(answer["meta"]["compute_ms"]))
            wall_ms.append(1000 * wall)
            start = time.perf_counter()
            peer_out = peer(rows)
            shap_ms.append(1000 * (time.perf_counter() - start))
        peer_values = np.asarray(peer_out.values, dtype=np.float64)
        peer_base = np.asarray(peer_out.base_values, dtype=np.float64)
        if peer_values.ndim == 3:  # [m, n, k]: the explained output
            peer_values, peer_base = peer_values[..., target], peer_base[..., target]
        ours = values_of(answer)
        out[kind] = {
            "max_abs_diff_vs_shap_exact": float(np.max(np.abs(ours - peer_values))),
            "base_value_diff": float(np.max(np.abs(bases_of(answer) - peer_base))),
            "max_abs_value": float(np.max(np.abs(peer_values))),
            "exact": answer["meta"]["exact"],
            "masker": answer["meta"]["parameters"].get("masker"),
            "n_model_evals": answer["meta"]["n_model_evals"],
            "median_ms": {
                "ours_compute": median(ours_ms),
                "ours_wall": median(wall_ms),
                "shap_exact": median(shap_ms),
            },
            "ours_over_shap_compute": median(ours_ms) / median(shap_ms),
            "runs": {"ours_compute": ours_ms, "ours_wall": wall_ms, "shap_exact": shap_ms},
        }
    print_table(
        f"2. ONNX MLP {HIDDEN}, exact ({args.rows} rows, 20 background rows in the request, "
        f"medians of {args.repeats})",
        [
            "pipeline",
            "max abs diff vs shap.ExactExplainer",
            "base diff",
            "max abs value",
            "masker source",
            "model rows",
            "ours compute ms",
            "ours wall ms",
            "shap ms",
            "ours/shap",
        ],
        [
            [
                k,
                f"{r['max_abs_diff_vs_shap_exact']:.2e}",
                f"{r['base_value_diff']:.1e}",
                fmt(r["max_abs_value"], 3),
                (r["masker"] or {}).get("source"),
                f"{r['n_model_evals']:,}",
                fmt(r["median_ms"]["ours_compute"], 0),
                fmt(r["median_ms"]["ours_wall"], 0),
                fmt(r["median_ms"]["shap_exact"], 0),
                f"{r['ours_over_shap_compute']:.2f}",
            ]
            for k, r in out.items()
        ],
    )
    return out


# --------------------------------------------------------------------------------------------
# 3. onnxruntime vs torch on masked rows


class Standardize(torch.nn.Module):
    """The StandardScaler step: (x - mean) / scale."""

    mean: torch.Tensor
    scale: torch.Tensor

    def __init__(self, mean: np.ndarray, scale: np.ndarray) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))
        self.register_buffer("scale", torch.tensor(scale, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.scale


def torch_copy(pipe: Pipeline) -> torch.nn.Sequential:
    """The same network in float32 torch: scaler, then Linear + ReLU per hidden layer."""
    scaler, mlp = pipe.steps[0][1], pipe.steps[-1][1]
    layers: list[torch.nn.Module] = [Standardize(scaler.mean_, scaler.scale_)]
    for i, (w, b) in enumerate(zip(mlp.coefs_, mlp.intercepts_, strict=True)):
        linear = torch.nn.Linear(w.shape[0], w.shape[1])
        with torch.no_grad():
            linear.weight.copy_(torch.tensor(w.T, dtype=torch.float32))
            linear.bias.copy_(torch.tensor(b, dtype=torch.float32))
        layers.append(linear)
        if i < len(mlp.coefs_) - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).eval()


def masked_rows(x: np.ndarray, background: np.ndarray, n_rows: int) -> np.ndarray:
    """All 2^n coalitions of x over the background rows, tiled to n_rows. float32 [n_rows, n]"""
    n = x.shape[0]
    masks = ((np.arange(1 << n)[:, None] >> np.arange(n)) & 1).astype(bool)  # [2^n, n]
    rows = np.where(masks[:, None, :], x, background[None]).reshape(-1, n)
    reps = -(-n_rows // rows.shape[0])
    return np.ascontiguousarray(np.tile(rows, (reps, 1))[:n_rows], dtype=np.float32)


def rate(fn: Callable[[], Any], n_rows: int, seconds: float) -> list[float]:
    """Rows per second of each call, repeated for about `seconds` (at least 3 calls)."""
    fn()
    rates: list[float] = []
    stop = time.perf_counter() + seconds
    while len(rates) < 3 or time.perf_counter() < stop:
        start = time.perf_counter()
        fn()
        rates.append(n_rows / (time.perf_counter() - start))
    return rates


def bench_throughput(client: TestClient, args: argparse.Namespace) -> dict[str, Any]:
    x_train, x_test, y_train, _, names = diabetes()
    pipe = mlp_pipelines(x_train, y_train)["regressor"]
    data = to_onnx(pipe, len(names))
    session = ort_session(data)
    output = session.get_outputs()[0].name
    net = torch_copy(pipe)
    name = "diabetes-onnx-throughput"
    register(client, name, data, names, ["progression"], "regression", format="onnx")
    adapter = client.app.state.service.registry.get(name)  # type: ignore[attr-defined]
    check = masked_rows(x_test[0], x_train[:20], 4096)
    with torch.inference_mode():
        torch_check = net(torch.from_numpy(check)).numpy()
    ort_check = session.run([output], {"input": check})[0]
    out: dict[str, Any] = {
        "torch_vs_ort_max_abs_diff": float(np.max(np.abs(torch_check - ort_check))),
        "adapter_vs_ort_max_abs_diff": float(np.max(np.abs(adapter.predict(check) - ort_check))),
        "batches": {},
    }
    for n_rows in args.batches:
        rows = masked_rows(x_test[0], x_train[:20], n_rows)
        tensor = torch.from_numpy(rows)

        def run_torch(tensor: torch.Tensor = tensor) -> Any:
            with torch.inference_mode():
                return net(tensor)

        def run_ort(rows: np.ndarray = rows) -> Any:
            return session.run([output], {"input": rows})

        def run_adapter(rows: np.ndarray = rows) -> Any:
            return adapter.predict(rows)

        results: dict[str, list[float]] = {
            "onnxruntime": [],
            "torch": [],
            "service adapter (onnx)": [],
        }
        for _ in range(3):  # interleaved rounds
            results["onnxruntime"] += rate(run_ort, n_rows, args.seconds / 3)
            results["torch"] += rate(run_torch, n_rows, args.seconds / 3)
            results["service adapter (onnx)"] += rate(run_adapter, n_rows, args.seconds / 3)
        med = {k: median(v) for k, v in results.items()}
        out["batches"][n_rows] = {
            "median_rows_per_s": med,
            "best_rows_per_s": {k: max(v) for k, v in results.items()},
            "ort_over_torch": med["onnxruntime"] / med["torch"],
            "adapter_over_ort": med["service adapter (onnx)"] / med["onnxruntime"],
            "runs": results,
        }
    malloc = os.environ.get("MALLOC_MMAP_THRESHOLD_", "glibc default")
    print_table(
        f"3. Masked rows/s (millions), MLP {HIDDEN} on 10 features, one thread each; "
        f"MALLOC_MMAP_THRESHOLD_={malloc}; torch vs onnxruntime max abs diff "
        f"{out['torch_vs_ort_max_abs_diff']:.1e}",
        [
            "batch rows",
            "onnxruntime median (best)",
            "torch median (best)",
            "onnxruntime/torch (medians)",
            "service ONNX adapter median",
            "adapter/onnxruntime",
        ],
        [
            [
                f"{n:,}",
                f"{r['median_rows_per_s']['onnxruntime'] / 1e6:.1f} "
                f"({r['best_rows_per_s']['onnxruntime'] / 1e6:.1f})",
                f"{r['median_rows_per_s']['torch'] / 1e6:.1f} "
                f"({r['best_rows_per_s']['torch'] / 1e6:.1f})",
                f"**{r['ort_over_torch']:.2f}**",
                f"{r['median_rows_per_s']['service adapter (onnx)'] / 1e6:.1f}",
                f"{r['adapter_over_ort']:.2f}",
            ]
            for n, r in out["batches"].items()
        ],
    )
    return out


PARTS: dict[str, Callable[[TestClient, argparse.Namespace], dict[str, Any]]] = {
    "trees": bench_trees,
    "mlp": bench_mlp,
    "throughput": bench_throughput,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=sorted(PARTS), help="run one part")
    parser.add_argument("--rows", type=int, default=20, help="explicands per request")
    parser.add_argument("--repeats", type=int, default=5, help="timed repetitions (parts 1-2)")
    parser.add_argument("--batches", type=int, nargs="+", default=[10_000, 50_000, 100_000])
    parser.add_argument("--seconds", type=float, default=3.0, help="per contender and batch")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args()
    report: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_start": os.getloadavg(),
            "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
            "versions": {m.__name__: m.__version__ for m in (np, torch, shap, xgb, lgb, ort)},
        },
        "service": "in-process TestClient (app.main.create_app), Cache-Control: no-cache",
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    with service() as client:
        for part, run in PARTS.items():
            if args.only in (None, part):
                report[part] = run(client, args)
    report["machine"]["load_average_end"] = os.getloadavg()
    print(
        f"\nload average: start {report['machine']['load_average_start']}, "
        f"end {report['machine']['load_average_end']}"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"byom_bench{'_' + args.only if args.only else ''}.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
