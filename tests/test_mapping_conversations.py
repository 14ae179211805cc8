"""build_conversations over each dialect and the edge cases: exact turns, calls and servers."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest

from tests.fixtures import semconv_scenarios as scenarios
from tests.support.otlp_json import request, span, tid
from tracejudge.mapping import build_conversations, compose_conversation, decode_otlp, map_traces
from tracejudge.mapping.spans import Span
from tracejudge.test_case import ConversationalTestCase


def spans_of(body: dict[str, Any]) -> list[Span]:
    decoded = decode_otlp(json.dumps(body), "application/json")
    assert decoded.problems == []
    return decoded.spans


def one(body: dict[str, Any], **kw: Any):
    [conversation] = build_conversations(spans_of(body), **kw)
    return conversation


def shape(tc: ConversationalTestCase) -> list[dict[str, Any]]:
    """Turns reduced to what a user checks: role, content, and each call's kind, target, args, result, error."""
    out = []
    for t in tc.turns:
        row: dict[str, Any] = {"role": t.role, "content": t.content}
        calls = []
        for c in t.mcp_tools_called or []:
            text = "\n".join(b.text or "" for b in c.result.content) if c.result else None
            calls.append(("tool", c.name, c.args, text, c.result.is_error if c.result else None))
        for r in t.mcp_resources_called or []:
            calls.append(("resource", r.uri, None, r.result.contents[0].text if r.result else None, None))
        for p in t.mcp_prompts_called or []:
            calls.append(("prompt", p.name, p.args, None, None))
        for f in t.tools_called or []:
            calls.append(("function", f.name, f.input_parameters, f.output, None))
        if calls:
            row["calls"] = calls
        out.append(row)
    return out


WEATHER = ("tool", "get-weather", {"city": "Paris"}, "Rainy, 14°C", False)
UMBRELLA = ("tool", "book-umbrella", {"qty": 1}, "No umbrellas left", True)


def test_otel_genai_and_mcp_semconv_two_traces_one_conversation() -> None:
    c = one(scenarios.otel_genai())
    assert (c.conversation_id, c.key, c.service_name, c.agent_name) == (
        "conv_42", "gen_ai.conversation.id", "weather-agent", "weather-agent")
    assert c.trace_ids == (tid(1), tid(2))
    assert shape(c.test_case) == [
        {"role": "user", "content": scenarios.USER_1},
        {"role": "assistant", "content": scenarios.REPLY_1, "calls": [WEATHER]},
        {"role": "user", "content": scenarios.USER_2},
        {"role": "assistant", "content": scenarios.REPLY_2, "calls": [
            UMBRELLA, ("resource", "file:///forecasts/paris.md", None, None, None),
            ("prompt", "summarize-forecast", {"city": "Paris"}, None, None)]},
    ]
    [server] = c.test_case.mcp_servers
    assert server.server_name == "weather-mcp"  # the server span's service, not the address the client dialled
    tools = {t.name: t for t in server.available_tools}
    assert tools["get-weather"].description == "Weather now"
    assert tools["get-weather"].input_schema["properties"] == {"city": {"type": "string"}}


def test_openinference_tool_spans_and_flattened_messages() -> None:
    c = one(scenarios.openinference())
    assert (c.conversation_id, c.key, c.agent_name) == ("conv_42", "session.id", "weather-agent")
    assert shape(c.test_case) == [
        {"role": "user", "content": scenarios.USER_1},
        {"role": "assistant", "content": scenarios.REPLY_1, "calls": [WEATHER]},
    ]
    [server] = c.test_case.mcp_servers
    assert server.server_name == "weather-mcp"
    assert [t.name for t in server.available_tools] == ["book-umbrella", "get-weather"]


def test_openllmetry_workflows_indexed_prompts_and_mcp_instrumentation() -> None:
    c = one(scenarios.openllmetry())
    assert (c.conversation_id, c.key) == ("conv_42", "traceloop.association.properties.session_id")
    assert shape(c.test_case) == [
        {"role": "user", "content": scenarios.USER_1},
        {"role": "assistant", "content": scenarios.REPLY_1, "calls": [WEATHER]},  # client + server .tool merged
        {"role": "user", "content": scenarios.USER_2},
        {"role": "assistant", "content": scenarios.REPLY_2, "calls": [
            UMBRELLA, ("resource", "file:///forecasts/paris.md", None, "Rain.", None),
            ("prompt", "summarize-forecast", {"city": "Paris"}, None, None)]},
    ]
    [server] = c.test_case.mcp_servers
    tools = {t.name: t for t in server.available_tools}
    assert set(tools) == {"get-weather", "book-umbrella"}
    assert tools["get-weather"].input_schema["required"] == ["city"]  # from llm.request.functions


def test_pydantic_ai_history_from_new_message_index() -> None:
    history = [
        {"role": "user", "parts": [{"type": "text", "content": "first question"}]},
        {"role": "assistant", "parts": [{"type": "text", "content": "first answer"}]},
        {"role": "user", "parts": [{"type": "text", "content": "Weather in Paris?"}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "get_weather",
                                         "arguments": {"city": "Paris"}}]},
        {"role": "user", "parts": [{"type": "tool_call_response", "id": "c1", "name": "get_weather",
                                    "result": "Rainy"}]},
        {"role": "assistant", "parts": [{"type": "thinking", "content": "..."},
                                        {"type": "text", "content": "It is rainy."}]},
    ]
    body = request(({"service.name": "pai"}, [
        span(7, 1, "invoke_agent weather", start=0, end=50, attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "weather", "gen_ai.conversation.id": "c-9",
            "pydantic_ai.all_messages": history, "pydantic_ai.new_message_index": 2,
            "final_result": "It is rainy."}),
        span(7, 2, "execute_tool get_weather", 1, start=10, end=20, attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather", "gen_ai.tool.call.id": "c1",
            "gen_ai.tool.call.arguments": {"city": "Paris"}, "gen_ai.tool.call.result": "Rainy"}),
    ]))
    c = one(body, servers=[{"server_name": "weather", "available_tools": [{"name": "get_weather"}]}])
    assert shape(c.test_case) == [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "It is rainy.", "calls": [("tool", "get_weather", {"city": "Paris"},
                                                                    "Rainy", False)]},
    ]
    assert c.test_case.mcp_servers[0].server_name == "weather"


def test_plain_function_tools_go_to_tools_called() -> None:
    body = request(({}, [
        span(3, 1, "invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent",
                                                 "gen_ai.input.messages": [{"role": "user",
                                                                            "parts": [{"type": "text",
                                                                                       "content": "add 2+2"}]}],
                                                 "gen_ai.output.messages": [{"role": "assistant", "parts": [
                                                     {"type": "text", "content": "4"}]}]}, end=10),
        span(3, 2, "execute_tool add", 1, start=1, attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "add",
            "gen_ai.tool.call.arguments": {"a": 2, "b": 2}, "gen_ai.tool.call.result": 4}),
    ]))
    c = one(body)
    assert shape(c.test_case)[1]["calls"] == [("function", "add", {"a": 2, "b": 2}, 4, None)]
    assert c.test_case.mcp_servers == []


def test_adk_tool_attributes_and_gemini_contents() -> None:
    body = request(({"service.name": "adk"}, [
        span(4, 1, "invoke_agent helper", end=40, attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "helper",
            "gen_ai.conversation.id": "adk-session"}),
        span(4, 2, "call_llm", 1, start=1, attributes={
            "gen_ai.system": "gcp.vertex.agent",
            "gcp.vertex.agent.llm_request": {"contents": [{"role": "user", "parts": [{"text": "Weather Rome?"}]}]},
            "gcp.vertex.agent.llm_response": {"content": {"role": "model", "parts": [
                {"function_call": {"id": "f1", "name": "get_weather", "args": {"city": "Rome"}}}]}}}),
        span(4, 3, "execute_tool get_weather", 1, start=5, attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather", "gen_ai.tool.type": "McpTool",
            "gen_ai.tool.call.id": "f1", "gcp.vertex.agent.tool_call_args": {"city": "Rome"},
            "gcp.vertex.agent.tool_response": {"result": "Sunny"}}),
        span(4, 4, "call_llm", 1, start=10, attributes={
            "gcp.vertex.agent.llm_request": {"contents": [
                {"role": "user", "parts": [{"text": "Weather Rome?"}]},
                {"role": "user", "parts": [{"function_response": {"id": "f1", "name": "get_weather",
                                                                  "response": {"result": "Sunny"}}}]}]},
            "gcp.vertex.agent.llm_response": {"content": {"role": "model", "parts": [{"text": "Sunny in Rome."}]}}}),
    ]))
    c = one(body)
    assert c.conversation_id == "adk-session"
    rows = shape(c.test_case)
    assert rows[0] == {"role": "user", "content": "Weather Rome?"}
    assert rows[1]["content"] == "Sunny in Rome."
    assert rows[1]["calls"][0][:3] == ("tool", "get_weather", {"city": "Rome"})


def test_integers_past_64_bits_in_arguments_and_results_stay_exact() -> None:
    """Order and account numbers past 64 bits are kept as the integers they are (read as floats they lost their last
    digits, and the conversation's content hash with them)."""
    big = 123456789012345678901234567890
    body = request(({}, [
        span(3, 1, "invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent",
                                                 "gen_ai.input.messages": [{"role": "user", "parts": [
                                                     {"type": "text", "content": "find my order"}]}]}, end=10),
        span(3, 2, "execute_tool find_order", 1, start=1, attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "find_order",
            "gen_ai.tool.call.arguments": {"order": big}, "gen_ai.tool.call.result": {"order": -big, "n": 2 ** 64}}),
    ]))
    c = one(body)
    assert shape(c.test_case)[1]["calls"] == [("function", "find_order", {"order": big},
                                               {"order": -big, "n": 2 ** 64}, None)]
    assert str(big) in c.stored_json() and str(2 ** 64) in c.stored_json()


def test_deprecated_per_message_events() -> None:
    body = request(({}, [span(5, 1, "chat gpt-4", kind=3, attributes={"gen_ai.system": "openai"}, events=[
        {"name": "gen_ai.system.message", "attributes": {"content": "be nice"}},
        {"name": "gen_ai.user.message", "attributes": {"content": "hello there"}},
        {"name": "gen_ai.choice", "attributes": {"index": 0, "finish_reason": "stop",
                                                 "message": {"content": "hi!", "role": "assistant"}}},
    ])]))
    c = one(body)
    assert c.key == "trace_id" and c.conversation_id == tid(5)
    assert shape(c.test_case) == [{"role": "user", "content": "hello there"},
                                  {"role": "assistant", "content": "hi!"}]


def test_spans_out_of_order_split_across_exports_and_redelivered() -> None:
    body = scenarios.otel_genai()
    all_spans = spans_of(body)
    expected = one(body)
    shuffled = list(all_spans)
    random.Random(7).shuffle(shuffled)
    halves = [shuffled[: len(shuffled) // 2], shuffled[len(shuffled) // 2:]]
    redelivered = halves[0] + halves[1] + halves[0]
    [again] = build_conversations(redelivered)
    assert again.test_case == expected.test_case
    assert again.content_hash == expected.content_hash


def test_content_hash_changes_when_a_late_span_adds_content() -> None:
    body = scenarios.otel_genai()
    spans = spans_of(body)
    late = [s for s in spans if s.name == "execute_tool book-umbrella"]
    early = [s for s in spans if s not in late]
    [before] = build_conversations(early)
    [after] = build_conversations(early + late)
    assert before.content_hash != after.content_hash


def test_ten_or_more_indexed_messages_sort_numerically() -> None:
    attributes: dict[str, Any] = {"openinference.span.kind": "LLM"}
    for i in range(12):
        attributes[f"llm.input_messages.{i}.message.role"] = "user" if i % 2 == 0 else "assistant"
        attributes[f"llm.input_messages.{i}.message.content"] = f"m{i}"
    attributes["llm.output_messages.0.message.role"] = "assistant"
    attributes["llm.output_messages.0.message.content"] = "final"
    c = one(request(({}, [span(6, 1, "llm", attributes=attributes)])))
    assert shape(c.test_case)[0] == {"role": "user", "content": "m10"}  # the last user message, not m8


def test_truncated_json_unknown_roles_and_parts_and_a_call_without_result() -> None:
    truncated = '{"city": "Par'
    body = request(({}, [
        span(8, 1, "invoke_agent x", end=30, attributes={"gen_ai.operation.name": "invoke_agent"}),
        span(8, 2, "chat m", 1, start=1, attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.input.messages": [
                {"role": "critic", "parts": [{"type": "text", "content": "odd role"}]},
                {"role": "user", "parts": [{"type": "hologram", "payload": 1}, {"type": "text", "content": "go"}]}],
            "gen_ai.output.messages": [{"role": "assistant", "parts": [
                {"type": "tool_call", "id": "t1", "name": "search", "arguments": truncated}]}]}),
        span(8, 3, "tools/call search", 1, kind=3, start=5, attributes={
            "mcp.method.name": "tools/call", "gen_ai.tool.name": "search"}),
    ]))
    c = one(body)
    rows = shape(c.test_case)
    assert rows[0] == {"role": "user", "content": "go"}
    assert rows[1]["calls"] == [("tool", "search", {}, None, None)]  # no result recorded, never invented
    notes = c.test_case.turns[1].metadata["mapping_notes"]
    assert "arguments of search are not a JSON object" in notes[0] and truncated in notes[0]


def test_huge_attribute_values_survive() -> None:
    big = "x" * 2_000_000
    body = request(({}, [span(9, 1, "chat m", kind=3, attributes={
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": [{"role": "user", "parts": [{"type": "text", "content": big}]}],
        "gen_ai.output.messages": [{"role": "assistant", "parts": [{"type": "text", "content": "ok"}]}]})]))
    c = one(body)
    assert len(c.test_case.turns[0].content) == 2_000_000


def test_conversations_without_content_are_left_out_and_results_validate() -> None:
    only_housekeeping = request(({}, [span(10, 1, "initialize", kind=2, attributes={"mcp.method.name": "initialize"})]))
    assert build_conversations(spans_of(only_housekeeping)) == []
    for scenario in (scenarios.otel_genai, scenarios.openinference, scenarios.openllmetry):
        for c in build_conversations(spans_of(scenario())):
            assert ConversationalTestCase.model_validate(c.test_case.model_dump(mode="json")) == c.test_case


@pytest.mark.parametrize("key", ["session.id", "traceloop.association.properties.session_id",
                                 "gcp.vertex.agent.session_id", "langsmith.trace.session_id", "mcp.session.id"])
def test_conversation_key_precedence(key: str) -> None:
    user = [{"role": "user", "parts": [{"type": "text", "content": "q"}]}]
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.input.messages": user, key: "K"}
    c = one(request(({}, [span(11, 1, "chat", attributes=attrs)])))
    assert (c.key, c.conversation_id) == (key, "K")
    both = {**attrs, "gen_ai.conversation.id": "G"}
    c = one(request(({}, [span(12, 1, "chat", attributes=both)])))
    assert (c.key, c.conversation_id) == ("gen_ai.conversation.id", "G")


def test_resource_attributes_give_the_key_when_spans_do_not() -> None:
    user = [{"role": "user", "parts": [{"type": "text", "content": "q"}]}]
    c = one(request(({"session.id": "from-resource"}, [
        span(13, 1, "chat", attributes={"gen_ai.operation.name": "chat", "gen_ai.input.messages": user})])))
    assert (c.key, c.conversation_id) == ("session.id", "from-resource")


# --- requested vs executed calls, positional arguments, legacy events, [mapping] mcp_tools -----------------


def _chat(trace: int, span_id: int, parent: int, start: int, inputs: list, outputs: list) -> dict[str, Any]:
    return span(trace, span_id, "chat m", parent, kind=3, start=start, attributes={
        "gen_ai.operation.name": "chat", "gen_ai.input.messages": inputs, "gen_ai.output.messages": outputs})


def _agent(trace: int, user: str) -> dict[str, Any]:
    return span(trace, 1, "invoke_agent a", start=0, end=100, attributes={
        "gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "c1",
        "gen_ai.input.messages": [{"role": "user", "parts": [{"type": "text", "content": user}]}]})


def _parts(*parts: dict[str, Any], role: str = "assistant") -> list[dict[str, Any]]:
    return [{"role": role, "parts": list(parts)}]


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_call", "id": call_id, "name": name, "arguments": args}


def test_a_requested_call_that_never_ran_is_kept_apart_and_never_scored() -> None:
    asked = _call("c9", "delete_repo", {"name": "x"})
    body = request(({"service.name": "a"}, [
        _agent(1, "Delete it"),
        _chat(1, 2, 1, 1, _parts({"type": "text", "content": "Delete it"}, role="user"), _parts(asked)),
        _chat(1, 3, 1, 50, _parts({"type": "text", "content": "Delete it"}, role="user"),
              _parts({"type": "text", "content": "I stopped before deleting."})),
    ]))
    [conversation] = build_conversations(spans_of(body), mcp_tools={"github": ["delete_repo"]})
    assistant = conversation.test_case.turns[1]
    assert assistant.mcp_tools_called is None and assistant.tools_called is None
    assert assistant.metadata["calls_not_executed"] == [{"name": "delete_repo", "args": {"name": "x"},
                                                         "call_id": "c9"}]
    from tracejudge import MCPCallValidityMetric
    metric = MCPCallValidityMetric()
    metric.measure(conversation.test_case)
    assert metric.applicable is False  # no MCP call was made, so there is nothing to judge


def test_a_request_and_its_execution_without_an_id_are_one_call_with_the_named_arguments() -> None:
    """LangChain-style: the tool span has no call id and only a positional input; the model named the argument."""
    paris, london = _call("c1", "get_weather", {"city": "Paris"}), _call("c2", "get_weather", {"city": "London"})
    tool = {"type": "tool_call_response"}
    body = request(({"service.name": "a"}, [
        _agent(1, "Weather?"),
        _chat(1, 2, 1, 1, _parts({"type": "text", "content": "Weather?"}, role="user"), _parts(paris, london)),
        span(1, 3, "get_weather", 1, start=10, attributes={
            "openinference.span.kind": "TOOL", "tool.name": "get_weather", "input.value": "London",
            "output.value": "London: 15°C"}),
        span(1, 4, "get_weather", 1, start=11, attributes={
            "openinference.span.kind": "TOOL", "tool.name": "get_weather", "input.value": '{"input": "Paris"}',
            "output.value": "Paris: 18°C"}),
        _chat(1, 5, 1, 20, _parts({**tool, "id": "c1", "response": "Paris: 18°C"},
                                  {**tool, "id": "c2", "response": "London: 15°C"}, role="tool"),
              _parts({"type": "text", "content": "Done."})),
    ]))
    [conversation] = build_conversations(spans_of(body), mcp_tools={"weather": ["get_weather"]})
    calls = conversation.test_case.turns[1].mcp_tools_called
    assert [(c.name, c.args, c.result.content[0].text) for c in calls] == [
        ("get_weather", {"city": "Paris"}, "Paris: 18°C"), ("get_weather", {"city": "London"}, "London: 15°C")]
    assert conversation.test_case.turns[1].metadata.get("calls_not_executed") is None


def test_turns_from_the_older_gen_ai_prompt_and_completion_events() -> None:
    body = request(({"service.name": "a"}, [span(1, 1, "openai.chat", kind=3, attributes={
        "gen_ai.operation.name": "chat", "gen_ai.conversation.id": "c2"}, events=[
        {"name": "gen_ai.content.prompt", "attributes": {"gen_ai.prompt": "Hello there"}},
        {"name": "gen_ai.content.completion", "attributes": {"gen_ai.completion": "Hi!"}}])]))
    [conversation] = build_conversations(spans_of(body))
    assert [(t.role, t.content) for t in conversation.test_case.turns] == [("user", "Hello there"),
                                                                           ("assistant", "Hi!")]


def test_mcp_tools_setting_decides_and_explain_says_why() -> None:
    call = _call("c1", "lookup", {"q": "x"})
    body = request(({"service.name": "a"}, [
        _agent(1, "Find x"),
        _chat(1, 2, 1, 1, _parts({"type": "text", "content": "Find x"}, role="user"), _parts(call)),
        span(1, 3, "execute_tool lookup", 1, start=5, attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup", "gen_ai.tool.call.id": "c1",
            "gen_ai.tool.call.arguments": {"q": "x"}, "gen_ai.tool.call.result": "found",
            "gen_ai.tool.status": "error"}),
    ]))
    [plain] = build_conversations(spans_of(body))
    assert [t.name for t in plain.test_case.turns[1].tools_called] == ["lookup"]  # no MCP evidence: a function
    [named] = build_conversations(spans_of(body), mcp_tools={"search": ["lookup"]}, explain=True)
    [tool] = named.test_case.turns[1].mcp_tools_called
    assert tool.result.is_error  # gen_ai.tool.status = error
    [server] = named.test_case.mcp_servers
    assert server.server_name == "search" and [t.name for t in server.available_tools] == ["lookup"]
    calls = named.explanation[1]["calls"]
    assert calls[0]["mcp_rule"] == "named for server 'search' in [mapping] mcp_tools"
    assert any("execute_tool lookup" in s for s in calls[0]["sources"])


def test_replayed_history_never_claims_a_call_of_this_run() -> None:
    """Run 2's first LLM input replays run 1's get_weather(Paris); its tool span (no id, no arguments) is the
    London call run 2's second LLM asked for, not a second Paris call."""
    paris, clock = _call("x1", "get_weather", {"city": "Paris"}), _call("y1", "get_time", {})
    london = _call("y2", "get_weather", {"city": "London"})
    history = _parts({"type": "text", "content": "Weather?"}, role="user") + _parts(paris) + _parts(
        {"type": "tool_call_response", "id": "x1", "response": "sunny"}, role="tool") + _parts(
        {"type": "text", "content": "And London?"}, role="user")
    body = request(({"service.name": "a"}, [
        _agent(2, "And London?"),
        _chat(2, 2, 1, 1, history, _parts(clock)),
        _chat(2, 3, 1, 5, history, _parts(london)),
        span(2, 4, "execute_tool get_weather", 1, start=10, attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather",
            "gen_ai.tool.call.result": "rainy"}),
    ]))
    [conversation] = build_conversations(spans_of(body), mcp_tools={"weather": ["get_weather", "get_time"]})
    calls = conversation.test_case.turns[1].mcp_tools_called
    assert [(c.name, c.args) for c in calls] == [("get_weather", {"city": "London"})]
    assert conversation.test_case.turns[1].metadata["calls_not_executed"][0]["name"] == "get_time"


def test_a_plain_tool_is_not_renamed_into_an_mcp_tool_it_resembles() -> None:
    body = request(({"service.name": "a"}, [
        _agent(1, "Find x"),
        span(1, 2, "execute_tool search", 1, start=5, attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search", "gen_ai.tool.call.id": "c1",
            "gen_ai.tool.call.result": "found"}),
        span(1, 3, "tools/list", 1, kind=3, start=1, attributes={"mcp.method.name": "tools/list"}),
    ]))
    [conversation] = build_conversations(spans_of(body), servers=[
        {"server_name": "brave", "available_tools": [{"name": "brave_search"}]}])
    turn = conversation.test_case.turns[1]
    assert turn.mcp_tools_called is None and [t.name for t in turn.tools_called] == ["search"]


def test_changing_a_built_case_changes_neither_the_spans_nor_the_next_case_built_from_them() -> None:
    nested = {"where": {"city": "Paris", "days": [1, 2]}}
    body = request(({}, [
        span(3, 1, "invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent",
                                                 "gen_ai.tool.definitions": [{"name": "forecast", "parameters": {
                                                     "type": "object", "properties": {"where": {"type": "object"}}}}],
                                                 "gen_ai.input.messages": [{"role": "user", "parts": [
                                                     {"type": "text", "content": "plan my week"}]}],
                                                 "gen_ai.output.messages": [{"role": "assistant", "parts": [
                                                     {"type": "text", "content": "done"}]}]}, end=10),
        span(3, 2, "tools/call forecast", 1, start=1, kind=2, attributes={
            "mcp.method.name": "tools/call", "gen_ai.tool.name": "forecast", "gen_ai.tool.call.arguments": nested,
            "gen_ai.tool.call.result": {"content": [{"type": "text", "text": "rain"}], "isError": False}}),
        span(3, 3, "execute_tool plan", 1, start=2, attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "plan",
            "gen_ai.tool.call.arguments": nested, "gen_ai.tool.call.result": {"steps": [{"day": 1}]}}),
    ]))
    spans = spans_of(body)
    [first] = build_conversations(spans)
    expected = copy.deepcopy(shape(first.test_case))
    turn = first.test_case.turns[1]
    assert turn.mcp_tools_called and turn.tools_called, "the case needs an MCP call and a function call"
    turn.mcp_tools_called[0].args["where"]["days"].append(3)
    turn.mcp_tools_called[0].result.content.clear()
    turn.tools_called[0].input_parameters["where"]["city"] = "Rome"
    turn.tools_called[0].output["steps"][0]["day"] = 9
    [tool] = first.test_case.mcp_servers[0].available_tools
    assert tool.name == "forecast" and "where" in tool.input_schema["properties"]
    tool.input_schema["properties"]["where"]["type"] = "string"
    [again] = build_conversations(spans)
    assert shape(again.test_case) == expected
    assert again.content_hash == first.content_hash


def test_a_conversation_composed_from_its_traces_mapped_apart_is_the_one_mapped_whole() -> None:
    """The collector maps a conversation's new trace alone and composes it with the earlier traces' mapped parts.
    Two turns that started at the same moment keep one order however the parts come, and composing with one
    setting does not leave a renamed call behind for the next composition."""
    body = request(({"service.name": "a"}, [
        _agent(1, "Weather?"),
        span(1, 2, "execute_tool weather__get_weather", 1, start=5, attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "weather__get_weather",
            "gen_ai.tool.call.id": "c1", "gen_ai.tool.call.result": "sunny"}),
        _agent(2, "And tomorrow?"),
    ]))
    spans = spans_of(body)
    first, second = (map_traces([s for s in spans if s.trace_id == tid(n)]) for n in (1, 2))
    named = {"weather": ["get_weather"]}
    [whole] = build_conversations(spans, mcp_tools=named)
    for parts in (first + second, second + first):
        composed = compose_conversation(parts, mcp_tools=named)
        assert composed is not None and composed.content_hash == whole.content_hash
    assert [t.content for t in whole.test_case.turns if t.role == "user"] == ["Weather?", "And tomorrow?"]
    assert [c.name for c in whole.test_case.turns[1].mcp_tools_called] == ["get_weather"]
    [plain] = build_conversations(spans)
    alone = compose_conversation(first + second)
    assert alone is not None and alone.content_hash == plain.content_hash
    assert [c.name for c in alone.test_case.turns[1].tools_called] == ["weather__get_weather"]


def test_a_listing_entry_mcp_refuses_is_left_out_and_the_conversation_is_still_built() -> None:
    """A `tools/list` result whose one entry has a schema that is no object: the other tools are listed, and the
    conversation is built (it failed whole, and was retried after every quiet period)."""
    listed = {"tools": [{"name": "get_weather", "inputSchema": {"type": "object"}},
                        {"name": "broken", "inputSchema": "not a schema"}]}
    body = request(({"service.name": "a"}, [
        _agent(1, "What is the weather?"),
        span(1, 3, "tools/list.mcp", 1, kind=3, start=1, attributes={"traceloop.entity.output": json.dumps(listed)}),
    ]))
    [conversation] = build_conversations(spans_of(body))
    [server] = conversation.test_case.mcp_servers
    assert [t.name for t in server.available_tools] == ["get_weather"]
    assert conversation.test_case.turns[0].content == "What is the weather?"
