"""Every score as an OpenTelemetry GenAI `gen_ai.evaluation.result` event, sent as an OTLP log record with the
trace and span id of the agent run it evaluates (the conversation's last agent invocation), so backends show it
on the trace.

Durable: a score is marked in `score_exports` only after the backend acknowledged its batch, so a score whose
export failed (backend down, collector restarted) is sent later, and one acknowledged is not sent again. A crash
between the acknowledgement and that commit can send one batch twice: each record carries
`tracejudge.score.id` for a backend that deduplicates. The exporter is the OpenTelemetry SDK's own
(`OTLPLogExporter`, gRPC or HTTP/protobuf), so the standard `OTEL_EXPORTER_OTLP_LOGS_*` variables apply.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

import duckdb
from opentelemetry._logs import LogRecord
from opentelemetry.sdk._logs import ReadWriteLogRecord
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from tracejudge.judged_metric import task_scores

EVENT = "gen_ai.evaluation.result"
SCOPE = InstrumentationScope("tracejudge", "0.1.0")
PENDING = """
    SELECT s.conversation_id, s.conversation_version, s.metric, s.metric_config, s.score, s.success, s.reason,
           s.error, s.eval_mode, s.judge_model, s.evaluation_cost, s.scored_at, s.service_name, s.agent_name,
           c.test_case->'turns' AS turns, s.threshold, s.breakdown->'tasks' AS tasks
    FROM scores s
    JOIN conversations c ON c.conversation_id = s.conversation_id AND c.version = s.conversation_version
    ANTI JOIN score_exports e ON e.conversation_id = s.conversation_id
        AND e.conversation_version = s.conversation_version AND e.metric = s.metric
        AND e.metric_config = s.metric_config
    ORDER BY s.scored_at LIMIT ?
"""


def _ids(turns: Any) -> tuple[int | None, int | None]:
    """The trace and span id of the last assistant turn's agent run, as the SDK wants them (ints)."""
    for turn in reversed(json.loads(turns) if isinstance(turns, str) else turns or []):
        metadata = turn.get("metadata") or {}
        if turn.get("role") == "assistant" and metadata.get("trace_id") and metadata.get("span_id"):
            try:
                return int(metadata["trace_id"], 16), int(metadata["span_id"], 16)
            except ValueError:
                return None, None
    return None, None


def evaluation_record(row: dict[str, Any], resource: Resource) -> ReadWriteLogRecord:
    """One score as a `gen_ai.evaluation.result` log record."""
    trace_id, span_id = _ids(row["turns"])
    attributes: dict[str, Any] = {
        "gen_ai.evaluation.name": row["metric"],
        "gen_ai.conversation.id": row["conversation_id"],
        "tracejudge.conversation.version": row["conversation_version"],
        "tracejudge.metric_config": row["metric_config"],
        "tracejudge.score.id": hashlib.sha256(json.dumps(
            [row["conversation_id"], row["conversation_version"], row["metric"], row["metric_config"]]
        ).encode()).hexdigest()[:32],
    }
    if row["score"] is not None:
        attributes["gen_ai.evaluation.score.value"] = float(row["score"])
    if row["success"] is not None:
        attributes["gen_ai.evaluation.score.label"] = "pass" if row["success"] else "fail"
    if row["reason"]:
        attributes["gen_ai.evaluation.explanation"] = row["reason"][:8192]
    if row["error"]:
        attributes["error.type"] = row["error"].split(":", 1)[0]
    for key, column in (("tracejudge.eval_mode", "eval_mode"), ("tracejudge.judge_model", "judge_model"),
                        ("tracejudge.cost_usd", "evaluation_cost"), ("service.name", "service_name"),
                        ("gen_ai.agent.name", "agent_name")):
        if row[column] is not None:
            attributes[key] = row[column]
    tasks = task_scores({"tasks": json.loads(row["tasks"]) if isinstance(row["tasks"], str) else row["tasks"]})
    if tasks:  # per task, in task order: what the conversation's score averages (or takes the worst of)
        attributes["tracejudge.task.scores"] = tasks
        if row["threshold"] is not None:
            attributes["tracejudge.task.passed"] = [score >= row["threshold"] for score in tasks]
            attributes["tracejudge.tasks.failed"] = sum(score < row["threshold"] for score in tasks)
    timestamp = int(row["scored_at"].timestamp() * 1e9)
    record = LogRecord(timestamp=timestamp, observed_timestamp=time.time_ns(), trace_id=trace_id, span_id=span_id,
                       trace_flags=None, event_name=EVENT, attributes=attributes,
                       body=row["reason"][:8192] if row["reason"] else None)
    return ReadWriteLogRecord(record, resource=resource, instrumentation_scope=SCOPE)


class ScoreEventExporter:
    """Sends scores not yet exported, a batch at a time, and marks them once acknowledged."""

    def __init__(self, con: duckdb.DuckDBPyConnection, exporter: Any, log: Callable[..., None], *,
                 batch: int = 512, resource: Resource | None = None) -> None:
        self.con, self.exporter, self.log, self.batch = con, exporter, log, batch
        self.resource = resource or Resource.create({"service.name": "tracejudge"})
        self.sent = 0
        self.failures = 0

    def export_pending(self) -> int:
        """One batch; how many scores the backend acknowledged (0 when there was nothing or it failed)."""
        cursor = self.con.execute(PENDING, [self.batch])
        names = [d[0] for d in cursor.description or []]
        rows = [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]
        if not rows:
            return 0
        result = self.exporter.export([evaluation_record(row, self.resource) for row in rows])
        if getattr(result, "name", str(result)) != "SUCCESS":
            self.failures += 1
            return 0
        keys = [[r["conversation_id"], r["conversation_version"], r["metric"], r["metric_config"]] for r in rows]
        self.con.executemany("INSERT OR IGNORE INTO score_exports VALUES (?, ?, ?, ?, now())", keys)
        self.sent += len(rows)
        return len(rows)

    async def run(self, stop: asyncio.Event, interval_s: float) -> None:
        backoff = interval_s
        while not stop.is_set():
            try:
                exported = await asyncio.to_thread(self.export_pending)
                backoff = interval_s if exported or not self.failures else min(backoff * 2, 300.0)
                if exported == self.batch:
                    continue  # more are waiting
            except Exception as exc:  # the backend or the database: logged, retried, never fatal
                self.log("warning", "score export failed; retrying", reason=f"{type(exc).__name__}: {exc}")
                backoff = min(backoff * 2, 300.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.exporter.shutdown()


def otlp_log_exporter(endpoint: str | None, protocol: str, headers: dict[str, str], insecure: bool | None,
                      timeout_s: float) -> Any:
    """The OpenTelemetry SDK's OTLP log exporter for `protocol` (grpc or http/protobuf); unset arguments fall
    back to the standard OTEL_EXPORTER_OTLP_LOGS_* variables."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint, insecure=insecure, headers=headers or None, timeout=timeout_s)
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpExporter

    return HttpExporter(endpoint=endpoint, headers=headers or None, timeout=timeout_s)
