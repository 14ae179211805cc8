"""What one model call was given besides the conversation: its system prompt and the tools it was offered.

Read through the same dialects as the conversation (every framework records these its own way), so the page
that shows them and the mapping never disagree on what a span says.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tracejudge.mapping.conversation import span_facts
from tracejudge.mapping.dialects import LLMCall
from tracejudge.mapping.spans import Span

SYSTEM_ATTRIBUTES = ("gen_ai.system_instructions",)  # the GenAI conventions' own place for the system prompt


@dataclass(frozen=True)
class OfferedTool:
    name: str
    description: str | None
    input_schema: dict[str, Any] | None


@dataclass(frozen=True)
class ModelInputs:
    """A model call's system prompt (None: none recorded) and offered tools, in the order recorded."""

    span_id: str
    trace_id: str
    start_ns: int
    model: str | None
    system: str | None
    tools: tuple[OfferedTool, ...]

    @property
    def tools_text(self) -> str:
        """The offered tools as stable text, so two calls' lists can be compared line by line."""
        return "\n".join(f"{t.name}: {t.description or ''} {json.dumps(t.input_schema, sort_keys=True)}"
                         for t in self.tools)


def _read(span: Span) -> tuple[LLMCall | None, tuple[OfferedTool, ...]]:
    """The span's model call (if it is one) and the tools it lists, as the conversation reads them."""
    facts = span_facts(span)
    tools: dict[str, OfferedTool] = {}
    for definition in facts.definitions:  # one dialect's listing may name a tool twice: the first is shown
        tools.setdefault(definition.name, OfferedTool(definition.name, definition.description,
                                                      definition.input_schema))
    return facts.llm, tuple(tools.values())


def offered_tools(span: Span) -> tuple[OfferedTool, ...]:
    """The tools a span lists as offered, model call or not (an agent span may list them for its calls)."""
    return _read(span)[1]


def model_inputs(span: Span) -> ModelInputs | None:
    """The system prompt and offered tools of a model-call span; None for a span that is no model call."""
    llm, tools = _read(span)
    if llm is None:
        return None
    system = "\n\n".join(m.text for m in llm.input if m.role in ("system", "developer") and m.text)
    if not system:
        system = "\n\n".join(filter(None, (_text(span.genai_json(key)) for key in SYSTEM_ATTRIBUTES)))
    model = span.str_attr("gen_ai.request.model") or span.str_attr("gen_ai.response.model")
    return ModelInputs(span.span_id, span.trace_id, span.start_ns, model, system or None, tools)


def _text(value: Any) -> str | None:
    """Text of a system-instructions value: a string, or GenAI parts (`[{"type": "text", "content": ...}]`)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = [part.get("content") or part.get("text") for part in value if isinstance(part, dict)]
        return "\n".join(t for t in texts if isinstance(t, str)) or None
    return None
