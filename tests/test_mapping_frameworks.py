"""Real traces recorded from agent frameworks (tests/fixtures/real/generate_<framework>.py) map to the
conversation the framework's own message history records, field by field.

The ground truth (`<framework>.expected.json`) is written by each generator from the framework's history
and the MCP server's answers, never from this mapping. Where an instrumentation does not record something
at all, `NOT_RECORDED` says what and the test asserts the documented stand-in instead (the README's
conformance table lists the same gaps).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tracejudge.mapping import build_conversations, decode_otlp, decode_otlp_logs

REAL = Path(__file__).parent / "fixtures" / "real"
# autogen: its built-in tracing records no content at all (tests/test_mapping_content.py checks what it says)
NO_CONTENT = {"autogen"}
FRAMEWORKS = sorted(p.name.removesuffix(".expected.json") for p in REAL.glob("*.expected.json")
                    if "notes" in json.loads(p.read_text()) and p.name.removesuffix(".expected.json") not in NO_CONTENT)

# framework -> what its instrumentation never records, so no mapping can rebuild it
NOT_RECORDED: dict[str, set[str]] = {
    "strands": {"resource_uri", "resource_text", "prompt_args", "prompt_text"},
    "adk": {"resource_uri", "resource_text", "prompt_args", "prompt_text"},
    "openai_agents": {"resource_uri", "resource_text", "prompt_args", "prompt_text"},
    "llamaindex": {"resource_uri", "resource_text", "prompt_args", "prompt_text"},
    "smolagents": {"tool_error"},  # no MCP span, and no status or flag marks the failed call
    "vercel_ai": {"resource_read", "prompt_get"},  # its MCP client makes no span and sends no traceparent
    # mcp 1.x (which these frameworks require) makes no span; the app's resource read and prompt get leave none
    "langgraph": {"resource_read", "prompt_get"},
    "crewai": {"resource_read", "prompt_get"},
    # mcp 1.x (no MCP span) and no resource API of its own: the app's resource read leaves no trace
    "semantic_kernel": {"resource_read"},
    # Mastra makes no span for the app's reads and gets, sends no traceparent, and names its tools without schemas
    "mastra": {"resource_read", "prompt_get", "tool_schemas"},
}
# frameworks whose traces have no MCP span: the user names the MCP server's tools ([mapping] mcp_tools)
MCP_TOOLS: dict[str, dict[str, list[str]]] = {
    "smolagents": {"weather": ["book_umbrella", "get_weather"]},
    "vercel_ai": {"weather": ["book_umbrella", "get_weather"]},
    "langgraph": {"weather": ["book_umbrella", "get_weather"]},
    "crewai": {"weather": ["book_umbrella", "get_weather"]},
}


def _text(blocks: Any) -> str | None:
    return None if blocks is None else "\n".join(getattr(b, "text", None) or "" for b in blocks)


def recorded_spans(name: str) -> list[Any]:
    """The fixture's spans, with the log records of `<name>.logs.otlp.json` where the framework logs its messages
    (Semantic Kernel)."""
    decoded = decode_otlp((REAL / f"{name}.otlp.json").read_bytes(), "application/json")
    assert decoded.problems == []
    logs = REAL / f"{name}.logs.otlp.json"
    if not logs.exists():
        return decoded.spans
    carried = decode_otlp_logs(logs.read_bytes(), "application/json")
    assert carried.problems == [] and carried.spans
    return decoded.spans + carried.spans


def mapped_turns(name: str) -> tuple[list[dict[str, Any]], dict[str, Any], Any]:
    """The conversation tracejudge rebuilds from the recorded trace, in the ground truth's shape."""
    expected = json.loads((REAL / f"{name}.expected.json").read_text())
    conversations = build_conversations(recorded_spans(name), mcp_tools=MCP_TOOLS.get(name))
    if expected.get("conversation_id"):
        conversations = [c for c in conversations if c.conversation_id == expected["conversation_id"]]
    assert len(conversations) == 1, [c.conversation_id for c in conversations]
    case = conversations[0].test_case
    gaps = NOT_RECORDED.get(name, set())
    turns = []
    for turn in case.turns:
        if turn.role == "user":
            turns.append({"role": "user", "content": turn.content})
            continue
        turns.append({
            "role": "assistant",
            "content": turn.content,
            "mcp_tools_called": [{"name": c.name, "args": c.args, "result_text": _text(c.result.content) if c.result
                                  else None, "is_error": bool(c.result and c.result.is_error)}
                                 for c in turn.mcp_tools_called or []],
            "mcp_resources_called": [{"uri": r.uri, "text": None if "resource_text" in gaps else
                                      _text(r.result.contents) if r.result else None}
                                     for r in turn.mcp_resources_called or []],
            "mcp_prompts_called": [{"name": p.name, "args": p.args, "text": None if "prompt_text" in gaps else
                                    _prompt_text(p.result)} for p in turn.mcp_prompts_called or []],
            "function_tools": [t.name for t in turn.tools_called or []],
            "not_executed": (turn.metadata or {}).get("calls_not_executed", []),
        })
    return turns, expected, case


def _prompt_text(result: Any) -> str | None:
    if result is None:
        return None
    texts = [m.content.text for m in result.messages or [] if getattr(m.content, "text", None)]
    return "\n".join(texts) if texts else result.description


def expected_turns(name: str, expected: dict[str, Any]) -> list[dict[str, Any]]:
    gaps = NOT_RECORDED.get(name, set())
    out = []
    for turn in expected["turns"]:
        if turn["role"] == "user":
            out.append(turn)
            continue
        resources = [{"uri": "unknown" if "resource_uri" in gaps else r["uri"],
                      "text": None if "resource_text" in gaps else r["text"]} for r in turn["mcp_resources_called"]
                     if "resource_read" not in gaps]
        prompts = [{"name": p["name"], "args": {} if "prompt_args" in gaps else p["args"],
                    "text": None if "prompt_text" in gaps else p["text"]} for p in turn["mcp_prompts_called"]
                   if "prompt_get" not in gaps]
        tools = [{**c, "is_error": False} if "tool_error" in gaps else c for c in turn["mcp_tools_called"]]
        out.append({**turn, "mcp_tools_called": tools, "mcp_resources_called": resources,
                    "mcp_prompts_called": prompts, "function_tools": [], "not_executed": []})
    return out


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_framework_trace_maps_to_the_framework_history(name: str) -> None:
    got, expected, _ = mapped_turns(name)
    want = expected_turns(name, expected)
    assert [(t["role"], t["content"]) for t in got] == [(t["role"], t["content"]) for t in want]
    for index, (got_turn, want_turn) in enumerate(zip(got, want, strict=True)):
        for key in ("mcp_tools_called", "mcp_resources_called", "mcp_prompts_called", "function_tools",
                    "not_executed"):
            assert got_turn.get(key) == want_turn.get(key), f"turn {index} {key}"


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_framework_inventory_has_the_servers_schemas(name: str) -> None:
    _, expected, case = mapped_turns(name)
    tools = {t.name: t.input_schema for s in case.mcp_servers or [] for t in s.available_tools}
    for tool, schema in expected["mcp_tools_available"].items():
        assert tool in tools, tools
        if "tool_schemas" in NOT_RECORDED.get(name, set()):
            assert tools[tool] in (None, {"type": "object"}), tool  # nothing made up
            continue
        assert set((tools[tool] or {}).get("properties", {})) == set(schema.get("properties", {})), tool
        assert (tools[tool] or {}).get("required") == schema.get("required"), tool


def test_every_framework_fixture_is_checked() -> None:
    generators = {p.name.removeprefix("generate_").removesuffix(".py") for p in REAL.glob("generate_*.py")}
    # pydantic_ai_session: a whole MCP session, checked by tests/test_mapping_sessions.py
    checked = set(FRAMEWORKS) | NO_CONTENT
    assert generators - {"openinference", "openllmetry", "pydantic_ai", "pydantic_ai_session",
                         "simulated_pydantic_ai"} <= checked
