"""The collector as production agents see it: the real OTel SDK exporters against `tracejudge serve` on loopback."""

from __future__ import annotations

import gzip
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import grpc
import httpx
import pyarrow as pa
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench.ingest import process_tree
from tests.support.collector_process import CollectorProcess
from tests.support.otlp_json import request, span
from tracejudge.mapping import decode_otlp

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def agent_spans(n_turns: int = 2, conversation: str = "conv-1") -> list[ReadableSpan]:
    """Spans an instrumented agent makes: an invoke_agent root with a chat and an MCP tool call per turn."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "weather-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test-agent")
    for turn in range(n_turns):
        with tracer.start_as_current_span("invoke_agent weather", attributes={
                "gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": conversation}):
            with tracer.start_as_current_span("chat gpt-4.1", attributes={
                    "gen_ai.operation.name": "chat",
                    "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [
                        {"type": "text", "content": f"question {turn} °C ✓"}]}])}):
                pass
            with tracer.start_as_current_span("execute_tool get-weather", attributes={
                    "gen_ai.operation.name": "execute_tool", "mcp.method.name": "tools/call",
                    "gen_ai.tool.name": "get-weather", "gen_ai.tool.call.arguments": '{"city": "Paris"}'}):
                pass
    provider.shutdown()
    return list(memory.get_finished_spans())


def stored(db: Path) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT trace_id, span_id, name, kind, service_name, conversation_key, "
                           "conversation_key_source, attributes->>'gen_ai.tool.name' FROM spans "
                           "ORDER BY start_ns").fetchall()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "spans.duckdb"


def test_grpc_and_http_exporters_store_every_span(db: Path) -> None:
    spans = agent_spans()
    with CollectorProcess(db) as collector:
        grpc_exporter = GrpcSpanExporter(endpoint=collector.grpc_endpoint, insecure=True)
        assert grpc_exporter.export(spans[:3]) is SpanExportResult.SUCCESS
        http_exporter = HttpSpanExporter(endpoint=collector.http_url, compression=Compression.Gzip)
        assert http_exporter.export(spans[3:]) is SpanExportResult.SUCCESS
        assert collector.metric("tracejudge_spans_accepted_total") == len(spans)
        # two turns, two traces, one conversation: waiting out its quiet period, as /metrics tells the operator
        assert (collector.metric("tracejudge_traces_waiting"), collector.metric("tracejudge_conversations_waiting")) \
            == (2, 1)
        assert collector.stop() == 0
    rows = stored(db)
    assert len(rows) == len(spans)
    assert {r[1] for r in rows} == {format(s.context.span_id, "016x") for s in spans}
    tool = next(r for r in rows if r[2] == "execute_tool get-weather")
    root = next(r for r in rows if r[2] == "invoke_agent weather")
    assert tool[3:] == (1, "weather-agent", None, None, "get-weather")  # the key is on the root span only
    assert root[5:7] == ("conv-1", "gen_ai.conversation.id")


def test_redelivered_spans_are_stored_once(db: Path) -> None:
    spans = agent_spans(1)
    with CollectorProcess(db) as collector:
        exporter = GrpcSpanExporter(endpoint=collector.grpc_endpoint, insecure=True)
        for _ in range(3):
            assert exporter.export(spans) is SpanExportResult.SUCCESS
        http = HttpSpanExporter(endpoint=collector.http_url)
        assert http.export(spans) is SpanExportResult.SUCCESS
        # what was stored is counted as accepted, the three redeliveries apart
        assert collector.metric("tracejudge_spans_accepted_total") == len(spans)
        assert collector.metric("tracejudge_spans_duplicate_total") == 3 * len(spans)
        collector.stop()
    assert len(stored(db)) == len(spans)
    stopped = next(json.loads(line) for line in collector.log_lines if '"stopped"' in line)
    assert (stopped["spans_committed"], stopped["spans_duplicate"]) == (len(spans), 3 * len(spans))
    # an exporter retrying across a collector restart: the request's digest was committed with its spans
    with CollectorProcess(db) as collector:
        exporter = GrpcSpanExporter(endpoint=collector.grpc_endpoint, insecure=True)
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        assert collector.metric("tracejudge_spans_duplicate_total") == len(spans)
        collector.stop()
    assert len(stored(db)) == len(spans)


def test_a_database_from_before_schema_7_keeps_its_spans_and_loses_the_span_index(tmp_path: Path) -> None:
    from tracejudge.collector.store.schema import MIGRATIONS, SCHEMA_VERSION
    from tracejudge.collector.store.span_store import SpanStore

    db = tmp_path / "old.duckdb"
    with duckdb.connect(str(db)) as con:  # the file a collector of schema 6 left
        con.execute("CREATE TABLE tracejudge_schema (version INTEGER NOT NULL, applied_at TIMESTAMPTZ)")
        for version in range(1, 7):
            con.execute(MIGRATIONS[version])
            con.execute("INSERT INTO tracejudge_schema VALUES (?, now())", [version])
        con.execute("INSERT INTO spans (trace_id, span_id, name, attributes, received_at) "
                    "SELECT 't' || i, 's' || i, 'chat', '{}', now() FROM range(1000) r(i)")
    store = SpanStore(db)
    store.open()
    con = store.cursor()
    assert con.execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone() == (1000, 1000)
    assert con.execute("SELECT count(*) FROM duckdb_constraints() WHERE table_name = 'spans' "
                       "AND constraint_type = 'PRIMARY KEY'").fetchone() == (0,)
    assert con.execute("SELECT max(version) FROM tracejudge_schema").fetchone() == (SCHEMA_VERSION,)
    store.close()


def test_request_digests_of_a_schema_10_file_are_kept_without_their_index_and_still_recognised(tmp_path: Path) -> None:
    """Schema 11 drops the digests' primary key (the writer's INSERT OR REPLACE cost); a digest committed before
    the upgrade, or stored twice since, still marks its request as already stored."""
    import datetime as dt

    from tracejudge.collector.store.schema import MIGRATIONS
    from tracejudge.collector.store.span_store import SpanStore

    db = tmp_path / "v10.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE tracejudge_schema (version INTEGER NOT NULL, applied_at TIMESTAMPTZ)")
        for version in range(1, 11):
            con.execute(MIGRATIONS[version])
            con.execute("INSERT INTO tracejudge_schema VALUES (?, now())", [version])
        con.execute("INSERT INTO ingest_requests VALUES (?, ?)", [b"\x01" * 16, dt.datetime.now(dt.UTC)])
    store = SpanStore(db)
    store.open()
    con = store.cursor()
    assert con.execute("SELECT count(*) FROM duckdb_constraints() WHERE table_name = 'ingest_requests' "
                       "AND constraint_type = 'PRIMARY KEY'").fetchone() == (0,)
    con.execute("INSERT INTO ingest_requests VALUES (?, now())", [b"\x01" * 16])  # the same digest twice
    store.close()
    store = SpanStore(db)
    store.open()
    assert b"\x01" * 16 in store._committed and len(store._committed) == 1
    store.close()


async def test_a_failing_commit_listener_is_counted_and_reported_and_the_spans_stay_committed(tmp_path: Path) -> None:
    """The assembler takes in each commit as a listener; if it ever fails, the commit stands and the failure is
    told (the collector logs it as an error), never swallowed."""
    import datetime as dt

    from tracejudge.collector.config import Settings
    from tracejudge.collector.receivers.span_rows import spans_to_arrow
    from tracejudge.collector.store.span_store import SpanStore

    store = SpanStore(tmp_path / "t.duckdb", threads=Settings().store.threads)
    store.open()
    assert store.cursor().execute("SELECT current_setting('threads')").fetchone() == (1,)  # cheapest appends
    told: list[Exception] = []
    seen: list[int] = []

    def broken(table) -> None:  # noqa: ANN001
        raise KeyError("attributes")

    def tell(exc: Exception) -> None:
        told.append(exc)
        raise RuntimeError("the logger failed too")  # still no hang: the exporters get their answer

    store.listeners += [broken, lambda table: seen.append(table.num_rows)]
    store.on_listener_error = tell
    body = json.dumps(request(({"service.name": "agent"}, [span(1, 1, "chat"), span(1, 2, "tool")]))).encode()
    table = spans_to_arrow(decode_otlp(body, "application/json").spans, dt.datetime.now(dt.UTC))
    assert await store.write(table) == 2
    store.close()
    assert store.stats.listener_errors == 1 and [type(e) for e in told] == [KeyError] and seen == [2]
    with duckdb.connect(str(tmp_path / "t.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM spans WHERE attributes IS NOT NULL").fetchone() == (2,)
        assert con.execute("SELECT typeof(attributes) FROM spans LIMIT 1").fetchone() == ("JSON",)
    assert table.spans.schema.field("attributes").type == pa.json_(pa.string())  # stored as given, not parsed again


async def test_a_commit_that_meets_a_query_holding_duckdbs_memory_waits_for_it_instead_of_failing(
        tmp_path: Path) -> None:
    """Queries share DuckDB's buffer pool with the writer; a commit that finds it full waits for the query to let
    go, so the exporter gets its acknowledgement instead of a retry a second later."""
    import datetime as dt
    import threading

    from tracejudge.collector.receivers.span_rows import spans_to_arrow
    from tracejudge.collector.store.connection.arrow_reads import DUCKDB_MAJOR
    from tracejudge.collector.store.span_store import SpanStore

    store = SpanStore(tmp_path / "t.duckdb", memory_limit="64MB", temp_limit="0KB", threads=1)
    store.open()
    query = store.cursor()  # a query holding the pool: an in-memory table it cannot spill (no temp space)
    query.execute("CREATE TEMP TABLE hog (s VARCHAR)")
    # DuckDB 2 tells the full pool at the statement's commit, with the class a failed commit has
    full = duckdb.OutOfMemoryException if DUCKDB_MAJOR < 2 else (duckdb.OutOfMemoryException,
                                                                 duckdb.TransactionException)
    with pytest.raises(full):
        for _ in range(1000):  # fill the pool to the last block
            query.execute("INSERT INTO hog SELECT repeat('x', 200) || i FROM range(5000) t(i)")

    answered = threading.Event()

    def query_lets_go() -> None:
        while store.stats.memory_retries == 0 and not answered.wait(0.005):
            pass
        query.execute("DROP TABLE hog")

    releaser = threading.Thread(target=query_lets_go)
    releaser.start()
    body = json.dumps(request(({"service.name": "agent"}, [span(1, i + 1, "x" * 3000) for i in range(2000)])))
    table = spans_to_arrow(decode_otlp(body.encode(), "application/json").spans, dt.datetime.now(dt.UTC))
    try:
        assert await store.write(table) == 2000
    finally:
        answered.set()
        releaser.join()
    assert store.stats.memory_retries >= 1  # it did meet the full pool
    assert store.cursor().execute("SELECT count(*) FROM spans").fetchone() == (2000,)
    store.close()


async def test_the_wal_is_checkpointed_at_the_configured_size_and_a_size_duckdb_cannot_read_is_named(
        tmp_path: Path) -> None:
    """The commit that crosses `[store] checkpoint_threshold` waits for the checkpoint, and so do the exports in
    it: the setting must reach DuckDB (the default keeps that wait short, BENCHMARKS.md), a typo in it must stop the
    start with the setting's name rather than run with DuckDB's own, and "none" is refused, not an endless WAL."""
    import datetime as dt

    from tracejudge.collector.config import StoreSettings
    from tracejudge.collector.receivers.span_rows import spans_to_arrow
    from tracejudge.collector.store.span_store import SpanStore, StoreOpenError

    body = json.dumps(request(({"service.name": "agent"}, [span(1, i + 1, "x" * 3000) for i in range(500)])))
    wal_sizes = {}
    for threshold in ("1MB", "1GB"):
        store = SpanStore(tmp_path / f"{threshold}.duckdb", checkpoint_threshold=threshold)
        store.open()
        spans = decode_otlp(body.encode(), "application/json").spans
        for _ in range(4):  # about 1.5 MB of WAL per write: past the small threshold, far under the large one
            await store.write(spans_to_arrow(spans, dt.datetime.now(dt.UTC)))
        wal = Path(f"{tmp_path}/{threshold}.duckdb.wal")
        wal_sizes[threshold] = wal.stat().st_size if wal.exists() else 0
        store.close()
    assert wal_sizes["1MB"] < 2_000_000 < 4_000_000 < wal_sizes["1GB"], wal_sizes
    with pytest.raises(StoreOpenError, match=r"\[store\] checkpoint_threshold = 'lots' is not a size DuckDB accepts"):
        SpanStore(tmp_path / "typo.duckdb", checkpoint_threshold="lots").open()
    with pytest.raises(ValueError, match="'none' is not a size"):  # DuckDB would take it as never: an endless WAL
        StoreSettings(checkpoint_threshold="none")
    assert StoreSettings(assembling_checkpoint_threshold="none").assembling_checkpoint_threshold is None
    assert StoreSettings().assembling_checkpoint_threshold == "64MB"
    with pytest.raises(ValueError, match="'lots' is not a size"):
        StoreSettings(assembling_checkpoint_threshold="lots")


def test_ingest_token_is_required_when_configured(db: Path) -> None:
    spans = agent_spans(1)
    with CollectorProcess(db, env={"TRACEJUDGE_INGEST_TOKEN": "s3cret-token"}) as collector:
        assert GrpcSpanExporter(endpoint=collector.grpc_endpoint, insecure=True,
                                timeout=5).export(spans) is SpanExportResult.FAILURE
        assert HttpSpanExporter(endpoint=collector.http_url, timeout=5).export(spans) is SpanExportResult.FAILURE
        wrong = httpx.post(collector.http_url, content=b"{}", headers={"Content-Type": "application/json",
                                                                       "Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["code"] == 16
        good = {"authorization": "Bearer s3cret-token"}
        assert GrpcSpanExporter(endpoint=collector.grpc_endpoint, insecure=True,
                                headers=good).export(spans) is SpanExportResult.SUCCESS
        assert HttpSpanExporter(endpoint=collector.http_url, headers=good).export(spans) is SpanExportResult.SUCCESS
        collector.stop()
        logs = "".join(collector.log_lines)
        assert "s3cret-token" not in logs
    assert len(stored(db)) == len(spans)


def _mixed_json_request() -> dict:
    good = span(1, 1, "good span", attributes={"gen_ai.operation.name": "chat"})
    bad_id = dict(span(1, 2, "bad id"), spanId="abc")
    zero_trace = dict(span(1, 3, "zero trace"), traceId="0" * 32)
    return request(({"service.name": "svc"}, [good, bad_id, zero_trace]))


def test_http_partial_success_keeps_the_good_spans(db: Path) -> None:
    with CollectorProcess(db) as collector:
        reply = httpx.post(collector.http_url, json=_mixed_json_request())
        assert reply.status_code == 200
        partial = reply.json()["partialSuccess"]
        assert partial["rejectedSpans"] == "2"
        assert "spans[1]" in partial["errorMessage"] and "span_id" in partial["errorMessage"]
        assert "trace_id is all zeros" in partial["errorMessage"]
        collector.stop()
    assert [r[2] for r in stored(db)] == ["good span"]


def test_grpc_partial_success_for_invalid_utf8_and_bad_ids(db: Path) -> None:
    spans = [PbSpan(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="good"),
             PbSpan(trace_id=b"\x01" * 16, span_id=b"\x03" * 8, name="BADUTF"),
             PbSpan(trace_id=b"\x01" * 15, span_id=b"\x04" * 8, name="short trace id")]
    raw = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])])
    payload = raw.SerializeToString().replace(b"BADUTF", b"\xff\xfe\xfd\xfc\xfb\xfa")
    with CollectorProcess(db) as collector, grpc.insecure_channel(collector.grpc_endpoint) as channel:
        export = channel.unary_unary(EXPORT, request_serializer=None,
                                     response_deserializer=ExportTraceServiceResponse.FromString)
        response = export(payload, timeout=10)
        assert response.partial_success.rejected_spans == 2
        assert "invalid UTF-8" in response.partial_success.error_message
        assert "trace_id must be 16 bytes" in response.partial_success.error_message
        with pytest.raises(grpc.RpcError) as info:
            export(b"\x0a\x05garbage-not-protobuf", timeout=10)
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid OTLP protobuf" in info.value.details()
        collector.stop()
    assert [r[2] for r in stored(db)] == ["good"]


def test_http_status_codes_for_bad_requests(db: Path, tmp_path: Path) -> None:
    config = tmp_path / "tracejudge.toml"
    config.write_text("[server]\nmax_message_bytes = 4096\n")
    with CollectorProcess(db, config=config) as collector:
        url = collector.http_url
        big = json.dumps(request(({}, [span(1, i, "x" * 100) for i in range(1, 60)]))).encode()
        assert httpx.post(url, content=big, headers={"Content-Type": "application/json"}).status_code == 413
        bomb = gzip.compress(b'{"resourceSpans": [' + b" " * 1_000_000 + b"]}")
        reply = httpx.post(url, content=bomb, headers={"Content-Type": "application/json",
                                                        "Content-Encoding": "gzip"})
        assert reply.status_code == 413 and "after decompression" in reply.json()["message"]
        reply = httpx.post(url, content=b"<xml/>", headers={"Content-Type": "application/xml"})
        assert reply.status_code == 415
        reply = httpx.post(url, content=b"\x0a\xff", headers={"Content-Type": "application/x-protobuf"})
        assert reply.status_code == 400 and reply.headers["content-type"] == "application/x-protobuf"
        reply = httpx.post(url, content=b"not gzip", headers={"Content-Type": "application/json",
                                                               "Content-Encoding": "gzip"})
        assert reply.status_code == 400 and "not valid gzip" in reply.json()["message"]
        small = gzip.compress(json.dumps(request(({}, [span(1, 1, "fits")]))).encode())
        reply = httpx.post(url, content=small, headers={"Content-Type": "application/json",
                                                         "Content-Encoding": "gzip"})
        assert reply.status_code == 200 and reply.json() == {}
        with grpc.insecure_channel(collector.grpc_endpoint) as channel:
            export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            with pytest.raises(grpc.RpcError) as info:
                export(b"\x00" * 10_000, timeout=10)
            assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        collector.stop()
    assert [r[2] for r in stored(db)] == ["fits"]


def test_backpressure_answers_retryable_and_the_exporter_retry_succeeds(db: Path, tmp_path: Path) -> None:
    config = tmp_path / "tracejudge.toml"
    config.write_text("[server]\nmax_message_bytes = 67108864\n"
                      "[store]\nmax_queue_spans = 60000\nmax_batch_spans = 100000\n")
    small = agent_spans(1)
    floods, accepted = 0, 0
    with CollectorProcess(db, config=config) as collector:
        refused: list[httpx.Response] = []
        # while a flood waits for its commit, a request is refused retryably; on a busy machine the commit may end
        # before the first one is decoded, so a new flood (other spans: the same body is a duplicate) until one is
        for flood_trace in range(9, 14):
            flood = request(({}, [span(flood_trace, i, "flood", attributes={"k": "v" * 200})
                                  for i in range(1, 60_001)]))
            flooding = threading.Thread(target=httpx.post, args=(collector.http_url,),
                                        kwargs={"json": flood, "timeout": 120})
            flooding.start()
            floods += 1
            deadline = time.monotonic() + 60
            while collector.metric("tracejudge_queue_spans") == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            replies: list[httpx.Response] = []
            while flooding.is_alive() and not any(r.status_code == 503 for r in replies):
                replies.append(httpx.post(collector.http_url, json=request(({}, [span(8, accepted + len(replies) + 1,
                                                                                      "late")]))))
            accepted += sum(r.status_code == 200 for r in replies)
            refused = [r for r in replies if r.status_code == 503]
            if refused:
                break
            flooding.join()
        assert refused and refused[0].headers["Retry-After"] == "1", f"no request refused in {floods} floods"
        exporter = GrpcSpanExporter(endpoint=collector.grpc_endpoint, insecure=True, timeout=60)
        assert exporter.export(small) is SpanExportResult.SUCCESS  # retried until the flood was committed
        flooding.join()
        assert collector.metric('tracejudge_spans_rejected_total{reason="backpressure"}') >= 1
        collector.stop()
    names = [r[2] for r in stored(db)]
    assert names.count("flood") == 60_000 * floods and len(names) == 60_000 * floods + len(small) + accepted


def test_acknowledged_spans_survive_kill_9(db: Path) -> None:
    batches = [agent_spans(3, conversation=f"c{i}") for i in range(5)]
    with CollectorProcess(db) as collector:
        exporter = GrpcSpanExporter(endpoint=collector.grpc_endpoint, insecure=True)
        for spans in batches:
            assert exporter.export(spans) is SpanExportResult.SUCCESS
        json_body = request(({}, [span(4, 1, "starts the decode workers")]))  # OTLP/JSON: the Python decoder's
        assert httpx.post(collector.http_url, json=json_body).status_code == 200
        assert collector.proc is not None
        workers = process_tree(collector.proc.pid)[1:]
        assert workers, "the decode workers should be running"
        collector.kill()
    deadline = time.monotonic() + 15  # orphaned decode workers notice and exit within a couple of seconds
    while any(Path(f"/proc/{w}").exists() for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [w for w in workers if Path(f"/proc/{w}").exists()], "decode workers outlived a killed collector"
    with CollectorProcess(db) as collector:  # opens cleanly after the crash, recovering from the WAL
        assert collector.stop() == 0
    assert len(stored(db)) == sum(len(b) for b in batches) + 1


def test_sigterm_drains_in_flight_exports(db: Path) -> None:
    big = request(({}, [span(21, i, "in flight", attributes={"k": "v" * 200}) for i in range(1, 30_001)]))
    with CollectorProcess(db) as collector:
        replies: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: replies.append(httpx.post(collector.http_url, json=big,
                                                                           timeout=120)))
        sender.start()
        deadline = time.monotonic() + 60
        while collector.metric("tracejudge_spans_received_total") == 0 and time.monotonic() < deadline:
            time.sleep(0.005)  # SIGTERM once the request is being handled, before it is committed
        assert collector.stop() == 0
        sender.join()
        assert '"event": "stopped"' in "".join(collector.log_lines)
    assert [r.status_code for r in replies] == [200] and len(stored(db)) == 30_000


def test_admin_health_readiness_and_metrics(db: Path) -> None:
    with CollectorProcess(db) as collector:
        assert httpx.get(f"{collector.admin_url}/healthz").text == "ok\n"
        ready = httpx.get(f"{collector.admin_url}/readyz")
        assert ready.status_code == 200 and ready.json()["ready"] is True
        GrpcSpanExporter(endpoint=collector.grpc_endpoint, insecure=True).export(agent_spans(1))
        text = httpx.get(f"{collector.admin_url}/metrics").text
        assert 'tracejudge_export_requests_total{protocol="grpc",status="ok"} 1.0' in text
        assert "tracejudge_commit_seconds_bucket" in text and "tracejudge_store_bytes" in text
        # exports the span writer answered 50 ms or more after they came (what the assembler's pauses follow)
        assert "\ntracejudge_ingest_requests_slowed_total " in text
        collector.stop()


def test_a_database_locked_by_another_process_fails_at_start_naming_it(db: Path) -> None:
    with CollectorProcess(db) as first:
        second = CollectorProcess(db)
        with pytest.raises(RuntimeError) as info:
            second.start()
        text = str(info.value)
        assert str(db) in text and "lock" in text.lower()
        first.stop()


def test_invalid_settings_fail_at_start_with_their_name(db: Path, tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[server]\nmax_message_bytes = \"big\"\n")
    with pytest.raises(RuntimeError) as info:
        CollectorProcess(db, config=config).start()
    assert "[server] max_message_bytes = 'big'" in str(info.value) and "bad.toml" in str(info.value)
    config.write_text("[server]\ngrcp_port = 1\n")
    with pytest.raises(RuntimeError) as info:
        CollectorProcess(db, config=config).start()
    assert "unknown setting [server] grcp_port" in str(info.value)


def test_replay_sends_saved_traces_over_http_and_grpc(db: Path, tmp_path: Path) -> None:
    from tests.fixtures import semconv_scenarios

    trace = tmp_path / "saved.jsonl"
    trace.write_text(json.dumps(semconv_scenarios.otel_genai()) + "\n" + json.dumps(_mixed_json_request()) + "\n")
    clean = tmp_path / "clean.json"
    clean_body = request(({"service.name": "replayed"}, [span(77, 1, "replayed root"), span(77, 2, "child", 1)]))
    clean.write_text(json.dumps(clean_body))
    with CollectorProcess(db) as collector:
        cli = [sys.executable, "-m", "tracejudge.collector.cli", "replay"]
        proc = subprocess.run([*cli, str(trace), "--endpoint", collector.http_url], capture_output=True, text=True)
        assert proc.returncode == 1 and "sent 2 request(s)" in proc.stdout and "2 span(s) rejected" in proc.stdout
        proc = subprocess.run([*cli, str(clean), "--protocol", "grpc", "--endpoint", collector.grpc_endpoint],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        base = collector.http_url.removesuffix("/v1/traces")  # the form OTEL_EXPORTER_OTLP_ENDPOINT takes
        proc = subprocess.run([*cli, str(clean), "--endpoint", base], capture_output=True, text=True)
        assert proc.returncode == 0 and f"to {collector.http_url}" in proc.stdout, proc.stderr
        proc = subprocess.run([*cli, str(clean), "--protocol", "grpc", "--endpoint",
                               f"http://{collector.grpc_endpoint}"], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        collector.stop()
    bodies = (semconv_scenarios.otel_genai(), _mixed_json_request(), clean_body)
    expected = {s.key for body in bodies for s in decode_otlp(json.dumps(body), "application/json").spans}
    rows = stored(db)
    assert {(r[0], r[1]) for r in rows} == expected
    assert [r[4] for r in rows if r[2] == "replayed root"] == ["replayed"]  # resource kept through gRPC


def test_tls_and_mutual_tls_on_both_receivers(db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.certificates import make_certificates

    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # requests lets these override the exporter's CA file
        monkeypatch.delenv(name, raising=False)
    certs = make_certificates(tmp_path / "certs")
    config = tmp_path / "tls.toml"
    config.write_text(f'[server]\ntls_cert = "{certs.server_cert}"\ntls_key = "{certs.server_key}"\n'
                      f'tls_client_ca = "{certs.ca}"\n')
    spans = agent_spans(1)
    with CollectorProcess(db, config=config) as collector:
        assert collector.http_url.startswith("https://")
        body = json.dumps(request(({}, [span(5, 1, "over tls")])))
        anonymous = ssl.create_default_context(cafile=certs.ca)
        with pytest.raises(httpx.HTTPError):  # no client certificate: the handshake is refused
            httpx.post(collector.http_url, content=body, verify=anonymous,
                       headers={"Content-Type": "application/json"})
        identified = ssl.create_default_context(cafile=certs.ca)
        identified.load_cert_chain(certs.client_cert, certs.client_key)
        reply = httpx.post(collector.http_url, content=body, headers={"Content-Type": "application/json"},
                           verify=identified)
        assert reply.status_code == 200
        exporter = HttpSpanExporter(endpoint=collector.http_url, certificate_file=str(certs.ca),
                                    client_certificate_file=str(certs.client_cert),
                                    client_key_file=str(certs.client_key))
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        credentials = grpc.ssl_channel_credentials(certs.ca.read_bytes(), certs.client_key.read_bytes(),
                                                   certs.client_cert.read_bytes())
        grpc_exporter = GrpcSpanExporter(endpoint=collector.grpc_endpoint, credentials=credentials)
        assert grpc_exporter.export(agent_spans(1, conversation="tls-grpc")) is SpanExportResult.SUCCESS
        collector.stop()
    assert len(stored(db)) == 1 + 2 * len(spans)


def test_malformed_json_shapes_are_span_problems_and_lone_surrogates_are_stored(db: Path) -> None:
    good = span(1, 1, "good")
    broken = [dict(span(1, 2, "events not a list"), events=5),
              dict(span(1, 3, "huge time"), startTimeUnixNano="1e400"),
              dict(span(1, 4, "bad array"), attributes=[{"key": "k", "value": {"arrayValue": [1]}}])]
    surrogate = span(1, 5, "surrogate", attributes={"text": "x"})
    body = json.dumps(request(({}, [good, *broken, surrogate]))).replace('"x"', '"x\\ud800y"')
    with CollectorProcess(db) as collector:
        reply = httpx.post(collector.http_url, content=body, headers={"Content-Type": "application/json"})
        assert reply.status_code == 200, reply.text
        assert reply.json()["partialSuccess"]["rejectedSpans"] == "3"
        deep = "[" * 100_000 + "]" * 100_000
        reply = httpx.post(collector.http_url, content=deep, headers={"Content-Type": "application/json"})
        assert reply.status_code == 400
        collector.stop()
    rows = stored(db)
    assert sorted(r[2] for r in rows) == ["good", "surrogate"]


def test_gzip_bodies_must_be_complete_and_may_have_several_members(db: Path) -> None:
    first = gzip.compress(json.dumps(request(({}, [span(2, 1, "member one")]))).encode())
    with CollectorProcess(db) as collector:
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        reply = httpx.post(collector.http_url, content=first[:-12], headers=headers)
        assert reply.status_code == 400 and "truncated" in reply.json()["message"]
        reply = httpx.post(collector.http_url, content=first + gzip.compress(b" "), headers=headers)
        assert reply.status_code == 200
        collector.stop()
    assert [r[2] for r in stored(db)] == ["member one"]


def test_a_dead_decode_worker_is_replaced_and_the_export_retried(db: Path) -> None:
    """Protobuf is decoded in C on the server's threads, without a process; the first request that needs the Python
    decoder starts its worker processes, and one that dies is replaced and the export retried. (Assembly workers
    start with the first conversation built: agent_spans ends none within the test, and any there are left alone.)"""
    with CollectorProcess(db) as collector:
        assert collector.proc is not None
        assembly = set(process_tree(collector.proc.pid)[1:])
        exporter = GrpcSpanExporter(endpoint=collector.grpc_endpoint, insecure=True, timeout=60)
        assert exporter.export(agent_spans(1)) is SpanExportResult.SUCCESS
        assert set(process_tree(collector.proc.pid)[1:]) == assembly, \
            "a worker process ran for protobuf the C walk decodes"
        start = request(({}, [span(3, 2, "starts the workers")]))
        assert httpx.post(collector.http_url, json=start).status_code == 200
        assert '"event": "decode workers started"' in "".join(collector.log_lines)
        children = [pid for pid in process_tree(collector.proc.pid)[1:] if pid not in assembly]
        assert children
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        body = request(({}, [span(3, 1, "after the crash")]))
        first = httpx.post(collector.http_url, json=body)
        assert first.status_code in (200, 503) and (first.status_code == 200 or "Retry-After" in first.headers)
        assert exporter.export(agent_spans(1)) is SpanExportResult.SUCCESS
        assert httpx.post(collector.http_url, json=body).status_code == 200
        collector.stop()
    assert "after the crash" in [r[2] for r in stored(db)]


def test_the_wal_is_checkpointed_while_conversations_are_assembled_and_scored(tmp_path: Path) -> None:
    """DuckDB checkpoints only when no open transaction needs the old data; a query result left unread on an idle
    connection (the storage report's, once a minute) kept one open, so while the pipeline assembled and scored,
    no checkpoint ran and the WAL, and the memory holding its rows, grew with every export."""
    config = tmp_path / "tracejudge.toml"
    config.write_text('[store]\ncheckpoint_threshold = "1MB"\n[conversations]\nquiet_period_s = 0.2\npoll_s = 0.1\n'
                      '[scoring]\nmetrics = ["mcp_call_validity"]\n')
    wal = Path(f"{tmp_path}/t.duckdb.wal")
    sizes = []
    with CollectorProcess(tmp_path / "t.duckdb", config=config) as collector:
        exporter = GrpcSpanExporter(endpoint=collector.grpc_endpoint, insecure=True)
        for round_ in range(16):  # about 0.8 MB of WAL each, 13 MB in all
            memory = InMemorySpanExporter()
            provider = TracerProvider(resource=Resource.create({"service.name": "agent"}))
            provider.add_span_processor(SimpleSpanProcessor(memory))
            tracer = provider.get_tracer("agent")
            for turn in range(8):
                with tracer.start_as_current_span("invoke_agent", attributes={
                        "gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": f"c-{round_}-{turn}",
                        "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [
                            {"type": "text", "content": f"question {round_} {turn} " + "words " * 16_000}]}])}):
                    pass
            provider.shutdown()
            assert exporter.export(list(memory.get_finished_spans())) is SpanExportResult.SUCCESS
            time.sleep(0.3)  # conversations complete and are scored between the exports
            try:  # a checkpoint may remove the file between a look and a stat: read it once
                sizes.append(wal.stat().st_size)
            except FileNotFoundError:
                sizes.append(0)
        assert collector.metric("tracejudge_conversations_assembled_total") >= 64
    assert max(sizes[8:]) < 4_000_000, [round(size / 1e6, 1) for size in sizes]
