"""pydantic-ai: the agent run span carries the whole history (`pydantic_ai.all_messages`) and where this
run's messages start (`pydantic_ai.new_message_index`); its model-request spans list every tool the model was
offered with the toolset it came from (`model_request_parameters`), which tells MCP tools from function tools."""

from __future__ import annotations

import functools
from typing import Any

from tracejudge.mapping.dialects.base import AgentRun, Dialect, ToolDefinition
from tracejudge.mapping.dialects.otel_genai import CACHED_TEXT, CACHED_TEXTS
from tracejudge.mapping.messages import parse_messages
from tracejudge.mapping.spans import Span, as_list, only_text, parse_json_value

ALL_MESSAGES, REQUEST_PARAMETERS = "pydantic_ai.all_messages", "model_request_parameters"
# the metadata pydantic-ai's MCPToolset gives each tool it lists from an MCP server (the MCP tool's `_meta`
# and annotations); function tools have none
MCP_TOOL_METADATA = frozenset({"meta", "annotations"})


class PydanticAI(Dialect):
    name = "pydantic_ai"

    def applies(self, span: Span) -> bool:
        return ALL_MESSAGES in span.attributes or REQUEST_PARAMETERS in span.attributes

    def agent_run(self, span: Span) -> AgentRun | None:
        if ALL_MESSAGES not in span.attributes:
            return None
        history = parse_messages(span.json_attr(ALL_MESSAGES))
        index = span.attr("pydantic_ai.new_message_index")
        final = span.json_attr("final_result")
        return AgentRun(
            agent_name=span.str_attr("gen_ai.agent.name") or span.str_attr("agent_name"),
            output_text=only_text(final),
            history=history,
            new_from=index if isinstance(index, int) and 0 <= index <= len(history) else 0,
        )

    def tool_definitions(self, span: Span) -> list[ToolDefinition]:
        raw = span.attr(REQUEST_PARAMETERS)
        if isinstance(raw, str) and len(raw) <= CACHED_TEXT:  # every model request of a run repeats the same tools
            return list(_offered(raw))
        return list(_offered_in(span.json_attr(REQUEST_PARAMETERS)))


@functools.lru_cache(maxsize=CACHED_TEXTS)
def _offered(text: str) -> tuple[ToolDefinition, ...]:
    return _offered_in(parse_json_value(text))


def _offered_in(parameters: Any) -> tuple[ToolDefinition, ...]:
    if not isinstance(parameters, dict):
        return ()
    return tuple(_definition(tool) for tool in as_list(parameters.get("function_tools"))
                 if isinstance(tool, dict) and isinstance(tool.get("name"), str))


def _definition(tool: dict[str, Any]) -> ToolDefinition:
    metadata, toolset = tool.get("metadata"), tool.get("toolset_id")
    schema = tool.get("parameters_json_schema")
    return ToolDefinition(
        name=tool["name"], description=only_text(tool.get("description")),
        input_schema=schema if isinstance(schema, dict) else None,
        mcp=isinstance(metadata, dict) and not MCP_TOOL_METADATA.isdisjoint(metadata),
        # a toolset's own id (`MCPToolset(id=...)`) names its server; "<agent>" is the agent's function tools
        server=toolset if isinstance(toolset, str) and toolset and not toolset.startswith("<") else None)
