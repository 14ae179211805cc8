"""Multi-Turn MCP Use: did the agent pick the right MCP primitives and pass the right arguments, per task?

llm and hybrid: score = mean over answered tasks of min(primitive score, argument score); the breakdown
also keeps DeepEval's min(mean primitive, mean argument). system_one: (2 v0 + v1 + v2) / 4 over the
questions below.
"""

from __future__ import annotations

from statistics import fmean
from typing import Any, Literal

from tracejudge.errors import NoTaskError
from tracejudge.interactions import Task, inventory_data, render_tasks_text, split_tasks
from tracejudge.judged_metric import Ask, JudgedMetric, Verdict
from tracejudge.judges.questions import ScoreLevels, YesNo
from tracejudge.metric import Scored, Usage
from tracejudge.prompts import ARGUMENT_CORRECTNESS, PRIMITIVE_SELECTION
from tracejudge.system_one_mode import WeightedQuestion
from tracejudge.test_case import ConversationalTestCase, LLMTestCase

NO_CALL = Verdict(1.0, "No MCP call was made, so no argument could be wrong.", "rule: no MCP call")

AGGREGATIONS = ("mean_of_minima", "deepeval", "any_task")
PRIMITIVE_LEVELS = ("Wrong primitives", "Poor choice", "Reasonable choice", "Best choice")
ARGUMENT_LEVELS = ("Incorrect", "Mostly incorrect", "Mostly correct", "Fully correct")


class MultiTurnMCPUseMetric(JudgedMetric):
    metric_id = "mcp_use"
    display_name = "Multi-Turn MCP Use"
    include_inventory = True
    system_one_questions = (
        WeightedQuestion("q_0", "right MCP primitives", 2, YesNo(
            "In every assistant turn of `turns`, are the MCP primitives called (tools, resources, prompts) the "
            "right ones among those the servers in `mcp_servers` offer for what the user asked, with no clearly "
            "better primitive missed and no unnecessary call?")),
        WeightedQuestion("q_1", "arguments match schemas and request", 1, YesNo(
            "Does every MCP call in `turns` pass arguments that match the primitive's input schema in "
            "`mcp_servers` and carry the values the user asked for?")),
        WeightedQuestion("q_2", "overall MCP use", 1, ScoreLevels(
            "Overall, how well did the assistant use the MCP servers in `mcp_servers` to serve the user's "
            "requests in `turns`?", ("Wrong use", "Poor use", "Adequate use", "Correct use"))),
    )

    def __init__(self, *args: Any,
                 aggregation: Literal["mean_of_minima", "deepeval", "any_task"] = "mean_of_minima",
                 **kwargs: Any) -> None:
        """`aggregation="deepeval"` scores min(mean primitive score, mean argument score) over the tasks, as
        DeepEval does, for users who need its numbers; the default is the mean over tasks of each task's minimum,
        so a task with a bad argument is not hidden by other tasks' good choices; `"any_task"` scores the worst
        task's minimum, so the conversation fails when any task does."""
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {', '.join(map(repr, AGGREGATIONS))}, not {aggregation!r}")
        super().__init__(*args, **kwargs)
        self.aggregation = aggregation

    async def _score_tasks(self, test_case: ConversationalTestCase, usage: Usage) -> Scored:
        all_tasks = split_tasks(test_case, self.units)
        tasks = [t for t in all_tasks if t.answered]
        if not tasks:
            raise NoTaskError("no task has an assistant response, so there is no MCP use to judge")
        inventory = inventory_data(test_case.mcp_servers)

        def ask(task: Task, aspect: str, name: str, instructions: str, levels: tuple[str, ...], what: str) -> Ask:
            # the inventory first: the same bytes open every request of this agent, so providers cache it
            return Ask(f"t{task.index}.{aspect}", task, name, instructions, {"mcp_servers": inventory, **task.data()},
                       levels, f"For the task with task_index {task.index} in `tasks`: {what}")

        asks = [ask(t, "primitives", "mcp_primitive_selection", PRIMITIVE_SELECTION, PRIMITIVE_LEVELS,
                    "how well did the agent choose MCP primitives (tools, resources, prompts) from `mcp_servers` "
                    "for what the user asked? A better primitive missed, an unnecessary call or a needed call not "
                    "made lowers the level.") for t in tasks]
        asks += [ask(t, "arguments", "mcp_argument_correctness", ARGUMENT_CORRECTNESS, ARGUMENT_LEVELS,
                     "how correct are the arguments of the agent's MCP calls: required fields, names and types per "
                     "the input schemas in `mcp_servers`, and the values the user asked for?")
                 for t in tasks if t.has_mcp_calls]
        decided = await self._decide(asks, usage, {"mcp_servers": inventory})

        rows: list[dict[str, Any]] = []
        for task in tasks:
            prim = decided[f"t{task.index}.primitives"]
            arg = decided.get(f"t{task.index}.arguments", NO_CALL)
            rows.append({
                "task_index": task.index,
                "task": task.text,
                "primitive_score": prim.score,
                "primitive_reason": prim.reason,
                "argument_score": arg.score,
                "argument_reason": arg.reason,
                "alignment_score": min(prim.score, arg.score),
                "primitive": self._verdict_breakdown(prim),
                "argument": self._verdict_breakdown(arg),
                **task.scope(),
            })
        mean_primitive = fmean(r["primitive_score"] for r in rows)
        mean_argument = fmean(r["argument_score"] for r in rows)
        breakdown = {
            "eval_mode": self.eval_mode.value,
            "units": self.units,
            "aggregation": self.aggregation,
            "equation": {"deepeval": "min(mean primitive_score, mean argument_score) over tasks (DeepEval's)",
                         "any_task": "min over tasks of min(primitive_score, argument_score): fails if any task "
                                     "does"}.get(self.aggregation,
                                                 "mean over tasks of min(primitive_score, argument_score)"),
            "tasks": rows,
            "skipped_tasks": [t.index for t in all_tasks if not t.answered],
            "mean_primitive_score": mean_primitive,
            "mean_argument_score": mean_argument,
            "min_of_means": min(mean_primitive, mean_argument),
        }
        detail = [{k: r[k] for k in ("task", "alignment_score", "primitive_reason", "argument_reason")}
                  for r in rows]
        alignment = [r["alignment_score"] for r in rows]
        score = {"deepeval": breakdown["min_of_means"], "any_task": min(alignment)}.get(self.aggregation,
                                                                                         fmean(alignment))
        return Scored(score, breakdown, render_tasks_text(all_tasks),
                      detail=detail, confidence=self._task_confidence(list(decided.values())))


class MCPUseMetric(MultiTurnMCPUseMetric):
    """DeepEval's single-turn MCP Use: an `LLMTestCase` (input, actual output, the MCP servers and the calls made
    for it) judged as a one-task conversation, with the multi-turn metric's judge, eval modes, per-task
    breakdown and cost accounting. A `ConversationalTestCase` is scored as `MultiTurnMCPUseMetric` scores it."""

    metric_id = "mcp_use_single_turn"
    display_name = "MCP Use"

    async def a_measure(self, test_case: Any) -> float | None:
        return await super().a_measure(test_case.as_conversation() if isinstance(test_case, LLMTestCase)
                                       else test_case)

