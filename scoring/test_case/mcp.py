"""DeepEval's path to the MCP test-case objects (`deepeval.test_case.mcp`)."""

from __future__ import annotations

from tracejudge.test_case import MCPPromptCall, MCPResourceCall, MCPServer, MCPToolCall

__all__ = ["MCPPromptCall", "MCPResourceCall", "MCPServer", "MCPToolCall"]
