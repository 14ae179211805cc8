"""The one interface every span dialect implements: what a span says about the conversation, if anything.

Each method returns None (or []) when the dialect has nothing to say about the span; the builder asks the
dialects in order of richness and takes the first answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from tracejudge.mapping.messages import Message
from tracejudge.mapping.spans import Span, by_fields


@dataclass
class AgentRun:
    """A span that is one agent run (one assistant turn), with what it knows of its input and output."""

    agent_name: str | None = None
    input_text: str | None = None
    output_text: str | None = None
    history: list[Message] | None = None  # the whole history, when the run span carries it
    new_from: int | None = None  # index in `history` where this run's messages start


@dataclass
class LLMCall:
    input: list[Message]
    output: list[Message]


@dataclass(init=False)
class ToolExecution:
    """A tool being run (agent side): name, call id, arguments and result as recorded. Its `__init__` and the
    others' here are written out: compiled, a dataclass's generated one stays interpreted (`spans.Span`)."""

    name: str
    call_id: str | None = None
    arguments: Any = None
    result: Any = None
    error: bool = False
    error_message: str | None = None
    mcp: bool = False
    server: str | None = None

    def __init__(self, name: str, call_id: str | None = None, arguments: Any = None, result: Any = None,
                 error: bool = False, error_message: str | None = None, mcp: bool = False,
                 server: str | None = None) -> None:
        self.name = name
        self.call_id = call_id
        self.arguments = arguments
        self.result = result
        self.error = error
        self.error_message = error_message
        self.mcp = mcp
        self.server = server

    def __reduce__(self) -> tuple[Any, ...]:
        return by_fields(self)


Side = Literal["client", "server"]


@dataclass(init=False)
class MCPOperation:
    """An MCP JSON-RPC operation seen on the wire: tools/call, resources/read, prompts/get, */list."""

    method: str
    side: Side | None = None
    target: str | None = None  # tool or prompt name, or resource URI
    arguments: Any = None
    result: Any = None
    error: bool = False
    error_message: str | None = None
    request_id: str | None = None
    server: str | None = None
    listed: list[dict[str, Any]] = field(default_factory=list)  # */list results

    def __init__(self, method: str, side: Side | None = None, target: str | None = None, arguments: Any = None,
                 result: Any = None, error: bool = False, error_message: str | None = None,
                 request_id: str | None = None, server: str | None = None,
                 listed: list[dict[str, Any]] | None = None) -> None:
        self.method = method
        self.side = side
        self.target = target
        self.arguments = arguments
        self.result = result
        self.error = error
        self.error_message = error_message
        self.request_id = request_id
        self.server = server
        self.listed = [] if listed is None else listed

    def __reduce__(self) -> tuple[Any, ...]:
        return by_fields(self)


@dataclass(frozen=True)
class ToolDefinition:
    """A tool the model was offered; `mcp` when the span says it came from an MCP server (`server`, if named).
    Frozen: one parsed listing serves every span that repeats it."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    mcp: bool = False
    server: str | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        return by_fields(self)


class Dialect:
    name: ClassVar[str]

    def applies(self, span: Span) -> bool:
        raise NotImplementedError

    def exclusive(self, span: Span) -> bool:
        """Whether this dialect's answers are all there is to read of the span: the dialects after it, which
        would read the span's generic attributes another way, are not asked."""
        return False

    def agent_run(self, span: Span) -> AgentRun | None:
        return None

    def llm_call(self, span: Span) -> LLMCall | None:
        return None

    def tool_execution(self, span: Span) -> ToolExecution | None:
        return None

    def mcp_operation(self, span: Span) -> MCPOperation | None:
        return None

    def tool_definitions(self, span: Span) -> list[ToolDefinition]:
        return []


def span_error(span: Span) -> tuple[bool, str | None]:
    """Failed if the status is ERROR, error.type says so (`tool_error` included) or `gen_ai.tool.status` is error."""
    error_type = span.str_attr("error.type")
    failed = span.is_error or error_type is not None or span.str_attr("gen_ai.tool.status") == "error"
    message = span.status_message or (error_type if error_type not in (None, "tool_error") else None)
    return failed, message or None


def schema_like(value: Any) -> bool:
    return isinstance(value, dict) and ("properties" in value or value.get("type") == "object"
                                        or "$schema" in value)
