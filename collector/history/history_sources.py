"""Where `tracejudge query` and `tracejudge report` read score history from, when not from a running
collector: the shared lake, several replica files, or one database file, always read-only."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb

from tracejudge.collector.config import load_settings
from tracejudge.collector.history.lake import LakeError, open_lake_for_query
from tracejudge.collector.history.replica_files import ReplicaFileError, open_replica_files
from tracejudge.collector.store.span_store import lock_down

# what retention archives (collector/pipeline/retention.py AGED, and spans), and the live rows of each
LIVE = {"spans": "spans", "conversations": "conversations", "scores": "scores",
        "failed_jobs": "eval_jobs WHERE status = 'failed'", "done_jobs": "eval_jobs WHERE status = 'done'",
        "reviews": "reviews", "review_queue": "review_queue", "review_thumbs_down": "review_thumbs_down",
        "cohort_counts": "cohort_counts", "pruned_conversations": "pruned_conversations",
        "judge_batches": "judge_batch_requests"}
ARCHIVED = tuple(LIVE)


def open_history(lake: bool, dbs: list[str] | None, config: str | None,
                 archive: Path | None = None) -> tuple[duckdb.DuckDBPyConnection, str]:
    """A read-only connection with the history tables and views, and a description of its source; with
    `archive`, also `archived_<table>` (the Parquet files retention wrote) and `all_<table>` (live and archived).

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
    if archive is not None:
        attach_archive(con, archive)
    lock_down(con)
    return con, str(paths[0]) + (f" and the archive {archive}" if archive is not None else "")


def attach_archive(con: duckdb.DuckDBPyConnection, archive: Path) -> None:
    """Views over the archive's Parquet files; reading is allowed under `archive` only."""
    if not archive.is_dir():
        raise ReplicaFileError(f"there is no archive directory {archive}")
    root = archive.resolve()
    con.execute(f"SET allowed_directories = ['{_quoted(str(root))}']")
    for name in ARCHIVED:
        if not any((root / name).glob("day=*/*.parquet")):
            continue
        files = _quoted(str(root / name / "day=*" / "*.parquet"))
        con.execute(f"CREATE TEMP VIEW archived_{name} AS SELECT * EXCLUDE (day) FROM read_parquet('{files}', "
                    "hive_partitioning = true, union_by_name = true)")
        con.execute(f"CREATE TEMP VIEW all_{name} AS SELECT * FROM {LIVE[name]} UNION ALL BY NAME "
                    f"SELECT * FROM archived_{name}")


def _quoted(text: str) -> str:
    return text.replace("'", "''")
