"""Spans in, scores out: the real OTel SDK exporter against `tracejudge serve`, scripted judges on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from tests.support.collector_process import CollectorProcess
from tests.support.scripted_server import Reply, Request, completion, error, system_one_answers
from tracejudge.collector.config import SamplingSettings
from tracejudge.collector.pipeline.assembly.conversation_assembler import CPU_STAGES
from tracejudge.collector.pipeline.sampling import decide, sample_value

PARIS, ROME, UMBRELLA = "What's the weather in Paris?", "And in Rome?", "Book an umbrella for me."
JUDGED = {PARIS: 0.8, ROME: 0.6, UMBRELLA: 0.4}


def judge_script(request: Request) -> Reply:
    if request.judge == "final_reason":
        return completion({"reason": "final"})
    return completion({"reason": request.judge, "score": JUDGED[request.data["task"]]})


def turn(tracer: Any, conversation: str, question: str, tool: str, args: dict, result: str, reply: str,
         failed: bool = False, end: bool = False) -> None:
    """One agent run as an OTel GenAI + MCP instrumented agent records it."""
    attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "weather-agent",
                  "gen_ai.conversation.id": conversation,
                  "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text",
                                                                                   "content": question}]}]),
                  "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text",
                                                                                         "content": reply}]}])}
    if end:
        attributes["tracejudge.conversation.end"] = True
    tool_attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                       "mcp.method.name": "tools/call", "gen_ai.tool.call.arguments": json.dumps(args),
                       "gen_ai.tool.call.result": json.dumps({"content": [{"type": "text", "text": result}],
                                                              "isError": failed})}
    with (tracer.start_as_current_span("invoke_agent weather-agent", attributes=attributes),
          tracer.start_as_current_span(f"execute_tool {tool}", attributes=tool_attributes) as span):
        if failed:
            span.set_status(Status(StatusCode.ERROR, result))


def recorded(service: str, agent: Callable[[Any], None], resource: dict[str, str] | None = None
             ) -> list[ReadableSpan]:
    """The spans the real OTel SDK records while `agent(tracer)` runs, as a service of that name (with more
    resource attributes, such as service.version, when given)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service, **(resource or {})}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    agent(provider.get_tracer("agent"))
    provider.shutdown()
    return list(memory.get_finished_spans())


def conversations(end: bool = False) -> list[ReadableSpan]:
    def agent(tracer: Any) -> None:
        turn(tracer, "conv-a", PARIS, "get-weather", {"city": "Paris"}, "Rainy, 14C", "It is rainy in Paris.")
        turn(tracer, "conv-a", ROME, "get-weather", {"city": "Rome"}, "Sunny, 20C", "Sunny in Rome.", end=end)
        turn(tracer, "conv-b", UMBRELLA, "book-umbrella", {"qty": 1}, "No umbrellas left", "Sorry, none left.",
             failed=True, end=end)
    return recorded("weather-agent", agent)


def config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "tracejudge.toml"
    path.write_text("[conversations]\nquiet_period_s = 1\npoll_s = 0.1\n[scoring]\nmodel = \"gpt-4o-mini\"\n"
                    "retry_backoff_s = 0.2\n" + extra)
    return path


def query(collector: CollectorProcess, sql: str, token: str | None = None) -> list[list[Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    reply = httpx.post(f"{collector.admin_url}/api/query", json={"sql": sql}, headers=headers, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()["rows"]


def wait_for(collector: CollectorProcess, sql: str, expected: int, timeout: float = 60,
             token: str | None = None) -> list[list[Any]]:
    deadline = time.monotonic() + timeout
    while True:
        rows = query(collector, sql, token)
        if len(rows) >= expected or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def export(collector: CollectorProcess, spans: list[ReadableSpan]) -> None:
    result = OTLPSpanExporter(endpoint=collector.grpc_endpoint, insecure=True).export(spans)
    assert result is SpanExportResult.SUCCESS, (  # when it fails: is the collector still running, and what it said
        f"export failed; collector exit status {collector.proc.poll() if collector.proc else None}, "
        f"its last log lines: {collector.log_lines[-8:]}")


SCORES = "SELECT conversation_id, metric, round(score, 4), conversation_version FROM scores ORDER BY 1, 2, 4"


@pytest.fixture
def judge_env(judge_server) -> dict[str, str]:
    judge_server.script = judge_script
    return {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}


def test_completed_conversations_are_scored_as_the_judges_answers_imply(tmp_path, judge_env, judge_server) -> None:
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path), env=judge_env) as collector:
        export(collector, conversations())
        rows = wait_for(collector, SCORES, 6)
        assert rows == [
            ["conv-a", "mcp_call_validity", 1.0, 1],
            ["conv-a", "mcp_task_completion", 0.7, 1],  # mean of 0.8 and 0.6
            ["conv-a", "mcp_use", 0.7, 1],  # mean over tasks of min(primitive, argument)
            ["conv-b", "mcp_call_validity", 0.0, 1],  # the call returned isError
            ["conv-b", "mcp_task_completion", 0.4, 1],
            ["conv-b", "mcp_use", 0.4, 1],
        ]
        [[turns, calls, sampled]] = query(collector, "SELECT turns, mcp_calls, sampled FROM conversations "
                                                     "WHERE conversation_id = 'conv-a'")
        assert (turns, calls) == (4, 2) and json.loads(sampled) == {
            "mcp_use": True, "mcp_task_completion": True, "mcp_call_validity": True}
        [[model, calls_made, cost, service]] = query(collector, "SELECT judge_model, judge_calls, evaluation_cost, "
                                                                "service_name FROM scores WHERE conversation_id = "
                                                                "'conv-a' AND metric = 'mcp_use'")
        assert (model, calls_made, service) == ("gpt-4o-mini", 2 + 2 + 1, "weather-agent") and cost > 0
        daily = query(collector, "SELECT metric, conversations, round(mean_score, 4) FROM daily_scores ORDER BY 1")
        assert daily == [["mcp_call_validity", 2, 0.5], ["mcp_task_completion", 2, 0.55], ["mcp_use", 2, 0.55]]
        text = httpx.get(f"{collector.admin_url}/metrics").text
        assert 'tracejudge_eval_jobs{state="done"} 6.0' in text
        collector.stop()


def test_system_one_mode_end_to_end(tmp_path, s1_server) -> None:
    s1_server.script = lambda r: system_one_answers(
        {k: ([0.0, 0.2, 0.6, 0.2] if k == "q_2" else (0.9 if k == "q_0" else 0.6)) for k in r.questions})
    env = {"TYPESAFE_BASE_URL": s1_server.root_url, "TYPESAFE_API_KEY": "ts-test-not-a-secret"}
    cfg = config(tmp_path, 'eval_mode = "system_one"\n')
    with CollectorProcess(tmp_path / "t.duckdb", config=cfg, env=env) as collector:
        export(collector, conversations(end=True))
        rows = wait_for(collector, SCORES + "", 6, timeout=30)
        judged = [r for r in rows if r[1] != "mcp_call_validity"]
        assert [r[2] for r in judged] == [round((2 * 0.9 + 0.6 + 2 / 3) / 4, 4)] * 4
        [[mode, s1_model, confidence]] = query(collector, "SELECT DISTINCT eval_mode, system_one_model, "
                                                          "round(confidence, 4) FROM scores WHERE metric = 'mcp_use'")
        assert (mode, s1_model, confidence) == ("system_one", "system_one:jev-latest", 0.2)
        collector.stop()
    assert len(s1_server.calls()) == 4  # one request per conversation and judged metric, no LLM at all


def test_a_late_span_makes_a_new_version_that_supersedes_the_old(tmp_path, judge_env) -> None:
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path), env=judge_env) as collector:
        export(collector, conversations(end=True))
        wait_for(collector, SCORES, 6)
        memory = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({"service.name": "weather-agent"}))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        turn(provider.get_tracer("agent"), "conv-b", PARIS, "get-weather", {"city": "Paris"}, "Rainy", "Rainy.")
        provider.shutdown()
        export(collector, list(memory.get_finished_spans()))
        rows = wait_for(collector, SCORES, 9)
        assert [r for r in rows if r[0] == "conv-b" and r[3] == 2] == [
            ["conv-b", "mcp_call_validity", 0.5, 2], ["conv-b", "mcp_task_completion", 0.6, 2],
            ["conv-b", "mcp_use", 0.6, 2]]
        latest = query(collector, "SELECT metric, conversation_version FROM latest_scores "
                                  "WHERE conversation_id = 'conv-b' ORDER BY 1")
        assert latest == [["mcp_call_validity", 2], ["mcp_task_completion", 2], ["mcp_use", 2]]
        assert query(collector, "SELECT count(*) FROM scores WHERE conversation_id = 'conv-b'") == [[6]]
        # every version written, the late one too, is counted where the operator looks
        [[versions]] = query(collector, "SELECT count(*) FROM conversations")
        assert collector.metric("tracejudge_conversations_assembled_total") == versions >= 3
        # and so is what assembly read back to build them: every stored span at least once
        [[stored]] = query(collector, "SELECT count(*) FROM span_records")
        assert collector.metric("tracejudge_assembly_read_spans_total") >= stored > 0
        assert collector.metric("tracejudge_assembly_read_seconds_total") > 0
        # and where assembly's CPU went, stage by stage (the late version built in the server, the first ones in
        # the workers): every stage counted (that they add up, none twice: tests/test_assembler.py)
        stages = {s: collector.metric(f'tracejudge_assembly_cpu_seconds_total{{stage="{s}"}}') for s in CPU_STAGES}
        assert all(seconds > 0 for seconds in stages.values()), stages
        collector.stop()


def test_a_conversation_the_judge_has_seen_is_not_judged_again(tmp_path, judge_env, judge_server) -> None:
    """A scripted health check asks the same thing every hour: identical content (other ids, other spans) gets
    the score already measured for it, at no judge cost."""
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path), env=judge_env) as collector:
        export(collector, conversations(end=True))
        wait_for(collector, SCORES, 6)
        calls = len(judge_server.calls())
        memory = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({"service.name": "weather-agent"}))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        turn(provider.get_tracer("agent"), "conv-c", UMBRELLA, "book-umbrella", {"qty": 1}, "No umbrellas left",
             "Sorry, none left.", failed=True, end=True)
        provider.shutdown()
        export(collector, list(memory.get_finished_spans()))
        rows = wait_for(collector, SCORES, 9)
        assert [r for r in rows if r[0] == "conv-c"] == [
            ["conv-c", "mcp_call_validity", 0.0, 1], ["conv-c", "mcp_task_completion", 0.4, 1],
            ["conv-c", "mcp_use", 0.4, 1]]
        assert len(judge_server.calls()) == calls
        reused = query(collector, "SELECT metric, judge_calls, evaluation_cost, "
                                  "breakdown->>'$.reused_from.conversation_id' FROM scores "
                                  "WHERE conversation_id = 'conv-c' AND metric <> 'mcp_call_validity' ORDER BY 1")
        assert reused == [["mcp_task_completion", 0, 0.0, "conv-b"], ["mcp_use", 0, 0.0, "conv-b"]]
        collector.stop()


def test_without_a_judge_judged_jobs_wait_and_score_pending_scores_them(tmp_path, judge_env) -> None:
    db, cfg = tmp_path / "t.duckdb", config(tmp_path)
    with CollectorProcess(db, config=cfg) as collector:
        assert set(collector.start_line["waiting_for_judge"]) == {"mcp_use", "mcp_task_completion"}
        assert "OPENAI_API_KEY" in collector.start_line["waiting_for_judge"]["mcp_use"]
        export(collector, conversations(end=True))
        assert [r[1] for r in wait_for(collector, SCORES, 2)] == ["mcp_call_validity", "mcp_call_validity"]
        time.sleep(1)
        assert query(collector, "SELECT status, count(*) FROM eval_jobs GROUP BY 1 ORDER BY 1") == [
            ["done", 2], ["waiting_for_judge", 4]]
        collector.stop()
    env = {k: v for k, v in judge_env.items()}
    proc = subprocess.run([sys.executable, "-m", "tracejudge.collector.cli", "score", "--pending", "--db", str(db),
                           "--config", str(cfg)], capture_output=True, text=True, env={**_clean_env(), **env},
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "scored 4 job(s); 0 failed, 0 still waiting" in proc.stdout
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM scores WHERE score IS NOT NULL").fetchone() == (6,)


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "TRACEJUDGE_", "TYPESAFE_"))}


def test_a_misbehaving_judge_is_retried_and_every_job_scores_once(tmp_path, judge_server, judge_env) -> None:
    failures = {"left": 6}
    lock = threading.Lock()

    def flaky(request: Request) -> Reply:
        with lock:
            if failures["left"] > 0:
                failures["left"] -= 1
                return error(404, "model not loaded yet")  # not retried by the judge: the job is retried
        return judge_script(request)

    judge_server.script = flaky
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path), env=judge_env) as collector:
        export(collector, conversations(end=True))
        rows = wait_for(collector, SCORES, 6)
        assert len(rows) == 6 and {r[2] for r in rows if r[0] == "conv-a" and r[1] != "mcp_call_validity"} == {0.7}
        [[retried]] = query(collector, "SELECT count(*) FROM eval_jobs WHERE attempts > 1 AND status = 'done'")
        assert retried >= 1
        text = httpx.get(f"{collector.admin_url}/metrics").text
        assert 'tracejudge_judge_errors_total{kind="JudgeRequestError"' in text
        assert "tracejudge_measure_seconds_bucket" in text
        collector.stop()


def test_the_daily_budget_parks_judged_jobs(tmp_path, judge_env) -> None:
    cfg = config(tmp_path, "daily_budget_usd = 0.000001\nconcurrency = 1\n")
    with CollectorProcess(tmp_path / "t.duckdb", config=cfg, env=judge_env) as collector:
        export(collector, conversations(end=True))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = dict(map(tuple, query(collector, "SELECT status, count(*) FROM eval_jobs GROUP BY 1")))
            if states.get("budget") and states.get("done", 0) >= 3:
                break
            time.sleep(0.2)
        assert states.get("budget", 0) >= 1, states
        parked = query(collector, "SELECT DISTINCT metric, not_before > now() FROM eval_jobs WHERE status = 'budget'")
        assert all(metric != "mcp_call_validity" and later for metric, later in parked)
        assert query(collector, "SELECT count(*) FROM scores WHERE metric = 'mcp_call_validity'") == [[2]]
        collector.stop()


def test_kill_9_during_scoring_then_every_job_finishes_once(tmp_path, judge_server, judge_env) -> None:
    def slow(request: Request) -> Reply:
        threading.Event().wait(0.5)
        return judge_script(request)

    judge_server.script = slow
    db, cfg = tmp_path / "t.duckdb", config(tmp_path)
    with CollectorProcess(db, config=cfg, env=judge_env) as collector:
        export(collector, conversations(end=True))
        deadline = time.monotonic() + 30
        while not query(collector, "SELECT 1 FROM eval_jobs WHERE status = 'running'") and time.monotonic() < deadline:
            time.sleep(0.05)
        collector.kill()
    judge_server.script = judge_script
    with CollectorProcess(db, config=cfg, env=judge_env) as collector:
        rows = wait_for(collector, SCORES, 6)
        assert len(rows) == 6
        assert query(collector, "SELECT status, count(*) FROM eval_jobs GROUP BY 1") == [["done", 6]]
        collector.stop()


def test_query_while_serving_and_writes_refused(tmp_path, judge_env) -> None:
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path), env=judge_env,
                          ) as collector:
        export(collector, conversations(end=True))
        wait_for(collector, SCORES, 6)
        cli = [sys.executable, "-m", "tracejudge.collector.cli", "query", "--url", collector.admin_url]
        proc = subprocess.run([*cli, "SELECT metric, count(*) AS n FROM scores GROUP BY 1 ORDER BY 1",
                               "--format", "csv"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines() == ["metric,n", "mcp_call_validity,2", "mcp_task_completion,2", "mcp_use,2"]
        proc = subprocess.run([*cli, "DELETE FROM scores"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "only read-only SELECT" in proc.stderr
        refused = httpx.post(f"{collector.admin_url}/api/query", json={"sql": "SELECT * FROM read_text('/etc/hosts')"})
        assert refused.status_code == 403 and "reads files" in refused.json()["error"]
        assert query(collector, "SELECT count(*) FROM scores") == [[6]]
        collector.stop()
    proc = subprocess.run([sys.executable, "-m", "tracejudge.collector.cli", "query", "--url", "http://127.0.0.1:9",
                           "--db", str(tmp_path / "t.duckdb"), "SELECT count(*) AS n FROM conversations"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.splitlines()[1].strip() == "2"
    proc = subprocess.run([sys.executable, "-m", "tracejudge.collector.cli", "export", "--since", "7d", "--to",
                           str(tmp_path / "out"), "--db", str(tmp_path / "t.duckdb")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    with duckdb.connect() as con:
        assert con.execute(f"SELECT count(*) FROM '{tmp_path / 'out' / 'scores.parquet'}'").fetchone() == (6,)


def test_sampling_is_deterministic_nested_and_filtered() -> None:
    ids = [f"conversation-{i}" for i in range(2000)]
    at = {rate: {i for i in ids if decide(SamplingSettings(rate=rate), ["mcp_use"], i, None, None)[1]["mcp_use"]}
          for rate in (0.1, 0.5)}
    again = {i for i in ids if decide(SamplingSettings(rate=0.5), ["mcp_use"], i, None, None)[1]["mcp_use"]}
    assert at[0.5] == again and at[0.1] <= at[0.5]
    assert 900 < len(at[0.5]) < 1100 and 150 < len(at[0.1]) < 250
    assert sample_value("conv-a") == sample_value("conv-a") and 0 <= sample_value("x") < 1
    settings = SamplingSettings(rate=0.0, exclude_services=["canary"])
    _, sampled, _ = decide(settings, ["mcp_use", "mcp_call_validity"], "c", "prod", None)
    assert sampled == {"mcp_use": False, "mcp_call_validity": True}  # validity runs on every conversation
    _, sampled, _ = decide(settings, ["mcp_call_validity"], "c", "canary", None)
    assert sampled == {"mcp_call_validity": False}


def test_a_conversation_waiting_at_a_restart_is_still_assembled(tmp_path, judge_env) -> None:
    db = tmp_path / "t.duckdb"
    cfg = config(tmp_path, 'metrics = ["mcp_call_validity"]\n')
    cfg.write_text(cfg.read_text().replace("quiet_period_s = 1", "quiet_period_s = 3"))
    spans = conversations()
    conv_b = [s for s in spans if "umbrella" in json.dumps(dict(s.attributes)) or s.name.endswith("book-umbrella")]
    with CollectorProcess(db, config=cfg) as collector:
        export(collector, [s for s in spans if s.context.trace_id in {b.context.trace_id for b in conv_b}])
        time.sleep(1.5)
        export(collector, [s for s in spans if s.context.trace_id not in {b.context.trace_id for b in conv_b}])
        wait_for(collector, "SELECT conversation_id FROM conversations", 1, timeout=20)
        collector.stop()  # conv-a is still inside its quiet period
    with CollectorProcess(db, config=cfg) as collector:
        rows = wait_for(collector, "SELECT conversation_id FROM conversations ORDER BY 1", 2, timeout=30)
        assert rows == [["conv-a"], ["conv-b"]]
        collector.stop()


def test_side_effecting_functions_are_refused_in_queries(tmp_path, judge_env) -> None:
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path), env=judge_env) as collector:
        for sql in ("SELECT setval('eval_job_ids', 9223372036854775807)", "SELECT nextval('eval_job_ids')",
                    "SELECT * FROM query('DELETE FROM scores')",
                    # a serialized statement hides its functions from the parse tree
                    "SELECT * FROM json_execute_serialized_sql("
                    "json_serialize_sql('SELECT nextval(''eval_job_ids'')'))"):
            reply = httpx.post(f"{collector.admin_url}/api/query", json={"sql": sql})
            assert reply.status_code == 403, sql
        export(collector, conversations(end=True))
        assert len(wait_for(collector, SCORES, 6)) == 6  # the pipeline still works
        collector.stop()


def test_sampling_filters_on_resource_and_span_attributes(tmp_path, judge_env) -> None:
    spans = []
    for environment, conversation, tier in (("prod", "conv-prod", "paid"), ("staging", "conv-staging", "paid"),
                                            ("prod", "conv-test-user", "test")):
        memory = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({"service.name": "weather-agent",
                                                            "deployment.environment": environment}))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        tracer = provider.get_tracer("agent")
        with tracer.start_as_current_span("request", attributes={"user.tier": tier}):
            turn(tracer, conversation, PARIS, "get-weather", {"city": "Paris"}, "Rainy", "Rainy.", end=True)
        provider.shutdown()
        spans += memory.get_finished_spans()
    cfg = config(tmp_path, "[sampling]\ninclude_attributes = {'deployment.environment' = ['prod']}\n"
                           "exclude_attributes = {'user.tier' = ['test']}\n")
    with CollectorProcess(tmp_path / "t.duckdb", config=cfg, env=judge_env) as collector:
        export(collector, spans)
        rows = wait_for(collector, "SELECT conversation_id FROM conversations", 3)
        assert len(rows) == 3
        sampled = {c: json.loads(s) for c, s in query(collector, "SELECT conversation_id, sampled FROM conversations")}
        collector.stop()
    assert sampled["conv-prod"]["mcp_use"] is True
    assert not any(sampled["conv-staging"].values()) and not any(sampled["conv-test-user"].values())


def test_waiting_jobs_resume_when_the_collector_restarts_with_a_judge(tmp_path, judge_env) -> None:
    db, cfg = tmp_path / "t.duckdb", config(tmp_path)
    with CollectorProcess(db, config=cfg) as collector:
        assert "judge_model" in collector.start_line and collector.start_line["config"] == str(cfg.resolve())
        export(collector, conversations(end=True))
        wait_for(collector, "SELECT 1 FROM eval_jobs WHERE status = 'waiting_for_judge'", 4)
        assert any('"advice"' in line and "tracejudge score --pending" in line for line in collector.log_lines)
        collector.stop()
    with CollectorProcess(db, config=cfg, env=judge_env) as collector:
        assert collector.start_line["resumed_jobs"] == 4 and collector.start_line["waiting_for_judge"] == {}
        rows = wait_for(collector, "SELECT metric FROM scores WHERE score IS NOT NULL", 6)
        assert sorted(r[0] for r in rows).count("mcp_use") == 2
        collector.stop()


def test_score_pending_runs_on_a_running_collector(tmp_path, judge_server, judge_env) -> None:
    """Jobs that failed while the judge answered garbage are re-run by `score --pending` through the admin API,
    while the collector holds the file."""
    judge_server.script = lambda request: completion("not json at all")
    cfg = config(tmp_path, "max_attempts = 1\n")
    with CollectorProcess(tmp_path / "t.duckdb", config=cfg, env=judge_env) as collector:
        export(collector, conversations(end=True))
        wait_for(collector, "SELECT 1 FROM eval_jobs WHERE status = 'failed'", 4)
        judge_server.script = judge_script
        proc = subprocess.run([sys.executable, "-m", "tracejudge.collector.cli", "score", "--pending", "--url",
                               collector.admin_url, "--wait", "60"], capture_output=True, text=True,
                              env=_clean_env(), timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "is scoring 4 job(s)" in proc.stderr
        assert "scored 4 job(s); 0 failed, 0 still waiting" in proc.stdout
        assert query(collector, "SELECT count(*) FROM scores WHERE metric = 'mcp_use' AND score IS NOT NULL") == [[2]]
        collector.stop()


def test_the_model_that_answered_is_recorded_and_only_known_models_are_priced(tmp_path, judge_server,
                                                                              judge_env) -> None:
    """A local server asked for the default model answers as its own model: that name is kept, cost is NULL
    (no list price), tokens stay; --judge-model sets what is asked for."""
    judge_server.script = lambda request: (completion({"reason": "final"}, model="qwen2.5-1.5b-instruct")
                                           if request.judge == "final_reason" else
                                           completion({"reason": "r", "score": 0.5}, model="qwen2.5-1.5b-instruct"))
    cfg = tmp_path / "tracejudge.toml"
    cfg.write_text("[conversations]\nquiet_period_s = 1\npoll_s = 0.1\n")
    env = {"OPENAI_BASE_URL": judge_env["OPENAI_BASE_URL"], "TRACEJUDGE_JUDGE_MODEL": "qwen2.5"}
    with CollectorProcess(tmp_path / "t.duckdb", config=cfg, env=env) as collector:
        assert collector.start_line["judge_model"] == "qwen2.5"
        assert collector.start_line["judge_base_url"] == judge_env["OPENAI_BASE_URL"]
        export(collector, conversations(end=True))
        rows = wait_for(collector, "SELECT judge_model, evaluation_cost, input_tokens FROM scores "
                                   "WHERE metric = 'mcp_use'", 2)
        assert [(model, cost) for model, cost, _ in rows] == [("qwen2.5-1.5b-instruct", None)] * 2
        assert all(tokens > 0 for _, _, tokens in rows)
        collector.stop()
    assert {r.body["model"] for r in judge_server.calls()} == {"qwen2.5"}


def test_the_log_shows_each_conversation_score_and_progress(tmp_path) -> None:
    """A quiet period from the environment in the duration syntax, and a log that says what happens."""
    cfg = tmp_path / "tracejudge.toml"
    cfg.write_text('[conversations]\npoll_s = 0.1\n[log]\nprogress_s = "0.5s"\n')
    with CollectorProcess(tmp_path / "t.duckdb", config=cfg, env={"TRACEJUDGE_QUIET_PERIOD": "1s"}) as collector:
        assert collector.start_line["quiet_period_s"] == 1.0
        export(collector, conversations())
        wait_for(collector, "SELECT 1 FROM scores", 2)
        time.sleep(1.2)  # a progress line after the scores
        collector.stop()
    records = [json.loads(line) for line in collector.log_lines if line.startswith("{")]
    complete = sorted((r["conversation_id"], r["turns"], r["mcp_calls"], tuple(r["metrics_queued"]))
                      for r in records if r["event"] == "conversation complete")
    assert complete == [("conv-a", 4, 2, ("mcp_use", "mcp_task_completion", "mcp_call_validity")),
                        ("conv-b", 2, 1, ("mcp_use", "mcp_task_completion", "mcp_call_validity"))]
    scores = sorted((r["conversation_id"], r["metric"], r["score"], r["result"])
                    for r in records if r["event"] == "score written")
    assert scores == [("conv-a", "mcp_call_validity", 1.0, "pass"), ("conv-b", "mcp_call_validity", 0.0, "fail")]
    progress = [r for r in records if r["event"] == "progress"]
    assert progress and progress[-1]["jobs"] == {"done": 2, "waiting_for_judge": 4}
    assert progress[-1]["spans_total"] == len(conversations())


def test_set_eval_mode_tells_a_running_collector_to_restart(tmp_path) -> None:
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path)) as collector:
        proc = subprocess.run([sys.executable, "-m", "tracejudge.collector.cli", "set-eval-mode", "hybrid", "--url",
                               collector.admin_url], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                              env=_clean_env())
        assert proc.returncode == 0, proc.stderr
        assert f"a collector is running at {collector.admin_url}" in proc.stderr and "restart it" in proc.stderr
        collector.stop()
