"""Remote OIP models served by a real MLServer (sklearn runtime), registered through our API."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from fastapi.testclient import TestClient

from models.adapters.remote import RemoteClient, RemoteModelError
from tests.peers.mlserver import MLServerPeer, PeerModel, mlserver_peer, registration

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MLServerPeer]:
    with mlserver_peer(tmp_path_factory.mktemp("mlserver")) as running:
        yield running


@pytest.fixture(scope="module")
def client(peer: MLServerPeer, make_client: Callable[..., TestClient]) -> TestClient:
    c = make_client(remote_model_hosts="127.0.0.1")  # MLServer listens on loopback
    for m in peer.models.values():
        r = c.post("/v2/repository/models", data=registration(peer, m))
        assert r.status_code == 201, r.text
    return c


def exact_shapley(f: PeerModel, x: np.ndarray, background: np.ndarray, k: int) -> np.ndarray:
    """Interventional Shapley values of output k by enumerating all 2^n coalitions."""
    n = x.shape[0]
    value = {}
    for mask in itertools.product([False, True], repeat=n):
        rows = np.where(np.array(mask), x, background)  # present: x; absent: background rows
        value[mask] = float(f.local(rows)[:, k].mean())
    phi = np.zeros(n)
    for mask, v in value.items():
        s = sum(mask)
        for i in range(n):
            if mask[i]:
                without = tuple(False if j == i else b for j, b in enumerate(mask))
                weight = math.factorial(s - 1) * math.factorial(n - s) / math.factorial(n)
                phi[i] += weight * (v - value[without])
    return phi


@pytest.mark.parametrize("name", ["mls-cancer", "mls-diabetes"])
def test_infer_through_us_equals_sklearn(client: TestClient, peer: MLServerPeer, name: str) -> None:
    m = peer.models[name]
    meta = client.get(f"/v2/models/{name}").json()
    assert meta["platform"] == "remote"
    rows = m.x[::40]
    body = {
        "inputs": [
            {
                "name": "input",
                "shape": list(rows.shape),
                "datatype": "FP32",
                "data": rows.reshape(-1).tolist(),
            }
        ]
    }
    r = client.post(f"/v2/models/{name}/infer", json=body)
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    got = np.asarray(out["data"], dtype=np.float64).reshape(len(rows), -1)
    np.testing.assert_allclose(got, m.local(rows), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(("name", "target"), [("mls-cancer", 1), ("mls-diabetes", 0)])
def test_exact_shapley_equals_enumeration(
    client: TestClient, peer: MLServerPeer, name: str, target: int
) -> None:
    m = peer.models[name]
    rng = np.random.default_rng(0)
    background = m.x[rng.choice(len(m.x), 16, replace=False)]
    instances = m.x[[3, 100]]
    body = {
        "inputs": instances.tolist(),
        "background": background.tolist(),
        "target": target,
        "parameters": {"estimator": "exact", "masker": {"type": "background"}},
    }
    r = client.post(f"/v2/models/{name}/explain/shapley", json=body)
    assert r.status_code == 200, r.text
    explanations = r.json()["data"]["explanations"]
    for x, e in zip(instances, explanations, strict=True):
        assert e["exact"] is True
        expected = exact_shapley(m, x, background, target)
        np.testing.assert_allclose(e["values"], expected, atol=1e-5)
        np.testing.assert_allclose(
            e["base_value"], m.local(background)[:, target].mean(), atol=1e-5
        )


def test_exact_shapley_equals_shap_exact_explainer(client: TestClient, peer: MLServerPeer) -> None:
    shap = pytest.importorskip("shap")
    m = peer.models["mls-cancer"]
    rng = np.random.default_rng(1)
    background = m.x[rng.choice(len(m.x), 12, replace=False)]
    instances = m.x[[7, 250]]
    masker = shap.maskers.Independent(background, max_samples=len(background))
    ours = client.post(
        "/v2/models/mls-cancer/explain/shapley",
        json={
            "inputs": instances.tolist(),
            "background": background.tolist(),
            "target": 1,
            "parameters": {"estimator": "exact", "masker": {"type": "background"}},
        },
    )
    assert ours.status_code == 200, ours.text
    theirs = shap.explainers.Exact(lambda rows: m.local(rows)[:, 1], masker)(instances)
    values = [e["values"] for e in ours.json()["data"]["explanations"]]
    np.testing.assert_allclose(values, theirs.values, atol=1e-5)


def test_gradient_explainers_refuse_remote_models(client: TestClient, peer: MLServerPeer) -> None:
    m = peer.models["mls-cancer"]
    r = client.post(
        "/v2/models/mls-cancer/explain/integrated-gradients", json={"inputs": [m.x[0].tolist()]}
    )
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "not_differentiable"


def test_bad_mlserver_registrations_say_why(client: TestClient, peer: MLServerPeer) -> None:
    cancer, diabetes = peer.models["mls-cancer"], peer.models["mls-diabetes"]
    # Without remote_output MLServer answers predict (one label column): not 2 outputs.
    no_proba = registration(peer, cancer, name="mls-cancer-labels")
    del no_proba["remote_output"]
    r = client.post("/v2/repository/models", data=no_proba)
    assert r.status_code == 400 and r.json()["code"] == "invalid_model", r.text
    # A regressor has no predict_proba: MLServer's own message comes back.
    wrong = registration(peer, diabetes, name="mls-diabetes-proba", remote_output="predict_proba")
    r = client.post("/v2/repository/models", data=wrong)
    assert r.status_code == 400 and r.json()["code"] == "invalid_model", r.text
    assert "predict_proba" in r.json()["error"]
    unknown = registration(peer, diabetes, name="mls-nope", remote_url=peer.model_url("nope"))
    r = client.post("/v2/repository/models", data=unknown)
    assert r.status_code == 400 and "404" in r.json()["error"], r.text


def test_many_rows_in_chunks_from_many_threads(peer: MLServerPeer) -> None:
    m = peer.models["mls-cancer"]
    client = RemoteClient(peer.model_url(m.name), 30.0, "predict_proba", chunk_rows=4096)
    rows = np.repeat(m.x, 18, axis=0)  # 10242 rows: three requests
    expected = m.local(rows)
    try:
        with ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(lambda _: client(rows), range(4)))
    finally:
        client.close()
    for out in outs:
        assert out.shape == (len(rows), 2) and out.dtype == np.float32
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-7)
    # INT64 labels (predict without a requested output) come back as float32 too.
    labels = RemoteClient(peer.model_url(m.name), 30.0)(rows[:5])
    np.testing.assert_array_equal(labels[:, 0], m.estimator.predict(rows[:5]))  # type: ignore[attr-defined]
    with pytest.raises(RemoteModelError, match="answered HTTP 400") as caught:
        RemoteClient(peer.model_url(m.name), 30.0, "bogus")(np.zeros((2, 6), np.float32))
    assert "only supports" in (caught.value.remote_detail or "")  # MLServer's own message
    assert "only supports" not in str(caught.value)  # ... kept out of the message
