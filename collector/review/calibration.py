"""Which reviews calibrate a metric (`[scoring] calibration = "reviews"`): the N most informative disagreements,
chosen deterministically, so the same reviews always give the same examples and the same configuration hash.

One correction per conversation (its review furthest from the judge), then `tracejudge.calibration.most_informative`:
furthest first, false passes and false fails in turn; ties by review time, then id. The request shown is the task
the reviewer marked wrong, else the conversation's first task.
"""

from __future__ import annotations

import json

import duckdb

from tracejudge.calibration import CalibrationExample, most_informative
from tracejudge.collector.review.reviews import judged_parts


def calibration_examples(con: duckdb.DuckDBPyConnection, metric: str, limit: int) -> list[CalibrationExample]:
    """The reviewers' corrections of this metric chosen as its calibration examples (see most_informative)."""
    rows = con.execute("""
        WITH disagreements AS (
            SELECT r.*, row_number() OVER (
                PARTITION BY r.conversation_id
                ORDER BY abs(r.judge_score - coalesce(r.human_score, CAST(r.human_pass AS DOUBLE))) DESC,
                         r.reviewed_at, r.review_id) AS nth
            FROM reviews r WHERE r.metric = ? AND r.verdict = 'disagree' AND r.judge_score IS NOT NULL)
        SELECT d.judge_score, d.human_pass, d.human_score, d.note, d.labels, s.breakdown, s.threshold
        FROM disagreements d
        LEFT JOIN scores s ON s.conversation_id = d.conversation_id AND s.conversation_version = d.conversation_version
             AND s.metric = d.metric AND s.metric_config = d.metric_config
        WHERE d.nth = 1 ORDER BY d.reviewed_at, d.review_id""", [metric]).fetchall()
    corrections = []
    for judge_score, human_pass, human_score, note, labels, breakdown, threshold in rows:
        tasks = {p.index: p.label for p in judged_parts(json.loads(breakdown or "{}"), threshold) if p.kind == "task"}
        disputed = [t["index"] for t in (json.loads(labels or "{}").get("tasks") or [])
                    if t["judge_pass"] != t["human_pass"]]
        request = next((tasks[i] for i in disputed if i in tasks), next(iter(tasks.values()), ""))
        corrections.append(CalibrationExample(request, judge_score, "pass" if human_pass else "fail", human_score,
                                              note))
    return most_informative(corrections, limit)
