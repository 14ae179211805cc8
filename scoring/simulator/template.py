"""The simulated user's prompts, and the expected-outcome check. A custom template subclasses
ConversationSimulatorTemplate and overrides a static method, as DeepEval's custom templates do; each returns the
prompt text, and the answer is JSON: `{"simulated_input": ...}` or `{"is_complete": ..., "reason": ...}`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def _who(golden: Any) -> str:
    """Who the user is: the golden's persona (tagged, as its text may hold anything), else its description."""
    persona = getattr(golden, "persona", None)
    if persona is not None:
        return "\n" + persona.prompt_block()
    return golden.user_description or "not given"


def _transcript(turns: Sequence[Any]) -> str:
    return json.dumps([{"role": t.role, "content": t.content} for t in turns], ensure_ascii=False, indent=2)


class ConversationSimulatorTemplate:
    @staticmethod
    def simulate_first_user_turn(golden: Any, language: str) -> str:
        return (
            f"You play a user talking to an AI assistant, in {language}. Write the user's first message.\n"
            f"Scenario (what the user wants): {golden.scenario}\n"
            f"Who the user is: {_who(golden)}\n"
            "Write only what this user would type: no explanations, no quotes, and never say you are simulated.\n"
            'Answer with JSON: {"simulated_input": "<the message>"}'
        )

    @staticmethod
    def simulate_user_turn(golden: Any, turns: Sequence[Any], language: str) -> str:
        return (
            f"You play a user talking to an AI assistant, in {language}. Write the user's next message.\n"
            f"Scenario (what the user wants): {golden.scenario}\n"
            f"Who the user is: {_who(golden)}\n"
            f"The conversation so far:\n{_transcript(turns)}\n"
            "Reply to the assistant's last message as this user would, to get what the scenario says; do not repeat "
            "yourself, and never say you are simulated.\n"
            'Answer with JSON: {"simulated_input": "<the message>"}'
        )

    @staticmethod
    def check_expected_outcome(turns: Sequence[Any], expected_outcome: str) -> str:
        return (
            "Decide whether a conversation between a user and an AI assistant has reached its expected outcome.\n"
            f"Expected outcome: {expected_outcome}\n"
            f"The conversation:\n{_transcript(turns)}\n"
            'Answer with JSON: {"is_complete": true or false, "reason": "<one sentence>"}'
        )
