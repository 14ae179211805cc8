"""Attacks on a real `tracejudge serve` that used to exhaust or freeze it, each asserting it no longer works:
the server's memory stays bounded (its peak RSS, VmHWM) and a normal exporter keeps being served."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk.trace.export import SpanExportResult

from tests.support.at_once import at_once
from tests.support.collector_process import CollectorProcess
from tests.support.otlp_json import request, span
from tests.test_ingest import agent_spans

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
TOKEN = "hostile-test-token"
MiB = 1024 * 1024


def peak_rss_mb(collector: CollectorProcess, field: str = "VmHWM") -> float:
    """The server process's high-water mark of resident memory (VmHWM; VmRSS: what it holds now), in MB."""
    assert collector.proc is not None
    for line in Path(f"/proc/{collector.proc.pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field}")


def exporter_still_served(collector: CollectorProcess, token: str | None = None) -> None:
    headers = {"authorization": f"Bearer {token}"} if token else None
    exporter = OTLPSpanExporter(endpoint=collector.grpc_endpoint, insecure=True, headers=headers, timeout=30)
    assert exporter.export(agent_spans(1)) is SpanExportResult.SUCCESS


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[CollectorProcess]:
    """A collector with a token and small limits, so the attacks run in seconds."""
    config = tmp_path / "tracejudge.toml"
    config.write_text('[server]\nmax_connections = 40\nheader_timeout_s = 1.0\n'
                      '[scoring]\nmetrics = ["mcp_call_validity"]\n')
    env = {"TRACEJUDGE_INGEST_TOKEN": TOKEN, "TRACEJUDGE_QUERY_TOKEN": TOKEN}
    with CollectorProcess(tmp_path / "t.duckdb", config=config, env=env) as running:
        yield running


def test_unauthenticated_grpc_exports_are_refused_before_their_message_is_buffered(guarded) -> None:
    before = peak_rss_mb(guarded)
    payload = b"\x0a" + b"\xff" * (12 * MiB)  # 12 MiB, under the 16 MiB limit: it would be read in full
    codes: list[grpc.StatusCode] = []

    def send() -> None:
        with grpc.insecure_channel(guarded.grpc_endpoint) as channel:
            export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            try:
                export(payload, timeout=60)
            except grpc.RpcError as exc:
                codes.append(exc.code())

    at_once(send, 24)
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 24
    # 24 x 12 MiB held would be 288 MiB more; refused on the metadata, the server grows by far less
    assert peak_rss_mb(guarded) - before < 150, (before, peak_rss_mb(guarded))
    exporter_still_served(guarded, TOKEN)


def test_a_body_of_600k_gzip_members_is_refused_without_freezing_the_server(guarded) -> None:
    body = gzip.compress(b"") * 600_000
    answers: dict[str, int] = {}

    def bomb() -> None:
        answers["bomb"] = httpx.post(guarded.http_url, content=body, timeout=60, headers={
            "Content-Type": "application/x-protobuf", "Content-Encoding": "gzip",
            "Authorization": f"Bearer {TOKEN}"}).status_code

    thread = threading.Thread(target=bomb)
    thread.start()
    answers["health"] = httpx.get(f"{guarded.admin_url}/healthz", timeout=60).status_code
    thread.join()
    assert answers == {"bomb": 400, "health": 200}
    reply = httpx.post(guarded.http_url, content=body, timeout=60, headers={
        "Content-Type": "application/json", "Content-Encoding": "gzip", "Authorization": f"Bearer {TOKEN}"})
    assert "more than 10000 members" in reply.json()["message"]
    exporter_still_served(guarded, TOKEN)


def _slow_socket(port: int, data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(data)
    return sock


def _closed(sock: socket.socket) -> bool:
    """The server closed the connection (end of stream or reset) within 5 s; False while it still holds it."""
    sock.settimeout(5)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_slow_and_numerous_http_clients_are_cut_off(guarded) -> None:
    port = int(guarded.http_url.rsplit(":", 1)[1].split("/")[0])
    partial = [_slow_socket(port, b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n") for _ in range(60)]
    # 40 connections are allowed and the rest are closed at once; the held ones go after the 1 s header deadline
    assert all(_closed(sock) for sock in partial)
    kept = _slow_socket(port, b"POST /v1/traces HTTP/1.1\r\n")  # a fresh one is accepted again, then cut off
    assert _closed(kept)
    for sock in partial:
        sock.close()
    stalled = _slow_socket(port, b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                 b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: 100000\r\n\r\n{")
    stalled.settimeout(30)
    answer = stalled.recv(65536)
    stalled.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    exporter_still_served(guarded, TOKEN)
    text = httpx.get(f"{guarded.admin_url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    assert 'tracejudge_export_requests_total{protocol="http",status="too_slow"} 1.0' in text


def test_a_non_ascii_authorization_header_is_a_401(guarded) -> None:
    for url in (guarded.http_url, f"{guarded.admin_url}/api/query"):
        host, rest = url.removeprefix("http://").split("/", 1)
        sock = _slow_socket(int(host.split(":")[1]), b"POST /" + rest.encode() + b" HTTP/1.1\r\nHost: localhost\r\n"
                            b"Content-Type: application/json\r\nAuthorization: Bearer \xff\xfe\xe9t\xe9\r\n"
                            b"Content-Length: 2\r\n\r\n{}")
        answer = sock.recv(65536)
        sock.close()
        assert answer.startswith(b"HTTP/1.1 401"), answer[:300]
    assert not any("Traceback" in line for line in guarded.log_lines)


def test_oversized_spans_are_cut_to_the_limits_and_the_exporter_is_told(tmp_path: Path) -> None:
    attributes = [KeyValue(key=f"k{i}", value=AnyValue(string_value="v")) for i in range(100_000)]
    big = Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="wide", attributes=attributes,
               start_time_unix_nano=1, end_time_unix_nano=2)
    body = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[big])])])
    empties = b'{"resourceSpans": [' + b"{}," * (4 * MiB) + b"{}]}"
    # the value-length limit from OpenTelemetry's own variable (the default, 16 MiB, keeps long histories whole)
    with CollectorProcess(tmp_path / "t.duckdb", env={"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "1048576"}) \
            as collector:
        reply = httpx.post(collector.http_url, content=body.SerializeToString(),
                           headers={"Content-Type": "application/x-protobuf"}, timeout=60)
        assert reply.status_code == 200
        rows = httpx.post(f"{collector.admin_url}/api/query", json={
            "sql": "SELECT count(*) FROM (SELECT unnest(json_keys(attributes)) FROM spans WHERE name = 'wide')"})
        assert rows.json()["rows"] == [[4096]]
        reply = httpx.post(collector.http_url, content=json.dumps(request(({}, [span(
            3, 1, "long", attributes={"x": "y" * (2 * MiB)})]))), headers={"Content-Type": "application/json"})
        assert reply.status_code == 200 and "cut to the span limits" in reply.json()["partialSuccess"]["errorMessage"]
        reply = httpx.post(collector.http_url, content=empties, headers={"Content-Type": "application/json"},
                           timeout=60)
        assert reply.status_code == 400 and "JSON objects" in reply.json()["message"]
        exporter_still_served(collector)
        collector.stop()


def test_admin_api_stays_on_loopback_unless_a_query_token_guards_it(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="set a query token first"):
        CollectorProcess(tmp_path / "t.duckdb", env={"TRACEJUDGE_ADMIN_HOST": "0.0.0.0"}).start()


def test_queries_that_would_take_all_memory_fail_alone(guarded) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    before, holding = peak_rss_mb(guarded), peak_rss_mb(guarded, "VmRSS")
    for sql in ("SELECT string_agg(repeat('x', 1000000), '') FROM range(3000)",
                "SELECT list(i) FROM range(400000000) t(i)"):
        reply = httpx.post(f"{guarded.admin_url}/api/query", json={"sql": sql}, headers=auth, timeout=120)
        assert reply.status_code == 400, (sql, reply.text)
        assert "memory" in reply.json()["error"].lower() or "ran past" in reply.json()["error"], reply.text
    # what the stopped queries took is given back before the next one can stack on it
    assert peak_rss_mb(guarded, "VmRSS") - holding < 80, (holding, peak_rss_mb(guarded, "VmRSS"))
    big = httpx.post(f"{guarded.admin_url}/api/query", json={"sql": "SELECT repeat('x', 1000000) FROM range(100)"},
                     headers=auth, timeout=120).json()
    assert big["truncated"] is True and len(big["rows"]) < 100  # cut at the answer's byte bound, not its rows
    assert peak_rss_mb(guarded) - before < 900, (before, peak_rss_mb(guarded))
    exporter_still_served(guarded, TOKEN)


def test_concurrent_queries_cannot_add_up_past_a_gigabyte(guarded) -> None:
    """DuckDB builds a 500 MB vector for this query before the answer's byte cut can apply, outside memory_limit;
    four at once (the most that may be in flight) took the server to 1.2 GB. They now run one at a time."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    answers: list[int] = []

    def heavy() -> None:
        reply = httpx.post(f"{guarded.admin_url}/api/query", headers=auth, timeout=120,
                           json={"sql": "SELECT repeat('x', 5000000) FROM range(100)"})
        answers.append(reply.status_code)

    at_once(heavy, 4)
    assert answers == [200] * 4  # queued behind each other, not refused
    assert peak_rss_mb(guarded) < 1000, peak_rss_mb(guarded)
    exporter_still_served(guarded, TOKEN)


def test_every_answer_is_strict_json_even_for_values_json_cannot_hold(guarded) -> None:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the answer is not JSON")

    reply = httpx.post(f"{guarded.admin_url}/api/query", headers={"Authorization": f"Bearer {TOKEN}"}, json={
        "sql": "SELECT 'nan'::DOUBLE AS a, '-inf'::DOUBLE AS b, [1.5, 'inf'::DOUBLE] AS c, NULL AS d, "
               "170141183460469231731687303715884105727::HUGEINT AS e, 'é ✓' AS f"})
    assert reply.status_code == 200, reply.text
    answer = json.loads(reply.content, parse_constant=refuse)
    assert answer["rows"] == [["nan", "-inf", [1.5, "inf"], None, 170141183460469231731687303715884105727, "é ✓"]]


@pytest.mark.parametrize("sql, refused", [
    ("SELECT * FROM read_blob('t.duckdb')", "read_blob"),
    ("SELECT * FROM glob('*')", "glob"),
    ("SELECT * FROM duckdb_databases()", "duckdb_databases"),
    ("SELECT current_setting('temp_directory')", "current_setting"),
    ("SELECT enable_profiling()", "enable_profiling"),
    ("SELECT * FROM 't.duckdb'", "the file"),
    ("SELECT * FROM '/etc/hostname'", "the file"),
])
def test_queries_cannot_read_files_or_learn_server_paths(guarded, sql: str, refused: str) -> None:
    reply = httpx.post(f"{guarded.admin_url}/api/query", json={"sql": sql},
                       headers={"Authorization": f"Bearer {TOKEN}"})
    assert reply.status_code == 403 and refused in reply.json()["error"], reply.text


def test_malformed_values_are_span_problems_and_surrogates_become_replacement_characters(tmp_path: Path) -> None:
    good = span(5, 1, "kept", attributes={"a\ud800": "x\udfff", "a\ud801": 1})  # noqa: F601 (distinct keys)
    bad = [
        {**span(5, 2, "string as number"), "attributes": [{"key": "k", "value": {"stringValue": 7}}]},
        {**span(5, 3, "deep"), "attributes": [{"key": "k", "value": {"stringValue": [[[]] * 3] * 900}}]},
        {**span(5, 4, "far future"), "startTimeUnixNano": str(2**63)},
        {**span(5, 5, "boolean time"), "startTimeUnixNano": True},
        # bytes are base64 text: a number here would be stored as one, past 64 bits too
        {**span(5, 6, "number as bytes"), "attributes": [{"key": "k", "value": {"bytesValue": 2**70}}]},
    ]
    body = json.dumps(request(({}, [good, *bad])))  # lone surrogates travel as \ud800 escapes
    with CollectorProcess(tmp_path / "t.duckdb") as collector:
        reply = httpx.post(collector.http_url, content=body, headers={"Content-Type": "application/json"})
        partial = reply.json()["partialSuccess"]
        assert partial["rejectedSpans"] == "5"
        for reason in ("stringValue must be a string", "after the year 2262", "startTimeUnixNano must be an integer",
                       "bytesValue must be base64 text"):
            assert reason in partial["errorMessage"], partial["errorMessage"]
        rows = httpx.post(f"{collector.admin_url}/api/query", json={"sql": "SELECT attributes FROM spans"}).json()
        assert json.loads(rows["rows"][0][0]) == {"a\ufffd": "x\ufffd", "a\ufffd (2)": 1}
        report = httpx.get(f"{collector.admin_url}/report", params={"since": "0001-01-01"}, timeout=120)
        assert report.status_code == 200 and len(report.content) < 2 * MiB
        collector.stop()


def test_a_conversation_past_max_spans_is_logged_not_assembled(tmp_path: Path) -> None:
    config = tmp_path / "tracejudge.toml"
    config.write_text("[conversations]\nquiet_period_s = 0.5\npoll_s = 0.1\nmax_spans = 50\n")
    spans = [span(9, i, "step", i - 1 if i > 1 else None, attributes={"gen_ai.conversation.id": "huge"})
             for i in range(1, 121)]
    with CollectorProcess(tmp_path / "t.duckdb", config=config) as collector:
        httpx.post(collector.http_url, json=request(({}, spans)))
        deadline = time.monotonic() + 30
        while not any("conversation too large" in line for line in collector.log_lines) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        [line] = [json.loads(line) for line in collector.log_lines if "conversation too large" in line]
        assert (line["conversation_id"], line["spans"], line["max_spans"]) == ("huge", 120, 50)
        rows = httpx.post(f"{collector.admin_url}/api/query", json={"sql": "SELECT count(*) FROM conversations"})
        assert rows.json()["rows"] == [[0]]
        collector.stop()
