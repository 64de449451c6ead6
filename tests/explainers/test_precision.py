"""Precision targets (target_se) and anytime answers at a deadline, on games with known values."""

from __future__ import annotations

import time

import numpy as np
import pytest

from explainers import shapley_values
from explainers.estimators.budget import TARGET_FACTOR, ceiling, default_budget
from explainers.explanation import OptionError
from explainers.games import DeadlineExceeded, deadline
from tests.explainers.shapley_oracles import TableGame, brute_force_shapley, random_table

SAMPLED = [("permutation", "kernel"), ("kernel", "kernel"), ("kernel", "leverage")]
IDS = ["permutation", "kernel", "kernel-leverage"]


class UnanimityGame:
    """v(S) = w . S + sum_T c_T [T subset of S]; Shapley phi_i = w_i + sum_{T ni i} c_T / |T|."""

    def __init__(self, n: int, seed: int, terms: int = 12) -> None:
        rng = np.random.default_rng(seed)
        self.n = n
        self.w = rng.normal(size=n) * 0.3
        self.sets = [
            rng.choice(n, size=int(rng.integers(2, 6)), replace=False) for _ in range(terms)
        ]
        self.c = rng.normal(size=terms)
        self.rows = 0

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        self.rows += masks.shape[0]
        out = masks.astype(np.float64) @ self.w
        for t, c in zip(self.sets, self.c, strict=True):
            out += c * masks[:, t].all(axis=1)
        return out

    def shapley(self) -> np.ndarray:
        phi = self.w.copy()
        for t, c in zip(self.sets, self.c, strict=True):
            phi[t] += c / len(t)
        return phi


def _within(values: np.ndarray, truth: np.ndarray, se: float) -> np.ndarray:
    return np.abs(values - truth) <= 3 * se


@pytest.mark.parametrize(("estimator", "sampler"), [*SAMPLED, ("auto", "kernel")],
                         ids=[*IDS, "auto"])  # fmt: skip
def test_unanimity_game_within_three_target_se(estimator: str, sampler: str) -> None:
    """20 players, closed-form values: >= 99% of coordinates within 3 target_se over 30 seeds."""
    target = 0.02
    hits, reached = [], []
    for seed in range(30):
        game = UnanimityGame(20, seed=seed % 5)
        est = shapley_values(
            game, 20, estimator=estimator, sampler=sampler, seed=seed, target_se=target
        )
        assert est.precision is not None and est.error_std is not None
        assert est.precision.target_se == target and est.precision.rounds >= 1
        assert est.precision.max_error_std == pytest.approx(float(est.error_std.max()))
        reached.append(est.precision.reached)
        assert est.precision.reached == (est.error_std.max() <= target)
        assert game.rows == est.n_evaluations  # every evaluation counted, the race's included
        np.testing.assert_allclose(est.efficiency_gap, 0.0, atol=1e-9)
        hits.append(_within(est.values, game.shapley(), target))
    assert all(reached)
    rate = float(np.mean(hits))
    assert rate >= 0.99, rate


@pytest.mark.parametrize(
    ("estimator", "sampler", "target"),
    [("permutation", "kernel", 0.15), ("kernel", "kernel", 0.05), ("kernel", "leverage", 0.05)],
    ids=IDS,
)
def test_random_game_against_enumeration(estimator: str, sampler: str, target: float) -> None:
    """n = 12 non-additive game (i.i.d. normal values), exact by enumeration; a budget below 2^12
    keeps the kernel sampling. Over 40 seeds: >= 99% of coordinates within 3 target_se, and 90-99%
    within 2 error_std (the standard errors stay calibrated when the sampling stops itself).
    Measured: all within 3 target_se; 2-error_std coverage 0.93 / 0.95 / 0.96."""
    table = random_table(12, seed=4)
    truth = brute_force_shapley(table)
    hits, covered = [], []
    for seed in range(40):
        est = shapley_values(
            TableGame(table),
            12,
            estimator=estimator,
            sampler=sampler,
            seed=seed,
            target_se=target,
            budget=3000,
        )
        assert est.precision is not None and est.precision.reached
        assert not est.exact and est.error_std is not None
        hits.append(_within(est.values, truth, target))
        covered.append(np.abs(est.values - truth) <= 2 * est.error_std)
    assert float(np.mean(hits)) >= 0.99, np.mean(hits)
    rate = float(np.mean(covered))
    assert 0.90 <= rate <= 0.99, rate


def test_reached_is_false_when_the_budget_runs_out() -> None:
    game = UnanimityGame(20, seed=1)
    for estimator in ("permutation", "kernel", "auto"):
        est = shapley_values(game, 20, estimator=estimator, budget=400, seed=0, target_se=1e-4)
        assert est.precision is not None and est.error_std is not None
        assert not est.precision.reached
        assert est.precision.max_error_std == pytest.approx(float(est.error_std.max()))
        assert est.precision.max_error_std > 1e-4
        assert est.n_evaluations <= 400


def test_the_target_watches_the_explained_output_only() -> None:
    """Two outputs, the second 100x noisier: a target on output 0 stops long before one on all."""
    base = UnanimityGame(16, seed=2)

    def game(masks: np.ndarray) -> np.ndarray:
        v = base(masks)
        return np.stack([v, 100 * v], axis=1)

    one = shapley_values(game, 16, estimator="kernel", seed=0, target_se=0.02, target_output=0)
    every = shapley_values(game, 16, estimator="kernel", seed=0, target_se=0.02, budget=4000)
    assert one.precision is not None and one.precision.reached
    assert one.error_std is not None and one.error_std[:, 0].max() <= 0.02
    assert one.error_std[:, 1].max() > 0.02  # not watched
    assert every.precision is not None and not every.precision.reached
    rule = shapley_values(
        game, 16, estimator="kernel", seed=0, target_se=0.02, target_output=lambda full: 0
    )
    np.testing.assert_array_equal(rule.values, one.values)


@pytest.mark.parametrize("estimator", ["permutation", "kernel", "auto"])
def test_same_seed_same_answer(estimator: str) -> None:
    def once(seed: int):
        return shapley_values(UnanimityGame(18, 3), 18, estimator=estimator, seed=seed,
                              target_se=0.03)  # fmt: skip

    a, b, c = once(5), once(5), once(6)
    np.testing.assert_array_equal(a.values, b.values)
    np.testing.assert_array_equal(a.error_std, b.error_std)
    assert a.n_evaluations == b.n_evaluations and a.precision == b.precision
    assert not np.array_equal(a.values, c.values)


def test_exact_answers_carry_a_reached_precision() -> None:
    table = random_table(8, seed=0)
    est = shapley_values(TableGame(table), 8, seed=0, target_se=0.01)  # auto: 2^8 fits
    assert est.exact and est.precision is not None
    assert est.precision.reached and est.precision.max_error_std == 0.0


def test_target_se_must_be_positive() -> None:
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(OptionError):
            shapley_values(UnanimityGame(5, 0), 5, target_se=bad)


def test_default_budget_with_a_target() -> None:
    """64x the usual default, never below it, at most the ceiling (the service's MAX_BUDGET)."""
    assert default_budget(30, 100, target=True) == TARGET_FACTOR * (2 * 30 + 2048) * 100
    assert default_budget(30, 100, target=True) <= 1 << 24
    with ceiling(500_000):
        assert default_budget(30, 100, target=True) == 5000 * 100
    with ceiling(10):
        assert default_budget(30, 100, target=True) == default_budget(30, 100)
    assert default_budget(30, 1, estimator="exact", target=True) == 1 << 30


@pytest.mark.parametrize(("estimator", "sampler"), SAMPLED, ids=IDS)
def test_rounds_do_not_change_a_complete_answer(estimator: str, sampler: str) -> None:
    """The round schedule depends on the seed and budget only: a far deadline changes nothing."""
    table = random_table(12, seed=2)
    plain = shapley_values(TableGame(table), 12, estimator=estimator, sampler=sampler, budget=1500)
    with deadline(time.monotonic() + 600):
        timed = shapley_values(
            TableGame(table), 12, estimator=estimator, sampler=sampler, budget=1500
        )
    assert not timed.partial
    np.testing.assert_array_equal(plain.values, timed.values)
    np.testing.assert_array_equal(plain.error_std, timed.error_std)


class SlowGame:
    """The unanimity game, sleeping 2 ms per call plus `delay` seconds per coalition (a slow
    model: 60,000 coalitions take 12 s at 2e-4)."""

    def __init__(self, delay: float) -> None:
        self.game = UnanimityGame(16, seed=7)
        self.delay = delay
        self.calls = 0

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        self.calls += 1
        time.sleep(0.002 + self.delay * masks.shape[0])
        return self.game(masks)


@pytest.mark.parametrize(("estimator", "sampler"), SAMPLED, ids=IDS)
def test_deadline_gives_the_anytime_estimate_with_its_error(estimator: str, sampler: str) -> None:
    slow = SlowGame(2e-4)
    with deadline(time.monotonic() + 0.4):
        est = shapley_values(slow, 16, estimator=estimator, sampler=sampler, budget=60_000)
    assert est.partial and not est.exact
    assert est.error_std is not None and np.all(np.isfinite(est.error_std))
    assert est.n_evaluations == slow.game.rows < 60_000  # everything the game received
    np.testing.assert_allclose(est.efficiency_gap, 0.0, atol=1e-9)
    truth = slow.game.shapley()
    # Correct for its sample size: within 5 of its own standard errors (or exact-by-chance).
    assert np.all(np.abs(est.values - truth) <= 5 * est.error_std + 1e-9)


@pytest.mark.parametrize(("estimator", "sampler"), SAMPLED, ids=IDS)
def test_deadline_with_a_target_reports_both(estimator: str, sampler: str) -> None:
    slow = SlowGame(2e-4)
    with deadline(time.monotonic() + 0.3):
        est = shapley_values(
            slow, 16, estimator=estimator, sampler=sampler, budget=60_000, target_se=1e-5
        )
    assert est.partial and est.precision is not None and not est.precision.reached


@pytest.mark.parametrize("estimator", ["permutation", "kernel", "auto"])
def test_deadline_before_any_round_raises(estimator: str) -> None:
    slow = SlowGame(0.0)
    with deadline(time.monotonic() - 1), pytest.raises(DeadlineExceeded):
        shapley_values(slow, 16, estimator=estimator, budget=5000, target_se=0.01)
    assert slow.calls == 0
