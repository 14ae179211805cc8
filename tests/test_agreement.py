"""The judge-agreement estimator (collector/history/agreement.py): Cohen's kappa from inverse-probability-weighted
proportions, with bootstrap intervals. Its bias and coverage are checked by simulation in bench/agreement.py."""

from __future__ import annotations

import pytest

from tracejudge.collector.history.agreement import agreement


def test_kappa_is_cohens_on_the_reviewed_items_when_all_were_equally_likely() -> None:
    result = agreement([True, True, False, False], [True, False, False, False], resamples=200)
    # observed agreement 3/4; chance 0.5 x 0.25 + 0.5 x 0.75 = 0.5; kappa (0.75 - 0.5) / 0.5
    assert result.kappa.value == pytest.approx(0.5) and result.accuracy.value == pytest.approx(0.75)
    assert result.kappa.n == 4


def test_an_item_the_queue_chose_half_as_often_counts_twice() -> None:
    result = agreement([True, True, False, False], [True, False, False, False], [1, 0.5, 1, 1], resamples=0)
    # weights 1, 2, 1, 1: observed 3/5; judge passes 3/5, human 1/5; chance 0.12 + 0.32 = 0.44
    assert result.kappa.value == pytest.approx((0.6 - 0.44) / 0.56)
    assert result.kappa.low is None  # no resamples, no interval


def test_the_interval_holds_the_estimate_and_narrows_with_more_reviews() -> None:
    judge = [i % 10 != 0 for i in range(400)]
    human = [i % 10 not in (0, 1) for i in range(400)]
    wide = agreement(judge[:40], human[:40], resamples=500).kappa
    narrow = agreement(judge, human, resamples=500).kappa
    assert wide.low <= wide.value <= wide.high and narrow.low <= narrow.value <= narrow.high
    assert narrow.high - narrow.low < wide.high - wide.low


def test_what_cannot_be_estimated_is_none_and_bad_input_is_refused() -> None:
    assert agreement([], []).kappa.value is None
    assert agreement([True, True], [True, True], resamples=50).kappa.value is None  # one class: kappa undefined
    with pytest.raises(ValueError, match="one entry per reviewed item"):
        agreement([True], [True, False])
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        agreement([True], [True], [0.0])
