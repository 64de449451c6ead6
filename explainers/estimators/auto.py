"""`auto`'s cost model: KernelSHAP's fit or the GP's on the same coalitions, by measured cost.

`kernel` and `gp` draw the same coalitions (gp fits KernelSHAP's plan: same seed, rounds and
budget), so the choice is only of the fit and can wait until the model has been timed: every
model call is timed (`Timed`), and when the rounds are fitted `Chooser` predicts each fit's
error at equal wall time, from the measured seconds per coalition, each fit's own time
(OWN_S, a function of coalitions and players) and gp's RMSE relative to KernelSHAP's at equal
coalitions (RMSE_RATIO), with KernelSHAP's 1/sqrt(m) rate [Lundberg & Lee (2017); Covert & Lee
(2021)]. The values are deterministic given the seed; which fit answers depends on the measured
time (AUTO_COST=0 in the environment: the static rule of `registry.choose_estimator` instead).

The rule: with m coalitions (the budget), c seconds per coalition and T = m c + own_kernel(m, n)
(KernelSHAP's wall time; the time left where a deadline is nearer; own times are OWN_S scaled
by the machine's slowness now, `speed()`), gp could have spent m_g coalitions in T
(m_g c + own_gp(m_g, n) <= T); gp answers when its predicted error
ratio(m_g / n) / sqrt(m_g) is below KernelSHAP's 1 / sqrt(m). On a cheap model (microseconds per
coalition) own_gp dominates and m_g is small: KernelSHAP; on an expensive one (>= 1 ms per
coalition) m_g is nearly m: gp. gp then spends the whole budget (a lower error still, in
about own_gp more seconds).

Own times move with the machine and its load, the model's measured cost moves with them, and a
fixed table would shift the choice: `speed()` times a fixed piece of gp-like linear algebra
(PROBE, one BLAS thread, a few milliseconds, at most every PROBE_EVERY_S seconds per process)
and scales OWN_S by its ratio to PROBE_REF_S, the same probe timed when OWN_S was measured, and
by the load per core beyond 1 (a probe of milliseconds runs between preemptions; a request's
model calls, which the cost measures, and its fit do not).

Measured once, kept: the same request must not get another fit because the machine got busier
(a two-thread audit measured on a loaded machine took gp for 64 of 200 rows). A caller that
names what it explains (`key`: the model's name and version, players, budget, rows per
coalition) gets the first decision for that key again, for the life of the process
(`REMEMBER` keys, oldest forgotten first); details.auto says `"decided": "remembered"`. A
choice forced by a near deadline is not kept.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from explainers.games import Game, rows_per_coalition
from explainers.games.deadlines import time_left

ENV = "AUTO_COST"  # "0": auto keeps the static rule (reproducible choice); else cost-based

# Own seconds of each fit (the whole estimator on a near-free game: KernelSHAP's plan, rounds
# and fit) by players (rows) and coalitions (columns), min of 3; interpolated in log-log,
# clamped at the edges, made non-decreasing in coalitions (noise). Machine: AMD EPYC, 2 cores
# shared (load 1.2), one BLAS thread, 2026-12-07, after issue 30's screened prior choice
# (gp_prior.SCREEN: gp 2.2-4.4x less at 256-1024 coalitions than the table before it).
# Reproduce: .venv/bin/python bench/auto_bench.py own (it prints PROBE_REF_S of the same run)
OWN_PLAYERS = (8, 16, 32, 64, 128)
OWN_COALITIONS = (64, 256, 1024, 2560)
OWN_S: dict[str, tuple[tuple[float, ...], ...]] = {
    "kernel": (
        (0.0012, 0.0022, 0.0034, 0.0051),  # n = 8: beyond 64 only the n = 16 row (2^8 = 256)
        (0.0017, 0.0022, 0.0034, 0.0051),
        (0.0036, 0.0042, 0.0053, 0.0074),
        (0.0123, 0.0123, 0.0183, 0.0226),  # 64 coalitions < 2n: the 256 column
        (0.0501, 0.0501, 0.0513, 0.0658),
    ),
    "gp": (
        (0.0131, 0.0288, 0.0674, 0.4726),
        (0.0144, 0.0288, 0.0674, 0.4726),
        (0.0067, 0.0381, 0.0801, 0.4769),
        (0.1093, 0.1093, 0.1701, 0.5443),
        (0.0699, 0.0699, 0.1881, 0.6449),
    ),
}
# gp's RMSE over KernelSHAP's at equal coalitions, by coalitions per player: geometric mean over
# the tuned-on games of docs/benchmarks.md ("Cubic-surrogate-adjusted KernelSHAP and
# Gaussian-process estimators", re-measured under the held-out protocol, 8 seeds: tanh-MLP 16
# players, breast-cancer-mlp, digits-cnn 2x2 and 1x1, sentiment-minilm words) of (gp / best
# peer) / (kernel / best peer). At 2n that mean is 0.17 because KernelSHAP's regression is
# ill-posed there (its error is no longer on its 1/sqrt(m) rate): 0.50 is kept there as a cap.
# Below 3n auto takes gp by rule (registry.GP_BELOW).
RATIO_PER_PLAYER = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
RMSE_RATIO = (0.50, 0.67, 0.645, 0.62, 0.54, 0.43)


# The probe: Cholesky factorisation and solve of a PROBE_ROWS-row kernel matrix of random
# coalitions, one BLAS thread, min of 5. PROBE_REF_S: its seconds in the run that measured OWN_S.
PROBE_ROWS = 256
PROBE_REF_S = 0.00179  # OWN_S's run: 1.88 ms before, 1.70 ms after
PROBE_EVERY_S = 30.0
SPEED_BOUNDS = (0.2, 5.0)  # a probe beyond these (a stall) is clamped
_speed: tuple[float, float] | None = None  # (monotonic time of the probe, factor)


def probe() -> float:
    """Seconds of the probe (min of 5), on one BLAS thread."""
    from explainers.estimators.kernel import _blas

    rng = np.random.default_rng(0)
    z = (rng.random((PROBE_ROWS, 32)) < 0.5).astype(float)
    k = np.exp(z @ z.T / 16.0) + np.eye(PROBE_ROWS)
    y = rng.normal(size=PROBE_ROWS)
    best = np.inf
    with _blas().limit(limits=1, user_api="blas"):
        for _ in range(5):
            t0 = time.perf_counter()
            low = np.linalg.cholesky(k)
            np.linalg.solve(low.T, np.linalg.solve(low, y))
            best = min(best, time.perf_counter() - t0)
    return float(best)


def contention() -> float:
    """Runnable threads per core over the last minute, at least 1: a short probe runs between
    preemptions, but a request's model calls and fits share the cores with the rest."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available here
        return 1.0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1.0, load / max(cores or 1, 1))


def speed(now: float | None = None) -> float:
    """The machine's slowness now relative to OWN_S's run (2.0: fits take twice as long): the
    probe over PROBE_REF_S times `contention()` (OWN_S's run: load 2 on 2 cores, 1), re-timed
    at most every PROBE_EVERY_S seconds, clamped."""
    global _speed
    now = time.monotonic() if now is None else now
    if _speed is None or now - _speed[0] >= PROBE_EVERY_S:
        factor = float(np.clip(probe() / PROBE_REF_S * contention(), *SPEED_BOUNDS))
        _speed = (now, factor)
    return _speed[1]


def enabled() -> bool:
    """Whether auto chooses kernel or gp by measured cost (AUTO_COST unset or not "0")."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def own_seconds(fit: str, coalitions: float | np.ndarray, players: int) -> Any:
    """Predicted own seconds of `fit` ("kernel" or "gp") at these coalitions (a number or an
    array) and players: OWN_S interpolated in log-log, clamped at the edges."""
    table = np.maximum.accumulate(np.asarray(OWN_S[fit]), axis=1)  # [players, coalitions]
    ln = np.log(np.clip(players, OWN_PLAYERS[0], OWN_PLAYERS[-1]))
    row = np.array([np.interp(ln, np.log(OWN_PLAYERS), col) for col in table.T])  # [coalitions]
    lm = np.log(np.clip(coalitions, OWN_COALITIONS[0], OWN_COALITIONS[-1]))
    out = np.interp(lm, np.log(OWN_COALITIONS), row)
    return float(out) if np.ndim(out) == 0 else out


def rmse_ratio(coalitions: float, players: int) -> float:
    """gp's RMSE over KernelSHAP's at equal coalitions (RMSE_RATIO, interpolated in log)."""
    per = np.log(np.clip(coalitions / max(players, 1), RATIO_PER_PLAYER[0], RATIO_PER_PLAYER[-1]))
    return float(np.interp(per, np.log(RATIO_PER_PLAYER), RMSE_RATIO))


class Timed:
    """A game that times its own calls (the model's time per coalition, measured)."""

    def __init__(self, game: Game) -> None:
        self.game = game
        self.rows_per_coalition = rows_per_coalition(game)
        self.hierarchy = getattr(game, "hierarchy", None)
        self.seconds = 0.0
        self.coalitions = 0
        self.first: tuple[float, int] | None = None  # (seconds, coalitions) of the first call

    def __call__(self, masks: np.ndarray) -> Any:
        t0 = time.perf_counter()
        out = self.game(masks)
        took = time.perf_counter() - t0
        self.seconds += took
        self.coalitions += len(masks)
        if self.first is None:
            self.first = (took, len(masks))
        return out

    @property
    def per_coalition(self) -> float:
        """Seconds per coalition over every call so far (0 before any)."""
        return self.seconds / self.coalitions if self.coalitions else 0.0


@dataclass(frozen=True)
class Choice:
    """What auto measured and predicted, and the fit it chose (details.auto)."""

    chosen: str
    reason: str
    cost_per_coalition_s: float
    coalitions: int
    own_s: dict[str, float]
    gp_coalitions_at_equal_time: int
    predicted_rmse_vs_kernel: float  # gp's predicted error at equal wall time over kernel's
    measured: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen,
            "reason": self.reason,
            "measured": self.measured,
            "cost_per_coalition_s": self.cost_per_coalition_s,
            "coalitions": self.coalitions,
            "predicted_own_s": dict(self.own_s),
            "gp_coalitions_at_equal_time": self.gp_coalitions_at_equal_time,
            # left out where gp's fit alone would not fit in kernel's time
            **(
                {"predicted_gp_rmse_vs_kernel": ratio}
                if np.isfinite(ratio := self.predicted_rmse_vs_kernel)
                else {}
            ),
            **self.extra,
        }


def decide(
    cost: float,
    coalitions: int,
    players: int,
    left: float | None = None,
    slowness: float = 1.0,
) -> Choice:
    """kernel or gp for `coalitions` at `cost` seconds per coalition, with own times OWN_S x
    `slowness` (`speed()`; the rule: module doc)."""
    own = {f: slowness * own_seconds(f, coalitions, players) for f in ("kernel", "gp")}
    wall = coalitions * cost + own["kernel"]
    if left is not None:
        wall = min(wall, left)
    grid = np.unique(np.linspace(1, coalitions, 256).astype(int))
    spent = grid * cost + slowness * own_seconds("gp", grid, players)
    fits = grid[spent <= wall]
    m_gp = int(fits.max()) if len(fits) else 0
    ratio = np.inf
    if m_gp >= 2 * players:
        ratio = rmse_ratio(m_gp, players) * float(np.sqrt(coalitions / m_gp))
    ms = cost * 1e3
    if left is not None and own["gp"] > left:
        chosen = "kernel"
        why = f"deadline: {left:.3f} s left, gp's fit needs about {own['gp']:.3f} s"
    elif ratio < 1.0:
        chosen = "gp"
        why = (
            f"gp: predicted {ratio:.2f}x kernel's error at equal wall time ({m_gp} of "
            f"{coalitions} coalitions in kernel's {wall:.3f} s at {ms:.4f} ms a coalition)"
        )
    else:
        chosen = "kernel"
        why = (
            f"kernel: gp's own time ({own['gp']:.3f} s) leaves it {m_gp} of {coalitions} "
            f"coalitions in kernel's {wall:.3f} s at {ms:.4f} ms a coalition: predicted "
            f"{ratio:.2f}x kernel's error"
        )
    extra = {"machine_slowness": round(slowness, 3)}
    return Choice(chosen, why, cost, coalitions, own, m_gp, float(ratio), extra=extra)


REMEMBER = 4096  # decisions kept per process (a key is a model version x players x budget)
_decided: OrderedDict[Hashable, Choice] = OrderedDict()
_decided_lock = threading.Lock()


def remembered(key: Hashable | None, left: float | None) -> Choice | None:
    """The decision kept for `key`, unless a deadline `left` seconds away rules gp out."""
    if key is None:
        return None
    with _decided_lock:
        choice = _decided.get(key)
        if choice is not None:
            _decided.move_to_end(key)
    if choice is None or (choice.chosen == "gp" and left is not None and choice.own_s["gp"] > left):
        return None
    return replace(choice, extra={**choice.extra, "decided": "remembered"})


def remember(key: Hashable | None, choice: Choice, left: float | None) -> Choice:
    """Keep `choice` for `key` (not when a deadline forced it); returns it as answered."""
    if key is None or choice.reason.startswith("deadline"):
        return choice
    with _decided_lock:
        choice = _decided.setdefault(key, choice)  # a concurrent first decision wins
        _decided.move_to_end(key)
        while len(_decided) > REMEMBER:
            _decided.popitem(last=False)
    return replace(choice, extra={**choice.extra, "decided": "measured"})


class Chooser:
    """The fit of KernelSHAP's rounds that decides, once, between kernel's fit and gp's;
    with a `key`, once per key and process (`remembered`)."""

    def __init__(self, timed: Timed, players: int, key: Hashable | None = None) -> None:
        self.timed, self.players, self.key = timed, players, key
        self.choice: Choice | None = None

    def __call__(
        self, plan: Any, y: np.ndarray, total: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray | None]:
        from explainers.estimators import gp, kernel

        if self.choice is None:
            left = time_left()
            self.choice = remembered(self.key, left)
            if self.choice is None:
                measured = decide(
                    self.timed.per_coalition, len(plan.masks), self.players, left, speed()
                )
                self.choice = remember(self.key, measured, left)
        if self.choice.chosen == "gp":
            return gp._fit(plan, y, total)
        return kernel._blas_limited_fit(plan, y, total)


def static(chosen: str, reason: str) -> dict[str, Any]:
    """details.auto of a choice made without measuring (exact, text models, AUTO_COST=0)."""
    return {"chosen": chosen, "reason": reason, "measured": False}
