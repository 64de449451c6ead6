"""An explainer's own top-level request fields: schema, validation and audit instances."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.schemas import request_model, spec_fields
from explainers.registry import ExplainerSpec


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    k: int = 3


class _Fields(BaseModel):
    query: str = Field(..., min_length=1)
    documents: list[str] = Field(..., min_length=1, max_length=4)


def _spec(uses_inputs: bool) -> ExplainerSpec:
    return ExplainerSpec(
        "toy-rank", "1", ("ranker",), _Options, lambda *a, **k: None, "toy", "none",
        fields=_Fields, uses_inputs=uses_inputs,
    )  # fmt: skip


def test_fields_become_top_level_and_inputs_optional() -> None:
    body = request_model(_spec(uses_inputs=False))(query="q", documents=["a", "b"])
    assert body.query == "q" and body.documents == ["a", "b"]  # type: ignore[attr-defined]
    assert body.inputs is None
    assert spec_fields(_spec(False)) == ("query", "documents")
    schema = request_model(_spec(False)).model_json_schema()
    assert {"query", "documents"} <= set(schema["required"])
    assert "inputs" not in schema["required"]


def test_fields_are_validated_and_unknown_keys_refused() -> None:
    model = request_model(_spec(uses_inputs=False))
    with pytest.raises(ValidationError):
        model(query="q", documents=[])
    with pytest.raises(ValidationError):
        model(query="q", documents=["a"], extra=1)
    with pytest.raises(ValidationError):
        model(documents=["a"])


def test_inputs_still_required_when_used() -> None:
    model = request_model(_spec(uses_inputs=True))
    with pytest.raises(ValidationError):
        model(query="q", documents=["a"])
    assert model(inputs=[[1.0]], query="q", documents=["a"]).inputs == [[1.0]]
