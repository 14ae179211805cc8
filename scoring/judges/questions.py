"""Typed System One questions (yes/no, choice, score levels), their wire form, and answers read from probabilities.

Values and confidences are always computed here from the probabilities, whatever a server says, so every
backend is read the same way: yes/no value P(yes), confidence |2p - 1|; K options or levels, confidence
(K * p_max - 1) / (K - 1); a score's value is its expected level / (K - 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from tracejudge.errors import JudgeOutputError

Kind = Literal["yes_no", "choice", "score"]


@dataclass(frozen=True)
class YesNo:
    """A yes/no question (the wire type `noul`), with optional descriptions of each outcome."""

    instructions: str
    yes: str | None = None
    no: str | None = None
    kind: Kind = "yes_no"

    @property
    def options(self) -> dict[str, str | None]:
        return {"yes": self.yes, "no": self.no}

    def wire(self) -> dict[str, Any]:
        question: dict[str, Any] = {"type": "noul", "instructions": self.instructions}
        if self.yes is not None or self.no is not None:
            question["criteria"] = {"true": self.yes, "false": self.no}
        return question


@dataclass(frozen=True)
class Choice:
    """Pick one label; each label may carry a description."""

    instructions: str
    choices: tuple[tuple[str, str | None], ...]
    kind: Kind = "choice"

    @property
    def options(self) -> dict[str, str | None]:
        return dict(self.choices)

    def wire(self) -> dict[str, Any]:
        return {"type": "choice", "instructions": self.instructions, "criteria": dict(self.choices)}


@dataclass(frozen=True)
class ScoreLevels:
    """An ordered scale, lowest level first; level i scores i."""

    instructions: str
    levels: tuple[str, ...]
    kind: Kind = "score"

    @property
    def options(self) -> dict[str, str | None]:
        return {str(i): level for i, level in enumerate(self.levels)}

    def wire(self) -> dict[str, Any]:
        return {"type": "score", "instructions": self.instructions, "criteria": list(self.levels)}


Question = YesNo | Choice | ScoreLevels


@dataclass(frozen=True)
class Answer:
    """One answered question: the distribution over its options and what follows from it."""

    kind: Kind
    size: int
    probabilities: dict[str, float]
    value: float
    confidence: float
    most_likely: str
    expected_level: float | None = None
    server_confidence: float | None = None

    @property
    def passes(self) -> bool:
        """The strict-mode test: yes at P >= 0.5; a score whose most likely level is the top one."""
        if self.kind == "yes_no":
            return self.value >= 0.5
        if self.kind == "score":
            return self.most_likely == str(self.size - 1)
        return True


def _margin_confidence(probabilities: dict[str, float]) -> float:
    k = len(probabilities)
    return max(0.0, (k * max(probabilities.values()) - 1) / (k - 1))


def answer_from_probabilities(question: Question, probabilities: dict[str, float],
                              server_confidence: float | None = None) -> Answer:
    """Normalise a distribution over the question's options (clamped, missing as 0) into an Answer."""
    options = list(question.options)
    clean = {}
    for option in options:
        p = probabilities.get(option, 0.0)
        clean[option] = min(1.0, max(0.0, p)) if isinstance(p, int | float) and math.isfinite(p) else 0.0
    total = sum(clean.values())
    if total <= 0:
        raise JudgeOutputError(f"the System One answer gives no probability to any option of {options}")
    dist = {o: p / total for o, p in clean.items()}
    most_likely = max(options, key=lambda o: dist[o])
    if question.kind == "yes_no":
        p_yes = dist["yes"]
        return Answer("yes_no", 2, dist, p_yes, abs(2 * p_yes - 1), most_likely, server_confidence=server_confidence)
    confidence = _margin_confidence(dist)
    if question.kind == "score":
        expected = sum(int(o) * p for o, p in dist.items())
        value = min(1.0, max(0.0, expected / (len(options) - 1)))
        return Answer("score", len(options), dist, value, confidence, most_likely, expected, server_confidence)
    return Answer("choice", len(options), dist, dist[most_likely], confidence, most_likely,
                  server_confidence=server_confidence)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def parse_wire_answer(key: str, question: Question, raw: Any) -> Answer:
    """Read one answer of the TypeSafe wire format, tolerating the field variants compatible servers send."""
    if not isinstance(raw, dict):
        raise JudgeOutputError(f"System One answer {key!r} is not an object: {raw!r:.200}")
    server_conf = _number(raw.get("confidence"))
    probs = raw.get("probabilities")
    if question.kind == "yes_no":
        p = next((v for v in (_number(raw.get(f)) for f in ("noul", "probability", "p")) if v is not None), None)
        if p is None and isinstance(probs, dict):
            p = _number(probs.get("true"))
        if p is None:
            raise JudgeOutputError(f"System One answer {key!r} has no probability of yes: {raw!r:.200}")
        return answer_from_probabilities(question, {"yes": p, "no": 1.0 - p}, server_conf)
    if isinstance(probs, dict) and probs:
        numeric = {str(k): v for k, v in probs.items() if _number(v) is not None}
        return answer_from_probabilities(question, numeric, server_conf)
    if question.kind == "score" and (expected := _number(raw.get("score"))) is not None:
        top = len(question.levels) - 1
        level = min(top, max(0, round(expected)))
        value = min(1.0, max(0.0, expected / top))
        return Answer("score", len(question.levels), {}, value, server_conf or 0.0, str(level), expected, server_conf)
    raise JudgeOutputError(f"System One answer {key!r} has no probabilities: {raw!r:.200}")
