"""Strict parsing of a judge's answer: exactly one JSON object that validates against the output model.

Nothing is repaired or clamped: prose around the object, a second object or a score outside [0, 1]
is an error, so an invalid answer is retried and never scored.
"""

from __future__ import annotations

import json
import re
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tracejudge.errors import JudgeOutputError

_FENCE = re.compile(r"^```(?:json)?\s*\n(?P<body>.*)\n\s*```$", re.DOTALL)


class ScoreVerdict(BaseModel):
    """A judged score in [0, 1] with its reason."""

    model_config = ConfigDict(extra="ignore")
    reason: str = Field(strict=True)
    score: float = Field(strict=True, ge=0.0, le=1.0)


class ReasonVerdict(BaseModel):
    """A final reason text."""

    model_config = ConfigDict(extra="ignore")
    reason: str = Field(strict=True)


T = TypeVar("T", bound=BaseModel)


def parse_output(text: str | None, model: type[T]) -> T:
    """The judge's text as `model`, or JudgeOutputError saying exactly what was wrong."""
    if text is None or not text.strip():
        raise JudgeOutputError("the judge returned an empty answer")
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group("body").strip()
    try:
        value = json.loads(body, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise JudgeOutputError(f"the judge's answer is not one JSON object ({exc.msg} at char {exc.pos}): "
                               f"{_excerpt(text)}") from exc
    if not isinstance(value, dict):
        raise JudgeOutputError(f"the judge's answer is JSON but not an object: {_excerpt(text)}")
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'answer'}: {e['msg']}" for e in exc.errors())
        raise JudgeOutputError(f"the judge's answer does not match the schema ({problems}): "
                               f"{_excerpt(text)}") from exc


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    keys = [k for k, _ in pairs]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise JudgeOutputError(f"the judge's answer repeats the key(s) {', '.join(duplicates)}")
    return dict(pairs)


def _excerpt(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."
