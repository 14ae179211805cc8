"""Query answers as Arrow, read the cheaper way on each DuckDB version the collector runs on.

DuckDB 1.5 reads a prepared statement's answer into Arrow faster than a relation's (a relation with parameters cost
about half as much CPU again, and the assembler's span reads three times the time in `python
bench/pipeline_pace.py`); DuckDB 2 copies a statement's rows once more on the way to Arrow, so there a relation is
the cheaper. Every Arrow read of a query's answer goes through here. A relation runs its query when its answer is
read, outside the cursor's `execute`: on a `GatedCursor` that read goes through `reading`, so a FatalException it
raises reaches the collector as a statement's does (a streamed reader's later batches are read by the caller). DuckDB
2 also refuses a relation (and a registered Arrow table) on a connection whose last answer was not fetched to its
end, which 1.5 drops at the next statement: `drop_unfinished` drops it first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import duckdb
import pyarrow as pa

from tracejudge.collector.store.connection.checkpoint_gate import GatedCursor

_T = TypeVar("_T")

DUCKDB_MAJOR = int(duckdb.__version__.split(".", 1)[0])
DEFAULT_BATCH_ROWS = 1_000_000  # DuckDB's own default; it reserves each column's buffers for a whole batch at once


def arrow_table(con: duckdb.DuckDBPyConnection, query: str, params: list[Any] | None = None,
                batch_rows: int = DEFAULT_BATCH_ROWS) -> pa.Table:
    """The whole answer of `query` as one Arrow table, in batches of `batch_rows`."""
    if DUCKDB_MAJOR >= 2:
        return _relation_read(con, query, lambda: con.sql(query, params=params).to_arrow_table(batch_rows))
    return con.execute(query, params).to_arrow_table(batch_rows)


def arrow_batches(con: duckdb.DuckDBPyConnection, query: str, params: list[Any] | None = None,
                  batch_rows: int = DEFAULT_BATCH_ROWS) -> pa.RecordBatchReader:
    """The answer of `query` streamed `batch_rows` at a time: only a batch is held, whatever the table's size."""
    if DUCKDB_MAJOR >= 2:
        return _relation_read(con, query, lambda: con.sql(query, params=params).to_arrow_reader(batch_rows))
    return con.execute(query, params).to_arrow_reader(batch_rows)


def _relation_read(con: duckdb.DuckDBPyConnection | GatedCursor, query: str, read: Callable[[], _T]) -> _T:
    drop_unfinished(con)
    return con.reading(query, read) if isinstance(con, GatedCursor) else read()


def drop_unfinished(con: duckdb.DuckDBPyConnection | GatedCursor) -> None:
    """DuckDB 2 refuses a relation or an Arrow table registered on a connection whose last answer was not fetched to
    its end (a `fetchone()`, even of a one-row answer); 1.5 drops that answer at the next statement, and so does this
    on 2."""
    if DUCKDB_MAJOR >= 2:
        con.abort()
