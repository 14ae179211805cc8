"""What a score report shows, read with SQL from any history: one file, several replicas, or the lake.

The connection needs `scores`, `conversations`, `latest_scores` and `daily_scores`; `eval_jobs` is read
when present (a replica's own file has it, the lake does not).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

import duckdb

from collector import durations
from collector.durations import DurationError
from scoring.errors import TracejudgeError

WORST = 10
BINS = 10
MAX_REPORT_DAYS = 731  # a report covers two years at most, whichever way --since is written


class ReportError(TracejudgeError):
    """The report cannot be built: a bad --since or a database without tracejudge's tables."""


def parse_since(text: str, today: dt.date) -> dt.date:
    """`7d`, `12h`, `2w` (back from today, UTC) or a date like 2026-11-25."""
    try:
        return durations.parse_since(text, today, MAX_REPORT_DAYS)
    except DurationError as exc:
        raise ReportError(str(exc)) from None


@dataclass
class DailyPoint:
    day: dt.date
    mean: float | None
    p10: float | None
    pass_rate: float | None
    conversations: int


@dataclass
class Worst:
    conversation_id: str
    version: int
    metric: str
    service: str | None
    score: float | None
    reason: str | None
    error: str | None
    test_case: dict[str, Any]


@dataclass
class ReportData:
    since: dt.date
    until: dt.date
    days: list[dt.date]
    daily: dict[tuple[str, str], list[DailyPoint]] = field(default_factory=dict)  # (metric, service) -> points
    histogram: dict[str, list[int]] = field(default_factory=dict)  # metric -> counts per score bin
    cost: dict[dt.date, float] = field(default_factory=dict)
    worst: list[Worst] = field(default_factory=list)
    fallbacks: list[tuple[str, str, int]] = field(default_factory=list)  # metric, reason, count
    score_errors: list[tuple[str, str, int]] = field(default_factory=list)
    failed_jobs: list[tuple[str, str, int]] | None = None  # None: no eval_jobs table (the lake)
    replicas: list[str] = field(default_factory=list)


def _has(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    try:
        con.execute(f"SELECT 1 FROM {name} LIMIT 0")
    except duckdb.CatalogException:
        return False
    return True


def collect(con: duckdb.DuckDBPyConnection, since: dt.date, until: dt.date) -> ReportData:
    """Every figure of the report for the UTC days since..until."""
    for name in ("scores", "conversations", "daily_scores", "latest_scores"):
        if not _has(con, name):
            raise ReportError(f"no {name} table or view here: is this a tracejudge database?")
    days = [since + dt.timedelta(days=i) for i in range((until - since).days + 1)]
    data = ReportData(since, until, days)
    window = [since, until]
    for metric, service, day, mean, p10, pass_rate, n in con.execute(
            "SELECT metric, coalesce(service_name, '(none)'), day, mean_score, p10, pass_rate, conversations "
            "FROM daily_scores WHERE day BETWEEN ? AND ? ORDER BY 1, 2, 3", window).fetchall():
        data.daily.setdefault((metric, service), []).append(DailyPoint(day, mean, p10, pass_rate, n))
    for metric, bin_, n in con.execute(
            f"SELECT metric, greatest(0, least(CAST(floor(score * {BINS}) AS INTEGER), {BINS - 1})), count(*) "
            "FROM latest_scores "
            "WHERE score IS NOT NULL AND CAST(timezone('UTC', scored_at) AS DATE) BETWEEN ? AND ? GROUP BY 1, 2",
            window).fetchall():
        data.histogram.setdefault(metric, [0] * BINS)[bin_] += n
    for day, cost in con.execute(
            "SELECT CAST(timezone('UTC', scored_at) AS DATE) AS day, sum(evaluation_cost) FROM scores "
            "WHERE CAST(timezone('UTC', scored_at) AS DATE) BETWEEN ? AND ? GROUP BY 1", window).fetchall():
        data.cost[day] = cost or 0.0
    in_window = "CAST(timezone('UTC', s.scored_at) AS DATE) BETWEEN ? AND ?"
    replica = "replica" in [column for column, *_ in con.execute("DESCRIBE scores").fetchall()]
    join = "AND c.replica = s.replica" if replica else ""
    for row in con.execute(
            "SELECT s.conversation_id, s.conversation_version, s.metric, s.service_name, s.score, s.reason, "
            f"s.error, c.test_case FROM latest_scores s LEFT JOIN conversations c ON c.conversation_id = "
            f"s.conversation_id AND c.version = s.conversation_version {join} WHERE {in_window} AND "
            "(s.score IS NOT NULL OR s.error IS NOT NULL) AND s.metric <> 'mcp_call_validity' "
            f"ORDER BY s.score ASC NULLS FIRST, s.scored_at DESC LIMIT {WORST}", window).fetchall():
        test_case = json.loads(row[7]) if isinstance(row[7], str) else (row[7] or {})
        data.worst.append(Worst(row[0], row[1], row[2], row[3], row[4], row[5], row[6], test_case))
    data.fallbacks = [tuple(r) for r in con.execute(
        f"SELECT s.metric, s.fallback_reason, count(*) FROM scores s WHERE {in_window} AND s.fallback_reason "
        "IS NOT NULL GROUP BY 1, 2 ORDER BY 3 DESC", window).fetchall()]
    data.score_errors = [tuple(r) for r in con.execute(
        f"SELECT s.metric, s.error, count(*) FROM scores s WHERE {in_window} AND s.error IS NOT NULL "
        "GROUP BY 1, 2 ORDER BY 3 DESC", window).fetchall()]
    if _has(con, "eval_jobs"):
        data.failed_jobs = [tuple(r) for r in con.execute(
            "SELECT metric, coalesce(last_error, '(no message)'), count(*) FROM eval_jobs WHERE status = 'failed' "
            "AND CAST(timezone('UTC', updated_at) AS DATE) BETWEEN ? AND ? GROUP BY 1, 2 ORDER BY 3 DESC",
            window).fetchall()]
    if replica:
        data.replicas = [r[0] for r in con.execute("SELECT DISTINCT replica FROM scores ORDER BY 1").fetchall()]
    return data
