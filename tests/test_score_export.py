"""Scores reach the user's OTLP backend as `gen_ai.evaluation.result` log records, sent by the OpenTelemetry
SDK's own log exporter to a loopback LogsService (opentelemetry-proto's), with the trace and span id of the
agent run they evaluate; a backend that is down for a while, then back, loses and duplicates nothing across a
collector restart."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc

from tests.support.collector_process import CollectorProcess
from tests.test_pipeline import conversations, export, query, wait_for


class Backend(logs_service_pb2_grpc.LogsServiceServicer):
    """An OTLP logs backend on a loopback port that keeps every record it is sent."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.records: list = []
        self.server: grpc.Server | None = None

    def Export(self, request, context):  # noqa: N802 (the protocol's name)
        for resource_logs in request.resource_logs:
            for scope_logs in resource_logs.scope_logs:
                self.records.extend(scope_logs.log_records)
        return logs_service_pb2.ExportLogsServiceResponse()

    def start(self) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(2))
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(0)


@pytest.fixture
def backend() -> Iterator[Backend]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    running = Backend(port)
    yield running
    running.stop()


def test_scores_are_exported_once_even_when_the_backend_was_down(tmp_path: Path, backend: Backend) -> None:
    cfg = tmp_path / "tracejudge.toml"
    cfg.write_text("[conversations]\nquiet_period_s = 1\npoll_s = 0.1\n"
                   f'[export]\nendpoint = "http://127.0.0.1:{backend.port}"\ninsecure = true\n'
                   'timeout_s = "1s"\ninterval_s = "0.3s"\n')
    db = tmp_path / "t.duckdb"
    spans = conversations(end=True)
    with CollectorProcess(db, config=cfg) as collector:  # the backend is down: nothing is marked as sent
        export(collector, spans)
        wait_for(collector, "SELECT 1 FROM scores", 2)
        time.sleep(2)
        assert query(collector, "SELECT count(*) FROM score_exports") == [[0]]
        collector.stop()
    backend.start()
    with CollectorProcess(db, config=cfg) as collector:  # back: what waited is sent, once
        wait_for(collector, "SELECT 1 FROM score_exports", 2)
        time.sleep(1.5)  # more intervals pass: nothing is sent twice
        collector.stop()
    with CollectorProcess(db, config=cfg) as collector:  # and nothing again after another restart
        time.sleep(1.5)
        collector.stop()
    records = backend.records
    assert len(records) == 2
    roots = {format(s.context.span_id, "016x"): format(s.context.trace_id, "032x") for s in spans
             if s.name.startswith("invoke_agent") and s.attributes["gen_ai.conversation.id"] in ("conv-a", "conv-b")}
    by_conversation = {}
    for record in records:
        attributes = {kv.key: kv.value for kv in record.attributes}
        assert record.event_name == "gen_ai.evaluation.result"
        assert attributes["gen_ai.evaluation.name"].string_value == "mcp_call_validity"
        by_conversation[attributes["gen_ai.conversation.id"].string_value] = (
            attributes["gen_ai.evaluation.score.value"].double_value,
            attributes["gen_ai.evaluation.score.label"].string_value, record.trace_id.hex(), record.span_id.hex())
    assert {k: v[:2] for k, v in by_conversation.items()} == {"conv-a": (1.0, "pass"), "conv-b": (0.0, "fail")}
    for _, _, trace_id, span_id in by_conversation.values():  # on the agent run the score evaluates
        assert roots[span_id] == trace_id
    # conv-a's score is on its last agent run (the Rome turn), not the first
    last_a = max((s for s in spans if s.attributes.get("gen_ai.conversation.id") == "conv-a"
                  and s.name.startswith("invoke_agent")), key=lambda s: s.start_time)
    assert by_conversation["conv-a"][3] == format(last_a.context.span_id, "016x")


def test_a_judged_score_carries_each_tasks_score_and_verdict() -> None:
    """The event of a judged score says which task failed, not only the mean that may hide it."""
    from datetime import UTC, datetime

    from opentelemetry.sdk.resources import Resource

    from tracejudge.collector.exporters.score_events import evaluation_record

    row = {"conversation_id": "conv-c", "conversation_version": 1, "metric": "mcp_task_completion",
           "metric_config": "cfg", "score": 0.6, "success": True, "reason": "two of three done", "error": None,
           "eval_mode": "llm", "judge_model": "gpt-4o-mini", "evaluation_cost": 0.001,
           "scored_at": datetime(2026, 12, 5, tzinfo=UTC), "service_name": "weather-agent", "agent_name": None,
           "turns": "[]", "threshold": 0.5,
           "tasks": json.dumps([{"task_index": 0, "score": 0.8}, {"task_index": 1, "score": 0.6},
                                {"task_index": 2, "score": 0.4}])}
    attributes = evaluation_record(row, Resource.create({})).log_record.attributes
    assert list(attributes["tracejudge.task.scores"]) == [0.8, 0.6, 0.4]
    assert list(attributes["tracejudge.task.passed"]) == [True, True, False]
    assert attributes["tracejudge.tasks.failed"] == 1 and attributes["gen_ai.evaluation.score.label"] == "pass"
