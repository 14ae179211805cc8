"""OTel GenAI semantic conventions: invoke_agent, chat and execute_tool spans, message attributes, the
deprecated per-message span events, and tool definitions."""

from __future__ import annotations

from typing import Any

from mapping.dialects.base import AgentRun, Dialect, LLMCall, ToolDefinition, ToolExecution, span_error
from mapping.messages import Message, Part, final_assistant_text, last_user_text, parse_messages
from mapping.spans import Span, as_list, parse_json_value

LLM_OPERATIONS = frozenset({"chat", "generate_content", "text_completion"})
EVENT_ROLES = {"gen_ai.system.message": "system", "gen_ai.user.message": "user",
               "gen_ai.assistant.message": "assistant", "gen_ai.tool.message": "tool"}


def _event_message(name: str, attrs: dict[str, Any]) -> Message | None:
    if name == "gen_ai.choice":
        body = parse_json_value(attrs.get("message")) or {}
        attrs = {**(body if isinstance(body, dict) else {}), **{k: v for k, v in attrs.items() if k != "message"}}
        role = "assistant"
    elif name in EVENT_ROLES:
        role = EVENT_ROLES[name]
    else:
        return None
    parts: list[Part] = []
    content = parse_json_value(attrs.get("content"))
    if role == "tool":
        return Message("tool", [Part("tool_call_response", id=_s(attrs.get("id")), result=content)])
    if isinstance(content, str) and content:
        parts.append(Part("text", text=content))
    for call in as_list(parse_json_value(attrs.get("tool_calls"))):
        if isinstance(call, dict):
            function = call.get("function") if isinstance(call.get("function"), dict) else call
            parts.append(Part("tool_call", id=_s(call.get("id")), name=_s(function.get("name")),
                              arguments=parse_json_value(function.get("arguments"))))
    return Message(role, parts)


def _s(value: Any) -> str | None:
    return None if value is None else str(value)


class OTelGenAI(Dialect):
    name = "otel_genai"

    def applies(self, span: Span) -> bool:
        return ("gen_ai.operation.name" in span.attributes or "gen_ai.input.messages" in span.attributes
                or "gen_ai.output.messages" in span.attributes
                or any(e.name.startswith("gen_ai.") for e in span.events))

    def agent_run(self, span: Span) -> AgentRun | None:
        if span.str_attr("gen_ai.operation.name") != "invoke_agent" and not span.name.startswith("invoke_agent"):
            return None
        return AgentRun(
            agent_name=span.str_attr("gen_ai.agent.name"),
            input_text=last_user_text(parse_messages(span.json_attr("gen_ai.input.messages"))),
            output_text=final_assistant_text(parse_messages(span.json_attr("gen_ai.output.messages"))),
        )

    def llm_call(self, span: Span) -> LLMCall | None:
        operation = span.str_attr("gen_ai.operation.name")
        if operation in ("invoke_agent", "execute_tool"):
            return None
        inputs = parse_messages(span.json_attr("gen_ai.input.messages"))
        outputs = parse_messages(span.json_attr("gen_ai.output.messages"))
        if not inputs and not outputs:
            events = [(e.name, _event_message(e.name, e.attributes)) for e in span.events]
            inputs = [m for name, m in events if m is not None and name != "gen_ai.choice"]
            outputs = [m for name, m in events if m is not None and name == "gen_ai.choice"]
        if not inputs and not outputs and operation not in LLM_OPERATIONS:
            return None
        return LLMCall(inputs, outputs)

    def tool_execution(self, span: Span) -> ToolExecution | None:
        if span.str_attr("gen_ai.operation.name") != "execute_tool":
            return None
        failed, message = span_error(span)
        name = span.str_attr("gen_ai.tool.name") or span.name.removeprefix("execute_tool").strip() or "unknown"
        return ToolExecution(
            name=name,
            call_id=span.str_attr("gen_ai.tool.call.id"),
            arguments=span.json_attr("gen_ai.tool.call.arguments"),
            result=span.json_attr("gen_ai.tool.call.result"),
            error=failed,
            error_message=message,
            mcp=span.str_attr("mcp.method.name") == "tools/call",
            server=span.str_attr("server.address"),
        )

    def tool_definitions(self, span: Span) -> list[ToolDefinition]:
        definitions = span.json_attr("gen_ai.tool.definitions")
        if not isinstance(definitions, list):
            return []
        out = []
        for item in definitions:
            if isinstance(item, dict):
                function = item.get("function") if isinstance(item.get("function"), dict) else item
                if isinstance(function.get("name"), str):
                    schema = function.get("parameters", function.get("input_schema"))
                    out.append(ToolDefinition(function["name"], function.get("description"),
                                              schema if isinstance(schema, dict) else None))
        return out
