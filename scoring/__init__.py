"""tracejudge's evaluation library: the MCP metrics, their judges and `evaluate()`.

The names below are imported on first use (PEP 562), so a process that needs one module (a decode worker
needs only `scoring.errors`) does not load the judges, the OpenAI client and the metrics.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scoring.assertions import assert_test
    from scoring.call_validity import MCPCallValidityMetric
    from scoring.dataset import ConversationalGolden, DatasetError, EvaluationDataset
    from scoring.errors import (
        EvalModeError,
        EvaluationError,
        InvalidTestCaseError,
        JudgeAuthenticationError,
        JudgeConfigurationError,
        JudgeContextOverflowError,
        JudgeError,
        JudgeOutputError,
        JudgeRequestError,
        JudgeUnavailableError,
        NoTaskError,
        TracejudgeError,
    )
    from scoring.evaluate_config import AsyncConfig, CacheConfig, DisplayConfig, ErrorConfig
    from scoring.evaluation import EvaluationResult, MetricResult, TestResult, a_evaluate, evaluate
    from scoring.evaluation_template import MCPTaskCompletionTemplate
    from scoring.judges import LLMJudge, RetryPolicy
    from scoring.mcp_use import MultiTurnMCPUseMetric
    from scoring.metric import BaseMetric
    from scoring.task_completion import MCPTaskCompletionMetric

_WHERE = {
    "assert_test": "scoring.assertions",
    "AsyncConfig": "scoring.evaluate_config", "CacheConfig": "scoring.evaluate_config",
    "DisplayConfig": "scoring.evaluate_config", "ErrorConfig": "scoring.evaluate_config",
    "MCPCallValidityMetric": "scoring.call_validity",
    "ConversationalGolden": "scoring.dataset", "DatasetError": "scoring.dataset",
    "EvaluationDataset": "scoring.dataset",
    "EvaluationResult": "scoring.evaluation", "MetricResult": "scoring.evaluation", "TestResult": "scoring.evaluation",
    "a_evaluate": "scoring.evaluation", "evaluate": "scoring.evaluation",
    "LLMJudge": "scoring.judges", "RetryPolicy": "scoring.judges",
    "MultiTurnMCPUseMetric": "scoring.mcp_use", "BaseMetric": "scoring.metric",
    "MCPTaskCompletionMetric": "scoring.task_completion",
    "MCPTaskCompletionTemplate": "scoring.evaluation_template",
    **{name: "scoring.errors" for name in (
        "EvalModeError", "InvalidTestCaseError", "JudgeAuthenticationError", "JudgeConfigurationError",
        "JudgeContextOverflowError", "JudgeError",
        "JudgeOutputError", "JudgeRequestError", "JudgeUnavailableError", "NoTaskError", "TracejudgeError",
        "EvaluationError")},
}


def __getattr__(name: str) -> Any:
    if name == "METRICS":
        metrics = {m.metric_id: m for m in (__getattr__("MultiTurnMCPUseMetric"), __getattr__(
            "MCPTaskCompletionMetric"), __getattr__("MCPCallValidityMetric"))}
        globals()["METRICS"] = metrics
        return metrics
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'scoring' has no attribute {name!r}")


__all__ = [
    "METRICS",
    "AsyncConfig",
    "BaseMetric",
    "CacheConfig",
    "ConversationalGolden",
    "DatasetError",
    "DisplayConfig",
    "ErrorConfig",
    "EvalModeError",
    "EvaluationError",
    "EvaluationDataset",
    "EvaluationResult",
    "InvalidTestCaseError",
    "JudgeAuthenticationError",
    "JudgeConfigurationError",
    "JudgeContextOverflowError",
    "JudgeError",
    "JudgeOutputError",
    "JudgeRequestError",
    "JudgeUnavailableError",
    "LLMJudge",
    "MCPCallValidityMetric",
    "MCPTaskCompletionMetric",
    "MCPTaskCompletionTemplate",
    "MetricResult",
    "MultiTurnMCPUseMetric",
    "NoTaskError",
    "RetryPolicy",
    "TestResult",
    "TracejudgeError",
    "a_evaluate",
    "assert_test",
    "evaluate",
]
