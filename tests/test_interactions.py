from __future__ import annotations

import pytest

from tests.support.cases import three_task_case, two_turn_case
from tracejudge.errors import NoTaskError
from tracejudge.interactions import HIDDEN, split_tasks
from tracejudge.test_case import load_test_case


def test_two_turn_conversation_is_one_task_with_its_reply_text_kept() -> None:
    [task] = split_tasks(load_test_case(two_turn_case()))
    assert task.text == "Find flights from SFO to JFK on 2026-12-24."
    [step] = task.steps
    assert step["response_to_user"] == "UA 100 at 08:00 or DL 200 at 11:30."
    [call] = step["mcp_calls"]
    assert call["server"] == "flights" and call["name"] == "search_flights"
    assert call["visibility"] == HIDDEN
    assert call["result"]["structured_content"] == {"flights": [{"id": "UA100"}, {"id": "DL200"}]}


def test_units_join_consecutive_user_turns_and_take_every_following_assistant_turn() -> None:
    tasks = split_tasks(load_test_case(three_task_case()))
    assert [t.text for t in tasks] == [
        "Find flights from SFO to JFK on 2026-12-24.", "What's the weather in New York?", "Thanks!\nThat's all."]
    assert [len(t.steps) for t in tasks] == [2, 1, 1]
    assert [t.has_mcp_calls for t in tasks] == [True, True, False]
    assert tasks[1].steps[0]["mcp_calls"][0]["server"] == "weather"


def test_assistant_turns_before_the_first_user_turn_are_context_of_the_first_task() -> None:
    case = load_test_case({"turns": [
        {"role": "assistant", "content": "Hi, I can book flights."},
        {"role": "user", "content": "Book UA100."},
        {"role": "assistant", "content": "Done."},
    ]})
    [task] = split_tasks(case)
    assert task.context[0]["response_to_user"] == "Hi, I can book flights."
    assert [s["turn"] for s in task.steps] == [2]
    assert task.data()["assistant_turns_before_the_task"][0]["turn"] == 0


def test_trailing_user_turn_without_reply_is_an_unanswered_task() -> None:
    data = two_turn_case()
    data["turns"].append({"role": "user", "content": "Book the first one."})
    tasks = split_tasks(load_test_case(data))
    assert len(tasks) == 2 and not tasks[1].answered and tasks[1].steps == ()


def test_conversation_without_user_turn_has_no_task() -> None:
    with pytest.raises(NoTaskError, match="no user turn"):
        split_tasks(load_test_case({"turns": [{"role": "assistant", "content": "hello"}]}))


def test_results_of_any_shape_render_without_crashing() -> None:
    case = load_test_case({"turns": [
        {"role": "user", "content": "show me"},
        {"role": "assistant", "content": "", "mcp_tools_called": [
            {"name": "no_result_key", "args": {}, "result": {"structuredContent": {"temperature": 3}}},
            {"name": "failing", "args": {}, "result": {"content": [{"type": "text", "text": "boom"}],
                                                        "isError": True}},
            {"name": "mixed", "args": {}, "result": {"content": [
                {"type": "image", "data": "AAAA", "mimeType": "image/png"},
                {"type": "resource_link", "uri": "file:///a.txt", "name": "a"},
                {"type": "resource", "resource": {"uri": "file:///b.txt", "text": "inner text"}}]}},
            {"name": "unfinished", "args": {}},
        ], "mcp_resources_called": [{"uri": "file:///c", "result": {"contents": [
            {"uri": "file:///c", "text": "c body"}, {"uri": "file:///d", "blob": "AA", "mimeType": "image/png"}]}}],
         "mcp_prompts_called": [{"name": "p", "args": {"x": "1"}, "result": {"messages": [
            {"role": "user", "content": {"type": "text", "text": "prompt text"}}]}}]},
    ]})
    [task] = split_tasks(case)
    calls = task.steps[0]["mcp_calls"]
    by_name = {c.get("name") or c.get("uri"): c for c in calls}
    assert by_name["no_result_key"]["result"] == {"text": "", "structured_content": {"temperature": 3},
                                                  "is_error": False}
    assert by_name["failing"]["result"]["is_error"] is True
    assert by_name["mixed"]["result"]["text"] == "[image image/png]\n[resource link file:///a.txt]\ninner text"
    assert by_name["unfinished"]["result"] == "no result recorded"
    assert by_name["file:///c"]["result"]["text"] == "c body\n[binary image/png file:///d]"
    assert by_name["p"]["result"]["messages"] == [{"role": "user", "text": "prompt text"}]
