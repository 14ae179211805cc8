"""OpenInference (Arize): `openinference.span.kind`, flattened `llm.{input,output}_messages.{i}.*`, TOOL spans,
`llm.tools.{i}`, and the OpenAI Agents `mcp_tools` listing."""

from __future__ import annotations

from typing import Any

from tracejudge.mapping.dialects.base import (
    AgentRun,
    Dialect,
    LLMCall,
    MCPOperation,
    ToolDefinition,
    ToolExecution,
    schema_like,
    span_error,
)
from tracejudge.mapping.flattened import group_indexed, sub
from tracejudge.mapping.messages import Message, Part, last_user_text, newest_user_text, normalize_role, parse_messages
from tracejudge.mapping.spans import Span, as_text, only_text, parse_json_value

KIND = "openinference.span.kind"


def _message(record: dict[str, Any]) -> Message:
    role = normalize_role(record.get("message.role"))
    parts: list[Part] = []
    content = record.get("message.content")
    if isinstance(content, str) and content:
        parts.append(Part("text", text=content))
    for block in group_indexed(sub(record, "message.contents")):
        if block.get("message_content.type", "text") == "text" and block.get("message_content.text"):
            parts.append(Part("text", text=str(block["message_content.text"])))
    for call in group_indexed(sub(record, "message.tool_calls")):
        parts.append(Part("tool_call", id=as_text(call.get("tool_call.id")),
                          name=as_text(call.get("tool_call.function.name")),
                          arguments=parse_json_value(call.get("tool_call.function.arguments"))))
    if record.get("message.function_call_name"):
        parts.append(Part("tool_call", name=str(record["message.function_call_name"]),
                          arguments=parse_json_value(record.get("message.function_call_arguments_json"))))
    if role == "tool":
        parts = [Part("tool_call_response", id=as_text(record.get("message.tool_call_id")),
                      name=as_text(record.get("message.name")), result=parse_json_value(content))]
    return Message(role, parts)


def _text_value(value: Any) -> str | None:
    """input.value / output.value as the text a user typed or saw."""
    parsed = parse_json_value(value)
    if isinstance(parsed, str):
        return parsed
    if isinstance(parsed, list):
        return last_user_text(parse_messages(parsed))
    if isinstance(parsed, dict):
        if isinstance(parsed.get("messages"), list):  # LangGraph state, CrewAI kickoff(messages)
            return newest_user_text(parsed["messages"])
        # task: smolagents' run(); user_msg: LlamaIndex's agent.run(user_msg=...)
        for key in ("input", "output", "content", "text", "final_output", "task", "user_msg"):
            if isinstance(parsed.get(key), str):
                return parsed[key]
    return None


def _call_arguments(value: Any) -> Any:
    """A tool span's input as the tool's named arguments: smolagents records the Python call,
    `{"args": [], "sanitize_inputs_outputs": true, "kwargs": {...}}`."""
    if isinstance(value, dict) and isinstance(value.get("kwargs"), dict) and not value.get("args") \
            and set(value) <= {"args", "kwargs", "sanitize_inputs_outputs"}:
        return value["kwargs"]
    return value


class OpenInference(Dialect):
    name = "openinference"

    def applies(self, span: Span) -> bool:
        return KIND in span.attributes

    def agent_run(self, span: Span) -> AgentRun | None:
        kind = span.str_attr(KIND)
        if kind == "AGENT" or (kind == "CHAIN" and span.parent_span_id is None):
            return AgentRun(agent_name=span.str_attr("agent.name") or span.str_attr("graph.node.id"),
                            input_text=_text_value(span.attr("input.value")),
                            output_text=_text_value(span.attr("output.value")))
        return None

    def llm_call(self, span: Span) -> LLMCall | None:
        if span.str_attr(KIND) != "LLM":
            return None
        inputs = [_message(r) for r in group_indexed(span.prefixed("llm.input_messages."))]
        outputs = [_message(r) for r in group_indexed(span.prefixed("llm.output_messages."))]
        return LLMCall(inputs, outputs)

    def tool_execution(self, span: Span) -> ToolExecution | None:
        if span.str_attr(KIND) != "TOOL":
            return None
        arguments = _call_arguments(span.json_attr("input.value"))
        if arguments is None:
            parameters = span.json_attr("tool.parameters")
            arguments = None if schema_like(parameters) else parameters
        failed, message = span_error(span)
        return ToolExecution(name=span.str_attr("tool.name") or span.name, call_id=span.str_attr("tool.id"),
                             arguments=arguments, result=span.json_attr("output.value"), error=failed,
                             error_message=message)

    def mcp_operation(self, span: Span) -> MCPOperation | None:
        if span.str_attr(KIND) == "CHAIN" and span.name == "mcp_tools":
            names = span.json_attr("output.value")
            listed = [{"name": n} for n in names if isinstance(n, str)] if isinstance(names, list) else []
            return MCPOperation(method="tools/list", side="client", listed=listed)
        return None

    def tool_definitions(self, span: Span) -> list[ToolDefinition]:
        out = []
        parameters = span.json_attr("tool.parameters") if span.attributes.get(KIND) == "TOOL" else None
        if schema_like(parameters):
            out.append(ToolDefinition(span.str_attr("tool.name") or span.name, span.str_attr("tool.description"),
                                      parameters))
        for record in group_indexed(span.prefixed("llm.tools.")):
            schema = parse_json_value(record.get("tool.json_schema"))
            if isinstance(schema, dict):
                function: dict[str, Any] = schema["function"] if isinstance(schema.get("function"), dict) else schema
                if isinstance(function.get("name"), str):
                    params = function.get("parameters")
                    out.append(ToolDefinition(function["name"], only_text(function.get("description")),
                                              params if isinstance(params, dict) else None))
        return out
