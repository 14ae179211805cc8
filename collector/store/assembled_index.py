"""What was assembled, indexed in SQLite beside the DuckDB file, so the assembler's lookups cost what a poll holds.

Every poll asks which of its traces were assembled before, which traces its conversations already hold
(`assembled_traces`) and each conversation's newest version (`conversations`: its number, content hash and
inclusion probabilities). DuckDB 1.5 answers `IN (SELECT ...)` with a full scan, and an index on a table made every
checkpoint rewrite it (schema 27 dropped `assembled_traces`' key), so those lookups grew with everything ever assembled:
0.4 s each at 16M traces (`python bench/assembly.py --assembled-before 16000000`). SQLite's B-trees answer them in
microseconds, with a bounded page cache.

DuckDB stays the record and the index follows it. Every change to `assembled_traces` or `conversations` goes through
`AssembledIndex.write`, which sets `assembled_index.generation` to a new random stamp in the same DuckDB transaction,
then applies the change here under that stamp. Each lookup compares the two first: a crash between the commits, a
SQLite write that failed, a database file restored from a backup (random, so no other history of the file has the
same stamp), an index of another format or an older collector's writes leave them apart, and the index is rebuilt
from DuckDB before it answers. (A writer that changed the tables without `write` and without a new stamp would
leave no sign: there must be none; `results_file`, which writes test results as conversations, sets a new stamp.)
An index file SQLite cannot read is removed and made again the same way.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import duckdb

from tracejudge.collector.store.connection.arrow_reads import arrow_batches
from tracejudge.collector.store.connection.transaction import in_transaction
from tracejudge.collector.store.span_store import StoreOpenError

_T = TypeVar("_T")
SUFFIX = ".assembled.sqlite"  # beside the DuckDB file: `tracejudge.duckdb.assembled.sqlite`
AT_ONCE = 500  # ids per SQLite statement (its bound-parameter limit is higher; this keeps statements small)
REBUILD_ROWS = 100_000  # rows copied from DuckDB per step of a rebuild
# a delete of earlier rows reads the row groups marked since the newest mark less this in one statement, and each
# older mark alone: DuckDB skips the row groups outside by their min/max of marked_at
RECENT_US = 3_600_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TRACES = """
CREATE TABLE IF NOT EXISTS traces (
    trace_id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    first_us INTEGER,
    marked_us INTEGER
) WITHOUT ROWID"""
_VERSIONS = """
CREATE TABLE IF NOT EXISTS versions (
    conversation_id TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    content_hash TEXT NOT NULL,
    inclusion TEXT,
    assembled_us INTEGER NOT NULL
) WITHOUT ROWID"""
# the DuckDB generation the index holds, and the index's format: an index of another format (one without
# `versions`, which an older collector went on stamping after a downgrade) is made again
FORMAT = 2
_STATE = "CREATE TABLE IF NOT EXISTS index_state (format INTEGER NOT NULL, generation INTEGER NOT NULL)"
_BY_CONVERSATION = "CREATE INDEX IF NOT EXISTS traces_by_conversation ON traces (conversation_id)"
_BY_AGE = "CREATE INDEX IF NOT EXISTS versions_by_age ON versions (assembled_us)"
# each conversation's newest version as the index keeps it (add a WHERE, then GROUP BY conversation_id)
LATEST_VERSIONS = ("SELECT conversation_id, max(version), arg_max(content_hash, version), arg_max(inclusion, version), "
                   "epoch_us(max(assembled_at)) FROM conversations")
# each table of the index as copied from DuckDB (sorted: the B-tree fills in order): name, columns, query
_COPIES = (
    ("traces", 4, "SELECT trace_id, conversation_id, epoch_us(first_received_at), epoch_us(marked_at) "
                  "FROM assembled_traces ORDER BY trace_id"),
    ("versions", 5, f"{LATEST_VERSIONS} GROUP BY conversation_id ORDER BY conversation_id"))
_UPSERT_VERSION = ("INSERT INTO versions VALUES (?, ?, ?, ?, ?) ON CONFLICT (conversation_id) DO UPDATE SET "
                   "version = excluded.version, content_hash = excluded.content_hash, inclusion = excluded.inclusion, "
                   "assembled_us = max(assembled_us, excluded.assembled_us)")


class Assembled(NamedTuple):
    """A trace assembled before: its conversation, its oldest span's received_at and when its row was written
    (µs; None where an older collector did not keep them)."""

    trace_id: str
    conversation_id: str
    first_us: int | None
    marked_us: int | None


class Latest(NamedTuple):
    """A conversation's newest version: its number, content hash and inclusion probabilities (JSON), and when its
    versions were last written (µs: once retention's cutoff passes it, the conversation has no version left)."""

    conversation_id: str
    version: int
    content_hash: str
    inclusion: str | None
    assembled_us: int


@dataclass
class Change:
    """What a DuckDB transaction changed, for the index to follow (`AssembledIndex.write`); `work` may fill in what it
    learns as it runs."""

    put: list[Assembled] = field(default_factory=list)  # traces' rows, each replacing the trace's earlier one
    remove: list[str] = field(default_factory=list)  # traces whose rows went
    versions: list[Latest] = field(default_factory=list)  # conversations' new newest versions (after the drops)
    drop_versions: list[str] = field(default_factory=list)  # conversations whose versions went (some may be put back)
    versions_through_us: int | None = None  # every conversation whose versions were all written by then went


def _damage(exc: sqlite3.Error) -> bool:
    """Whether SQLite found the file damaged or not a database at all (`SQLITE_CORRUPT`, `SQLITE_NOTADB`)."""
    return (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def epoch_us(at: datetime) -> int:
    """µs since the epoch, as DuckDB's `epoch_us` gives a TIMESTAMPTZ and the index keeps times."""
    return (at - _EPOCH) // timedelta(microseconds=1)


def at_epoch_us(us: int) -> datetime:
    """The time `epoch_us` gave these µs for, to bind as a TIMESTAMPTZ."""
    return _EPOCH + timedelta(microseconds=us)


def restamp(con: duckdb.DuckDBPyConnection) -> int:
    """Give the database a new generation (inside the caller's transaction): random, so no other history of the file
    can have it (a counter could repeat), and any index of the file that did not make the change sees it is behind.
    The stamp written."""
    stamp = random.getrandbits(63)
    con.execute("UPDATE assembled_index SET generation = ?", [stamp])
    return stamp


def index_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + SUFFIX)


def index_bytes(db_path: Path) -> int:
    """The index's files on disk beside this database (for the disk budget)."""
    path = index_path(db_path)
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


class AssembledIndex:
    """The index of one DuckDB file's `assembled_traces` and newest versions (`path`; None: in memory, rebuilt at
    each start). One per file and process: its lock puts the index's changes in the order of their DuckDB commits."""

    def __init__(self, path: Path | None, con: duckdb.DuckDBPyConnection,
                 log: Callable[..., None] | None = None) -> None:
        self.path = path
        self.con = con  # a cursor of its own, to compare generations (under `_duck_lock`; a rebuild takes another)
        self.log = log or (lambda *args, **fields: None)
        self.rebuilds = 0  # times the index was found behind DuckDB and rebuilt (a crash, a restored file)
        self._order = threading.RLock()  # held across a change's DuckDB commit and its apply here
        self._sql_lock = threading.Lock()  # the SQLite connection, one statement sequence at a time
        self._duck_lock = threading.Lock()  # `con`: a DuckDB connection holds one result at a time
        self._writing: int | None = None  # the generation a change in flight has committed in DuckDB
        try:
            self._sql = self._connect()
            self._generation = self._stored_generation()  # compared with DuckDB's at the first lookup, not here: a
            # rebuild at a start after a crash takes a while, and ingest need not wait for it
        except sqlite3.DatabaseError as exc:
            if not _damage(exc):
                raise StoreOpenError(f"cannot open the index of assembled traces {path}: {exc}; it lives beside the "
                                     "database file, so that folder must be writable (the index can be deleted: "
                                     "it is made again from the database)") from exc
            self._sql = self._made_again(exc)

    def _made_again(self, exc: sqlite3.DatabaseError) -> sqlite3.Connection:
        """An index file SQLite cannot read (not one, or damaged) is removed and opened empty, to be rebuilt: it only
        ever copies the tables."""
        self.log("warning", "the assembled-traces index cannot be read; it is made again from the database",
                 path=str(self.path), reason=str(exc))
        if self.path is not None:
            for leftover in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")):
                leftover.unlink(missing_ok=True)
        self._generation = None
        return self._connect()

    def _damaged(self, exc: sqlite3.DatabaseError) -> None:
        """After a statement SQLite refused as damaged (`_damage`; a full disk or a busy file is not): a fresh file,
        rebuilt by the next lookup."""
        if not _damage(exc):
            return
        with self._sql_lock:
            with contextlib.suppress(sqlite3.Error):
                self._sql.close()
            self._sql = self._made_again(exc)

    def _connect(self) -> sqlite3.Connection:
        sql = sqlite3.connect(":memory:" if self.path is None else str(self.path), check_same_thread=False,
                              isolation_level=None)
        try:
            sql.execute("PRAGMA journal_mode = WAL")
            sql.execute("PRAGMA synchronous = NORMAL")  # a commit lost with the machine shows as a generation behind
            for statement in (_TRACES, _VERSIONS, _STATE, _BY_CONVERSATION, _BY_AGE):
                sql.execute(statement)
        except sqlite3.Error:
            sql.close()
            raise
        return sql

    def close(self) -> None:
        with self._sql_lock:
            self._sql.close()

    def follow(self) -> None:
        """Make the index again now if it is behind the table (else its next lookup would)."""
        self._check()

    # --- lookups --------------------------------------------------------------------------------------------

    def by_trace(self, traces: Iterable[str]) -> list[Assembled]:
        """The rows of these traces that were assembled before."""
        return [Assembled(*row) for row in self._select("traces", "trace_id", traces)]

    def by_conversation(self, conversations: Iterable[str]) -> list[Assembled]:
        """The rows of every trace assembled into one of these conversations."""
        return [Assembled(*row) for row in self._select("traces", "conversation_id", conversations)]

    def latest(self, conversations: Iterable[str]) -> list[Latest]:
        """The newest version of each of these conversations that has one."""
        return [Latest(*row) for row in self._select("versions", "conversation_id", conversations)]

    def _select(self, table: str, column: str, values: Iterable[str]) -> list[tuple[Any, ...]]:
        wanted = list(dict.fromkeys(values))

        def select() -> list[tuple[Any, ...]]:
            self._check()
            out: list[tuple[Any, ...]] = []
            with self._sql_lock:
                for start in range(0, len(wanted), AT_ONCE):
                    chunk = wanted[start:start + AT_ONCE]
                    out.extend(self._sql.execute(f"SELECT * FROM {table} WHERE {column} IN "
                                                 f"({','.join('?' * len(chunk))})", chunk))
            return out

        return self._once_more_if_damaged(select)

    def _once_more_if_damaged(self, action: Callable[[], _T]) -> _T:
        """`action`, and once more on a fresh index file if SQLite found this one damaged."""
        try:
            return action()
        except sqlite3.DatabaseError as exc:
            if not _damage(exc):
                raise
            self._damaged(exc)
            return action()

    # --- changes --------------------------------------------------------------------------------------------

    def write(self, con: duckdb.DuckDBPyConnection, work: Callable[[], object], change: Change) -> None:
        """Run `work` (which changes `assembled_traces` or `conversations` on `con`) in one DuckDB transaction with
        the generation's new stamp, then make `change` here. Lookups made inside `work` see the index as it was
        before it."""
        stamps: list[int] = []
        with self._order:
            self._check()
            in_transaction(con, lambda: (work(), stamps.append(restamp(con))))
            self._writing = stamp = stamps[0]
            try:
                with self._sql_transaction() as sql:
                    for table, column, ids in (("traces", "trace_id", change.remove),
                                               ("versions", "conversation_id", change.drop_versions)):
                        for start in range(0, len(ids), AT_ONCE):
                            chunk = ids[start:start + AT_ONCE]
                            sql.execute(f"DELETE FROM {table} WHERE {column} IN ({','.join('?' * len(chunk))})",
                                        chunk)
                    if change.versions_through_us is not None:
                        sql.execute("DELETE FROM versions WHERE assembled_us <= ?", [change.versions_through_us])
                    sql.executemany("INSERT OR REPLACE INTO traces VALUES (?, ?, ?, ?)", change.put)
                    sql.executemany(_UPSERT_VERSION, change.versions)
                    sql.execute("UPDATE index_state SET generation = ?", [stamp])
                self._generation = stamp
            except sqlite3.Error as exc:  # DuckDB holds the change: the next lookup finds the index behind, rebuilds
                self.log("warning", "the assembled-traces index missed a change; it is rebuilt from the database",
                         path=str(self.path), reason=str(exc))
                if isinstance(exc, sqlite3.DatabaseError):
                    self._damaged(exc)  # and if the file is damaged, a fresh one
            finally:
                self._writing = None

    def marks(self, traces: Iterable[str]) -> dict[str, int | None]:
        """When each of these traces' rows was written (those with a row), for `delete_earlier` inside `work`."""
        return {row.trace_id: row.marked_us for row in self.by_trace(traces)}

    def delete_earlier(self, con: duckdb.DuckDBPyConnection, ids: str, marks: dict[str, int | None]) -> None:
        """Delete from `assembled_traces` the rows of the traces in the registered table `ids`, whose rows were
        written at `marks` (`marks`): each statement bounded by marked_at, so DuckDB skips the row groups written
        at other times instead of scanning every trace ever assembled."""
        if any(mark is None for mark in marks.values()):  # rows of an older collector: its row groups only
            con.execute(f"DELETE FROM assembled_traces WHERE marked_at IS NULL AND trace_id IN (SELECT id FROM {ids})")
        known = sorted({mark for mark in marks.values() if mark is not None})
        if not known:
            return
        recent = next(mark for mark in known if mark >= known[-1] - RECENT_US)
        con.execute(f"DELETE FROM assembled_traces WHERE marked_at >= ? AND trace_id IN (SELECT id FROM {ids})",
                    [at_epoch_us(recent)])
        for mark in known:
            if mark >= recent:
                break
            con.execute(f"DELETE FROM assembled_traces WHERE marked_at = ? AND trace_id IN (SELECT id FROM {ids})",
                        [at_epoch_us(mark)])

    @contextlib.contextmanager
    def _sql_transaction(self) -> Iterator[sqlite3.Connection]:
        """The SQLite connection in one transaction, committed whole or rolled back."""
        with self._sql_lock:
            self._sql.execute("BEGIN")
            try:
                yield self._sql
                self._sql.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self._sql.execute("ROLLBACK")
                raise

    # --- keeping up with DuckDB -----------------------------------------------------------------------------

    def _duck_generation(self, con: duckdb.DuckDBPyConnection | None = None) -> int:
        if con is None:
            with self._duck_lock:
                return self._duck_generation(self.con)
        return int(con.execute("SELECT generation FROM assembled_index").fetchall()[0][0])

    def _stored_generation(self) -> int | None:
        row = self._sql.execute("SELECT format, generation FROM index_state").fetchone()
        return None if row is None or row[0] != FORMAT else int(row[1])

    def _check(self) -> None:
        """Rebuild the index if DuckDB's generation is not the one it holds (or one a change in flight has just
        committed there, which it applies next)."""
        current = self._duck_generation()
        if current == self._generation or current == self._writing:
            return
        with self._order:  # no change commits while the rows are copied
            current = self._duck_generation()
            if current != self._generation:
                self._rebuild()

    def _rebuild(self) -> None:
        """Copy the tables here; an index file found damaged on the way is made afresh and copied once more."""
        self._once_more_if_damaged(self._copy)

    def _copy(self) -> None:
        """The tables' rows (`_COPIES`) from one DuckDB snapshot, read on a cursor of its own (a lookup's generation
        check on `con` would end its result)."""
        started = time.monotonic()
        copied = 0
        con = self.con.cursor()
        con.execute("BEGIN TRANSACTION")
        try:
            generation = self._duck_generation(con)
            [(total,)] = con.execute("SELECT (SELECT count(*) FROM assembled_traces) + (SELECT count(*) FROM "
                                     "conversations)").fetchall()
            said = total > 0 or self._generation is not None  # not said of a new index for a new file
            if said:
                self.log("info", "assembled-traces index behind the database: made again from it",
                         path=str(self.path), rows=total,
                         advice="about 6 s a million traces; assembly waits for it, ingest does not")
            with self._sql_transaction() as sql:
                sql.execute("DROP TABLE IF EXISTS traces")
                sql.execute("DROP TABLE IF EXISTS versions")
                sql.execute(_TRACES)
                sql.execute(_VERSIONS)
                sql.execute("DROP TABLE IF EXISTS state")  # the generation as the first format kept it
                sql.execute("DELETE FROM index_state")
                for table, columns, select in _COPIES:
                    marks = ", ".join("?" * columns)
                    # by columns: a tuple per row from DuckDB cost half as much again
                    with arrow_batches(con, select, batch_rows=REBUILD_ROWS) as reader:  # closed if sqlite fails
                        for batch in reader:
                            sql.executemany(f"INSERT OR REPLACE INTO {table} VALUES ({marks})",
                                            zip(*(column.to_pylist() for column in batch.columns), strict=True))
                            copied += batch.num_rows
                sql.execute(_BY_CONVERSATION)  # built once, after the rows: faster than row by row
                sql.execute(_BY_AGE)
                sql.execute("INSERT INTO index_state VALUES (?, ?)", [FORMAT, generation])
            with self._sql_lock, contextlib.suppress(sqlite3.Error):  # the WAL held every row once: give it back
                self._sql.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            con.close()
        self._generation = generation
        if said:
            self.rebuilds += 1
            self.log("info", "assembled-traces index rebuilt from the database", path=str(self.path), rows=copied,
                     seconds=round(time.monotonic() - started, 2))
