"""The DEVICE setting (issue 20): resolution, start-up errors, placement and batch sizing.

The CPU path runs everywhere; the CUDA tests run on a machine with a CUDA device (skipped with
the reason elsewhere) and compare against the CPU at float32 tolerances.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from app.settings import Settings
from explainers.gradients import integrated as gradients
from explainers.gradients import uni
from explainers.gradients.learned_baseline import low_order_objective
from models import Model, ModelRegistry
from models.adapters.user import register
from models.base import rows_for_memory
from models.declaration import Declaration
from models.device import DeviceError, place, resolve_device

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device on this machine")
without_cuda = pytest.mark.skipif(CUDA, reason="this machine has a CUDA device")


def test_resolve_device_names() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")
    auto = resolve_device("auto")
    assert auto == (torch.device("cuda", 0) if CUDA else torch.device("cpu"))
    for bad in ("gpu", "", "cuda:", "cuda:x", "cuda0", "mps"):
        with pytest.raises(DeviceError, match="DEVICE must be auto, cpu, cuda or cuda:<index>"):
            resolve_device(bad)


@without_cuda
def test_explicit_cuda_without_a_device_fails_clearly() -> None:
    for spec in ("cuda", "cuda:0", "cuda:1"):
        with pytest.raises(DeviceError, match=rf"DEVICE={spec} but torch sees no CUDA device"):
            resolve_device(spec)
    with pytest.raises(DeviceError, match="set DEVICE=cpu or DEVICE=auto"):
        ModelRegistry(Path("/nonexistent"), builtins=(), device="cuda")


@without_cuda
def test_settings_refuse_cuda_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="DEVICE=cuda but torch sees no CUDA device"):
        Settings(device="cuda")
    monkeypatch.setenv("DEVICE", "cuda:0")
    with pytest.raises(ValidationError, match="DEVICE=cuda:0 but torch sees no CUDA device"):
        Settings()


def test_settings_accept_cpu_and_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().device == "auto"
    assert Settings(device="CPU").device == "cpu"
    monkeypatch.setenv("DEVICE", "auto")
    assert Settings().device == "auto"
    with pytest.raises(ValidationError, match="DEVICE must be"):
        Settings(device="tpu")


@needs_cuda
def test_cuda_index_out_of_range() -> None:
    count = torch.cuda.device_count()
    with pytest.raises(DeviceError, match=f"has {count} CUDA device"):
        resolve_device(f"cuda:{count}")
    assert resolve_device("cuda") == torch.device("cuda", 0)


def test_rows_for_memory() -> None:
    assert rows_for_memory(1000, 10, cap=1 << 20) == 50  # half the free memory
    assert rows_for_memory(1000, 10, cap=20) == 20
    assert rows_for_memory(5, 10, cap=20) == 1  # never zero rows
    assert rows_for_memory(1000, 0, cap=7) == 7  # unknown row size: the cap
    assert rows_for_memory(1000, 10, cap=1 << 20, share=0.9) == 90


@pytest.mark.parametrize("spec", ["cpu", "auto"])
def test_cpu_registry_matches_the_default(model_dir: Path, spec: str) -> None:
    """DEVICE=cpu and auto (on a CPU machine) give the outputs and versions of before."""
    if spec == "auto" and CUDA:
        pytest.skip("auto means cuda on this machine")
    before = ModelRegistry(model_dir)  # the library default: the CPU
    placed = ModelRegistry(model_dir, device=spec)
    assert placed.device == torch.device("cpu")
    for name in ("diabetes-mlp", "breast-cancer-mlp", "digits-cnn"):
        a, b = before.get(name), placed.get(name)
        assert b.device == torch.device("cpu") and b.info["device"] == "cpu"
        assert (a.version, a.batch_size, a.row_bytes) == (b.version, b.batch_size, b.row_bytes)
        assert b.row_bytes > 0  # measured on the CPU too (MAX_BATCH_BYTES)
        assert b.rows_per_pass() == b.batch_size
        x = a.reference[:300] if a.reference is not None else None
        assert x is not None
        np.testing.assert_array_equal(a.predict(x), b.predict(x))  # same CPU kernels
    digits = placed.get("digits-cnn")
    x = digits.reference[:2] if digits.reference is not None else None
    assert x is not None
    opts = gradients.IntegratedGradientsOptions(steps=8)
    ig_a = gradients.explain(before.get("digits-cnn"), x, options=opts)
    ig_b = gradients.explain(digits, x, options=opts)
    for e, f in zip(ig_a.explanations, ig_b.explanations, strict=True):
        np.testing.assert_array_equal(e.values, f.values)


def test_black_boxes_stay_where_they_compute() -> None:
    """Models another runtime evaluates keep their object; info says where they run."""
    box = Model(
        name="box",
        modality="tabular",
        task="regression",
        input_shape=(3,),
        feature_names=("a", "b", "c"),
        output_names=("y",),
        predict_fn=lambda rows: rows.sum(axis=1, keepdims=True),
        version="v1",
    )
    assert place(box, torch.device("cpu")) is box and box.info["device"] == "cpu"
    assert box.device == torch.device("cpu") and box.module is None and not box.differentiable
    np.testing.assert_allclose(box.predict(np.ones((4, 3))), np.full((4, 1), 3.0))


# ----------------------------------------------------------------------- on a CUDA device


@pytest.fixture(scope="module")
def on_cuda(model_dir: Path) -> tuple[ModelRegistry, ModelRegistry]:
    if not CUDA:
        pytest.skip("no CUDA device on this machine")
    return ModelRegistry(model_dir, device="cpu"), ModelRegistry(model_dir, device="cuda")


@needs_cuda
def test_cuda_models_match_the_cpu(on_cuda: tuple[ModelRegistry, ModelRegistry]) -> None:
    cpu, gpu = on_cuda
    for name in ("diabetes-mlp", "breast-cancer-mlp", "digits-cnn"):
        a, b = cpu.get(name), gpu.get(name)
        assert b.device.type == "cuda" and b.info["device"] == "cuda:0"
        assert a.version == b.version  # the version never depends on the device
        assert b.row_bytes > 0 and b.batch_size >= a.batch_size
        assert 1 <= b.rows_per_pass() <= b.batch_size
        x = a.reference if a.reference is not None else np.zeros((1, *a.input_shape))
        np.testing.assert_allclose(b.predict(x), a.predict(x), rtol=1e-4, atol=1e-5)


@needs_cuda
def test_cuda_gradient_explainers_match_the_cpu(
    on_cuda: tuple[ModelRegistry, ModelRegistry],
) -> None:
    cpu, gpu = on_cuda
    a, b = cpu.get("digits-cnn"), gpu.get("digits-cnn")
    x = a.reference[:2] if a.reference is not None else None
    assert x is not None
    opts = gradients.IntegratedGradientsOptions(steps=16)
    for e, f in zip(
        gradients.explain(a, x, options=opts).explanations,
        gradients.explain(b, x, options=opts).explanations,
        strict=True,
    ):
        np.testing.assert_allclose(f.values, e.values, rtol=1e-3, atol=1e-5)
    u_opts = uni.UniOptions(unlearning_rule="normalized", pgd_steps=5)
    ua, ub = uni.explain(a, x[:1], options=u_opts), uni.explain(b, x[:1], options=u_opts)
    assert ub.explanations[0].values.shape == ua.explanations[0].values.shape
    assert np.all(np.isfinite(ub.explanations[0].values))
    c, g = cpu.get("breast-cancer-mlp"), gpu.get("breast-cancer-mlp")
    rows = c.reference[:8] if c.reference is not None else None
    assert rows is not None
    target = torch.as_tensor(c.predict(rows).argmax(axis=1))
    values = [
        float(
            low_order_objective(
                m.torch_module(),
                torch.as_tensor(rows),
                target,
                torch.as_tensor(rows.mean(axis=0)),
                logodds=True,
                sample_num=4,
                low_order=0.1,
                generator=torch.Generator().manual_seed(0),
            )
        )
        for m in (c, g)
    ]
    assert values[1] == pytest.approx(values[0], rel=1e-3)


def _torchscript(weights: list[float]) -> bytes:
    layer = torch.nn.Linear(len(weights), 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([weights]))
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(layer), buf)
    return buf.getvalue()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_torchscript_registers_on_the_device(device: str) -> None:
    """The test forward pass of a registration runs where the model will compute."""
    decl = Declaration("lin", "tabular", "regression", (3,), ("y",), ("a", "b", "c"))
    model, meta = register(decl, {"model": _torchscript([1.0, 2.0, 3.0])}, resolve_device(device))
    assert model.device.type == device and model.info["device"].startswith(device)
    assert model.version == meta["version"]  # the same version as a CPU registration
    _, cpu_meta = register(decl, {"model": _torchscript([1.0, 2.0, 3.0])})
    assert cpu_meta["version"] == meta["version"]
    np.testing.assert_allclose(model.predict(np.ones((5, 3))), np.full((5, 1), 6.0), rtol=1e-6)


def test_text_model_placed_on_the_cpu_is_unchanged() -> None:
    from models.builtin.text import load_sentiment_minilm

    texts = ["The movie was wonderful.", "I hated every minute of it.", "A plain sentence."]
    before = load_sentiment_minilm(Path("/nonexistent"))
    expected = before.predict(texts)
    placed = place(before, torch.device("cpu"))
    assert placed is before and placed.info["device"] == "cpu"
    np.testing.assert_array_equal(placed.predict(texts), expected)


@needs_cuda
def test_cuda_text_model_matches_the_cpu() -> None:
    from models.builtin.text import load_sentiment_minilm

    texts = ["The movie was wonderful.", "I hated every minute of it.", "A plain sentence."]
    cpu = load_sentiment_minilm(Path("/nonexistent"))
    gpu = place(load_sentiment_minilm(Path("/nonexistent")), torch.device("cuda", 0))
    assert gpu.device.type == "cuda" and gpu.version == cpu.version
    np.testing.assert_allclose(gpu.predict(texts), cpu.predict(texts), rtol=1e-4, atol=1e-5)


@needs_cuda
def test_cuda_salvage_trains_and_explains(on_cuda: tuple[ModelRegistry, ModelRegistry]) -> None:
    from explainers.amortized.salvage import inference as salvage_inference
    from explainers.amortized.salvage import train as salvage

    digits = on_cuda[1].get("digits-cnn")
    tiny = {"rows": 48, "surrogate_epochs": 1, "explainer_epochs": 2, "batch_size": 16}
    trained = salvage.train(digits, salvage.SalvageTrainOptions(**tiny, pairs=2))
    assert trained is not None and trained.metrics["device"] == "cuda:0"
    x = digits.reference[:3] if digits.reference is not None else None
    assert x is not None
    out = salvage_inference.amortized(trained, x)
    assert out.values.shape == (3, 16, 10) and np.all(np.isfinite(out.values))
    # efficiency after the projection: the values add up to v(N) - v(empty) per class
    np.testing.assert_allclose(out.values.sum(axis=1), out.full - out.base, atol=1e-4)
    game = salvage_inference.surrogate_game(trained, x[0])
    full = game(np.ones((1, 16), dtype=bool))
    np.testing.assert_allclose(full[0], out.full[0], rtol=1e-4, atol=1e-5)
