"""Publish this replica's conversations and scores to a shared DuckLake, and open the lake for queries.

Each replica keeps spans and jobs in its own DuckDB file and copies the finished rows (conversations,
scores) to one DuckLake (a PostgreSQL catalog plus a shared data path), tagged with its replica name, so
`tracejudge query --lake` sees every replica's history. DuckLake has no unique constraints, so a publish
inserts only the rows whose key this replica has not published yet: a retry after a failure or a crash
never duplicates a row, and a row is only counted as published once the lake transaction committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from tracejudge.collector.store.connection.arrow_reads import arrow_table
from tracejudge.collector.store.schema import history_views, mcp_calls_view, task_views, union_view
from tracejudge.errors import TracejudgeError

LAKE_ALIAS = "lake"
# table -> (the time column rows are published by, the columns that identify a row)
TABLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "conversations": ("assembled_at", ("conversation_id", "version")),
    "scores": ("scored_at", ("conversation_id", "conversation_version", "metric", "metric_config")),
}
# rows are re-checked this far behind the newest published one: a transaction that stamped its rows
# before the last publish but committed after it is still picked up (the key check drops repeats)
LATE_COMMIT_MARGIN = timedelta(minutes=10)
EXTENSIONS = ("postgres_scanner", "ducklake")


class LakeError(TracejudgeError):
    """The lake cannot be opened or written; the message names the catalog and what to check."""


@dataclass(frozen=True)
class LakeConfig:
    catalog: str  # what follows `ducklake:` in ATTACH: `postgres:dbname=... host=...`, `sqlite:f.db`, `f.ducklake`
    data_path: str | None
    replica: str


INSTALL_LAKE = "pip install 'tracejudge[lake]'"  # the extension packages and the one DuckDB they are built for


def _extension_file(name: str) -> Path:
    """The extension binary shipped by the `duckdb-extension-<name>` package (no download at run time), built for
    the DuckDB running (DuckDB refuses any other)."""
    spec = importlib.util.find_spec(f"duckdb_extension_{name}")
    if spec is None or not spec.submodule_search_locations:
        raise LakeError(f"the lake needs the DuckDB extension {name}, which is not installed: {INSTALL_LAKE} "
                        "installs it with the DuckDB it is built for (1.5.5)")
    root = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(root.glob(f"extensions/*/{name}.duckdb_extension"))
    if not found:
        raise LakeError(f"the package duckdb-extension-{name} holds no extension binary under {root}")
    built_for = found[-1].parent.name.removeprefix("v")
    if built_for != duckdb.__version__:
        raise LakeError(f"the DuckDB extension {name} is built for DuckDB {built_for}, and this is DuckDB "
                        f"{duckdb.__version__}: {INSTALL_LAKE} installs the DuckDB the lake's extensions need")
    return found[-1]


def check_extensions() -> None:
    """LakeError unless every extension the lake loads is installed for the DuckDB running."""
    for name in EXTENSIONS:
        _extension_file(name)


def _attach_sql(config: LakeConfig, read_only: bool) -> str:
    target = "ducklake:" + _with_timeouts(config.catalog)
    options = []
    if config.data_path and not read_only:
        options.append(f"DATA_PATH '{_quote(config.data_path)}'")
    if read_only:
        options.append("READ_ONLY")
    suffix = f" ({', '.join(options)})" if options else ""
    return f"ATTACH '{_quote(target)}' AS {LAKE_ALIAS}{suffix}"


def _quote(text: str) -> str:
    return text.replace("'", "''")


_PASSWORD = re.compile(r"(?i)(password\s*=\s*)('[^']*'|\S+)")
_USERINFO = re.compile(r"(://[^/@\s:]+):[^@/\s]*@")


def _scrub(text: str) -> str:
    """Text with any password of a libpq connection string or URI removed (DuckDB repeats the string)."""
    return _USERINFO.sub(r"\1:***@", _PASSWORD.sub(r"\1***", text))


def _with_timeouts(catalog: str) -> str:
    """A PostgreSQL catalog that does not hang a publish or a stop when the server is unreachable."""
    if catalog.startswith("postgres:") and "connect_timeout" not in catalog and "://" not in catalog:
        return catalog + " connect_timeout=10"
    return catalog


def open_lake(config: LakeConfig, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the lake attached as `lake`; LakeError says what failed."""
    con = duckdb.connect(":memory:")
    try:
        for name in EXTENSIONS:
            con.execute(f"LOAD '{_quote(str(_extension_file(name)))}'")
        con.execute(_attach_sql(config, read_only))
    except duckdb.Error as exc:
        con.close()
        raise LakeError(f"cannot attach the DuckLake {_scrub(config.catalog)!r}: {_scrub(str(exc))}; check "
                        "[lake] catalog and data_path, that the catalog database is reachable, and PGPASSWORD "
                        "if it needs one") from exc
    except LakeError:
        con.close()
        raise
    return con


def open_lake_for_query(config: LakeConfig) -> duckdb.DuckDBPyConnection:
    """The lake read-only, with the history views, and no file access beyond the lake's own data."""
    con = open_lake(config, read_only=True)
    con.execute(f"USE {LAKE_ALIAS}")
    for table in TABLES:
        _require_table(con, table)
    con.execute("USE memory")
    for table in TABLES:
        union_view(con, table, f"SELECT * FROM {LAKE_ALIAS}.{table}")
    con.execute(history_views("temp.main.scores", "replica, ", temporary=True))
    con.execute(mcp_calls_view(temporary=True))
    con.execute(task_views(temporary=True))
    rows = con.execute("SELECT value FROM __ducklake_metadata_lake.ducklake_metadata WHERE key = 'data_path'"
                       ).fetchall()
    if not rows:
        raise LakeError("the lake's catalog names no data path; publish to it from a replica with [lake] data_path")
    data_path = rows[0][0]
    if "://" not in data_path:
        con.execute("SET allowed_directories = [?]", [data_path])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def _require_table(con: duckdb.DuckDBPyConnection, table: str) -> None:
    found = con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND table_name = ?",
                        [LAKE_ALIAS, table]).fetchall()
    if not found or not found[0][0]:
        raise LakeError(f"the lake has no {table} table yet: no replica has published to it")


class LakePublisher:
    """Copies new rows of the local tables to the lake; `publish()` is safe to repeat at any time."""

    def __init__(self, local: duckdb.DuckDBPyConnection, config: LakeConfig,
                 log: Callable[..., None] | None = None) -> None:
        self.local = local
        self.config = config
        self.log = log or (lambda *a, **k: None)
        self.lake: duckdb.DuckDBPyConnection | None = None
        self.watermarks: dict[str, datetime | None] = {}
        self.published = {table: 0 for table in TABLES}
        self.last_error: str | None = None
        self._lock = threading.Lock()

    def _connect(self) -> duckdb.DuckDBPyConnection:
        if self.lake is None:
            lake = open_lake(self.config)
            for table in TABLES:
                self._create(lake, table)
            self.watermarks = {table: self._newest(lake, table) for table in TABLES}
            self.lake = lake
        return self.lake

    def _create(self, lake: duckdb.DuckDBPyConnection, table: str) -> None:
        """The lake table, with every local column: a newer replica adds the columns it brings."""
        columns = [(name, kind) for name, kind, *_ in self.local.execute(f"DESCRIBE {table}").fetchall()]
        ddl = ", ".join(f'"{name}" {kind}' for name, kind in columns)
        self._retrying(lake, f"CREATE TABLE IF NOT EXISTS {LAKE_ALIAS}.{table} (replica VARCHAR, {ddl})")
        present = {r[0] for r in lake.execute(f"DESCRIBE {LAKE_ALIAS}.{table}").fetchall()}
        for name, kind in columns:
            if name not in present:
                self._retrying(lake, f'ALTER TABLE {LAKE_ALIAS}.{table} ADD COLUMN IF NOT EXISTS "{name}" {kind}')

    @staticmethod
    def _retrying(lake: duckdb.DuckDBPyConnection, ddl: str) -> None:
        for attempt in range(5):  # two replicas changing the catalog at once: one wins, the other retries
            try:
                lake.execute(ddl)
                return
            except duckdb.TransactionException:
                time.sleep(0.1 * (attempt + 1))
        lake.execute(ddl)

    def _newest(self, lake: duckdb.DuckDBPyConnection, table: str) -> datetime | None:
        column = TABLES[table][0]
        row = lake.execute(f"SELECT max({column})::VARCHAR FROM {LAKE_ALIAS}.{table} WHERE replica = ?",
                           [self.config.replica]).fetchall()
        return datetime.fromisoformat(row[0][0]) if row and row[0][0] else None

    def publish(self) -> dict[str, int]:
        """Publish what is new; the rows inserted per table. LakeError when the lake cannot be written."""
        with self._lock:
            try:
                lake = self._connect()
                counts = {table: self._publish_table(lake, table) for table in TABLES}
            except duckdb.Error as exc:
                self._reset()
                self.last_error = _scrub(f"{type(exc).__name__}: {exc}")
                raise LakeError(f"publishing to the lake {_scrub(self.config.catalog)!r} failed: "
                                f"{_scrub(str(exc))}; the "
                                "rows stay local and are published on the next try") from exc
            self.last_error = None
            return counts

    def _publish_table(self, lake: duckdb.DuckDBPyConnection, table: str) -> int:
        column, key = TABLES[table]
        watermark = self.watermarks.get(table)
        since = watermark - LATE_COMMIT_MARGIN if watermark is not None else None
        where, params = (f"WHERE {column} >= ?", [since]) if since is not None else ("", [])
        rows: pa.Table = arrow_table(self.local, f"SELECT * FROM {table} {where}", params)
        if rows.num_rows == 0:
            return 0
        match = " AND ".join(f'l."{k}" IS NOT DISTINCT FROM i."{k}"' for k in key)
        recent = f"AND l.{column} >= ?" if since is not None else ""
        lake.register("incoming_rows", rows)
        try:
            lake.execute("BEGIN TRANSACTION")
            [(inserted,)] = lake.execute(
                f"INSERT INTO {LAKE_ALIAS}.{table} BY NAME SELECT ? AS replica, i.* FROM incoming_rows i "
                f"WHERE NOT EXISTS (SELECT 1 FROM {LAKE_ALIAS}.{table} l WHERE l.replica = ? {recent} AND {match})",
                [self.config.replica, self.config.replica, *([since] if since is not None else [])]).fetchall()
            lake.execute("COMMIT")
        except duckdb.Error:
            with contextlib.suppress(duckdb.Error):
                lake.execute("ROLLBACK")
            raise
        finally:
            lake.unregister("incoming_rows")
        newest = _max_time(rows, column)
        if newest is not None and (watermark is None or newest > watermark):
            self.watermarks[table] = newest
        self.published[table] += inserted
        return inserted

    def _reset(self) -> None:
        if self.lake is not None:
            with contextlib.suppress(duckdb.Error):
                self.lake.close()
        self.lake = None

    def close(self, timeout_s: float = 15.0) -> None:
        """Close the lake connection; gives up after `timeout_s` if a publish is still running."""
        if self._lock.acquire(timeout=timeout_s):
            try:
                self._reset()
            finally:
                self._lock.release()


def _max_time(rows: pa.Table, column: str) -> datetime | None:
    value: Any = pc.max(rows[column]).as_py()
    if value is None:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)



async def publish_periodically(publisher: LakePublisher, interval_s: float, stop: asyncio.Event,
                               log: Callable[..., None]) -> None:
    """Publish every `interval_s` until `stop`, then once more, so a clean stop leaves nothing behind."""
    while True:
        stopping = stop.is_set()
        try:
            counts = await asyncio.to_thread(publisher.publish)
            if any(counts.values()):
                log("info", "published to the lake", **counts)
        except LakeError as exc:
            log("error", "lake publish failed", reason=str(exc))
        except Exception as exc:  # never end the loop: the rows stay local and the next round retries
            log("error", "lake publish failed", reason=_scrub(f"{type(exc).__name__}: {exc}"))
        if stopping:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
