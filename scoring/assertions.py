"""`assert_test`: DeepEval's way to gate a pytest run on metrics, for conversational MCP test cases."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scoring.evaluate import MetricResult, evaluate
from scoring.metric import BaseMetric
from scoring.test_case import ConversationalTestCase


def _describe(m: MetricResult) -> str:
    score = "none" if m.score is None else f"{m.score:.3f}"
    return (f"{m.name} (score: {score}, threshold: {m.threshold}, strict: {m.strict_mode}, error: {m.error}, "
            f"reason: {m.reason})")


def assert_test(test_case: ConversationalTestCase | dict[str, Any], metrics: Sequence[BaseMetric],
                run_async: bool = True) -> None:
    """Measure every metric on the case; AssertionError naming each metric that failed or errored, with its
    score, threshold and reason, so a pytest run fails with what went wrong."""
    result = evaluate([test_case], metrics, max_concurrency=8 if run_async else 1, print_results=False)
    failed = [m for m in result.test_results[0].metrics if not m.passed]
    if failed:
        raise AssertionError(f"Metrics: {', '.join(_describe(m) for m in failed)} failed.")
