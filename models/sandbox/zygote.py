"""Imported once by the forkserver (the workers' zygote), never by the server: every library a
worker uses, warmed up on tiny models of each format so that their lazy imports and one-time
initialisations (torch's cpuinfo, the profiler, shap's TreeSHAP) happen here. A worker
cannot import or read a file after its chroot (models/sandbox/worker.py)."""

from __future__ import annotations

import contextlib
import io
import logging
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


def _declaration(fmt: str, n: int, outputs: tuple[str, ...], task: str) -> object:
    from models.declaration import Declaration

    return Declaration(
        "warm-up", "tabular", task, (n,), outputs, tuple(f"x{i}" for i in range(n)), format=fmt
    )


def _torchscript() -> None:
    import torch

    from models.adapters.user import register

    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(torch.nn.Sequential(*net, torch.nn.Softmax(dim=1))), buf)
    decl = _declaration("torchscript", 3, ("a", "b"), "classification")
    model, _ = register(decl, {"model": buf.getvalue()})  # type: ignore[arg-type]
    x = torch.zeros(2, 3, requires_grad=True)
    torch.autograd.grad(model.torch_module()(x)[:, 0].sum(), x)
    conv = torch.nn.Conv2d(1, 2, 3)
    conv(torch.zeros(1, 1, 8, 8)).sum().backward()


def _boosters() -> None:
    import lightgbm as lgb
    import xgboost as xgb

    from models.adapters.user import register

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3))
    y = (x[:, 0] > 0).astype(int)
    params = {"objective": "binary:logistic", "max_depth": 2, "nthread": 1}
    booster = xgb.train(params, xgb.DMatrix(x, y), 3)
    text = lgb.train(
        {"objective": "binary", "verbose": -1, "min_data_in_leaf": 2, "num_threads": 1},
        lgb.Dataset(x, y),
        3,
    ).model_to_string()
    for fmt, data in (("xgboost", bytes(booster.save_raw("json"))), ("lightgbm", text.encode())):
        decl = _declaration(fmt, 3, ("no", "yes"), "classification")
        model, _ = register(decl, {"model": data})  # type: ignore[arg-type]
        assert model.tree is not None
        model.tree.contributions(x[:2])
        model.tree.interactions(x[:2])
        model.tree.interventional_values(x[:2], x[:4])


def _onnx() -> None:
    import onnx
    from onnx import TensorProto, helper

    from models.adapters.user import register

    weight = helper.make_tensor("w", TensorProto.FLOAT, [3, 1], [1.0, 2.0, 3.0])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "warm-up",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])],
        [weight],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    proto.ir_version = 8
    decl = _declaration("onnx", 3, ("y",), "regression")
    register(decl, {"model": proto.SerializeToString()})  # type: ignore[arg-type]
    onnx.checker.check_model(proto)


def _huggingface() -> None:
    """Tiny checkpoints of each kind, saved and loaded as a user's are (models/adapters/hf.py), and
    each operation a worker serves run once: transformers imports its pieces lazily."""
    import tempfile
    from pathlib import Path

    import torch
    from transformers import (  # type: ignore[attr-defined]
        BertConfig,
        BertForSequenceClassification,
        BertTokenizerFast,
        LlamaConfig,
        LlamaForCausalLM,
    )

    from models.adapters.checkpoint import folder_checkpoint
    from models.adapters.hf import _load, declare
    from models.adapters.hf_models import check_texts
    from models.sandbox.hf_worker import read_files_now

    read_files_now()

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c", "test", "."]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "vocab.txt").write_text("\n".join(words))
        tok = BertTokenizerFast(vocab_file=str(Path(tmp) / "vocab.txt"))
        small: dict[str, Any] = {"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
                 "intermediate_size": 8, "vocab_size": len(words)}  # fmt: skip
        folders = {}
        for name, net in (
            ("text", BertForSequenceClassification(BertConfig(**{**small, "num_labels": 2}))),
            ("ranker", BertForSequenceClassification(BertConfig(**{**small, "num_labels": 1}))),
            ("lm", LlamaForCausalLM(LlamaConfig(**small, num_key_value_heads=1,
                                                bos_token_id=2, eos_token_id=3))),
        ):  # fmt: skip
            folder = Path(tmp) / name
            net.save_pretrained(folder)
            tok.save_pretrained(folder)
            folders[name] = folder
        for name, folder in folders.items():
            ck = folder_checkpoint(folder)
            model: Any = _load(declare("warm-up", ck, modality=name), ck, folder, "0")
            if name == "lm":
                ids = model.encode("a b c", bos=True)
                _, prefix = model.full_pass(ids[:2], ids[2:])
                model.response_log_likelihood([ids[:2], ids[:1]], ids[2:], prefix=prefix)
                model.decode(model.generate(ids, 2))
                continue
            check_texts(model)
            if name == "text":
                hook = model.embeddings
                ids, types, _, _ = hook.encode("a b")
                x = hook.embed(torch.tensor([ids])).detach().requires_grad_(True)
                out = hook.scores(x, torch.tensor([types]), "probability")
                torch.autograd.grad(out.sum(), x)
                hook.embedding_std()


# One thread: an OpenMP pool started here would deadlock its forks (libgomp after fork).
with contextlib.suppress(Exception):
    import torch

    torch.set_num_threads(1)
for _step in (_torchscript, _boosters, _onnx, _huggingface):
    try:
        _step()
    except Exception as exc:  # the zygote must start; a worker then reports the failure
        with contextlib.suppress(Exception):
            log.warning("model worker warm-up %s failed: %s", _step.__name__, exc)
