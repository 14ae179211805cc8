"""What the Semantic Kernel and Mastra dialects decide beyond the recorded scenario (tests/test_mapping_frameworks.py
checks the recordings field by field): which SK functions are MCP, when an SK result is an MCP error, and that a
hostile result repr costs bounded work."""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.support.collector_process import CollectorProcess
from tests.test_cli import run
from tests.test_mapping_frameworks import REAL, recorded_spans
from tests.test_pipeline import config, wait_for
from tracejudge.mapping import build_conversations
from tracejudge.mapping.python_reprs import MAX_REPR_CHARS, read_repr

RESULT = "gen_ai.tool.call.result"


def _with_results(change: dict[str, str]) -> list:
    """The recorded SK conversation with some execute_tool results replaced (tool name -> new result text)."""
    spans = []
    for span in recorded_spans("semantic_kernel"):
        name = span.attributes.get("gen_ai.tool.name")
        if name in change:
            span = dataclasses.replace(span, attributes={**span.attributes, RESULT: change[name]}, _parsed={})
        spans.append(span)
    return spans


def _calls(spans: list) -> tuple[list[tuple[str, bool]], list[str]]:
    [conversation] = build_conversations(spans)
    turns = conversation.test_case.turns
    mcp = [(c.name, bool(c.result and c.result.is_error)) for t in turns for c in t.mcp_tools_called or []]
    functions = [c.name for t in turns for c in t.tools_called or []]
    return mcp, functions


def test_sk_functions_whose_results_hold_no_mcp_object_are_function_tools() -> None:
    mcp, functions = _calls(_with_results({"weather-get_weather": "18°C and rain",
                                           "weather-book_umbrella": "[TextContent(text='booked', encoding=None)]"}))
    assert mcp == []
    assert sorted(functions) == ["weather-book_umbrella", "weather-get_weather", "weather-get_weather"]


def test_an_sk_result_is_an_mcp_error_only_when_the_sdk_says_so_for_that_tool() -> None:
    recorded = _calls(recorded_spans("semantic_kernel"))[0]
    assert ("book_umbrella", True) in recorded and ("get_weather", False) in recorded
    other = ("[TextContent(inner_content=TextContent(type='text', text='Error executing tool get_weather: no', "
             "annotations=None, meta=None), text='Error executing tool get_weather: no')]")
    mcp, _ = _calls(_with_results({"weather-book_umbrella": other}))
    assert ("book_umbrella", False) in mcp  # another tool's error text is this tool's answer, not its error


def test_a_large_mcp_result_full_of_brackets_and_commas_is_still_read() -> None:
    text = json.dumps([{"city": f"c{i}", "temps": [1, 2, 3], "note": "(rain)"} for i in range(1500)])
    assert len(text) > 50_000
    result = f"[TextContent(inner_content=TextContent(type='text', text={text!r}), text={text!r})]"
    mcp, _ = _calls(_with_results({"weather-get_weather": result}))
    assert mcp.count(("get_weather", False)) == 2


def test_hostile_reprs_are_read_as_nothing_and_never_run() -> None:
    assert read_repr("[" * 200_000) is None
    assert read_repr("a<" * 100_000) is None  # a tree of operators, no bracket: refused by its size
    assert read_repr("TextContent(text='" + "x" * MAX_REPR_CHARS + "')") is None
    assert read_repr("__import__('os').system('false')") == {"__class__": "system"}  # read, never run
    assert read_repr("TextContent(text=f'{1/0}')") == {"__class__": "TextContent", "text": None}
    mcp, functions = _calls(_with_results({"weather-get_weather": "[TextContent(inner_content=" * 50_000}))
    assert "weather-get_weather" in functions and ("book_umbrella", True) in mcp


def test_the_collector_maps_both_frameworks_as_sent(tmp_path: Path) -> None:
    """Semantic Kernel's trace and log files replayed (each to its own endpoint); Mastra's OTLP/JSON as its exporter
    may send it, gzip and chunked: the stored conversations hold the user turns and MCP calls the files map to."""
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path)) as collector:
        files = [str(REAL / "semantic_kernel.otlp.json"), str(REAL / "semantic_kernel.logs.otlp.json")]
        proc = run(["replay", *files, "--endpoint", collector.http_url])
        assert proc.returncode == 0, proc.stderr

        def chunks() -> Iterator[bytes]:
            body = gzip.compress((REAL / "mastra.otlp.json").read_bytes())
            yield from (body[i:i + 4096] for i in range(0, len(body), 4096))

        reply = httpx.post(collector.http_url, content=chunks(), headers={
            "Content-Type": "application/json", "Content-Encoding": "gzip"})
        assert reply.status_code == 200, reply.text
        rows = wait_for(collector, "SELECT conversation_id, test_case FROM conversations WHERE conversation_id IN "
                                   "('conv-fw-semantic_kernel', 'conv-fw-mastra') ORDER BY 1", 2)
        for conversation_id, test_case in rows:
            turns = json.loads(test_case)["turns"]
            name = conversation_id.removeprefix("conv-fw-")
            users = [t["content"] for t in json.loads((REAL / f"{name}.expected.json").read_text())["turns"]
                     if t["role"] == "user"]
            assert [t["content"] for t in turns if t["role"] == "user"] == users, conversation_id
            calls = [(c["name"], bool(c["result"].get("isError"))) for t in turns
                     for c in t.get("mcp_tools_called") or []]
            assert calls == [("get_weather", False), ("get_weather", False), ("book_umbrella", True)], conversation_id
            # the page's "what the model was given": SK's system prompt is in its log records, Mastra's on the
            # step around each chat span
            page = httpx.get(f"{collector.admin_url}/conversations/{conversation_id}", timeout=30).text
            given = page.split("What the model was given", 1)[1].split("<h2", 1)[0]
            assert "You are a helpful weather assistant." in given, conversation_id
            if conversation_id == "conv-fw-semantic_kernel":  # offered on the agent span, two levels up
                assert "weather-get_weather" in given and "weather-book_umbrella" in given


def test_hostile_values_where_the_dialects_expect_text_leave_the_conversation_built() -> None:
    """A repr whose content type is a list, bytes or Ellipsis where text goes, and Mastra tool calls whose id and
    name are not strings: read as what they can be, never an error that keeps the conversation from being built."""
    hostile = ("[TextContent(inner_content=TextContent(type=['text'], text=b'\\xff'), text=...)]")
    mcp, functions = _calls(_with_results({"weather-get_weather": hostile}))
    assert "weather-get_weather" in functions and ("book_umbrella", True) in mcp
    spans = []
    for span in recorded_spans("mastra"):
        output = span.attributes.get("mastra.model_step.output")
        if output and "toolCalls" in output:
            body = json.loads(output)
            body["toolCalls"] = [{**c, "toolCallId": [1], "toolName": 5} for c in body["toolCalls"]]
            span = dataclasses.replace(span, attributes={**span.attributes,
                                                         "mastra.model_step.output": json.dumps(body)}, _parsed={})
        spans.append(span)
    [conversation] = build_conversations(spans)
    conversation.test_case.model_dump_json()  # storable
    assert [c.name for t in conversation.test_case.turns for c in t.mcp_tools_called or []] == [
        "get_weather", "get_weather", "book_umbrella"]
