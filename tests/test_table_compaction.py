"""Keyed tables give their deleted rows back: DuckDB 1.5 does not vacuum a table with a primary key (2.0 drops or
merges the row groups it can, and keeps the deleted rows of the others), so retention rewrites one that still holds
more deleted rows than live ones, and the file's blocks are reused."""

from __future__ import annotations

from pathlib import Path

import duckdb

from tracejudge.collector.config import RetentionSettings
from tracejudge.collector.pipeline.retention import Retention
from tracejudge.collector.store.connection.arrow_reads import DUCKDB_MAJOR
from tracejudge.collector.store.schema import migrate
from tracejudge.collector.store.table_compaction import compact, garbage, keyed_tables


def _used_blocks(con: duckdb.DuckDBPyConnection) -> int:
    return con.execute("SELECT used_blocks FROM pragma_database_size() WHERE database_name = current_database()"
                       ).fetchone()[0]


def _jobs(tmp_path: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(str(tmp_path / "c.duckdb"))
    con.execute("CREATE SEQUENCE job_ids")
    con.execute("CREATE TABLE jobs (job_id BIGINT PRIMARY KEY DEFAULT nextval('job_ids'), note VARCHAR)")
    con.execute("CREATE TABLE log (line VARCHAR)")  # no key: DuckDB vacuums it itself
    con.execute("CREATE VIEW open_jobs AS SELECT * FROM jobs WHERE note LIKE 'open%'")
    con.execute("INSERT INTO jobs (note) SELECT 'open ' || md5(range::VARCHAR) || md5((range * 7)::VARCHAR) "
                "FROM range(200000)")
    con.execute("DELETE FROM jobs WHERE job_id <= 190000")  # retention took the oldest
    con.execute("CHECKPOINT")
    return con


def test_a_keyed_table_is_rewritten_and_its_blocks_reused(tmp_path: Path) -> None:
    con = _jobs(tmp_path)
    assert keyed_tables(con) == ["jobs"]
    found = garbage(con, "jobs")
    assert found.live == 10_000 and found.worth_compacting
    assert found.stored == 200_000 if DUCKDB_MAJOR < 2 else found.stored > 2 * found.live  # 2.0: 77,120
    before = _used_blocks(con)
    kept = con.execute("SELECT job_id, note FROM jobs ORDER BY job_id").fetchall()

    compact(con, "jobs")
    con.execute("CHECKPOINT")
    assert _used_blocks(con) < before / (4 if DUCKDB_MAJOR < 2 else 2)
    assert con.execute("SELECT job_id, note FROM jobs ORDER BY job_id").fetchall() == kept
    assert garbage(con, "jobs").stored == 10_000 and not garbage(con, "jobs").worth_compacting
    assert con.execute("SELECT count(*) FROM open_jobs").fetchone() == (10_000,)  # views follow the new table
    assert con.execute("INSERT INTO jobs (note) VALUES ('new') RETURNING job_id").fetchone() == (200_001,)


def test_retention_compacts_what_it_pruned_and_says_so(tmp_path: Path) -> None:
    """The collector's own `eval_jobs` after retention removed most of them: the next round rewrites it, and the
    file's used space falls to about what the live rows take."""
    db = tmp_path / "t.duckdb"
    con = duckdb.connect(str(db))
    migrate(con)
    lines: list[tuple[str, str, dict]] = []
    retention = Retention(con, RetentionSettings(), lambda level, event, **kw: lines.append((level, event, kw)), db)
    con.execute("INSERT INTO eval_jobs (conversation_id, conversation_version, metric, metric_config, status, "
                "last_error, created_at, updated_at) SELECT 'c' || range, 1, 'mcp_use', 'cfg', 'done', "
                "md5(range::VARCHAR), now(), now() FROM range(200000)")
    con.execute("CHECKPOINT")
    full = retention.report().db_bytes["used"]  # the report samples row widths: the size of a copy is known
    con.execute("DELETE FROM eval_jobs WHERE job_id <= 190000")
    con.execute("CHECKPOINT")
    left = garbage(con, "eval_jobs")  # DuckDB 2 has vacuumed part of it already
    freed = 190_000 if DUCKDB_MAJOR < 2 else left.stored - 10_000
    retention.apply()
    assert [kw for _, event, kw in lines if event == "table compacted"] == [
        {"table": "eval_jobs", "live_rows": 10_000, "deleted_rows_freed": freed}]
    assert retention.report().db_bytes["used"] < full / 3 and retention.stats.compacted == {"eval_jobs": freed}
    assert con.execute("SELECT min(job_id), count(*) FROM eval_jobs").fetchone() == (190_001, 10_000)
    retention.apply()  # nothing more to free: no second rewrite
    assert sum(event == "table compacted" for _, event, _ in lines) == 1
