"""Every registered explainer x every model kind over HTTP, in one app.

The models: the built-ins (LMs included), users' own uploads (sklearn->ONNX classifier and
regressor, torch->ONNX image classifier, traced and scripted TorchScript image classifiers, a
scripted linear regressor and tabular classifier, XGBoost regressor and classifier, LightGBM
multiclass; XGBoost classifier, regressor and categorical classifier and a categorical LightGBM
classifier trained on pandas DataFrames) and remote Open Inference Protocol models served by a
real MLServer (sklearn runtime).
For each pair:

- listed in GET /v2/models/{m} `explainers`: a valid request answers 200 (Salvage, AutoGnothi:
  409 explainer_not_trained, their documented answer before a training job);
- not listed: a documented 4xx with {"error", "code"}: 400 unsupported_modality or
  needs_classifier, 422 not_differentiable, the code `unsupported(spec, model)` gives;
- never a 5xx.
Listed pairs on tabular and image models are asked again with the request's own background rows.

Iterating `EXPLAINERS` and the app's own model listing, a new explainer or model fails here until
it has a valid body in BODIES (tests/cases.py, the table the library contract test uses too; or an
instance in the kinds table) and answers honestly.
`pytest -s` prints the matrix.
"""

from __future__ import annotations

import io
import json
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from explainers.registry import EXPLAINERS, unsupported
from models.registry import ModelRegistry
from tests import byom_models as bm
from tests.cases import BODIES, Kind, body, builtin_kinds
from tests.peers.mlserver import MLServerPeer, mlserver_peer

pytestmark = pytest.mark.slow

# The answers a pair the model does not list may give (API.md): status per code.
REFUSALS = {"unsupported_modality": 400, "needs_classifier": 400, "not_differentiable": 422}


def body_for(
    explainer: str, modalities: tuple[str, ...], modality: str, kind: Kind
) -> dict[str, Any]:
    """The valid body for the model's modality, else the one of the explainer's own modality
    (with the model's instance): a request only the model's capabilities can refuse."""
    return body(explainer, modality if modality in modalities else modalities[0], kind)


def onnx_regressor(name: str) -> bm.UserModel:
    """A StandardScaler + MLPRegressor pipeline converted by skl2onnx.

    Built here: `bm.sklearn_onnx(task="regression")` passes the hidden sizes positionally, which
    scikit-learn 1.9's MLPRegressor takes as `loss` (InvalidParameterError)."""
    from skl2onnx import to_onnx
    from sklearn.neural_network import MLPRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = bm.tabular_data("regression")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings of a small fixed-seed fit
        mlp = MLPRegressor(hidden_layer_sizes=(16,), max_iter=300, random_state=0)
        pipe = make_pipeline(StandardScaler(), mlp).fit(x, y)
    form = {
        "name": name,
        "modality": "tabular",
        "input_shape": json.dumps([bm.N_TAB]),
        "output_names": json.dumps(["progression"]),
        "feature_names": json.dumps([f"f{i}" for i in range(bm.N_TAB)]),
        "task": "regression",
    }
    onx = to_onnx(pipe, x[:1]).SerializeToString()
    return bm.UserModel(name, onx, form, lambda r: pipe.predict(r)[:, None], x[:4], x[100:120])


class _TabularClassifier(torch.nn.Module):
    """Two classes from six features, softmax last (seeded)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(bm.N_TAB, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.linear(x / 100.0), dim=1)


def scripted_classifier(name: str) -> bm.UserModel:
    """A scripted TorchScript tabular classifier without a stored background: differentiable,
    so every tabular explainer (UNI included) must answer from the request alone."""
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(_TabularClassifier().eval()), buf)
    x, _ = bm.tabular_data("classification")
    form = {
        "name": name,
        "modality": "tabular",
        "input_shape": json.dumps([bm.N_TAB]),
        "output_names": json.dumps(["malignant", "benign"]),
        "feature_names": json.dumps([f"f{i}" for i in range(bm.N_TAB)]),
        "task": "classification",
    }
    return bm.UserModel(name, buf.getvalue(), form, lambda r: r, x[:4], x[100:120])


def user_models() -> list[tuple[bm.UserModel, str]]:
    """Users' uploads as they bring them, with the kind printed in the summary."""
    onnx_clf = bm.sklearn_onnx("skl-onnx-clf", "classification")
    onnx_clf.files["background"] = ("bg.csv", bm.csv_background(onnx_clf.background))
    return [
        (onnx_clf, "ONNX sklearn classifier (stored background)"),
        (onnx_regressor("skl-onnx-reg"), "ONNX sklearn regressor"),
        (bm.torch_onnx("cnn-onnx"), "ONNX torch image classifier"),
        (bm.torchscript_cnn("cnn-traced", traced=True), "TorchScript traced image classifier"),
        (bm.torchscript_cnn("cnn-scripted", traced=False), "TorchScript scripted image clf"),
        (bm.scripted_linear("linear-scripted"), "TorchScript scripted regressor"),
        (scripted_classifier("clf-scripted"), "TorchScript scripted tabular classifier"),
        (bm.xgboost_model("xgb-reg", "regression"), "XGBoost regressor"),
        (bm.xgboost_model("xgb-clf", "classification", ubj=True), "XGBoost classifier (UBJSON)"),
        (bm.lightgbm_model("lgbm"), "LightGBM multiclass"),
        # trained on pandas DataFrames: column names (and categorical types) in the file
        (bm.xgboost_frame("xgb-frame-clf", "multiclass"), "XGBoost classifier (DataFrame)"),
        (bm.xgboost_frame("xgb-frame-reg", "regression"), "XGBoost regressor (DataFrame)"),
        (
            bm.xgboost_frame("xgb-frame-cat", "binary", categorical=True),
            "XGBoost classifier (DataFrame, categorical)",
        ),
        (bm.lightgbm_frame("lgbm-frame-cat", "multiclass"), "LightGBM (DataFrame, categorical)"),
    ]


@dataclass
class Matrix:
    client: TestClient
    registry: ModelRegistry
    kinds: dict[str, Kind]


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MLServerPeer]:
    """Started before the app (see tests/peers/mlserver.py)."""
    with mlserver_peer(tmp_path_factory.mktemp("mlserver")) as running:
        yield running


@pytest.fixture(scope="module")
def matrix(
    peer: MLServerPeer,
    model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    one_torch_thread: None,
    make_client: Callable[..., TestClient],
) -> Matrix:
    registry = ModelRegistry(model_dir)
    kinds = builtin_kinds()
    for name in kinds:
        # Loaded now, LMs too: ~10 s with warm caches; a fresh machine first converts the GGUF
        # files of smollm2-135m and gemma3-270m (~70 s on two cores, once).
        registry.get(name)
    # a fresh Salvage store (nothing trained) under model_dir; built-ins come from the registry
    client = make_client(
        registry,
        model_dir=tmp_path_factory.mktemp("matrix") / "models",
        remote_model_hosts="127.0.0.1",  # MLServer listens on loopback
    )
    for model, label in user_models():
        r = client.post("/v2/repository/models", data=model.form, files=model.upload())
        assert r.status_code == 201, r.text
        bg = model.background[:3].tolist()
        kinds[model.name] = Kind(label, model.rows[0].tolist(), background=bg)
    for m in peer.models.values():
        form = {
            "name": m.name,
            "modality": "tabular",
            "input_shape": json.dumps([len(m.feature_names)]),
            "output_names": json.dumps(m.output_names),
            "feature_names": json.dumps(m.feature_names),
            "task": m.task,
            "remote_url": peer.model_url(m.name),
            "remote_output": m.remote_output,
        }
        r = client.post("/v2/repository/models", data=form)
        assert r.status_code == 201, r.text
        label = f"remote OIP (MLServer sklearn) {m.task}"
        kinds[m.name] = Kind(label, m.x[0].tolist(), background=m.x[1:4].tolist())
    return Matrix(client, registry, kinds)


def test_every_explainer_has_a_valid_body_per_modality() -> None:
    missing = [
        (s.name, modality)
        for s in EXPLAINERS
        for modality in s.modalities
        if (s.name, modality) not in BODIES
    ]
    assert not missing, f"add a valid request body to BODIES for {missing}"


def post(client: TestClient, model: str, explainer: str, body: Any) -> tuple[int, Any, str]:
    """(status, code or None for a 200, what to print on failure); uncached."""
    url = f"/v2/models/{model}/explain/{explainer}"
    t0 = time.perf_counter()
    r = client.post(url, json=body, headers={"Cache-Control": "no-cache"})
    seconds = time.perf_counter() - t0
    got = r.json()
    code = None
    if r.status_code == 200:  # one instance, one explanation of finite values
        (explanation,) = got["data"]["explanations"]
        assert np.all(np.isfinite(explanation["values"])), (url, explanation)
    else:
        assert set(got) >= {"error", "code"}, (url, r.text)
        code = got["code"]
    report = f"POST {url} {json.dumps(body)[:300]}\n  -> {r.status_code} {r.text[:500]}"
    assert seconds < 30, f"{report}\n  took {seconds:.1f} s"  # budgets here are tiny
    return r.status_code, code, report


def test_matrix_listed_pairs_answer_unlisted_pairs_refuse(matrix: Matrix) -> None:
    client = matrix.client
    names = [m["name"] for m in client.get("/v2/models").json()]
    unknown = sorted(set(names) - set(matrix.kinds))
    assert not unknown, f"give these models an instance in the matrix: {unknown}"
    cells: dict[tuple[str, str], str] = {}
    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    start = time.perf_counter()
    for name in names:
        meta = client.get(f"/v2/models/{name}").json()
        model, kind = matrix.registry.get(name), matrix.kinds[name]
        listed = meta["explainers"]
        # The listing is the refusal rule, and capabilities say what the platform can do.
        assert listed == [s.name for s in EXPLAINERS if unsupported(s, model) is None], name
        caps = meta["capabilities"]
        if caps["differentiable"]:
            assert meta["platform"] in ("pytorch", "torchscript"), meta
        assert (caps["tree"] is not None) == (meta["platform"] in ("xgboost", "lightgbm")), meta
        for spec in EXPLAINERS:
            body = body_for(spec.name, spec.modalities, meta["modality"], kind)
            status, code, report = post(client, name, spec.name, body)
            if spec.name in listed:
                expected, want = (
                    (409, "explainer_not_trained") if spec.train_job else (200, None)
                )
            else:
                refusal = unsupported(spec, model)
                assert refusal is not None
                want = refusal.code
                expected = REFUSALS[want]
            cells[name, spec.name] = f"{status} {code}" if code else str(status)
            outcomes[
                "5xx" if status >= 500 else str(status) if status in (200, 409) else "4xx"
            ] += 1
            if (status, code) != (expected, want):
                failures.append(f"{report}\n  expected {expected} {want}")
            # The request's own background rows are valid for every listed array explainer.
            if spec.name in listed and kind.background is not None and "inputs" in body:
                status, code, report = post(
                    client, name, spec.name, {**body, "background": kind.background}
                )
                outcomes[f"background {status}"] += 1
                if (status, code) != (expected, want):
                    failures.append(f"{report}\n  expected {expected} {want}")
    print_matrix(names, matrix.kinds, cells, outcomes, time.perf_counter() - start)
    assert not failures, "\n".join(failures)
    total = len(names) * len(EXPLAINERS)
    assert outcomes["200"] + outcomes["409"] + outcomes["4xx"] == total and outcomes["5xx"] == 0
    assert outcomes["200"] >= len(names)  # every model has at least one explainer that answers


def print_matrix(
    names: list[str],
    kinds: dict[str, Kind],
    cells: dict[tuple[str, str], str],
    outcomes: Counter[str],
    seconds: float,
) -> None:
    """The matrix as a table (`pytest -s` shows it)."""
    explainers = [s.name for s in EXPLAINERS]
    short = {"unsupported_modality": "modality", "needs_classifier": "classifier",
             "not_differentiable": "not diff.", "explainer_not_trained": "untrained"}  # fmt: skip
    first = max(len(f"{n} [{kinds[n].label}]") for n in names)
    width = max(max(len(e) for e in explainers), 14)
    lines = [" " * first + " | " + " | ".join(e.ljust(width) for e in explainers)]
    lines.append("-" * len(lines[0]))
    for n in names:
        row = []
        for e in explainers:
            status, _, code = cells[n, e].partition(" ")
            row.append((status + (f" {short.get(code, code)}" if code else "")).ljust(width))
        lines.append(f"{n} [{kinds[n].label}]".ljust(first) + " | " + " | ".join(row))
    total = len(names) * len(explainers)
    lines.append(
        f"{len(names)} models x {len(explainers)} explainers = {total} pairs: "
        f"{outcomes['200']} x 200, {outcomes['409']} x 409 (salvage, autognothi untrained), "
        f"{outcomes['4xx']} x documented 4xx, {outcomes['5xx']} x 5xx; again with the request's "
        f"background rows: {outcomes['background 200']} x 200, {outcomes['background 409']} x "
        f"409; {seconds:.1f} s"
    )
    print("\n" + "\n".join(lines))
