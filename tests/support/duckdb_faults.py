"""DuckDB's own fault injection, armed in the collector's span store: its next checkpoint fails fatally
(`debug_checkpoint_abort`) and DuckDB invalidates the database, as an out-of-memory rollback does in the field."""

from __future__ import annotations

from collections.abc import Callable

import duckdb

LockDown = Callable[[duckdb.DuckDBPyConnection], None]


def armed(lock_down: LockDown) -> LockDown:
    """`span_store.lock_down` that arms the fault first: set after it, the locked configuration would refuse it."""

    def arm_then_lock(con: duckdb.DuckDBPyConnection) -> None:
        con.execute("SET debug_checkpoint_abort = 'before_header'")
        lock_down(con)

    return arm_then_lock


def armed_collector(repository: str) -> str:
    """`python -c` code that runs `tracejudge` (its arguments follow) with the fault armed."""
    return (f"import sys; sys.path.insert(0, {repository!r})\n"
            "from tests.support.duckdb_faults import armed\n"
            "from tracejudge.collector.store import span_store\n"
            "span_store.lock_down = armed(span_store.lock_down)\n"
            "from tracejudge.collector.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
