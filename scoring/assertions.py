"""`assert_test`: DeepEval's way to gate a pytest run on metrics, for conversational MCP test cases."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tracejudge.evaluation import MetricResult, TestResult, evaluate
from tracejudge.metric import BaseMetric
from tracejudge.test_case import ConversationalTestCase, load_test_case

Listener = Callable[[ConversationalTestCase, TestResult], None]
listeners: list[Listener] = []  # told of every assert_test result (the pytest plugin records them to DuckDB)


def _describe(m: MetricResult) -> str:
    score = "none" if m.score is None else f"{m.score:.3f}"
    return (f"{m.name} (score: {score}, threshold: {m.threshold}, strict: {m.strict_mode}, error: {m.error}, "
            f"reason: {m.reason})")


def assert_test(test_case: ConversationalTestCase | dict[str, Any], metrics: Sequence[BaseMetric],
                run_async: bool = True) -> None:
    """Measure every metric on the case; AssertionError naming each metric that failed or errored, with its
    score, threshold and reason, so a pytest run fails with what went wrong."""
    case = load_test_case(test_case)
    result = evaluate([case], metrics, max_concurrency=8 if run_async else 1, print_results=False)
    for listener in listeners:
        listener(case, result.test_results[0])
    failed = [m for m in result.test_results[0].metrics if not m.passed]
    if failed:
        raise AssertionError(f"Metrics: {', '.join(_describe(m) for m in failed)} failed.")
