"""Opening a database file the collector writes, in the storage format both DuckDB versions it runs on read.

The collector installs DuckDB 2 by default and DuckDB 1.5.5 with the lake (`pip install 'tracejudge[lake]'`: the
lake's extension packages exist for 1.5.5 only). DuckDB 2 writes a file format 1.5 cannot open, so a deployment that
adds the lake later, or goes back a version, would find its history unreadable; every file the collector writes
is kept in the 1.5 format, which both read and write.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

FILE_FORMAT = "v1.5.0"  # DuckDB's `storage_compatibility_version`: the oldest DuckDB that must read the file


def connect_file(path: Path | str) -> duckdb.DuckDBPyConnection:
    """A read-write connection to the file (created if missing); files it creates or attaches are in `FILE_FORMAT`."""
    return duckdb.connect(str(path), config={"storage_compatibility_version": FILE_FORMAT})
