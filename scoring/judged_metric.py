"""The part of the two MCP metrics that asks judges: eval mode, the LLM judge, concurrency, final reason."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from pydantic import BaseModel

from scoring.eval_mode import EvalMode, resolve_eval_mode
from scoring.judges.llm import LLMJudge, resolve_llm_judge
from scoring.judges.structured_output import ReasonVerdict
from scoring.metric import BaseMetric, Scored, Usage
from scoring.prompts import FINAL_REASON, REASON_OUTPUT, OutputSpec, build_messages
from scoring.test_case import ConversationalTestCase

T = TypeVar("T", bound=BaseModel)


class JudgedMetric(BaseMetric):
    def __init__(
        self,
        threshold: float | None = 0.5,
        model: str | LLMJudge | None = None,
        include_reason: bool = True,
        strict_mode: bool = False,
        async_mode: bool = True,
        verbose_mode: bool = False,
        flaky: bool = False,
        system_one_model: Any = None,
        eval_mode: str | EvalMode | None = None,
    ) -> None:
        super().__init__(threshold, include_reason, strict_mode, async_mode, verbose_mode, flaky)
        self.eval_mode = resolve_eval_mode(eval_mode)
        self.system_one_model = system_one_model
        self.model = resolve_llm_judge(model)

    async def a_measure(self, test_case: ConversationalTestCase | dict[str, Any]) -> float | None:
        async with self.model.session():
            return await super().a_measure(test_case)

    async def _ask(self, usage: Usage, name: str, instructions: str, data: Any, output: type[T],
                   spec: OutputSpec) -> T:
        """One LLM judge call, its tokens and cost added to this measure's usage."""
        judgement = await self.model.judge(build_messages(name, instructions, data, spec), output, spec)
        usage.add(judgement.model, judgement.input_tokens, judgement.output_tokens, judgement.cost)
        return judgement.value

    async def _gather(self, calls: list[Awaitable[T]]) -> list[T]:
        """Independent judge calls: concurrently in async mode (the judge caps them), else one by one."""
        if self.async_mode:
            return list(await asyncio.gather(*calls))
        return [await call for call in calls]

    async def _reason(self, scored: Scored, usage: Usage) -> str | None:
        data = {
            "metric": self.display_name,
            "score": self.score,
            "threshold": self.threshold,
            "passed": self.success,
            "strict_mode": self.strict_mode,
            "tasks": scored.detail,
        }
        verdict = await self._ask(usage, "final_reason", FINAL_REASON, data, ReasonVerdict, REASON_OUTPUT)
        return verdict.reason
