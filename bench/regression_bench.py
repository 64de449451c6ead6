"""Cubic-surrogate-adjusted KernelSHAP (`surrogate_kernel`, issues 17 and 28) and gp: ours against
shap KernelExplainer and shapiq KernelSHAP at equal coalitions, on games with exact (or
long-run reference) Shapley values.

    .venv/bin/python bench/regression_bench.py [--games tanh16,digits2,breast] [--seeds 4]
        [--count 3] [--more-peers]
    .venv/bin/python bench/regression_bench.py --games sentiment --count 4 --seeds 3
    .venv/bin/python bench/regression_bench.py --jackknife [--games tanh16] [--seeds 8]
    .venv/bin/python bench/regression_bench.py --games heldout --count 2 --seeds 8

The held-out protocol (issue 28, bench/protocol.py): per family and budget, RMSE over every
(explicand, seed) answer, ratio to the best peer (shap KernelExplainer, shapiq KernelSHAP,
shapiq kADDSHAP order 2) with a 90% paired bootstrap interval over answers; shares within 2
error_std with a 90% Wilson interval. Families are labelled "tuned-on" (tanh16, digits2,
digits1, breast, sentiment: gp's prior and misfit rule and surrogate_kernel's surrogate were
designed on them) or "held-out" (`heldout`: tests/explainers/heldout_games.py, threshold, max,
product and tree, `--count` instances each). Games of at most 16 players are enumerated once
into a table that every contender reads (same values; the model's time is then the measured
enumeration time per coalition times the coalitions, labelled so).

--jackknife: surrogate_kernel's two error bars on the same draws, the surrogate refitted in
every delete-a-group replicate (the estimator) and held fixed (`fixed`, before issue 28: only
the residual's KernelSHAP is refitted): share within 2 error_std and own time of each; no peers.

Ours: kernel (KernelSHAP), surrogate_kernel (cubic surrogate + cross-fitted KernelSHAP residual,
inspired by Witter et al. 2025; once called `regression`), gp
(Gaussian-process posterior on a Möbius kernel). Games: tanh16, digits2, digits1, breast,
sentiment (sentiment-minilm's word players, the service's text game, exact values). Every
contender sees the same game (bool masks -> values); shap and shapiq get it as a function on
the mask space (KernelExplainer: explicand = all ones, background = one all-zeros row,
nsamples = coalitions - 2 as it evaluates v(empty) and v(full) besides), so coalitions are
counted alike; a budget of 2^n or more is capped at 2^n - 2. One thread for torch and BLAS.
Prints, per game and budget: mean
RMSE against the exact values, the ratio of ours to the best peer, the share of values within
2 error_std of exact (calibration), and ours' own time against the model's time.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

torch.set_num_threads(1)
threadpool_limits(limits=1)

import shap  # noqa: E402
import shapiq  # noqa: E402

from bench.protocol import Ratio, ratio_interval, wilson  # noqa: E402
from explainers import shapley_values  # noqa: E402
from explainers.games.masked import MaskedModelGame, patch_groups  # noqa: E402

warnings.filterwarnings("ignore", module="shapiq")
warnings.filterwarnings("ignore", category=UserWarning, module="shap")

MULTIPLES = [2, 4, 8, 16, 32, 64]  # budgets: coalitions per player
OURS = ("kernel", "surrogate_kernel", "gp")
FIXED = "surrogate_kernel fixed"  # --jackknife: the surrogate held fixed in the jackknife
MORE_PEERS = False  # --more-peers: shapiq ProxySPEX, SPEX, SVARM too (not in "best peer")
# Cases of at most 16 players answer their table (`Tabulated`) when True (this script's main);
# False for other scripts (auto_bench, gp_interactions_*), which call the real game.
TABULATE = False
Case = tuple[
    str, Callable[[np.ndarray], np.ndarray], int, int, np.ndarray
]  # name, game, n, out, phi


class Timed:
    """A game that counts coalitions and the seconds spent inside it (`seconds`), and the model's
    time (`model_seconds`: the same, or for a `Tabulated` game its enumeration time per coalition
    times the coalitions read)."""

    def __init__(self, game: Callable[[np.ndarray], np.ndarray], cost: int = 1) -> None:
        self.game, self.rows_per_coalition = game, cost
        self.seconds, self.model_seconds, self.coalitions = 0.0, 0.0, 0
        self.per_coalition = getattr(game, "seconds_per_coalition", None)

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        out = np.asarray(self.game(masks))
        took = time.perf_counter() - t0
        self.seconds += took
        self.model_seconds += took if self.per_coalition is None else self.per_coalition * len(out)
        self.coalitions += len(masks)
        return out


class Tabulated:
    """A game of at most 16 players enumerated once: every later call reads the table (the same
    values for every contender, without the model's cost)."""

    def __init__(
        self,
        game: Callable[[np.ndarray], np.ndarray],
        n: int,
        chunk: int = 4096,
        cache: Path | None = None,
    ) -> None:
        self.n = n
        self.rows_per_coalition = int(getattr(game, "rows_per_coalition", 1))
        self.bits = 1 << np.arange(n, dtype=np.int64)
        if cache is not None and cache.exists():
            with np.load(cache) as f:
                self.table, self.seconds_per_coalition = f["table"], float(f["seconds"])
            return
        index = np.arange(1 << n, dtype=np.int64)
        t0 = time.perf_counter()
        parts = []
        for start in range(0, len(index), chunk):
            masks = ((index[start : start + chunk, None] >> np.arange(n)) & 1).astype(bool)
            out = np.asarray(game(masks), dtype=np.float64)
            parts.append(out.reshape(len(masks), -1))
        self.seconds_per_coalition = (time.perf_counter() - t0) / len(index)
        self.table = np.concatenate(parts)
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            np.savez(cache, table=self.table, seconds=self.seconds_per_coalition)

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        return self.table[np.asarray(masks, dtype=bool).astype(np.int64) @ self.bits]


def exact_of(game: Callable[[np.ndarray], np.ndarray], n: int) -> tuple[Tabulated, np.ndarray]:
    """The game tabulated and its exact Shapley values [n, outputs] from the table."""
    tab = Tabulated(game, n)
    return tab, np.asarray(shapley_values(tab, n, estimator="exact").values)


def tanh_cases(count: int) -> list[Case]:
    """Interventional games of random 2-layer tanh MLPs: 16 features, 50 background rows."""
    n = 16
    cases: list[Case] = []
    for seed in range(count):
        rng = np.random.default_rng(seed)
        w1 = rng.normal(size=(n, 32)) * 2 / np.sqrt(n)
        b1 = rng.normal(size=32) * 0.5
        w2 = rng.normal(size=(32, 2)) / np.sqrt(32)

        def predict(x: np.ndarray, w1=w1, b1=b1, w2=w2) -> np.ndarray:
            return np.tanh(x.astype(np.float64) @ w1 + b1) @ w2

        game = MaskedModelGame(
            predict, rng.normal(size=n), rng.normal(size=(50, n)), dtype="float64"
        )
        tab, exact = exact_of(game, n)
        cases.append((f"tanh-mlp seed {seed}", tab if TABULATE else game, n, 0, exact[:, 0]))
    return cases


def digits_cases(count: int, patch: int) -> list[Case]:
    """digits-cnn, zero baseline, patches as players, the predicted class; exact values."""
    from app.settings import Settings
    from models.builtin.trained import dataset_split
    from models.registry import ModelRegistry

    model = ModelRegistry(Settings().model_dir).get("digits-cnn")
    groups, names = patch_groups(model.input_shape, patch)
    n = len(names)
    xs = dataset_split("digits-cnn").x_test
    cases: list[Case] = []
    for i in [0, 3, 4][:count]:
        base = np.zeros((1, *model.input_shape), dtype=np.float32)
        game: Callable[[np.ndarray], np.ndarray]
        game = MaskedModelGame(model.predict, xs[i], base, groups, model.batch_size)
        out = int(np.argmax(model.predict(xs[i : i + 1])[0]))
        if n <= 16:
            tab, values = exact_of(game, n)
            game, phi = (tab if TABULATE else game), values[:, out]
        else:  # a long reference run: our kernel at 2^16 coalitions
            phi = shapley_values(game, n, estimator="kernel", budget=1 << 16, seed=99).values[
                :, out
            ]
        cases.append((f"digits-cnn {patch}x{patch} test row {i}", game, n, out, phi))
    return cases


def breast_cases(count: int) -> list[Case]:
    """breast-cancer-mlp, 20 background rows, "benign"; reference: the mean of our kernel and
    our permutation at 2^16 coalitions each (shapley_bench's reference, cached there)."""
    from app.settings import Settings
    from bench.shapley_bench import SAMPLED_BG, SAMPLED_TARGET, reference_values
    from models.builtin.trained import dataset_split
    from models.registry import ModelRegistry

    model = ModelRegistry(Settings().model_dir).get("breast-cancer-mlp")
    xs = dataset_split("breast-cancer-mlp").x_test[:count]
    bg = np.ascontiguousarray(model.background[:SAMPLED_BG])
    cache = ROOT / "bench" / "out" / f"reference_breast-cancer-mlp_bg{SAMPLED_BG}.npz"
    ref = reference_values(model, xs, bg, 1 << 16, cache)
    return [
        (
            f"breast-cancer-mlp test row {i}",
            MaskedModelGame(model.predict, x, bg, max_rows=model.batch_size),
            model.n_features,
            SAMPLED_TARGET,
            ref["values"][i],
        )
        for i, x in enumerate(xs)
    ]


# Neutral-to-mixed sentences of 10 words (the word players), none a prompt or CHECK_SET line.
SENTENCES = (
    "The service was slow, but the food arrived warm enough.",
    "The plot drags in places, yet the ending felt earned.",
    "It works as described, though the battery life is short.",
    "We stayed two nights; the room was small but clean.",
    "The package arrived on Tuesday and contained the usual parts.",
    "Nothing special about the acting, but the music was lovely.",
)


def sentiment_cases(count: int) -> list[Case]:
    """sentiment-minilm, word players, absent words deleted: the game the service's `shapley`
    explainer plays (text_games with its defaults), for the predicted class's probability;
    exact values by full enumeration (2^10 = 1,024 texts per sentence)."""
    from app.settings import Settings
    from explainers.games.text import text_games
    from models.registry import ModelRegistry

    model = ModelRegistry(Settings().model_dir).get("sentiment-minilm")
    cases: list[Case] = []
    for i, game in enumerate(text_games(model, list(SENTENCES[:count]), "words", "delete")):
        n = game.n_players
        tab, values = exact_of(game, n)
        out = int(np.argmax(tab(np.ones((1, n), dtype=bool))[0]))  # no target: predicted class
        name = f"sentiment-minilm words sentence {i}"
        cases.append((name, tab if TABULATE else game, n, out, values[:, out]))
    return cases


SENTENCE14 = "The service was slow, but the food arrived warm and the staff were kind."


def sentence14_game() -> tuple[Tabulated, int]:
    """sentiment-minilm's word game on the 14-word sentence of `auto`'s text rule, tabulated
    (2^14 MiniLM passes, cached in bench/out), and its predicted class."""
    from app.settings import Settings
    from explainers.games.text import text_games
    from models.registry import ModelRegistry

    model = ModelRegistry(Settings().model_dir).get("sentiment-minilm")
    game = next(iter(text_games(model, [SENTENCE14], "words", "delete")))  # type: ignore[arg-type]
    n = game.n_players
    tab = Tabulated(game, n, cache=ROOT / "bench" / "out" / "table_sentiment14.npz")
    return tab, int(np.argmax(tab(np.ones((1, n), dtype=bool))[0]))


def sentence14_cases(count: int) -> list[Case]:
    """The 14-word sentence (one game; `count` is ignored); exact values from its table."""
    tab, out = sentence14_game()
    phi = np.asarray(shapley_values(tab, tab.n, estimator="exact").values)[:, out]
    return [("sentiment-minilm 14 words sentence 0", tab, tab.n, out, phi)]


def heldout_cases(count: int) -> list[Case]:
    """The held-out families of tests/explainers/heldout_games.py (used to tune nothing), `count`
    instances each; exact values by their own enumeration (no code shared with explainers/)."""
    from tests.explainers.heldout_games import FAMILIES, game

    cases: list[Case] = []
    for family in FAMILIES:
        for inst in range(count):
            g = game(family, inst)

            def column(masks: np.ndarray, g: Any = g) -> np.ndarray:
                return np.asarray(g(masks))[:, None]

            tab = Tabulated(column, g.n_players)
            cases.append((f"held-out {family} instance {inst}", tab, g.n_players, 0, g.exact))
    return cases


TUNED_ON = ("tanh-mlp", "digits-cnn", "breast-cancer-mlp", "sentiment-minilm")
PEERS = ("shap Kernel", "shapiq KernelSHAP", "shapiq kADDSHAP")  # "best peer": the best of these


def peers(game: Timed, n: int, out: int) -> dict[str, Callable[[int, int], np.ndarray]]:
    def f(z: np.ndarray) -> np.ndarray:
        return np.asarray(game(np.asarray(z) > 0.5))[:, out]

    kernel_explainer = shap.KernelExplainer(f, np.zeros((1, n)))

    def shap_kernel(coalitions: int, seed: int) -> np.ndarray:
        np.random.seed(seed)
        vals = kernel_explainer.shap_values(  # it evaluates v(empty), v(full) besides
            np.ones(n), nsamples=coalitions - 2, l1_reg=False, silent=True
        )
        return np.asarray(vals).reshape(-1)

    class Wrapped(shapiq.Game):
        def __init__(self) -> None:
            super().__init__(n_players=n, normalize=False)

        def value_function(self, coalitions_: np.ndarray) -> np.ndarray:
            return f(coalitions_)

    def shapiq_kernel(coalitions: int, seed: int) -> np.ndarray:
        approx = shapiq.KernelSHAP(n, pairing_trick=True, random_state=seed)
        return np.asarray(approx.approximate(coalitions, Wrapped()).get_n_order_values(1)).reshape(
            -1
        )

    def shapiq_kadd(coalitions: int, seed: int) -> np.ndarray:
        approx = shapiq.kADDSHAP(n, max_order=2, pairing_trick=True, random_state=seed)
        return np.asarray(approx.approximate(coalitions, Wrapped()).get_n_order_values(1)).reshape(
            -1
        )

    out_: dict[str, Callable[[int, int], np.ndarray]] = {
        "shap Kernel": shap_kernel,
        "shapiq KernelSHAP": shapiq_kernel,
        "shapiq kADDSHAP": shapiq_kadd,
    }
    if MORE_PEERS:
        for label, make in {
            "shapiq ProxySPEX": lambda s: shapiq.ProxySPEX(
                n=n, index="SV", max_order=1, random_state=s
            ),
            "shapiq SPEX": lambda s: shapiq.SPEX(n=n, index="SV", max_order=1, random_state=s),
            "shapiq SVARM": lambda s: shapiq.SVARM(n, "SV", random_state=s, pairing_trick=True),
        }.items():

            def run(coalitions: int, seed: int, make: Any = make) -> np.ndarray:
                try:
                    res = make(seed).approximate(coalitions, Wrapped())
                    return np.asarray(res.get_n_order_values(1)).reshape(-1)
                except Exception:  # a peer that does not run at this budget: no value
                    return np.full(n, np.nan)

            out_[label] = run
    return out_


def run_case(case: Case, seeds: int) -> dict[str, Any]:
    """Per budget and contender: each seed's mean squared error over the players (`sq`, the
    protocol's answers), hits and values within 2 error_std, own and model seconds."""
    name, inner, n, out, exact = case
    cost = int(getattr(inner, "rows_per_coalition", 1))
    game = Timed(inner, cost)
    contenders = peers(game, n, out)
    rows: dict[str, Any] = {}
    for mult in MULTIPLES:
        # A budget of every coalition would be exact enumeration: cap it below 2^n (reported).
        coalitions = min(mult * n, (1 << n) - 2)
        sq: dict[str, list[float]] = {}
        hits: dict[str, list[int]] = {}
        own: dict[str, list[float]] = {}
        model: list[float] = []
        for seed in range(seeds):
            for est in OURS:
                game.seconds = game.model_seconds = 0.0
                t0 = time.perf_counter()
                e = shapley_values(game, n, estimator=est, budget=coalitions * cost, seed=seed)
                wall = time.perf_counter() - t0
                err = e.values[:, out] - exact
                sq.setdefault(f"ours {est}", []).append(float(np.mean(err**2)))
                own.setdefault(est, []).append(wall - game.seconds)
                if est == "kernel":
                    model.append(game.model_seconds)
                if e.error_std is not None:
                    inside = np.abs(err) <= 2 * e.error_std[:, out]
                    counts = hits.setdefault(est, [0, 0])
                    counts[0] += int(inside.sum())
                    counts[1] += n
            for label, call in contenders.items():
                try:
                    vals = call(coalitions, seed)
                    sq.setdefault(label, []).append(float(np.mean((vals - exact) ** 2)))
                except Exception:  # a peer that does not run at this budget: left out
                    sq.setdefault(label, []).append(float("nan"))
        rows[str(mult)] = {
            "coalitions": coalitions,
            "capped": coalitions < mult * n,
            "sq": sq,
            "rmse": {k: float(np.sqrt(np.mean(v))) for k, v in sq.items()},
            "within": hits,
            **{f"{est}_own_seconds": float(np.median(own[est])) for est in OURS},
            "model_seconds": float(np.median(model)),
        }
    return {"case": name, "n": n, "rms_phi": float(np.sqrt(np.mean(exact**2))), "budgets": rows}


def run_jackknife(case: Case, seeds: int) -> dict[str, Any]:
    """surrogate_kernel with the surrogate refitted in the jackknife and held fixed: the same
    draws (seed), so the values agree and only the error bars (and time) differ."""
    from explainers.estimators import regression

    name, inner, n, out, exact = case
    cost = int(getattr(inner, "rows_per_coalition", 1))
    game = Timed(inner, cost)
    rows: dict[str, Any] = {}
    for mult in MULTIPLES:
        coalitions = min(mult * n, (1 << n) - 2)
        cover: dict[str, list[float]] = {}
        own: dict[str, list[float]] = {}
        for seed in range(seeds):
            for label, refit in (("surrogate_kernel", True), (FIXED, False)):
                regression.REFIT_SURROGATE = refit
                game.seconds = 0.0
                t0 = time.perf_counter()
                try:
                    e = shapley_values(
                        game, n, estimator="surrogate_kernel", budget=coalitions * cost, seed=seed
                    )
                finally:
                    regression.REFIT_SURROGATE = True
                own.setdefault(label, []).append(time.perf_counter() - t0 - game.seconds)
                assert e.error_std is not None
                err = e.values[:, out] - exact
                inside = np.abs(err) <= 2 * e.error_std[:, out]
                cover.setdefault(label, []).append(float(np.mean(inside)))
        rows[str(mult)] = {
            "coalitions": coalitions,
            **{f"{k}_within_2_error_std": float(np.mean(v)) for k, v in cover.items()},
            **{f"{k}_own_seconds": float(np.median(v)) for k, v in own.items()},
        }
    return {"case": name, "n": n, "budgets": rows}


def report_jackknife(results: list[dict[str, Any]]) -> None:
    print(
        "\n| game | coalitions | within 2 se, refitted | within 2 se, fixed | own s, refitted "
        "| own s, fixed |"
    )
    print("|---|---|---|---|---|---|")
    for r in results:
        for mult in MULTIPLES:
            b = r["budgets"][str(mult)]
            print(
                f"| {r['case']} | {mult}n = {b['coalitions']} "
                f"| {b['surrogate_kernel_within_2_error_std']:.3f} "
                f"| {b[FIXED + '_within_2_error_std']:.3f} "
                f"| {b['surrogate_kernel_own_seconds']:.3f} | {b[FIXED + '_own_seconds']:.3f} |"
            )


def family_of(case: str) -> str:
    return re.sub(r" (test row|seed|sentence|instance) \d+$", "", case)


def pooled(rs: list[dict[str, Any]], mult: int, est: str) -> Ratio:
    """`ours est` over the best peer, answers pooled over the family's games and seeds."""
    bs = [r["budgets"][str(mult)] for r in rs]
    ours = np.concatenate([b["sq"][f"ours {est}"] for b in bs])
    peer_sq = {p: np.concatenate([b["sq"][p] for b in bs]) for p in PEERS if p in bs[0]["sq"]}
    return ratio_interval(ours, peer_sq)


def share(rs: list[dict[str, Any]], mult: int, est: str) -> str:
    hit = sum(r["budgets"][str(mult)]["within"].get(est, [0, 0])[0] for r in rs)
    total = sum(r["budgets"][str(mult)]["within"].get(est, [0, 0])[1] for r in rs)
    if not total:
        return "-"
    lo, hi = wilson(hit, total)
    return f"{hit / total:.2f} [{lo:.2f}, {hi:.2f}]"


def report(results: list[dict[str, Any]], seeds: int) -> None:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault(family_of(r["case"]), []).append(r)
    for family, rs in groups.items():
        label = "tuned-on" if family.startswith(TUNED_ON) else "held-out"
        print(
            f"\n{family} [{label}] ({rs[0]['n']} players, {len(rs)} games x {seeds} seeds = "
            f"{len(rs) * seeds} answers per cell)"
        )
        print(
            "| coalitions | kernel / best peer [90%] | surrogate_kernel / best peer [90%] "
            "| **gp / best peer** [90%] | best peer (gp's cell) | gp within 2 se [90%] "
            "| surrogate_kernel within 2 se [90%] | gp own s | surrogate_kernel own s | model s |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for mult in MULTIPLES:
            b = [r["budgets"][str(mult)] for r in rs]

            def median(key: str, b: list[dict[str, Any]] = b) -> float:
                return float(np.median([x[key] for x in b]))

            capped = " (capped below 2^n)" if any(x.get("capped") for x in b) else ""
            gp = pooled(rs, mult, "gp")
            print(
                f"| {mult}n = {b[0]['coalitions']}{capped} | {pooled(rs, mult, 'kernel')} | "
                f"{pooled(rs, mult, 'surrogate_kernel')} | **{gp}** | {gp.best} | "
                f"{share(rs, mult, 'gp')} | {share(rs, mult, 'surrogate_kernel')} | "
                f"{median('gp_own_seconds'):.3f} | {median('surrogate_kernel_own_seconds'):.3f} | "
                f"{median('model_seconds'):.3f} |"
            )
        extra = [k for k in rs[0]["budgets"][str(MULTIPLES[0])]["sq"] if k.startswith("shapiq S")]
        extra += [k for k in rs[0]["budgets"][str(MULTIPLES[0])]["sq"] if k == "shapiq ProxySPEX"]
        for name in extra:
            ratios = []
            for mult in MULTIPLES:
                bs = [r["budgets"][str(mult)] for r in rs]
                ours = np.concatenate([x["sq"][name] for x in bs])
                peer_sq = {p: np.concatenate([x["sq"][p] for x in bs]) for p in PEERS}
                ratios.append(str(ratio_interval(ours, peer_sq)))
            print(f"{name} / best peer at {MULTIPLES}n: " + ", ".join(ratios))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--games", default="tanh16,digits2,breast")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--count", type=int, default=3, help="games (explicands) per family")
    parser.add_argument("--more-peers", action="store_true", help="shapiq ProxySPEX, SPEX, SVARM")
    parser.add_argument("--multiples", default="2,4,8,16,32,64", help="coalitions per player")
    parser.add_argument(
        "--jackknife", action="store_true", help="surrogate_kernel's error bar, refit vs fixed"
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "out" / "regression_bench.json"
    )
    args = parser.parse_args()
    global MORE_PEERS, TABULATE, MULTIPLES
    MORE_PEERS, TABULATE = args.more_peers, True
    MULTIPLES = [int(m) for m in args.multiples.split(",")]
    makers = {
        "tanh16": lambda: tanh_cases(args.count),
        "digits2": lambda: digits_cases(args.count, 2),
        "digits1": lambda: digits_cases(args.count, 1),
        "breast": lambda: breast_cases(args.count),
        "sentiment": lambda: sentiment_cases(args.count),
        "heldout": lambda: heldout_cases(args.count),
        "sentence14": lambda: sentence14_cases(args.count),
    }
    results = []
    t0 = time.perf_counter()
    run = run_jackknife if args.jackknife else run_case
    for key in args.games.split(","):
        for case in makers[key]():
            results.append(run(case, args.seeds))
            print(f"  {case[0]} done at {time.perf_counter() - t0:.0f} s", flush=True)
    if args.jackknife:
        report_jackknife(results)
        args.out = args.out.with_name("regression_jackknife.json")
    else:
        report(results, args.seeds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    prior = json.loads(args.out.read_text()) if args.out.exists() else {}
    prior.update({r["case"]: r for r in results})
    args.out.write_text(json.dumps(prior, indent=1))


if __name__ == "__main__":
    main()
