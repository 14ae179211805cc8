"""Calibration from reviews (issue 38, part 4): after reviewers correct the judge, a collector restarted with
`[scoring] calibration = "reviews"` shows the judge their most informative corrections, first in the data block
(after the constant instructions, before the conversation), so every request of a metric opens with the same
cacheable bytes; the metric configuration hash changes with the examples, so old and new scores never blend."""

from __future__ import annotations

import os

import httpx
import pytest

from tests.support.collector_process import CollectorProcess
from tests.support.scripted_server import Reply, Request, completion
from tests.test_pipeline import (
    JUDGED,
    PARIS,
    ROME,
    UMBRELLA,
    config,
    conversations,
    export,
    query,
    recorded,
    turn,
    wait_for,
)
from tracejudge.calibration import CALIBRATION_NOTE
from tracejudge.prompts import DATA_OPEN

TOKEN = "calibration-query-token"
ALICE, BOB = "alice-review-token-0123", "bob-review-token-456789"
LISBON, OSLO = "Weather in Lisbon?", "And in Oslo?"
SCORES = {**JUDGED, LISBON: 0.9, OSLO: 0.2}
NOTE = "The agent said honestly that none were left: that is the right answer."


def judge(request: Request) -> Reply:
    if request.judge == "final_reason":
        return completion({"reason": "final"})
    return completion({"reason": request.judge, "score": SCORES[request.data["task"]]})


def settings(tmp_path, calibration: str) -> os.PathLike:
    return config(tmp_path, f'metrics = ["mcp_task_completion"]\ncalibration = "{calibration}"\n')


def test_reviews_calibrate_the_judge_in_a_cached_prefix_under_a_new_configuration(tmp_path, judge_server) -> None:
    judge_server.script = judge
    env = {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret",
           "TRACEJUDGE_QUERY_TOKEN": TOKEN, "TRACEJUDGE_REVIEWER_TOKENS": f"alice:{ALICE},bob:{BOB}"}
    db = tmp_path / "t.duckdb"
    with CollectorProcess(db, config=settings(tmp_path, "off"), env=env) as collector:
        export(collector, conversations(end=True))
        before = dict(wait_for(collector, "SELECT conversation_id, metric_config FROM scores", 2, token=TOKEN))

        def review(token: str, conversation: str, verdict: str, **extra: object) -> None:
            reply = httpx.post(f"{collector.admin_url}/api/reviews", headers={"Authorization": f"Bearer {token}"},
                               json={"conversation_id": conversation, "metric": "mcp_task_completion",
                                     "verdict": verdict, **extra}, timeout=30)
            assert reply.status_code == 201, reply.text

        # conv-b scored 0.4 (fail); alice passes it at 0.9: the judge is 0.5 off. conv-a scored 0.7 (pass); bob
        # fails it at 0.5 (0.2 off, so it comes second); alice agrees with conv-a (no example: not a correction)
        review(ALICE, "conv-b", "disagree", human_score=0.9, note=NOTE, tasks=[{"index": 0, "verdict": "disagree"}])
        review(BOB, "conv-a", "disagree", human_score=0.5, tasks=[{"index": 1, "verdict": "disagree"}])
        review(ALICE, "conv-a", "agree")
        collector.stop()
    assert before["conv-a"] == before["conv-b"]
    uncalibrated = len(judge_server.requests)

    with CollectorProcess(db, config=settings(tmp_path, "reviews"), env=env) as collector:
        export(collector, recorded("weather-agent", lambda tracer: (
            turn(tracer, "conv-c", LISBON, "get-weather", {"city": "Lisbon"}, "Sunny", "Sunny in Lisbon."),
            turn(tracer, "conv-c", OSLO, "get-weather", {"city": "Oslo"}, "Snow", "Snow in Oslo.", end=True))))
        [[after]] = wait_for(collector, "SELECT metric_config FROM scores WHERE conversation_id = 'conv-c'", 1,
                             token=TOKEN)
        configs = query(collector, "SELECT conversation_id, metric_config FROM scores ORDER BY 1", TOKEN)
        assert any("calibration" in line and '"examples": 2' in line for line in collector.log_lines)
        collector.stop()

    assert after != before["conv-a"]  # a new configuration: the old scores keep theirs, nothing blends
    assert configs == [["conv-a", before["conv-a"]], ["conv-b", before["conv-b"]], ["conv-c", after]]
    asked = [r for r in judge_server.requests[uncalibrated:] if r.judge == "mcp_task_completion"]
    assert sorted(r.data["task"] for r in asked) == sorted([LISBON, OSLO])
    for request in asked:
        assert CALIBRATION_NOTE in request.system
        assert list(request.data)[0] == "reviewed_examples"  # before the conversation
        assert request.data["reviewed_examples"] == [
            {"request": UMBRELLA, "judge_score": 0.4, "reviewer_verdict": "pass", "reviewer_score": 0.9,
             "reviewer_note": NOTE},
            {"request": ROME, "judge_score": 0.7, "reviewer_verdict": "fail", "reviewer_score": 0.5}]
    # both requests open with the same bytes through the last example: the provider's cached prefix holds
    first, second = (r.user for r in asked)
    shared = len(os.path.commonprefix([first, second]))
    assert first.startswith(f"{DATA_OPEN}\n") and first.index(NOTE) < first.index('"task"') <= shared + 10
    assert asked[0].system == asked[1].system
    assert PARIS not in first  # conv-a's first task was not disputed: the disputed one is shown


@pytest.mark.parametrize("calibration", ["sometimes"])
def test_an_unknown_calibration_setting_is_refused_at_start(tmp_path, calibration) -> None:
    from tracejudge.collector.config import ConfigError, load_settings

    with pytest.raises(ConfigError, match="calibration"):
        load_settings(settings(tmp_path, calibration))


def test_the_most_informative_corrections_come_first_in_both_directions() -> None:
    from tracejudge.calibration import CalibrationExample, most_informative

    false_fails = [CalibrationExample(f"ff{i}", 0.1 * i, "pass") for i in range(4)]  # off by 1.0, 0.9, 0.8, 0.7
    false_passes = [CalibrationExample(f"fp{i}", 0.9 - 0.1 * i, "fail", 0.1) for i in range(3)]  # 0.8, 0.7, 0.6
    chosen = most_informative([*false_passes, *false_fails], 5)
    assert [e.request for e in chosen] == ["ff0", "fp0", "ff1", "fp1", "ff2"]  # furthest kind first, in turn
    assert most_informative([*false_fails, *false_passes], 5) == chosen  # the order given does not matter
    assert [e.request for e in most_informative(false_fails, 9)] == ["ff0", "ff1", "ff2", "ff3"]


def test_the_calibration_bench_measures_before_and_after_on_held_out_conversations(tmp_path) -> None:
    import json
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).parent.parent / "bench" / "calibration.py"
    done = subprocess.run([sys.executable, str(bench), "--scripted", "--sample", "40", "--resamples", "200"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results["examples"] > 0 and results["reviewed"] + results["held_out"] <= 41
    for when in ("before", "after"):
        assert results[when]["scored"] == results["held_out"]
        assert 0 <= results[when]["accuracy"]["value"] <= 1
    assert results["before"]["accuracy"] != results["after"]["accuracy"]  # the examples reached the judge
