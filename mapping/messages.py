"""Chat messages as (role, parts), whatever shape a dialect stored them in.

The OTel GenAI parts format (`{"role", "parts": [{"type": "text"|"tool_call"|"tool_call_response", ...}]}`)
is the common form; the per-dialect modules turn their flattened or legacy encodings into it. Unknown
roles and part types are kept or skipped, never an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tracejudge.mapping.spans import as_list, as_text, by_fields, parse_json_value

ROLE_ALIASES = {"model": "assistant", "ai": "assistant", "human": "user", "developer": "system",
                "function": "tool"}


class Part(NamedTuple):
    """One part of a message (a NamedTuple: immutable, and a third of a frozen dataclass's cost to make, which a
    span's messages made by the dozen)."""

    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    arguments: Any = None
    result: Any = None


@dataclass(init=False)
class Message:
    """One message of a model's input or output. Its `__init__` is written out: compiled, a dataclass's generated
    one stays interpreted (`spans.Span`)."""

    role: str
    parts: list[Part] = field(default_factory=list)

    def __init__(self, role: str, parts: list[Part] | None = None) -> None:
        self.role = role
        self.parts = [] if parts is None else parts

    def __reduce__(self) -> tuple[Any, ...]:
        return by_fields(self)

    @property
    def text(self) -> str:
        return "\n".join(p.text for p in self.parts if p.type == "text" and p.text)

    @property
    def tool_calls(self) -> list[Part]:
        return [p for p in self.parts if p.type == "tool_call"]

    @property
    def tool_results(self) -> list[Part]:
        return [p for p in self.parts if p.type == "tool_call_response"]

    @property
    def is_user_text(self) -> bool:
        """A real user message: role user with text (tool results sent as role user do not count)."""
        return self.role == "user" and bool(self.text)


_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "tool": "tool"}  # already normal


def normalize_role(role: Any) -> str:
    known = _ROLES.get(role) if role.__class__ is str else None  # nearly every message: no new string to make
    if known is not None:
        return known
    text = str(role or "unknown").strip().lower()
    return ROLE_ALIASES.get(text, text)


def _text_of(content: Any) -> str | None:
    """Text from a content value: a string, a list of blocks, or a block."""
    content = parse_json_value(content)
    if content is None:
        return None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [t for t in (_text_of(c) for c in content) if t]
        return "\n".join(texts) if texts else None
    if isinstance(content, dict):
        for key in ("text", "content"):
            if isinstance(content.get(key), str):
                return content[key]
    return None


def parse_part(raw: Any) -> Part | None:
    if isinstance(raw, str):
        return Part("text", text=raw)
    if not isinstance(raw, dict):
        return None
    kind = str(raw.get("type") or ("text" if "content" in raw or "text" in raw else "unknown"))
    if kind == "text":
        return Part("text", text=_text_of(raw.get("content", raw.get("text"))) or "")
    if kind in ("tool_call", "function_call", "tool_use"):
        return Part("tool_call", id=as_text(raw.get("id")), name=as_text(raw.get("name")),
                    arguments=parse_json_value(raw.get("arguments", raw.get("input"))))
    if kind in ("tool_call_response", "function_call_output", "tool_result"):
        result = raw.get("response", raw.get("result", raw.get("content", raw.get("output"))))
        return Part("tool_call_response", id=as_text(raw.get("id", raw.get("tool_call_id"))),
                    name=as_text(raw.get("name")), result=parse_json_value(result))
    return Part(kind)


def parse_message(raw: Any) -> Message | None:
    """One message in the OTel parts format, or the older `{role, content, tool_calls}` form."""
    if not isinstance(raw, dict):
        return None
    role = normalize_role(raw.get("role"))
    parts: list[Part] = []
    if isinstance(raw.get("parts"), list):
        parts = [p for p in (parse_part(p) for p in raw["parts"]) if p is not None]
    else:
        text = _text_of(raw.get("content"))
        if text:
            parts.append(Part("text", text=text))
        for call in as_list(raw.get("tool_calls")):
            if isinstance(call, dict):
                function: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else call
                parts.append(Part("tool_call", id=as_text(call.get("id")), name=as_text(function.get("name")),
                                  arguments=parse_json_value(function.get("arguments"))))
        if role == "tool" and raw.get("id", raw.get("tool_call_id")) is not None:
            parts = [Part("tool_call_response", id=as_text(raw.get("id", raw.get("tool_call_id"))),
                          result=parse_json_value(raw.get("content")))]
    if role == "user" and parts and all(p.type == "tool_call_response" for p in parts):
        role = "tool"  # pydantic-ai before v6 and ADK send tool results as user messages
    return Message(role, parts)


def parse_messages(value: Any) -> list[Message]:
    """A messages attribute (JSON string or structured list) as Messages; anything else gives []."""
    value = parse_json_value(value)
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        return []
    return [m for m in (parse_message(v) for v in value) if m is not None]


def last_user_text(messages: list[Message]) -> str | None:
    for message in reversed(messages):
        if message.is_user_text:
            return message.text
    return None


def newest_user_text(raw_messages: list[Any]) -> str | None:
    """The last user text of a recorded message list, parsing from the end only as far as it takes (a run's
    input can hold the whole history)."""
    for raw in raw_messages[::-1]:  # (mypyc cannot compile reversed() over a list of Any)
        message = parse_message(raw)
        if message is not None and message.is_user_text:
            return message.text
    return None


def final_assistant_text(messages: list[Message]) -> str | None:
    for message in reversed(messages):
        if message.role == "assistant" and message.text:
            return message.text
    return None
