"""The index of assembled traces beside the DuckDB file: it answers as `assembled_traces` would, and is made again
from the table whenever it is behind it (a crash between the two commits, a database restored from a backup, a
broken index file)."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import random
import shutil
import sqlite3
import threading
from pathlib import Path

import duckdb
import pytest

from tests.test_assembler import _assembling_store, _write_turn
from tracejudge.collector.log import Logger
from tracejudge.collector.store.assembled_index import LATEST_VERSIONS, Assembled, AssembledIndex, Change, index_path
from tracejudge.collector.store.connection.id_table import id_table
from tracejudge.collector.store.results_file import ScoredCase, write_results
from tracejudge.collector.store.schema import migrate
from tracejudge.collector.store.span_store import StoreOpenError
from tracejudge.evaluation import MetricResult, TestResult
from tracejudge.test_case import ConversationalTestCase, Turn

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _table(con: duckdb.DuckDBPyConnection) -> set[tuple[object, ...]]:
    return set(con.execute("SELECT trace_id, conversation_id, epoch_us(first_received_at), epoch_us(marked_at) "
                           "FROM assembled_traces").fetchall())


def _indexed(path: Path, table: str = "traces") -> set[tuple[object, ...]]:
    with sqlite3.connect(path) as sql:
        return set(sql.execute(f"SELECT * FROM {table}").fetchall())


def _newest(con: duckdb.DuckDBPyConnection) -> set[tuple[object, ...]]:
    """Each conversation's newest version, as the index keeps it."""
    return set(con.execute(f"{LATEST_VERSIONS} GROUP BY conversation_id").fetchall())


def _database(path: Path) -> tuple[duckdb.DuckDBPyConnection, AssembledIndex]:
    """A migrated database file and its index beside it."""
    con = duckdb.connect(str(path))
    migrate(con)
    return con, AssembledIndex(index_path(path), con.cursor())


def _us(at: dt.datetime) -> int:
    return (at - _EPOCH) // dt.timedelta(microseconds=1)


def test_the_index_holds_what_the_assembler_wrote_and_one_row_a_trace_when_it_assembles_again(tmp_path) -> None:
    async def scenario() -> None:
        store, assembler = _assembling_store(tmp_path / "s.duckdb", quiet_period_s=0.05)
        try:
            now = dt.datetime.now(dt.UTC)
            await _write_turn(store, 1, 1, "chat-a", "first", now)
            await _write_turn(store, 2, 2, "chat-b", "other", now)
            await asyncio.sleep(0.1)
            assert assembler.assemble_due() == 2
            later = dt.datetime.now(dt.UTC)
            await _write_turn(store, 3, 3, "chat-a", "second", later)  # chat-a goes on: trace 1 is an earlier trace
            await _write_turn(store, 2, 9, "chat-b", "late", later)  # a late span of trace 2
            await asyncio.sleep(0.1)
            assert assembler.assemble_due() == 2
            con = store.cursor()
            rows = _table(con)
            assert len(rows) == 3 == len({r[0] for r in rows})  # a row a trace, the late span's trace once
            assert {(r[0], r[1]) for r in rows} == {(f"{1:032x}", "chat-a"), (f"{2:032x}", "chat-b"),
                                                    (f"{3:032x}", "chat-a")}
            path = index_path(tmp_path / "s.duckdb")
            assert _indexed(path) == rows
            assert {r.trace_id for r in assembler.index.by_conversation(["chat-a"])} == {f"{1:032x}", f"{3:032x}"}
            assert [r.conversation_id for r in assembler.index.by_trace([f"{2:032x}", "no-such-trace"])] == ["chat-b"]
            # each conversation's newest version, the one the next version's number and content hash follow
            assert {(v.conversation_id, v.version) for v in assembler.index.latest(["chat-a", "chat-b", "chat-c"])} \
                == {("chat-a", 2), ("chat-b", 2)}
            assert _indexed(path, "versions") == _newest(con) and len(_newest(con)) == 2
            # as a kill between the two commits leaves them: both tables made again from the database
            con.execute("UPDATE assembled_index SET generation = generation + 1")
            assembler.index.follow()
            assert assembler.index.rebuilds == 1
            assert _indexed(path) == rows and _indexed(path, "versions") == _newest(con)
            # the next versions follow the index made again: chat-b's number goes on, chat-a's content is not new
            await _write_turn(store, 2, 10, "chat-b", "later", dt.datetime.now(dt.UTC))
            await _write_turn(store, 1, 1, "chat-a", "first", later)  # a copy of a span stored already
            await asyncio.sleep(0.1)
            assembler.assemble_due()
            assert con.execute("SELECT conversation_id, max(version) FROM conversations GROUP BY 1 ORDER BY 1"
                               ).fetchall() == [("chat-a", 2), ("chat-b", 3)]
            assert _indexed(path, "versions") == _newest(con)
        finally:
            store.close()

    asyncio.run(scenario())


def _rows_at(con: duckdb.DuckDBPyConnection, index: AssembledIndex, rows: dict[str, int | None]) -> None:
    """Rows of these traces written at these marks (µs; None: by a collector before marks), each its own row."""
    def work() -> None:
        for trace, mark in rows.items():
            con.execute("INSERT INTO assembled_traces VALUES (?, 'c', now(), NULL, ?)",
                        [trace, None if mark is None else _EPOCH + dt.timedelta(microseconds=mark)])

    index.write(con, work, Change(put=[Assembled(t, "c", None, m) for t, m in rows.items()]))


def test_deleting_earlier_rows_finds_each_by_when_it_was_written_and_touches_no_other(tmp_path) -> None:
    con, index = _database(tmp_path / "d.duckdb")
    now = _us(dt.datetime.now(dt.UTC))
    hours = 3_600_000_000
    marks = {"older-collector": None, "three-hours": now - 3 * hours, "two-hours": now - 2 * hours,
             "ten-minutes": now - 600_000_000, "a-minute": now - 60_000_000, "untouched-now": now,
             "untouched-five-minutes": now - 300_000_000, "untouched-three-hours": now - 3 * hours,
             "untouched-older-collector": None}
    _rows_at(con, index, marks)
    doomed = [t for t in marks if not t.startswith("untouched")]

    def work() -> None:
        with id_table(con, doomed) as ids:
            index.delete_earlier(con, ids, index.marks(doomed))

    index.write(con, work, Change(remove=doomed))
    left = {t for (t,) in con.execute("SELECT trace_id FROM assembled_traces").fetchall()}
    assert left == {"untouched-now", "untouched-five-minutes", "untouched-three-hours", "untouched-older-collector"}
    assert {r.trace_id for r in index.by_conversation(["c"])} == left
    index.close()
    con.close()


def test_a_change_that_reached_the_database_and_not_the_index_is_found_and_the_index_made_again(tmp_path) -> None:
    """As a kill between the two commits leaves them: the generation tells, at the next start and at the next lookup
    of a running collector."""
    db = tmp_path / "c.duckdb"
    con = duckdb.connect(str(db))
    migrate(con)
    logged: list[str] = []
    index = AssembledIndex(index_path(db), con.cursor(), lambda level, event, **fields: logged.append(event))
    _rows_at(con, index, {"t1": 1, "t2": 2})
    # what a process killed after DuckDB's commit leaves: the table changed, the generation with it, the index not
    con.execute("BEGIN; DELETE FROM assembled_traces WHERE trace_id = 't1'; "
                "INSERT INTO assembled_traces VALUES ('t3', 'd', now(), NULL, now()); "
                "UPDATE assembled_index SET generation = generation + 1; COMMIT")
    assert {r.trace_id for r in index.by_conversation(["c", "d"])} == {"t2", "t3"}  # the running one notices
    index.close()
    con.execute("BEGIN; DELETE FROM assembled_traces WHERE trace_id = 't2'; "
                "UPDATE assembled_index SET generation = generation + 1; COMMIT")
    reopened = AssembledIndex(index_path(db), con.cursor())  # the next start
    assert reopened.by_trace(["t1", "t2", "t3"])[0].trace_id == "t3" and len(reopened.by_trace(["t1", "t2"])) == 0
    assert reopened.rebuilds == 1
    assert _indexed(index_path(db)) == _table(con)
    assert logged.count("assembled-traces index rebuilt from the database") == 1  # by the running one
    reopened.close()
    con.close()


def test_a_database_restored_from_a_backup_gets_its_own_index_not_the_newer_one(tmp_path) -> None:
    db = tmp_path / "r.duckdb"
    con, index = _database(db)
    _rows_at(con, index, {"kept": 1})
    con.close()
    shutil.copy(db, tmp_path / "backup.duckdb")
    con = duckdb.connect(str(db))
    index.con = con.cursor()
    _rows_at(con, index, {"after-the-backup": 2})
    index.close()
    con.close()
    shutil.copy(tmp_path / "backup.duckdb", db)  # the index beside it is newer than the file now
    con = duckdb.connect(str(db))
    restored = AssembledIndex(index_path(db), con.cursor())
    assert [r.trace_id for r in restored.by_conversation(["c"])] == ["kept"]
    restored.close()
    con.close()


def test_an_index_file_that_cannot_be_read_is_made_again_with_a_warning(tmp_path) -> None:
    db = tmp_path / "b.duckdb"
    con, first = _database(db)
    _rows_at(con, first, {"t": 5})
    first.close()
    index_path(db).write_bytes(b"not an index " * 1000)
    for suffix in ("-wal", "-shm"):
        Path(f"{index_path(db)}{suffix}").unlink(missing_ok=True)
    out = io.StringIO()
    again = AssembledIndex(index_path(db), con.cursor(), Logger(stream=out).log)
    assert [r.trace_id for r in again.by_trace(["t"])] == ["t"]
    assert "cannot be read" in out.getvalue()
    again.close()
    con.close()


def test_a_change_the_database_refuses_leaves_the_index_as_it_was(tmp_path) -> None:
    db = tmp_path / "f.duckdb"
    con, index = _database(db)
    _rows_at(con, index, {"t": 5})

    def failing() -> None:
        con.execute("DELETE FROM assembled_traces")
        raise RuntimeError("the disk is full")

    with pytest.raises(RuntimeError):
        index.write(con, failing, Change(remove=["t"]))
    assert [r.trace_id for r in index.by_trace(["t"])] == ["t"] and _table(con) == _indexed(index_path(db))
    index.close()
    con.close()


def test_lookups_in_one_thread_while_another_writes_see_the_table_before_or_after_each_change(tmp_path) -> None:
    """The assembler looks up while retention deletes, each from its own thread, through one index."""
    db = tmp_path / "t.duckdb"
    con, index = _database(db)
    writer = con.cursor()
    errors: list[BaseException] = []
    seen: list[int] = []
    done = threading.Event()

    def write_pairs() -> None:
        try:
            for n in range(300):  # each change puts two traces of a conversation in
                pair = [f"t{n}-a", f"t{n}-b"]

                def work(pair: list[str] = pair, n: int = n) -> None:
                    for trace in pair:
                        writer.execute("INSERT INTO assembled_traces VALUES (?, ?, now(), NULL, NULL)",
                                       [trace, f"c{n}"])

                index.write(writer, work, Change(put=[Assembled(t, f"c{n}", None, None) for t in pair]))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=write_pairs)
    thread.start()
    try:
        while not done.is_set():
            rows = index.by_conversation([f"c{n}" for n in range(300)])
            seen.append(len(rows))
            assert len(rows) % 2 == 0  # a change is seen whole or not at all
    finally:
        thread.join(60)
    assert not errors, errors
    assert len(seen) > 1 and index.rebuilds == 0  # the lookups ran beside the writes, and never found it behind
    assert _indexed(index_path(db)) == _table(con)
    index.close()
    con.close()


def test_an_index_file_damaged_inside_is_made_again_when_a_lookup_finds_it(tmp_path) -> None:
    db = tmp_path / "p.duckdb"
    con, index = _database(db)
    traces = [f"{n:032x}" for n in range(20_000)]

    def work() -> None:
        con.execute("INSERT INTO assembled_traces SELECT printf('%032x', i), 'c' || (i % 100), now(), NULL, now() "
                    "FROM range(20000) t(i)")

    index.write(con, work, Change(put=[Assembled(t, f"c{n % 100}", None, None) for n, t in enumerate(traces)]))
    index.close()
    path = index_path(db)
    with path.open("r+b") as file:  # twenty pages in the middle overwritten, the header intact
        rng = random.Random(7)
        size = path.stat().st_size
        for _ in range(20):
            file.seek(rng.randrange(size // 4, 3 * size // 4) // 4096 * 4096)
            file.write(rng.randbytes(4096))
    out = io.StringIO()
    again = AssembledIndex(path, con.cursor(), Logger(stream=out).log)
    assert {r.trace_id for r in again.by_conversation(["c7"])} == {t for n, t in enumerate(traces) if n % 100 == 7}
    assert len(again.by_trace(traces)) == 20_000
    assert "cannot be read" in out.getvalue()
    again.close()
    con.close()


def test_a_change_the_index_fails_to_take_is_kept_in_the_database_and_the_index_made_again(tmp_path) -> None:
    db = tmp_path / "m.duckdb"
    con, index = _database(db)
    _rows_at(con, index, {"t1": 1})
    with sqlite3.connect(index_path(db)) as sql:  # SQLite refuses the next insert, as a full disk would
        sql.execute("CREATE TRIGGER refuse BEFORE INSERT ON traces BEGIN SELECT RAISE(ABORT, 'refused'); END")
    _rows_at(con, index, {"t2": 2})  # the change's DuckDB commit stands; the caller is not failed for the index
    assert {r.trace_id for r in index.by_conversation(["c"])} == {"t1", "t2"}
    assert index.rebuilds == 1 and _indexed(index_path(db)) == _table(con)
    index.close()
    con.close()


def test_an_index_of_an_earlier_format_is_made_again_though_its_generation_matches(tmp_path) -> None:
    """The first format kept traces only: its generation can match the database's while it holds no versions."""
    db = tmp_path / "u.duckdb"
    con, index = _database(db)
    _rows_at(con, index, {"t": 5})
    con.execute("INSERT INTO conversations (conversation_id, version, content_hash, status, assembled_at) "
                "VALUES ('c', 3, 'h', 'complete', now())")
    index.close()
    [(generation,)] = con.execute("SELECT generation FROM assembled_index").fetchall()
    index_path(db).unlink()
    with sqlite3.connect(index_path(db)) as sql:  # as the first format wrote it, in step with the database
        sql.execute("CREATE TABLE traces (trace_id TEXT PRIMARY KEY, conversation_id TEXT NOT NULL, first_us "
                    "INTEGER, marked_us INTEGER) WITHOUT ROWID")
        sql.execute("INSERT INTO traces VALUES ('t', 'c', NULL, 5)")
        sql.execute("CREATE TABLE state (generation INTEGER NOT NULL)")
        sql.execute("INSERT INTO state VALUES (?)", [generation])
    upgraded = AssembledIndex(index_path(db), con.cursor())
    assert [(v.conversation_id, v.version) for v in upgraded.latest(["c"])] == [("c", 3)]
    assert upgraded.rebuilds == 1 and _indexed(index_path(db), "versions") == _newest(con)
    upgraded.close()
    con.close()


def test_an_index_that_cannot_be_opened_says_where_and_what_to_do(tmp_path) -> None:
    con = duckdb.connect(str(tmp_path / "o.duckdb"))
    migrate(con)
    index_path(tmp_path / "o.duckdb").mkdir()  # a folder where the index file goes
    with pytest.raises(StoreOpenError, match="o.duckdb.assembled.sqlite.*folder must be writable"):
        AssembledIndex(index_path(tmp_path / "o.duckdb"), con.cursor())
    con.close()


def test_results_written_into_a_collectors_file_are_in_its_index_when_it_starts_again(tmp_path) -> None:
    """A pytest run's `assert_test` results (the pytest plugin) written into the file a collector stopped on: its
    index, beside the file, did not make that change, so it is made again at the next start and holds the results'
    versions (left as it was, it listed none of them, and the file's generation alone told it nothing)."""
    db = tmp_path / "h.duckdb"
    con, index = _database(db)
    index.follow()  # current with the file, as a collector leaves it when it stops
    assert index.latest(["ci:1:test_weather#1"]) == []
    index.close()
    con.close()
    case = ConversationalTestCase(turns=[Turn(role="user", content="weather in Paris?"),
                                         Turn(role="assistant", content="rainy, 14C")])
    result = TestResult(index=0, name="test_weather", metrics=[MetricResult(
        metric="mcp_use", name="MCP Use", score=0.9, success=True, threshold=0.5, reason="fine",
        evaluation_cost=0.0, error=None)])
    write_results(db, [ScoredCase("ci:1:test_weather#1", "test_weather", case, result)], "ci", "ci")
    con = duckdb.connect(str(db))
    reopened = AssembledIndex(index_path(db), con.cursor())
    try:
        (latest,) = reopened.latest(["ci:1:test_weather#1"])
        stored = con.execute("SELECT version, content_hash FROM conversations").fetchall()
        assert (latest.version, latest.content_hash) == stored[0] and len(stored) == 1
        assert reopened.rebuilds == 1
    finally:
        reopened.close()
        con.close()
