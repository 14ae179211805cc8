"""What every metric shares: DeepEval's result attributes, threshold and strict rules, sync and async entry.

A metric subclass implements `_score` (the raw score and its breakdown) and may implement `_reason`;
this class applies strict mode and the threshold, keeps `success` consistent with the final score,
and records errors in `error` before re-raising them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tracejudge.loop_bridge import run_sync
from tracejudge.test_case import ConversationalTestCase, load_test_case


@dataclass
class Scored:
    """A metric's raw result before strict mode and threshold; `raw=None` means not applicable."""

    raw: float | None
    breakdown: dict[str, Any]
    logs: str | None = None
    reason: str | None = None
    detail: Any = None
    confidence: float | None = None
    strict_pass: bool | None = None  # overrides "score is 1" as the strict-mode test (system_one)


@dataclass
class Usage:
    """Judge calls and tokens of one measure; cost is None once any call had no known price."""

    llm_calls: int = 0
    system_one_requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cost: float | None = 0.0
    models: list[str] = field(default_factory=list)
    prompt_reductions: list[dict[str, Any]] = field(default_factory=list)  # what was cut to fit the judge

    @property
    def calls(self) -> int:
        return self.llm_calls + self.system_one_requests

    def add(self, model: str, input_tokens: int, output_tokens: int, cost: float | None, *,
            system_one_requests: int = 0, cached_tokens: int = 0) -> None:
        """Count one LLM call, or (with `system_one_requests`) a System One decision's requests."""
        if system_one_requests:
            self.system_one_requests += system_one_requests
        else:
            self.llm_calls += 1
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.cached_input_tokens += cached_tokens
        self.cost = None if cost is None or self.cost is None else self.cost + cost
        if model not in self.models:
            self.models.append(model)


class BaseMetric:
    metric_id: ClassVar[str]
    display_name: ClassVar[str]

    def __init__(
        self,
        threshold: float | None = 0.5,
        include_reason: bool = True,
        strict_mode: bool = False,
        async_mode: bool = True,
        verbose_mode: bool = False,
        flaky: bool = False,
    ) -> None:
        if threshold is not None and not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be between 0 and 1 or None, not {threshold!r}")
        self.threshold = 1.0 if strict_mode else threshold
        self.include_reason = include_reason
        self.strict_mode = strict_mode
        self.async_mode = async_mode
        self.verbose_mode = verbose_mode
        self.flaky = flaky
        self._reset()

    def _reset(self) -> None:
        self.score: float | None = None
        self.reason: str | None = None
        self.success: bool | None = None
        self.evaluation_cost: float | None = None
        self.score_breakdown: dict[str, Any] | None = None
        self.verbose_logs: str | None = None
        self.error: str | None = None
        self.confidence: float | None = None
        self.applicable: bool = True
        self.usage = Usage()

    @property
    def __name__(self) -> str:
        return self.display_name

    def copy(self) -> BaseMetric:
        """The same configuration (and judge, so its concurrency cap is shared) with no results."""
        clone = copy.copy(self)
        clone._reset()
        return clone

    def is_successful(self) -> bool | None:
        """False on an error or a score under the threshold; None without a threshold (a score only, as in
        DeepEval); True when it passed or does not apply."""
        if self.error is not None:
            return False
        if self.threshold is None:
            return None
        return self.success is not False

    @property
    def evaluation_model(self) -> str | None:
        """The judge model(s) of the last measure, as DeepEval reports it; None for deterministic metrics."""
        return ", ".join(self.usage.models) or None

    @property
    def input_tokens(self) -> int:
        """Judge input tokens of the last measure."""
        return self.usage.input_tokens

    @property
    def output_tokens(self) -> int:
        """Judge output tokens of the last measure."""
        return self.usage.output_tokens

    def measure(self, test_case: ConversationalTestCase | dict[str, Any]) -> float | None:
        """Score one test case; works from plain code and from inside a running event loop."""
        return run_sync(self.a_measure(test_case))

    async def a_measure(self, test_case: ConversationalTestCase | dict[str, Any]) -> float | None:
        self._reset()
        try:
            scored = await self._score(load_test_case(test_case), self.usage)
            self.verbose_logs = scored.logs
            if self.verbose_mode and scored.logs:
                print(scored.logs)
            self.confidence = scored.confidence
            if scored.raw is None:
                self.applicable = False
                self.reason = scored.reason if self.include_reason else None
            else:
                strict_pass = scored.raw >= 1.0 if scored.strict_pass is None else scored.strict_pass
                self.score = scored.raw if not self.strict_mode else (1.0 if strict_pass else 0.0)
                self.success = None if self.threshold is None else self.score >= self.threshold
                if self.include_reason:
                    self.reason = await self._reason(scored, self.usage)
            self.evaluation_cost = self.usage.cost
            self.score_breakdown = {**scored.breakdown, "judge_calls": self.usage.calls,
                                    "llm_calls": self.usage.llm_calls,
                                    "system_one_requests": self.usage.system_one_requests,
                                    "input_tokens": self.usage.input_tokens,
                                    "cached_input_tokens": self.usage.cached_input_tokens,
                                    "output_tokens": self.usage.output_tokens}
            if self.usage.prompt_reductions:
                self.score_breakdown["prompt_reductions"] = self.usage.prompt_reductions
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            self.success = False
            self.evaluation_cost = self.usage.cost
            raise
        return self.score

    async def _score(self, test_case: ConversationalTestCase, usage: Usage) -> Scored:
        raise NotImplementedError

    async def _reason(self, scored: Scored, usage: Usage) -> str | None:
        """The final reason, asked for once `score` and `success` are final."""
        return scored.reason
