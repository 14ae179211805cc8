"""Span dialects, richest first: the builder takes the first dialect's answer for each aspect of a span."""

from mapping.dialects.adk import ADK
from mapping.dialects.base import AgentRun, Dialect, LLMCall, MCPOperation, ToolDefinition, ToolExecution
from mapping.dialects.mcp_semconv import MCPSemconv
from mapping.dialects.openinference import OpenInference
from mapping.dialects.openllmetry import OpenLLMetry
from mapping.dialects.otel_genai import OTelGenAI
from mapping.dialects.pydantic_ai import PydanticAI

DIALECTS: tuple[Dialect, ...] = (PydanticAI(), ADK(), OpenInference(), OpenLLMetry(), OTelGenAI(), MCPSemconv())

__all__ = ["DIALECTS", "AgentRun", "Dialect", "LLMCall", "MCPOperation", "ToolDefinition", "ToolExecution"]
