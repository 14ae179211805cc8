"""Goldens to test cases and back, one list at a time: a golden is what to run, a test case what came of it, and
DeepEval's users move between the two with these functions (`deepeval.dataset.utils`)."""

from __future__ import annotations

from collections.abc import Sequence

from tracejudge.dataset import ConversationalGolden, Golden
from tracejudge.test_case import ConversationalTestCase, LLMTestCase


def convert_convo_goldens_to_convo_test_cases(goldens: Sequence[ConversationalGolden]) -> list[ConversationalTestCase]:
    """Each golden as a test case of its turns so far; the persona becomes the case's `user_description`."""
    return [ConversationalTestCase(turns=list(g.turns or []), scenario=g.scenario, expected_outcome=g.expected_outcome,
                                   user_description=g.user_description, context=g.context, name=g.name,
                                   metadata=g.metadata, comments=g.comments) for g in goldens]


def convert_convo_test_cases_to_convo_goldens(cases: Sequence[ConversationalTestCase]) -> list[ConversationalGolden]:
    """Each test case as a golden (`ConversationalGolden.from_test_case`), with no deprecation warning."""
    return [ConversationalGolden.from_test_case(case) for case in cases]


def convert_goldens_to_test_cases(goldens: Sequence[Golden]) -> list[LLMTestCase]:
    """Each single-turn golden as a test case with what it recorded."""
    return [LLMTestCase(input=g.input, actual_output=g.actual_output, expected_output=g.expected_output,
                        context=g.context, retrieval_context=g.retrieval_context, tools_called=g.tools_called,
                        expected_tools=g.expected_tools, name=g.name, comments=g.comments, metadata=g.metadata)
            for g in goldens]


def convert_test_cases_to_goldens(cases: Sequence[LLMTestCase]) -> list[Golden]:
    """Each single-turn test case as a golden (`Golden.from_test_case`)."""
    return [Golden.from_test_case(case) for case in cases]
