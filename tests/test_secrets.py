"""Tokens and API keys never appear in the collector's logs, errors, job rows or /metrics."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from tests.support.collector_process import CollectorProcess
from tests.support.scripted_server import error, system_one_answers
from tests.test_pipeline import config, conversations, wait_for

INGEST, QUERY = "ingest-tok-7f3a9c1e55d04b2b", "query-tok-0c8e4d2a91f7"
OPENAI_KEY, TYPESAFE_KEY = "sk-live-SECRETKEY0123456789abcdef", "ts-live-SECRETKEY9876543210"
GUESS = "guessed-token-55aa66bb"


def test_secrets_stay_out_of_logs_errors_and_metrics(tmp_path: Path, judge_server, s1_server) -> None:
    # a judge that echoes the refused key, as some providers do
    judge_server.script = lambda r: error(401, f"Incorrect API key provided: {OPENAI_KEY}. Bearer {OPENAI_KEY}")
    s1_server.script = lambda r: system_one_answers({})
    env = {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": OPENAI_KEY,
           "TYPESAFE_BASE_URL": s1_server.root_url, "TYPESAFE_API_KEY": TYPESAFE_KEY,
           "TRACEJUDGE_INGEST_TOKEN": INGEST, "TRACEJUDGE_QUERY_TOKEN": QUERY, "TRACEJUDGE_LOG_LEVEL": "debug"}
    cfg = config(tmp_path, "max_attempts = 1\n")
    with CollectorProcess(tmp_path / "t.duckdb", config=cfg, env=env) as collector:
        spans = conversations(end=True)
        refused = HttpSpanExporter(endpoint=collector.http_url, headers={"Authorization": f"Bearer {GUESS}"})
        assert refused.export(spans) is SpanExportResult.FAILURE
        good = HttpSpanExporter(endpoint=collector.http_url, headers={"Authorization": f"Bearer {INGEST}"})
        assert good.export(spans) is SpanExportResult.SUCCESS
        wrong_query = httpx.post(f"{collector.admin_url}/api/query", json={"sql": "SELECT 1"},
                                 headers={"Authorization": f"Bearer {GUESS}"}, timeout=10)
        assert wrong_query.status_code == 401 and GUESS not in wrong_query.text
        tried = wait_for(collector, "SELECT status, last_error FROM eval_jobs WHERE last_error IS NOT NULL", 4,
                         token=QUERY)
        assert tried and all(status != "done" for status, _ in tried)
        errors = " ".join(e or "" for _, e in tried)
        assert "refused the credentials (HTTP 401)" in errors and "…" + OPENAI_KEY[-4:] in errors
        metrics = httpx.get(f"{collector.admin_url}/metrics", timeout=10).text
        collector.stop()
    seen = {"log": "".join(collector.log_lines), "metrics": metrics, "jobs": json.dumps(tried),
            "query answer": wrong_query.text}
    for where, text in seen.items():
        for secret in (INGEST, QUERY, OPENAI_KEY, TYPESAFE_KEY, GUESS):
            assert secret not in text, f"{secret[:8]}… appears in the {where}"


def test_credentials_in_a_judge_url_are_masked_in_errors(judge_server) -> None:
    import pytest

    from tests.support.cases import two_turn_case
    from tracejudge import LLMJudge, MCPTaskCompletionMetric
    from tracejudge.errors import JudgeRequestError

    judge_server.script = lambda r: error(404, "no such model")
    url = judge_server.base_url.replace("http://", "http://alice:s3cr3t-pass@")  # a proxy with basic auth
    judge = LLMJudge("gpt-4o-mini", base_url=url, api_key="sk-test-not-a-secret")
    metric = MCPTaskCompletionMetric(model=judge)
    with pytest.raises(JudgeRequestError) as caught:
        metric.measure(two_turn_case())
    shown = str(caught.value) + repr(judge)
    assert "s3cr3t-pass" not in shown and "http://***@127.0.0.1" in shown, shown
