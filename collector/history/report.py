"""`tracejudge report` and the admin API's `/report`: score history as one self-contained HTML page."""

from __future__ import annotations

import datetime as dt

import duckdb

from collector.history.report_data import collect, parse_since
from collector.history.report_html import render


def build_report(con: duckdb.DuckDBPyConnection, since: str, source: str, today: dt.date | None = None) -> str:
    """The page for the UTC days from `since` (7d, 24h, 2w or a date) to today; ReportError if it cannot."""
    today = today or dt.datetime.now(dt.UTC).date()
    return render(collect(con, parse_since(since, today), today), source)
