"""Registration errors a user can act on: one line, not an interpreter traceback."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from models.adapters.user import register
from models.base import ModelError
from models.declaration import Declaration, InvalidModelError


class _TokenIds(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(100, 4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.head(self.embed(ids).mean(1)), -1)


def test_token_id_torchscript_is_refused_in_one_line() -> None:
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(_TokenIds()), buf)
    decl = Declaration(
        "tok", "tabular", "classification", (8,), ("a", "b"), tuple(f"x{i}" for i in range(8))
    )
    with pytest.raises(InvalidModelError) as err:
        register(decl, {"model": buf.getvalue()})
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message
    assert "token ids" in message and "huggingface" in message


def test_onnx_of_token_ids_is_not_a_tabular_model(tmp_path: Path) -> None:
    path = tmp_path / "tokens.onnx"
    torch.onnx.export(
        _TokenIds(),
        (torch.zeros(1, 8, dtype=torch.long),),
        str(path),
        input_names=["input_ids"],
        output_names=["probs"],
        dynamic_axes={"input_ids": {0: "n"}},
        dynamo=False,
    )
    decl = Declaration(
        "tok",
        "tabular",
        "classification",
        (8,),
        ("a", "b"),
        tuple(f"x{i}" for i in range(8)),
        format="onnx",
    )
    with pytest.raises(ModelError, match="token ids") as err:
        register(decl, {"model": path.read_bytes()})
    assert "huggingface" in str(err.value)
