"""Owen values (estimator partition) against their definition, Shapley values and shap.

Ground truth: Owen's value as the mean marginal contribution over the orders in which every
node's players come together (Owen 1977; Winter 1989 for several levels), enumerated over all
n! orders for n <= 8; exact Shapley values for a flat hierarchy; shap's PartitionExplainer on
the same model, background and tree.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import numpy as np
import pytest

from explainers import shapley_values
from explainers.estimators import partition as partition_estimator
from explainers.estimators.registry import choose_estimator
from explainers.explanation import OptionError
from explainers.games import BudgetError, GameRecorder
from explainers.games import hierarchy as hier
from explainers.games.text import TextGame, text_games, word_spans
from explainers.shapley.explainer import ShapleyOptions, explain

shap = pytest.importorskip("shap")


class Game:
    """A batched game over n players with an optional hierarchy, counting coalitions."""

    def __init__(self, f: Any, n: int, hierarchy: Any = None) -> None:
        self.f, self.n, self.hierarchy, self.calls, self.rows = f, n, hierarchy, 0, 0

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        self.calls += 1
        self.rows += len(masks)
        return np.asarray(self.f(np.asarray(masks, dtype=bool)), dtype=np.float64)


def product_game(n: int, seed: int) -> Any:
    """Non-additive: sums, a product of three players, a threshold and a max, two outputs."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=n)
    a, b, c = rng.choice(n, size=3, replace=False)

    def f(m: np.ndarray) -> np.ndarray:
        m = m.astype(np.float64)
        first = m @ w + 2.0 * m[:, a] * m[:, b] * m[:, c] + (m.sum(1) >= n / 2) * 1.5
        second = np.max(m * w, axis=1) - 0.7 * m[:, a] * (1 - m[:, b])
        return np.stack([first, second], axis=1)

    return f


def owen_by_orders(f: Any, n: int, h: Any) -> np.ndarray:
    """Mean marginal contribution over every order in which each node's players are
    contiguous (the orders consistent with the hierarchy). [n, k]"""
    nodes: list[list[int]] = []

    def collect(x: Any) -> list[int]:
        if isinstance(x, int):
            return [x]
        members = [p for child in x for p in collect(child)]
        nodes.append(members)
        return members

    collect(h)
    orders = []
    for perm in itertools.permutations(range(n)):
        pos = np.empty(n, dtype=np.int64)
        pos[list(perm)] = np.arange(n)
        if all(pos[g].max() - pos[g].min() == len(g) - 1 for g in nodes):
            orders.append(perm)
    orders_a = np.asarray(orders)  # [o, n]
    steps = np.arange(n + 1)[None, :, None]
    pos = np.argsort(orders_a, axis=1)  # rank of each player
    masks = pos[:, None, :] < steps  # prefixes [o, n + 1, n]
    v = f(masks.reshape(-1, n)).reshape(len(orders_a), n + 1, -1)
    deltas = v[:, 1:] - v[:, :-1]  # [o, n, k]: step j adds orders[:, j]
    out = np.zeros((n, v.shape[2]))
    for j in range(n):
        np.add.at(out, orders_a[:, j], deltas[:, j])
    return out / len(orders_a)


HIERARCHIES = [
    ((0, 1), (2, 3)),
    ((0, 1, 2), (3, 4)),
    (((0, 1), 2), ((3, 4), 5), 6),
    (((0, 4), (1, 5)), ((2, 6), (3, 7))),
    ((0, (1, 2, 3)), (4, 5, (6, 7))),
    hier.sequence(7),
]


@pytest.mark.parametrize("h", HIERARCHIES, ids=[str(h) for h in HIERARCHIES])
def test_equals_owen_values_by_enumeration(h: Any) -> None:
    n = len(hier.players_of(h))
    f = product_game(n, seed=n)
    game = Game(f, n, h)
    est = shapley_values(game, n, estimator="partition", budget=1 << n)
    truth = owen_by_orders(f, n, h)
    np.testing.assert_allclose(est.values, truth, atol=1e-12)
    assert est.exact and est.index == "Owen" and est.error_std is None and not est.warnings
    # every coalition is distinct and paid once, as exact_cost says
    assert est.n_coalitions == game.rows == partition_estimator.exact_cost(h)
    np.testing.assert_allclose(est.efficiency_gap, 0, atol=1e-12)


def test_owen_values_differ_from_shapley_values_on_a_non_additive_game() -> None:
    """The ground truth is not Shapley in disguise: the hierarchy changes the answer."""
    h, n = (((0, 4), (1, 5)), ((2, 6), (3, 7))), 8
    f = product_game(n, seed=3)
    owen = shapley_values(Game(f, n, h), n, estimator="partition", budget=1 << n).values
    sv = shapley_values(Game(f, n), n, estimator="exact").values
    assert np.max(np.abs(owen - sv)) > 1e-2


@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_flat_hierarchy_gives_exact_shapley_values(n: int) -> None:
    f = product_game(max(n, 3), seed=1)
    if n < 3:

        def g(m: np.ndarray) -> np.ndarray:
            return f(np.pad(m, ((0, 0), (0, 3 - n)), constant_values=True))
    else:
        g = f
    est = shapley_values(Game(g, n, hier.flat(n)), n, estimator="partition", budget=1 << n)
    sv = shapley_values(Game(g, n), n, estimator="exact")
    np.testing.assert_allclose(est.values, sv.values, atol=1e-12)
    assert est.exact and est.n_coalitions <= 1 << n


def test_additive_game_gives_its_weights_for_any_hierarchy() -> None:
    w = np.arange(1.0, 11.0)
    game = Game(lambda m: m @ w + 3.0, 10)
    for h in (hier.sequence(10), hier.spatial(np.random.default_rng(0).random((10, 2)))):
        game.hierarchy = h
        est = shapley_values(game, 10, estimator="partition", budget=1 << 10)
        np.testing.assert_allclose(est.values, w, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_efficiency_on_random_games_at_any_budget(seed: int) -> None:
    """Exact or truncated, the values add up to v(all) - v(none) for every output."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(6, 40))
    w = rng.normal(size=(n, 3))
    pairs = rng.normal(size=(n, n)) / n

    def f(m: np.ndarray) -> np.ndarray:
        x = m.astype(np.float64)
        quad = np.einsum("mi,ij,mj->m", x, pairs, x)
        return np.tanh(x @ w) + quad[:, None] * np.array([1.0, -2.0, 0.5])

    full = partition_estimator.exact_cost(hier.sequence(n))
    for budget in (4, 10, 57, full - 1, full, full + 100):
        est = shapley_values(Game(f, n), n, estimator="partition", budget=budget)
        np.testing.assert_allclose(est.efficiency_gap, 0, atol=1e-10)
        assert est.n_coalitions <= budget
        assert est.exact == (budget >= full)
        codes = [c.code for c in est.warnings]
        assert codes == ([] if est.exact else ["partition_truncated"])


def test_truncated_answers_approach_the_exact_owen_values() -> None:
    """Under a budget the best-first refinement is coarse, never a sampling estimate: error
    decreases as the budget grows towards the exact cost, and no error_std is claimed."""
    n = 32
    rng = np.random.default_rng(5)
    w = rng.normal(size=n) * (rng.random(n) < 0.3)

    def f(m: np.ndarray) -> np.ndarray:
        x = m.astype(np.float64)
        return np.tanh(x @ w) + x[:, 3] * x[:, 17]

    h = hier.sequence(n)
    full = partition_estimator.exact_cost(h)
    truth = shapley_values(Game(f, n), n, estimator="partition", budget=full).values
    errors = []
    for budget in (16, 64, 256, full // 2):
        est = shapley_values(Game(f, n), n, estimator="partition", budget=budget)
        assert not est.exact and est.error_std is None
        errors.append(float(np.abs(est.values - truth).max()))
    assert errors[-1] < errors[0] and errors[-1] < 0.25 * errors[0]


def test_levels_are_batched_and_cost_is_quadratic_not_exponential() -> None:
    n = 64
    game = Game(lambda m: m.astype(np.float64) @ np.arange(n), n)
    cost = partition_estimator.exact_cost(hier.sequence(n))
    assert cost == 2 + 2 * (4**6 - 1) // 3  # 2n^2/3 for a balanced binary tree
    est = shapley_values(game, n, estimator="partition", budget=cost)
    assert est.exact and game.calls == 1 + hier.depth(hier.sequence(n))  # ends, then a level
    np.testing.assert_allclose(est.values, np.arange(n), atol=1e-9)


def test_exact_cost_counts_wide_nodes() -> None:
    # root of 3 children: 6 new coalitions; each child visited 4 times, a pair costs 2
    assert partition_estimator.exact_cost(((0, 1), (2, 3), 4)) == 2 + 6 + 2 * 4 * 2
    assert partition_estimator.exact_cost(hier.flat(6)) == 1 << 6


# --- shap's PartitionExplainer on the same model, masker and tree ---------------------------


class Net:
    """A fixed random tanh network R^d -> R^2 (float64)."""

    def __init__(self, d: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.w1 = rng.normal(size=(d, 12)) / np.sqrt(d)
        self.w2 = rng.normal(size=(12, 2))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
        return np.tanh(x @ self.w1) @ self.w2 + x[:, :1] * x[:, 1:2]


def background_game(model: Any, x: np.ndarray, background: np.ndarray) -> Any:
    def f(m: np.ndarray) -> np.ndarray:
        rows = np.where(m[:, None, :], x[None, None, :], background[None, :, :])  # [m, r, d]
        return model(rows.reshape(-1, x.size)).reshape(len(m), len(background), -1).mean(1)

    return f


def test_equals_shap_partition_explainer_on_a_clustered_tabular_model() -> None:
    from scipy.cluster.hierarchy import linkage

    d = 8
    rng = np.random.default_rng(2)
    data = rng.normal(size=(30, d))
    data[:, 4] = data[:, 0] + 0.1 * rng.normal(size=30)  # correlated: clustered together
    z = linkage(data.T, method="average")
    h = hier.from_linkage(z)
    x = rng.normal(size=d)
    model = Net(d)
    masker = shap.maskers.Partition(data, clustering=z)
    theirs = shap.PartitionExplainer(model, masker)(x[None], max_evals=5000, silent=True)
    est = shapley_values(
        Game(background_game(model, x, data), d, h), d, estimator="partition", budget=5000
    )
    assert est.exact
    np.testing.assert_allclose(est.values, theirs.values[0], atol=1e-6)
    np.testing.assert_allclose(est.base_value, theirs.base_values[0], atol=1e-6)
    # and this is Owen, not Shapley: the two differ on this tree
    sv = shapley_values(Game(background_game(model, x, data), d), d, estimator="exact")
    assert np.max(np.abs(sv.values - est.values)) > 1e-3


@pytest.mark.parametrize("shape", [(4, 4, 1), (2, 8, 1), (4, 4, 2)])
def test_equals_shap_on_the_image_maskers_tree(shape: tuple[int, int, int]) -> None:
    """shap.maskers.Image halves the image along its longer side; `spatial` over the pixel
    centres builds the same tree for one channel, and the values agree with shap's."""
    d = int(np.prod(shape))
    rng = np.random.default_rng(d)
    x = rng.random(shape)
    baseline = np.full(shape, 0.25)
    model = Net(d, seed=1)
    masker = shap.maskers.Image(baseline, shape)
    theirs = shap.PartitionExplainer(model, masker)(x[None], max_evals=20000, silent=True)
    h = hier.from_linkage(masker.clustering)
    if shape[2] == 1:
        centres = np.array([[r, c] for r in range(shape[0]) for c in range(shape[1])])
        assert canonical(hier.spatial(centres)) == canonical(h)
    flat_x, flat_b = x.reshape(-1), baseline.reshape(-1)

    def f(m: np.ndarray) -> np.ndarray:
        return model(np.where(m, flat_x, flat_b))

    est = shapley_values(Game(f, d, h), d, estimator="partition", budget=20000)
    assert est.exact
    np.testing.assert_allclose(est.values, theirs.values[0].reshape(d, -1), atol=1e-6)


def canonical(h: Any) -> Any:
    if isinstance(h, int):
        return h
    kids = [canonical(c) for c in h]
    return tuple(
        sorted(kids, key=lambda k: min(hier.players_of(k) if not isinstance(k, int) else [k]))
    )


# --- hierarchies ------------------------------------------------------------------------------


def test_hierarchy_builders_and_validation() -> None:
    assert hier.sequence(5) == ((0, 1), (2, (3, 4)))
    assert hier.sequence(1) == (0,) and hier.flat(3) == (0, 1, 2)
    grid = np.array([[r, c] for r in range(2) for c in range(4)])  # wider than tall: cols first
    assert hier.spatial(grid) == (((0, 1), (4, 5)), ((2, 3), (6, 7)))
    for h in (hier.sequence(37), hier.spatial(np.random.default_rng(1).random((37, 2)))):
        assert sorted(hier.players_of(h)) == list(range(37)) and hier.validate(h, 37) == h
    # a balanced tree: depth ceil(log2 n)
    assert hier.depth(hier.spatial(np.random.default_rng(2).random((64, 2)))) == 6
    for bad in [((0, 1), (1, 2)), ((0, 1), 3), ((0,), (1, 2)), (0, (1, 2, 2))]:
        with pytest.raises(OptionError):
            hier.validate(bad, 3)
    with pytest.raises(OptionError):
        hier.spatial(np.zeros((4, 3)))


def test_wide_nodes_and_budgets_are_checked() -> None:
    n = 20
    with pytest.raises(OptionError, match="children"):
        shapley_values(Game(lambda m: m.sum(1), n, hier.flat(n)), n, estimator="partition")
    wide = Game(lambda m: m.sum(1), 6, hier.flat(6))
    with pytest.raises(BudgetError, match="root take 64"):
        shapley_values(wide, 6, estimator="partition", budget=10)
    assert wide.rows == 0  # refused before any model call
    with pytest.raises(BudgetError):
        choose_estimator("partition", 8, 3)
    with pytest.raises(OptionError, match="target_se"):
        shapley_values(Game(lambda m: m.sum(1), 6), 6, estimator="partition", target_se=0.1)


def test_auto_never_picks_partition_and_defaults_accept_it() -> None:
    from explainers.estimators.budget import default_budget

    for n in (3, 12, 64, 300):
        for budget in (64, 4096, 1 << 20):
            with contextlib.suppress(BudgetError):  # too small for auto's own choice
                assert choose_estimator("auto", n, budget) != "partition"
        assert choose_estimator("partition", n, default_budget(n, 1, "partition")) == "partition"
    assert ShapleyOptions(estimator="partition").estimator == "partition"


def test_the_recorder_exposes_the_games_hierarchy() -> None:
    game = Game(lambda m: m.sum(1), 4, ((0, 1), (2, 3)))
    assert GameRecorder(game, 4).hierarchy == ((0, 1), (2, 3))
    assert GameRecorder(lambda m: m.sum(1), 4).hierarchy is None


def test_the_deadline_gives_an_efficient_partial_answer() -> None:
    from explainers.games import deadline

    n = 64
    calls = {"n": 0}

    def f(m: np.ndarray) -> np.ndarray:
        calls["n"] += 1
        if calls["n"] == 3:  # the third model call finds the time limit passed
            import time

            time.sleep(0.05)
        x = m.astype(np.float64)
        return np.tanh(x @ np.linspace(-1, 1, n))

    import time

    with deadline(time.monotonic() + 0.04):
        est = shapley_values(Game(f, n), n, estimator="partition", budget=1 << 20)
    assert est.partial and not est.exact
    assert [c.code for c in est.warnings] == ["partition_truncated"]
    np.testing.assert_allclose(est.efficiency_gap, 0, atol=1e-10)


# --- text ----------------------------------------------------------------------------------


def test_text_games_carry_a_word_hierarchy() -> None:
    text = "The movie was not good at all , sadly"
    game = TextGame(
        lambda ts: np.array([[len(t)] for t in ts], dtype=float), text, word_spans(text)
    )
    assert game.hierarchy == hier.sequence(game.n_players)


@pytest.mark.usefixtures("one_torch_thread")
def test_a_text_model_answers_owen_values_over_its_words(text_model: Any) -> None:
    """sentiment-minilm over 7 words: the default budget covers the word tree (exact), the
    values are efficient and equal Owen values by enumeration of the same word game."""
    texts = np.array(["Slow start, but the ending was wonderful."])
    (game,) = text_games(text_model, texts)
    n = game.n_players
    assert n == 7 and game.hierarchy == hier.sequence(7)
    result = explain(text_model, texts, options=ShapleyOptions(estimator="partition"))
    (e,) = result.explanations
    assert e.estimator == "partition" and e.exact and len(e.values) == n
    assert result.parameters["estimator"] == "partition"
    assert abs(e.values.sum() + e.base_value - e.instance_output_value) < 1e-5
    truth = owen_by_orders(game, n, game.hierarchy)  # the game predicts each text once
    np.testing.assert_allclose(e.values, truth[:, e.output_index], atol=1e-5)
