"""The statistics of `tracejudge compare` against published values (Newcombe 1998's worked examples, Student's t
tables), and the canary gate's three answers. Their error rates under repeated checks are simulated in
bench/compare.py (BENCHMARKS.md), not here."""

from __future__ import annotations

import pytest

from tracejudge.collector.history.cohort_stats import (
    Moments,
    gate,
    holm,
    mean_difference,
    rate_difference,
    rate_p_value,
    t_two_sided,
    wilson,
)


def test_wilson_and_newcombe_give_the_published_intervals() -> None:
    single = wilson(81, 263)  # Newcombe (1998a), example: 81/263
    assert (round(single.low, 4), round(single.high, 4)) == (0.2553, 0.3662)
    difference = rate_difference(48, 80, 56, 70)  # Newcombe (1998b), example (a): 56/70 - 48/80, method 10
    assert difference.value == pytest.approx(0.2)
    assert (round(difference.low, 4), round(difference.high, 4)) == (0.0524, 0.3339)
    assert wilson(0, 0).value is None and rate_difference(1, 2, 0, 0).value is None


def test_t_and_welch_match_the_tables() -> None:
    assert t_two_sided(2.228, 10) == pytest.approx(0.05, abs=2e-4)  # the 97.5 % quantile of t(10)
    assert t_two_sided(1.96, 1e6) == pytest.approx(0.05, abs=2e-4)
    interval, p = mean_difference(Moments(30, 0.7, 0.04), Moments(30, 0.6, 0.05))
    # Welch: se = sqrt(0.04/30 + 0.05/30) = 0.05477, df = 57.4, t = -1.826
    assert interval.value == pytest.approx(-0.1) and p == pytest.approx(0.0731, abs=1e-3)
    assert interval.low == pytest.approx(-0.1 - 2.0026 * 0.054772, abs=1e-3)
    assert rate_p_value(80, 100, 70, 100) == pytest.approx(0.1025, abs=1e-3)


def test_holm_adjusts_in_steps_and_keeps_the_order() -> None:
    assert holm([0.01, 0.04, 0.03, None]) == [0.03, 0.06, 0.06, None]
    assert holm([0.5]) == [0.5] and holm([]) == []


def test_the_gate_fails_a_worse_candidate_passes_an_equal_one_and_waits_for_data() -> None:
    assert gate(90, 100, 50, 100, margin=0.05).outcome == "fail"
    assert gate(600, 600, 600, 600, margin=0.02).outcome == "pass"
    early = gate(9, 10, 9, 10, margin=0.05)
    assert early.outcome == "undecided" and early.more_needed is not None and early.more_needed > 10
    later = gate(9 * early.more_needed // 10 + 9, early.more_needed + 10, 9 * early.more_needed // 10 + 9,
                 early.more_needed + 10, margin=0.05)
    assert later.outcome == "pass"  # the rates stayed, and about that many more decided it
    assert gate(0, 0, 5, 5, margin=0.05).outcome == "undecided"
