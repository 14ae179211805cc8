"""Traces produced by real instrumentation libraries (tests/fixtures/real, with their generators) map to the
conversations their scenarios actually had."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracejudge.mapping import build_conversations, decode_otlp

REAL = Path(__file__).parent / "fixtures" / "real"
# The weather scenario of _scenario.py; the agent-framework fixtures (_frameworks.py) have their own test.
FIXTURES = sorted(REAL / name for name in ("openinference.otlp.json", "openllmetry_mcp.otlp.json",
                                           "pydantic_ai_mcp.otlp.json"))


# What an instrumentation does not record cannot be rebuilt (tests/fixtures/real/README.md lists the gaps):
# OpenInference's MCP instrumentation only propagates context, and the MCP SDK's spans carry no resource URI.
URI_NOT_RECORDED = {"openinference.otlp.json"}


def _expected(path: Path) -> dict:
    return json.loads(path.with_name(path.name.replace(".otlp.", ".expected.")).read_text())


@pytest.mark.parametrize("path", FIXTURES, ids=[p.name for p in FIXTURES])
def test_real_trace_maps_to_the_scenario(path: Path) -> None:
    decoded = decode_otlp(path.read_bytes(), "application/json")
    assert decoded.problems == []
    expected = _expected(path)
    conversations = [c for c in build_conversations(decoded.spans) if len(c.test_case.turns) > 0]
    if expected.get("conversation_id"):
        conversations = [c for c in conversations if c.conversation_id == expected["conversation_id"]]
    [conversation] = conversations
    turns = conversation.test_case.turns
    assert [(t.role, t.content) for t in turns] == [(t["role"], t["content"]) for t in expected["turns"]]
    for turn, want in zip(turns, expected["turns"], strict=True):
        got_tools = [(c.name, c.args, "\n".join(b.text or "" for b in c.result.content) if c.result else None,
                      c.result.is_error if c.result else None) for c in turn.mcp_tools_called or []]
        want_tools = [(c["name"], c["args"], c.get("result_text"), c.get("is_error"))
                      for c in want.get("mcp_tools_called", [])]
        assert got_tools == want_tools
        want_resources = [r["uri"] for r in want.get("mcp_resources_called", [])]
        if path.name in URI_NOT_RECORDED:
            want_resources = ["unknown"] * len(want_resources)  # the read is seen, its URI is not
        assert [r.uri for r in turn.mcp_resources_called or []] == want_resources
        # prompts/get arguments are not recorded by these instrumentations, so only the prompt is compared
        want_prompts = [p["name"] for p in want.get("mcp_prompts_called", [])]
        assert [p.name for p in turn.mcp_prompts_called or []] == want_prompts
    available = {t.name for s in conversation.test_case.mcp_servers or [] for t in s.available_tools}
    assert set(expected.get("mcp_tools_available", [])) <= available
