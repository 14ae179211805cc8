"""A set of ids handed to DuckDB as a registered Arrow table.

A Python list bound as a parameter (`IN (SELECT unnest(?))`) is converted element by element (DuckDB 1.5 even
tries `import pandas` for each): 60k trace ids cost seconds of CPU. An Arrow table costs one copy.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager

import duckdb
import pyarrow as pa

from tracejudge.collector.store.connection.arrow_reads import drop_unfinished


@contextmanager
def registered(con: duckdb.DuckDBPyConnection, table: pa.Table) -> Iterator[str]:
    """A unique name under which `table` can be queried on `con` for the block's duration."""
    name = f"arrow_{uuid.uuid4().hex}"
    drop_unfinished(con)
    con.register(name, table)
    try:
        yield name
    except BaseException:
        # in a transaction the block's error aborted, DuckDB 2 refuses the unregister too; the caller's rollback
        # drops the name, and the block's own error is the one to tell
        with contextlib.suppress(duckdb.Error):
            con.unregister(name)
        raise
    con.unregister(name)


def id_table(con: duckdb.DuckDBPyConnection, values: Iterable[str | int],
             type: pa.DataType | None = None) -> AbstractContextManager[str]:
    """The name of a one-column (`id`) table holding `values`, registered on `con` for the block's duration."""
    return registered(con, pa.table({"id": pa.array(list(values), type=type or pa.string())}))
