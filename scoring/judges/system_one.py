"""The System One judge interface: answer typed questions about one JSON state, with probabilities.

Two implementations: `TypeSafeJudge` (TypeSafe's Jev, or any server speaking its `/v1/systemone` wire
protocol) and `LogprobJudge` (letter logprobs of any OpenAI-compatible chat model, uncalibrated).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from tracejudge.judges.questions import Answer, Question


@dataclass(frozen=True)
class Decision:
    """Every question's answer, the versioned model id that answered, and what it cost."""

    answers: dict[str, Answer]
    model: str
    input_tokens: int
    output_tokens: int
    cost: float | None
    requests: int
    calibrated: bool = True

    def share(self, prefix: str, of_questions: int) -> Decision:
        """This decision's answers under `prefix.` with the prefix removed, and their share of the cost."""
        mine = {k.removeprefix(prefix + "."): a for k, a in self.answers.items() if k.startswith(prefix + ".")}
        part = len(mine) / of_questions if of_questions else 0.0
        return replace(
            self,
            answers=mine,
            input_tokens=round(self.input_tokens * part),
            output_tokens=round(self.output_tokens * part),
            cost=None if self.cost is None else self.cost * part,
        )


@runtime_checkable
class SystemOneJudge(Protocol):
    """What the metrics need from a decision model."""

    @property
    def id(self) -> str: ...

    def session(self) -> AbstractAsyncContextManager[None]: ...

    async def decide(self, state: Any, questions: Mapping[str, Question]) -> Decision: ...
