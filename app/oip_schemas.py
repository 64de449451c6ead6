"""Open Inference Protocol bodies (the KServe v2 REST protocol): model metadata with this
service's extensions (modality, task, explainers, capabilities, background), the model list,
and inference requests and responses (app/oip.py, app/oip_codec.py). The explain contract's
bodies are app/schemas.py's."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.schemas import Utf8


class TensorMeta(BaseModel):
    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMeta]
    outputs: list[TensorMeta]
    modality: str
    task: str
    feature_names: list[str]
    output_names: list[str]
    explainers: list[str] = Field(
        ..., description="exactly the explainers that answer a valid request for this model"
    )
    capabilities: dict[str, Any] = Field(
        default_factory=dict,
        description="differentiable (input gradients), classifier, tree (the booster library "
        "whose TreeSHAP answers estimator tree), input_range, device (where it computes: cpu, "
        "cuda:k, remote)",
    )
    background: dict[str, Any] | None
    info: dict[str, Any] = Field(default_factory=dict)


class ModelSummary(BaseModel):
    name: str
    version: str | None
    modality: str
    state: Literal["ready", "loading", "unloaded", "failed"] = Field(
        ..., description="unloaded: loads on first use (LOAD_MODELS_ON_START=false)"
    )
    error: str | None = None


# The protocol's $parameters: a dict of scalars (no nesting, no null).
Parameters = dict[str, str | bool | int | float]


class InferInput(BaseModel):
    """One input tensor: `data` in JSON (flat or nested, row-major), or `binary_data_size`
    bytes after the JSON header (binary tensor data extension)."""

    model_config = ConfigDict(strict=True)  # JSON true is not 1, "1" is not 1
    name: str = "input"
    shape: list[int]
    datatype: str = "FP32"
    data: list[Any] | None = None
    parameters: Parameters | None = None


class InferRequestedOutput(BaseModel):
    """An output the caller wants; `parameters.binary_data: true` returns it as binary."""

    model_config = ConfigDict(strict=True)
    name: str
    parameters: Parameters | None = None


class InferRequest(BaseModel):
    """Open Inference Protocol inference request."""

    model_config = ConfigDict(strict=True)  # JSON true is not 1, "1" is not 1
    id: Utf8 | None = None
    inputs: list[InferInput] = Field(..., min_length=1, max_length=1)
    parameters: Parameters | None = Field(
        None,
        description="binary_data_output: true returns every output as binary; rankers read "
        "their query from `query`",
    )
    outputs: list[InferRequestedOutput] | None = Field(
        None, description="outputs to return (default: all); every model has one, `output`"
    )


class InferOutput(BaseModel):
    """One output tensor: `data` in JSON, or `parameters.binary_data_size` bytes after the
    JSON header (the response's Inference-Header-Content-Length says where it ends)."""

    name: str
    shape: list[int]
    datatype: str
    parameters: Parameters | None = None
    data: list[float] | None = None


class InferResponse(BaseModel):
    model_name: str
    model_version: str
    id: str
    outputs: list[InferOutput]
