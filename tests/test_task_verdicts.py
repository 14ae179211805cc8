"""Task-level verdicts: each judged task as a row (`score_tasks`), the three metrics side by side per task
(`task_verdicts`), counted on /metrics and on the OTLP-facing pages, and `[scoring] aggregation = "any_task"`
failing a conversation when one of its tasks fails. A scripted judge answers known scores per task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.support.collector_process import CollectorProcess
from tests.test_pipeline import (
    JUDGED,
    PARIS,
    ROME,
    UMBRELLA,
    config,
    export,
    judge_script,
    query,
    recorded,
    turn,
    wait_for,
)


def three_tasks() -> list:
    """conv-c: Paris (0.8), Rome (0.6) and an umbrella booking the MCP server refused (0.4)."""
    def agent(tracer: Any) -> None:
        turn(tracer, "conv-c", PARIS, "get-weather", {"city": "Paris"}, "Rainy, 14C", "It is rainy in Paris.")
        turn(tracer, "conv-c", ROME, "get-weather", {"city": "Rome"}, "Sunny, 20C", "Sunny in Rome.")
        turn(tracer, "conv-c", UMBRELLA, "book-umbrella", {"qty": 1}, "No umbrellas left", "Sorry, none left.",
             failed=True, end=True)
    return recorded("weather-agent", agent)


def _counter(collector: CollectorProcess, name: str) -> float:
    text = httpx.get(f"{collector.admin_url}/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_each_task_is_a_row_and_the_metrics_meet_per_task(tmp_path: Path, judge_server) -> None:
    judge_server.script = judge_script
    env = {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path), env=env) as collector:
        export(collector, three_tasks())
        wait_for(collector, "SELECT 1 FROM scores", 3)
        rows = query(collector, "SELECT task_index, task_text, score, passed, first_turn, last_turn, mcp_calls "
                                "FROM score_tasks WHERE metric = 'mcp_task_completion' ORDER BY task_index")
        assert [(r[1], r[2], r[3]) for r in rows] == [(q, JUDGED[q], JUDGED[q] >= 0.5)
                                                      for q in (PARIS, ROME, UMBRELLA)]
        assert [(r[4], r[5]) for r in rows] == [(0, 1), (2, 3), (4, 5)]
        assert [r[6] for r in rows] == [["tool get-weather"], ["tool get-weather"], ["tool book-umbrella"]]

        verdicts = query(collector, "SELECT task, task_completion, invalid_calls, went_wrong, passed "
                                    "FROM task_verdicts ORDER BY task_index")
        assert [v[4] for v in verdicts] == [True, True, False]
        assert verdicts[2][2] == ["tool book-umbrella"]
        assert verdicts[2][3] == "invalid or failed MCP call, wrong MCP use, not completed"  # the judge: 0.4 on both
        # the conversation passes task completion on the mean of its tasks, and says one task failed
        [(score, success)] = query(collector, "SELECT score, success FROM scores "
                                              "WHERE metric = 'mcp_task_completion'")
        assert abs(score - (0.8 + 0.6 + 0.4) / 3) < 1e-9 and success is True
        assert _counter(collector, 'tracejudge_task_results_total{metric="mcp_task_completion",result="fail"}') == 1
        assert _counter(collector, 'tracejudge_task_results_total{metric="mcp_task_completion",result="pass"}') == 2
        page = httpx.get(f"{collector.admin_url}/conversations/conv-c", timeout=30).text
        assert "tasks failed: 1 of 3" in page
        overview = httpx.get(f"{collector.admin_url}/", timeout=30).text
        assert "tasks failed: 1 of 3, in 1 conv." in overview
        compared = httpx.get(f"{collector.admin_url}/api/compare", timeout=30,
                             params={"a": "service=weather-agent", "b": "service=weather-agent,since=1h"}).json()
        completion = next(m for m in compared["metrics"] if m["metric"] == "mcp_task_completion")
        assert completion["a"]["failed_task_rate"]["value"] == 1.0  # its one conversation has a failed task
        assert completion["a"]["pass_rate"]["value"] == 1.0  # though it passes on the mean
        collector.stop()


def test_any_task_aggregation_fails_the_conversation_whose_one_task_failed(tmp_path: Path, judge_server) -> None:
    judge_server.script = judge_script
    env = {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}
    settings = config(tmp_path, 'aggregation = "any_task"\n')
    with CollectorProcess(tmp_path / "t.duckdb", config=settings, env=env) as collector:
        export(collector, three_tasks())
        wait_for(collector, "SELECT 1 FROM scores", 3)
        scores = dict((m, (s, ok)) for m, s, ok in query(collector, "SELECT metric, score, success FROM scores"))
        assert scores["mcp_task_completion"] == (0.4, False)
        breakdown = query(collector, "SELECT breakdown->>'aggregation' FROM scores WHERE metric = 'mcp_use'")
        assert breakdown == [["any_task"]]
        collector.stop()
