"""An ONNX text classifier built offline: the MiniLM classifier fixture of hf_fixtures.py exported
by torch.onnx.export (TorchScript exporter) into a folder beside its tokenizer and config.json."""

from __future__ import annotations

import functools
import shutil
import warnings
from pathlib import Path

import torch

from tests.models import hf_fixtures as fx

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def onnx_classifier_dir(dest: Path) -> Path:
    """model.onnx (logits [N, 2]) beside tokenizer.json, tokenizer_config.json, config.json."""
    from transformers import AutoModelForSequenceClassification

    src = fx.folder("classifier")
    hf = AutoModelForSequenceClassification.from_pretrained(src, local_files_only=True).eval()
    ids = torch.tensor([[101, 1037, 2143, 102]])
    dest.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation and trace notes
        warnings.simplefilter("ignore")
        _export(hf, ids, dest)
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(src / name, dest / name)
    return dest


def _export(hf: torch.nn.Module, ids: torch.Tensor, dest: Path) -> None:
    axes = {name: {0: "batch", 1: "tokens"} for name in INPUTS}
    torch.onnx.export(
        hf,
        (ids, torch.ones_like(ids), torch.zeros_like(ids)),
        str(dest / "model.onnx"),
        input_names=list(INPUTS),
        output_names=["logits"],
        dynamic_axes={**axes, "logits": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )


@functools.cache
def folder() -> Path:
    """The ONNX classifier folder, exported once per test session."""
    return onnx_classifier_dir(fx.folder("classifier").parent / "onnx-classifier")


@functools.cache
def archived(kind: str = "tar.gz") -> bytes:
    return fx.archive(folder(), kind)
