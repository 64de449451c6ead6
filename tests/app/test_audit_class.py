"""A classifier's audit explains one class for every row: by default the output a synchronous
explain of the same row explains (API.md's one rule: a binary classifier's positive class), the
one `target` names otherwise, never each row's own predicted class; an audit of several classes
gets a beeswarm and a dependence plot per class (shap's plots take one output)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from models.registry import ModelRegistry
from tests.app.test_job_plots import wait
from tests.app.test_plots import vega_lite_validator

MODEL = "breast-cancer-mlp"
BUDGET = 8000


def results(client: TestClient, job_id: str) -> list[dict[str, Any]]:
    lines = client.get(f"/v2/jobs/{job_id}/results").text.splitlines()
    return sorted((json.loads(line) for line in lines), key=lambda r: r["index"])


@pytest.fixture(scope="module")
def rows(client: TestClient, registry: ModelRegistry) -> list[Any]:
    """Examples the model predicts as both classes: a per-row predicted class would differ."""
    instances = client.get(f"/v2/models/{MODEL}/examples?n=40").json()["instances"]
    model = registry.get(MODEL)
    assert model.module is not None
    with torch.no_grad():
        x = torch.as_tensor(np.asarray(instances, dtype=np.float32))
        predicted = model.module(x).argmax(dim=1).numpy()
    pick = [*np.flatnonzero(predicted == 0)[:3], *np.flatnonzero(predicted == 1)[:3]]
    assert len(pick) == 6, "the examples hold both classes"
    return [instances[i] for i in pick]


def audit(client: TestClient, rows: list[Any], **fields: Any) -> str:
    body = {"model": MODEL, "inputs": rows, "budget": BUDGET, **fields}
    job = client.post("/v2/jobs", json=body)
    assert job.status_code == 202, job.text
    assert wait(client, job.json()["id"])["status"] == "succeeded"
    return str(job.json()["id"])


def test_default_audit_explains_what_a_synchronous_explain_explains(
    client: TestClient, rows: list[Any]
) -> None:
    """The rows are predicted as both classes; audit and synchronous explain both explain the
    positive class (benign, output 1) of every row, with the same values."""
    job = audit(client, rows)
    stored = results(client, job)
    assert [r["explanation"]["output_index"] for r in stored] == [1] * 6
    assert {r["explanation"]["output_name"] for r in stored} == {"benign"}
    sync = client.post(
        f"/v2/models/{MODEL}/explain/shapley", json={"inputs": rows, "budget": BUDGET}
    ).json()["data"]["explanations"]
    assert [e["output_index"] for e in sync] == [1] * 6
    for row, alone in zip(stored, sync, strict=True):
        np.testing.assert_allclose(row["explanation"]["values"], alone["values"], rtol=1e-9)
    status = client.get(f"/v2/jobs/{job}").json()
    assert status["status"] == "succeeded"
    summary = status["summary"]
    assert summary["target"].startswith("default, as a synchronous explain of each row")
    assert list(summary["per_class"]) == ["benign"]
    assert summary["per_class"]["benign"]["instances"] == 6
    spec = client.get(f"/v2/jobs/{job}/plot?kind=beeswarm&format=vega").json()
    vega_lite_validator().validate(spec)
    assert "vconcat" not in spec and len(spec["data"]["values"]) == 6 * 21  # 20 + the rest


def test_target_picks_another_class(client: TestClient, rows: list[Any]) -> None:
    stored = results(client, audit(client, rows, target="malignant"))
    assert [r["explanation"]["output_index"] for r in stored] == [0] * 6
    default = results(client, audit(client, rows))
    # two classes of a softmax: the attributions of one are minus the other's
    np.testing.assert_allclose(
        [r["explanation"]["values"] for r in stored],
        [-np.asarray(r["explanation"]["values"]) for r in default],
        atol=1e-6,
    )


def test_several_classes_get_a_plot_per_class(client: TestClient, rows: list[Any]) -> None:
    job = audit(client, rows, target="all")
    stored = results(client, job)
    values = {
        name: np.array([e["values"] for r in stored for e in r["explanations"]
                        if e["output_name"] == name])
        for name in ("malignant", "benign")
    }  # fmt: skip
    bees = client.get(f"/v2/jobs/{job}/plot?kind=beeswarm&format=vega&max_features=5").json()
    vega_lite_validator().validate(bees)
    assert [p["title"].rsplit(" · ", 2)[-2] for p in bees["vconcat"]] == [
        "class malignant",
        "class benign",
    ]
    for panel, name in zip(bees["vconcat"], ("malignant", "benign"), strict=True):
        dots = panel["data"]["values"]
        assert len(dots) == 6 * 6  # 5 features and the rest, one dot per row of this class
        top = np.argsort(-np.abs(values[name]).mean(axis=0))[0]
        first = [d["value"] for d in dots if d["rank"] == 0]
        assert sorted(first) == pytest.approx(sorted(values[name][:, top]))
    dep = client.get(f"/v2/jobs/{job}/plot?kind=dependence&feature=mean radius&format=vega")
    panels = dep.json()["vconcat"]
    assert [len(p["data"]["values"]) for p in panels] == [6, 6]
    assert [p["value"] for p in panels[1]["data"]["values"]] == pytest.approx(
        values["benign"][:, 0].tolist()
    )
    summary = client.get(f"/v2/jobs/{job}/plot?kind=summary&format=vega").json()
    assert "vconcat" not in summary  # the summary stacks the classes on one axis, as shap
    assert {row["class"] for row in summary["data"]["values"]} == {"malignant", "benign"}
    for kind in ("beeswarm", "dependence"):
        png = client.get(f"/v2/jobs/{job}/plot?kind={kind}&format=png")
        assert png.status_code == 200 and png.content.startswith(b"\x89PNG")
