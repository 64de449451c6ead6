"""`auto` chooses kernel's fit or gp's by measured cost (explainers/estimators/auto.py).

The expensive game is real work: a small torch CNN on 3 x 224 x 224 images, one forward pass
per coalition (several ms on one core); the cheap one a numpy MLP (microseconds a coalition).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from explainers.estimators import auto
from explainers.estimators.library import shapley_values, shapley_values_chosen


def cnn_game(side: int = 224, patch: int = 32, seed: int = 0):  # type: ignore[no-untyped-def]
    """Patches of an image (zero baseline) -> a random CNN's first logit. 49 players."""
    gen = torch.Generator().manual_seed(seed)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 5, stride=2),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, stride=2),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(4),
        torch.nn.Flatten(),
        torch.nn.Linear(256, 2),
    ).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    image = torch.rand((3, side, side), generator=gen)
    cells = side // patch
    n = cells * cells

    def game(masks: np.ndarray) -> np.ndarray:
        keep = torch.from_numpy(masks.reshape(-1, 1, cells, cells).astype(np.float32))
        keep = keep.repeat_interleave(patch, 2).repeat_interleave(patch, 3)
        out = []
        with torch.no_grad():
            for start in range(0, len(keep), 64):
                out.append(net(image[None] * keep[start : start + 64])[:, 0])
        return torch.cat(out).double().numpy()

    return game, n


def mlp_game(n: int = 30, seed: int = 0):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    w1, w2 = rng.normal(size=(n, 16)), rng.normal(size=16)

    def game(masks: np.ndarray) -> np.ndarray:
        return np.tanh(masks.astype(np.float64) @ w1) @ w2

    return game, n


@pytest.fixture(autouse=True)
def _measured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(auto.ENV, raising=False)


def test_expensive_cnn_gets_gp_and_says_why() -> None:
    torch.set_num_threads(1)
    game, n = cnn_game()
    budget = 8 * n  # 392 coalitions: sampled (2^49), from 3n (not gp by the static rule)
    est, details = shapley_values_chosen(game, n, budget=budget, seed=3)
    assert details is not None and details["measured"]
    # real work (about 1 ms a pass on one core here; the bound leaves room for faster cores),
    # and the choice is the rule's at what was measured
    assert details["cost_per_coalition_s"] >= 1e-4, details
    again = auto.decide(
        details["cost_per_coalition_s"], budget, n, slowness=details["machine_slowness"]
    )
    assert again.chosen == "gp", again
    assert est.estimator == details["chosen"] == "gp", details
    assert details["predicted_gp_rmse_vs_kernel"] < 1.0
    assert "equal wall time" in details["reason"]
    assert details["coalitions"] == est.n_coalitions == budget
    # the same coalitions and fit as gp by name: only the choice depends on the clock
    named = shapley_values(game, n, estimator="gp", budget=budget, seed=3)
    np.testing.assert_allclose(est.values, named.values, rtol=1e-9, atol=1e-12)


def test_cheap_mlp_keeps_kernel() -> None:
    game, n = mlp_game()
    est, details = shapley_values_chosen(game, n, seed=1)  # default budget 2n + 2048
    assert details is not None and details["measured"]
    assert details["cost_per_coalition_s"] < 1e-4, details
    assert est.estimator == details["chosen"] == "kernel", details
    assert details["predicted_own_s"]["gp"] > 10 * details["predicted_own_s"]["kernel"]
    named = shapley_values(game, n, estimator="kernel", seed=1)
    np.testing.assert_allclose(est.values, named.values, rtol=1e-9, atol=1e-12)


def test_forced_static_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(auto.ENV, "0")
    game, n = cnn_game(side=64, patch=16)  # 16 players
    est, details = shapley_values_chosen(game, n, budget=8 * n, seed=0)
    assert est.estimator == "kernel"
    assert details is not None and details["chosen"] == "kernel" and not details["measured"]
    assert "AUTO_COST=0" in details["reason"]


def test_static_choices_say_why() -> None:
    game, n = mlp_game(n=8)
    est, details = shapley_values_chosen(game, n, seed=0)
    assert est.estimator == "exact" and details is not None and not details["measured"]
    game, n = mlp_game(n=30)
    est, details = shapley_values_chosen(game, n, budget=2 * n, seed=0)
    assert est.estimator == "gp" and details is not None and "3n" in details["reason"]
    _, by_name = shapley_values_chosen(game, n, estimator="kernel", budget=4 * n, seed=0)
    assert by_name is None


@pytest.mark.parametrize(("cost", "chosen"), [(5e-6, "kernel"), (3e-5, "kernel"), (2e-3, "gp")])
def test_decide_rule(cost: float, chosen: str) -> None:
    choice = auto.decide(cost, 2108, 30)
    assert choice.chosen == chosen, choice.reason
    # gp's coalitions at equal wall time never exceed the budget and grow with the cost
    assert 0 <= choice.gp_coalitions_at_equal_time <= 2108


def test_decide_deadline_keeps_kernel() -> None:
    choice = auto.decide(2e-3, 2108, 30, left=0.05)
    assert choice.chosen == "kernel" and "deadline" in choice.reason


def test_own_time_model_monotone_in_coalitions() -> None:
    for fit in ("kernel", "gp"):
        times = [auto.own_seconds(fit, m, 32) for m in (64, 256, 1024, 2560)]
        assert times == sorted(times)
    assert auto.rmse_ratio(64 * 16, 16) < auto.rmse_ratio(4 * 16, 16) < 1.0


@pytest.mark.parametrize("name", ["breast-cancer-mlp", "digits-cnn"])
def test_builtin_models_choose_by_the_rule_with_details(name: str, model_dir) -> None:  # type: ignore[no-untyped-def]
    """The service's default request on a built-in model: the fit the rule gives at the cost
    measured, and details.auto says why. (digits-cnn, 0.01 ms a coalition, keeps kernel;
    breast-cancer-mlp, 0.04-0.09 ms with its background, sits at the switch since issue 30's
    screened gp: kernel or gp by the machine's load.)"""
    from explainers.shapley import explainer as shapley
    from models.builtin.trained import dataset_split
    from models.registry import ModelRegistry

    torch.set_num_threads(1)
    model = ModelRegistry(model_dir).get(name)
    x = dataset_split(name).x_test[:1]
    result = shapley.explain(model, x, options=shapley.ShapleyOptions(), seed=0)
    explanation = result.explanations[0]
    assert explanation.details is not None
    details = explanation.details["auto"]
    assert explanation.estimator == details["chosen"] in ("kernel", "gp"), details
    assert details["reason"].startswith(details["chosen"] + ":")
    # measured, not asserted against a wall time (this machine's load moves it): the choice
    # is the rule's at what was measured
    assert details["measured"] and details["cost_per_coalition_s"] > 0
    again = auto.decide(
        details["cost_per_coalition_s"],
        details["coalitions"],
        np.asarray(explanation.values).shape[0],
        slowness=details["machine_slowness"],
    )
    assert again.chosen == details["chosen"]
    if details["cost_per_coalition_s"] < 1e-5:  # far below the switch (about 0.03 ms)
        assert details["chosen"] == "kernel"
    assert 0 < details["coalitions"] <= explanation.n_model_evals <= result.budget


def test_own_times_scale_with_machine_slowness() -> None:
    """A slower machine (the probe takes longer) makes gp's own time dearer: at a cost per
    coalition where gp pays on OWN_S's machine, kernel answers on a machine 5x slower, and the
    choice says how slow it measured the machine."""
    fast = auto.decide(2e-3, 2108, 30, slowness=1.0)
    slow = auto.decide(2e-3, 2108, 30, slowness=5.0)
    assert fast.own_s["gp"] == pytest.approx(slow.own_s["gp"] / 5)
    assert slow.gp_coalitions_at_equal_time < fast.gp_coalitions_at_equal_time
    costs = np.geomspace(1e-5, 1e-2, 40)
    switch = {
        s: min(c for c in costs if auto.decide(float(c), 2108, 30, slowness=s).chosen == "gp")
        for s in (0.5, 1.0, 4.0)
    }
    assert switch[0.5] < switch[1.0] < switch[4.0]
    assert slow.as_dict()["machine_slowness"] == 5.0


def test_machine_speed_probe_is_cached_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """speed() times the probe at most every PROBE_EVERY_S seconds and clamps its ratio."""
    calls: list[float] = []
    real = auto.probe

    def timed_probe() -> float:
        calls.append(real())
        return calls[-1]

    monkeypatch.setattr(auto, "_speed", None)
    monkeypatch.setattr(auto, "probe", timed_probe)
    first = auto.speed(now=1000.0)
    assert auto.speed(now=1000.0 + auto.PROBE_EVERY_S / 2) == first and len(calls) == 1
    auto.speed(now=1000.0 + 2 * auto.PROBE_EVERY_S)
    assert len(calls) == 2
    low, high = auto.SPEED_BOUNDS
    assert low <= first <= high
    monkeypatch.setattr(auto, "contention", lambda: 1.0)  # an idle machine: the probe alone
    monkeypatch.setattr(auto, "_speed", None)
    alone = auto.speed(now=5000.0)
    assert alone == pytest.approx(np.clip(calls[-1] / auto.PROBE_REF_S, low, high))
    monkeypatch.setattr(auto, "contention", lambda: 3.0)  # 3 runnable threads per core
    monkeypatch.setattr(auto, "_speed", None)
    loaded = auto.speed(now=6000.0)
    assert loaded == pytest.approx(np.clip(calls[-1] / auto.PROBE_REF_S * 3.0, low, high))
    assert 0 < calls[0] < 1.0  # a few milliseconds of linear algebra, not a stall


def test_a_measured_choice_is_kept_for_its_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same request gets the same fit when the machine's load moves: the first measured
    decision for a key answers every later request with that key (an audit's rows, a
    dashboard's repeats); another key measures its own; a deadline's choice is not kept."""
    monkeypatch.setattr(auto, "_decided", type(auto._decided)())
    game, n = mlp_game()
    budget = 8 * n
    key = ("onnx-mlp", "v1", n, budget, 1)
    _, first = shapley_values_chosen(game, n, budget=budget, seed=1, remember=key)
    assert first is not None and first["chosen"] == "kernel" and first["decided"] == "measured"
    # the machine now reads 5x slower and the model 100x costlier: unkept, auto would flip
    monkeypatch.setattr(auto, "speed", lambda now=None: 5.0)
    slow_game = _slowed(game, 3e-3)
    est, again = shapley_values_chosen(slow_game, n, budget=budget, seed=1, remember=key)
    assert again is not None and again["decided"] == "remembered"
    assert again["chosen"] == est.estimator == "kernel"
    assert again["cost_per_coalition_s"] == first["cost_per_coalition_s"]  # what decided
    _, other = shapley_values_chosen(
        slow_game, n, budget=budget, seed=1, remember=("onnx-mlp", "v2", n, budget, 1)
    )
    assert other is not None and other["decided"] == "measured" and other["chosen"] == "gp"
    _, unkept = shapley_values_chosen(slow_game, n, budget=budget, seed=1)
    assert unkept is not None and "decided" not in unkept


def _slowed(game, seconds_per_coalition: float):  # type: ignore[no-untyped-def]
    """The game with a real wait per coalition (a costlier model)."""
    import time

    def slow(masks: np.ndarray) -> np.ndarray:
        time.sleep(seconds_per_coalition * len(masks))
        return game(masks)

    return slow
