"""The built-in LMs (GGUF -> bf16 cache) and background loading in the registry."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from models import ModelNotReadyError, ModelRegistry
from models.base import Model
from models.builtin.lm import SOURCES, _read, shared_language_model
from models.catalog import BUILTINS, BuiltinModel


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_lm_loads_from_its_cache_and_predicts_log_likelihoods(name: str, model_dir: Path) -> None:
    lm = shared_language_model(name, model_dir)
    assert lm is shared_language_model(name, model_dir)  # one copy per process
    assert lm.modality == "lm" and len(lm.version) == 16
    assert any(p.name.startswith(name) for p in (model_dir / "lm").iterdir())
    assert all(p.dtype == torch.float32 for p in lm.hf.parameters())
    text = "The quick brown fox jumps over the lazy dog."
    ids = lm.encode(text, bos=True)
    with torch.inference_mode():
        logits = lm.hf(torch.tensor([ids])).logits[0, :-1].double()
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None]).sum()
    out = lm.predict([text, text + " Again."])
    assert out.shape == (2, 1) and out.dtype == np.float32
    assert out[0, 0] == pytest.approx(float(expected), abs=1e-3)
    assert out[1, 0] < out[0, 0]  # more tokens, lower likelihood
    start, end = lm.token_spans("fox jumps")[0]
    assert "fox jumps"[start:end].strip() == "fox"


def test_corrupt_lm_cache_is_deleted(tmp_path: Path) -> None:
    bad = tmp_path / "lm" / "gemma3-270m-000000000000"
    bad.mkdir(parents=True)
    (bad / "meta.json").write_text("{}")  # complete-looking, but no weights
    assert _read(bad) is None
    assert not bad.exists()


def test_lms_are_background_builtins() -> None:
    lms = {b.name: b for b in BUILTINS if b.modality == "lm"}
    assert set(lms) == {"gemma3-270m", "smollm2-135m"}
    assert all(b.background for b in lms.values())


def test_background_model_answers_not_ready_while_loading(tmp_path: Path) -> None:
    release, started = threading.Event(), threading.Event()
    eager = BUILTINS[0]

    def slow(path: Path) -> Model:
        started.set()
        release.wait(30)
        return eager.load(path)

    registry = ModelRegistry(
        tmp_path, builtins=[eager, BuiltinModel("slow-lm", "tabular", slow, background=True)]
    )
    registry.load_all()  # the eager ones only
    assert registry.loaded(eager.name) and not registry.loaded("slow-lm")
    assert registry.status()["slow-lm"] == {"loaded": False, "error": None, "background": True}
    loader = threading.Thread(target=registry.load_all, kwargs={"include_background": True})
    loader.start()
    assert started.wait(30)
    with pytest.raises(ModelNotReadyError, match="loading"):
        registry.get("slow-lm")  # answers at once instead of waiting for the load
    release.set()
    loader.join(30)
    assert registry.get("slow-lm").name == eager.name and registry.loaded("slow-lm")


def test_interrupted_conversions_are_cleaned(tmp_path: Path) -> None:
    """A stop mid-conversion leaves `<dest>.<pid>.tmp`; the next load removes it unless its
    process still runs."""
    import os
    import subprocess

    from models.builtin.lm import clean_interrupted

    dead_pid = subprocess.Popen(["true"])  # a pid that has exited
    dead_pid.wait()
    stale = tmp_path / f"smollm2-135m-abc.{dead_pid.pid}.tmp"
    live = tmp_path / f"smollm2-135m-abc.{os.getpid()}.tmp"
    for folder in (stale, live):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"x" * 10)
    assert clean_interrupted(tmp_path) == [stale]
    assert not stale.exists() and live.exists()
