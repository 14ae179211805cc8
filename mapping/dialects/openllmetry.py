"""OpenLLMetry / Traceloop: workflow and tool spans (`traceloop.entity.*`), the indexed legacy
`gen_ai.{prompt,completion}.{i}.*` messages, and its MCP instrumentation (`{tool}.tool`, `{method}.mcp`)."""

from __future__ import annotations

from typing import Any

from tracejudge.mapping.dialects.base import (
    AgentRun,
    Dialect,
    LLMCall,
    MCPOperation,
    ToolDefinition,
    ToolExecution,
    span_error,
)
from tracejudge.mapping.flattened import group_indexed, sub
from tracejudge.mapping.messages import Message, Part, normalize_role
from tracejudge.mapping.spans import Span, as_dict, as_list, as_text, parse_json_value

KIND = "traceloop.span.kind"


def _message(record: dict[str, Any], role_default: str) -> Message:
    role = normalize_role(record.get("role") or role_default)
    content = parse_json_value(record.get("content"))
    if role == "tool":
        return Message("tool", [Part("tool_call_response", id=as_text(record.get("tool_call_id")), result=content)])
    parts: list[Part] = []
    if isinstance(content, str) and content:
        parts.append(Part("text", text=content))
    elif isinstance(content, list):
        parts += [Part("text", text=str(b.get("text"))) for b in content if isinstance(b, dict) and b.get("text")]
    for call in group_indexed(sub(record, "tool_calls")):
        parts.append(Part("tool_call", id=as_text(call.get("id")), name=as_text(call.get("name")),
                          arguments=parse_json_value(call.get("arguments"))))
    return Message(role, parts)


def _first_text(value: Any) -> str | None:
    """The user's text from a workflow's input `{"args": [...], "kwargs": {...}}`, or a plain value."""
    value = parse_json_value(value)
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        candidates = as_list(value.get("args")) + list(as_dict(value.get("kwargs")).values())
        return next((c for c in candidates if isinstance(c, str)), None)
    return None


class OpenLLMetry(Dialect):
    name = "openllmetry"

    def applies(self, span: Span) -> bool:
        return (KIND in span.attributes or "traceloop.entity.input" in span.attributes
                or "gen_ai.prompt.0.role" in span.attributes or "gen_ai.completion.0.role" in span.attributes
                or span.name.endswith(".mcp"))

    def agent_run(self, span: Span) -> AgentRun | None:
        if span.str_attr(KIND) not in ("workflow", "agent"):
            return None
        return AgentRun(agent_name=span.str_attr("traceloop.entity.name"),
                        input_text=_first_text(span.attr("traceloop.entity.input")),
                        output_text=_first_text(span.attr("traceloop.entity.output")))

    def llm_call(self, span: Span) -> LLMCall | None:
        prompts = group_indexed(span.prefixed("gen_ai.prompt."))
        completions = group_indexed(span.prefixed("gen_ai.completion."))
        if not prompts and not completions:
            return None
        return LLMCall([_message(r, "user") for r in prompts], [_message(r, "assistant") for r in completions])

    def tool_execution(self, span: Span) -> ToolExecution | None:
        if span.str_attr(KIND) != "tool" and not span.name.endswith(".tool"):
            return None
        entity_input = span.json_attr("traceloop.entity.input")
        output = span.json_attr("traceloop.entity.output")
        failed, message = span_error(span)
        mcp = isinstance(entity_input, dict) and "tool_name" in entity_input
        if mcp:
            name = str(entity_input["tool_name"])
            arguments = entity_input.get("arguments")
        else:
            name = span.str_attr("traceloop.entity.name") or span.name.removesuffix(".tool")
            arguments = (entity_input.get("kwargs") or entity_input.get("args")) if isinstance(entity_input, dict) \
                else entity_input
        result = output
        if isinstance(output, dict) and "result" in output:
            result = output["result"]
            failed = failed or bool(output.get("is_error"))
        return ToolExecution(name=name, arguments=arguments, result=result, error=failed, error_message=message,
                             mcp=mcp)

    def mcp_operation(self, span: Span) -> MCPOperation | None:
        if not span.name.endswith(".mcp"):
            return None
        method = span.name.removesuffix(".mcp")
        request = span.json_attr("traceloop.entity.input")
        params: dict[str, Any] = request["params"] if isinstance(request, dict) \
            and isinstance(request.get("params"), dict) else {}
        output = span.json_attr("traceloop.entity.output")
        listed: list[dict[str, Any]] = []
        if method.endswith("/list") and isinstance(output, dict):
            key = method.split("/", 1)[0]
            listed = [item for item in as_list(output.get(key)) if isinstance(item, dict)]
        failed, message = span_error(span)
        return MCPOperation(method=method, side="client", target=as_text(params.get("name") or params.get("uri")),
                            arguments=params.get("arguments"), result=output, error=failed, error_message=message,
                            listed=listed)

    def tool_definitions(self, span: Span) -> list[ToolDefinition]:
        out = []
        for record in group_indexed(span.prefixed("llm.request.functions.")):
            if isinstance(record.get("name"), str):
                params = parse_json_value(record.get("parameters"))
                out.append(ToolDefinition(record["name"], as_text(record.get("description")),
                                          params if isinstance(params, dict) else None))
        return out
