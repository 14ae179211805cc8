"""Query results on the terminal: an aligned table, CSV or JSON."""

from __future__ import annotations

import csv
import json
import sys
from typing import Any

from tracejudge.collector.history.query_result import QueryResult


def print_result(result: QueryResult, fmt: str) -> None:
    if fmt == "json":
        print(json.dumps(result.to_json(), indent=2, default=str, ensure_ascii=False))
        return
    rows = [[_cell(v) for v in row] for row in result.to_json()["rows"]]
    if fmt == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow(result.columns)
        writer.writerows(rows)
        return
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(result.columns)]
    print("  ".join(c.ljust(w) for c, w in zip(result.columns, widths, strict=True)).rstrip())
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    print(f"({len(rows)} row{'s' if len(rows) != 1 else ''}{', truncated' if result.truncated else ''})")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())  # one line per row, whatever the cell holds
    return text if len(text) <= 80 else text[:77] + "..."
