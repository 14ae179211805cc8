"""Semantic Kernel (Python): its GenAI diagnostics name a plugin's functions `<plugin>-<function>` and record a
function's result as `str()` of SK's content objects. An MCP plugin's functions wrap the MCP SDK's own objects
(`inner_content=TextContent(type='text', ...)`, `PromptMessage(...)`), and that is the only sign that a function
is an MCP tool, or that a prompt the plugin offered the model as a function was fetched: SK records no MCP span
(it needs mcp 1.x) and drops `isError`. The messages themselves come as log records (`otlp_logs`).

Read here: an MCP plugin function's call as an MCP tool call (server = the plugin) or, when its result is prompt
messages, as a prompt get; its result unwrapped to MCP content; an error where the MCP Python SDK's error text
says so (`Error executing tool <tool>: ...`, the text of its `isError` results, all that is left of the flag).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tracejudge.mapping.dialects.base import Dialect, MCPOperation, ToolExecution, span_error
from tracejudge.mapping.python_reprs import CLASS_KEY, read_repr
from tracejudge.mapping.results import CONTENT_TYPES
from tracejudge.mapping.spans import Span, by_fields

SK_SCOPE_PREFIX = "semantic_kernel."
PLUGIN_SEPARATOR = "-"  # SK's fully qualified function name: plugin name, "-", function name
MCP_ERROR_PREFIX = "Error executing tool {tool}: "  # the MCP Python SDK's text for a tool that raised
_CACHE_KEY = "semantic_kernel:mcp_call"


@dataclass(frozen=True)
class MCPContent:
    """What an MCP plugin function returned, as MCP data: content blocks of a tool, or messages of a prompt."""

    kind: str  # "tool" | "prompt"
    blocks: list[dict[str, Any]]
    messages: list[dict[str, Any]]

    def __reduce__(self) -> tuple[Any, ...]:
        return by_fields(self)


def _mcp_block(inner: Any) -> dict[str, Any] | None:
    """An MCP SDK content object (its pydantic repr has `type` and no SK fields) as a content block."""
    kind = inner.get("type") if isinstance(inner, dict) else None
    if not isinstance(kind, str) or kind not in CONTENT_TYPES or "ai_model_id" in inner:
        return None
    block = {k: v for k, v in inner.items() if k != CLASS_KEY and v is not None}
    if isinstance(block.get("resource"), dict):
        block["resource"] = {k: v for k, v in block["resource"].items() if k != CLASS_KEY and v is not None}
    return block


def mcp_content(raw: Any) -> MCPContent | None:
    """The MCP result inside SK's recorded content objects; None when they wrap no MCP object (a native
    function's result, or no repr at all)."""
    if not isinstance(raw, str) or "inner_content=" not in raw:
        return None
    items = read_repr(raw)
    items = items if isinstance(items, list) else [items]
    blocks, messages = [], []
    for item in items:
        inner = item.get("inner_content") if isinstance(item, dict) else None
        if isinstance(inner, dict) and inner.get(CLASS_KEY) == "PromptMessage":
            content = _mcp_block(inner.get("content"))
            if content is None:
                return None
            messages.append({"role": str(inner.get("role") or "user"), "content": content})
            continue
        block = _mcp_block(inner)
        if block is None:
            return None
        blocks.append(block)
    if messages and not blocks:
        return MCPContent("prompt", [], messages)
    return MCPContent("tool", blocks, []) if blocks and not messages else None


def _split(name: str) -> tuple[str | None, str]:
    plugin, separator, function = name.partition(PLUGIN_SEPARATOR)
    return (plugin, function) if separator and plugin and function else (None, name)


class SemanticKernel(Dialect):
    name = "semantic_kernel"

    def applies(self, span: Span) -> bool:
        return span.scope_name.startswith(SK_SCOPE_PREFIX)

    def _mcp_call(self, span: Span, kind: str | None = None) -> tuple[MCPContent, str | None, str] | None:
        """(what it returned, plugin, function) of an MCP plugin function's span, of `kind` ("tool", "prompt") if
        given; read once per span."""
        if span.str_attr("gen_ai.operation.name") != "execute_tool":
            return None
        if _CACHE_KEY not in span._parsed:
            content = mcp_content(span.attr("gen_ai.tool.call.result"))
            span._parsed[_CACHE_KEY] = None if content is None else (
                content, *_split(span.str_attr("gen_ai.tool.name") or ""))
        found = span._parsed[_CACHE_KEY]
        return found if found is None or kind is None or found[0].kind == kind else None

    def exclusive(self, span: Span) -> bool:
        """An MCP plugin function's span is read here alone: the generic reading would make it a plain function."""
        return self._mcp_call(span) is not None

    def tool_execution(self, span: Span) -> ToolExecution | None:
        found = self._mcp_call(span, "tool")
        if found is None:
            return None
        content, plugin, tool = found
        failed, message = span_error(span)
        texts = [b.get("text") for b in content.blocks if b.get("type") == "text"]
        failed = failed or bool(texts) and str(texts[0]).startswith(MCP_ERROR_PREFIX.format(tool=tool))
        return ToolExecution(name=tool, call_id=span.str_attr("gen_ai.tool.call.id"),
                             arguments=span.json_attr("gen_ai.tool.call.arguments"),
                             result={"content": content.blocks, "isError": failed}, error=failed,
                             error_message=message, mcp=True, server=plugin)

    def mcp_operation(self, span: Span) -> MCPOperation | None:
        found = self._mcp_call(span, "prompt")
        if found is None:
            return None
        content, plugin, prompt = found
        failed, message = span_error(span)
        return MCPOperation(method="prompts/get", side="client", target=prompt,
                            arguments=span.json_attr("gen_ai.tool.call.arguments"),
                            result={"messages": content.messages}, error=failed, error_message=message,
                            server=plugin)
