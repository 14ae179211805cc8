"""MCP Task Completion: judged from what the user sees, was each task done and are the claims backed?

llm and hybrid: score = mean over tasks; a task the agent never answered scores 0 without a judge call.
system_one: (2 v0 + v1 + v2) / 4 over the questions below.
"""

from __future__ import annotations

from collections.abc import Callable
from statistics import fmean
from typing import Any, Literal

from tracejudge.evaluation_template import final_reason_prompt, overridden, task_prompt
from tracejudge.interactions import render_tasks_text, split_tasks
from tracejudge.judged_metric import Ask, JudgedMetric, Verdict
from tracejudge.judges.questions import ScoreLevels, YesNo
from tracejudge.metric import Scored, Usage
from tracejudge.prompts import TASK_COMPLETION
from tracejudge.system_one_mode import WeightedQuestion
from tracejudge.test_case import ConversationalTestCase

NO_RESPONSE = Verdict(0.0, "The agent never responded to this task (no response).", "rule: no response")
COMPLETION_LEVELS = ("Not completed", "Partly completed", "Mostly completed", "Fully completed")


class MCPTaskCompletionMetric(JudgedMetric):
    metric_id = "mcp_task_completion"
    display_name = "MCP Task Completion"
    include_inventory = False
    system_one_questions = (
        WeightedQuestion("q_0", "every task completed", 2, YesNo(
            "Is every task that a user message in `turns` asks for completed, as the user sees it in the "
            "assistant's replies?")),
        WeightedQuestion("q_1", "claims backed by MCP results", 1, YesNo(
            "Is everything the assistant says it did or found backed by the MCP calls and their results in "
            "`turns`?")),
        WeightedQuestion("q_2", "overall completion", 1, ScoreLevels(
            "Overall, how completely did the assistant do what the user asked in `turns`?", COMPLETION_LEVELS)),
    )

    def __init__(self, *args: Any, evaluation_template: type | None = None,
                 aggregation: Literal["mean", "any_task"] = "mean", **kwargs: Any) -> None:
        """`evaluation_template`: DeepEval's template class; a method it overrides is sent as the prompt (see
        `tracejudge.evaluation_template`), the others keep tracejudge's prompts. `aggregation="any_task"` scores
        the worst task, so the conversation fails when any task does; the default, DeepEval's, the mean."""
        if aggregation not in ("mean", "any_task"):
            raise ValueError(f"aggregation must be 'mean' or 'any_task', not {aggregation!r}")
        super().__init__(*args, **kwargs)
        self.aggregation = aggregation
        self.evaluation_template = evaluation_template
        overridden(evaluation_template, "get_task_completion_score")  # a bad template fails here, not mid-run
        overridden(evaluation_template, "generate_final_reason")

    async def _score_tasks(self, test_case: ConversationalTestCase, usage: Usage) -> Scored:
        tasks = split_tasks(test_case, self.units)
        custom = overridden(self.evaluation_template, "get_task_completion_score")
        render = None if custom is None else (
            lambda data: task_prompt(custom, data, test_case.multimodal, self.strict_mode))
        self._multimodal = test_case.multimodal
        asks = [
            Ask(f"t{t.index}.completion", t, "mcp_task_completion", TASK_COMPLETION, t.data(), COMPLETION_LEVELS,
                f"For the task with task_index {t.index} in `tasks`: judging only what the user sees in the "
                "agent's replies (`response_to_user`), how completely and correctly was the task done, with "
                "every claim of having done or found something backed by the MCP calls and results?", render)
            for t in tasks if t.answered
        ]
        decided = await self._decide(asks, usage, {})
        verdicts = [decided.get(f"t{t.index}.completion", NO_RESPONSE) for t in tasks]
        rows = [
            {"task_index": task.index, "task": task.text, "score": v.score, "reason": v.reason,
             **self._verdict_breakdown(v), **task.scope()}
            for task, v in zip(tasks, verdicts, strict=True)
        ]
        any_task = self.aggregation == "any_task"
        breakdown = {"eval_mode": self.eval_mode.value, "units": self.units, "aggregation": self.aggregation,
                     "equation": "min over tasks of the task completion score: fails if any task does" if any_task
                     else "mean over tasks of the task completion score", "tasks": rows}
        detail = [{"task": r["task"], "score": r["score"], "reason": r["reason"]} for r in rows]
        scores = [r["score"] for r in rows]
        return Scored(min(scores) if any_task else fmean(scores), breakdown, render_tasks_text(tasks),
                      detail=detail, confidence=self._task_confidence(list(decided.values())))

    def _final_reason_render(self) -> Callable[[dict[str, Any]], str] | None:
        custom = overridden(self.evaluation_template, "generate_final_reason")
        if custom is None:
            return None
        multimodal = getattr(self, "_multimodal", False)
        return lambda data: final_reason_prompt(custom, data, multimodal)
