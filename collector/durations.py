"""One time syntax everywhere: durations (`90s`, `5m`, `2h`, `7d`, `2w`, or plain seconds) for settings and
flags, and `--since` (a duration back from today, or a date like 2026-11-25) for reports and exports."""

from __future__ import annotations

import datetime as dt
import re

from tracejudge.errors import TracejudgeError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*")
MAX_DAYS_BACK = 36_600  # a century


class DurationError(TracejudgeError, ValueError):
    """Not a duration or a date tracejudge understands; the message shows the forms it takes."""


def parse_duration(value: str | float | int) -> float:
    """Seconds in `value`: a number of seconds, or a number with a unit (ms, s, m, h, d, w)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    match = _DURATION.fullmatch(str(value))
    if not match:
        raise DurationError(f"{value!r} is not a duration: use seconds or a number with a unit, like 5s, 2m, "
                            "1h, 7d or 2w")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def parse_since(text: str, today: dt.date, max_days: int = MAX_DAYS_BACK) -> dt.date:
    """The first UTC day of `--since`: a duration back from today (7d is today and the 6 days before it,
    24h today) or an ISO date; at most `max_days` back either way."""
    try:
        day = dt.date.fromisoformat(text.strip())
    except ValueError:
        day = None
    if day is not None:
        return max(day, today - dt.timedelta(days=max_days - 1))
    try:
        seconds = parse_duration(text)
    except DurationError:
        raise DurationError(f"--since must be like 7d, 24h, 2w or 2026-11-25, not {text!r}") from None
    days = min(int(seconds // 86400 + (1 if seconds % 86400 else 0)), max_days)
    return today - dt.timedelta(days=max(0, days - 1))
