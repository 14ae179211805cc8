"""Trend charts as SVG geometry on a real time axis: the templates draw what this computes."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

WIDTH, HEIGHT, LEFT, BOTTOM, TOP, RIGHT = 560, 170, 40, 24, 10, 10
MIN_BUCKETS = 3  # with fewer, a chart is a dot or two: the figures say more as numbers
MIN_AXIS = dt.timedelta(hours=1)


@dataclass
class Chart:
    lines: list[tuple[str, str]]  # (css class, SVG points)
    dots: list[tuple[str, float, float, str]]  # (css class, x, y, tooltip)
    x_ticks: list[tuple[float, str]]
    y_ticks: list[tuple[float, str]]
    numbers: list[tuple[str, float | None, float | None, float | None]] | None = None  # (bucket, mean, p10, pass)
    width: int = WIDTH
    height: int = HEIGHT


def _x(at: dt.datetime, start: dt.datetime, end: dt.datetime) -> float:
    span = max((end - start).total_seconds(), 1.0)
    return LEFT + (WIDTH - LEFT - RIGHT) * min(max((at - start).total_seconds() / span, 0.0), 1.0)


def _utc(at: dt.datetime) -> dt.datetime:
    return at if at.tzinfo else at.replace(tzinfo=dt.UTC)


def _y(value: float) -> float:
    return TOP + (HEIGHT - TOP - BOTTOM) * (1.0 - min(max(value, 0.0), 1.0))


def trend_chart(points: list[tuple[dt.datetime, float | None, float | None, float | None]], start: dt.datetime,
                end: dt.datetime) -> Chart:
    """Mean, p10 and pass rate per bucket (0..1) against time: the axis runs from the first bucket with data to
    the last (within `start`..`end`, at least an hour), so a day of data in a 90-day window is not squeezed into
    its last pixels. Fewer than MIN_BUCKETS buckets with data: `numbers` instead of lines."""
    with_data = [p for p in points if any(v is not None for v in p[1:])]
    if len(with_data) < MIN_BUCKETS:
        return Chart([], [], [], [], numbers=[(f"{_utc(at):%Y-%m-%d %H:%M} UTC", mean, p10, rate)
                                             for at, mean, p10, rate in with_data])
    first, last = _utc(with_data[0][0]), _utc(with_data[-1][0])
    step = min((_utc(b[0]) - _utc(a[0]) for a, b in zip(with_data, with_data[1:], strict=False)),
               default=MIN_AXIS)
    start, end = max(start, first - step / 2), min(max(end, last), last + step / 2)
    if end - start < MIN_AXIS:
        start = end - MIN_AXIS
    series: dict[str, list[tuple[float, float, str]]] = {"mean": [], "p10": [], "pass": []}
    for at, mean, p10, rate in points:
        moment = _utc(at)
        x = _x(moment, start, end)
        for name, value in (("mean", mean), ("p10", p10), ("pass", rate)):
            if value is not None:
                series[name].append((x, _y(value), f"{name} {value:.2f} at {moment:%Y-%m-%d %H:%M} UTC"))
    lines = [(name, " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in values)) for name, values in series.items()
             if len(values) > 1]
    dots = [(name, x, y, tip) for name, values in series.items() for x, y, tip in values]
    span = end - start
    fmt = "%H:%M" if span <= dt.timedelta(days=1) else "%m-%d %H:%M" if span <= dt.timedelta(days=4) else "%m-%d"
    x_ticks = [(_x(start + span * i / 4, start, end), (start + span * i / 4).strftime(fmt)) for i in range(5)]
    y_ticks = [(_y(v), f"{v:.1f}") for v in (0.0, 0.5, 1.0)]
    return Chart(lines, dots, x_ticks, y_ticks)
