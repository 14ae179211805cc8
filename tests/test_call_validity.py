from __future__ import annotations

import copy

import pytest

from tests.support.cases import FLIGHTS_SERVER, search_call, three_task_case, two_turn_case
from tracejudge import MCPCallValidityMetric
from tracejudge.test_case import ConversationalTestCase


def _case(*assistant_turns: dict, servers: list | None = None) -> dict:
    turns = [{"role": "user", "content": "Plan my trip."}, *assistant_turns]
    return {"turns": turns, "mcp_servers": [FLIGHTS_SERVER] if servers is None else servers}


def _measure(case: dict) -> MCPCallValidityMetric:
    metric = MCPCallValidityMetric()
    metric.measure(case)
    return metric


def test_valid_calls_score_one_without_any_judge() -> None:
    metric = _measure(three_task_case())
    assert metric.score == 1.0 and metric.success is True
    assert metric.reason.startswith("2 of 2 MCP calls are valid.")
    assert metric.evaluation_cost == 0.0


def test_unknown_tool_is_a_violation() -> None:
    metric = _measure(_case({"role": "assistant", "content": "", "mcp_tools_called": [
        search_call(), {"name": "cancel_flight", "args": {"id": "UA100"}}]}))
    assert metric.score == 0.5
    assert "- turn 1, tool cancel_flight: tool not advertised by any MCP server" in metric.reason


def test_arguments_that_break_the_input_schema_are_listed_with_the_schema_error() -> None:
    bad = search_call(origin="San Francisco")
    del bad["args"]["date"]
    metric = _measure(_case({"role": "assistant", "content": "", "mcp_tools_called": [bad]}))
    assert metric.score == 0.0 and metric.success is False
    assert "turn 1, tool search_flights: arguments do not match inputSchema: 'date' is a required property" \
        in metric.reason
    assert "at origin: 'San Francisco' is too long" in metric.reason
    [row] = metric.score_breakdown["calls"]
    assert row["valid"] is False and len(row["violations"]) == 2


def test_error_results_are_violations() -> None:
    failing = search_call()
    failing["result"] = {"content": [{"type": "text", "text": "upstream timeout"}], "isError": True}
    metric = _measure(_case({"role": "assistant", "content": "", "mcp_tools_called": [failing]}))
    assert metric.score == 0.0
    assert "the call returned an error (isError): upstream timeout" in metric.reason


def test_identical_repeated_call_in_one_task_is_flagged_but_not_across_tasks() -> None:
    same_task = _case({"role": "assistant", "content": "", "mcp_tools_called": [search_call()]},
                      {"role": "assistant", "content": "", "mcp_tools_called": [search_call()]})
    metric = _measure(same_task)
    assert metric.score == 0.5
    assert "turn 2, tool search_flights: repeats the identical call of turn 1 in the same task" in metric.reason
    across = copy.deepcopy(same_task)
    across["turns"].insert(2, {"role": "user", "content": "Again please."})
    assert _measure(across).score == 1.0
    other_args = _case({"role": "assistant", "content": "", "mcp_tools_called": [search_call(),
                                                                                 search_call(date="2026-12-25")]})
    assert _measure(other_args).score == 1.0


def test_resources_and_prompts_are_checked_against_the_inventory() -> None:
    metric = _measure(_case({"role": "assistant", "content": "",
                             "mcp_resources_called": [{"uri": "flights://airports"}, {"uri": "flights://secret"}],
                             "mcp_prompts_called": [{"name": "itinerary", "args": {"style": "short", "tone": "x"}}]}))
    assert metric.score == pytest.approx(1 / 3)
    assert "resource flights://secret: resource not advertised by any MCP server" in metric.reason
    assert "prompt itinerary: missing required prompt arguments: flight_id" in metric.reason
    assert "prompt itinerary: arguments the prompt does not declare: tone" in metric.reason


def test_without_an_inventory_only_results_and_repeats_are_checked() -> None:
    metric = _measure(_case({"role": "assistant", "content": "",
                             "mcp_tools_called": [{"name": "anything", "args": {"x": 1}}]}, servers=[]))
    assert metric.score == 1.0 and metric.score_breakdown["lists_seen"] == []
    assert "No MCP server inventory was given" in metric.reason


def test_conversation_without_mcp_calls_is_not_applicable() -> None:
    metric = _measure({"turns": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
    assert metric.score is None and metric.success is None and not metric.applicable
    assert metric.is_successful() and "not applicable" in metric.reason


def test_strict_mode_and_threshold_apply_to_validity_too() -> None:
    case = _case({"role": "assistant", "content": "", "mcp_tools_called": [search_call(), {"name": "nope"}]})
    strict = MCPCallValidityMetric(strict_mode=True)
    assert strict.measure(case) == 0.0 and strict.success is False
    lenient = MCPCallValidityMetric(threshold=0.4)
    assert lenient.measure(case) == 0.5 and lenient.success is True
    assert MCPCallValidityMetric(include_reason=False).measure(two_turn_case()) == 1.0


def test_an_invalid_server_schema_is_noted_not_blamed_on_the_call() -> None:
    server = copy.deepcopy(FLIGHTS_SERVER)
    server["available_tools"][0]["inputSchema"] = {"type": "objekt"}
    metric = _measure(_case({"role": "assistant", "content": "", "mcp_tools_called": [search_call()]},
                            servers=[server]))
    assert metric.score == 1.0
    assert "inputSchema is itself invalid" in metric.score_breakdown["calls"][0]["notes"][0]


def test_each_servers_own_schema_judges_its_calls_however_often_a_tool_name_comes_back() -> None:
    """Checked schemas are reused across conversations (checking one costs 50x validating a call): two servers
    with a tool of the same name and different schemas, and an invalid one, must each be judged by their own."""
    strict = copy.deepcopy(FLIGHTS_SERVER)
    strict["available_tools"][0]["inputSchema"]["properties"]["origin"] = {"type": "integer"}
    broken = copy.deepcopy(FLIGHTS_SERVER)
    broken["available_tools"][0]["inputSchema"] = {"type": "objekt"}
    calls = {"role": "assistant", "content": "", "mcp_tools_called": [search_call()]}
    for _ in range(2):
        assert _measure(_case(calls)).score == 1.0
        judged = _measure(_case(calls, servers=[strict]))
        assert judged.score == 0.0 and "at origin: 'SFO' is not of type 'integer'" in judged.reason
        noted = _measure(_case(calls, servers=[broken]))
        assert noted.score == 1.0 and "itself invalid" in noted.score_breakdown["calls"][0]["notes"][0]


def test_a_kind_whose_list_was_never_seen_cannot_make_a_call_not_advertised() -> None:
    """The shipped pydantic-ai trace holds a tools/list only: its resource read and prompt get are not flagged,
    and the only invalid call is the one the server failed."""
    from pathlib import Path

    from tracejudge.mapping import build_conversations, decode_otlp

    trace = Path(__file__).parent / "fixtures" / "real" / "pydantic_ai_mcp.otlp.json"
    [conversation] = [c for c in build_conversations(decode_otlp(trace.read_bytes(), "application/json").spans)
                      if c.conversation_id == "conv-weather-0001"]
    metric = MCPCallValidityMetric()
    metric.measure(conversation.test_case)
    assert metric.score == 0.75
    assert metric.score_breakdown["lists_seen"] == ["tools"]
    invalid = [(c["kind"], c["name"]) for c in metric.score_breakdown["calls"] if not c["valid"]]
    assert invalid == [("tool", "book_umbrella")]
    assert "resources or prompts" in metric.reason


def test_a_resource_matching_an_advertised_template_is_advertised() -> None:
    case = ConversationalTestCase.model_validate({
        "turns": [{"role": "user", "content": "read"},
                  {"role": "assistant", "content": "ok", "mcp_resources_called": [
                      {"uri": "weather://cities/Paris"}, {"uri": "weather://other"}]}],
        "mcp_servers": [{"server_name": "w", "available_resource_templates": [
            {"uriTemplate": "weather://cities/{city}", "name": "city"}]}]})
    metric = MCPCallValidityMetric()
    metric.measure(case)
    assert [c["valid"] for c in metric.score_breakdown["calls"]] == [True, False]
    assert metric.score_breakdown["inventory_known"] == {"tools": False, "resources": True, "prompts": False}


def test_a_hostile_uri_template_is_not_matched_rather_than_backtracked() -> None:
    from tracejudge.call_validity import _template_pattern

    assert _template_pattern("{+a}x" * 8) is None  # eight `.*` would backtrack for seconds on "x" * 40
    merged = _template_pattern("{+a}" * 8 + "x")  # adjacent wildcards merge into one, so it stays linear
    assert merged is not None and merged.pattern.count(".*") == 1 and merged.fullmatch("aaax")
    assert _template_pattern("x" * 600) is None
    assert _template_pattern("files://{+path}").fullmatch("files://a/b/c")
    assert _template_pattern("w://{a}{b}/x").fullmatch("w://ab/x")
