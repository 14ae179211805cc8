"""Arrow reads of a query's answer: whole, or streamed a bounded batch at a time, with the query's parameters, on
whichever DuckDB version is installed."""

from __future__ import annotations

from pathlib import Path

import duckdb

from tracejudge.collector.store.connection.arrow_reads import arrow_batches, arrow_table
from tracejudge.collector.store.connection.id_table import id_table


def _table(tmp_path: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(str(tmp_path / "r.duckdb"))
    con.execute("CREATE TABLE t AS SELECT range AS i, 'row ' || range AS s FROM range(10000)")
    return con


def test_a_whole_answer_comes_back_with_its_parameters_applied(tmp_path: Path) -> None:
    con = _table(tmp_path)
    table = arrow_table(con, "SELECT i, s FROM t WHERE i >= ? ORDER BY i", [9000], batch_rows=256)
    assert table.num_rows == 1000
    assert table.column("i").to_pylist() == list(range(9000, 10000))
    assert table.column("s")[0].as_py() == "row 9000"


def test_a_streamed_answer_holds_no_more_than_a_batch_at_a_time(tmp_path: Path) -> None:
    con = _table(tmp_path)
    sizes, seen = [], []
    for batch in arrow_batches(con, "SELECT i FROM t WHERE i < ? ORDER BY i", [5000], batch_rows=2048):
        sizes.append(batch.num_rows)
        seen += batch.column(0).to_pylist()
    assert max(sizes) <= 2048 and len(sizes) >= 3
    assert seen == list(range(5000))


def test_reads_and_id_tables_after_an_answer_left_unfinished_on_the_connection(tmp_path: Path) -> None:
    """`fetchone()` leaves the rest of an answer unread (here a one-row answer, whose end is not fetched either);
    DuckDB 2 refused the next relation and the next registered table on that connection, so an Arrow read or an id
    table after it failed there."""
    con = _table(tmp_path)
    assert con.execute("SELECT max(i) FROM t").fetchone() == (9999,)
    assert arrow_table(con, "SELECT count(*) AS n FROM t WHERE i < ?", [10]).column("n").to_pylist() == [10]
    con.execute("SELECT i FROM t ORDER BY i").fetchone()
    assert sum(batch.num_rows for batch in arrow_batches(con, "SELECT i FROM t", batch_rows=4096)) == 10_000
    con.execute("SELECT i FROM t ORDER BY i").fetchone()
    with id_table(con, ["row 1", "row 2"]) as ids:
        assert con.execute(f"SELECT count(*) FROM t WHERE s IN (SELECT id FROM {ids})").fetchall() == [(2,)]
