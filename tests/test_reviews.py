"""People reviewing the judge (issue 38, in part): two reviewers with their own tokens record verdicts on real scores
of a running collector; the agreement between judge and reviewers is what their verdicts imply, in the API (with
intervals) and the `judge_agreement` view; a reviewer token opens nothing else, and the query token records no
review."""

from __future__ import annotations

import httpx
import pytest

from tests.support.collector_process import CollectorProcess
from tests.test_pipeline import config, conversations, export, query, wait_for
from tracejudge.collector.history.agreement import agreement

QUERY_TOKEN = "query-token-for-reviews"
ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789ab"


def test_two_reviewers_and_the_agreement_their_verdicts_imply(tmp_path) -> None:
    env = {"TRACEJUDGE_QUERY_TOKEN": QUERY_TOKEN, "TRACEJUDGE_REVIEWER_TOKENS": f"alice:{ALICE},bob:{BOB}"}
    cfg = config(tmp_path, 'metrics = ["mcp_call_validity"]\n')
    with CollectorProcess(tmp_path / "t.duckdb", config=cfg, env=env) as collector:
        export(collector, conversations(end=True))
        scores = dict(wait_for(collector, "SELECT conversation_id, success FROM latest_scores ORDER BY 1", 2,
                               token=QUERY_TOKEN))
        assert scores == {"conv-a": True, "conv-b": False}  # conv-b's tool call failed

        def review(token: str, conversation: str, verdict: str, **extra: object) -> httpx.Response:
            return httpx.post(f"{collector.admin_url}/api/reviews", timeout=30,
                              headers={"Authorization": f"Bearer {token}"},
                              json={"conversation_id": conversation, "metric": "mcp_call_validity",
                                    "verdict": verdict, **extra})

        first = review(ALICE, "conv-b", "agree")  # alice changes her mind below: her second verdict replaces it
        assert first.status_code == 201 and first.json()["replaced"] is False
        verdicts = [(ALICE, "conv-a", "agree"), (ALICE, "conv-b", "disagree"), (BOB, "conv-a", "agree"),
                    (BOB, "conv-b", "agree")]
        for token, conversation, verdict in verdicts:
            reply = review(token, conversation, verdict)
            assert reply.status_code == 201, reply.text
            assert reply.json()["reviewer"] == ("alice" if token == ALICE else "bob")

        judge = [scores[c] for _, c, _ in verdicts]
        human = [scores[c] if v == "agree" else not scores[c] for _, c, v in verdicts]
        expected = agreement(judge, human, resamples=0)  # not queued: manual reviews, equal weights
        assert expected.kappa.value == pytest.approx(0.5) and expected.accuracy.value == pytest.approx(0.75)

        reply = httpx.get(f"{collector.admin_url}/api/agreement", headers={"Authorization": f"Bearer {BOB}"},
                          timeout=30)
        [row] = reply.json()["agreement"]
        assert (row["metric"], row["reviews"], row["reviewers"]) == ("mcp_call_validity", 4, 2)
        assert row["kappa"]["value"] == pytest.approx(0.5) and row["accuracy"]["value"] == pytest.approx(0.75)
        assert row["kappa"]["low"] is None  # 4 reviews: too few for an honest interval (the UI test has one)
        [[kappa, accuracy, reviews]] = query(collector, "SELECT kappa, accuracy, reviews FROM judge_agreement",
                                             QUERY_TOKEN)
        assert (kappa, accuracy, reviews) == (pytest.approx(0.5), pytest.approx(0.75), 4)
        assert query(collector, "SELECT reviewer, count(*) FROM reviews GROUP BY 1 ORDER BY 1", QUERY_TOKEN) == [
            ["alice", 2], ["bob", 2]]

        # a reviewer reviews and reads agreement, nothing else; the shared query token names nobody
        refused = httpx.post(f"{collector.admin_url}/api/query", json={"sql": "SELECT 1"}, timeout=30,
                             headers={"Authorization": f"Bearer {ALICE}"})
        assert refused.status_code == 401
        assert review(QUERY_TOKEN, "conv-a", "agree").status_code == 401
        missing = review(ALICE, "conv-nobody", "agree")
        assert missing.status_code == 404 and "no mcp_call_validity score" in missing.json()["error"]
        assert review(ALICE, "conv-a", "maybe").status_code == 400


def test_reviews_are_a_labelled_corpus_the_validity_bench_reads(tmp_path) -> None:
    """`tracejudge export --reviews` writes the reviewed conversations labelled per metric by their reviewers'
    majority; `python bench/validity.py --corpus` measures a metric on them."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    env = {"TRACEJUDGE_REVIEWER_TOKENS": f"alice:{ALICE},bob:{BOB}"}
    cfg = config(tmp_path, 'metrics = ["mcp_call_validity"]\n')
    db = tmp_path / "t.duckdb"
    with CollectorProcess(db, config=cfg, env=env) as collector:
        export(collector, conversations(end=True))
        wait_for(collector, "SELECT 1 FROM latest_scores", 2)
        # alice thinks conv-b's failed call was valid (the server failed, not the call): a per-call label
        for token, conversation, verdict, calls in [
                (ALICE, "conv-a", "agree", []), (BOB, "conv-a", "agree", []),
                (ALICE, "conv-b", "disagree", [{"index": 0, "verdict": "disagree"}]), (BOB, "conv-b", "agree", [])]:
            reply = httpx.post(f"{collector.admin_url}/api/reviews", headers={"Authorization": f"Bearer {token}"},
                               json={"conversation_id": conversation, "metric": "mcp_call_validity",
                                     "verdict": verdict, "calls": calls}, timeout=30)
            assert reply.status_code == 201, reply.text
    from tracejudge.dataset import EvaluationDataset

    reviewed = EvaluationDataset.from_history(db, reviewed_only=True)
    assert [(c.name, c.metadata["human_verdicts"]) for c in reviewed.test_cases] == [
        ("conv-a", {"mcp_call_validity": True}), ("conv-b", {"mcp_call_validity": False})]
    assert len(reviewed.goldens) == 2
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "tracejudge.collector.cli", "export", "--reviews", "--since", "7d",
                           "--to", str(out), "--db", str(db)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (out / "reviews.jsonl").read_text().splitlines()]
    assert [(r["id"], r["labels"]["metrics"], r["labels"]["fault"]) for r in rows] == [
        ("conv-a#v1", {"mcp_call_validity": True}, "clean"),
        ("conv-b#v1", {"mcp_call_validity": False}, "human_fail")]  # a 1-1 tie counts as a fail
    assert rows[1]["labels"]["call_verdicts"] == {"mcp_call_validity": {"0": True}}  # alice's per-call label
    assert rows[0]["labels"]["call_verdicts"] == {} and rows[0]["labels"]["task_verdicts"] == {}
    assert rows[0]["test_case"]["turns"][0]["role"] == "user"
    bench = subprocess.run([sys.executable, str(Path(__file__).parent.parent / "bench" / "validity.py"),
                            "--corpus", str(out / "reviews.jsonl"), "--metric", "mcp_call_validity",
                            "--out", str(tmp_path / "results")], capture_output=True, text=True, timeout=300)
    assert bench.returncode == 0, bench.stderr
    assert "mcp_call_validity: AUC 1.000 accuracy 1.000 (2 scored" in bench.stdout
