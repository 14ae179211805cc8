"""tracejudge's evaluation library: the MCP metrics, their judges and `evaluate()`."""

from scoring.call_validity import MCPCallValidityMetric
from scoring.errors import (
    EvalModeError,
    InvalidTestCaseError,
    JudgeAuthenticationError,
    JudgeConfigurationError,
    JudgeError,
    JudgeOutputError,
    JudgeRequestError,
    JudgeUnavailableError,
    NoTaskError,
    TracejudgeError,
)
from scoring.evaluate import EvaluationResult, MetricResult, TestResult, a_evaluate, evaluate
from scoring.judges import LLMJudge, RetryPolicy
from scoring.mcp_use import MultiTurnMCPUseMetric
from scoring.metric import BaseMetric
from scoring.task_completion import MCPTaskCompletionMetric

METRICS: dict[str, type[BaseMetric]] = {
    m.metric_id: m for m in (MultiTurnMCPUseMetric, MCPTaskCompletionMetric, MCPCallValidityMetric)
}

__all__ = [
    "METRICS",
    "BaseMetric",
    "EvalModeError",
    "EvaluationResult",
    "InvalidTestCaseError",
    "JudgeAuthenticationError",
    "JudgeConfigurationError",
    "JudgeError",
    "JudgeOutputError",
    "JudgeRequestError",
    "JudgeUnavailableError",
    "LLMJudge",
    "MCPCallValidityMetric",
    "MCPTaskCompletionMetric",
    "MetricResult",
    "MultiTurnMCPUseMetric",
    "NoTaskError",
    "RetryPolicy",
    "TestResult",
    "TracejudgeError",
    "a_evaluate",
    "evaluate",
]
