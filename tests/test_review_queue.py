"""The review queue's rules (issue 38, part 1): which scored conversation versions a rule takes, the rule and
sampling probability recorded with each, a later and surer rule raising an item's probability, and end-user
thumbs-down from a real collector's feedback API putting a passing conversation in the queue."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import httpx

from tests.support.collector_process import CollectorProcess
from tests.test_pipeline import config, conversations, export, query, wait_for
from tracejudge.collector.config import ReviewSettings
from tracejudge.collector.review import queue
from tracejudge.collector.store.schema import migrate

TOKEN = "review-queue-query-token"
ALICE = "alice-review-token-0123"


def _store(path: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(str(path))
    migrate(con)
    return con


def _score(con: duckdb.DuckDBPyConnection, cid: str, metric: str, success: bool | None, *, eval_mode: str = "llm",
           confidence: float | None = None, fallback: str | None = None, version: int = 1,
           at: datetime | None = None) -> None:
    con.execute("INSERT OR IGNORE INTO conversations (conversation_id, version, content_hash, status, assembled_at) "
                "VALUES (?, ?, 'h', 'assembled', now())", [cid, version])
    con.execute("INSERT INTO scores (conversation_id, conversation_version, metric, metric_config, eval_mode, score, "
                "success, confidence, fallback_reason, scored_at) VALUES (?, ?, ?, 'cfg', ?, ?, ?, ?, ?, ?)",
                [cid, version, metric, eval_mode, None if success is None else float(success), success, confidence,
                 fallback, at or datetime.now(UTC)])


def _queued(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[str, float]]:
    return {cid: (rule, p) for cid, rule, p in con.execute(
        "SELECT conversation_id, queue_rule, sampling_probability FROM review_queue").fetchall()}


def _drawn(cid: str) -> float:
    """The random sample's documented draw: the first 32 bits of md5('tracejudge-review:' + id), in [0, 1)."""
    return int(hashlib.md5(f"tracejudge-review:{cid}".encode()).hexdigest()[:8], 16) / 2**32


def test_each_rule_takes_what_it_says_with_its_probability(tmp_path: Path) -> None:
    con = _store(tmp_path / "q.duckdb")
    _score(con, "failing", "mcp_use", False)
    _score(con, "disagree", "mcp_call_validity", False)  # validity fails, task completion passes
    _score(con, "disagree", "mcp_task_completion", True)
    _score(con, "unsure", "mcp_use", True, eval_mode="hybrid", confidence=0.4)
    _score(con, "fell-back", "mcp_use", True, eval_mode="hybrid", fallback="JudgeUnavailableError: down")
    _score(con, "not-applicable", "mcp_use", None)
    passing = [f"pass-{i}" for i in range(400)]
    for cid in passing:
        _score(con, cid, "mcp_use", True, eval_mode="hybrid", confidence=0.9)
    rules = ReviewSettings(failing=False, random_rate=0.25)
    queue.refresh(con, rules)
    queued = _queued(con)
    assert queued.get("failing", ("random", 0.25)) == ("random", 0.25)  # the rule is off: only the sample can
    assert queued["disagree"] == ("metric_disagreement", 1.0)
    assert queued["unsure"] == ("low_confidence", 1.0)
    assert queued["fell-back"] == ("hybrid_fallback", 1.0)
    assert "not-applicable" not in queued  # no pass/fail to agree with
    sampled = {cid for cid in passing if cid in queued}
    assert sampled == {cid for cid in passing if _drawn(cid) < 0.25}
    assert {queued[cid] for cid in sampled} == {("random", 0.25)}
    assert 60 < len(sampled) < 140  # about a quarter of 400

    # a failing score of a sampled conversation, written later: the item is now certain, not a 1-in-4 draw
    rules = rules.model_copy(update={"failing": True})
    upgraded = next(iter(sorted(sampled)))
    _score(con, upgraded, "mcp_task_completion", False)
    queue.refresh(con, rules)
    assert _queued(con)[upgraded] == ("failing", 1.0)
    assert _queued(con)["failing"] == ("failing", 1.0)
    # the refresh read forward: what it saw before is not read again past the overlap
    assert con.execute("SELECT scores_read_to FROM review_queue_progress").fetchone()[0] is not None


def test_the_queue_reads_forward_and_serves_each_reviewer_what_they_have_not_reviewed(tmp_path: Path) -> None:
    con = _store(tmp_path / "q.duckdb")
    old = datetime.now(UTC) - timedelta(hours=3)
    _score(con, "a", "mcp_use", False, at=old)
    rules = ReviewSettings(random_rate=0, reviews_per_item=2)
    assert queue.refresh(con, rules) == 1
    con.execute("DELETE FROM review_queue")  # what was read is not read again (it is past the overlap)
    assert queue.refresh(con, rules) == 0
    _score(con, "b", "mcp_use", False)
    _score(con, "c", "mcp_use", False)
    assert queue.refresh(con, rules) == 2
    first = queue.next_item(con, "alice", rules)
    assert first is not None and first.queue_rule == "failing"
    con.execute("INSERT INTO reviews (review_id, conversation_id, conversation_version, metric, metric_config, "
                "reviewer, verdict, human_pass, queue_rule, sampling_probability, judge_success, reviewed_at) "
                "VALUES ('r1', ?, 1, 'mcp_use', 'cfg', 'alice', 'agree', false, 'failing', 1, false, now())",
                [first.conversation_id])
    # alice gets the other one; bob gets the one alice started first, so it reaches its two reviewers
    second = queue.next_item(con, "alice", rules)
    assert second is not None and second.conversation_id != first.conversation_id
    assert queue.next_item(con, "bob", rules).conversation_id == first.conversation_id
    # skipping moves on, however many were skipped in a row
    assert queue.next_item(con, "bob", rules, [first.conversation_id]).conversation_id == second.conversation_id
    assert queue.next_item(con, "bob", rules, [first.conversation_id, second.conversation_id]) is None
    # a newer version of a conversation leaves its older version's item behind
    _score(con, second.conversation_id, "mcp_use", True, version=2)
    queue.refresh(con, rules)
    assert queue.next_item(con, "alice", rules) is None


def test_end_user_thumbs_down_queues_a_conversation_the_judge_passed(tmp_path: Path) -> None:
    env = {"TRACEJUDGE_QUERY_TOKEN": TOKEN, "TRACEJUDGE_REVIEWER_TOKENS": f"alice:{ALICE}"}
    cfg = config(tmp_path, 'metrics = ["mcp_call_validity"]\n[review]\nrandom_rate = 0\n')
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with CollectorProcess(tmp_path / "t.duckdb", config=cfg, env=env) as collector:
        export(collector, conversations(end=True))
        wait_for(collector, "SELECT 1 FROM scores", 2, token=TOKEN)
        page = httpx.get(f"{collector.admin_url}/review", headers=auth, timeout=30)
        assert page.status_code == 200
        assert query(collector, "SELECT conversation_id, queue_rule FROM review_queue", TOKEN) == [
            ["conv-b", "failing"]]  # conv-a passed, and no sample is drawn
        reply = httpx.post(f"{collector.admin_url}/api/feedback", headers=auth, timeout=30, json={
            "conversation_id": "conv-a", "value": 0, "label": "thumbs_down", "comment": "wrong city"})
        assert reply.status_code == 201
        wait_for(collector, "SELECT 1 FROM feedback", 1, token=TOKEN)
        assert httpx.get(f"{collector.admin_url}/review", headers=auth, timeout=30).status_code == 200
        assert query(collector, "SELECT conversation_id, queue_rule, sampling_probability FROM review_queue "
                                "ORDER BY 1", TOKEN) == [["conv-a", "thumbs_down", 1.0], ["conv-b", "failing", 1.0]]
        # the rules are edited by the query-token holder, not by a signed-in reviewer
        with httpx.Client(base_url=collector.admin_url, timeout=30) as reviewer:
            csrf = re.search(r'name="csrf" value="([^"]+)"', reviewer.get("/login").text).group(1)
            signed_in = reviewer.post("/login", data={"token": ALICE, "csrf": csrf, "next": "/review"})
            assert signed_in.status_code == 303 and signed_in.headers["location"] == "/review"
            assert reviewer.get("/review").status_code == 200
            refused = reviewer.post("/review/rules", data={"random_rate": "1", "csrf": csrf})
            assert refused.status_code == 403 and "query token" in refused.json()["error"]
            # the review form: a bad score is sent back with what is wrong; a good one is weighted as queued
            form = {"csrf": csrf, "version": "1", "verdict.mcp_call_validity": "disagree", "parts.mcp_call_validity":
                    '["call.0"]', "wrong.mcp_call_validity.call.0": "on", "note.mcp_call_validity": "server fault"}
            bad = reviewer.post("/review/items/conv-b", data={**form, "score.mcp_call_validity": "2"})
            assert bad.status_code == 303 and "error=" in bad.headers["location"]
            assert "less than or equal to 1" in httpx.URL(bad.headers["location"]).params["error"]
            forged = reviewer.post("/review/items/conv-b", data={**form, "csrf": "not-the-token"})
            assert forged.status_code == 403
            good = reviewer.post("/review/items/conv-b", data={**form, "score.mcp_call_validity": "0.5"})
            assert good.status_code == 303 and good.headers["location"] == "/review/next"
        assert query(collector, "SELECT reviewer, queue_rule, sampling_probability, human_pass, labels FROM reviews",
                     TOKEN) == [["alice", "failing", 1.0, True,
                                 '{"calls": [{"index": 0, "judge_pass": false, "human_pass": true}]}']]
        collector.stop()
