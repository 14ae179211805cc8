"""Google ADK (`gcp.vertex.agent.*`): tool arguments and responses in its own attributes, LLM requests
as Gemini `contents` (role `model` is the assistant), MCP tools marked by the tool class name."""

from __future__ import annotations

from typing import Any

from tracejudge.mapping.dialects.base import AgentRun, Dialect, LLMCall, ToolExecution, span_error
from tracejudge.mapping.messages import Message, Part, normalize_role
from tracejudge.mapping.spans import Span, as_list, as_text


def _content_message(content: Any) -> Message | None:
    if not isinstance(content, dict):
        return None
    parts: list[Part] = []
    for part in as_list(content.get("parts")):
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str):
            parts.append(Part("text", text=part["text"]))
        call = part.get("function_call")
        if isinstance(call, dict):
            parts.append(Part("tool_call", id=as_text(call.get("id")), name=as_text(call.get("name")),
                              arguments=call.get("args")))
        response = part.get("function_response")
        if isinstance(response, dict):
            parts.append(Part("tool_call_response", id=as_text(response.get("id")), name=as_text(response.get("name")),
                              result=response.get("response")))
    role = normalize_role(content.get("role") or "user")
    if role == "user" and parts and all(p.type == "tool_call_response" for p in parts):
        role = "tool"
    return Message(role, parts)


ADK_SCOPE = "gcp.vertex.agent"


class ADK(Dialect):
    name = "adk"

    def applies(self, span: Span) -> bool:
        # the scope first: scanning every attribute key of every span was the mapping's hottest line
        if span.scope_name == ADK_SCOPE:
            return True
        attributes = span.attributes
        return "gcp.vertex.agent.llm_request" in attributes or "gcp.vertex.agent.tool_call_args" in attributes

    def agent_run(self, span: Span) -> AgentRun | None:
        if span.name == "invocation" or span.name.startswith("agent_run"):
            return AgentRun(agent_name=span.name.partition("[")[2].rstrip("]") or None)
        return None

    def llm_call(self, span: Span) -> LLMCall | None:
        request = span.json_attr("gcp.vertex.agent.llm_request")
        if not isinstance(request, dict) or not request.get("contents"):
            return None
        inputs = [m for m in (_content_message(c) for c in as_list(request.get("contents"))) if m]
        response = span.json_attr("gcp.vertex.agent.llm_response")
        output = _content_message(response.get("content")) if isinstance(response, dict) else None
        return LLMCall(inputs, [output] if output else [])

    def tool_execution(self, span: Span) -> ToolExecution | None:
        if "gcp.vertex.agent.tool_call_args" not in span.attributes:
            return None
        failed, message = span_error(span)
        tool_type = span.str_attr("gen_ai.tool.type") or ""
        result = span.json_attr("gcp.vertex.agent.tool_response")
        if isinstance(result, dict) and set(result) == {"result"}:
            result = result["result"]  # ADK wraps a non-dict result as {"result": value}
        return ToolExecution(
            name=span.str_attr("gen_ai.tool.name") or span.name.removeprefix("execute_tool").strip(),
            call_id=span.str_attr("gen_ai.tool.call.id"),
            arguments=span.json_attr("gcp.vertex.agent.tool_call_args"),
            result=result,
            error=failed, error_message=message, mcp="mcp" in tool_type.lower(),
        )
