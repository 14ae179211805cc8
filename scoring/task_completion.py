"""MCP Task Completion: judged from what the user sees, was each task done and are the claims backed?

Score = mean over tasks. A task the agent never answered scores 0 without a judge call.
"""

from __future__ import annotations

from statistics import fmean

from scoring.interactions import Task, render_tasks_text, split_tasks
from scoring.judged_metric import JudgedMetric
from scoring.judges.structured_output import ScoreVerdict
from scoring.metric import Scored, Usage
from scoring.prompts import SCORE_OUTPUT, TASK_COMPLETION
from scoring.test_case import ConversationalTestCase

NO_RESPONSE = ScoreVerdict(score=0.0, reason="The agent never responded to this task (no response).")


class MCPTaskCompletionMetric(JudgedMetric):
    metric_id = "mcp_task_completion"
    display_name = "MCP Task Completion"

    async def _score(self, test_case: ConversationalTestCase, usage: Usage) -> Scored:
        tasks = split_tasks(test_case)
        answered = [t for t in tasks if t.answered]

        async def judge(task: Task) -> ScoreVerdict:
            return await self._ask(usage, "mcp_task_completion", TASK_COMPLETION, task.data(), ScoreVerdict,
                                   SCORE_OUTPUT)

        judged = iter(await self._gather([judge(t) for t in answered]))
        verdicts = [next(judged) if t.answered else NO_RESPONSE for t in tasks]
        rows = [
            {
                "task_index": task.index,
                "task": task.text,
                "score": verdict.score,
                "reason": verdict.reason,
                "decided_by": self.model.id if task.answered else "rule: no response",
            }
            for task, verdict in zip(tasks, verdicts, strict=True)
        ]
        breakdown = {"equation": "mean over tasks of the task completion score", "tasks": rows}
        detail = [{"task": r["task"], "score": r["score"], "reason": r["reason"]} for r in rows]
        return Scored(fmean(r["score"] for r in rows), breakdown, render_tasks_text(tasks), detail=detail)
