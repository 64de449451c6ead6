"""`auto` by measured cost (issue 30): its own-time constants, and its error against peers.

    .venv/bin/python bench/auto_bench.py own                 # auto.OWN_S (own seconds table)
    .venv/bin/python bench/auto_bench.py coalitions --seeds 8   # expensive: equal coalitions
    .venv/bin/python bench/auto_bench.py walltime --seeds 8     # cheap: equal wall time

Peers: shap KernelExplainer, shapiq KernelSHAP and shapiq kADDSHAP (order 2), all with paired
sampling where they have it, on the mask space (explicand all ones, background one all-zeros
row). RMSE against exact values by enumeration. Ratios: auto's mean RMSE over the best peer's
(the peer of smallest mean RMSE per game), geometric mean over games, with a 90% bootstrap
interval over seeds (paired: the same seeds for every contender).

Expensive games (`coalitions`; auto runs on the real model, so its choice is what the service
would make; the peers read the same values from the exact table):
- heldout-remote: the held-out games (tests/explainers/heldout_games.py) behind a stand-in for a
  remote model: time.sleep(1 ms per coalition) per call (a sleep stands for network and server
  time; the values are the game's);
- cnn224: a random torch CNN on 3 x 224 x 224 images, 4 x 3 patches (12 players, zero baseline),
  one real forward pass per coalition (milliseconds on one core);
- sentiment: sentiment-minilm word players (the service's text game; real MiniLM passes);
- mlserver: a real MLServer (mlserver-sklearn, .peers/mlserver from scripts/setup_mlserver.sh)
  serving a scikit-learn MLP and a gradient-boosting regressor on Friedman #1 with 12 features
  (neither family was used to tune anything), called through the service's Open Inference
  Protocol client (models/adapters/remote.py) with a 10-row background: the row's label gives
  the measured seconds per coalition.
Cheap games (`walltime`): the held-out games as they are and 16-feature tanh MLPs with 50
background rows (microseconds per coalition); each peer at 4n..64n coalitions, and auto's
error at its own wall time against each peer's error at the largest budget it finished in that
time (median over seeds; its smallest budget's error when even that one took longer).
One BLAS and one torch thread; the machine is shared with other agents (times are noisy).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from explainers.estimators import auto, gp, kernel  # noqa: E402
from explainers.estimators.library import shapley_values_chosen  # noqa: E402
from explainers.games import GameRecorder, all_masks  # noqa: E402

Z90 = (5.0, 95.0)
Fn = Callable[[int, int], np.ndarray]  # (coalitions, seed) -> values [n]


def own_table(reps: int = 3) -> None:
    """Own seconds of kernel and gp on a near-free game, min of `reps` (auto.OWN_S), with the
    machine probe before and after (auto.PROBE_REF_S: their mean)."""
    before = auto.probe()
    print("players coalitions kernel_s gp_s")
    for n in auto.OWN_PLAYERS:
        rng = np.random.default_rng(0)
        w, pair = rng.normal(size=n), rng.normal(size=(n, n)) / n

        def g(masks: np.ndarray, w: np.ndarray = w, pair: np.ndarray = pair) -> np.ndarray:
            z = masks.astype(float)
            return np.tanh(z @ w + ((z @ pair) * z).sum(1))

        for m in auto.OWN_COALITIONS:
            if m < 2 * n or m >= 2**n:
                continue
            row = []
            for fit in (kernel.kernel, gp.gp):
                times = []
                for r in range(reps):
                    t0 = time.perf_counter()
                    fit(GameRecorder(g, n, m), np.random.default_rng(r))
                    times.append(time.perf_counter() - t0)
                row.append(min(times))
            print(n, m, f"{row[0]:.4f} {row[1]:.4f}", flush=True)
    after = auto.probe()
    mean = (before + after) / 2
    print(f"probe before {before:.5f} s, after {after:.5f} s: PROBE_REF_S {mean:.5f}")


def peers(
    table: np.ndarray, n: int, value: Callable[[np.ndarray], np.ndarray] | None = None
) -> dict[str, Fn]:
    """The peers on a game: its real `value` (equal wall time), else read from its table [2^n]
    (bit i of the index = player i; equal coalitions: the same values, faster)."""
    import shap
    import shapiq

    bits = 1 << np.arange(n)

    def f(z: np.ndarray) -> np.ndarray:
        if value is not None:
            return np.asarray(value(np.asarray(z) > 0.5)).reshape(-1)
        return table[(np.asarray(z) > 0.5).astype(np.int64) @ bits]

    explainer = shap.KernelExplainer(f, np.zeros((1, n)))

    def shap_kernel(coalitions: int, seed: int) -> np.ndarray:
        np.random.seed(seed)  # KernelExplainer samples with the global numpy RNG
        vals = explainer.shap_values(np.ones(n), nsamples=coalitions - 2, l1_reg=False, silent=True)
        return np.asarray(vals).reshape(-1)

    class Wrapped(shapiq.Game):
        def __init__(self) -> None:
            super().__init__(n_players=n, normalize=False)

        def value_function(self, coalitions_: np.ndarray) -> np.ndarray:
            return f(coalitions_)

    def shapiq_run(make: Callable[[int], object]) -> Fn:
        def run(coalitions: int, seed: int) -> np.ndarray:
            res = make(seed).approximate(coalitions, Wrapped())  # type: ignore[attr-defined]
            return np.asarray(res.get_n_order_values(1)).reshape(-1)

        return run

    return {
        "shap Kernel": shap_kernel,
        "shapiq KernelSHAP": shapiq_run(
            lambda s: shapiq.KernelSHAP(n, pairing_trick=True, random_state=s)
        ),
        "shapiq kADDSHAP": shapiq_run(
            lambda s: shapiq.kADDSHAP(n, max_order=2, pairing_trick=True, random_state=s)
        ),
    }


def exact_values(table: np.ndarray, n: int) -> np.ndarray:
    """Shapley values from the full table by enumeration. [n]"""
    from math import comb

    masks = all_masks(n)
    size = masks.sum(1)
    phi = np.zeros(n)
    for i in range(n):
        without = ~masks[:, i]
        idx = np.flatnonzero(without)
        w = np.array([1.0 / (n * comb(n - 1, int(s))) for s in size[idx]])
        phi[i] = np.sum(w * (table[idx | (1 << i)] - table[idx]))
    return phi


class Game:
    """One benchmark game: the real value function (for auto), its table and exact values."""

    def __init__(
        self,
        name: str,
        value: Callable[[np.ndarray], np.ndarray],
        n: int,
        raw: Callable[[np.ndarray], np.ndarray] | None = None,  # the same values, faster
    ) -> None:
        self.name, self.value, self.n = name, value, n
        raw = raw or value
        self.table = np.concatenate(
            [np.asarray(raw(all_masks(n, s, min(s + 1024, 1 << n)))).reshape(-1)
             for s in range(0, 1 << n, 1024)]
        )  # fmt: skip
        self.exact = exact_values(self.table, n)


def heldout(remote_s: float | None) -> list[Game]:
    from tests.explainers.heldout_games import FAMILIES, game

    out = []
    for family in FAMILIES:
        for inst in range(2):
            g = game(family, inst)
            value: Callable[[np.ndarray], np.ndarray] = g
            if remote_s is not None:

                def value(masks: np.ndarray, g: Callable = g) -> np.ndarray:
                    time.sleep(remote_s * len(masks))  # stands for a remote model's time
                    return g(masks)

            out.append(Game(g.name, value, g.n_players, g))
    return out


def cnn224(count: int = 2) -> list[Game]:
    import torch

    torch.set_num_threads(1)
    out = []
    for seed in range(count):
        gen = torch.Generator().manual_seed(seed)
        net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 5, stride=2), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 16, 3, stride=2), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(256, 2),
        ).eval()  # fmt: skip
        with torch.no_grad():
            for p in net.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        image = torch.rand((3, 224, 224), generator=gen)
        def value(masks: np.ndarray, net=net, image=image) -> np.ndarray:  # type: ignore[no-untyped-def]
            rows, cols = 4, 3  # patches of 56 x 75 (the last column 74)
            keep = torch.from_numpy(masks.reshape(-1, 1, rows, cols).astype(np.float32))
            keep = torch.nn.functional.interpolate(keep, size=(224, 224), mode="nearest")
            res = []
            with torch.no_grad():
                for s in range(0, len(keep), 64):
                    res.append(net(image[None] * keep[s : s + 64])[:, 0])
            return torch.cat(res).double().numpy()

        out.append(Game(f"cnn224 seed {seed}", value, 12))
    return out


def sentiment(count: int = 2) -> list[Game]:
    from bench.regression_bench import sentiment_cases

    out = []
    for name, game, n, k, _ in sentiment_cases(count):

        def value(masks: np.ndarray, game=game, k=k) -> np.ndarray:  # type: ignore[no-untyped-def]
            return np.asarray(game(masks))[:, k]

        out.append(Game(name, value, n))
    return out


def remote_models() -> list[Any]:
    """An MLP and a gradient-boosting regressor on Friedman #1, 12 features (fixed seeds)."""
    from sklearn.datasets import make_friedman1
    from sklearn.ensemble import GradientBoostingRegressor
    from sklearn.neural_network import MLPRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from tests.peers.mlserver import PeerModel

    x, y = make_friedman1(n_samples=2000, n_features=12, noise=0.5, random_state=0)
    x = x.astype(np.float32)
    names = [f"x{i}" for i in range(12)]
    mlp = make_pipeline(
        StandardScaler(), MLPRegressor(hidden_layer_sizes=(32, 16), max_iter=1000, random_state=0)
    ).fit(x, y)
    gbr = GradientBoostingRegressor(n_estimators=200, max_depth=4, random_state=0).fit(x, y)
    return [
        PeerModel(name, "regression", est, names, ["y"], "predict", x)
        for name, est in (("friedman-mlp", mlp), ("friedman-gbr", gbr))
    ]


def remote_games(peer: Any, background: int = 10, explicands: int = 2) -> list[Game]:
    """Interventional games of the served models through the service's OIP client: v(S) is
    the mean over the background of the remote prediction with the explicand's features in S."""
    from models.adapters.remote import RemoteClient

    out = []
    for name, m in peer.models.items():
        client = RemoteClient(peer.model_url(name), timeout_s=60.0, output=m.remote_output)
        bg = m.x[:background]
        for e in range(explicands):
            xe = m.x[1000 + e]

            def value(masks: np.ndarray, client=client, xe=xe, bg=bg) -> np.ndarray:  # type: ignore[no-untyped-def]
                rows = np.where(masks[:, None, :], xe[None, None], bg[None])
                pred = client(rows.reshape(-1, rows.shape[-1]))[:, 0].astype(np.float64)
                return pred.reshape(len(masks), len(bg)).mean(1)

            probe = np.random.default_rng(0).random((256, 12)) < 0.5
            t0 = time.perf_counter()
            value(probe)
            per = (time.perf_counter() - t0) / len(probe)
            out.append(Game(f"{name} row {e} ({per * 1e3:.2f} ms/coalition)", value, 12))
    return out


def ours(g: Game, costly: bool) -> Callable[[int, int], tuple[np.ndarray, float, str]]:
    def run(coalitions: int, seed: int) -> tuple[np.ndarray, float, str]:
        t0 = time.perf_counter()
        est, details = shapley_values_chosen(
            g.value, g.n, budget=coalitions, seed=seed, costly=costly
        )
        took = time.perf_counter() - t0
        return np.asarray(est.values).reshape(-1), took, details["chosen"] if details else "?"

    return run


def ratio_ci(auto_rmse: dict[str, np.ndarray], best: dict[str, np.ndarray], rng: np.random.Generator) -> tuple[float, float, float]:  # noqa: E501
    """Geometric mean over games of mean auto RMSE / mean best-peer RMSE, with a paired seed
    bootstrap (best: [peers, seeds] per game, the best chosen inside each draw)."""

    def stat(idx: np.ndarray | None) -> float:
        logs = []
        for name, a in auto_rmse.items():
            sel = slice(None) if idx is None else idx
            logs.append(np.log(a[sel].mean() / best[name][:, sel].mean(axis=1).min()))
        return float(np.exp(np.mean(logs)))

    seeds = len(next(iter(auto_rmse.values())))
    draws = [stat(rng.integers(seeds, size=seeds)) for _ in range(1000)]
    lo, hi = np.percentile(draws, Z90)
    return stat(None), float(lo), float(hi)


def equal_coalitions(
    games: list[Game], seeds: int, costly: bool, label: str, pers: tuple[int, ...] = (4, 8, 16, 32)
) -> None:
    n = games[0].n
    rows = []
    for per in pers:
        m = per * n
        a_rmse, p_rmse, chosen = {}, {}, set()
        for g in games:
            if m >= 1 << g.n:
                continue
            run, pe = ours(g, costly), peers(g.table, g.n)
            a, p = [], []
            for s in range(seeds):
                vals, _, name = run(m, s)
                chosen.add(name)
                a.append(np.sqrt(np.mean((vals - g.exact) ** 2)))
                p.append([np.sqrt(np.mean((fn(m, s) - g.exact) ** 2)) for fn in pe.values()])
            a_rmse[g.name], p_rmse[g.name] = np.array(a), np.array(p).T
        if not a_rmse:
            continue
        r, lo, hi = ratio_ci(a_rmse, p_rmse, np.random.default_rng(0))
        rows.append(f"| {label} | {per}n = {m} | {'/'.join(sorted(chosen))} | **{r:.2f}** "
                    f"[{lo:.2f}, {hi:.2f}] |")  # fmt: skip
        print(rows[-1], flush=True)


def equal_time(games: list[Game], seeds: int, label: str) -> None:
    n = games[0].n
    pers = [p for p in (4, 8, 16, 32, 64) if p * n < 1 << n]
    cache: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for per in pers:
        m = per * n
        a_rmse: dict[str, np.ndarray] = {}
        p_at: dict[str, np.ndarray] = {}
        chosen, walls = set(), []
        for g in games:
            run, pe = ours(g, False), peers(g.table, g.n, g.value)
            # each peer's curve: mean RMSE [seeds] and median wall time per budget
            curves = cache.setdefault(g.name, {})
            for pname, fn in pe.items() if not curves else ():
                errs_q, times_q = [], []
                for q in pers:
                    e, tq = [], []
                    for s in range(seeds):
                        t0 = time.perf_counter()
                        v = fn(q * n, s)
                        tq.append(time.perf_counter() - t0)
                        e.append(np.sqrt(np.mean((v - g.exact) ** 2)))
                    errs_q.append(np.array(e))
                    times_q.append(float(np.median(tq)))
                curves[pname] = (np.array(times_q), np.array(errs_q))  # [budgets], [budgets, seeds]
            a, t_a = [], []
            for s in range(seeds):
                vals, took, name = run(m, s)
                chosen.add(name)
                a.append(np.sqrt(np.mean((vals - g.exact) ** 2)))
                t_a.append(took)
            t = float(np.median(t_a))
            walls.append(t)
            at = []
            for times, errs in curves.values():
                # the peer's error at auto's time: its largest budget done by then (times made
                # monotone in the budget); before its smallest one finishes, that one's error
                done = np.flatnonzero(np.maximum.accumulate(times) <= t)
                at.append(errs[done[-1] if len(done) else 0])
            a_rmse[g.name], p_at[g.name] = np.array(a), np.array(at)
        r, lo, hi = ratio_ci(a_rmse, p_at, np.random.default_rng(0))
        cell = f"**{r:.2f}** [{lo:.2f}, {hi:.2f}]"
        wall = np.median(walls) * 1e3
        print(f"| {label} | {per}n = {m} | {'/'.join(sorted(chosen))} | {wall:.1f} | {cell} |",
              flush=True)  # fmt: skip


def tanh(count: int = 3) -> list[Game]:
    from bench.regression_bench import tanh_cases

    out = []
    for name, game, n, k, _ in tanh_cases(count):

        def value(masks: np.ndarray, game=game, k=k) -> np.ndarray:  # type: ignore[no-untyped-def]
            return np.asarray(game(masks))[:, k]

        out.append(Game(name, value, n))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("what", choices=("own", "coalitions", "walltime"))
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--cases", default="heldout-remote,cnn224,sentiment")
    parser.add_argument("--pers", default="4,8,16,32", help="coalitions per player (coalitions)")
    args = parser.parse_args()
    pers = tuple(int(p) for p in args.pers.split(","))
    threadpool_limits(1)
    cpu = platform.processor() or platform.machine()
    print(f"# {cpu}, {os.cpu_count()} cores (shared), load {os.getloadavg()[0]:.1f}, one BLAS "
          f"thread, {args.seeds} seeds", flush=True)  # fmt: skip
    if args.what == "own":
        own_table()
        return
    if args.what == "coalitions":
        print("| games | coalitions | auto chose | auto RMSE / best peer [90%] |")
        print("|---|---|---|---|")
        for case in args.cases.split(","):
            if case == "heldout-remote":
                by_n: dict[int, list[Game]] = {}
                for g in heldout(1e-3):
                    by_n.setdefault(g.n, []).append(g)
                for n, gs in sorted(by_n.items()):
                    label = f"held-out, remote 1 ms ({n} pl.)"
                    equal_coalitions(gs, args.seeds, False, label, pers)
            elif case == "cnn224":
                equal_coalitions(cnn224(), args.seeds, False, "cnn 3x224x224 (12 patches)", pers)
            elif case == "sentiment":
                equal_coalitions(sentiment(), args.seeds, True, "sentiment-minilm words", pers)
            elif case == "mlserver":
                import tempfile

                from tests.peers.mlserver import mlserver_peer

                with (
                    tempfile.TemporaryDirectory() as folder,
                    mlserver_peer(Path(folder), remote_models()) as peer,
                ):
                    games = remote_games(peer)
                    for g in games:
                        print(f"# {g.name}", flush=True)
                    label = "real MLServer, Friedman #1 MLP + GBR (12 pl., 10 bg rows)"
                    equal_coalitions(games, args.seeds, False, label, pers)
        return
    print("| games | auto coalitions | auto chose | auto ms | auto RMSE / best peer at equal "
          "time [90%] |")  # fmt: skip
    print("|---|---|---|---|---|")
    by_n = {}
    for g in heldout(None):
        by_n.setdefault(g.n, []).append(g)
    for n, gs in sorted(by_n.items()):
        equal_time(gs, args.seeds, f"held-out ({n} pl.)")
    equal_time(tanh(), args.seeds, "tanh-mlp 16 pl., 50 bg rows")


if __name__ == "__main__":
    main()
