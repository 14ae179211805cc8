"""Where `tracejudge query` and `tracejudge report` read score history from, when not from a running
collector: the shared lake, several replica files, or one database file, always read-only."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb

from collector.config import load_settings
from collector.history.lake import LakeError, open_lake_for_query
from collector.history.replica_files import ReplicaFileError, open_replica_files
from collector.store.span_store import lock_down


def open_history(lake: bool, dbs: list[str] | None, config: str | None) -> tuple[duckdb.DuckDBPyConnection, str]:
    """A read-only connection with the history tables and views, and a description of its source.

    Raises LakeError, ReplicaFileError or ConfigError with what to fix.
    """
    if lake:
        found = load_settings(Path(config) if config else None).lake.lake_config()
        if found is None:
            raise LakeError("no lake is configured: set [lake] catalog in tracejudge.toml or TRACEJUDGE_LAKE_CATALOG")
        return open_lake_for_query(found), f"the lake of replica {found.replica}'s configuration"
    paths = [Path(p) for p in dbs or [os.environ.get("TRACEJUDGE_DB") or "tracejudge.duckdb"]]
    if len(paths) > 1:
        return open_replica_files(paths), "the replica files " + ", ".join(str(p) for p in paths)
    if not paths[0].is_file():
        raise ReplicaFileError(f"there is no database file {paths[0]}")
    try:
        con = duckdb.connect(str(paths[0]), read_only=True)
    except duckdb.Error as exc:
        raise ReplicaFileError(f"cannot open {paths[0]} ({exc}); if a collector holds it, pass its admin --url") \
            from exc
    lock_down(con)
    return con, str(paths[0])
