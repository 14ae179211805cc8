"""Judging through the OpenAI Batch API (a loopback stand-in speaking its wire format): half price, requests
gathered into batches, and a collector restart that waits on the batch already submitted instead of paying
twice."""

from __future__ import annotations

import io
import time
from datetime import UTC, datetime

import duckdb
import pytest

from tests.support.batch_server import BatchServer
from tests.support.cases import three_task_case, two_turn_case
from tests.support.collector_process import CollectorProcess
from tests.support.scripted_server import Reply, Request, error
from tests.test_metrics_llm import scripted
from tests.test_pipeline import SCORES, config, conversations, export, judge_script, query, wait_for
from tracejudge import JudgeUnavailableError, LLMJudge, MCPTaskCompletionMetric, MultiTurnMCPUseMetric, evaluate
from tracejudge.collector.pipeline.scoring_stage import ScoringStage, StageConfig
from tracejudge.collector.store.schema import migrate
from tracejudge.judges.batch import BatchOptions
from tracejudge.judges.resolve import JudgeOptions

PER_CALL = (100 * 0.15 + 20 * 0.60) / 1e6  # gpt-4o-mini list price of one scripted answer (100 in, 20 out)


def batch_judge(server: BatchServer) -> LLMJudge:
    return LLMJudge("gpt-4o-mini", base_url=server.base_url, api_key="sk-test-not-a-secret",
                    batch=BatchOptions(flush_s=0.3, poll_s=0.05))


def test_batch_judging_gathers_each_round_into_one_batch_at_half_price() -> None:
    with BatchServer(scripted) as server:
        metric = MultiTurnMCPUseMetric(model=batch_judge(server))
        result = evaluate([three_task_case(), three_task_case()], [metric], file=io.StringIO())
    use = [t.metrics[0] for t in result.test_results]
    assert [m.score for m in use] == [pytest.approx(2 / 3)] * 2  # the same scores as synchronous judging
    assert len(server.batches) == 2  # round one: every task decision of both cases; round two: the reasons
    lines = server.uploaded_lines()
    assert len(lines) == len({line["custom_id"] for line in lines})
    assert len(lines) == 6  # identical requests of the two identical cases are sent once
    assert all(m.evaluation_cost == pytest.approx(0.5 * PER_CALL * m.score_breakdown["llm_calls"]) for m in use)


def test_a_batch_line_refusing_the_format_falls_back_like_a_synchronous_answer() -> None:
    def no_schema(request: Request) -> Reply:
        if request.format == "json_schema":
            return error(400, "response_format json_schema is not supported by this deployment")
        return scripted(request)

    with BatchServer(no_schema) as server:
        judge = batch_judge(server)
        metric = MCPTaskCompletionMetric(model=judge)
        assert metric.measure(two_turn_case()) == pytest.approx(0.9)
    assert judge.output_format == "json_object"
    assert [line["body"].get("response_format", {}).get("type") for line in server.uploaded_lines()] == [
        "json_schema", "json_object", "json_object"]


def test_a_failed_batch_line_is_asked_again_not_replayed() -> None:
    failures = iter([True])

    def flaky(request: Request) -> Reply:
        return error(500, "internal error") if next(failures, False) else scripted(request)

    with BatchServer(flaky) as server:
        metric = MCPTaskCompletionMetric(model=batch_judge(server), include_reason=False)
        with pytest.raises(JudgeUnavailableError):
            metric.measure(two_turn_case())
        assert metric.measure(two_turn_case()) == pytest.approx(0.9)  # the ledger kept no failed answer
    assert len(server.uploaded_lines()) == 2 and len(server.batches) == 2


def test_a_collector_restarted_while_its_batch_runs_waits_on_that_batch(tmp_path) -> None:
    with BatchServer(judge_script, auto_complete=False) as server:
        env = {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}
        db = tmp_path / "t.duckdb"
        cfg = config(tmp_path, "batch = true\nbatch_flush_s = 0.3\nbatch_poll_s = 0.1\n")
        with CollectorProcess(db, config=cfg, env=env) as collector:
            export(collector, conversations(end=True))
            # every job has asked once its requests stop arriving (they can span two flushes): then kill -9
            deadline, seen, steady_since = time.monotonic() + 30, 0, time.monotonic()
            while time.monotonic() < deadline and (not seen or time.monotonic() - steady_since < 2.0):
                [[count]] = query(collector, "SELECT count(*) FROM judge_batch_requests")
                if count != seen:
                    seen, steady_since = count, time.monotonic()
                time.sleep(0.05)
            collector.kill()
        submitted = len(server.batches)
        assert submitted >= 1
        first_round = len(server.uploaded_lines())
        with CollectorProcess(db, config=cfg, env=env) as collector:
            time.sleep(1.0)  # the retried jobs ask again: they must find the running batches, not submit another
            assert len(server.batches) == submitted
            server.auto_complete = True
            server.release()
            rows = wait_for(collector, SCORES, 6)
            assert [r[:3] for r in rows] == [
                ["conv-a", "mcp_call_validity", 1.0], ["conv-a", "mcp_task_completion", 0.7],
                ["conv-a", "mcp_use", 0.7], ["conv-b", "mcp_call_validity", 0.0],
                ["conv-b", "mcp_task_completion", 0.4], ["conv-b", "mcp_use", 0.4]]
            [[calls, cost]] = query(collector, "SELECT sum(judge_calls), sum(evaluation_cost) FROM scores "
                                               "WHERE metric <> 'mcp_call_validity'")
            collector.stop()
    lines = server.uploaded_lines()
    assert len(lines) == len({line["custom_id"] for line in lines})  # nothing was paid for twice
    assert len(lines) == first_round + 4  # the four final reasons, in a batch of their own
    assert cost == pytest.approx(0.5 * PER_CALL * calls)


async def test_batch_mode_leases_only_the_jobs_the_daily_budget_left_pays_for(tmp_path, monkeypatch) -> None:
    """Spend in batch mode lands hours after jobs are leased: the stage must not lease 2,000 jobs on $1 left."""
    con = duckdb.connect(str(tmp_path / "t.duckdb"))
    migrate(con)
    now = datetime.now(UTC)
    con.execute("INSERT INTO scores (conversation_id, conversation_version, metric, metric_config, "
                "evaluation_cost, scored_at) VALUES ('old', 1, 'mcp_use', 'x', 0.25, ?), "
                "('old', 1, 'mcp_task_completion', 'x', 0.25, ?)", [now, now])
    con.execute("INSERT INTO eval_jobs (conversation_id, conversation_version, metric, metric_config, status, "
                "created_at, updated_at) SELECT 'c' || range, 1, 'mcp_use', 'x', 'pending', ?, ? FROM range(50)",
                [now, now])
    con.execute("INSERT INTO conversations (conversation_id, version, content_hash, status, assembled_at) "
                "SELECT 'c' || range, 1, 'h', 'complete', ? FROM range(50)", [now])  # the versions the jobs score
    config = StageConfig(metrics=("mcp_use",), model="gpt-4o-mini", daily_budget_usd=2.0,
                         judge=JudgeOptions(batch=True))
    with BatchServer(scripted) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-secret")
        leased = await ScoringStage(con, config, lambda *a, **k: None).step()
    assert leased == 6  # $2.00 - $0.50 spent = $1.50 left, at $0.25 a job
    con.close()
