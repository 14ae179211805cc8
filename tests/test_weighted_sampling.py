"""Judges spent where they tell most, estimates unbiased (issue 39, part 4): with `[sampling]` judging every
conversation whose MCP call failed and 20 % of the rest, each score records the probability its conversation had
of being judged, and `daily_scores` and `tracejudge compare` weigh the sample back (Hajek): the pass rate they
report is that of all conversations, not of the error-heavy sample."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.support.collector_process import CollectorProcess
from tests.support.scripted_server import Reply, Request, completion
from tests.test_compare import tracejudge
from tests.test_pipeline import config, export, query, recorded, turn, wait_for
from tracejudge.collector.pipeline.sampling import sample_value

TOKEN = "weighted-query-token"
FAILED, CLEAN = 30, 120


def judge(request: Request) -> Reply:
    """Task completion fails exactly the conversations whose forecast call failed."""
    if request.judge == "final_reason":
        return completion({"reason": "final"})
    return completion({"reason": "judged", "score": 0.1 if "failing" in request.data["task"] else 0.9})


def traffic() -> list:
    def agent(tracer: Any) -> None:
        for i in range(FAILED + CLEAN):
            failed = i < FAILED
            turn(tracer, f"conv-{i}", f"{'failing' if failed else 'clean'} forecast {i}?", "get_forecast",
                 {"city": f"c{i}"}, "timeout" if failed else "Sunny", "Sorry." if failed else "Sunny.",
                 failed=failed, end=True)
    return recorded("weather-agent", agent, {"service.version": "1.0"})


def test_error_heavy_sampling_is_weighed_back_to_all_traffic(tmp_path, judge_server) -> None:
    judge_server.script = judge
    cfg = config(tmp_path, 'metrics = ["mcp_task_completion"]\n[sampling]\nrate = 0.2\n'
                           'rules = [{when = "mcp_error", rate = 1.0}]\n')
    env = {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret",
           "TRACEJUDGE_QUERY_TOKEN": TOKEN}
    judged_clean = sum(1 for i in range(FAILED, FAILED + CLEAN) if sample_value(f"conv-{i}") < 0.2)
    assert 10 < judged_clean < 40  # the documented hash draws about a fifth of the clean ones
    with CollectorProcess(tmp_path / "t.duckdb", config=cfg, env=env) as collector:
        export(collector, traffic())
        wait_for(collector, "SELECT 1 FROM scores", FAILED + judged_clean, timeout=120, token=TOKEN)
        probabilities = query(collector, "SELECT inclusion_probability, count(*), count(*) FILTER (WHERE success) "
                                         "FROM scores GROUP BY 1 ORDER BY 1", TOKEN)
        assert probabilities == [[0.2, judged_clean, judged_clean], [1.0, FAILED, 0]]
        [[rate, effective_n, scored]] = query(collector, "SELECT pass_rate, effective_n, conversations "
                                                         "FROM daily_scores", TOKEN)
        # weights 1 (failed: always judged) and 5 (clean: one in five): the passes stand for 5 each
        expected = 5 * judged_clean / (FAILED + 5 * judged_clean)
        assert rate == pytest.approx(expected) and scored == FAILED + judged_clean
        assert abs(rate - CLEAN / (FAILED + CLEAN)) < 0.1  # near the truth, 0.8; the sample's own rate is far off
        assert judged_clean / (FAILED + judged_clean) < 0.6
        assert effective_n == pytest.approx((FAILED + 5 * judged_clean) ** 2 / (FAILED + 25 * judged_clean))
        done = tracejudge("compare", "service.version=1.0", "service.version=1.0", "--url", collector.admin_url,
                          "--format", "json", env={"TRACEJUDGE_QUERY_TOKEN": TOKEN})
        assert done.returncode == 0, done.stderr
        [metric] = json.loads(done.stdout)["metrics"]
        assert metric["a"]["pass_rate"]["value"] == pytest.approx(expected)
        assert metric["a"]["pass_rate"]["n"] == FAILED + judged_clean
        assert metric["a"]["pass_rate"]["effective_n"] == pytest.approx(effective_n)
        collector.stop()
    import duckdb

    from tracejudge.collector.pipeline.summary_tables import SummaryTables
    from tracejudge.collector.ui import views

    with duckdb.connect(str(tmp_path / "t.duckdb")) as con:  # the web UI's overview weighs the same way
        SummaryTables().refresh(con)
        [overview] = views.overview(con, "7d", "", None).metrics
        assert overview["pass_rate"] == pytest.approx(expected) and overview["conversations"] == FAILED + judged_clean


def test_the_first_conversations_of_a_new_version_are_judged_then_the_base_rate(tmp_path, judge_server) -> None:
    """`{when = "new_cohort", first = 5, rate = 1.0}` with a base rate of 0: the first five conversations of each
    service.version are judged (inclusion probability 1), the rest are not (0); the counts survive a restart."""
    judge_server.script = judge
    cfg = config(tmp_path, 'metrics = ["mcp_task_completion"]\n[sampling]\nrate = 0.0\n'
                           'rules = [{when = "new_cohort", first = 5, rate = 1.0}]\n')
    env = {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret",
           "TRACEJUDGE_QUERY_TOKEN": TOKEN}

    def version(name: str, first: int, n: int) -> list:
        return recorded("weather-agent", lambda tracer: [
            turn(tracer, f"{name}-{i}", f"clean forecast {i}?", "get_forecast", {"city": "x"}, "Sunny", "Sunny.",
                 end=True) for i in range(first, first + n)], {"service.version": name})

    with CollectorProcess(tmp_path / "t.duckdb", config=cfg, env=env) as collector:
        export(collector, version("1.0", 0, 8))
        wait_for(collector, "SELECT 1 FROM conversations", 8, token=TOKEN)
        wait_for(collector, "SELECT 1 FROM scores", 5, token=TOKEN)
        collector.stop()
    with CollectorProcess(tmp_path / "t.duckdb", config=cfg, env=env) as collector:
        export(collector, version("1.0", 8, 3))  # the same version after a restart: its first five are done
        export(collector, version("2.0", 0, 7))  # a new version: its first five
        wait_for(collector, "SELECT 1 FROM conversations", 18, token=TOKEN)
        wait_for(collector, "SELECT 1 FROM scores", 10, token=TOKEN)
        time.sleep(1.5)  # nothing more is judged
        judged = query(collector, "SELECT split_part(conversation_id, '-', 1), count(*) FROM scores "
                                  "WHERE inclusion_probability = 1.0 GROUP BY 1 ORDER BY 1", TOKEN)
        assert judged == [["1.0", 5], ["2.0", 5]]
        assert query(collector, "SELECT count(*) FROM scores", TOKEN) == [[10]]
        assert query(collector, "SELECT key, value, conversations FROM cohort_counts ORDER BY 2", TOKEN) == [
            ["service.version", "1.0", 11], ["service.version", "2.0", 7]]
        collector.stop()
