"""Typed audit results (app/jobs/results.py): rows stored in the current format parse and write
back the same JSON, key order included; the server's flattening gives the client's rows
(xai/results.py flat_results, installed without the server); a live audit's stored lines
round-trip; the table reads the typed rows."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app import job_tables
from app.jobs.results import AuditResult, flat
from models.registry import ModelRegistry
from tests.app.test_job_plots import wait


def _explanation(index: int, name: str, values: list[float], **extra: Any) -> dict[str, Any]:
    """An explanation as an audit stores it (ExplanationOut, the fields that were set)."""
    return {
        "output_index": index,
        "output_name": name,
        "data": {"a": 1.5, "b": -2.0},
        "values": values,
        "base_value": 0.25,
        "instance_output_value": 0.25 + sum(values),
        "approximation_error": 0.0,
        "error_std": None,
        "interactions": None,
        "players": None,
        "details": {"auto": {"chosen": "exact", "measured": False}},
        "warnings": [],
        "exact": True,
        "estimator": "exact",
        "n_model_evals": 4,
        **extra,
    }


NOISY = {"code": "noisy_estimate", "message": "the largest standard error ..."}
# the current format: one explanation; one per target ("explanations"); text; an error
STORED: list[dict[str, Any]] = [
    {
        "explanation": _explanation(1, "malignant", [0.5, -0.125], warnings=[NOISY]),
        "feature_names": ["a", "b"],
        "cache": "hit",
    },
    {
        "explanations": [
            _explanation(1, "malignant", [0.5, -0.125]),
            _explanation(0, "benign", [-0.5, 0.125]),
        ],
        "feature_names": ["a", "b"],
        "cache": "miss",
        "background_audit": {"ks_pvalue": 0.5, "shifted": False},
    },
    {
        "explanation": _explanation(
            0,
            "negative",
            [-0.25, 0.125],
            data="good film",
            players=[
                {"text": "good", "start": 0, "end": 4},
                {"text": "film", "start": 5, "end": 9},
            ],
        ),
        "feature_names": [],
        "cache": "bypass",
    },
    {"error": "budget 300 pays for 3 coalitions", "code": "budget_too_small"},
]


@pytest.mark.parametrize("stored", STORED)
def test_a_stored_result_parses_and_writes_back_the_same_json(stored: dict[str, Any]) -> None:
    before = copy.deepcopy(stored)
    result = AuditResult.parse(stored)
    assert json.dumps(result.stored()) == json.dumps(stored)  # same keys in the same order
    assert stored == before  # parsing leaves the stored object alone
    line = AuditResult.parse({"index": 7, **stored})
    assert line.index == 7 and line.stored() == stored


def test_fields_are_read_once_into_attributes() -> None:
    one, several, text, error = (AuditResult.parse(s) for s in STORED)
    e = one.explanations[0]
    assert (e.output_index, e.output_name, e.values, e.warnings) == (
        1,
        "malignant",
        (0.5, -0.125),
        ("noisy_estimate",),
    )
    assert e.feature_row(("b", "a")) == [-2.0, 1.5]  # a {feature: value} row, players' order
    assert one.cache == "hit" and one.error is None and not one.several
    assert several.several and [x.output_name for x in several.explanations] == [
        "malignant",
        "benign",
    ]
    assert text.feature_names == () and text.explanations[0].players == ("good", "film")
    assert (error.error, error.code, error.explanations) == (
        "budget 300 pays for 3 coalitions",
        "budget_too_small",
        (),
    )


def test_rows_are_the_clients_flat_results() -> None:
    """One rule for server and client: a row per explanation, the instance's fields kept."""
    from xai.results import flat_results

    lines = [{"index": i, **s} for i, s in enumerate(STORED)]
    client = flat_results(lines)
    server = flat([AuditResult.parse(line) for line in lines])
    assert len(server) == len(client) == 5
    for row, theirs in zip(server, client, strict=True):
        assert row.index == theirs["index"]
        assert (row.explanation.raw if row.explanation else None) == theirs.get("explanation")
        assert row.feature_names == (
            None if "feature_names" not in theirs else tuple(theirs["feature_names"])
        )
        assert (row.error, row.code) == (theirs.get("error"), theirs.get("code"))


def test_the_table_reads_typed_rows() -> None:
    results = [AuditResult.parse({"index": i, **s}) for i, s in enumerate(STORED[:2] + STORED[3:])]
    columns, table = job_tables.rows(results)
    assert columns[9:] == ["value.a", "value.b", "input.a", "input.b"]
    assert [r["output_name"] for r in table] == ["malignant", "malignant", "benign", None]
    assert table[0]["warnings"] == "noisy_estimate" and table[1]["warnings"] == ""
    assert (table[2]["value.b"], table[2]["input.a"], table[2]["input.b"]) == (0.125, 1.5, -2.0)
    assert table[3]["error"] == "budget_too_small: budget 300 pays for 3 coalitions"
    # a record without an explanation (a training job's) reads as an error-like row
    assert job_tables.rows([AuditResult.parse({"index": 0, "epoch": 1})])[1][0]["error"] == (
        "error: "
    )


def test_a_live_audit_round_trips(
    registry: ModelRegistry, make_client: Callable[..., TestClient]
) -> None:
    """Every line a real audit stores (one target, then a target list) parses and writes
    back the same JSON."""
    client = make_client(registry)
    rows = client.get("/v2/models/breast-cancer-mlp/examples?n=2").json()["instances"]
    for target in (None, [1, 0]):
        body = {"model": "breast-cancer-mlp", "inputs": rows, "target": target}
        body |= {"budget": 8000, "parameters": {"estimator": "kernel"}}
        job = client.post("/v2/jobs", json=body).json()["id"]
        assert wait(client, job)["status"] == "succeeded"
        lines = [json.loads(x) for x in client.get(f"/v2/jobs/{job}/results").text.splitlines()]
        assert len(lines) == 2
        for line in lines:
            result = AuditResult.parse(line)
            assert result.error is None and result.several == (target is not None)
            assert json.dumps({"index": line["index"], **result.stored()}) == json.dumps(line)
