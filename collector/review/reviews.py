"""People reviewing the judge: a reviewer's verdict on one score (`POST /api/reviews`), who the reviewer is (named
tokens, not one shared token), and agreement between judge and people per metric, configuration and judge model
(`GET /api/agreement`, the `judge_agreement` view), weighted by each review's queue-sampling probability."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import duckdb
from pydantic import BaseModel, ConfigDict, Field

from tracejudge.collector.history.agreement import FullAgreement, ReviewedItem, full_agreement
from tracejudge.collector.receivers.ingest import bearer_matches
from tracejudge.collector.review.queue import queue_item

REVIEWER_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")  # recorded with each review and carried in a cookie
REVIEW_SHAPE = ('{"conversation_id": "...", "metric": "mcp_use", "verdict": "agree" | "disagree", '
                '"human_score": 0.4, "note": "...", "tasks": [{"index": 0, "verdict": "disagree"}]}')


class ReviewError(ValueError):
    """A review that cannot be recorded, with what to do."""


class PartLabel(BaseModel):
    """A reviewer's verdict on one task or MCP call the metric decided on its own (index as in the score's
    breakdown: `task_index` of a task, position in `calls` of a call)."""

    model_config = ConfigDict(extra="forbid")

    index: int = Field(ge=0, lt=10_000)
    verdict: Literal["agree", "disagree"]


@dataclass(frozen=True)
class JudgedPart:
    """A task or call as the judge decided it: what a reviewer agrees or disagrees with."""

    kind: Literal["task", "call"]
    index: int
    label: str
    judge_pass: bool
    score: float | None
    reason: str


def judged_parts(breakdown: dict[str, Any] | None, threshold: float | None) -> list[JudgedPart]:
    """The per-task decisions of a judged metric (a task passes at the metric's threshold) and the per-call
    decisions of call validity, from a score's breakdown."""
    breakdown = breakdown or {}
    mark = 0.5 if threshold is None else threshold
    parts = []
    for task in breakdown.get("tasks") or []:
        if not isinstance(task, dict) or not isinstance(task.get("task_index"), int):
            continue
        score = task.get("alignment_score", task.get("score"))
        if not isinstance(score, int | float):
            continue
        reason = " / ".join(str(task[k]) for k in ("primitive_reason", "argument_reason", "reason") if task.get(k))
        parts.append(JudgedPart("task", task["task_index"], str(task.get("task") or ""), score >= mark, score, reason))
    for position, call in enumerate(breakdown.get("calls") or []):
        if isinstance(call, dict) and isinstance(call.get("valid"), bool):
            parts.append(JudgedPart("call", position, f"turn {call.get('turn')}: {call.get('kind')} {call.get('name')}",
                                    call["valid"], None, "; ".join(map(str, call.get("violations") or []))))
    return parts


class ReviewIn(BaseModel):
    """A reviewer's verdict on the latest score of one metric for one conversation version."""

    model_config = ConfigDict(extra="forbid")

    conversation_id: str = Field(min_length=1, max_length=512)
    version: int | None = Field(None, ge=1, description="the conversation version reviewed (default: the latest)")
    metric: str = Field(min_length=1, max_length=64)
    verdict: Literal["agree", "disagree"]
    human_score: float | None = Field(None, ge=0, le=1)
    note: str | None = Field(None, max_length=8192)
    tasks: list[PartLabel] = Field([], max_length=1000, description="per-task verdicts, where the metric decides per "
                                   "task (unlisted tasks: not reviewed)")
    calls: list[PartLabel] = Field([], max_length=1000, description="per-call verdicts (call validity)")


def reviewer_tokens(spec: str | None) -> dict[str, str]:
    """`name:token,name:token` (TRACEJUDGE_REVIEWER_TOKENS) -> token -> reviewer name."""
    out: dict[str, str] = {}
    for item in (spec or "").split(","):
        if not item.strip():
            continue
        name, sep, token = item.strip().partition(":")
        if not sep or not REVIEWER_NAME.fullmatch(name) or len(token) < 16:
            raise ValueError("TRACEJUDGE_REVIEWER_TOKENS must be name:token pairs separated by commas, each name "
                             "letters, digits, '.', '_', '@' or '-' (at most 64), each token at least 16 characters "
                             "(openssl rand -hex 16)")
        out[token] = name
    return out


def reviewer_named(header: str | None, reviewers: dict[bytes, str]) -> str | None:
    """The name of the reviewer whose token `Authorization: Bearer ...` carries (constant-time compares), if any."""
    return next((name for token, name in reviewers.items() if bearer_matches(header, token)), None)


def record_review(con: duckdb.DuckDBPyConnection, review: ReviewIn, reviewer: str) -> dict[str, Any]:
    """Store the review with the score it judged, as that score was (a later re-score is a new row to review)."""
    version = review.version
    if version is None:
        found = con.execute("SELECT max(version) FROM conversations WHERE conversation_id = ?",
                            [review.conversation_id]).fetchone()
        version = found[0] if found else None
    scored = con.execute(
        "SELECT metric_config, score, success, judge_model, breakdown, threshold, inclusion_probability FROM scores "
        "WHERE conversation_id = ? AND conversation_version = ? AND metric = ? ORDER BY scored_at DESC LIMIT 1",
        [review.conversation_id, version, review.metric]).fetchall() if version is not None else []
    if not scored:
        raise ReviewError(f"no {review.metric} score of conversation {review.conversation_id!r}"
                          f"{f' version {version}' if version else ''}; review a scored conversation")
    config, score, success, judge_model, breakdown, threshold, inclusion = scored[0]
    if success is None:
        raise ReviewError(f"this {review.metric} score has no pass/fail (not applicable, or no threshold) to agree "
                          "or disagree with")
    human_pass = success if review.verdict == "agree" else not success
    labels = _part_labels(review, judged_parts(json.loads(breakdown or "{}"), threshold))
    # weighed as it was chosen, never as a client says: by the queue (else a manual review, 1), times the chance the
    # conversation had of being scored at all ([sampling] rate and rules)
    entry = queue_item(con, review.conversation_id)
    rule, probability = (entry.queue_rule, entry.sampling_probability) \
        if entry is not None and entry.conversation_version == version else ("manual", 1.0)
    probability *= inclusion if inclusion else 1.0
    review_id = uuid.uuid4().hex
    con.execute("BEGIN TRANSACTION")
    try:  # a reviewer's second verdict on the same score replaces the first: one voice per reviewer and item
        replaced = con.execute("DELETE FROM reviews WHERE reviewer = ? AND conversation_id = ? AND "
                               "conversation_version = ? AND metric = ? AND metric_config = ? RETURNING 1",
                               [reviewer, review.conversation_id, version, review.metric, config]).fetchall()
        con.execute("INSERT INTO reviews VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [
            review_id, review.conversation_id, version, review.metric, config, reviewer, review.verdict, human_pass,
            review.human_score, review.note, rule, probability, score, success,
            judge_model, datetime.now(UTC), json.dumps(labels) if labels else None])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return {"review_id": review_id, "conversation_version": version, "judge_success": success,
            "human_pass": human_pass, "queue_rule": rule, "sampling_probability": probability,
            "replaced": bool(replaced)}


def _part_labels(review: ReviewIn, parts: list[JudgedPart]) -> dict[str, list[dict[str, Any]]]:
    """Each labelled task or call with the judge's decision and the reviewer's; an index the score does not have
    is refused (the reviewer looked at another version)."""
    decided = {(p.kind, p.index): p for p in parts}
    out: dict[str, list[dict[str, Any]]] = {}
    for kind, labels in (("task", review.tasks), ("call", review.calls)):
        for label in labels:
            part = decided.get((kind, label.index))
            if part is None:
                raise ReviewError(f"the {review.metric} score decided no {kind} {label.index}; label the {kind}s "
                                  "its breakdown lists")
            human = part.judge_pass if label.verdict == "agree" else not part.judge_pass
            out.setdefault(f"{kind}s", []).append({"index": label.index, "judge_pass": part.judge_pass,
                                                   "human_pass": human})
    return out


def agreement_report(con: duckdb.DuckDBPyConnection, resamples: int = 1000) -> list[dict[str, Any]]:
    """Per metric, configuration and judge model: every agreement figure between judge and reviewers, each with a
    95 % bootstrap interval and its count (collector/history/agreement.py says how they are estimated). A change
    of judge model or prompt is a new configuration, so a new row, never a blend."""
    rows = con.execute(
        "SELECT metric, metric_config, judge_model, judge_success, human_pass, sampling_probability, reviewer, "
        "judge_score, human_score, labels, conversation_id, conversation_version FROM reviews "
        "ORDER BY metric, metric_config, judge_model, reviewed_at, review_id").fetchall()
    groups: dict[tuple[str, str, str | None], list[tuple[Any, ...]]] = {}
    for row in rows:
        groups.setdefault((row[0], row[1], row[2]), []).append(row)
    out = []
    for (metric, config, model), reviews in groups.items():
        first: dict[tuple[str, int], int] = {}  # the item's first review -> the second reviewer's verdict
        second: dict[int, bool] = {}
        for position, r in enumerate(reviews):
            key = (r[10], r[11])
            if key not in first:
                first[key] = position
            elif reviews[first[key]][6] != r[6] and first[key] not in second:
                second[first[key]] = r[4]
        items = [ReviewedItem(r[3], r[4], r[5], r[7], r[8], *_label_pairs(r[9]), second.get(position),
                              cluster=(r[10], r[11])) for position, r in enumerate(reviews)]
        figures = full_agreement(items, resamples=resamples)
        out.append({"metric": metric, "metric_config": config, "judge_model": model, "reviews": len(reviews),
                    "reviewers": len({r[6] for r in reviews}),
                    **{name: vars(getattr(figures, name)) for name in FullAgreement.__dataclass_fields__}})
    return out


class AgreementCache:
    """The last agreement report, kept until a review is added (its bootstrap takes seconds on thousands of
    reviews; the page, the API and every refresh read the same one)."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._report: list[dict[str, Any]] = []

    def report(self, con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
        key = con.execute("SELECT count(*), max(reviewed_at) FROM reviews").fetchone()
        if key != self._key:
            self._report, self._key = agreement_report(con), key
        return self._report


def _label_pairs(labels: str | None) -> tuple[tuple[tuple[bool, bool], ...], tuple[tuple[bool, bool], ...]]:
    parsed = json.loads(labels) if labels else {}
    return tuple((t["judge_pass"], t["human_pass"]) for t in parsed.get("tasks", [])), \
        tuple((c["judge_pass"], c["human_pass"]) for c in parsed.get("calls", []))
