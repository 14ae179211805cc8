"""DeepEval-style tests of the test-case model, written here: what a DeepEval user's own tests check about
`Turn` and `ConversationalTestCase` passes after changing the import to tracejudge."""

from __future__ import annotations

import warnings

import pytest

from scoring.errors import InvalidTestCaseError
from scoring.test_case import ConversationalTestCase, Turn, load_test_case


def _turns() -> list[Turn]:
    return [Turn(role="user", content="Book a table for two"), Turn(role="assistant", content="Booked for 19:00")]


def test_turn_takes_additional_metadata_under_every_spelling() -> None:
    assert Turn(role="user", content="hi", additional_metadata={"a": 1}).metadata == {"a": 1}
    assert Turn.model_validate({"role": "user", "content": "hi", "additionalMetadata": {"b": 2}}).metadata == {"b": 2}
    turn = Turn(role="user", content="hi", metadata={"c": 3})
    with pytest.warns(DeprecationWarning, match="use 'metadata'"):
        assert turn.additional_metadata == {"c": 3}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        turn.additional_metadata = {"d": 4}
    assert turn.metadata == {"d": 4}


def test_the_case_takes_deepevals_fields_and_detects_multimodal_placeholders() -> None:
    case = ConversationalTestCase(turns=_turns(), comments="flaky on Mondays", flaky=True,
                                  additional_metadata={"team": "search"})
    assert (case.comments, case.flaky, case.metadata, case.multimodal) == ("flaky on Mondays", True,
                                                                           {"team": "search"}, False)
    pictured = ConversationalTestCase(turns=[Turn(role="user", content="What is this? [DEEPEVAL:IMAGE:abc123]")])
    assert pictured.multimodal is True
    assert ConversationalTestCase.model_validate(case.model_dump()).comments == "flaky on Mondays"


def test_turns_are_copied_so_changing_one_afterwards_leaves_the_case_alone() -> None:
    turns = _turns()
    case = ConversationalTestCase(turns=turns)
    turns[0].content = "Cancel everything"
    turns.append(Turn(role="user", content="and one more"))
    assert case.turns[0].content == "Book a table for two" and len(case.turns) == 2


@pytest.mark.parametrize("kwargs, message", [
    ({"turns": []}, "'turns' must not be empty"),
    ({"turns": ["hello"]}, "'turns' must be a list of Turn or dict, got <class 'str'>"),
    ({"turns": [Turn(role="user", content="hi")], "context": "not a list"}, "'context' must be None or a list"),
    ({"turns": [Turn(role="user", content="hi")], "context": ["ok", 3]}, "'context' must be None or a list"),
])
def test_wrong_shapes_raise_type_error_with_deepevals_message(kwargs: dict, message: str) -> None:
    with pytest.raises(TypeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ConversationalTestCase(**kwargs)


def test_files_with_those_shapes_still_get_tracejudges_error_naming_the_problem() -> None:
    with pytest.raises(InvalidTestCaseError, match="'turns' must not be empty"):
        load_test_case({"turns": []})
