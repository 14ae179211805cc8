"""Multi-Turn MCP Use: did the agent pick the right MCP primitives and pass the right arguments, per task?

Score = mean over answered tasks of min(primitive score, argument score). The breakdown also keeps
the per-task values and DeepEval's min(mean primitive, mean argument) so either reading is derivable.
"""

from __future__ import annotations

from statistics import fmean
from typing import Any

from scoring.errors import NoTaskError
from scoring.interactions import Task, inventory_data, render_tasks_text, split_tasks
from scoring.judged_metric import JudgedMetric
from scoring.judges.structured_output import ScoreVerdict
from scoring.metric import Scored, Usage
from scoring.prompts import ARGUMENT_CORRECTNESS, PRIMITIVE_SELECTION, SCORE_OUTPUT
from scoring.test_case import ConversationalTestCase

NO_CALL = ScoreVerdict(score=1.0, reason="No MCP call was made, so no argument could be wrong.")


class MultiTurnMCPUseMetric(JudgedMetric):
    metric_id = "mcp_use"
    display_name = "Multi-Turn MCP Use"

    async def _score(self, test_case: ConversationalTestCase, usage: Usage) -> Scored:
        all_tasks = split_tasks(test_case)
        tasks = [t for t in all_tasks if t.answered]
        if not tasks:
            raise NoTaskError("no task has an assistant response, so there is no MCP use to judge")
        inventory = inventory_data(test_case.mcp_servers)

        async def judge(task: Task, name: str, instructions: str) -> ScoreVerdict:
            data = {**task.data(), "mcp_servers": inventory}
            return await self._ask(usage, name, instructions, data, ScoreVerdict, SCORE_OUTPUT)

        calls = [judge(t, "mcp_primitive_selection", PRIMITIVE_SELECTION) for t in tasks]
        calls += [judge(t, "mcp_argument_correctness", ARGUMENT_CORRECTNESS) for t in tasks if t.has_mcp_calls]
        verdicts = iter(await self._gather(calls))
        primitive = [next(verdicts) for _ in tasks]
        argument = [next(verdicts) if t.has_mcp_calls else NO_CALL for t in tasks]

        judge_id = self.model.id
        rows: list[dict[str, Any]] = []
        for task, prim, arg in zip(tasks, primitive, argument, strict=True):
            rows.append({
                "task_index": task.index,
                "task": task.text,
                "primitive_score": prim.score,
                "primitive_reason": prim.reason,
                "argument_score": arg.score,
                "argument_reason": arg.reason,
                "alignment_score": min(prim.score, arg.score),
                "decided_by": {"primitive": judge_id, "argument": judge_id if task.has_mcp_calls else "rule"},
            })
        mean_primitive = fmean(r["primitive_score"] for r in rows)
        mean_argument = fmean(r["argument_score"] for r in rows)
        breakdown = {
            "equation": "mean over tasks of min(primitive_score, argument_score)",
            "tasks": rows,
            "skipped_tasks": [t.index for t in all_tasks if not t.answered],
            "mean_primitive_score": mean_primitive,
            "mean_argument_score": mean_argument,
            "min_of_means": min(mean_primitive, mean_argument),
        }
        detail = [{k: r[k] for k in ("task", "alignment_score", "primitive_reason", "argument_reason")}
                  for r in rows]
        return Scored(fmean(r["alignment_score"] for r in rows), breakdown, render_tasks_text(all_tasks),
                      detail=detail)
