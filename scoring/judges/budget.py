"""System One's context budget, checked before sending: about 32k tokens for the state plus the longest
question, 64k per request, estimating one token per 3 characters of JSON (as DeepEval does)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tracejudge.errors import ContextBudgetError
from tracejudge.judges.questions import Question


def estimate_tokens(value: Any) -> int:
    return math.ceil(len(json.dumps(value, ensure_ascii=False, default=str)) / 3)


@dataclass(frozen=True)
class Budget:
    state_and_question: int = 32_000
    request: int = 64_000

    def fits(self, state_tokens: int, question_tokens: list[int]) -> bool:
        return (state_tokens + max(question_tokens, default=0) <= self.state_and_question
                and state_tokens + sum(question_tokens) <= self.request)

    def plan(self, state: Any, questions: Mapping[str, Question]) -> list[list[str]]:
        """The question keys of each request: as few requests as fit; ContextBudgetError if none can."""
        state_tokens = estimate_tokens(state)
        sizes = {key: estimate_tokens(q.wire()) for key, q in questions.items()}
        longest = max(sizes.values(), default=0)
        if state_tokens + longest > self.state_and_question:
            raise ContextBudgetError(
                f"the conversation is too large for System One: its state is about {state_tokens:,} tokens "
                f"(characters / 3) and the longest question {longest:,}, over the {self.state_and_question:,}-"
                "token limit for state plus question; score it with eval_mode='llm'"
            )
        requests: list[list[str]] = [[]]
        used = state_tokens
        for key, size in sizes.items():
            if requests[-1] and used + size > self.request:
                requests.append([])
                used = state_tokens
            requests[-1].append(key)
            used += size
        return requests


DEFAULT_BUDGET = Budget()
