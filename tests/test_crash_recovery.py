"""kill -9 at random points, repeatedly, while agents export and the judges score.

Each round starts `tracejudge serve` on the same database file, exports conversations from a thread
with the real OTel SDK exporter, and kills the process after a random delay (seeded, printed on failure).
After the last round a clean start must finish the work: every acknowledged span is stored, every
stored conversation has each metric's job done exactly once, and no score row is duplicated.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.collector_process import CollectorProcess
from tests.support.duckdb_faults import armed, armed_collector
from tests.support.scripted_server import Reply, Request, completion
from tests.test_assembler import _spans
from tests.test_pipeline import config, query, turn, wait_for
from tracejudge.collector.receivers.span_rows import spans_to_arrow
from tracejudge.collector.store import span_store
from tracejudge.collector.store.assembled_index import LATEST_VERSIONS, index_path
from tracejudge.collector.store.connection.arrow_reads import arrow_table
from tracejudge.collector.store.connection.checkpoint_gate import WritesRefused
from tracejudge.collector.store.connection.database_file import connect_file

ROUNDS, SEED = 5, 20261202
METRICS = 3


def _conversation(n: int) -> list[Any]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "crash-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    turn(provider.get_tracer("agent"), f"conv-{n}", f"Question {n}?", "lookup", {"n": n}, f"result {n}",
         f"Answer {n}.", end=True)
    provider.shutdown()
    return list(memory.get_finished_spans())


class Sender:
    """Exports one conversation per request until stopped; remembers what was acknowledged."""

    def __init__(self, endpoint: str, first: int, acked: dict[str, set[tuple[str, str]]]) -> None:
        self.exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=2)
        self.next, self.acked, self.stopped = first, acked, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopped.is_set():
            spans = _conversation(self.next)
            if self.exporter.export(spans) is SpanExportResult.SUCCESS:
                self.acked[f"conv-{self.next}"] = {(f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}")
                                                   for s in spans}
            self.next += 1
            time.sleep(0.15)  # a few dozen conversations in all: enough kills land mid-export


def test_repeated_kill_9_loses_no_span_no_job_and_duplicates_no_score(tmp_path: Path, judge_server) -> None:
    def slow_judge(request: Request) -> Reply:
        threading.Event().wait(0.02)  # keep measures in flight when the kill comes
        return completion({"reason": "final"} if request.judge == "final_reason" else {"reason": "ok", "score": 0.5})

    judge_server.script = slow_judge
    env = {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}
    db, cfg = tmp_path / "t.duckdb", config(tmp_path)
    rng = random.Random(SEED)
    acked: dict[str, set[tuple[str, str]]] = {}
    delays, first = [], 0
    for _ in range(ROUNDS):
        collector = CollectorProcess(db, config=cfg, env=env).start()
        sender = Sender(collector.grpc_endpoint, first, acked)
        sender.thread.start()
        delays.append(round(rng.uniform(0.3, 2.0), 2))
        time.sleep(delays[-1])
        collector.kill()
        sender.stopped.set()
        sender.thread.join(30)
        first = sender.next
    context = f"seed {SEED}, kill after {delays} s, {len(acked)} conversations acknowledged"
    assert len(acked) >= ROUNDS, context

    with CollectorProcess(db, config=cfg, env=env) as collector:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            # by id, not by count: a conversation stored but whose answer the kill lost is assembled too, and
            # counting it let the wait end before the last acknowledged one was assembled
            [[conversations, open_jobs]] = query(collector, "SELECT (SELECT list(DISTINCT conversation_id) FROM "
                                                            "conversations), (SELECT count(*) FROM eval_jobs WHERE "
                                                            "status <> 'done')")
            if set(acked) <= set(conversations or []) and open_jobs == 0:
                break
            time.sleep(0.3)
        assert collector.stop() == 0
    with duckdb.connect(str(db), read_only=True) as con:
        stored = set(con.execute("SELECT trace_id, span_id FROM spans").fetchall())
        missing = [c for c, keys in acked.items() if not keys <= stored]
        assert not missing, f"acknowledged spans lost for {missing[:5]} ({context})"
        assembled = {r[0] for r in con.execute("SELECT conversation_id FROM conversations").fetchall()}
        assert set(acked) <= assembled, context
        jobs = con.execute("SELECT status, count(*) FROM eval_jobs GROUP BY 1").fetchall()
        assert jobs == [("done", METRICS * len(assembled))], f"{jobs} ({context})"
        [(rows, distinct)] = con.execute("SELECT count(*), count(DISTINCT (conversation_id, conversation_version, "
                                         "metric)) FROM scores").fetchall()
        assert rows == distinct == METRICS * len(assembled), context
        assert con.execute("SELECT DISTINCT version FROM conversations").fetchall() == [(1,)]
        # the index beside the file, rebuilt where a kill fell between its commit and DuckDB's, follows the table
        traces = con.execute("SELECT trace_id, conversation_id, epoch_us(first_received_at), epoch_us(marked_at) "
                             "FROM assembled_traces").fetchall()
        newest = set(con.execute(f"{LATEST_VERSIONS} GROUP BY conversation_id").fetchall())
    assert len(traces) == len({t[0] for t in traces})  # a row a trace
    with sqlite3.connect(index_path(db)) as sql:
        assert set(sql.execute("SELECT trace_id, conversation_id, first_us, marked_us FROM traces")) == set(traces)
        assert set(sql.execute("SELECT * FROM versions")) == newest


def test_a_database_duckdb_invalidated_stops_the_collector_non_zero_and_a_restart_has_every_acknowledged_span(
        tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"  # the first checkpoint, at a 1 MB WAL, invalidates it
    faulty = CollectorProcess(db, config=config(tmp_path, '[store]\ncheckpoint_threshold = "1MB"\n'),
                             command=[sys.executable, "-c", armed_collector(str(Path(__file__).parents[1]))])
    acked: dict[str, set[tuple[str, str]]] = {}
    with faulty:
        assert faulty.proc is not None
        exporter = OTLPSpanExporter(endpoint=faulty.grpc_endpoint, insecure=True, timeout=5)
        for n in range(2000):  # until the first export the invalid database refuses
            spans = _conversation(n)
            if exporter.export(spans) is not SpanExportResult.SUCCESS:
                break
            acked[f"conv-{n}"] = {(f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}") for s in spans}
        code = faulty.proc.wait(60)  # stopped by itself, not left running with a database that refuses everything
        time.sleep(0.1)
    records = [json.loads(line) for line in faulty.log_lines if line.startswith("{")]
    assert code == 1, records[-5:]
    critical = [r for r in records if r["level"] == "critical"]
    assert len(critical) == 1, critical
    assert "Checkpoint aborted" in critical[0]["reason"] and "restart the collector" in critical[0]["advice"]
    assert records[-1]["event"] == "stopped", records[-3:]  # drained as on SIGTERM
    assert acked, "no export was acknowledged before the checkpoint"

    with CollectorProcess(db, config=config(tmp_path)) as plain:
        stored = query(plain, "SELECT trace_id, span_id FROM spans")
        keys = {tuple(row) for row in stored}
        missing = [c for c, spans in acked.items() if not spans <= keys]
        assert not missing, f"acknowledged spans lost: {missing[:5]}"
        assert len(stored) == len(keys), "an export answered with an error was stored twice"
        # what the pipeline had in flight is taken up again: every acknowledged conversation is assembled
        assembled = wait_for(plain, "SELECT DISTINCT conversation_id FROM conversations", len(acked))
        assert set(acked) <= {row[0] for row in assembled}
        assert plain.stop() == 0


def test_a_fatal_error_on_a_pipeline_cursor_invalidates_the_store_once_and_ingest_is_refused_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(span_store, "lock_down", armed(span_store.lock_down))
    store = span_store.SpanStore(tmp_path / "t.duckdb")
    told: list[span_store.StoreInvalidated] = []

    def tell(error: span_store.StoreInvalidated) -> None:
        told.append(error)
        raise BrokenPipeError("stderr is gone")  # the log line cannot be written: the store goes on regardless

    store.on_invalidated = tell
    store.open()
    try:
        retention, scoring = store.cursor(), store.cursor()
        with pytest.raises(duckdb.FatalException):  # no span is coming: the pipeline is the first to meet it
            retention.execute("CHECKPOINT")
        with pytest.raises(duckdb.FatalException):  # another cursor meets it too; told once
            scoring.execute("SELECT count(*) FROM eval_jobs")
        with pytest.raises(WritesRefused, match="restart the collector"):  # not attempted
            scoring.execute("UPDATE eval_jobs SET status = 'done'")
        assert len(told) == 1 and "Checkpoint aborted" in told[0].error
        assert store.invalidated is told[0] and not store.healthy
        rows = spans_to_arrow(_spans(1, 1, session="chat-1", turn="hello"), dt.datetime.now(dt.UTC))
        with pytest.raises(span_store.StoreInvalidated, match="restart the collector"):
            asyncio.run(store.write(rows))
    finally:
        store.close()


SINCE = [dt.datetime(2026, 1, 1, tzinfo=dt.UTC)]
READS: dict[str, Callable[[duckdb.DuckDBPyConnection], object]] = {
    # DuckDB 2 makes an Arrow answer outside `execute` (the assembler's span reads, retention's archive)
    "an answer read into Arrow": lambda cursor: arrow_table(
        cursor, "SELECT trace_id FROM span_records WHERE received_at > ?", SINCE),
    # the assembled-traces index opens its own cursor from the one it is given
    "a cursor opened from a store's cursor": lambda cursor: cursor.cursor().execute(
        "SELECT count(*) FROM span_records").fetchall(),
}


@pytest.mark.parametrize("read", list(READS))
def test_a_fatal_error_met_by_any_read_invalidates_the_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read: str) -> None:
    """Every way the pipeline reads must stop the collector on DuckDB's fatal error, as a statement does, not leave
    it to the next statement."""
    monkeypatch.setattr(span_store, "lock_down", armed(span_store.lock_down))
    store = span_store.SpanStore(tmp_path / "t.duckdb")
    told: list[span_store.StoreInvalidated] = []
    store.on_invalidated = told.append
    store.open()
    try:
        with pytest.raises(duckdb.FatalException):
            connect_file(tmp_path / "t.duckdb").execute("CHECKPOINT")  # outside the store: nobody is told
        assert store.invalidated is None
        with pytest.raises(duckdb.FatalException):
            READS[read](store.cursor())
        assert len(told) == 1 and store.invalidated is told[0] and not store.healthy
    finally:
        store.close()
