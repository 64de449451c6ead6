"""Salvage: samplers, the efficiency projection, determinism, classification and accuracy
against exact Shapley values of the surrogate game (16 patch players of digits-cnn)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from explainers.amortized import masks as salvage_masks
from explainers.amortized.salvage import inference as salvage_inference
from explainers.amortized.salvage import train as salvage
from explainers.amortized.salvage.explainer import (
    NotTrainedError,
    SalvageOptions,
    SalvageStore,
    explain,
)
from explainers.context import Artifacts, RunContext
from explainers.shapley.explainer import shapley_values
from models.base import Model
from models.builtin.trained import dataset_split

# Small enough for a loaded CI machine; the bench trains the full default configuration.
SMALL = {"rows": 500, "surrogate_epochs": 2, "explainer_epochs": 20, "lr": 3e-3, "seed": 3}
TINY = {"rows": 48, "surrogate_epochs": 1, "explainer_epochs": 2, "batch_size": 16, "pairs": 2}


# One torch thread, as in the service's job workers: much faster on a shared CPU.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="session")
def held_out() -> np.ndarray:
    """The classifier's test split: seen by neither the classifier nor the explainer."""
    return dataset_split("digits-cnn").x_test[:200]


@pytest.fixture(scope="session")
def trained(digits: Model) -> salvage.Trained:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the service's job workers; faster on a shared CPU
    try:
        out = salvage.train(digits, salvage.SalvageTrainOptions(**SMALL))
    finally:
        torch.set_num_threads(threads)
    assert out is not None
    return out


@pytest.mark.parametrize("kind", ["informed", "kernel", "uniform"])
def test_sampler_pairs_complements(kind: str) -> None:
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(5, 16, generator=gen)
    masks = salvage_masks.sample_masks(kind, 16, 5, 7, gen, scores)
    assert masks.shape == (5, 14, 16) and masks.dtype == torch.bool
    assert torch.equal(masks[:, 0::2], ~masks[:, 1::2])


def test_kernel_sampler_follows_the_shapley_kernel() -> None:
    n, count = 10, 200_000
    masks = salvage_masks.kernel_masks(n, count, torch.Generator().manual_seed(1))
    sizes = np.bincount(masks.sum(dim=1).numpy(), minlength=n + 1)
    k = np.arange(1, n)
    expected = (1 / (k * (n - k))) / (1 / (k * (n - k))).sum()
    assert sizes[0] == sizes[n] == 0
    np.testing.assert_allclose(sizes[1:n] / count, expected, atol=0.005)
    # Given its size, a coalition is uniform: every player equally often.
    np.testing.assert_allclose(masks.float().mean(dim=0).numpy(), 0.5, atol=0.01)


@pytest.mark.parametrize("offset", [0.0, 2.0, -50.0])
def test_informed_sampler_standardises_the_scores(offset: float) -> None:
    """P(i in S) = sigmoid(beta z_i), z centred and scaled: an offset common to every player
    (e.g. all values positive for a confident class) changes nothing."""
    gen = torch.Generator().manual_seed(2)
    scores = torch.tensor([[3.0, 1.5, 0.5, -1.0, -2.0]]) + offset
    masks = salvage_masks.sample_masks("informed", 5, 1, 40_000, gen, scores, 1.0, 1.0)
    z = (scores - scores.mean()) / scores.std()
    freq = masks[0, 0::2].float().mean(dim=0)  # informed halves; the others are complements
    np.testing.assert_allclose(freq.numpy(), torch.sigmoid(z[0]).numpy(), atol=0.01)
    assert freq[0] > 0.5 > freq[-1]  # likelier present: the more important players


def _additive_case(seed: int) -> tuple[torch.Tensor, ...]:
    """A game that is additive in centred log-probabilities, and its exact contributions."""
    gen = torch.Generator().manual_seed(seed)
    b, n, c, m = 3, 6, 4, 10
    psi = salvage.centred(torch.randn(b, n, c, generator=gen, dtype=torch.float64))
    empty_logp = torch.log_softmax(torch.randn(c, generator=gen, dtype=torch.float64), dim=0)
    masks = torch.rand(b, m, n, generator=gen) < 0.5
    target = torch.log_softmax(empty_logp[None, None] + masks.double() @ psi, dim=-1)
    full = torch.log_softmax(empty_logp[None] + psi.sum(dim=1), dim=-1)
    return psi, masks, target, full, empty_logp


@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
def test_temperature_acts_on_the_target(temperature: float) -> None:
    """The exact contributions minimise the loss at every T (values keep their units), and
    rescaled outputs do not: the network cannot learn the temperature away."""
    psi, masks, target, full, empty = _additive_case(0)

    def loss(p: torch.Tensor, t: float) -> float:
        return float(salvage._loss(p, masks, target, full, empty, "distribution", t))

    assert loss(psi, temperature) == pytest.approx(0.0, abs=1e-12)
    if temperature != 1.0:  # the old rule, logits = outputs / T, was fitted by T * psi
        assert loss(temperature * psi, temperature) > 1e-3
        assert loss(psi / temperature, temperature) > 1e-3
    # Away from the optimum, T reweighs the classes: the loss differs with T.
    noisy = psi + 0.3 * salvage.centred(torch.ones_like(psi).cumsum(dim=-1))
    assert loss(noisy, 3.0) != pytest.approx(loss(noisy, 1.0), rel=1e-3)


def test_efficiency_projection_closed_form() -> None:
    gen = torch.Generator().manual_seed(3)
    values = torch.randn(4, 16, 10, generator=gen)
    full, empty = torch.randn(4, 10, generator=gen), torch.randn(1, 10, generator=gen)
    out = salvage.efficiency_projection(values, full, empty)
    np.testing.assert_allclose(out.sum(dim=1).numpy(), (full - empty).numpy(), atol=1e-5)
    shift = out - values  # the same shift for every player
    np.testing.assert_allclose(shift.numpy(), shift[:, :1].expand_as(shift).numpy(), atol=1e-6)


@pytest.mark.parametrize("objective", ["distribution", "squared"])
def test_tiny_seeded_run_is_deterministic(digits: Model, objective: str) -> None:
    opts = salvage.SalvageTrainOptions(**TINY, objective=objective)
    a, b = salvage.train(digits, opts), salvage.train(digits, opts)
    assert a is not None and b is not None
    for net_a, net_b in ((a.surrogate, b.surrogate), (a.explainer, b.explainer)):
        state_b = net_b.state_dict()
        for key, ta in net_a.state_dict().items():
            assert torch.equal(ta, state_b[key]), key
    assert [r["loss"] for r in a.history] == [r["loss"] for r in b.history]
    other = salvage.train(digits, opts.model_copy(update={"seed": 1}))
    assert other is not None
    last = "head.2.weight"
    assert not torch.equal(other.explainer.state_dict()[last], a.explainer.state_dict()[last])


def test_efficiency_after_projection(trained: salvage.Trained, held_out: np.ndarray) -> None:
    out = salvage_inference.amortized(trained, held_out[:20])
    total = out.values.sum(axis=1) + out.base[None]
    np.testing.assert_allclose(total, out.full, atol=1e-4)


def test_explainer_classifies_like_the_classifier(
    digits: Model, trained: salvage.Trained, held_out: np.ndarray
) -> None:
    """Full inputs: the distribution the contributions parameterise vs the classifier's."""
    out = salvage_inference.amortized(trained, held_out)
    assert out.explainer_probs is not None
    f = digits.predict(held_out).astype(np.float64)
    q = np.clip(out.explainer_probs.astype(np.float64), 1e-7, 1)
    kl = np.sum(f * (np.log(np.clip(f, 1e-7, 1)) - np.log(q)), axis=1)
    # Measured with SMALL: mean KL ~0.1 nats, agreement ~0.96; a broken head gives KL > 1.
    assert kl.mean() < 0.3
    assert np.mean(q.argmax(axis=1) == f.argmax(axis=1)) > 0.9


def test_values_track_exact_shapley(trained: salvage.Trained, held_out: np.ndarray) -> None:
    """Against exact Shapley values of the game the explainer approximates."""
    x = held_out[:2]
    out = salvage_inference.amortized(trained, x)
    for j in range(len(x)):
        game = salvage_inference.surrogate_game(trained, x[j])
        exact = shapley_values(game, 16, estimator="exact")
        c = int(out.surrogate_probs[j].argmax())
        np.testing.assert_allclose(exact.full_value[c], out.full[j, c], atol=1e-4)
        np.testing.assert_allclose(exact.base_value[c], out.base[c], atol=1e-4)
        corr = np.corrcoef(exact.values[:, c], out.values[j, :, c])[0, 1]
        assert corr > 0.7, corr


def test_store_round_trip_and_versions(
    digits: Model, trained: salvage.Trained, held_out: np.ndarray, tmp_path: Path
) -> None:
    artifacts = Artifacts(tmp_path)  # a run context's artifact store: Salvage's under salvage/
    store = SalvageStore.within(artifacts)
    with pytest.raises(NotTrainedError, match="train"):
        SalvageOptions().pinned(store, digits)
    info = store.save(digits, trained)
    assert info.id == trained.id and store.list(digits.name, digits.version)[0].id == info.id
    loaded = SalvageStore.within(artifacts).load(digits, info.id)
    a = salvage_inference.amortized(trained, held_out[:5])
    b = salvage_inference.amortized(loaded, held_out[:5])
    np.testing.assert_array_equal(a.values, b.values)
    opts = SalvageOptions().pinned(store, digits)
    assert opts.artifact == info.id and opts.objective == "distribution"
    with pytest.raises(NotTrainedError):
        SalvageOptions(objective="squared").pinned(store, digits)
    result = explain(
        digits, held_out[:2], options=opts, target=4, context=RunContext(artifacts=artifacts)
    )
    e = result.explanations[0]
    assert e.output_index == 4 and e.n_model_evals == 1 and e.approximation_error < 1e-4
    assert result.player_names[0] == "patch_0_0" and len(e.values) == 16
    assert e.details is not None and len(e.details["explainer_probabilities"]) == 10
    # Another model version (new weights) never sees these artifacts.
    other = Model(**{**digits.__dict__, "version": "another"})
    with pytest.raises(NotTrainedError):
        SalvageOptions().pinned(store, other)
