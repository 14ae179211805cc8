"""One unit of work in one DuckDB transaction: committed whole, or rolled back with its own error kept."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import duckdb


def in_transaction(con: duckdb.DuckDBPyConnection, work: Callable[[], object]) -> None:
    """Run `work` between BEGIN and COMMIT on `con`; on any error roll back and raise that error (a failed COMMIT
    has already ended the transaction, so the ROLLBACK's own error would hide it)."""
    con.execute("BEGIN TRANSACTION")
    try:
        work()
        con.execute("COMMIT")
    except Exception:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise
