"""The review queue: which scored conversations a person should look at, by rule, each with the probability that
its rule chose it (so agreement can be weighted back to all traffic), and the next item for a reviewer.

The queue is read forward, not recomputed: a refresh looks at the scores and the feedback written since the last
one and upserts their conversation versions; it marks as read only what is older than OVERLAP_S, so a row that
commits a little after its timestamp is still read next time. A version matched by
several rules keeps the rule with the higher probability (a deterministic rule, 1, over the random sample), so its
recorded probability is the chance that it was chosen at all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

import duckdb

from tracejudge.collector.config import ReviewSettings

OVERLAP_S = 120  # scores and feedback commit after their timestamps: the newest this long stay unread
RULES = ("thumbs_down", "failing", "metric_disagreement", "low_confidence", "hybrid_fallback", "random")
# the random sample's hash: its own salt, so it is independent of the scoring sample (conversations.sample_value)
RANDOM_DRAW = "CAST(('0x' || substr(md5('tracejudge-review:' || {column}), 1, 8)) AS BIGINT) / 4294967296.0"


@dataclass(frozen=True)
class QueueItem:
    conversation_id: str
    conversation_version: int
    queue_rule: str
    sampling_probability: float
    reviews: int


@dataclass(frozen=True)
class QueueSummary:
    """What the queue page shows: items waiting and done per rule, and the next few waiting."""

    by_rule: list[tuple[str, int, int]]  # rule, waiting, done
    waiting: list[QueueItem]


def current_rules(con: duckdb.DuckDBPyConnection, configured: ReviewSettings) -> tuple[ReviewSettings, str | None]:
    """The rules as last edited in the UI, else as configured; and who edited them (None: the configuration)."""
    row = con.execute("SELECT rules, edited_by, edited_at FROM review_rules ORDER BY edited_at DESC LIMIT 1").fetchone()
    if row is None:
        return configured, None
    return ReviewSettings.model_validate(json.loads(row[0])), f"{row[1]} at {row[2]:%Y-%m-%d %H:%M} UTC"


def save_rules(con: duckdb.DuckDBPyConnection, rules: ReviewSettings, editor: str) -> None:
    con.execute("INSERT INTO review_rules VALUES (?, ?, ?)", [rules.model_dump_json(), editor, datetime.now(UTC)])


def reset_rules(con: duckdb.DuckDBPyConnection) -> None:
    """Back to the configuration's `[review]` rules."""
    con.execute("DELETE FROM review_rules")


def refresh(con: duckdb.DuckDBPyConnection, rules: ReviewSettings) -> int:
    """Queue what the scores and feedback written since the last refresh call for; how many items it added or
    raised. Work is proportional to what was written since, in a few set-based statements."""
    row = con.execute("SELECT scores_read_to, feedback_read_to FROM review_queue_progress").fetchone()
    scores_from, feedback_from = row if row is not None else (None, None)
    con.execute("BEGIN TRANSACTION")
    try:
        new_feedback = ("FROM feedback WHERE conversation_id IS NOT NULL AND (CAST(? AS TIMESTAMPTZ) IS NULL OR "
                        "received_at > CAST(? AS TIMESTAMPTZ))")
        since = [feedback_from, feedback_from]
        [(feedback_to,)] = con.execute(f"SELECT least(max(received_at), now() - to_seconds(?)) {new_feedback}",
                                       [OVERLAP_S, *since]).fetchall()
        con.execute(f"INSERT INTO review_thumbs_down SELECT conversation_id, max(received_at) {new_feedback} AND "
                    "(value < ? OR lower(label) IN ('thumbs_down', 'thumbs-down', 'negative')) GROUP BY 1 "
                    "ON CONFLICT DO UPDATE SET received_at = excluded.received_at", [*since, rules.feedback_below])
        [(scores_to,)] = con.execute("SELECT least(max(scored_at), now() - to_seconds(?)) FROM scores "
                                     "WHERE CAST(? AS TIMESTAMPTZ) IS NULL OR scored_at > CAST(? AS TIMESTAMPTZ)",
                                     [OVERLAP_S, scores_from, scores_from]).fetchall()
        draw = RANDOM_DRAW.format(column="v.conversation_id")
        changed = con.execute(f"""
            WITH touched AS (
                SELECT DISTINCT conversation_id, conversation_version FROM scores
                WHERE CAST(? AS TIMESTAMPTZ) IS NULL OR scored_at > CAST(? AS TIMESTAMPTZ)
                UNION
                SELECT s.conversation_id, max(s.conversation_version) FROM scores s JOIN review_thumbs_down t
                    ON t.conversation_id = s.conversation_id
                WHERE CAST(? AS TIMESTAMPTZ) IS NULL OR t.received_at > CAST(? AS TIMESTAMPTZ)
                GROUP BY 1),
            v AS (
                SELECT s.conversation_id, s.conversation_version,
                       bool_or(NOT s.success) AS failing,
                       bool_or(s.success) AND bool_or(NOT s.success) AS disagreement,
                       min(s.confidence) AS confidence,
                       bool_or(s.eval_mode = 'hybrid' AND s.fallback_reason IS NOT NULL) AS fallback
                FROM scores s JOIN touched USING (conversation_id, conversation_version)
                GROUP BY ALL HAVING bool_or(s.success IS NOT NULL)),
            chosen AS (
                SELECT v.conversation_id, v.conversation_version,
                       CASE WHEN ? AND t.conversation_id IS NOT NULL THEN 'thumbs_down'
                            WHEN ? AND v.failing THEN 'failing'
                            WHEN ? AND v.disagreement THEN 'metric_disagreement'
                            WHEN v.confidence < ? THEN 'low_confidence'
                            WHEN ? AND v.fallback THEN 'hybrid_fallback'
                            WHEN {draw} < ? THEN 'random' END AS queue_rule
                FROM v LEFT JOIN review_thumbs_down t ON t.conversation_id = v.conversation_id)
            INSERT INTO review_queue
            SELECT conversation_id, conversation_version, queue_rule,
                   CASE WHEN queue_rule = 'random' THEN ? ELSE 1.0 END, now()
            FROM chosen WHERE queue_rule IS NOT NULL
            ON CONFLICT DO UPDATE SET queue_rule = excluded.queue_rule,
                sampling_probability = excluded.sampling_probability
                WHERE excluded.sampling_probability > review_queue.sampling_probability
            RETURNING 1""", [
            scores_from, scores_from, feedback_from, feedback_from,
            rules.thumbs_down, rules.failing, rules.metric_disagreement,
            rules.low_confidence_below if rules.low_confidence_below is not None else -1.0,
            rules.hybrid_fallback, rules.random_rate, rules.random_rate]).fetchall()
        con.execute("DELETE FROM review_queue_progress")
        con.execute("INSERT INTO review_queue_progress VALUES (?, ?)",
                    [scores_to or scores_from, feedback_to or feedback_from])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return len(changed)


# items others started first (so they reach their reviewers), then a random order fixed by the conversation id
_SERVING_ORDER = "reviews DESC, md5(conversation_id), conversation_id"
_WAITING = """
    WITH latest AS (SELECT conversation_id, max(version) AS version FROM conversations
                    WHERE conversation_id IN (SELECT conversation_id FROM review_queue) GROUP BY 1),
    done AS (SELECT conversation_id, conversation_version, count(DISTINCT reviewer) AS reviews,
                    bool_or(reviewer = ?) AS mine FROM reviews GROUP BY ALL)
    SELECT q.conversation_id, q.conversation_version, q.queue_rule, q.sampling_probability,
           coalesce(d.reviews, 0) AS reviews, coalesce(d.mine, false) AS mine
    FROM review_queue q JOIN latest l ON l.conversation_id = q.conversation_id AND l.version = q.conversation_version
    LEFT JOIN done d ON d.conversation_id = q.conversation_id AND d.conversation_version = q.conversation_version
"""


def next_item(con: duckdb.DuckDBPyConnection, reviewer: str, rules: ReviewSettings,
              skip: list[str] | None = None) -> QueueItem | None:
    """The next item for this reviewer: one they have not reviewed, still short of `reviews_per_item`; items
    others started first (so they reach their reviewers), then in a random order fixed by the conversation id, so
    the items reviewed of a long queue are a random part of it and the sampling weights stay right."""
    row = con.execute(f"""
        SELECT conversation_id, conversation_version, queue_rule, sampling_probability, reviews FROM ({_WAITING}) w
        WHERE NOT mine AND reviews < ? AND NOT list_contains(?, conversation_id)
        ORDER BY {_SERVING_ORDER} LIMIT 1""",
                      [reviewer, rules.reviews_per_item, skip or []]).fetchone()
    return QueueItem(*row) if row is not None else None


def queue_item(con: duckdb.DuckDBPyConnection, conversation_id: str) -> QueueItem | None:
    """The queue's entry for a conversation's latest version (how a review of it is weighted), if queued."""
    row = con.execute(f"SELECT conversation_id, conversation_version, queue_rule, sampling_probability, reviews "
                      f"FROM ({_WAITING}) w WHERE conversation_id = ?", ["", conversation_id]).fetchone()
    return QueueItem(*row) if row is not None else None


def summary(con: duckdb.DuckDBPyConnection, reviewer: str, rules: ReviewSettings, limit: int = 50) -> QueueSummary:
    rows = con.execute(f"SELECT conversation_id, conversation_version, queue_rule, sampling_probability, reviews, "
                       f"mine FROM ({_WAITING}) w ORDER BY {_SERVING_ORDER}", [reviewer]).fetchall()
    counts: dict[str, list[int]] = {rule: [0, 0] for rule in RULES}
    waiting: list[QueueItem] = []
    for cid, version, rule, probability, reviews, mine in rows:
        done = reviews >= rules.reviews_per_item
        counts.setdefault(rule, [0, 0])[1 if done else 0] += 1
        if not done and not mine:
            waiting.append(QueueItem(cid, version, rule, probability, reviews))
    return QueueSummary([(rule, w, d) for rule, (w, d) in counts.items()], waiting[:limit])


def describe(rules: ReviewSettings) -> dict[str, tuple[bool, str]]:
    """The rules as the queue page lists them: rule -> (on, what it takes)."""
    return {
        "thumbs_down": (rules.thumbs_down, f"end-user feedback below {rules.feedback_below:g} or labelled thumbs_down"),
        "failing": (rules.failing, "a failing score"),
        "metric_disagreement": (rules.metric_disagreement, "one metric passes and another fails"),
        "low_confidence": (rules.low_confidence_below is not None,
                           f"a decision with confidence below {rules.low_confidence_below}"),
        "hybrid_fallback": (rules.hybrid_fallback, "hybrid mode where the LLM decided"),
        "random": (rules.random_rate > 0,
                   f"{rules.random_rate:.1%} of all other scored conversations (probability recorded)"),
    }
