"""Feedback on a conversation sent to `POST /api/feedback`: the model at that boundary, and the
`gen_ai.evaluation.result` attributes it is stored as (the same event an OTLP log record carries)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

FEEDBACK_SHAPE = ('{"conversation_id": "...", "name": "user_feedback", "value": 1, "label": "thumbs_up", '
                  '"comment": "..."}')


class FeedbackIn(BaseModel):
    """One piece of feedback: a name (what is judged), a value and/or a label, an optional comment."""

    model_config = ConfigDict(extra="forbid")

    conversation_id: str = Field(min_length=1, max_length=512)
    name: str = Field("user_feedback", min_length=1, max_length=128)
    value: float | None = None
    label: str | None = Field(None, max_length=128)
    comment: str | None = Field(None, max_length=8192)

    def attributes(self) -> dict[str, Any]:
        """The semconv attributes of the evaluation event, marked as sent to the API."""
        given = {"gen_ai.evaluation.score.value": self.value, "gen_ai.evaluation.score.label": self.label,
                 "gen_ai.evaluation.explanation": self.comment}
        return {"gen_ai.evaluation.name": self.name, "tracejudge.feedback.source": "api",
                **{key: value for key, value in given.items() if value is not None}}
