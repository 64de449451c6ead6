"""digits-sst (SST's shared-trunk network) and digits-sst-twin (our independent-selector
variant), models/builtin/sst.py: seeded and cached training, accuracy, own subsets that the model
itself verifies as sufficient, SST's design (the masked input goes through the same trunk and class
head), and the shapley / sufficient-subset routes over HTTP."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from explainers.games.masked import patch_groups
from models import Model, ModelError, ModelRegistry
from models.builtin import sst
from models.builtin.sst import TWIN, SSTConfig, SSTNet, load_digits_sst, own_subset, subset_input
from models.builtin.trained import dataset_split, load_digits_cnn
from models.catalog import BUILTINS

# Measured on the cached default models (bench/sst_bench.py, torch 2.13 CPU), 449 test images:
# digits-sst accuracy 0.987, own subsets of 2.26 patches on average that keep the class on 0.873
# of them, 0.205 at random places; digits-sst-twin 0.982, 2.67 patches, 0.871, 0.274.
# (digits-cnn: 0.978.) Floors a little below, per model.
FLOORS = {
    # name: (accuracy floor, faithfulness floor, random-places ceiling, mean size ceiling)
    "digits-sst": (0.96, 0.84, 0.40, 4.0),
    "digits-sst-twin": (0.96, 0.84, 0.45, 4.0),
}
CONFIGS = {"digits-sst": SSTConfig(), "digits-sst-twin": TWIN}


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """One torch thread, as the service runs."""


@pytest.fixture(scope="module", params=list(CONFIGS))
def model(request: pytest.FixtureRequest, model_dir: Path) -> Model:
    return load_digits_sst(model_dir, CONFIGS[request.param])


@pytest.mark.parametrize("design", ["shared", "twin"])
def test_training_is_seeded_cached_and_rebuilt_when_corrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, design: str
) -> None:
    cfg = SSTConfig(epochs=4, design=design)  # type: ignore[arg-type]
    rng_before = torch.random.get_rng_state()
    first = load_digits_sst(tmp_path / "a", cfg)
    assert torch.equal(torch.random.get_rng_state(), rng_before)  # the caller's RNG untouched
    second = load_digits_sst(tmp_path / "b", cfg)
    assert first.version == second.version  # same seed, same weights, in another cache
    assert first.version != load_digits_sst(tmp_path / "a", replace(cfg, epochs=5)).version

    def no_training(*_: object) -> None:
        raise AssertionError("retrained although the cache holds the weights")

    with monkeypatch.context() as patch:
        patch.setattr(sst, "train_sst", no_training)
        assert load_digits_sst(tmp_path / "a", cfg).version == first.version

    weights, _ = sst.cache_paths(tmp_path / "a", cfg)
    weights.write_bytes(b"not a state dict")
    with caplog.at_level("WARNING", logger="models.builtin.sst"):
        rebuilt = load_digits_sst(tmp_path / "a", cfg)
    assert rebuilt.version == first.version and "corrupt model cache" in caplog.text


def test_registered_as_an_image_classifier(model: Model) -> None:
    entry = next(b for b in BUILTINS if b.name == model.name)
    # digits-sst loads with the others; the twin (for comparison) in the background
    assert entry.modality == "image" and entry.background is (model.name == "digits-sst-twin")
    assert model.task == "classification" and model.input_range == (0.0, 1.0)
    assert model.input_shape == (1, 8, 8) and model.n_outputs == 10
    probs = model.predict(dataset_split("digits-cnn").x_test[:5])
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)


def test_held_out_accuracy(model: Model) -> None:
    split = dataset_split("digits-cnn")
    accuracy = float((model.predict(split.x_test).argmax(axis=1) == split.y_test).mean())
    assert accuracy >= FLOORS[model.name][0]
    assert model.info["training"]["test_accuracy"] == pytest.approx(accuracy)


def test_own_subsets_are_sufficient_and_small(model: Model) -> None:
    x = dataset_split("digits-cnn").x_test
    classes = model.predict(x).argmax(axis=1)
    _, faithful_floor, random_ceiling, size_ceiling = FLOORS[model.name]
    own = own_subset(model, x)
    assert own.shape == (len(x), 16) and own.dtype == bool
    assert 0 < own.sum(axis=1).mean() <= size_ceiling
    kept = model.predict(subset_input(x, own)).argmax(axis=1) == classes  # the model verifies
    assert kept.mean() >= faithful_floor
    # The selector, not the mere number of patches, makes them sufficient.
    rng = np.random.default_rng(0)
    shuffled = np.array([rng.permutation(row) for row in own])
    assert (model.predict(subset_input(x, shuffled)).argmax(axis=1) == classes).mean() < (
        random_ceiling
    )
    assert model.info["training"]["test_faithfulness"] == pytest.approx(kept.mean())
    # One image at a time gives the batch's answer.
    np.testing.assert_array_equal(own_subset(model, x[:1]), own[:1])


def test_digits_sst_is_one_network_with_two_heads(model_dir: Path) -> None:
    """SST's design: one trunk feeds the class head and the mask head, and the prediction on
    the masked input is that same network's (no second network anywhere)."""
    net = load_digits_sst(model_dir).module
    assert isinstance(net, SSTNet)
    assert {name for name, _ in net.named_children()} == {"trunk", "class_head", "mask_head"}
    assert net.class_head.in_features == net.mask_head.in_features == 64
    assert net.mask_head.out_features == 16 and net.class_head.out_features == 10
    x = torch.from_numpy(dataset_split("digits-cnn").x_test[:8])
    with torch.no_grad():
        logits, mask = net.heads(x)
        features = net.trunk(x)  # one trunk pass gives both heads
        torch.testing.assert_close(logits, net.class_head(features))
        torch.testing.assert_close(mask, net.mask_head(features))
        torch.testing.assert_close(torch.softmax(logits, dim=1), net(x))
        # the masked input's prediction: the same trunk and class head
        kept = x * sst.pixel_mask(net.own_subset(x).float())
        torch.testing.assert_close(net(kept), torch.softmax(net.class_head(net.trunk(kept)), 1))
    trained = load_digits_sst(model_dir).info["sufficient_subset"]["design"]
    assert trained.startswith("SST's")


def test_players_are_sufficient_subsets_patches() -> None:
    groups, _ = patch_groups((1, 8, 8), 2)
    x = np.ones((16, 1, 8, 8), np.float32)
    kept = subset_input(x, np.eye(16, dtype=bool)).reshape(16, -1)
    np.testing.assert_array_equal(kept > 0, groups[None, :] == np.arange(16)[:, None])


def test_own_subset_needs_an_sst_model(model: Model, model_dir: Path) -> None:
    cnn = load_digits_cnn(model_dir)
    assert sst.has_own_subset(model) and not sst.has_own_subset(cnn)
    with pytest.raises(ModelError, match="own sufficient subset"):
        own_subset(cnn, np.zeros((1, 1, 8, 8), np.float32))


@pytest.fixture(scope="module")
def client(model_dir: Path, make_client: Callable[..., TestClient]) -> TestClient:
    registry = ModelRegistry(model_dir, builtins=[b for b in BUILTINS if b.name in CONFIGS])
    for name in CONFIGS:
        registry.get(name)  # loaded now: the twin would otherwise load in the background
    return make_client(registry)


def test_shapley_and_sufficient_subset_over_http(client: TestClient, model: Model) -> None:
    url = f"/v2/models/{model.name}"
    listed = client.get(url).json()["explainers"]
    assert {"shapley", "sufficient-subset"} <= set(listed)
    x = dataset_split("digits-cnn").x_test[:2]
    r = client.post(
        f"{url}/explain/shapley",
        json={"inputs": x[:1].tolist(), "parameters": {"patch_size": 4}},
    )
    assert r.status_code == 200, r.text
    e = r.json()["data"]["explanations"][0]
    assert len(e["values"]) == 4 and e["exact"] is True
    np.testing.assert_allclose(
        sum(e["values"]) + e["base_value"], e["instance_output_value"], rtol=1e-4, atol=1e-5
    )
    r = client.post(f"{url}/explain/sufficient-subset", json={"inputs": x.tolist()})
    assert r.status_code == 200, r.text
    for xi, e in zip(x, r.json()["data"]["explanations"], strict=True):
        d = e["details"]
        assert d["verified"] is True and d["n_players"] == 16
        subset = np.isin(np.arange(16), d["subset"])[None]
        p = model.predict(subset_input(xi[None], subset))
        assert int(p.argmax()) == d["class"] == int(model.predict(xi[None]).argmax())
        np.testing.assert_allclose(p[0, d["class"]], d["probability_subset"], rtol=1e-5)
    bad = client.post(f"{url}/explain/sufficient-subset", json={"inputs": [[1]]})
    assert 400 <= bad.status_code < 500 and "error" in bad.json()
