"""KernelSHAP: Shapley values as a constrained weighted regression over sampled coalitions.

Lundberg & Lee (2017), "A unified approach to interpreting model predictions"; paired
sampling after Covert & Lee (2021), "Improving KernelSHAP"; the leverage sampler after
Musco & Witter (2025), "Provably accurate Shapley value estimation via leverage score sampling".

Thousands of players: the size weights are computed in log space (C(4096, 2048) overflows a
float), the sampler draws in blocks of bounded memory, and above EXACT_JACKKNIFE_UP_TO players
the regression and the jackknife's refits are Cholesky solves instead of pseudo-inverses (32
SVDs of the (n-1)^2 system take 11 s at n = 1,024 on one core, a Cholesky refit 15 ms), with 8
jackknife groups above 1,024 players.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import cache, partial
from itertools import combinations, pairwise
from math import comb

import numpy as np
from scipy.special import gammaln
from threadpoolctl import ThreadpoolController

from explainers.estimators.base import Estimate, Target
from explainers.estimators.rounds import Round, Slicer, caps, drive
from explainers.explanation import Caveat
from explainers.games import BudgetError, GameRecorder

N_JACKKNIFE = 32
INTERPOLATES = 1e-9  # drawn residuals at most this times max |v| : the fit interpolates ...
INTERPOLATION_FLOOR = 3.0  # ... and error_std is at least this / draws x the pair range
NOISE_RATIO = 0.2  # a floor above this times the largest |value| warns (caveats.NOISE_RATIO)
SAMPLERS = ("kernel", "leverage")
EXACT_JACKKNIFE_UP_TO = 512  # players; above: Cholesky solves and systems built in blocks
LARGE_GROUPS_FROM = 1024  # players; above, the jackknife has N_JACKKNIFE_LARGE groups
N_JACKKNIFE_LARGE = 8
RIDGE = 1e-10  # relative ridge of a singular system above EXACT_JACKKNIFE_UP_TO players
BLOCK = 1 << 22  # numbers per block of the sampler's draws and the regression's rows


def min_coalitions(n: int) -> int:
    """Empty, full and n-1 complement pairs: under the efficiency constraint a pair gives
    one equation, and n-1 free coefficients need n-1 of them."""
    return 2 * n


@cache
def _blas() -> ThreadpoolController:
    """The loaded BLAS libraries, scanned once: a scan costs milliseconds per call."""
    return ThreadpoolController()


def size_distribution(n: int) -> np.ndarray:
    """Shapley-kernel probability of each coalition size k = 1..n-1: p(k) ~ 1/(k(n-k)). [n-1]

    The kernel estimator samples sizes by it; Salvage's kernel sampler should too.
    """
    k = np.arange(1, n, dtype=np.float64)
    w = 1.0 / (k * (n - k))
    return np.asarray(w / w.sum())


def log_comb(n: int, s: np.ndarray | int) -> np.ndarray:
    """log C(n, s), finite for any n (C(4096, 2048) is about 1e1231). float64"""
    s = np.asarray(s, dtype=np.float64)
    return np.asarray(gammaln(n + 1.0) - gammaln(s + 1.0) - gammaln(n - s + 1.0))


def _size_weight(n: int, s: int) -> float:
    """Shapley-kernel weight of one coalition of size s (0 < s < n): (n-1) / (C(n,s) s (n-s)),
    exactly where C(n, s) is a float, else in log space (underflowing to 0.0)."""
    c = comb(n, s)
    if c < 1 << 1000:
        return (n - 1) / (c * s * (n - s))
    return float(np.exp(np.log(n - 1.0) - log_comb(n, s) - np.log(s * (n - s + 0.0))))


def _full_size(n: int, size: int) -> np.ndarray:
    """Every coalition of one size. [C(n, size), n]"""
    members = np.array(list(combinations(range(n), size)), dtype=np.int64).reshape(-1, size)
    masks = np.zeros((members.shape[0], n), dtype=bool)
    np.put_along_axis(masks, members, True, axis=1)
    return masks


def _keys(masks: np.ndarray) -> list[bytes]:
    packed = np.packbits(masks, axis=1)
    return packed.view(f"V{packed.shape[1]}").ravel().tolist()


@dataclass(frozen=True)
class Design:
    """A snapshot of the regression rows, as rows of the value store."""

    masks: np.ndarray  # [rows, n] the store's coalitions
    enumerated: np.ndarray  # [e] store rows of the enumerated coalitions
    enumerated_weights: np.ndarray  # [e] kernel weights
    draws: np.ndarray  # [2 * n_pairs] store rows of the drawn coalitions, pair-major
    draw_weight: np.ndarray  # [2 * n_pairs] kernel weight / inclusion probability
    n_pairs: int

    @property
    def exact(self) -> bool:
        return self.n_pairs == 0


class Planner:
    """The coalitions of KernelSHAP for a growing budget, every earlier one kept.

    Size groups {s, n-s} are enumerated, largest kernel mass first, once sampling would cover
    them anyway; the rest are sampled in complement pairs. Draws from a group that becomes
    enumerated later leave the sample (their coalitions are reused): restricted to the groups
    still sampled, the earlier draws follow exactly the new size distribution, so every draw
    that remains is an i.i.d. draw of the current sampler.
    """

    def __init__(self, n: int, sampler: str, rng: np.random.Generator) -> None:
        if sampler not in SAMPLERS:
            raise ValueError(f"unknown sampler {sampler!r}; use one of {SAMPLERS}")
        self.n, self.sampler, self.rng = n, sampler, rng
        self.groups = list(range(1, n // 2 + 1))  # size groups {s, n-s} still sampled
        p = size_distribution(n)  # a pair {S, N\S} draws either size: twice p(s) unless s = n/2
        self.mass = {s: float(p[s - 1]) * (1 if 2 * s == n else 2) for s in self.groups}
        self.index: dict[bytes, int] = {}  # coalition -> row of the value store
        self.masks: list[np.ndarray] = []  # store rows, in blocks
        self.enumerated_count = 0
        self.enumerated_rows: list[np.ndarray] = []
        self.enumerated_weights: list[np.ndarray] = []
        self.draw_rows: list[np.ndarray] = []  # canonical member's store row per draw
        self.draw_groups: list[np.ndarray] = []  # group (smaller size) per draw

    @property
    def size(self) -> int:
        return len(self.index)

    @property
    def exact(self) -> bool:
        return not self.groups

    def _add(self, masks: np.ndarray) -> None:
        """Append coalitions to the store (callers pass only new ones)."""
        keys = _keys(masks)
        self.index.update(zip(keys, range(self.size, self.size + len(keys)), strict=True))
        self.masks.append(masks)

    def extend(self, cap: int) -> np.ndarray:
        """Plan up to `cap` coalitions in all; returns the new ones, in store order. [m, n]"""
        start = self.size
        n = self.n
        if start == 0:
            ends = np.zeros((2, n), dtype=bool)
            ends[1] = True
            self._add(ends)
        self._enumerate(cap)
        self._sample(cap)
        return np.concatenate(self.masks)[start:] if self.size > start else np.zeros((0, n), bool)

    def _enumerate(self, cap: int) -> None:
        n = self.n
        while self.groups:
            s = self.groups[0]
            count = comb(n, s) * (1 if 2 * s == n else 2)
            left = cap - 2 - self.enumerated_count
            share = self.mass[s] / sum(self.mass[g] for g in self.groups)
            if count > left or left * share < count:
                break
            sizes = sorted({s, n - s})
            masks = [_full_size(n, size) for size in sizes]
            keys = [_keys(m) for m in masks]
            fresh = [np.array([k not in self.index for k in ks], dtype=bool) for ks in keys]
            if sum(int(f.sum()) for f in fresh) > cap - self.size:
                break  # sampled coalitions of other groups took the room: a later round
            for m, f in zip(masks, fresh, strict=True):
                if f.any():
                    self._add(m[f])
            for size, ks in zip(sizes, keys, strict=True):
                self.enumerated_rows.append(np.array([self.index[k] for k in ks], dtype=np.int64))
                self.enumerated_weights.append(np.full(len(ks), _size_weight(n, size)))
            self.enumerated_count += count
            self.groups.pop(0)

    def _probabilities(self) -> tuple[np.ndarray, np.ndarray]:
        """Group probabilities q and, per sampled group, a drawn pair's weight: its kernel
        weight over its inclusion probability q m / C(n, s) (m = 2 for s = n/2, else 1). The
        binomials cancel: (n-1) / (s (n-s) q m), finite for any n."""
        n, groups = self.n, self.groups
        if self.sampler == "kernel":
            q = np.array([self.mass[s] for s in groups])
        else:  # leverage scores 1/C(n,|S|): every size equally likely
            q = np.array([1.0 if 2 * s == n else 2.0 for s in groups])
        q = q / q.sum()
        sizes = np.array(groups, dtype=np.float64)
        multiplicity = np.where(2 * sizes == n, 2.0, 1.0)
        weight = (n - 1) / (sizes * (n - sizes) * q * multiplicity)
        return q, weight

    def _sample(self, cap: int) -> None:
        if not self.groups:
            return
        n, rng = self.n, self.rng
        q, _ = self._probabilities()
        sizes = np.array(self.groups)
        for _ in range(64):  # batches; late ones mostly hit coalitions already drawn
            left = cap - self.size
            if left < 2:
                break
            batch = max(left, 16)
            g = rng.choice(len(sizes), size=batch, p=q)
            # In blocks of rows (the same stream as one draw): [batch, n] floats and their
            # argsort would take gigabytes at thousands of players.
            step = max(1, BLOCK // n)
            picked = np.concatenate(
                [
                    np.argsort(rng.random((len(part), n)), axis=1) < sizes[part][:, None]
                    for part in np.array_split(g, range(step, batch, step))
                ]
            )
            canonical = np.where(picked[:, :1], picked, ~picked)  # one key per complement pair
            packed = np.packbits(canonical, axis=1)
            uniq, first, inverse = np.unique(
                packed.view(f"V{packed.shape[1]}").ravel(), return_index=True, return_inverse=True
            )
            known = np.array([self.index.get(k, -1) for k in uniq.tolist()], dtype=np.int64)
            fresh = np.flatnonzero(known < 0)
            fresh = fresh[np.argsort(first[fresh])]  # in order of first draw
            take = fresh[: left // 2]
            # Draws are accepted in order up to the first new pair that no longer fits.
            cutoff = int(first[fresh[left // 2]]) if len(fresh) > left // 2 else batch
            known[take] = self.size + 2 * np.arange(len(take))
            new = canonical[first[take]]
            self._add(np.stack([new, ~new], axis=1).reshape(-1, n))
            self.draw_rows.append(known[inverse.ravel()[:cutoff]])
            self.draw_groups.append(sizes[g[:cutoff]])

    def design(self) -> Design:
        """The regression rows of everything planned so far."""
        store = np.concatenate(self.masks)
        enumerated = np.concatenate([np.zeros(0, np.int64), *self.enumerated_rows])
        weights = np.concatenate([np.zeros(0), *self.enumerated_weights])
        if not self.groups or not self.draw_rows:
            empty = np.zeros(0, dtype=np.int64)
            return Design(store, enumerated, weights, empty, np.zeros(0), 0)
        rows = np.concatenate(self.draw_rows)
        groups = np.concatenate(self.draw_groups)
        keep = np.isin(groups, self.groups)  # draws of groups enumerated since leave the sample
        rows, groups = rows[keep], groups[keep]
        _, weight = self._probabilities()
        weight_of = dict(zip(self.groups, weight.tolist(), strict=True))
        w = np.array([weight_of[int(g)] for g in groups])
        # The two members of each pair weigh the same (w(s) = w(n - s)).
        draws = np.stack([rows, rows + 1], axis=1).ravel()
        return Design(store, enumerated, weights, draws, np.repeat(w, 2), len(rows))


def _system(
    masks: np.ndarray, y: np.ndarray, total: np.ndarray, weights: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Normal equations of the regression with phi_n = total - sum(phi_<n) eliminated."""
    z = masks.astype(np.float64)
    x = z[:, :-1] - z[:, -1:]
    target = y - z[:, -1:] * total[None, :]
    xw = x * weights[:, None]
    return xw.T @ x, xw.T @ target


def _solve(a: np.ndarray, b: np.ndarray, total: np.ndarray) -> np.ndarray:
    """Coefficients from the small (n-1)^2 system; lstsq tolerates rank deficiency. [n, k]"""
    head, *_ = np.linalg.lstsq(a, b, rcond=None)
    return np.concatenate([head, total[None, :] - head.sum(axis=0, keepdims=True)])


def kernel(
    recorder: GameRecorder,
    rng: np.random.Generator,
    sampler: str = "kernel",
    target: Target | None = None,
) -> Estimate:
    """KernelSHAP with paired sampling, exact small sizes and the efficiency constraint.

    Runs in rounds (rounds.py); the standard error comes from a delete-a-group jackknife over
    the sampled pairs.
    """
    return drive(rounds(recorder, rng, sampler), recorder, target)


Fit = Callable[[Design, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray | None]]
Warn = Callable[[int, int], Caveat | None]  # (coalitions, players) -> a warning of the design



class OnPlan:
    """An estimator on KernelSHAP's coalition plan and rounds with its own `fit` (the
    regression-adjusted and Gaussian-process estimators): same seed, budget and deadline."""

    def __init__(self, fit: Fit, name: str, warn: Warn | None = None) -> None:
        self.fit, self.name, self.warn = fit, name, warn

    def __call__(
        self,
        recorder: GameRecorder,
        rng: np.random.Generator,
        sampler: str = "kernel",
        target: Target | None = None,
    ) -> Estimate:
        return drive(self.rounds(recorder, rng, sampler), recorder, target)

    def rounds(
        self, recorder: GameRecorder, rng: np.random.Generator, sampler: str
    ) -> Iterator[Round]:
        """Rounds of coalitions (rounds.py), each estimate refitted on everything so far."""
        return rounds(recorder, rng, sampler, fit=self.fit, name=self.name, warn=self.warn)

def rounds(
    recorder: GameRecorder,
    rng: np.random.Generator,
    sampler: str,
    fit: Fit | None = None,
    name: str = "kernel",
    warn: Warn | None = None,
) -> Iterator[Round]:
    """Rounds of coalitions (see rounds.py); each yields the estimate of all so far.

    `fit` turns the plan and the values so far into (values, standard errors): KernelSHAP's
    weighted regression by default; the regression-adjusted estimator brings its own.
    """
    n = recorder.n_players
    planner = Planner(n, sampler, rng)
    slicer = Slicer(recorder, distinct=True)  # the plan's coalitions are distinct by construction
    values: list[np.ndarray] = []
    for index, cap in enumerate(caps(n), start=1):
        remaining = recorder.remaining
        limit = min(cap, 1 << n, planner.size + (1 << n if remaining is None else remaining))
        if index == 1 and limit < min_coalitions(n):
            raise BudgetError(
                f"budget too small for the {name} estimator ({min_coalitions(n)} coalitions)"
            )
        masks = planner.extend(limit)
        if masks.shape[0] == 0 and index > 1:
            return
        values.append(slicer(masks))
        design = planner.design()
        yield Round(
            partial(
                _estimate, recorder, design, tuple(values), fit or _blas_limited_fit, name, warn
            ),
            samples=design.n_pairs,
            coalitions=planner.size,
            index=index,
            exact=design.exact,
        )
        if design.exact:
            return


def _estimate(
    recorder: GameRecorder,
    plan: Design,
    values: tuple[np.ndarray, ...],
    fit: Fit,
    name: str,
    warn: Warn | None = None,
) -> Estimate:
    table = np.concatenate(values)  # [store rows, k]
    base, full = table[0], table[1]
    y = table - base[None, :]
    phi, error = fit(plan, y, full - base)
    floor = np.zeros(phi.shape[1])
    if error is not None:  # whatever the fit: an answer that interpolates the draws (issue 28)
        floor = interpolation_floor(plan, y, phi)
        error = np.maximum(error, floor[None, :])
    est = Estimate(
        values=recorder.shape_out(phi),
        base_value=recorder.shape_out(base),
        full_value=recorder.shape_out(full),
        exact=plan.exact,
        n_evaluations=recorder.n_evaluations,
        n_coalitions=recorder.n_coalitions,
        estimator=name,
        error_std=None if error is None else recorder.shape_out(error),
    )
    caveat = floor_caveat(est, floor)
    if caveat is None and warn is not None and not plan.exact:
        caveat = warn(len(plan.masks), plan.masks.shape[1])
    return est if caveat is None else replace(est, warnings=(caveat,))


def _blas_limited_fit(
    plan: Design, y: np.ndarray, total: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None]:
    with _blas().limit(limits=1, user_api="blas"):  # tiny products; BLAS threads only contend
        return _fit(plan, y, total)


def _fit(plan: Design, y: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Solve the regression; jackknife standard errors when coalitions were sampled.

    `y` holds v(S) - v(empty) for every store row; the plan names the rows it uses.
    """
    if plan.masks.shape[1] > EXACT_JACKKNIFE_UP_TO:
        return _fit_large(plan, y, total)
    masks = plan.masks
    a, b = _system(masks[plan.enumerated], y[plan.enumerated], total, plan.enumerated_weights)
    error = None
    if not plan.exact:
        # Rows one per draw, in draw order; pairs are i.i.d., so contiguous blocks of pairs
        # are the jackknife groups.
        draws = masks[plan.draws]
        y_draws = y[plan.draws]
        w = plan.draw_weight / plan.n_pairs
        groups = min(N_JACKKNIFE, plan.n_pairs)
        bounds = np.linspace(0, plan.n_pairs, groups + 1).astype(int) * 2
        parts = [
            _system(draws[lo:hi], y_draws[lo:hi], total, w[lo:hi]) for lo, hi in pairwise(bounds)
        ]
        a_s = sum(p[0] for p in parts)
        b_s = sum(p[1] for p in parts)
        if groups > 1:
            scale = plan.n_pairs / (plan.n_pairs - np.diff(bounds) / 2)[:, None, None]
            a_loo = a + (a_s - np.stack([p[0] for p in parts])) * scale  # [groups, n-1, n-1]
            b_loo = b + (b_s - np.stack([p[1] for p in parts])) * scale  # [groups, n-1, k]
            head = np.linalg.pinv(a_loo, rcond=1e-12, hermitian=True) @ b_loo
            loo = np.concatenate([head, total - head.sum(axis=1, keepdims=True)], axis=1)
            spread = ((loo - loo.mean(axis=0)) ** 2).sum(axis=0) * (groups - 1) / groups
            error = np.sqrt(spread)
        a, b = a + a_s, b + b_s
    phi = _solve(a, b, total)
    if error is not None:
        error = np.maximum(error, interpolation_floor(plan, y, phi))
    return phi, error


def interpolation_floor(plan: Design, y: np.ndarray, phi: np.ndarray) -> np.ndarray:
    """The error floor of a design whose fit interpolates every drawn coalition (issue 28):
    0 where any drawn residual is above rounding, else per output INTERPOLATION_FLOOR / draws
    times the largest drawn pair difference |v(S) - v(N minus S)|. [k]

    Where the additive fit reproduces every drawn pair, each delete-a-group refit is the same
    fit and the jackknife reports ~1e-15, whatever the game is off the sample (a threshold game
    at 4n: values 0.8 off). Such a sample cannot tell an additive game (values exact) from one
    whose non-additive pairs were not drawn; by the rule of three, those pairs hold at most a
    share 3 / draws of the pair distribution (95%), each moving the fit by up to the pair
    differences' range: that is the floor. Not an estimate of the error: answers with it carry
    an uncalibrated_error warning when it is large against the values (`floor_caveat`).
    """
    if plan.exact or plan.n_pairs == 0:
        return np.zeros(y.shape[1])
    z = plan.masks[plan.draws].astype(np.float64)
    resid = y[plan.draws] - z @ phi  # [2 * pairs, k]
    diff = np.abs(y[plan.draws[0::2]] - y[plan.draws[1::2]]).max(axis=0)  # [k]
    scale = np.maximum(np.abs(y).max(axis=0), 1e-300)
    fitted = np.abs(resid).max(axis=0) <= INTERPOLATES * scale
    return np.where(fitted, INTERPOLATION_FLOOR * diff / plan.n_pairs, 0.0)


def floor_caveat(estimate: Estimate, floor: np.ndarray) -> Caveat | None:
    """An uncalibrated_error warning when the interpolation floor decides an error bar that is
    large against the values (the budget cannot reach a calibrated error bar), else None."""
    if estimate.error_std is None or not np.any(floor > 0):
        return None
    error = np.asarray(estimate.error_std).reshape(-1, floor.shape[0])
    values = np.abs(np.asarray(estimate.values)).reshape(-1, floor.shape[0])
    decided = np.any(error <= floor[None, :] * (1 + 1e-12), axis=0) & (floor > 0)
    if not np.any(decided & (floor > NOISE_RATIO * values.max(axis=0))):
        return None
    return Caveat(
        "uncalibrated_error",
        f"the additive fit reproduces every one of the {estimate.n_coalitions} sampled "
        "coalitions, so the sample shows no spread: the values are exact if the game is "
        "additive, else off by an amount this sample cannot see; error_std is a floor "
        f"(rule of three over the draws), not an estimate: raise the budget",
    )


def _gram(upper: np.ndarray, x: np.ndarray, w: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """upper + alpha x^T diag(w) x (w >= 0) in the upper triangle, by a symmetric rank-k update
    (half a product); `upper` is Fortran-ordered and updated in place. [c, c]"""
    from scipy.linalg.blas import dsyrk

    xw = np.asfortranarray(x * np.sqrt(w)[:, None])
    return np.asarray(dsyrk(alpha, xw, beta=1.0, c=upper, trans=1, overwrite_c=1))


def _rows(z: np.ndarray, y: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Regression rows x (phi_n eliminated) and their targets. [c, n-1], [c, k]"""
    z = z.astype(np.float64)
    return z[:, :-1] - z[:, -1:], y - z[:, -1:] * total[None, :]


def _enumerated_system(
    plan: Design, y: np.ndarray, total: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The normal equations of the enumerated coalitions, in blocks of rows (the matrix's
    upper triangle, what the Cholesky solves read)."""
    masks, n = plan.masks, plan.masks.shape[1]
    a, b = np.zeros((n - 1, n - 1), order="F"), np.zeros((n - 1, y.shape[1]))
    step = max(1, BLOCK // n)
    enum, enum_w = plan.enumerated, plan.enumerated_weights
    for lo in range(0, len(enum), step):
        x, t = _rows(masks[enum[lo : lo + step]], y[enum[lo : lo + step]], total)
        a = _gram(a, x, enum_w[lo : lo + step])
        b += (x * enum_w[lo : lo + step, None]).T @ t
    return a, b


def _pairs_system(
    plan: Design, y: np.ndarray, total: np.ndarray, lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray]:
    """The normal equations of the drawn pairs lo..hi-1, in blocks of rows: a pair's
    complement has the row -x, so a pair adds 2 w x x^T and w x (t - t'). Upper triangle."""
    masks, n = plan.masks, plan.masks.shape[1]
    a, b = np.zeros((n - 1, n - 1), order="F"), np.zeros((n - 1, y.shape[1]))
    step = max(1, BLOCK // n)
    members, weights = plan.draws[0::2], plan.draw_weight[0::2] / plan.n_pairs
    for start in range(lo, hi, step):
        rows, w = members[start : min(hi, start + step)], weights[start : min(hi, start + step)]
        x, t = _rows(masks[rows], y[rows], total)
        _, t_c = _rows(masks[rows + 1], y[rows + 1], total)
        a = _gram(a, x, w, 2.0)
        b += (x * w[:, None]).T @ (t - t_c)
    return a, b


def _cholesky_solve(
    upper: np.ndarray, b: np.ndarray, singular: bool = False
) -> tuple[np.ndarray, bool]:
    """(a^-1 b, whether a was singular) by Cholesky, for the symmetric a whose upper triangle is
    `upper` (overwritten). Where a is singular (known to be: `singular`; or found so: fewer
    distinct pairs than players, say), with a ridge of RIDGE times its largest diagonal entry:
    as the ridge vanishes that is the minimum-norm solution lstsq gives below
    EXACT_JACKKNIFE_UP_TO, at one factorisation's cost instead of an eigendecomposition's
    (13 s at 4,096 players)."""
    from scipy.linalg import LinAlgError, cho_factor, cho_solve

    if not singular:
        try:
            factor = cho_factor(upper.copy(), check_finite=False)
            return np.asarray(cho_solve(factor, b, check_finite=False)), False
        except LinAlgError:
            pass
    upper.flat[:: len(upper) + 1] += RIDGE * max(float(np.max(np.diag(upper))), 1e-300)
    factor = cho_factor(upper, overwrite_a=True, check_finite=False)
    return np.asarray(cho_solve(factor, b, check_finite=False)), True


def _fit_large(
    plan: Design, y: np.ndarray, total: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None]:
    """`_fit` for many players: Cholesky solves (a pseudo-inverse only where the system is not
    positive definite), the systems built in blocks of rows by symmetric rank-k updates, and
    the same delete-a-group jackknife over fewer groups above LARGE_GROUPS_FROM players (each
    group one refit of the (n-1)^2 system: 0.8 s at 4,096 players on one core)."""
    a_e, b_e = _enumerated_system(plan, y, total)
    if plan.exact:
        head, _ = _cholesky_solve(a_e, b_e)
        return np.concatenate([head, total[None, :] - head.sum(axis=0, keepdims=True)]), None
    n = plan.masks.shape[1]
    groups = min(N_JACKKNIFE if n <= LARGE_GROUPS_FROM else N_JACKKNIFE_LARGE, plan.n_pairs)
    bounds = np.linspace(0, plan.n_pairs, groups + 1).astype(int)  # in pairs
    a_s, b_s = _pairs_system(plan, y, total, 0, plan.n_pairs)
    head, singular = _cholesky_solve(a_e + a_s, b_e + b_s)  # [n-1, k]
    phi = np.concatenate([head, total[None, :] - head.sum(axis=0, keepdims=True)])
    if groups < 2:
        return phi, None
    scale = plan.n_pairs / (plan.n_pairs - np.diff(bounds))
    loo = []
    for (lo, hi), f in zip(pairwise(bounds), scale, strict=True):
        # rebuilt, not kept: G matrices of (n-1)^2 float64 are 1 GB at 4,096 players
        a_g, b_g = _pairs_system(plan, y, total, lo, hi)
        h, _ = _cholesky_solve(a_e + (a_s - a_g) * f, b_e + (b_s - b_g) * f, singular)
        loo.append(np.concatenate([h, total[None, :] - h.sum(axis=0, keepdims=True)]))
    stacked = np.stack(loo)
    spread = ((stacked - stacked.mean(axis=0)) ** 2).sum(axis=0) * (groups - 1) / groups
    return phi, np.maximum(np.sqrt(spread), interpolation_floor(plan, y, phi))
