"""Retention's checkpoint gets in between the pipeline's writes: a transaction that updates rows in place makes
DuckDB refuse CHECKPOINT, so the store's cursors hold a gate the checkpoint waits on (bounded)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import duckdb
import pytest

from tracejudge.collector.store.connection.checkpoint_gate import CheckpointGate, GatedCursor, WritesRefused


@pytest.fixture
def con(tmp_path: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(str(tmp_path / "gate.duckdb"))
    con.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, status VARCHAR)")
    con.execute("INSERT INTO jobs SELECT range, 'pending' FROM range(1000)")
    return con


def test_an_open_update_refuses_a_plain_checkpoint_but_the_gate_waits_for_its_commit(
        con: duckdb.DuckDBPyConnection) -> None:
    gate = CheckpointGate()
    writer, checkpointer = GatedCursor(con.cursor(), gate), con.cursor()
    writer.execute("BEGIN TRANSACTION")
    writer.execute("UPDATE jobs SET status = 'running' WHERE id < 10")
    with pytest.raises(duckdb.TransactionException, match="CHECKPOINT"):
        checkpointer.execute("CHECKPOINT")  # why the gate exists

    threading.Timer(0.3, lambda: writer.execute("COMMIT")).start()
    ran: list[bool] = []
    assert gate.alone(lambda: ran.append(bool(checkpointer.execute("CHECKPOINT"))), timeout_s=10)
    assert ran == [True]
    assert con.execute("SELECT count(*) FROM jobs WHERE status = 'running'").fetchone() == (10,)


def test_writers_that_arrive_while_a_checkpoint_waits_go_after_it(con: duckdb.DuckDBPyConnection) -> None:
    gate = CheckpointGate()
    first, second = GatedCursor(con.cursor(), gate), GatedCursor(con.cursor(), gate)
    order: list[str] = []
    first.execute("BEGIN TRANSACTION")
    first.execute("UPDATE jobs SET status = 'running' WHERE id = 1")

    def late_writer() -> None:
        second.execute("UPDATE jobs SET status = 'done' WHERE id = 2")
        order.append("late writer")

    def checkpoint() -> None:
        con.cursor().execute("CHECKPOINT")
        order.append("checkpoint")

    checkpointer = threading.Thread(target=lambda: gate.alone(checkpoint, timeout_s=10))
    checkpointer.start()
    while gate._exclusive is None:  # the checkpoint is waiting for `first`
        time.sleep(0.01)
    late = threading.Thread(target=late_writer)
    late.start()
    time.sleep(0.2)
    assert order == []  # the late writer waits behind the checkpoint, which waits for the open transaction
    first.execute("COMMIT")
    checkpointer.join(10)
    late.join(10)
    assert order == ["checkpoint", "late writer"]


def test_a_writer_that_holds_on_past_the_timeout_defers_the_checkpoint_and_nobody_waits_after(
        con: duckdb.DuckDBPyConnection) -> None:
    gate = CheckpointGate()
    writer, other = GatedCursor(con.cursor(), gate), GatedCursor(con.cursor(), gate)
    writer.execute("BEGIN TRANSACTION")
    writer.execute("UPDATE jobs SET status = 'running' WHERE id = 1")
    ran: list[str] = []
    assert not gate.alone(lambda: ran.append("checkpoint"), timeout_s=0.2)
    assert ran == []
    other.execute("UPDATE jobs SET status = 'done' WHERE id = 2")  # not held off by the abandoned checkpoint
    writer.execute("COMMIT")
    assert gate.alone(lambda: ran.append("checkpoint"), timeout_s=1)
    assert ran == ["checkpoint"]


def test_a_failed_statement_or_rollback_releases_the_gate(con: duckdb.DuckDBPyConnection) -> None:
    gate = CheckpointGate()
    writer = GatedCursor(con.cursor(), gate)
    with pytest.raises(duckdb.Error):
        writer.execute("UPDATE no_such_table SET x = 1")
    writer.execute("BEGIN TRANSACTION")
    with pytest.raises(duckdb.ConstraintException):
        writer.execute("INSERT INTO jobs VALUES (1, 'duplicate')")
    writer.execute("ROLLBACK")
    assert gate.alone(lambda: None, timeout_s=0.5)


def test_reads_neither_hold_nor_wait_for_the_gate(con: duckdb.DuckDBPyConnection) -> None:
    """A read, alone or in a transaction that only reads, goes on while a checkpoint waits for a writer (here
    for up to a minute): if it waited too, it would still be waiting when checked."""
    gate = CheckpointGate()
    writer, reader = GatedCursor(con.cursor(), gate), GatedCursor(con.cursor(), gate)
    writer.execute("BEGIN TRANSACTION")
    writer.execute("UPDATE jobs SET status = 'running' WHERE id = 1")
    ran: list[bool] = []
    checkpointer = threading.Thread(target=lambda: ran.append(gate.alone(lambda: None, timeout_s=60)))
    checkpointer.start()
    while gate._exclusive is None:
        time.sleep(0.01)
    counted: list[tuple] = []

    def read() -> None:
        counted.append(reader.execute("SELECT count(*) FROM jobs").fetchone())
        reader.execute("BEGIN TRANSACTION")  # a snapshot read, as the assembler takes one
        counted.append(reader.execute("SELECT count(*) FROM jobs WHERE status = 'pending'").fetchone())
        reader.execute("ROLLBACK")

    reading = threading.Thread(target=read)
    reading.start()
    reading.join(20)
    assert not reading.is_alive() and counted == [(1000,), (1000,)]
    writer.execute("COMMIT")
    checkpointer.join(20)
    assert ran == [True]


def test_a_transaction_takes_the_gate_at_its_first_write(con: duckdb.DuckDBPyConnection) -> None:
    gate = CheckpointGate()
    cursor = GatedCursor(con.cursor(), gate)
    cursor.execute("BEGIN TRANSACTION")
    cursor.execute("SELECT count(*) FROM jobs").fetchall()
    assert gate._writers == 0
    cursor.execute("UPDATE jobs SET status = 'done' WHERE id = 3")
    assert gate._writers == 1
    cursor.execute("COMMIT")
    assert gate._writers == 0


def test_a_table_swap_waits_for_an_open_transaction_that_read_then_writes(con: duckdb.DuckDBPyConnection) -> None:
    """A transaction that read a table and writes it after a swap would fail (the table it read was dropped):
    the swap waits for open transactions to end, the open one writes and commits, then the swap runs."""
    from tracejudge.collector.store.table_compaction import compact

    gate = CheckpointGate()
    worker, swapper = GatedCursor(con.cursor(), gate), GatedCursor(con.cursor(), gate)
    worker.execute("BEGIN TRANSACTION")
    assert worker.execute("SELECT count(*) FROM jobs WHERE status = 'pending'").fetchone() == (1000,)
    ran: list[bool] = []
    swapping = threading.Thread(target=lambda: ran.append(gate.alone(lambda: compact(swapper, "jobs"),
                                                                     timeout_s=60, no_transactions=True)))
    swapping.start()
    while gate._exclusive is None:
        time.sleep(0.01)
    worker.execute("UPDATE jobs SET status = 'done' WHERE id < 10")  # not held off: the swap waits for it
    worker.execute("COMMIT")
    swapping.join(60)
    assert ran == [True]
    assert con.execute("SELECT count(*) FROM jobs WHERE status = 'done'").fetchone() == (10,)
    late = GatedCursor(con.cursor(), gate)
    late.execute("BEGIN TRANSACTION")  # a transaction after the swap sees the new table
    late.execute("UPDATE jobs SET status = 'done' WHERE id = 500")
    late.execute("COMMIT")
    assert con.execute("SELECT count(*) FROM jobs WHERE status = 'done'").fetchone() == (11,)


def test_a_statement_that_starts_like_a_read_but_writes_holds_the_gate() -> None:
    from tracejudge.collector.store.connection.checkpoint_gate import reads_only

    assert reads_only("SELECT updated_at, last_update FROM eval_jobs")
    assert not reads_only("WITH old AS (SELECT 1) DELETE FROM eval_jobs WHERE job_id IN (SELECT * FROM old)")
    assert not reads_only("EXPLAIN ANALYZE UPDATE eval_jobs SET status = 'done'")


def test_a_refused_store_takes_reads_but_no_write_and_nothing_is_half_written(con: duckdb.DuckDBPyConnection) -> None:
    reason: list[str | None] = ["the disk is full"]
    cursor = GatedCursor(con.cursor(), CheckpointGate(), refuse=lambda: reason[0])
    con.execute("CREATE TABLE keyed (k INTEGER PRIMARY KEY, v INTEGER)")
    con.execute("INSERT INTO keyed VALUES (1, 1)")
    with pytest.raises(WritesRefused, match="the disk is full"):
        cursor.execute("UPDATE keyed SET v = 2")
    cursor.execute("BEGIN TRANSACTION")
    assert cursor.execute("SELECT v FROM keyed").fetchall() == [(1,)]  # reads go on
    with pytest.raises(duckdb.IOException):  # handled wherever a failed write is
        cursor.execute("INSERT OR REPLACE INTO keyed VALUES (1, 3)")
    cursor.execute("ROLLBACK")
    reason[0] = None  # the span writer's commits succeed again
    cursor.execute("UPDATE keyed SET v = 4")
    assert con.execute("SELECT v FROM keyed").fetchall() == [(4,)]


def test_a_transaction_whose_store_goes_at_fault_before_commit_is_rolled_back_and_the_gate_released(
        con: duckdb.DuckDBPyConnection) -> None:
    reason: list[str | None] = [None]
    gate = CheckpointGate()
    cursor = GatedCursor(con.cursor(), gate, refuse=lambda: reason[0])
    cursor.execute("BEGIN TRANSACTION")
    cursor.execute("UPDATE jobs SET status = 'running' WHERE id < 10")
    reason[0] = "only 12 KB is free"  # the disk filled while the transaction was open
    with pytest.raises(WritesRefused, match="only 12 KB is free"):
        cursor.execute("COMMIT")
    cursor.execute("ROLLBACK")  # what callers do after a failed commit: nothing left to do, and no error
    assert con.execute("SELECT count(*) FROM jobs WHERE status = 'running'").fetchone() == (0,)
    assert gate.alone(lambda: None, timeout_s=1, no_transactions=True)  # nothing holds the gate or is open
