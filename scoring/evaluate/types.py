"""DeepEval's `deepeval.evaluate.types`: the result of `evaluate()`, one `TestResult` per case."""

from tracejudge.evaluation import EvaluationResult, MetricResult, TestResult

__all__ = ["EvaluationResult", "MetricResult", "TestResult"]
