"""People reviewing the judge: a reviewer's verdict on one score (`POST /api/reviews`), who the reviewer is (named
tokens, not one shared token), and agreement between judge and people per metric, configuration and judge model
(`GET /api/agreement`, the `judge_agreement` view), weighted by each review's queue-sampling probability."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, Literal

import duckdb
from pydantic import BaseModel, ConfigDict, Field

from tracejudge.collector.history.agreement import agreement

REVIEW_SHAPE = ('{"conversation_id": "...", "metric": "mcp_use", "verdict": "agree" | "disagree", '
                '"human_score": 0.4, "note": "...", "queue_rule": "failing", "sampling_probability": 1}')


class ReviewError(ValueError):
    """A review that cannot be recorded, with what to do."""


class ReviewIn(BaseModel):
    """A reviewer's verdict on the latest score of one metric for one conversation version."""

    model_config = ConfigDict(extra="forbid")

    conversation_id: str = Field(min_length=1, max_length=512)
    version: int | None = Field(None, ge=1, description="the conversation version reviewed (default: the latest)")
    metric: str = Field(min_length=1, max_length=64)
    verdict: Literal["agree", "disagree"]
    human_score: float | None = Field(None, ge=0, le=1)
    note: str | None = Field(None, max_length=8192)
    queue_rule: str = Field("manual", min_length=1, max_length=64)
    sampling_probability: float = Field(1.0, gt=0, le=1, description="the chance the queue rule chose this item")


def reviewer_tokens(spec: str | None) -> dict[str, str]:
    """`name:token,name:token` (TRACEJUDGE_REVIEWER_TOKENS) -> token -> reviewer name."""
    out: dict[str, str] = {}
    for item in (spec or "").split(","):
        if not item.strip():
            continue
        name, sep, token = item.strip().partition(":")
        if not sep or not name or len(token) < 16:
            raise ValueError("TRACEJUDGE_REVIEWER_TOKENS must be name:token pairs separated by commas, each token "
                             "at least 16 characters (openssl rand -hex 16)")
        out[token] = name
    return out


def record_review(con: duckdb.DuckDBPyConnection, review: ReviewIn, reviewer: str) -> dict[str, Any]:
    """Store the review with the score it judged, as that score was (a later re-score is a new row to review)."""
    version = review.version
    if version is None:
        found = con.execute("SELECT max(version) FROM conversations WHERE conversation_id = ?",
                            [review.conversation_id]).fetchone()
        version = found[0] if found else None
    scored = con.execute(
        "SELECT metric_config, score, success, judge_model FROM scores WHERE conversation_id = ? AND "
        "conversation_version = ? AND metric = ? ORDER BY scored_at DESC LIMIT 1",
        [review.conversation_id, version, review.metric]).fetchall() if version is not None else []
    if not scored:
        raise ReviewError(f"no {review.metric} score of conversation {review.conversation_id!r}"
                          f"{f' version {version}' if version else ''}; review a scored conversation")
    config, score, success, judge_model = scored[0]
    if success is None:
        raise ReviewError(f"this {review.metric} score has no pass/fail (not applicable, or no threshold) to agree "
                          "or disagree with")
    human_pass = success if review.verdict == "agree" else not success
    review_id = uuid.uuid4().hex
    con.execute("INSERT INTO reviews VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [
        review_id, review.conversation_id, version, review.metric, config, reviewer, review.verdict, human_pass,
        review.human_score, review.note, review.queue_rule, review.sampling_probability, score, success,
        judge_model, datetime.now(UTC)])
    return {"review_id": review_id, "conversation_version": version, "judge_success": success,
            "human_pass": human_pass}


def agreement_report(con: duckdb.DuckDBPyConnection, resamples: int = 1000) -> list[dict[str, Any]]:
    """Per metric, configuration and judge model: kappa and accuracy between judge and reviewers, each with a 95 %
    bootstrap interval and the number of reviews (collector/history/agreement.py says how they are estimated)."""
    rows = con.execute("SELECT metric, metric_config, judge_model, judge_success, human_pass, sampling_probability, "
                       "reviewer FROM reviews ORDER BY metric, metric_config, judge_model, reviewed_at").fetchall()
    groups: dict[tuple[str, str, str | None], list[tuple[Any, ...]]] = {}
    for row in rows:
        groups.setdefault((row[0], row[1], row[2]), []).append(row)
    out = []
    for (metric, config, model), items in groups.items():
        result = agreement([r[3] for r in items], [r[4] for r in items], [r[5] for r in items], resamples=resamples)
        out.append({"metric": metric, "metric_config": config, "judge_model": model, "reviews": len(items),
                    "reviewers": len({r[6] for r in items}),
                    "kappa": vars(result.kappa), "accuracy": vars(result.accuracy)})
    return out
