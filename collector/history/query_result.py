"""A query's answer as JSON-ready rows; apart from the query runner so the CLI prints one without DuckDB."""

from __future__ import annotations

import datetime as dt
import decimal
import math
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass
class QueryResult:
    columns: list[str]
    rows: list[list[Any]]
    truncated: bool

    def to_json(self) -> dict[str, Any]:
        return {"columns": self.columns, "rows": [[_plain(v) for v in row] for row in self.rows],
                "truncated": self.truncated}


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN or Infinity; the answer stays strict JSON
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value
