"""GenAI events sent as OTLP log records (event-mode instrumentations) give the turns of the span they name:
the real OTel SDK log exporters (gRPC and HTTP) against `tracejudge serve`, with the spans sent apart."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import set_span_in_context

from tests.support.collector_process import CollectorProcess
from tests.test_pipeline import config, export, query, wait_for
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
