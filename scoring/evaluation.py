"""Run metrics over test cases concurrently (bounded) and collect per-case, per-metric results."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any, TextIO

from pydantic import BaseModel

from tracejudge.dataset import EvaluationDataset
from tracejudge.errors import EvaluationError, NoTaskError
from tracejudge.evaluate.configs import AsyncConfig, CacheConfig, DisplayConfig, ErrorConfig, RunSettings, run_settings
from tracejudge.loop_bridge import run_sync
from tracejudge.metric import BaseMetric
from tracejudge.system_one_batch import decide_together
from tracejudge.test_case import ConversationalTestCase, load_test_case


class MetricResult(BaseModel):
    metric: str
    name: str
    score: float | None
    success: bool | None
    threshold: float | None
    reason: str | None
    evaluation_cost: float | None
    error: str | None
    confidence: float | None = None
    system_one_fallback_reason: str | None = None
    score_breakdown: dict[str, Any] | None = None
    strict_mode: bool = False
    evaluation_model: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    verbose_logs: str | None = None
    skipped: bool = False  # ErrorConfig(skip_on_missing_params=True) and the case had no task for this metric

    @property
    def passed(self) -> bool:
        return self.error is None and self.success is not False


class TestResult(BaseModel):
    __test__ = False  # not a pytest class
    index: int
    name: str | None
    metrics: list[MetricResult]

    @property
    def passed(self) -> bool:
        return all(m.passed for m in self.metrics)

    @property
    def success(self) -> bool:
        """DeepEval's name for `passed`."""
        return self.passed

    @property
    def metrics_data(self) -> list[MetricResult]:
        """DeepEval's name for `metrics`."""
        return self.metrics

    @property
    def conversational(self) -> bool:
        return True

    @property
    def status(self) -> str:
        """passed, failed, or not scored (every metric was not applicable): n/a is no pass."""
        if not self.passed:
            return "failed"
        return "passed" if any(m.score is not None for m in self.metrics) else "not scored"


class EvaluationResult(BaseModel):
    test_results: list[TestResult]

    @property
    def passed(self) -> bool:
        return all(t.passed for t in self.test_results)

    @property
    def total_cost(self) -> float | None:
        costs = [m.evaluation_cost for t in self.test_results for m in t.metrics]
        return None if any(c is None for c in costs) else sum(costs)  # type: ignore[misc]


async def _run_one(metric: BaseMetric, case: ConversationalTestCase, gate: asyncio.Semaphore,
                   settings: RunSettings) -> MetricResult:
    skipped = False
    async with gate:
        try:
            await metric.a_measure(case)
        except NoTaskError:
            if not settings.skip_without_task:
                metric.error = metric.error or "NoTaskError: the conversation has no task for this metric"
            else:
                metric.error, metric.success, skipped = None, None, True
        except Exception as exc:  # recorded per metric; one failure must not hide the other results
            metric.error = metric.error or f"{type(exc).__name__}: {exc}"
    return MetricResult(
        metric=metric.metric_id, name=metric.display_name, score=metric.score, success=metric.success,
        threshold=metric.threshold, reason=metric.reason, evaluation_cost=metric.evaluation_cost,
        error=metric.error, confidence=metric.confidence,
        system_one_fallback_reason=getattr(metric, "system_one_fallback_reason", None),
        score_breakdown=metric.score_breakdown, strict_mode=metric.strict_mode,
        evaluation_model=metric.evaluation_model, input_tokens=metric.input_tokens,
        output_tokens=metric.output_tokens, verbose_logs=metric.verbose_logs, skipped=skipped,
    )


async def _run_case(case: ConversationalTestCase, metrics: Sequence[BaseMetric],
                    gate: asyncio.Semaphore, settings: RunSettings) -> list[MetricResult]:
    copies = [metric.copy() for metric in metrics]
    for copied in copies:
        if settings.verbose_mode is not None:
            copied.verbose_mode = settings.verbose_mode
    async with gate:
        await decide_together(copies, case)
    return list(await asyncio.gather(*(_run_one(metric, case, gate, settings) for metric in copies)))


async def a_evaluate(
    test_cases: Sequence[ConversationalTestCase | dict[str, Any]] | EvaluationDataset,
    metrics: Sequence[BaseMetric],
    *,
    max_concurrency: int = 8,
    print_results: bool = True,
    file: TextIO | None = None,
    async_config: AsyncConfig | None = None,
    display_config: DisplayConfig | None = None,
    error_config: ErrorConfig | None = None,
    cache_config: CacheConfig | None = None,
) -> EvaluationResult:
    """Every metric on every test case, at most `max_concurrency` measures at once. DeepEval's configs are
    accepted too (`tracejudge.evaluate.configs`); with `error_config` a metric error raises unless ignored."""
    if not metrics:
        raise ValueError("evaluate() needs at least one metric")
    settings = run_settings(async_config, display_config, error_config, cache_config,
                            max_concurrency=max_concurrency, print_results=print_results)
    if settings.max_concurrency < 1:
        raise ValueError(f"max_concurrency must be at least 1, not {settings.max_concurrency}")
    if isinstance(test_cases, EvaluationDataset):
        if not test_cases.test_cases and test_cases.goldens:
            raise ValueError("the dataset has goldens but no test cases: run the agent on each golden and "
                             "add_test_case() the conversations it produced, then evaluate the dataset")
        test_cases = test_cases.test_cases
    cases = [load_test_case(c) for c in test_cases]
    gate = asyncio.Semaphore(settings.max_concurrency)
    async with AsyncExitStack() as stack:
        judges = {id(j): j for m in metrics for j in (getattr(m, "model", None), getattr(m, "system_one", None))
                  if j is not None}
        for judge in judges.values():  # one connection pool per judge for the whole run
            await stack.enter_async_context(judge.session())
        rows = await asyncio.gather(*(_run_case(case, metrics, gate, settings) for case in cases))
    result = EvaluationResult(test_results=[
        TestResult(index=i, name=case.name, metrics=results)
        for i, (case, results) in enumerate(zip(cases, rows, strict=True))
    ])
    if settings.print_results:
        print(format_summary(result), file=file or sys.stdout)
    failed = [(t, m) for t in result.test_results for m in t.metrics if m.error]
    if settings.raise_errors and failed:
        t, m = failed[0]
        raise EvaluationError(f"{m.metric} failed on test case {t.name or f'#{t.index}'}: {m.error}; pass "
                              "error_config=ErrorConfig(ignore_errors=True) to record errors and go on")
    return result


def evaluate(
    test_cases: Sequence[ConversationalTestCase | dict[str, Any]] | EvaluationDataset,
    metrics: Sequence[BaseMetric],
    **options: Any,
) -> EvaluationResult:
    """Synchronous `a_evaluate`, with the same keyword options; works inside a running event loop too."""
    return run_sync(a_evaluate(test_cases, metrics, **options))


def _verdict(m: MetricResult) -> str:
    if m.error is not None:
        return "ERROR"
    if m.score is None:
        return "n/a"
    if m.success is None:
        return "scored"
    return "PASS" if m.success else "FAIL"


def _short(text: str | None, width: int = 70) -> str:
    """The first line of a reason, cut to fit a table cell."""
    line = " ".join((text or "").split("\n", 1)[0].split())
    return line if len(line) <= width else line[:width - 3] + "..."


def format_summary(result: EvaluationResult) -> str:
    """A compact table: one line per case and metric, then totals."""
    header = ("case", "metric", "score", "result", "cost_usd", "reason")
    lines: list[tuple[str, ...]] = [header]
    for t in result.test_results:
        label = t.name or f"#{t.index}"
        for m in t.metrics:
            score = "-" if m.score is None else f"{m.score:.3f}"
            cost = "-" if m.evaluation_cost is None else f"{m.evaluation_cost:.6f}"
            lines.append((label, m.metric, score, _verdict(m), cost, _short(m.error or m.reason)))
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in lines]
    total = result.total_cost
    statuses = [t.status for t in result.test_results]
    counts = ", ".join(f"{statuses.count(s)} {s}" for s in ("failed", "not scored") if statuses.count(s))
    text.append(f"{statuses.count('passed')}/{len(statuses)} test cases passed"
                + (f" ({counts})" if counts else "") + "; total cost "
                + ("unknown" if total is None else f"${total:.6f}"))
    errors = [(t, m) for t in result.test_results for m in t.metrics if m.error]
    text.extend(f"error in {t.name or f'#{t.index}'} {m.metric}: {m.error}" for t, m in errors)
    return "\n".join(text)
