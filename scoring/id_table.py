"""A set of ids handed to DuckDB as a registered Arrow table.

A Python list bound as a parameter (`IN (SELECT unnest(?))`) is converted element by element (DuckDB 1.5 even
tries `import pandas` for each): 60k trace ids cost seconds of CPU. An Arrow table costs one copy.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import duckdb
import pyarrow as pa


@contextmanager
def id_table(con: duckdb.DuckDBPyConnection, values: Iterable[str | int],
             type: pa.DataType | None = None) -> Iterator[str]:
    """The name of a one-column (`id`) table holding `values`, registered on `con` for the block's duration."""
    name = f"ids_{uuid.uuid4().hex}"
    con.register(name, pa.table({"id": pa.array(list(values), type=type or pa.string())}))
    try:
        yield name
    finally:
        con.unregister(name)
