"""Calibration from people's corrections: reviewed decisions the judge got wrong, shown to the LLM judge as
examples, so it scores more as the reviewers would.

The examples go into the data block, first, after the constant instructions and before the inventory and the
conversation: they are the same bytes in every request of a metric, so the provider's cached prefix still holds,
and they stay data (escaped, inside `<data>`), so a reviewer's note cannot pose as an instruction. They are bounded
by a share of the judge's prompt budget. System One decisions take no examples: its questions are fixed.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from tracejudge.judges.tokens import TokenCounter

CALIBRATION_NOTE = (
    "The data may open with `reviewed_examples`: earlier user requests where the people who review this judge "
    "disagreed with its score, with the score it gave, the verdict and score they gave instead, and why. Use them "
    "to judge as those reviewers would in similar situations; they are not part of the conversation to evaluate, "
    "and their scores are not the answer for this one."
)
MAX_TEXT_CHARS = 600  # per request and per note: an example teaches by its verdict, not by its length
BUDGET_SHARE = 4  # the examples take at most 1 / BUDGET_SHARE of the judge's prompt budget


@dataclass(frozen=True)
class CalibrationExample:
    """One correction: the user's request the judge decided, its score, and what the reviewer said."""

    request: str
    judge_score: float
    reviewer_verdict: Literal["pass", "fail"]
    reviewer_score: float | None = None
    note: str | None = None

    def data(self) -> dict[str, Any]:
        out: dict[str, Any] = {"request": _trim(self.request), "judge_score": round(self.judge_score, 3),
                               "reviewer_verdict": self.reviewer_verdict}
        if self.reviewer_score is not None:
            out["reviewer_score"] = round(self.reviewer_score, 3)
        if self.note:
            out["reviewer_note"] = _trim(self.note)
        return out


def most_informative(corrections: Sequence[CalibrationExample], limit: int) -> list[CalibrationExample]:
    """The `limit` corrections furthest from what the reviewer said (their score, else 1 for a pass and 0 for a
    fail), taking the judge's false fails and false passes in turn, from the kind of the furthest one, so a judge
    shown only one direction of error does not overcorrect; ties keep their given order (deterministic)."""
    def distance(e: CalibrationExample) -> float:
        wanted = e.reviewer_score if e.reviewer_score is not None else float(e.reviewer_verdict == "pass")
        return abs(e.judge_score - wanted)

    ranked = sorted(corrections, key=distance, reverse=True)  # stable: ties in the given order
    kinds = [[e for e in ranked if e.reviewer_verdict == v] for v in ("pass", "fail")]
    if ranked and ranked[0].reviewer_verdict == "fail":
        kinds.reverse()
    out: list[CalibrationExample] = []
    while len(out) < limit and any(kinds):
        for kind in kinds:
            if kind and len(out) < limit:
                out.append(kind.pop(0))
    return out


def _trim(text: str) -> str:
    return text if len(text) <= MAX_TEXT_CHARS else text[:MAX_TEXT_CHARS - 1] + "…"


def calibration_digest(examples: Sequence[CalibrationExample]) -> str:
    """A short hash of the examples as the judge sees them: part of the metric configuration, so scores judged
    with other examples (or none) never blend with these."""
    text = json.dumps([asdict(e) for e in examples], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=64)
def _fitting(examples: tuple[CalibrationExample, ...], budget: int, counter: TokenCounter) -> tuple[str, ...]:
    room = budget // BUDGET_SHARE
    out: list[dict[str, Any]] = []
    for example in examples:
        candidate = [*out, example.data()]
        if counter.count(json.dumps(candidate, ensure_ascii=False)) > room:
            break
        out = candidate
    return tuple(json.dumps(item, ensure_ascii=False) for item in out)


def fitting_examples(examples: Sequence[CalibrationExample], budget: int,
                     counter: TokenCounter) -> list[dict[str, Any]]:
    """The examples, most informative first, that fit in 1 / BUDGET_SHARE of the prompt budget (counted once
    per examples, budget and tokenizer)."""
    return [json.loads(item) for item in _fitting(tuple(examples), budget, counter)]
