"""Review queues in a real headless Chromium (issue 38): two reviewers sign in with their own tokens and work the
queue with the keyboard alone; the agreement page, the API and `/metrics` then show the kappa their verdicts imply
for a scripted judge whose disagreements with them are known; a reviewer opens nothing but the review pages.
Screenshots go to the test's folder, or to TRACEJUDGE_SCREENSHOTS (the docs' come from there)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.collector_process import CollectorProcess
from tests.support.scripted_server import Reply, Request, completion
from tests.test_pipeline import config, export, query, recorded, turn, wait_for
from tests.test_web_ui import CHROMIUM

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                                "(tests/install-system-packages.sh installs it)")
TOKEN = "review-ui-query-token"
ALICE, BOB = "alice-review-token-0123", "bob-review-token-456789"
# the judge's task completion score per conversation (one task each); it passes at 0.5
JUDGE = {"conv-1": 0.9, "conv-2": 0.8, "conv-3": 0.3, "conv-4": 0.2, "conv-5": 0.7, "conv-6": 0.1}
QUESTION = {cid: f"Question {cid}: what is the weather in city {i}?" for i, cid in enumerate(JUDGE)}
# alice thinks conv-3 was done (the judge failed it) and would score it 0.6; bob agrees with the judge throughout
ALICE_DISAGREES = {"conv-3": "0.6"}


def judge(request: Request) -> Reply:
    if request.judge == "final_reason":
        return completion({"reason": "final"})
    cid = next(c for c, q in QUESTION.items() if q == request.data["task"])
    return completion({"reason": f"judged {cid}", "score": JUDGE[cid]})


def traffic() -> list:
    def agent(tracer: Any) -> None:
        for cid, question in QUESTION.items():
            turn(tracer, cid, question, "get-weather", {"city": cid}, "Sunny", "It is sunny.", end=True)
    return recorded("weather-agent", agent)


@pytest.fixture
def collector(tmp_path: Path, judge_server) -> Iterator[CollectorProcess]:
    judge_server.script = judge
    env = {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret",
           "TRACEJUDGE_QUERY_TOKEN": TOKEN, "TRACEJUDGE_REVIEWER_TOKENS": f"alice:{ALICE},bob:{BOB}"}
    cfg = config(tmp_path, 'metrics = ["mcp_task_completion"]\n[review]\nreviews_per_item = 2\nrandom_rate = 1.0\n')
    with CollectorProcess(tmp_path / "t.duckdb", config=cfg, env=env) as running:
        export(running, traffic())
        wait_for(running, "SELECT 1 FROM scores", len(JUDGE), token=TOKEN)
        yield running
        running.stop()


def work_the_queue(browser, base: str, token: str, disagrees: dict[str, str], shots: Path | None) -> list[str]:
    """Sign in with the reviewer's token and review every item with the keyboard alone; the items reviewed."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto(f"{base}/review")
    assert page.url.startswith(f"{base}/login")
    page.fill("input[name=token]", token)
    with page.expect_navigation():
        page.keyboard.press("Enter")
    assert page.url == f"{base}/review"
    if shots is not None:
        page.screenshot(path=str(shots / "review-queue.png"), full_page=True)
    reviewed = []
    with page.expect_navigation():
        page.keyboard.press("Enter")  # the next item
    while "/review/items/" in page.url:
        cid = page.url.rsplit("/", 1)[1]
        reviewed.append(cid)
        if cid in disagrees:
            page.keyboard.press("d")
            page.keyboard.press("1")  # the judge got task 1 wrong
            page.keyboard.press("s")
            page.keyboard.type(disagrees[cid])
            page.keyboard.press("Escape")
            page.keyboard.press("n")
            page.keyboard.type("The forecast was given: the task is done.")
            page.keyboard.press("Escape")
            if shots is not None:
                page.screenshot(path=str(shots / "review-item.png"), full_page=True)
        else:
            page.keyboard.press("a")
        with page.expect_navigation():
            page.keyboard.press("Enter")  # save; the next item comes
        if page.url.startswith(f"{base}/review/next") or "/review/items/" not in page.url:
            page.wait_for_load_state()
    assert "Nothing is waiting for you" in page.content(), page.url
    assert problems == []
    context.close()
    return reviewed


def test_two_reviewers_work_the_queue_by_keyboard_and_agreement_shows_what_they_said(collector, shots) -> None:
    from playwright.sync_api import sync_playwright

    base = collector.admin_url
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-quic"])
        alice = work_the_queue(browser, base, ALICE, ALICE_DISAGREES, shots)
        bob = work_the_queue(browser, base, BOB, {}, None)
        assert sorted(alice) == sorted(bob) == sorted(JUDGE)  # each reviewer saw every item once

        context = browser.new_context(viewport={"width": 1600, "height": 900})
        page = context.new_page()
        page.goto(f"{base}/login?next=/agreement")
        page.fill("input[name=token]", BOB)
        with page.expect_navigation():
            page.keyboard.press("Enter")
        assert page.url == f"{base}/agreement"
        row = page.locator("#agreement tr", has_text="mcp_task_completion").inner_text()
        page.screenshot(path=str(shots / "review-agreement.png"), full_page=True)
        # a reviewer's session opens the review pages only
        page.goto(f"{base}/conversations")
        assert page.url == f"{base}/review"
        context.close()
        browser.close()

    # 12 reviews: the judge passes 6; people pass 7 (alice's conv-3 too); they agree on 11.
    # observed 11/12, chance 1/2 x 7/12 + 1/2 x 5/12 = 1/2: kappa (11/12 - 1/2) / (1/2) = 5/6
    assert re.search(r"\b0\.83\b", row) and "n=12" in row, row
    # between the reviewers: alice passes 4 of 6, bob 3, they agree on 5: chance 1/2, kappa (5/6 - 1/2) / (1/2)
    assert re.search(r"\b0\.67\b", row), row
    agreement = httpx.get(f"{base}/api/agreement", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    [figures] = agreement.json()["agreement"]
    assert figures["kappa"]["value"] == pytest.approx(5 / 6)
    assert figures["kappa"]["low"] <= 5 / 6 <= figures["kappa"]["high"] and figures["kappa"]["n"] == 12
    assert figures["task_kappa"]["value"] == pytest.approx(5 / 6) and figures["task_kappa"]["n"] == 12
    assert figures["reviewer_kappa"]["value"] == pytest.approx(2 / 3) and figures["reviewer_kappa"]["n"] == 6
    assert figures["mean_abs_diff"]["value"] == pytest.approx(0.3) and figures["mean_abs_diff"]["n"] == 1
    # people passed 7 at judge scores .9 .8 .3 .7 .9 .8 .7, failed 5 at .2 .1 .3 .2 .1: 34.5 of 35 pairs ordered
    assert figures["auc"]["value"] == pytest.approx(34.5 / 35)
    metrics = httpx.get(f"{base}/metrics", timeout=30).text
    [kappa] = re.findall(r'tracejudge_judge_agreement_kappa\{[^}]*metric="mcp_task_completion"[^}]*\} (\S+)', metrics)
    assert float(kappa) == pytest.approx(5 / 6)

    rows = query(collector, "SELECT reviewer, conversation_id, queue_rule, sampling_probability, human_score, note, "
                            "labels FROM reviews ORDER BY reviewer, conversation_id", TOKEN)
    assert [r[0] for r in rows] == ["alice"] * 6 + ["bob"] * 6
    rules = {r[1]: r[2] for r in rows}
    assert rules == {c: ("failing" if s < 0.5 else "random") for c, s in JUDGE.items()}
    assert {r[3] for r in rows} == {1.0}
    [disputed] = [r for r in rows if r[0] == "alice" and r[1] == "conv-3"]
    assert disputed[4] == 0.6 and disputed[5] == "The forecast was given: the task is done."
    assert json.loads(disputed[6]) == {"tasks": [{"index": 0, "judge_pass": False, "human_pass": True}]}

    # a reviewer's cookie or token reaches nothing else: no SQL, no rule edits
    assert httpx.post(f"{base}/api/query", json={"sql": "SELECT 1"}, timeout=30,
                      headers={"Authorization": f"Bearer {ALICE}"}).status_code == 401
