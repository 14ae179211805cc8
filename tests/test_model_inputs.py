"""What each model call was given (system prompt, offered tools), read from spans recorded by the real framework
packages; the ground truth is what the generators passed to the frameworks (`_frameworks.SYSTEM`, the weather
MCP server's tools), not our mapping."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracejudge.mapping.log_events import fold_log_events
from tracejudge.mapping.model_inputs import model_inputs
from tracejudge.mapping.otlp import decode_otlp
from tracejudge.mapping.otlp_logs import decode_otlp_logs

REAL = Path(__file__).parent / "fixtures" / "real"
SYSTEM = "You are a helpful weather assistant."  # tests/fixtures/real/_frameworks.py and _scenario.py
WEATHER_TOOLS = {"get_weather", "book_umbrella"}  # tests/fixtures/real/weather_mcp_server.py


def _given(fixture: str) -> list:
    """Each model call's inputs, with the messages a framework logs as log records put on their spans."""
    spans = decode_otlp((REAL / fixture).read_bytes(), "application/json").spans
    logs = REAL / fixture.replace(".otlp.json", ".logs.otlp.json")
    if logs.exists():
        spans = fold_log_events(spans + decode_otlp_logs(logs.read_bytes(), "application/json").spans)
    return [m for m in (model_inputs(span) for span in spans) if m is not None]


@pytest.mark.parametrize("fixture", ["adk", "langgraph", "openinference", "openllmetry_mcp", "pydantic_ai_mcp",
                                     "vercel_ai", "strands", "openai_agents", "semantic_kernel", "mastra"])
def test_each_model_call_shows_the_system_prompt_the_framework_was_given(fixture: str) -> None:
    given = _given(f"{fixture}.otlp.json")
    assert given, "no model call found"
    assert all(SYSTEM in (g.system or "") for g in given)


@pytest.mark.parametrize("fixture", ["adk", "langgraph", "openinference", "openllmetry_mcp", "pydantic_ai_mcp",
                                     "vercel_ai"])
def test_the_offered_tools_are_the_mcp_servers(fixture: str) -> None:
    for g in _given(f"{fixture}.otlp.json"):
        assert {t.name for t in g.tools} == WEATHER_TOOLS
        assert all(t.input_schema for t in g.tools)


def test_a_span_that_is_no_model_call_gives_nothing() -> None:
    decoded = decode_otlp((REAL / "strands.otlp.json").read_bytes(), "application/json")
    tool_spans = [s for s in decoded.spans if s.attributes.get("gen_ai.operation.name") == "execute_tool"]
    assert tool_spans and all(model_inputs(s) is None for s in tool_spans)
