"""`tracejudge rejudge`: score one stored conversation again with the current judge, next to the stored score.

Nothing is written: the stored score stays the record (a score is keyed by its settings, and history must not
change under a user's queries). The answer carries both scores, their per-task verdicts and the new judge
exchange, so "was the judge right, and would it say the same today?" has one place to look.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any

import duckdb

from tracejudge.collector.pipeline.assembly.conversation_builder import measure_recorded, not_applicable
from tracejudge.errors import InvalidTestCaseError, NoTaskError, TextOnlyJudgeError, TracejudgeError
from tracejudge.judges.exchanges import recording
from tracejudge.metric import BaseMetric
from tracejudge.test_case import load_test_case


class RejudgeError(TracejudgeError):
    """The conversation, its version or the metric cannot be scored again; the message says what to change."""


def stored_case(con: duckdb.DuckDBPyConnection, conversation_id: str, version: int | None) -> tuple[int, str]:
    """The version (the latest when None) and its test case JSON."""
    found = con.execute(
        "SELECT version, test_case FROM conversations WHERE conversation_id = ? AND (? IS NULL OR version = ?) "
        "ORDER BY version DESC LIMIT 1", [conversation_id, version, version]).fetchall()
    if not found:
        what = f"version {version} of conversation" if version is not None else "conversation"
        raise RejudgeError(f"no {what} {conversation_id!r} is stored (retention may have pruned it); list them "
                           "with: tracejudge query \"SELECT conversation_id, version FROM conversations\"")
    return found[0][0], found[0][1]


def stored_score(con: duckdb.DuckDBPyConnection, conversation_id: str, version: int, metric: str,
                 config: str) -> dict[str, Any] | None:
    """The stored score of this version and metric: with the current settings' config if there is one, else the
    newest; with how many judge calls it made and its per-task verdicts."""
    rows = con.execute(
        "SELECT metric_config, score, success, reason, judge_model, eval_mode, scored_at, breakdown, judge_calls, "
        "evaluation_cost FROM scores WHERE conversation_id = ? AND conversation_version = ? AND metric = ? "
        "ORDER BY metric_config = ? DESC, scored_at DESC LIMIT 1", [conversation_id, version, metric, config]
    ).fetchall()
    if not rows:
        return None
    config_, score, success, reason, judge, mode, at, breakdown, calls, cost = rows[0]
    return {"metric_config": config_, "same_settings": config_ == config, "score": score, "success": success,
            "reason": reason, "judge": judge, "eval_mode": mode, "scored_at": str(at), "judge_calls": calls,
            "cost_usd": cost, "tasks": _tasks(json.loads(breakdown) if isinstance(breakdown, str) else breakdown)}


async def rejudge(template: BaseMetric, metric: str, test_case_json: str) -> dict[str, Any]:
    """Measure a fresh copy of the metric on the stored test case, keeping the judge's exchanges."""
    scored = template.copy()
    started = time.perf_counter()
    error = None
    with recording() as log:
        try:
            await measure_recorded(scored, metric, load_test_case(test_case_json))
        except (NoTaskError, InvalidTestCaseError, TextOnlyJudgeError) as exc:
            not_applicable(scored, exc)
        except TracejudgeError as exc:
            error = f"{type(exc).__name__}: {exc}"
    model = getattr(scored, "model", None)
    return {"score": scored.score, "success": scored.success, "reason": scored.reason, "error": error or scored.error,
            "judge": getattr(model, "answered_model", None) or getattr(model, "model", None),
            "eval_mode": getattr(getattr(scored, "eval_mode", None), "value", None),
            "judge_calls": scored.usage.calls, "cost_usd": scored.evaluation_cost,
            "latency_ms": (time.perf_counter() - started) * 1000,
            "tasks": _tasks(scored.score_breakdown or {}),
            "exchanges": [asdict(e) for e in log.exchanges], "exchanges_not_kept": log.dropped}


def _tasks(breakdown: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each task's score and reason, whichever judged metric wrote the breakdown."""
    out = []
    for task in (breakdown or {}).get("tasks") or []:
        if "alignment_score" in task:
            reason = " / ".join(r for r in (task.get("primitive_reason"), task.get("argument_reason")) if r)
            out.append({"task": task.get("task", ""), "score": task.get("alignment_score"), "reason": reason})
        else:
            out.append({"task": task.get("task", ""), "score": task.get("score"), "reason": task.get("reason")})
    return out
