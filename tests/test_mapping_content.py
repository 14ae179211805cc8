"""A framework whose built-in tracing records no content (AutoGen AgentChat 0.7.5, recorded by
tests/fixtures/real/generate_autogen.py): the conversation says what is missing and what to turn on, `inspect
--explain` says it, and `tracejudge serve` scores nothing from nothing: every metric is not applicable with
that reason, and no judge is called. Ground truth: AutoGen's own run messages (autogen.expected.json)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.collector_process import CollectorProcess
from tests.test_pipeline import config, query, wait_for
from tracejudge.mapping import build_conversations, decode_otlp

REAL = Path(__file__).parent / "fixtures" / "real"
FIXTURE = REAL / "autogen.otlp.json"
SWITCH = "instrument its model client as well"


def _conversations() -> list:
    decoded = decode_otlp(FIXTURE.read_bytes(), "application/json")
    assert decoded.problems == []
    return build_conversations(decoded.spans, explain=True)


def test_each_conversation_says_what_its_spans_hold_none_of_and_what_records_it() -> None:
    truth = json.loads((REAL / "autogen.expected.json").read_text())
    conversations = _conversations()
    # what AutoGen's spans do record: the tools each run called, in order (one trace per run, no conversation id)
    called = [[c.name for c in t.tools_called or []] for c in conversations for t in c.test_case.turns]
    assert called == [[c["name"] for c in turn["mcp_tools_called"]] for turn in truth["turns"]
                      if turn["role"] == "assistant" and turn["mcp_tools_called"]]
    for conversation in conversations:
        gaps = conversation.test_case.metadata["content_missing"]
        assert gaps["missing"] == ["messages", "arguments", "results"]
        assert SWITCH in gaps["how_to_record"] and "gen_ai.conversation.id" in gaps["how_to_record"]
        assert any(e["role"] == "content missing" and SWITCH in e["source"] for e in conversation.explanation)


def test_inspect_explain_names_the_switch() -> None:
    done = subprocess.run([sys.executable, "-m", "tracejudge.collector.cli", "inspect", str(FIXTURE), "--explain"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "content missing: the spans hold no messages, no arguments, no results" in done.stdout
    assert SWITCH in done.stdout


def test_the_collector_scores_nothing_from_nothing(tmp_path: Path, judge_server) -> None:
    env = {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path), env=env) as collector:
        done = subprocess.run([sys.executable, "-m", "tracejudge.collector.cli", "replay", str(FIXTURE),
                               "--endpoint", collector.http_url], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        rows = wait_for(collector, "SELECT metric, score, success, error FROM scores ORDER BY conversation_id, "
                        "metric", 6)
        assert {(metric, score, success) for metric, score, success, _ in rows} == {
            ("mcp_call_validity", None, None), ("mcp_task_completion", None, None), ("mcp_use", None, None)}
        for metric, _, _, error in rows:
            needed = "arguments" if metric == "mcp_call_validity" else "messages"
            assert error.startswith(f"not applicable: the conversation's spans recorded no {needed}"), error
            assert SWITCH in error
        assert judge_server.calls() == []  # no judge call for a conversation with nothing to judge
        # not applicable is neither pass nor fail: the Result filter's fail finds none of them
        assert query(collector, "SELECT count(*) FROM score_summary WHERE success = false") == [[0]]


def test_reads_and_tools_without_parameters_are_not_missing_content() -> None:
    """An MCP client span of a resource read records its URI only, and a tool that takes no parameters may have
    no arguments recorded: neither makes a conversation with messages and results say content is missing."""
    from tests.support.otlp_json import request, span

    messages = {"gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "go"}]}]),
                "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                    {"type": "text", "content": "done"}]}])}
    spans = [
        span(1, 1, "invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent",
                                                 "gen_ai.conversation.id": "conv-ok", **messages}),
        span(1, 2, "resources/read", 1, kind=3, start=1, attributes={"mcp.method.name": "resources/read",
                                                                      "mcp.resource.uri": "docs://a"}),
        span(1, 3, "tools/call ping", 1, kind=3, start=2, attributes={
            "mcp.method.name": "tools/call", "gen_ai.tool.name": "ping", "gen_ai.tool.call.result": "pong"}),
        span(1, 4, "tools/list", 1, kind=3, start=0, attributes={"mcp.method.name": "tools/list"})]
    body = request(({"service.name": "agent"}, spans))
    [conversation] = build_conversations(decode_otlp(json.dumps(body), "application/json").spans,
                                         [{"server_name": "s", "available_tools": [
                                             {"name": "ping", "inputSchema": {"type": "object", "properties": {}}}]}])
    assert "content_missing" not in (conversation.test_case.metadata or {})
