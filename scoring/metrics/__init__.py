"""DeepEval's `deepeval.metrics` under tracejudge: the MCP metrics and the base class custom metrics extend.

Every tracejudge metric scores a ConversationalTestCase (`MCPUseMetric` an `LLMTestCase` too, as a one-task
conversation), so DeepEval's `BaseConversationalMetric` is `BaseMetric`.
"""

from tracejudge.call_validity import MCPCallValidityMetric
from tracejudge.mcp_use import MCPUseMetric, MultiTurnMCPUseMetric
from tracejudge.metric import BaseMetric
from tracejudge.task_completion import MCPTaskCompletionMetric

BaseConversationalMetric = BaseMetric

__all__ = ["BaseConversationalMetric", "BaseMetric", "MCPCallValidityMetric", "MCPTaskCompletionMetric",
           "MCPUseMetric", "MultiTurnMCPUseMetric"]
