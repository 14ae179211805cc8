"""Sizes in settings (`50GB`, `512MB`, or plain bytes), the same forms DuckDB's own size settings take."""

from __future__ import annotations

import re

from tracejudge.errors import TracejudgeError

_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


class SizeError(TracejudgeError, ValueError):
    """Not a size tracejudge understands; the message shows the forms it takes."""


def parse_size(value: str | int) -> int:
    """Bytes in `value`: a number of bytes, or a number with a unit (KB, MB, GB, TB, or KiB, MiB, GiB, TiB)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _SIZE.fullmatch(str(value))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise SizeError(f"{value!r} is not a size: use bytes or a number with a unit, like 512MB, 50GB or 2TiB")
    return int(float(match.group(1)) * _UNITS[unit])
