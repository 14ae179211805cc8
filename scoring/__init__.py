"""tracejudge: the evaluation library (the MCP metrics, their judges and `evaluate()`), at DeepEval's module paths
(`tracejudge.test_case`, `tracejudge.metrics`, `tracejudge.dataset`, `tracejudge.evaluate.configs`), with the
collector in `tracejudge.collector` and the span-to-test-case mapping in `tracejudge.mapping`.

The names below are imported on first use (PEP 562), so a process that needs one module (a decode worker needs
only `tracejudge.errors`) does not load the judges, the OpenAI client and the metrics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tracejudge.lazy_names import lazy_getattr

if TYPE_CHECKING:
    from tracejudge.assertions import assert_test
    from tracejudge.call_validity import MCPCallValidityMetric
    from tracejudge.dataset import ConversationalGolden, DatasetError, EvaluationDataset, Golden
    from tracejudge.errors import (
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
    from tracejudge.evaluate.configs import AsyncConfig, CacheConfig, DisplayConfig, ErrorConfig
    from tracejudge.evaluation import EvaluationResult, MetricResult, TestResult, a_evaluate, evaluate
    from tracejudge.evaluation_template import MCPTaskCompletionTemplate
    from tracejudge.judges import LLMJudge, RetryPolicy
    from tracejudge.mcp_use import MCPUseMetric, MultiTurnMCPUseMetric
    from tracejudge.metric import BaseMetric
    from tracejudge.task_completion import MCPTaskCompletionMetric

_NAMES = {
    "tracejudge.assertions": ("assert_test",),
    "tracejudge.evaluate.configs": ("AsyncConfig", "CacheConfig", "DisplayConfig", "ErrorConfig"),
    "tracejudge.call_validity": ("MCPCallValidityMetric",),
    "tracejudge.dataset": ("ConversationalGolden", "DatasetError", "EvaluationDataset", "Golden"),
    "tracejudge.evaluation": ("EvaluationResult", "MetricResult", "TestResult", "a_evaluate", "evaluate"),
    "tracejudge.judges": ("LLMJudge", "RetryPolicy"),
    "tracejudge.mcp_use": ("MCPUseMetric", "MultiTurnMCPUseMetric"),
    "tracejudge.metric": ("BaseMetric",),
    "tracejudge.task_completion": ("MCPTaskCompletionMetric",),
    "tracejudge.evaluation_template": ("MCPTaskCompletionTemplate",),
    "tracejudge.errors": (
        "EvalModeError", "InvalidTestCaseError", "JudgeAuthenticationError", "JudgeConfigurationError",
        "JudgeContextOverflowError", "JudgeError", "JudgeOutputError", "JudgeRequestError", "JudgeUnavailableError",
        "NoTaskError", "TextOnlyJudgeError", "TracejudgeError", "EvaluationError"),
}
_WHERE = {name: module for module, names in _NAMES.items() for name in names}


_lazy = lazy_getattr(globals(), _WHERE)


def __getattr__(name: str) -> Any:
    if name == "METRICS":  # every metric by its id: the collector's config names metrics by id
        metrics = {m.metric_id: m for m in (_lazy("MultiTurnMCPUseMetric"), _lazy("MCPTaskCompletionMetric"),
                                            _lazy("MCPCallValidityMetric"))}
        globals()["METRICS"] = metrics
        return metrics
    return _lazy(name)


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
    "Golden",
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
    "MCPUseMetric",
    "MultiTurnMCPUseMetric",
    "NoTaskError",
    "TextOnlyJudgeError",
    "RetryPolicy",
    "TestResult",
    "TracejudgeError",
    "a_evaluate",
    "assert_test",
    "evaluate",
]
