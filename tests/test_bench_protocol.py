"""The held-out protocol's statistics (bench/protocol.py): Wilson interval and the paired
bootstrap RMSE ratio used by docs/benchmarks.md."""

from __future__ import annotations

import numpy as np

from bench.protocol import ratio_interval, wilson


def test_wilson_known_values() -> None:
    # 90% Wilson interval of 8/10 (z = 1.6449), by hand: centre (0.8 + z^2/20) / (1 + z^2/10)
    # = 0.7361, half-width z sqrt(0.016 + z^2/400) / (1 + z^2/10) = 0.1953
    lo, hi = wilson(8, 10)
    assert abs(lo - 0.5408) < 1e-3 and abs(hi - 0.9314) < 1e-3
    assert wilson(0, 0) != wilson(0, 0)  # NaNs: no values, no interval
    lo, hi = wilson(20, 20)
    assert abs(hi - 1.0) < 1e-12 and 0.85 < lo < 0.9


def test_ratio_point_is_rmse_over_best_peer() -> None:
    rng = np.random.default_rng(0)
    ours = rng.random(24) * 0.25
    good, bad = rng.random(24), rng.random(24) * 4
    r = ratio_interval(ours, {"good": good, "bad": bad})
    assert r.best == "good"
    assert abs(r.point - np.sqrt(ours.mean() / good.mean())) < 1e-12
    assert r.lo <= r.point <= r.hi


def test_ratio_paired_interval_is_narrow_for_a_fixed_factor() -> None:
    # ours = 0.25 x the peer on every answer: the paired ratio is 0.5 in every resample
    rng = np.random.default_rng(1)
    peer = rng.exponential(size=16)
    r = ratio_interval(0.25 * peer, {"peer": peer})
    assert abs(r.lo - 0.5) < 1e-12 and abs(r.hi - 0.5) < 1e-12
    assert r.meets(0.5) and not r.meets(0.49)


def test_ratio_leaves_out_peers_that_did_not_run() -> None:
    ours = np.ones(8)
    r = ratio_interval(ours, {"nan": np.full(8, np.nan), "short": np.ones(3), "ok": 4 * ones()})
    assert r.best == "ok" and abs(r.point - 0.5) < 1e-12
    assert not np.isfinite(ratio_interval(ours, {"nan": np.full(8, np.nan)}).point)


def ones() -> np.ndarray:
    return np.ones(8)
