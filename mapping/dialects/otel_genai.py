"""OTel GenAI semantic conventions: invoke_agent, chat and execute_tool spans; messages as attributes or on a
span event (`gen_ai.client.inference.operation.details`, as Strands and event-mode instrumentations write
them); the deprecated per-message events and the older `gen_ai.prompt` / `gen_ai.completion` events; tool
definitions."""

from __future__ import annotations

import functools
from typing import Any

from tracejudge.mapping.dialects.base import AgentRun, Dialect, LLMCall, ToolDefinition, ToolExecution, span_error
from tracejudge.mapping.messages import Message, Part, final_assistant_text, last_user_text, parse_messages
from tracejudge.mapping.spans import Span, as_list, as_text, only_text, parse_json_value

# tool lists up to this long are parsed once per text, 64 texts kept per list: parsed, a text takes up to about
# 18 times its length (a hostile 16 KB list, about 290 KB), so at most about 19 MB per cache
CACHED_TEXT = 16 * 1024
CACHED_TEXTS = 64
ADK_MERGED = "(merged tools)"  # ADK's span for merging parallel tool responses: no call of its own
LLM_OPERATIONS = frozenset({"chat", "generate_content", "text_completion"})
# operations that carry messages but are no model call (Strands' loop cycle resends the history; agents and
# workflows are runs): their messages are never read as an LLM call
NOT_LLM_OPERATIONS = frozenset({"invoke_agent", "execute_tool", "invoke_workflow", "execute_event_loop_cycle",
                                "agent_step", "create_agent", "embeddings"})
MESSAGE_KEYS = frozenset({"role", "message", "tool_calls"})  # an event's content that is a whole message
EVENT_ROLES = {"gen_ai.system.message": "system", "gen_ai.user.message": "user",
               "gen_ai.assistant.message": "assistant", "gen_ai.tool.message": "tool"}


def _event_message(name: str, attrs: dict[str, Any]) -> Message | None:
    whole = parse_json_value(attrs.get("content"))
    if isinstance(whole, dict) and not MESSAGE_KEYS.isdisjoint(whole):  # Semantic Kernel logs it as its JSON text
        attrs = {**{k: v for k, v in attrs.items() if k != "content"}, **whole}
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
        return Message("tool", [Part("tool_call_response", id=as_text(attrs.get("id", attrs.get("tool_call_id"))),
                                     result=content)])
    if isinstance(content, dict) and isinstance(attrs.get("content"), str):
        content = attrs["content"]  # text that happens to be JSON (a user who typed some): what was written
    if isinstance(content, str) and content:
        parts.append(Part("text", text=content))
    for call in as_list(parse_json_value(attrs.get("tool_calls"))):
        if isinstance(call, dict):
            function: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else call
            parts.append(Part("tool_call", id=as_text(call.get("id")), name=as_text(function.get("name")),
                              arguments=parse_json_value(function.get("arguments"))))
    return Message(role, parts)


def _legacy_messages(value: Any, role: str) -> list[Message]:
    """`gen_ai.prompt` / `gen_ai.completion` event values: a message list, or plain text of one role."""
    messages = parse_messages(value)
    if messages:
        return messages
    return [Message(role, [Part("text", text=value)])] if isinstance(value, str) and value else []


def _messages(span: Span, key: str) -> list[Message]:
    return parse_messages(span.genai_json(key))


def _tool_part(messages: list[Message], kind: str) -> Part | None:
    return next((p for m in messages for p in m.parts if p.type == kind), None)


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
            input_text=last_user_text(_messages(span, "gen_ai.input.messages")),
            output_text=final_assistant_text(_messages(span, "gen_ai.output.messages")),
        )

    def llm_call(self, span: Span) -> LLMCall | None:
        operation = span.str_attr("gen_ai.operation.name")
        if operation in NOT_LLM_OPERATIONS:
            return None
        inputs = _messages(span, "gen_ai.input.messages")
        outputs = _messages(span, "gen_ai.output.messages")
        if not inputs and not outputs:
            inputs = _legacy_messages(span.genai_json("gen_ai.prompt"), "user")
            outputs = _legacy_messages(span.genai_json("gen_ai.completion"), "assistant")
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
        name = span.str_attr("gen_ai.tool.name") or span.name.removeprefix("execute_tool").strip() or "unknown"
        if name == ADK_MERGED:
            return None
        failed, message = span_error(span)
        arguments = span.genai_json("gen_ai.tool.call.arguments")
        result = span.genai_json("gen_ai.tool.call.result")
        if (arguments is None or result is None) and (span.events or "gen_ai.input.messages" in span.attributes):
            # event mode (Strands): the call and its result as the span's input and output messages
            call = _tool_part(_messages(span, "gen_ai.input.messages"), "tool_call")
            response = _tool_part(_messages(span, "gen_ai.output.messages"), "tool_call_response")
            arguments = arguments if arguments is not None or call is None else call.arguments
            result = result if result is not None or response is None else response.result
        return ToolExecution(
            name=name,
            call_id=span.str_attr("gen_ai.tool.call.id"),
            arguments=arguments,
            result=result,
            error=failed,
            error_message=message,
            mcp=span.str_attr("mcp.method.name") == "tools/call"
            or "mcp" in (span.str_attr("gen_ai.tool.type") or "").lower(),  # ADK: McpTool
            server=span.str_attr("server.address"),
        )

    def tool_definitions(self, span: Span) -> list[ToolDefinition]:
        if "gen_ai.tool.definitions" not in span.attributes and "gen_ai.tool.json_schema" not in span.attributes:
            return []
        raw = span.attr("gen_ai.tool.definitions")
        # every model call of a run repeats the same list: each text is read once
        out = list(_listed(raw) if isinstance(raw, str) and len(raw) <= CACHED_TEXT
                   else _listed_in(span.json_attr("gen_ai.tool.definitions")))
        own = _schema(span.json_attr("gen_ai.tool.json_schema"))
        name = span.str_attr("gen_ai.tool.name")
        if own is not None and name:
            out.append(ToolDefinition(name, span.str_attr("gen_ai.tool.description"), own))
        return out


@functools.lru_cache(maxsize=CACHED_TEXTS)
def _listed(text: str) -> tuple[ToolDefinition, ...]:
    return _listed_in(parse_json_value(text))


def _listed_in(value: Any) -> tuple[ToolDefinition, ...]:
    out = []
    for item in as_list(value):
        if isinstance(item, dict):
            function: dict[str, Any] = item["function"] if isinstance(item.get("function"), dict) else item
            if isinstance(function.get("name"), str):
                schema = _schema(function.get("parameters", function.get("input_schema", function.get("inputSchema"))))
                out.append(ToolDefinition(function["name"], only_text(function.get("description")), schema))
    return tuple(out)


def _schema(value: Any) -> dict[str, Any] | None:
    """A tool's JSON schema, also in the Bedrock form Strands records (`{"json": {...}}`)."""
    if isinstance(value, dict) and set(value) == {"json"} and isinstance(value["json"], dict):
        return value["json"]
    return value if isinstance(value, dict) else None
