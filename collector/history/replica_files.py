"""Several replicas' database files, attached read-only as one history for an ad-hoc query (no lake).

`conversations` and `scores` become views over every file with a `replica` column (the file's name), and
`latest_scores`/`daily_scores` are rebuilt over them, so the queries that work on one file work here.
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb

from tracejudge.collector.store.schema import history_views, mcp_calls_view, task_views, union_view
from tracejudge.collector.store.span_store import lock_down
from tracejudge.errors import TracejudgeError

UNION_TABLES = ("conversations", "scores")


class ReplicaFileError(TracejudgeError):
    """A replica file is missing or cannot be opened (a collector may hold it)."""


RESERVED = {"temp", "system", "memory", "main"}


def _aliases(paths: list[Path]) -> list[str]:
    aliases: list[str] = []
    for path in paths:
        base = re.sub(r"\W", "_", path.stem) or "replica"
        alias, n = (base if base.lower() not in RESERVED else f"{base}_db"), 2
        while alias in aliases:
            alias, n = f"{base}_{n}", n + 1
        aliases.append(alias)
    return aliases


def open_replica_files(paths: list[Path]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with every file attached read-only and the union views; no file access after."""
    paths = list(dict.fromkeys(p.resolve() for p in paths))  # one file named twice is one replica
    con = duckdb.connect(":memory:")
    aliases = _aliases(paths)
    for alias, path in zip(aliases, paths, strict=True):
        if not path.is_file():
            con.close()
            raise ReplicaFileError(f"no database file {path}")
        try:
            con.execute(f"ATTACH '{str(path).replace(chr(39), chr(39) * 2)}' AS \"{alias}\" (READ_ONLY)")
        except duckdb.Error as exc:
            con.close()
            raise ReplicaFileError(f"cannot open {path} ({exc}); if a collector holds it, stop it or query it "
                                   "through its admin --url") from exc
    for table in UNION_TABLES:
        union = " UNION ALL BY NAME ".join(f"SELECT '{alias}' AS replica, * FROM \"{alias}\".{table}"
                                           for alias in aliases)
        try:
            union_view(con, table, union)
        except duckdb.CatalogException as exc:
            con.close()
            raise ReplicaFileError(f"a file has no {table} table, so it is not a tracejudge database: {exc}") \
                from exc
    con.execute(history_views("temp.main.scores", "replica, ", temporary=True))
    con.execute(mcp_calls_view(temporary=True))
    con.execute(task_views(temporary=True))
    lock_down(con)
    return con
