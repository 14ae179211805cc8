"""Give a keyed table's deleted rows back to the file.

DuckDB vacuums deleted rows out of a table's row groups when it checkpoints, but 1.5 not in a table with a PRIMARY
KEY or UNIQUE constraint (its index points at row positions; 2.0 drops or merges the row groups it can and keeps the
deleted rows of the others), and it drops a row group only once all of its 122,880 rows are deleted. Under retention
such a table (`eval_jobs`, `scores`, the summaries...) kept every row it ever stored until a whole row group aged
out: in the retention soak `eval_jobs` held 273,000 stored rows for 16,000 live ones after 24 minutes, and the file
grew while the row counts stayed flat (`python bench/retention.py`, BENCHMARKS.md). Rewriting the table into a new
one and swapping them frees the old blocks at the next checkpoint.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

import duckdb

MIN_GARBAGE_ROWS = 20_000  # below this a rewrite frees too little to be worth its pause


@dataclass(frozen=True)
class Garbage:
    table: str
    live: int
    stored: int  # rows in the table's row groups, deleted ones included

    @property
    def worth_compacting(self) -> bool:
        """More deleted rows than live ones (and enough of them): the rewrite's cost follows the live rows, what
        it frees the deleted ones."""
        deleted = self.stored - self.live
        return deleted >= MIN_GARBAGE_ROWS and deleted > self.live


def keyed_tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The tables DuckDB 1.5 does not vacuum (2.0 only in part): those with a primary key or unique constraint."""
    return [t for (t,) in con.execute(
        "SELECT DISTINCT table_name FROM duckdb_constraints() WHERE constraint_type IN ('PRIMARY KEY', 'UNIQUE') "
        "AND database_name = current_database() AND schema_name = 'main' ORDER BY 1").fetchall()]


def garbage(con: duckdb.DuckDBPyConnection, table: str) -> Garbage:
    """Live and stored rows of a table: the stored ones from its first column's segments (metadata only)."""
    [(stored,)] = con.execute("SELECT coalesce(sum(count), 0) FROM pragma_storage_info(?) "
                              "WHERE column_id = 0 AND column_path = '[0]'", [table]).fetchall()
    [(live,)] = con.execute(f'SELECT count(*) FROM "{table}"').fetchall()
    return Garbage(table, int(live), int(stored))


def compact(con: duckdb.DuckDBPyConnection, table: str) -> None:
    """Rewrite `table` into a fresh copy with the same definition and swap them, in one transaction. The caller
    keeps every writer of the table out meanwhile (rows written between the copy and the swap would be lost) and
    checkpoints after, which frees the old copy's blocks."""
    [(ddl,)] = con.execute("SELECT sql FROM duckdb_tables() WHERE table_name = ? AND database_name = "
                           "current_database() AND schema_name = 'main'", [table]).fetchall()
    fresh = f"{table}__compacting"
    create, count = re.subn(rf'^CREATE TABLE\s+(?:main\.)?"?{re.escape(table)}"?\s*\(', f'CREATE TABLE "{fresh}"(',
                            ddl, count=1)
    if count != 1:
        raise ValueError(f"cannot read the definition of {table}: {ddl[:120]}")
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(create)
        con.execute(f'INSERT INTO "{fresh}" SELECT * FROM "{table}"')
        con.execute(f'DROP TABLE "{table}"')
        con.execute(f'ALTER TABLE "{fresh}" RENAME TO "{table}"')
        con.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(duckdb.Error):  # a failed COMMIT has ended it: keep the error that did
            con.execute("ROLLBACK")
        raise
