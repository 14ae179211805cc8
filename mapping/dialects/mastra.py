"""Mastra (TypeScript) through its own OpenTelemetry exporter: GenAI span names and a few GenAI attributes, but
the content in its own vocabulary. `mastra.span.type` says what a span is: `agent_run` (a turn: its input text and
its output `{"text"}`), `model_step` (one model call: its input messages, and `{"text", "toolCalls"}` out),
`mcp_tool_call` (an MCP tool, its server in `mastra.mcp_tool_call.server_name`, named `<server>_<tool>`, its
result's structured content, an MCP error as the span's ERROR status with `error.domain = MCP` and no result).

The `chat` span inside each step (`model_inference`) holds only streamed output without its tool calls; the step
says everything it does, so it is not read as a model call of its own.
"""

from __future__ import annotations

import re
from typing import Any

from tracejudge.mapping.dialects.base import AgentRun, Dialect, LLMCall, ToolDefinition, ToolExecution, span_error
from tracejudge.mapping.messages import Message, Part, last_user_text, parse_messages
from tracejudge.mapping.spans import Span, as_dict, as_list, only_text

SPAN_TYPE = "mastra.span.type"
# what Mastra writes in a step's input history in place of a tool call or result it sent the model
_PLACEHOLDER = re.compile(r"^(\[tool(-result)?: [^\]]*\])+$")


def _input_messages(value: Any) -> list[Message]:
    """A step's or a run's input: plain text, or messages whose tool calls and results Mastra summarised as
    `[tool: name]` placeholders (left out: they are no text the model or the user wrote)."""
    if isinstance(value, str) and not value.lstrip().startswith(("[", "{")):
        return [Message("user", [Part("text", text=value)])] if value else []
    messages = parse_messages(value.get("messages") if isinstance(value, dict) else value)
    for message in messages:
        message.parts = [p for p in message.parts if not (p.type == "text" and p.text and _PLACEHOLDER.match(p.text))]
    return messages


def _output_message(value: Any) -> Message | None:
    """`{"text", "toolCalls": [{"toolCallId", "toolName", "args"}]}` as the assistant's message."""
    output = as_dict(value)
    parts = [Part("text", text=output["text"])] if isinstance(output.get("text"), str) and output["text"] else []
    for call in as_list(output.get("toolCalls")):
        if isinstance(call, dict):
            parts.append(Part("tool_call", id=_text(call.get("toolCallId")), name=_text(call.get("toolName")),
                              arguments=call.get("args", call.get("input"))))
    return Message("assistant", parts) if parts else None


def _text(value: Any) -> str | None:
    """An id or a name as text, whatever JSON recorded it as (a list there must not become a dict key)."""
    return value if isinstance(value, str) else None if value is None or isinstance(value, dict | list) \
        else str(value)


class Mastra(Dialect):
    name = "mastra"

    def applies(self, span: Span) -> bool:
        return SPAN_TYPE in span.attributes

    def exclusive(self, span: Span) -> bool:
        """A step's `chat` span: its output lacks the step's tool calls, so no dialect reads it as a model call."""
        return span.attributes.get(SPAN_TYPE) == "model_inference"

    def agent_run(self, span: Span) -> AgentRun | None:
        if span.attributes.get(SPAN_TYPE) != "agent_run":
            return None
        output = span.json_attr("mastra.agent_run.output")
        text = output.get("text") if isinstance(output, dict) else output if isinstance(output, str) else None
        return AgentRun(agent_name=span.str_attr("gen_ai.agent.name"),
                        input_text=last_user_text(_input_messages(span.json_attr("mastra.agent_run.input"))),
                        output_text=only_text(text) or None)

    def llm_call(self, span: Span) -> LLMCall | None:
        if span.attributes.get(SPAN_TYPE) != "model_step":
            return None
        output = _output_message(span.json_attr("mastra.model_step.output"))
        return LLMCall(_input_messages(span.json_attr("mastra.model_step.input")), [output] if output else [])

    def tool_execution(self, span: Span) -> ToolExecution | None:
        if span.attributes.get(SPAN_TYPE) != "mcp_tool_call":
            return None
        server = span.str_attr("mastra.mcp_tool_call.server_name")
        name = span.str_attr("gen_ai.tool.name") or span.name.removeprefix("execute_tool").strip()
        if server and name.startswith(server + "_"):
            name = name[len(server) + 1:]
        failed, message = span_error(span)
        result = span.json_attr("gen_ai.tool.call.result")
        if isinstance(result, dict) and set(result) == {"result"} and isinstance(result["result"], str):
            # Mastra records the MCP result's structured content; the MCP Python SDK structures a text as this
            result = {"content": [{"type": "text", "text": result["result"]}], "structuredContent": result}
        return ToolExecution(name=name, call_id=span.str_attr("gen_ai.tool.call.id"),
                             arguments=span.json_attr("gen_ai.tool.call.arguments"), result=result,
                             error=failed or span.str_attr("error.domain") == "MCP",
                             error_message=span.str_attr("error.message") or message, mcp=True, server=server)

    def tool_definitions(self, span: Span) -> list[ToolDefinition]:
        """An agent run lists the names of the tools it offered (no schema)."""
        if span.attributes.get(SPAN_TYPE) != "agent_run":
            return []
        return [ToolDefinition(name) for name in as_list(span.json_attr("gen_ai.tool.definitions"))
                if isinstance(name, str) and name]
