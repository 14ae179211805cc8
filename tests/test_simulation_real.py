"""Simulated conversations of a real pydantic-ai agent with a real MCP server over stdio (issue 40), traced by
pydantic-ai's own instrumentation (tests/fixtures/real/generate_simulated_pydantic_ai.py records them): each test
case rebuilt from the spans carries the MCP calls, arguments, errors and inventory that pydantic-ai's own message
history records for that simulated conversation, although pydantic-ai gave every run a conversation id of its
own and the agent's callback returned only text."""

from __future__ import annotations

import json
from pathlib import Path

from tracejudge.collector.simulation import from_spans
from tracejudge.mapping.otlp import decode_otlp
from tracejudge.test_case import ConversationalTestCase

REAL = Path(__file__).parent / "fixtures" / "real"
NAME = "simulated_pydantic_ai"


def test_a_real_agents_simulated_conversations_come_from_its_spans_as_its_history_says() -> None:
    spans = decode_otlp((REAL / f"{NAME}.otlp.json").read_bytes(), "application/json").spans
    simulated = [ConversationalTestCase.model_validate(c)
                 for c in json.loads((REAL / f"{NAME}.simulated.json").read_text())]
    truth = json.loads((REAL / f"{NAME}.expected.json").read_text())
    own_ids = {s.attributes.get("gen_ai.conversation.id") for s in spans} - set(truth)
    assert own_ids, "pydantic-ai named its runs' conversations itself"
    cases = from_spans(spans, simulated)
    assert len(cases) == len(truth) == 2
    for case, plain in zip(cases, simulated, strict=True):
        [expected] = truth[case.metadata["simulation"]["thread_id"]]
        assert case.scenario == plain.scenario and case.metadata["simulation"]["traced"].endswith("traces")
        assert [(t.role, t.content) for t in case.turns] == [("user", expected["user"]),
                                                            ("assistant", expected["assistant"])]
        calls = [(c.name, c.args, c.result.is_error) for t in case.turns for c in t.mcp_tools_called or []]
        assert calls == [(c["tool"], c["args"], c["error"]) for c in expected["calls"]]
        [server] = case.mcp_servers
        assert sorted(t.name for t in server.available_tools) == ["add_to_cart", "checkout", "get_stock"]
