"""A real MLServer (mlserver + mlserver-sklearn) serving small scikit-learn models, for tests.

MLServer lives in its own virtualenv (.peers/mlserver, made by scripts/setup_mlserver.sh: it pins
fastapi/pydantic ranges of its own) and runs as a separate process on loopback ports. The models
are trained here with a fixed seed and saved with joblib; MLServer loads them in its own process
(the service itself never unpickles anything: it only speaks the Open Inference Protocol).

Use `mlserver_peer(folder)` as a context manager, or the `mlserver` fixture (module scope):

    from tests.peers.mlserver import mlserver  # noqa: F401  (a fixture)

Start it before the app under test (make the app's fixture depend on it): it trains with
scikit-learn, and a first import of sklearn racing one in the app's start-up threads can fail
with a circular-import error.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
PEERS_VENV = ROOT / ".peers" / "mlserver"
SEED = 0
N_FEATURES = 6  # 2^6 coalitions: exact Shapley values are cheap through a remote model


@dataclass(frozen=True)
class PeerModel:
    """A model MLServer serves, with the fitted estimator to compare against."""

    name: str
    task: str  # classification or regression
    estimator: object  # the fitted sklearn estimator (a Pipeline)
    feature_names: list[str]
    output_names: list[str]
    remote_output: str  # what to request: predict_proba (classifiers) or predict
    x: np.ndarray  # float32 [rows, N_FEATURES]: the data it was trained on

    def local(self, rows: np.ndarray) -> np.ndarray:
        """The estimator's own answer on float32 rows (as MLServer decodes them): [m, k]."""
        fn = getattr(self.estimator, self.remote_output)
        out = np.asarray(fn(np.asarray(rows, dtype=np.float32)), dtype=np.float64)
        return out.reshape(len(rows), -1)


@dataclass(frozen=True)
class MLServerPeer:
    """A running MLServer: its base URL and the models it serves."""

    url: str
    models: dict[str, PeerModel]

    def model_url(self, name: str) -> str:
        return f"{self.url}/v2/models/{name}"


def registration(peer: MLServerPeer, m: PeerModel, **extra: str) -> dict[str, str]:
    """The form a user sends to register an MLServer model (README: bring your own model)."""
    return {
        "name": m.name,
        "modality": "tabular",
        "input_shape": json.dumps([len(m.feature_names)]),
        "output_names": json.dumps(m.output_names),
        "feature_names": json.dumps(m.feature_names),
        "task": m.task,
        "remote_url": peer.model_url(m.name),
        "remote_output": m.remote_output,
        **extra,
    }


def train_models() -> list[PeerModel]:
    """A breast-cancer MLP classifier and a diabetes gradient-boosting regressor (6 features)."""
    from sklearn.datasets import load_breast_cancer, load_diabetes
    from sklearn.ensemble import GradientBoostingRegressor
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    cancer = load_breast_cancer()
    xc = cancer.data[:, :N_FEATURES].astype(np.float32)
    clf = make_pipeline(
        StandardScaler(),
        MLPClassifier(hidden_layer_sizes=(16,), max_iter=2000, random_state=SEED),
    ).fit(xc, cancer.target)
    diabetes = load_diabetes()
    xd = diabetes.data[:, :N_FEATURES].astype(np.float32)
    reg = make_pipeline(
        StandardScaler(),
        GradientBoostingRegressor(n_estimators=50, max_depth=3, random_state=SEED),
    ).fit(xd, diabetes.target)
    return [
        PeerModel(
            "mls-cancer",
            "classification",
            clf,
            [str(n).replace(" ", "_") for n in cancer.feature_names[:N_FEATURES]],
            [str(n) for n in cancer.target_names],
            "predict_proba",
            xc,
        ),
        PeerModel(
            "mls-diabetes",
            "regression",
            reg,
            [str(n) for n in diabetes.feature_names[:N_FEATURES]],
            ["progression"],
            "predict",
            xd,
        ),
    ]


def write_repository(folder: Path, models: list[PeerModel], ports: dict[str, int]) -> None:
    """MLServer's layout: settings.json at the root, <model>/model-settings.json + model.joblib."""
    import joblib

    settings = {
        "host": "127.0.0.1",
        "http_port": ports["http"],
        "grpc_port": ports["grpc"],
        "metrics_port": ports["metrics"],
        "parallel_workers": 0,  # infer in the server process: no worker pool on a small machine
        "debug": False,
    }
    (folder / "settings.json").write_text(json.dumps(settings))
    for m in models:
        sub = folder / m.name
        sub.mkdir()
        joblib.dump(m.estimator, sub / "model.joblib")
        model_settings = {
            "name": m.name,
            "implementation": "mlserver_sklearn.SKLearnModel",
            "parameters": {"uri": "./model.joblib", "version": "v1"},
        }
        (sub / "model-settings.json").write_text(json.dumps(model_settings))


def require_peers() -> Path:
    """The mlserver executable; skip without it (fail under CI=true: set-up must make it)."""
    binary = PEERS_VENV / "bin" / "mlserver"
    if not binary.exists():
        message = f"{binary} is missing: run scripts/setup_mlserver.sh"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return binary


def _wait_ready(proc: subprocess.Popen[bytes], url: str, names: list[str], log: Path) -> None:
    deadline = time.monotonic() + 120
    pending = [f"{url}/v2/health/ready", *(f"{url}/v2/models/{n}/ready" for n in names)]
    while pending:
        if proc.poll() is not None:
            pytest.fail(f"mlserver exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"mlserver not ready after 120 s:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(pending[0], timeout=2.0).status_code == 200:
                pending.pop(0)
                continue
        except httpx.HTTPError:
            pass
        time.sleep(0.25)


@contextmanager
def mlserver_peer(
    folder: Path, models: list[PeerModel] | None = None
) -> Iterator[MLServerPeer]:
    """Train the models (default: `train_models()`) into `folder`, start MLServer on free
    loopback ports, stop it after."""
    binary = require_peers()
    models = train_models() if models is None else models
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    write_repository(folder, models, ports)
    # MLSERVER_* variables of the caller would override settings.json; start from a clean slate.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLSERVER")}
    env["PYTHONUNBUFFERED"] = "1"
    log = folder / "mlserver.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(binary), "start", str(folder)],
            cwd=folder,  # MLServer keeps .metrics/ and .envs/ under its working directory
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{ports['http']}"
    try:
        _wait_ready(proc, url, [m.name for m in models], log)
        yield MLServerPeer(url, {m.name: m for m in models})
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture(scope="module")
def mlserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MLServerPeer]:
    """A running MLServer with `mls-cancer` (predict_proba) and `mls-diabetes` (predict)."""
    with mlserver_peer(tmp_path_factory.mktemp("mlserver")) as peer:
        yield peer
