"""Agent frameworks wrap an MCP tool's result in their own message type before it reaches a span; this
unwraps the known envelopes back to the MCP `content` the server sent, and reads the envelope's own error
status (often the only place a failed call is marked).

Known envelopes: Strands' ToolResult (`{"toolUseId", "status", "content": [{"text": ...}]}`) and its bare
content list, LangChain's ToolMessage (serialized `{"lc": 1, "type": "constructor", ...}`, as a message dict
`{"type": "tool", "data": {...}}`, or flat), CrewAI's tool failure (`{"message", "reason": "mcp_error", ...}`),
LlamaIndex's ToolOutput (`{"blocks", "tool_name", "raw_input", "raw_output": <the CallToolResult>, "is_error"}`),
and the OpenAI Agents SDK's MCP output strings (one content block, or a list of them, as JSON).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tracejudge.mapping.spans import parse_json_value

_LANGCHAIN_TOOL_MESSAGE = ("langchain", "schema", "messages", "ToolMessage")
_LANGCHAIN_TOOL_MESSAGE_CORE = ("langchain_core", "messages", "tool", "ToolMessage")


class Unwrapped(NamedTuple):
    """A tool result out of its framework envelope (a NamedTuple: made for every tool result)."""

    value: Any
    error: bool = False
    envelope: str | None = None  # which envelope was removed, for `inspect --explain`


def _langchain_fields(value: dict[str, Any]) -> dict[str, Any] | None:
    """The fields of a LangChain ToolMessage in either of its serialized forms."""
    if value.get("lc") == 1 and value.get("type") == "constructor" and isinstance(value.get("kwargs"), dict):
        path = value.get("id")
        if isinstance(path, list) and tuple(path) in (_LANGCHAIN_TOOL_MESSAGE, _LANGCHAIN_TOOL_MESSAGE_CORE):
            return value["kwargs"]
        return None
    if value.get("type") == "tool" and isinstance(value.get("data"), dict) and "content" in value["data"]:
        return value["data"]  # langchain_core.messages.message_to_dict
    if value.get("type") == "tool" and "content" in value and "tool_call_id" in value:
        return value
    return None


_CREWAI_FAILURE_KEYS = frozenset({"message", "reason", "code", "retryable", "details"})


def _bare_text_blocks(value: Any) -> list[dict[str, Any]] | None:
    """`[{"text": "..."}]` (Strands and Bedrock content blocks have no `type`) as MCP text blocks."""
    if isinstance(value, list) and value and all(isinstance(b, dict) and "type" not in b
                                                 and isinstance(b.get("text"), str) for b in value):
        return [{"type": "text", "text": b["text"]} for b in value]
    return None


def unwrap_tool_result(raw: Any) -> Unwrapped:
    """The MCP-shaped result inside a framework envelope; values that are no envelope pass unchanged."""
    value = parse_json_value(raw)
    if isinstance(value, dict):
        fields = _langchain_fields(value)
        if fields is not None:
            content = parse_json_value(fields.get("content"))
            content = _bare_text_blocks(content) or content
            artifact = fields.get("artifact")
            if isinstance(artifact, dict) and isinstance(artifact.get("structured_content"), dict):
                content = {"content": content if isinstance(content, list) else [{"type": "text", "text": content}],
                           "structuredContent": artifact["structured_content"]}
            return Unwrapped(content, fields.get("status") == "error", "langchain.ToolMessage")
        raw = value.get("raw_output")
        if "tool_name" in value and "raw_input" in value and isinstance(raw, dict) \
                and isinstance(raw.get("content"), list):
            result = {"content": raw["content"], "isError": bool(raw.get("is_error", raw.get("isError")))}
            structured = raw.get("structured_content", raw.get("structuredContent"))
            if isinstance(structured, dict):
                result["structuredContent"] = structured
            return Unwrapped(result, result["isError"] or bool(value.get("is_error")), "llama_index.ToolOutput")
        if set(value) == _CREWAI_FAILURE_KEYS and isinstance(value.get("message"), str):
            return Unwrapped([{"type": "text", "text": value["message"]}], True, "crewai tool failure")
        if "toolUseId" in value and isinstance(value.get("content"), list):
            blocks = _bare_text_blocks(value["content"]) or value["content"]
            return Unwrapped(blocks, value.get("status") == "error", "strands.ToolResult")
    blocks = _bare_text_blocks(value)
    if blocks is not None:
        return Unwrapped(blocks, False, "content blocks without type")
    return Unwrapped(value)
