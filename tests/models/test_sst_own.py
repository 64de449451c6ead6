"""search "own" of sufficient-subset on digits-sst (proposed wiring)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from models import Model, ModelRegistry
from models.builtin.sst import load_digits_sst, own_subset, subset_input
from models.builtin.trained import dataset_split
from models.catalog import BUILTINS


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """One torch thread, as the service runs."""


@pytest.fixture(scope="module")
def model(model_dir: Path) -> Model:
    return load_digits_sst(model_dir)


@pytest.fixture(scope="module")
def client(model_dir: Path, make_client: Callable[..., TestClient]) -> TestClient:
    names = {"digits-sst", "digits-cnn"}
    return make_client(ModelRegistry(model_dir, builtins=[b for b in BUILTINS if b.name in names]))


def test_own_search_over_http(client: TestClient, model: Model) -> None:
    x = dataset_split("digits-cnn").x_test[:40]
    body = {"inputs": x.tolist(), "parameters": {"search": "own"}}
    r = client.post("/v2/models/digits-sst/explain/sufficient-subset", json=body)
    assert r.status_code == 200, r.text
    own = own_subset(model, x)
    kept = model.predict(subset_input(x, own)).argmax(1) == model.predict(x).argmax(1)
    for i, e in enumerate(r.json()["data"]["explanations"]):
        d = e["details"]
        assert d["subset"] == np.flatnonzero(own[i]).tolist()
        assert d["search"] == "own" and d["minimality"] == "own"
        assert d["verified"] is bool(kept[i])
        assert e["n_model_evals"] == 4
        codes = {w["code"] for w in e["warnings"]}
        assert ("not_verified" in codes) is (not kept[i])
    assert not kept.all()  # some own subsets fail: the answer says so
    for model_name, params, code in (
        ("digits-cnn", {"search": "own"}, 400),
        ("digits-sst", {"search": "own", "patch_size": 4}, 400),
        ("digits-sst", {"search": "own", "masker": {"type": "background"}}, 400),
    ):
        bad = client.post(
            f"/v2/models/{model_name}/explain/sufficient-subset",
            json={"inputs": x[:1].tolist(), "parameters": params},
        )
        assert bad.status_code == code, bad.text
    small = client.post(
        "/v2/models/digits-sst/explain/sufficient-subset",
        json={"inputs": x[:1].tolist(), "parameters": {"search": "own"}, "budget": 3},
    )
    assert small.status_code == 400 and small.json()["code"] == "budget_too_small", small.text
