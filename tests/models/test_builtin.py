"""Built-in models (accuracy, caching, determinism) and the model registry."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from models import BUILTINS, Model, ModelNotReadyError, ModelRegistry, UnknownModelError
from models.builtin import trained as builtin
from models.builtin.trained import dataset_split
from models.catalog import BuiltinModel


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="session")
def trained(cache_dir: Path) -> dict[str, Model]:
    """The models trained here (pretrained, weightless and derived models are tested beside
    their code: tests/models/test_text.py, tests/explainers/test_rankshap.py, test_cocoa.py)."""
    return {b.name: b.load(cache_dir) for b in BUILTINS if b.name in builtin._SPECS}


def _accuracy(model: Model) -> float:
    split = dataset_split(model.name)
    return float((model.predict(split.x_test).argmax(axis=1) == split.y_test).mean())


def test_digits_cnn_held_out_accuracy(trained: dict[str, Model]) -> None:
    model = trained["digits-cnn"]
    split = dataset_split("digits-cnn")
    assert len(split.x_test) == round(0.25 * (len(split.x_train) + len(split.x_test)))
    assert _accuracy(model) >= 0.95
    assert model.info["training"]["test_accuracy"] == pytest.approx(_accuracy(model))


def test_breast_cancer_held_out_accuracy(trained: dict[str, Model]) -> None:
    assert _accuracy(trained["breast-cancer-mlp"]) >= 0.93


def test_diabetes_held_out_r2_in_original_units(trained: dict[str, Model]) -> None:
    model = trained["diabetes-mlp"]
    split = dataset_split("diabetes-mlp")
    pred = model.predict(split.x_test)[:, 0]
    r2 = (
        1.0 - ((split.y_test - pred) ** 2).sum() / ((split.y_test - split.y_test.mean()) ** 2).sum()
    )
    assert r2 >= 0.35
    assert pred.min() >= 25.0 and pred.max() <= 350.0  # the target's own range, not z-scores
    assert model.info["training"]["test_r2"] == pytest.approx(r2, abs=1e-5)


@pytest.mark.parametrize(
    ("name", "shape", "n_out"),
    [("diabetes-mlp", (10,), 1), ("breast-cancer-mlp", (30,), 2), ("digits-cnn", (1, 8, 8), 10)],
)
def test_model_metadata_and_predict(
    trained: dict[str, Model], name: str, shape: tuple[int, ...], n_out: int
) -> None:
    model = trained[name]
    assert model.input_shape == shape
    assert model.n_outputs == n_out
    assert len(model.feature_names) == model.n_features == len(set(model.feature_names))
    assert not model.torch_module().training
    params = list(model.torch_module().parameters())
    assert all(p.requires_grad and p.dtype == torch.float32 for p in params)
    assert model.background is not None
    assert model.background.shape == (100, *shape) and model.background.dtype == np.float32
    assert model.background_info == {
        "rows": 100,
        "source": "training split",
        "seed": 0,
        "description": model.background_info["description"],
    }
    assert model.info["seed"] == 0 and model.info["training"]["train_rows"] > 0

    x = dataset_split(name).x_test[:7]
    out = model.predict(x)
    assert out.shape == (7, n_out) and out.dtype == np.float32
    np.testing.assert_array_equal(model.predict(x.reshape(7, -1)), out)
    if model.task == "classification":
        assert (out >= 0).all()
        np.testing.assert_allclose(out.sum(axis=1), 1.0, atol=1e-5)


def test_names_and_shapes_follow_the_datasets(trained: dict[str, Model]) -> None:
    diabetes, cancer, digits = (
        trained[n] for n in ("diabetes-mlp", "breast-cancer-mlp", "digits-cnn")
    )
    assert diabetes.feature_names == ("age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6")
    assert diabetes.output_names == ("progression",)
    assert (diabetes.task, diabetes.modality) == ("regression", "tabular")
    assert cancer.output_names == ("malignant", "benign")
    assert cancer.feature_names[0] == "mean radius"
    assert (cancer.task, cancer.modality) == ("classification", "tabular")
    assert digits.output_names == tuple("0123456789")
    assert digits.feature_names[:2] == ("pixel_0_0", "pixel_0_1")
    assert digits.feature_names[-1] == "pixel_7_7"
    assert (digits.task, digits.modality, digits.batch_size) == ("classification", "image", 16384)
    assert digits.background is not None
    assert digits.background.min() >= 0.0 and digits.background.max() <= 1.0


def test_reload_from_cache_is_identical(trained: dict[str, Model], cache_dir: Path) -> None:
    weights = sorted(cache_dir.glob("*.pt"))
    mtimes = [w.stat().st_mtime_ns for w in weights]
    for first in trained.values():
        second = builtin.load_builtin(first.name, cache_dir)
        assert second.version == first.version
        assert second.info == first.info
        x = dataset_split(first.name).x_test
        np.testing.assert_array_equal(second.predict(x), first.predict(x))
    assert [w.stat().st_mtime_ns for w in weights] == mtimes  # loaded, not retrained


def test_training_is_deterministic(trained: dict[str, Model], tmp_path: Path) -> None:
    rng_state = torch.random.get_rng_state()
    for name, first in trained.items():
        again = builtin.load_builtin(name, tmp_path / "fresh")
        assert again.version == first.version, name
        np.testing.assert_array_equal(again.background, first.background)
    assert torch.equal(torch.random.get_rng_state(), rng_state)


def test_config_change_changes_cache_file() -> None:
    cfg = builtin._SPECS["digits-cnn"].config
    assert cfg.digest() == builtin.TrainConfig(**vars(cfg)).digest()
    changed = builtin.TrainConfig(**{**vars(cfg), "epochs": cfg.epochs + 1})
    assert changed.digest() != cfg.digest()


def test_concurrent_loads_train_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real_train = builtin._train

    def counting_train(spec: Any, split: Any) -> Any:
        calls.append(spec.config.name)
        return real_train(spec, split)

    monkeypatch.setattr(builtin, "_train", counting_train)
    versions: list[str] = []

    def load() -> None:
        versions.append(builtin.load_builtin("breast-cancer-mlp", tmp_path).version)

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["breast-cancer-mlp"]
    assert len(versions) == 3 and len(set(versions)) == 1
    assert len(list(tmp_path.glob("*.pt"))) == 1


def _user_model(name: str, seed: int) -> Model:
    torch.manual_seed(seed)
    return Model(
        name=name,
        modality="tabular",
        task="regression",
        input_shape=(3,),
        feature_names=("a", "b", "c"),
        output_names=("y",),
        module=torch.nn.Linear(3, 1).eval(),
    )


def test_registry_get_register_unregister(trained: dict[str, Model], cache_dir: Path) -> None:
    registry = ModelRegistry(cache_dir)
    assert registry.names() == sorted(b.name for b in BUILTINS)
    assert not registry.loaded("digits-cnn")
    assert registry.get("digits-cnn").version == trained["digits-cnn"].version
    assert registry.loaded("digits-cnn")
    assert registry.get("digits-cnn") is registry.get("digits-cnn")

    with pytest.raises(UnknownModelError):
        registry.get("nope")
    with pytest.raises(KeyError):
        registry.get("nope")

    v1 = registry.register(_user_model("mine", seed=1))
    v2 = registry.register(_user_model("mine", seed=2))
    assert v1.version != v2.version
    assert registry.get("mine") is v2
    assert "mine" in registry.names() and registry.loaded("mine")
    with pytest.raises(ValueError, match="built-in"):
        registry.register(_user_model("digits-cnn", seed=0))

    registry.unregister("mine")
    assert "mine" not in registry.names()
    with pytest.raises(UnknownModelError):
        registry.unregister("mine")
    with pytest.raises(UnknownModelError):
        registry.get("mine")


def test_registry_rejects_duplicate_builtin_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="duplicate"):
        ModelRegistry(tmp_path, builtins=[BUILTINS[0], BUILTINS[0]])


def test_registry_records_load_failures_and_retries(
    trained: dict[str, Model], cache_dir: Path
) -> None:
    attempts: list[int] = []

    def flaky(path: Path) -> Model:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("disk on fire")
        return builtin.load_breast_cancer_mlp(path)

    registry = ModelRegistry(
        cache_dir, builtins=[BuiltinModel("breast-cancer-mlp", "tabular", flaky), BUILTINS[0]]
    )
    registry.load_all()
    status = registry.status()
    assert status["breast-cancer-mlp"] == {"loaded": False, "error": "OSError: disk on fire"}
    assert status["diabetes-mlp"] == {"loaded": True, "error": None}

    model = registry.get("breast-cancer-mlp")
    assert model.version == trained["breast-cancer-mlp"].version
    assert registry.status()["breast-cancer-mlp"] == {"loaded": True, "error": None}


def test_registry_get_raises_not_ready_with_reason(tmp_path: Path) -> None:
    def broken(path: Path) -> Model:
        raise RuntimeError("no weights")

    registry = ModelRegistry(tmp_path, builtins=[BuiltinModel("broken", "tabular", broken)])
    with pytest.raises(ModelNotReadyError, match="no weights"):
        registry.get("broken")
    assert registry.status() == {"broken": {"loaded": False, "error": "RuntimeError: no weights"}}
