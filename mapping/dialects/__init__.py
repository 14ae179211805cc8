"""Span dialects, richest first: the builder takes the first dialect's answer for each aspect of a span."""

from tracejudge.mapping.dialects.adk import ADK
from tracejudge.mapping.dialects.base import AgentRun, Dialect, LLMCall, MCPOperation, ToolDefinition, ToolExecution
from tracejudge.mapping.dialects.mastra import Mastra
from tracejudge.mapping.dialects.mcp_semconv import MCPSemconv
from tracejudge.mapping.dialects.openinference import OpenInference
from tracejudge.mapping.dialects.openllmetry import OpenLLMetry
from tracejudge.mapping.dialects.otel_genai import OTelGenAI
from tracejudge.mapping.dialects.pydantic_ai import PydanticAI
from tracejudge.mapping.dialects.semantic_kernel import SemanticKernel

DIALECTS: tuple[Dialect, ...] = (PydanticAI(), ADK(), SemanticKernel(), Mastra(), OpenInference(), OpenLLMetry(),
                                 OTelGenAI(), MCPSemconv())

__all__ = ["DIALECTS", "AgentRun", "Dialect", "LLMCall", "MCPOperation", "ToolDefinition", "ToolExecution"]
