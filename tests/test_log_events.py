"""GenAI events sent as OTLP log records (event-mode instrumentations) give the turns of the span they name:
the real OTel SDK log exporters (gRPC and HTTP) against `tracejudge serve`, with the spans sent apart."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import httpx
import pytest
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import set_span_in_context

from tests.support.collector_process import CollectorProcess
from tests.test_cli import run
from tests.test_pipeline import config, export, query, wait_for
from tracejudge.collector.input_files import read_test_cases
from tracejudge.mapping import build_conversations, decode_otlp_logs

QUESTION, ANSWER = "What's the weather in Oslo?", "Snow in Oslo, -3°C."


def record_turn(log_exporter: object) -> list:
    """One agent run whose LLM span carries no content: the messages go out as log events on that span."""
    spans = InMemorySpanExporter()
    resource = Resource.create({"service.name": "event-agent"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(log_exporter))
    logger = logger_provider.get_logger("opentelemetry.instrumentation.genai")
    tracer = tracer_provider.get_tracer("agent")
    with tracer.start_as_current_span("invoke_agent oslo", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "conv-events"}), \
            tracer.start_as_current_span("chat m", attributes={"gen_ai.operation.name": "chat"}) as chat:
        context = set_span_in_context(chat)
        logger.emit(event_name="gen_ai.user.message", body={"content": QUESTION}, context=context,
                    attributes={"gen_ai.provider.name": "openai"})
        logger.emit(event_name="gen_ai.choice", body={"index": 0, "finish_reason": "stop",
                                                      "message": {"role": "assistant", "content": ANSWER}},
                    context=context)
        logger.emit(body="an ordinary application log line", context=context)  # not a GenAI event: dropped
    logger_provider.shutdown()
    tracer_provider.shutdown()
    return list(spans.get_finished_spans())


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_log_events_become_the_turns_of_their_span(tmp_path, protocol) -> None:
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path)) as collector:
        exporter = GrpcLogExporter(endpoint=collector.grpc_endpoint, insecure=True) if protocol == "grpc" \
            else HttpLogExporter(endpoint=collector.http_url.replace("/v1/traces", "/v1/logs"))
        spans = record_turn(exporter)
        time.sleep(0.5)  # the spans arrive after their events, as batching exporters often send them
        export(collector, spans)
        [[test_case]] = wait_for(collector, "SELECT test_case FROM conversations "
                                            "WHERE conversation_id = 'conv-events'", 1)
        turns = json.loads(test_case)["turns"]
        assert [(t["role"], t["content"]) for t in turns] == [("user", QUESTION), ("assistant", ANSWER)]
        # two carrier rows (the two GenAI events) beside the two spans; the plain log line was not kept
        assert query(collector, "SELECT scope_name, count(*) FROM spans GROUP BY 1 ORDER BY 1") == [
            ["agent", 2], ["tracejudge.log_event", 2]]


def test_redelivered_log_records_are_stored_once_and_bad_ones_are_named() -> None:
    body = {"resourceLogs": [{"resource": {"attributes": []}, "scopeLogs": [{"logRecords": [
        {"eventName": "gen_ai.user.message", "traceId": "0" * 31 + "1", "spanId": "0" * 15 + "2",
         "timeUnixNano": "5",
         "body": {"kvlistValue": {"values": [{"key": "content", "value": {"stringValue": "hi"}}]}}},
        {"eventName": "gen_ai.user.message", "traceId": "xyz", "spanId": "0" * 15 + "2"},
        {"eventName": "gen_ai.user.message", "body": {"stringValue": "no span"}},
    ]}]}]}
    first = decode_otlp_logs(json.dumps(body), "application/json")
    again = decode_otlp_logs(json.dumps(body), "application/json")
    assert [s.span_id for s in first.spans] == [s.span_id for s in again.spans] and len(first.spans) == 1
    assert [p.where for p in first.problems] == ["resourceLogs[0].scopeLogs[0].logRecords[1]"]
    assert "trace_id" in first.problems[0].reason
    [carrier] = first.spans
    assert carrier.parent_span_id == "0" * 15 + "2" and carrier.events[0].attributes == {"content": "hi"}
    # a carrier whose span never arrived adds nothing to any conversation
    assert build_conversations(first.spans) == []


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_metrics_exports_are_accepted_and_dropped_without_an_error(tmp_path, protocol) -> None:
    """An SDK set up to export every signal (logfire's default) sends metrics too: the real OTel metric exporter
    gets success (no 404 or UNIMPLEMENTED in the agent's log), and nothing is stored."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricExportResult, PeriodicExportingMetricReader

    with CollectorProcess(tmp_path / "t.duckdb") as collector:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
            exporter = OTLPMetricExporter(endpoint=collector.grpc_endpoint, insecure=True)
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            exporter = OTLPMetricExporter(endpoint=collector.http_url.replace("/v1/traces", "/v1/metrics"))
        results: list[MetricExportResult] = []
        export_once = exporter.export

        def recording(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - the exporter's own signature
            results.append(export_once(*args, **kwargs))
            return results[-1]

        exporter.export = recording
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60_000)
        provider = MeterProvider(metric_readers=[reader])
        provider.get_meter("agent").create_counter("gen_ai.client.operations").add(3, {"model": "m"})
        provider.force_flush()
        provider.shutdown()
        assert results and all(r is MetricExportResult.SUCCESS for r in results)
        dropped = [line for line in httpx.get(f"{collector.admin_url}/metrics", timeout=5).text.splitlines()
                   if line.startswith("tracejudge_export_requests_total{") and 'status="metrics_dropped"' in line
                   and f'protocol="{protocol}"' in line]
        assert dropped and float(dropped[0].rsplit(" ", 1)[1]) >= 1
        assert query(collector, "SELECT count(*) FROM spans") == [[0]]


def _otlp_json(request: Message) -> str:
    """A request as OTLP/JSON: protobuf's JSON mapping with hex ids (what other collectors' file exporters write)."""
    def hex_ids(value: object) -> object:
        if isinstance(value, dict):
            return {k: base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") else hex_ids(v)
                    for k, v in value.items()}
        return [hex_ids(v) for v in value] if isinstance(value, list) else value
    return json.dumps(hex_ids(MessageToDict(request, use_integers_for_enums=True)))


def recorded_files(tmp_path: Path) -> dict[str, Path]:
    """The turn of `record_turn` as a user saves it: the spans in a trace file, the log records in a log file, each
    as OTLP/JSON and as protobuf."""
    logs = InMemoryLogRecordExporter()
    spans = record_turn(logs)
    traces_request, logs_request = encode_spans(spans), encode_logs(logs.get_finished_logs())
    files = {"trace.json": _otlp_json(traces_request), "logs.json": _otlp_json(logs_request),
             "trace.pb": traces_request.SerializeToString(), "logs.pb": logs_request.SerializeToString()}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    return {name: tmp_path / name for name in files}


def test_inspect_and_evaluate_take_a_trace_file_with_its_log_file(tmp_path) -> None:
    files = recorded_files(tmp_path)
    alone = run(["inspect", str(files["trace.json"])])
    assert alone.returncode == 0 and QUESTION not in alone.stdout  # the messages are only in the log records
    for trace, logs in (("trace.json", "logs.json"), ("trace.pb", "logs.pb"), ("logs.pb", "trace.json")):
        proc = run(["inspect", str(files[trace]), str(files[logs])])
        assert proc.returncode == 0, proc.stderr
        assert f"  [0] user: {QUESTION}" in proc.stdout.splitlines(), (trace, logs, proc.stdout)
        assert f"  [1] assistant: {ANSWER}" in proc.stdout.splitlines()
    cases = read_test_cases([files["trace.pb"], files["logs.json"]])
    assert [(t.role, t.content) for t in cases[0].turns] == [("user", QUESTION), ("assistant", ANSWER)]
    proc = run(["evaluate", str(files["trace.json"]), str(files["logs.pb"]), "--metric", "mcp_call_validity",
                "--format", "json"])
    [result] = json.loads(proc.stdout)["test_results"]
    assert result["name"] == "conv-events", proc.stderr
    other = tmp_path / "other.json"
    other.write_text('{"service": "weather"}')
    assert f"{other}: not an OTLP export request" in run(["inspect", str(files["trace.json"]), str(other)]).stderr


@pytest.mark.parametrize(("protocol", "trace", "logs"), [("http", "trace.json", "logs.json"),
                                                         ("grpc", "trace.json", "logs.pb")])
def test_replay_sends_log_files_to_the_logs_endpoint(tmp_path, protocol, trace, logs) -> None:
    files = recorded_files(tmp_path)
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path)) as collector:
        endpoint = collector.http_url if protocol == "http" else collector.grpc_endpoint
        proc = run(["replay", str(files[logs]), str(files[trace]), "--protocol", protocol, "--endpoint", endpoint])
        assert proc.returncode == 0, proc.stderr
        assert "sent 2 request(s)" in proc.stdout
        [[test_case]] = wait_for(collector, "SELECT test_case FROM conversations "
                                            "WHERE conversation_id = 'conv-events'", 1)
        turns = json.loads(test_case)["turns"]
        assert [(t["role"], t["content"]) for t in turns] == [("user", QUESTION), ("assistant", ANSWER)]


def test_a_message_body_that_is_json_text_stays_the_message_unless_it_is_a_whole_message() -> None:
    """Semantic Kernel logs each message as its JSON text (`{"role": ..., "content": ...}`); a user who typed JSON
    keeps what they typed."""
    from tracejudge.mapping import Span
    from tracejudge.mapping.otlp_logs import _carrier

    def turns(user_body: str) -> list[tuple[str, str]]:
        chat = Span("a" * 32, "b" * 16, None, "chat m", 3, 1, 9, attributes={
            "gen_ai.operation.name": "chat", "gen_ai.conversation.id": "conv-json"})
        carriers = [_carrier("a" * 32, "b" * 16, "gen_ai.user.message", 2, {}, user_body, {}),
                    _carrier("a" * 32, "b" * 16, "gen_ai.choice", 3, {},
                             '{"message": {"role": "assistant", "content": "Done."}, "finish_reason": "stop"}', {})]
        [conversation] = build_conversations([chat, *carriers])
        return [(t.role, t.content) for t in conversation.test_case.turns]

    assert turns('{"order_id": 42}') == [("user", '{"order_id": 42}'), ("assistant", "Done.")]
    assert turns('{"role": "user", "content": "Hi"}') == [("user", "Hi"), ("assistant", "Done.")]


def test_replay_takes_a_base_url_with_a_path_as_otel_exporters_do() -> None:
    from tracejudge.collector.replay import http_signal_url

    assert http_signal_url("http://gw/otlp", "logs") == "http://gw/otlp/v1/logs"
    assert http_signal_url("http://gw/otlp/v1/traces", "logs") == "http://gw/otlp/v1/logs"
    assert http_signal_url("127.0.0.1:4318") == "http://127.0.0.1:4318/v1/traces"
