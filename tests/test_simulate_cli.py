"""`tracejudge simulate` (issue 40): goldens driven through two versions of an OpenTelemetry-instrumented agent, each
conversation built from the agent's own spans (--traced), scored, stored as a cohort that `tracejudge compare`
reads, and gated: the version whose MCP calls fail is worse than the baseline and the command exits 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_compare import tracejudge

AGENT = '''
import json
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

trace.set_tracer_provider(TracerProvider())
tracer = trace.get_tracer("weather-agent")
FAILS = {fails}


def reply(input):
    city = input.split()[-1].rstrip("?")
    text = "The forecast service is down." if FAILS else f"It is sunny in {{city}}."
    result = {{"content": [{{"type": "text", "text": "timeout" if FAILS else "Sunny"}}], "isError": FAILS}}
    with tracer.start_as_current_span("invoke_agent weather", attributes={{
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "weather",
            "gen_ai.input.messages": json.dumps([{{"role": "user", "parts": [{{"type": "text", "content": input}}]}}]),
            "gen_ai.output.messages": json.dumps([{{"role": "assistant", "parts": [{{"type": "text",
                                                                                    "content": text}}]}}])}}):
        with tracer.start_as_current_span("execute_tool get_forecast", attributes={{
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_forecast",
                "mcp.method.name": "tools/call", "gen_ai.tool.call.arguments": json.dumps({{"city": city}}),
                "gen_ai.tool.call.result": json.dumps(result)}}):
            pass
    return text
'''


def test_two_agent_versions_simulated_traced_stored_as_cohorts_compared_and_gated(tmp_path: Path) -> None:
    (tmp_path / "good_agent.py").write_text(AGENT.format(fails=False))
    (tmp_path / "bad_agent.py").write_text(AGENT.format(fails=True))
    goldens = tmp_path / "goldens.json"
    goldens.write_text(json.dumps([{"scenario": f"the weather in city {i}", "expected_outcome": "a forecast",
                                    "turns": [{"role": "user", "content": f"Weather in C{i}?"}]} for i in range(12)]))
    out = str(tmp_path / "sims.duckdb")
    common = ["--goldens", str(goldens), "--traced", "--metric", "mcp_call_validity", "--out", out]
    baseline = tracejudge("simulate", "--agent", "good_agent:reply", "--cohort", "baseline", *common)
    assert baseline.returncode == 0, baseline.stderr
    assert "simulated 12 conversations as cohort tracejudge.cohort=baseline" in baseline.stdout
    candidate = tracejudge("simulate", "--agent", "bad_agent:reply", "--cohort", "v2", *common,
                           "--fail-if-worse", "mcp_call_validity:0.05")
    assert candidate.returncode == 1 and "FAIL" in candidate.stdout, candidate.stdout + candidate.stderr

    compared = tracejudge("compare", "tracejudge.cohort=baseline", "tracejudge.cohort=v2", "--db", out,
                          "--format", "json", "--url", "http://127.0.0.1:9")
    assert compared.returncode == 0, compared.stderr
    result = json.loads(compared.stdout)
    [validity] = result["metrics"]
    assert validity["a"]["pass_rate"]["value"] == 1.0 and validity["b"]["pass_rate"]["value"] == 0.0
    assert result["conversations"] == {"a": 12, "b": 12}
    [tool] = result["tools"]  # the MCP calls came from the agents' spans
    assert (tool["name"], tool["a"]["calls"], tool["b"]["calls"]) == ("get_forecast", 12, 12)
    assert tool["b"]["error_rate"]["value"] == pytest.approx(1.0)

    missing = tracejudge("simulate", "--agent", "nowhere:reply", *common)
    assert missing.returncode == 2 and "cannot load the agent" in missing.stderr
    neither = tracejudge("simulate", "--agent", "good_agent:reply", "--out", out)
    assert neither.returncode == 2 and "--goldens FILE" in neither.stderr
