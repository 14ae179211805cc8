from __future__ import annotations

import io

import pytest

from tests.support.cases import three_task_case, two_turn_case
from tests.test_metrics_llm import scripted
from tracejudge import MCPCallValidityMetric, MCPTaskCompletionMetric, MultiTurnMCPUseMetric, evaluate


@pytest.fixture
def server(judge_server):
    judge_server.script = scripted
    return judge_server


def test_evaluate_runs_every_metric_on_every_case_and_prints_a_summary(server, judge) -> None:
    out = io.StringIO()
    metrics = [MultiTurnMCPUseMetric(model=judge), MCPTaskCompletionMetric(model=judge), MCPCallValidityMetric()]
    result = evaluate([two_turn_case(), three_task_case()], metrics, file=out)
    scores = {(t.name, m.metric): m.score for t in result.test_results for m in t.metrics}
    assert scores[("two-turn", "mcp_use")] == pytest.approx(0.5)
    assert scores[("three-tasks", "mcp_use")] == pytest.approx(2 / 3)
    assert scores[("three-tasks", "mcp_task_completion")] == pytest.approx(2.2 / 3)
    assert scores[("two-turn", "mcp_call_validity")] == 1.0
    assert result.passed
    assert metrics[0].score is None  # the caller's metric objects are templates, left untouched
    table = out.getvalue().splitlines()
    assert table[0].split() == ["case", "metric", "score", "result", "cost_usd", "reason"]
    assert any(line.split()[:4] == ["three-tasks", "mcp_use", "0.667", "PASS"] for line in table)
    assert table[-1].startswith("2/2 test cases passed; total cost $")
    assert len(server.calls()) == (3 + 6) + (2 + 4)


def test_one_failing_metric_does_not_hide_the_others(server, judge) -> None:
    no_task = {"name": "greeting-only", "turns": [{"role": "assistant", "content": "Hello!"}]}
    out = io.StringIO()
    result = evaluate([no_task, two_turn_case()],
                      [MCPTaskCompletionMetric(model=judge, threshold=0.95), MCPCallValidityMetric()], file=out)
    first, second = result.test_results
    assert first.metrics[0].error.startswith("NoTaskError: the conversation has no user turn")
    assert first.metrics[1].score is None and first.metrics[1].error is None  # not applicable
    assert second.metrics[0].score == pytest.approx(0.9) and second.metrics[0].success is False
    assert not result.passed
    text = out.getvalue()
    assert "greeting-only  mcp_task_completion  -" in text and "ERROR" in text and "n/a" in text
    assert "0/2 test cases passed" in text


async def test_evaluate_works_inside_a_running_event_loop(server, judge) -> None:
    result = evaluate([two_turn_case()], [MCPTaskCompletionMetric(model=judge)], print_results=False)
    assert result.test_results[0].metrics[0].score == pytest.approx(0.9)
