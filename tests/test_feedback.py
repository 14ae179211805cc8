"""End-user feedback in (issue 38, part 2): an application sends feedback the OTel way (a `gen_ai.evaluation.result`
log record through the real OTel SDK log exporters, naming the conversation or the span it is about) and the plain
way (`POST /api/feedback`), before or after its conversation is assembled; the `feedback` view holds each once,
with its conversation, and feedback never changes or creates a conversation."""

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
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

from tests.support.collector_process import CollectorProcess
from tests.test_pipeline import config, conversations, export, query, wait_for

TOKEN = "feedback-test-token"


def _send_log(exporter: object, attributes: dict, span: tuple[int, int] | None = None) -> None:
    provider = LoggerProvider(resource=Resource.create({"service.name": "shop-frontend"}))
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    context = None
    if span is not None:
        context = set_span_in_context(NonRecordingSpan(SpanContext(span[0], span[1], is_remote=True,
                                                                   trace_flags=TraceFlags(1))))
    provider.get_logger("app.feedback").emit(event_name="gen_ai.evaluation.result", attributes=attributes,
                                             context=context)
    provider.shutdown()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_feedback_before_and_after_its_conversation_is_kept_once_with_it(tmp_path, protocol) -> None:
    env = {"TRACEJUDGE_QUERY_TOKEN": TOKEN}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path), env=env) as collector:
        def exporter() -> object:
            return GrpcLogExporter(endpoint=collector.grpc_endpoint, insecure=True) if protocol == "grpc" \
                else HttpLogExporter(endpoint=collector.http_url.replace("/v1/traces", "/v1/logs"))

        # before the conversation exists: a thumbs-down naming the conversation only
        early = {"gen_ai.conversation.id": "conv-b", "gen_ai.evaluation.name": "user_feedback",
                 "gen_ai.evaluation.score.value": 0.0, "gen_ai.evaluation.score.label": "thumbs_down",
                 "gen_ai.evaluation.explanation": "it booked nothing"}
        _send_log(exporter(), early)
        time.sleep(1.5)  # past the quiet period: feedback alone makes no conversation
        assert query(collector, "SELECT count(*) FROM conversations", TOKEN) == [[0]]

        spans = conversations(end=True)
        export(collector, spans)
        wait_for(collector, "SELECT 1 FROM conversations", 2, token=TOKEN)
        # after: one about a span of conv-a (no conversation id: its trace tells), one over HTTP for conv-a
        agent_span = next(s for s in spans if s.attributes.get("gen_ai.conversation.id") == "conv-a")
        _send_log(exporter(), {"gen_ai.evaluation.name": "user_feedback", "gen_ai.evaluation.score.value": 1.0},
                  span=(agent_span.context.trace_id, agent_span.context.span_id))
        reply = httpx.post(f"{collector.admin_url}/api/feedback", headers=auth, timeout=30, json={
            "conversation_id": "conv-a", "name": "user_feedback", "value": 1, "label": "thumbs_up",
            "comment": "quick and right"})
        assert reply.status_code == 201, reply.text

        rows = wait_for(collector, "SELECT conversation_id, name, value, label, comment, source FROM feedback "
                        "ORDER BY conversation_id, source, value", 3, token=TOKEN)
        assert rows == [
            ["conv-a", "user_feedback", 1.0, "thumbs_up", "quick and right", "api"],
            ["conv-a", "user_feedback", 1.0, None, None, "log_record"],
            ["conv-b", "user_feedback", 0.0, "thumbs_down", "it booked nothing", "log_record"]]
        time.sleep(1.5)  # feedback never makes a new version of its conversation
        assert query(collector, "SELECT conversation_id, max(version) FROM conversations GROUP BY 1 ORDER BY 1",
                     TOKEN) == [["conv-a", 1], ["conv-b", 1]]


def test_the_feedback_api_says_what_is_wrong(tmp_path) -> None:
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path),
                          env={"TRACEJUDGE_QUERY_TOKEN": TOKEN}) as collector:
        url = f"{collector.admin_url}/api/feedback"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert httpx.post(url, json={"conversation_id": "c", "value": 1}, timeout=10).status_code == 401
        bad = httpx.post(url, headers=auth, json={"value": 1}, timeout=10)
        assert bad.status_code == 400 and "conversation_id" in bad.json()["error"]
        extra = httpx.post(url, headers=auth, json={"conversation_id": "c", "score": 1}, timeout=10)
        assert extra.status_code == 400 and "score" in extra.json()["error"]
        form = httpx.post(url, headers=auth, data={"conversation_id": "c"}, timeout=10)
        assert form.status_code in (400, 415)  # JSON only: no HTML form can send feedback in a user's name
        assert json.loads(httpx.post(url, headers=auth, json={"conversation_id": "c", "value": 0.5},
                                     timeout=10).text)["stored"] is True
