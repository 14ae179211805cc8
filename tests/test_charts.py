"""Trend charts: a line needs enough buckets, and the time axis follows the data, not the whole window."""

from __future__ import annotations

import datetime as dt

from tracejudge.collector.ui.charts import LEFT, RIGHT, WIDTH, trend_chart

NOW = dt.datetime(2026, 12, 5, 12, tzinfo=dt.UTC)
WEEK_AGO = NOW - dt.timedelta(days=7)


def test_fewer_than_three_buckets_are_numbers_not_dots() -> None:
    points = [(NOW - dt.timedelta(hours=2), 0.8, 0.5, 0.9), (NOW - dt.timedelta(hours=1), None, None, None),
              (NOW, 0.6, 0.2, 0.7)]
    chart = trend_chart(points, WEEK_AGO, NOW)
    assert chart.dots == [] and chart.lines == []
    assert [(mean, rate) for _, mean, _, rate in chart.numbers or []] == [(0.8, 0.9), (0.6, 0.7)]


def test_a_few_hours_of_data_in_a_week_window_fill_the_axis() -> None:
    points = [(NOW - dt.timedelta(hours=h), 0.5, 0.4, 0.6) for h in (3, 2, 1, 0)]
    chart = trend_chart(points, WEEK_AGO, NOW)
    assert chart.numbers is None and len(chart.lines) == 3
    xs = sorted({x for _, x, _, _ in chart.dots})
    plot = WIDTH - LEFT - RIGHT
    assert xs[0] < LEFT + 0.2 * plot and xs[-1] > LEFT + 0.8 * plot  # not squeezed into the week's last pixels
    assert all(":" in label for _, label in chart.x_ticks)  # hours, not dates


def test_data_across_the_window_keeps_the_window() -> None:
    points = [(WEEK_AGO + dt.timedelta(days=d), 0.5, 0.4, 0.6) for d in range(8)]
    chart = trend_chart(points, WEEK_AGO, NOW)
    xs = sorted({x for _, x, _, _ in chart.dots})
    assert xs[0] <= LEFT + 0.1 * (WIDTH - LEFT - RIGHT) and xs[-1] >= WIDTH - RIGHT - 0.1 * (WIDTH - LEFT - RIGHT)
