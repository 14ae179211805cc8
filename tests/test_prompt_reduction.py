"""Prompt reduction: deterministic, explicit about what it cut, and only as much as the budget needs."""

from __future__ import annotations

import copy
import json

from tracejudge.judges.tokens import BpeCounter, counter_for_model
from tracejudge.prompt_reduction import cut_middle, reduce_to_fit


def measure(data: dict) -> int:
    return BpeCounter("o200k_base").count(json.dumps(data))


def task(result: str, steps: int = 1) -> dict:
    return {"task": "Summarise the file.", "steps": [
        {"turn": i + 1, "mcp_calls": [{"kind": "tool", "name": "read_file", "arguments": {"path": f"/f{i}"},
                                       "result": {"text": result, "is_error": False}}],
         "response_to_user": f"Summary {i}."} for i in range(steps)]}


def test_cut_middle_keeps_head_and_tail_and_says_how_much_went() -> None:
    text, omitted = cut_middle("a" * 50 + "b" * 900 + "c" * 50, 100)
    assert omitted == 900
    assert text == "a" * 50 + "\n[... 900 characters omitted ...]\n" + "c" * 50
    assert cut_middle("short", 100) == ("short", 0)


def test_data_within_budget_is_returned_unchanged() -> None:
    data = task("small result")
    assert reduce_to_fit(data, measure, 10_000, "o200k_base") == (data, None)


def test_reduction_is_the_first_level_that_fits_and_is_deterministic() -> None:
    data = task("word " * 40_000)
    original = copy.deepcopy(data)
    first, reduction = reduce_to_fit(data, measure, 6_000, "o200k_base")
    again, _ = reduce_to_fit(data, measure, 6_000, "o200k_base")
    assert first == again and data == original  # same prompt every time; the input is not modified
    assert reduction is not None and reduction.fits and reduction.tokens_after <= 6_000 < reduction.tokens_before
    assert reduction.value_cap_chars == 20_000  # the gentlest cut that fits, not the harshest
    assert reduction.values_cut == 1 and reduction.characters_omitted == 200_000 - 20_000
    assert first["steps"][0]["mcp_calls"][0]["arguments"] == {"path": "/f0"}  # small values untouched


def test_many_small_rows_become_cut_json_text() -> None:
    data = task("x")
    data["steps"][0]["mcp_calls"][0]["result"] = {"rows": [{"id": i, "v": "r"} for i in range(20_000)]}
    reduced, reduction = reduce_to_fit(data, measure, 8_000, "o200k_base")
    rows = reduced["steps"][0]["mcp_calls"][0]["result"]["rows"]
    assert isinstance(rows, str) and rows.startswith('[{"id": 0, "v": "r"}') and "characters omitted" in rows
    assert rows.endswith('{"id": 19999, "v": "r"}]')
    assert reduction is not None and reduction.fits


def test_a_very_long_conversation_keeps_its_first_and_last_steps() -> None:
    data = task("r" * 300, steps=400)
    reduced, reduction = reduce_to_fit(data, measure, 3_000, "o200k_base")
    assert reduction is not None and reduction.fits and reduction.steps_omitted > 0
    turns = [s.get("turn") for s in reduced["steps"]]
    assert turns[0] == 1 and turns[-1] == 400
    marker = next(s for s in reduced["steps"] if "omitted" in s)
    assert marker["omitted"] == f"[... {reduction.steps_omitted} steps omitted ...]"
    assert len(reduced["steps"]) == 400 - reduction.steps_omitted + 1


def test_counters_know_openai_models_and_estimate_the_rest() -> None:
    assert counter_for_model("gpt-5.4").name == "o200k_base" and counter_for_model("gpt-5.4").exact
    assert counter_for_model("gpt-4-0613").name == "cl100k_base"
    other = counter_for_model("llama3.1:8b")
    assert not other.exact and other.count("hello world " * 100) > BpeCounter("o200k_base").count("hello world " * 100)
    text = "naïve café — 東京 " * 1000
    for counter in (counter_for_model("gpt-4o"), other):
        assert counter.count(text) <= counter.upper_bound(text)
