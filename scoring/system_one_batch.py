"""One System One request for every system_one metric of one conversation (as `evaluate()` runs them).

The metrics' states are merged (they share the turns; MCP use adds the server inventory), their question
keys are namespaced by metric id, and each metric is charged its share of the cost by question count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tracejudge.errors import ContextBudgetError
from tracejudge.eval_mode import EvalMode
from tracejudge.judged_metric import JudgedMetric
from tracejudge.judges.budget import DEFAULT_BUDGET
from tracejudge.judges.questions import Question
from tracejudge.metric import BaseMetric
from tracejudge.test_case import ConversationalTestCase


def _merge(states: list[dict[str, Any]]) -> dict[str, Any] | None:
    merged: dict[str, Any] = {}
    for state in states:
        for key, value in state.items():
            if key in merged and merged[key] != value:
                return None  # conflicting views of the conversation: ask separately
            merged[key] = value
    return merged


async def decide_together(metrics: Sequence[BaseMetric], test_case: ConversationalTestCase) -> None:
    """Give each group of system_one metrics asking the same judge one joint decision (or its error)."""
    groups: dict[tuple[type, str], list[JudgedMetric]] = {}
    for metric in metrics:
        if (isinstance(metric, JudgedMetric) and metric.eval_mode is EvalMode.SYSTEM_ONE
                and not metric.needs_no_judge(test_case)):
            judge = metric.system_one  # judges of the same type, model and endpoint count as one
            groups.setdefault((type(judge), repr(judge)), []).append(metric)
    for group in groups.values():
        if len(group) < 2:
            continue
        try:
            requests = [m.system_one_request(test_case) for m in group]
        except Exception:
            continue  # each metric reports its own error when it runs
        state = _merge([state for state, _ in requests])
        if state is None:
            continue
        prefixes = [f"{i}.{m.metric_id}" for i, m in enumerate(group)]  # unique even for two metrics of one id
        questions: dict[str, Question] = {
            f"{prefix}.{key}": q for prefix, (_, qs) in zip(prefixes, requests, strict=True) for key, q in qs.items()
        }
        judge = group[0].system_one
        assert judge is not None
        try:
            getattr(judge, "budget", DEFAULT_BUDGET).plan(state, questions)
        except ContextBudgetError:
            continue  # together too large: each metric asks alone and may fit
        try:
            async with judge.session():
                decision = await judge.decide(state, questions)
        except Exception as exc:  # the shared failure becomes each metric's error
            for metric in group:
                metric.use_decision(exc)
            continue
        for metric, prefix in zip(group, prefixes, strict=True):
            metric.use_decision(decision.share(prefix, len(questions)))
