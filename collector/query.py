"""Read-only SQL over the database: the admin API's `/api/query` and `tracejudge query` both run it here.

Only SELECT statements are accepted (checked on the parsed statements, not the text); results are cut at
a row limit and a query running past the timeout is interrupted.
"""

from __future__ import annotations

import datetime as dt
import decimal
import threading
import uuid
from dataclasses import dataclass
from typing import Any

import duckdb

from scoring.errors import TracejudgeError

DEFAULT_LIMIT = 10_000
DEFAULT_TIMEOUT_S = 30.0


class QueryRefused(TracejudgeError):
    """The statement is not a single read-only SELECT."""


class QueryFailed(TracejudgeError):
    """DuckDB rejected or interrupted the query."""


@dataclass
class QueryResult:
    columns: list[str]
    rows: list[list[Any]]
    truncated: bool

    def to_json(self) -> dict[str, Any]:
        return {"columns": self.columns, "rows": [[_plain(v) for v in row] for row in self.rows],
                "truncated": self.truncated}


def _plain(value: Any) -> Any:
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


def check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryFailed(f"cannot parse the query: {exc}") from exc
    if len(statements) != 1:
        raise QueryRefused(f"send exactly one statement, not {len(statements)}")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise QueryRefused(f"only read-only SELECT queries are accepted, not {kind.name}; "
                           "tracejudge's tables change only through the collector")


def run_read_query(con: duckdb.DuckDBPyConnection, sql: str, limit: int = DEFAULT_LIMIT,
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> QueryResult:
    check_read_only(con, sql)
    timer = threading.Timer(timeout_s, con.interrupt)
    timer.start()
    try:
        cursor = con.execute(sql)
        columns = [d[0] for d in cursor.description or []]
        rows = cursor.fetchmany(limit + 1)
    except duckdb.InterruptException as exc:
        raise QueryFailed(f"the query ran past {timeout_s:g} s and was stopped; narrow it down") from exc
    except duckdb.Error as exc:
        raise QueryFailed(str(exc)) from exc
    finally:
        timer.cancel()
    return QueryResult(columns, [list(r) for r in rows[:limit]], len(rows) > limit)
