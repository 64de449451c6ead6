"""The figures of bench/tree_audit_bench.py that need no server: quarter rates from progress
samples, and the value check signed by the output an explanation reports."""

from __future__ import annotations

import numpy as np

from bench.tree_audit_bench import check_values, crossing, quarter_rates


def test_crossing_interpolates_between_samples() -> None:
    samples = [(1.0, 0), (2.0, 100), (3.0, 300)]
    assert crossing(samples, 50) == 1.5
    assert crossing(samples, 200) == 2.5
    assert crossing(samples, 300) == 3.0
    assert crossing(samples, 301) is None


def test_quarter_rates_linear_and_slowing() -> None:
    steady = [(t * 0.5, min(400, int(t * 0.5 * 100))) for t in range(1, 10)]
    rates = quarter_rates(steady, 400, poll=0.5)
    assert rates.first is not None and abs(rates.first - 100) < 1e-9
    assert rates.last is not None and abs(rates.last - 100) < 1e-9
    assert rates.ratio is not None and abs(rates.ratio - 1) < 1e-9
    # the last quarter twice as slow as the first
    slowing = [(1.0, 100), (2.0, 200), (3.0, 300), (5.0, 400)]
    rates = quarter_rates(slowing, 400, poll=0.5)
    assert rates.ratio is not None and abs(rates.ratio - 0.5) < 1e-9


def test_quarter_rates_too_fast_for_the_polling() -> None:
    rates = quarter_rates([(0.5, 1000)], 1000, poll=0.5)
    assert rates.first is None and rates.last is None and rates.ratio is None
    assert "polling" in rates.note


def test_check_values_signs_by_output() -> None:
    reference = np.array([[0.5, -1.0], [2.0, 0.25], [0.0, 3.0]])
    picks = np.array([0, 2])
    answers = {0: (1, [0.5, -1.0]), 2: (0, [0.0, -3.0 + 1e-5])}  # output 0: minus the log-odds
    check = check_values(reference, answers, picks)
    assert check.ok and check.rows == 2 and check.output_indices == [0, 1]
    assert check.max_abs_diff is not None and check.max_abs_diff < 2e-5
    wrong_sign = check_values(reference, {0: (0, [0.5, -1.0]), 2: (1, [0.0, 3.0])}, picks)
    assert not wrong_sign.ok
    missing = check_values(reference, {0: (1, [0.5, -1.0])}, picks)
    assert not missing.ok and missing.rows == 1
