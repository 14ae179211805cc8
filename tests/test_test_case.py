from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from tests.support.cases import FLIGHTS_SERVER, three_task_case, two_turn_case
from tracejudge.errors import InvalidTestCaseError
from tracejudge.test_case import ConversationalTestCase, MCPToolCall, load_test_case


def test_camel_case_mcp_json_validates_and_dumps_back_losslessly() -> None:
    case = load_test_case(three_task_case())
    dumped = case.model_dump(mode="json")
    again = ConversationalTestCase.model_validate(json.loads(json.dumps(dumped)))
    assert again == case
    call = dumped["turns"][1]["mcp_tools_called"][0]
    assert call["result"]["structuredContent"] == {"flights": [{"id": "UA100"}, {"id": "DL200"}]}
    assert call["result"]["isError"] is False
    assert dumped["mcp_servers"][0]["available_tools"][0]["inputSchema"]["required"] == [
        "origin", "destination", "date"]
    assert dumped["mcp_servers"][0]["available_resources"][0]["mimeType"] == "application/json"


def test_unknown_protocol_fields_and_content_types_survive_the_round_trip() -> None:
    data = two_turn_case()
    result = data["turns"][1]["mcpToolsCalled"][0]["result"]
    result["_meta"] = {"trace": "abc"}
    result["content"].append({"type": "future_block", "payload": [1, 2]})
    case = load_test_case(data)
    dumped = case.model_dump(mode="json")["turns"][1]["mcp_tools_called"][0]["result"]
    assert dumped["_meta"] == {"trace": "abc"}
    assert {"type": "future_block", "payload": [1, 2]} in [
        {k: v for k, v in block.items() if v is not None} for block in dumped["content"]]
    assert load_test_case(case.model_dump(mode="json")) == case


def test_snake_case_protocol_names_are_accepted_too() -> None:
    call = MCPToolCall.model_validate(
        {"name": "t", "args": {}, "result": {"content": [], "structured_content": {"a": 1}, "is_error": True}})
    assert call.result is not None and call.result.is_error and call.result.structured_content == {"a": 1}


def test_live_mcp_types_objects_are_accepted() -> None:
    mcp_types = pytest.importorskip("mcp.types")
    result = mcp_types.CallToolResult(
        content=[mcp_types.TextContent(type="text", text="42")], structured_content={"result": 42}, is_error=False)
    tool = mcp_types.Tool(name="answer", input_schema={"type": "object", "properties": {}})
    case = ConversationalTestCase(
        turns=[{"role": "user", "content": "q"},
               {"role": "assistant", "content": "42", "mcp_tools_called": [MCPToolCall(name="answer", result=result)]}],
        mcp_servers=[{"server_name": "s", "available_tools": [tool]}],
    )
    assert case.turns[1].mcp_tools_called[0].result.structured_content == {"result": 42}
    assert case.mcp_servers[0].available_tools[0].input_schema == {"type": "object", "properties": {}}


def test_validation_errors_name_the_turn_and_field() -> None:
    data = three_task_case()
    data["turns"][4]["mcp_tools_called"][0]["args"] = "city=New York"
    data["turns"][6]["role"] = "system"
    with pytest.raises(InvalidTestCaseError) as info:
        load_test_case(data)
    problems = info.value.problems
    assert any(p.startswith("turn 4 (assistant), mcp_tools_called[0].args:") for p in problems), problems
    assert any(p.startswith("turn 6 (system), role:") for p in problems), problems


def test_unknown_fields_and_empty_turns_are_rejected() -> None:
    with pytest.raises(InvalidTestCaseError, match="at least one turn"):
        load_test_case({"turns": []})
    with pytest.raises(InvalidTestCaseError, match="tool_called"):
        load_test_case({"turns": [{"role": "user", "content": "x", "tool_called": []}]})
    with pytest.raises(InvalidTestCaseError, match="not valid JSON"):
        load_test_case("{turns: ")
    with pytest.raises(ValidationError):
        ConversationalTestCase(turns=[{"role": "robot", "content": "x"}])


def test_server_inventory_defaults_input_schema_to_an_object() -> None:
    server = dict(FLIGHTS_SERVER, available_tools=[{"name": "ping"}])
    case = load_test_case({"turns": [{"role": "user", "content": "hi"}], "mcp_servers": [server]})
    assert case.mcp_servers[0].available_tools[0].input_schema == {"type": "object"}


def test_a_turn_without_content_is_refused_as_deepeval_refuses_it_but_a_recorded_null_is_read() -> None:
    """`Turn(content=None)` raises (DeepEval's behaviour); a file or trace whose assistant message only called
    tools (content null) still loads, as the empty string."""
    from tracejudge.test_case import Turn

    with pytest.raises(ValidationError):
        Turn(role="user", content=None)
    case = load_test_case({"turns": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None}]})
    assert case.turns[1].content == ""
