"""Recorded tool, resource and prompt results, in whatever form a dialect kept them, as MCP result shapes."""

from __future__ import annotations

import json
from typing import Any

from tracejudge.test_case import CallToolResult, GetPromptResult, ReadResourceResult

CONTENT_TYPES = frozenset({"text", "image", "audio", "resource", "resource_link"})


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def tool_result(value: Any, error: bool, error_message: str | None) -> CallToolResult | None:
    """A CallToolResult from an MCP-shaped dict, a content-block list, a string, or any JSON value."""
    if value is None:
        if not error:
            return None
        return CallToolResult(content=[{"type": "text", "text": error_message or "the call failed"}], is_error=True)
    if isinstance(value, dict) and isinstance(value.get("content"), list):
        try:
            result = CallToolResult.model_validate(value)
        except ValueError:
            result = None
        if result is not None:
            return result if result.is_error or not error else result.model_copy(update={"is_error": True})
    if isinstance(value, dict) and isinstance(value.get("type"), str) and value["type"] in CONTENT_TYPES:
        value = [value]  # a single content block
    if isinstance(value, list) and value and all(isinstance(b, dict) and isinstance(b.get("type"), str)
                                                 for b in value):
        blocks = [{"type": b["type"], "text": _text(b.get("text", b.get("content", "")))} if b["type"] == "text"
                  else b for b in value]
        try:
            return CallToolResult(content=blocks, is_error=error)
        except ValueError:
            pass
    structured = value if isinstance(value, dict) else None
    return CallToolResult(content=[{"type": "text", "text": _text(value)}], structured_content=structured,
                          is_error=error)


def resource_result(value: Any, uri: str) -> ReadResourceResult | None:
    if value is None:
        return None
    if isinstance(value, dict) and isinstance(value.get("contents"), list):
        try:
            return ReadResourceResult.model_validate(value)
        except ValueError:
            pass
    return ReadResourceResult(contents=[{"uri": uri, "text": _text(value)}])


def prompt_result(value: Any) -> GetPromptResult | None:
    if value is None:
        return None
    if isinstance(value, dict) and isinstance(value.get("messages"), list):
        try:
            return GetPromptResult.model_validate(value)
        except ValueError:
            pass
    return GetPromptResult(description=_text(value))
