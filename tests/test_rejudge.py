"""`tracejudge rejudge`: one stored conversation scored again with today's judge, beside its stored score, on a
running collector and on the file; nothing written either way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.collector_process import CollectorProcess
from tests.support.scripted_server import Reply, Request, completion
from tests.test_pipeline import config, conversations, export, judge_script, query, wait_for


def tracejudge(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracejudge.collector.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


def stricter_judge(request: Request) -> Reply:
    """Today's judge: every task at 0.1, with its own reason."""
    if request.judge == "final_reason":
        return completion({"reason": "stricter final"})
    return completion({"reason": f"stricter {request.judge}", "score": 0.1})


def test_rejudge_shows_the_stored_score_and_todays_side_by_side_and_writes_nothing(tmp_path: Path,
                                                                                   judge_server) -> None:
    judge_server.script = judge_script
    env = {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}
    db = tmp_path / "t.duckdb"
    with CollectorProcess(db, config=config(tmp_path), env=env) as collector:
        export(collector, conversations(end=True))
        wait_for(collector, "SELECT 1 FROM scores WHERE metric = 'mcp_task_completion'", 2)
        stored = query(collector, "SELECT score, reason FROM scores WHERE conversation_id = 'conv-a' "
                                  "AND metric = 'mcp_task_completion'")
        sent_before = len(judge_server.requests)
        judge_server.script = stricter_judge
        url = ["--url", collector.admin_url]
        shown = tracejudge("rejudge", "conv-a", "--metric", "mcp_task_completion", *url, env=env)
        assert shown.returncode == 0, shown.stderr
        score_line = next(line for line in shown.stdout.splitlines() if line.startswith("score"))
        assert f"{stored[0][0]:.2f}" in score_line and "0.10 FAIL" in score_line
        assert "stricter mcp_task_completion" in shown.stdout and "judge exchange(s) made now" in shown.stdout
        answer = json.loads(tracejudge("rejudge", "conv-a", "--metric", "mcp_task_completion", "--json", *url,
                                       env=env).stdout)
        assert answer["stored"]["score"] == stored[0][0] and answer["now"]["score"] == 0.1
        assert [t["score"] for t in answer["now"]["tasks"]] == [0.1, 0.1]
        asked = judge_server.requests[sent_before:]
        assert len(answer["now"]["exchanges"]) == len(asked) // 2  # the two runs asked the same
        sent = [r.body["messages"] for r in asked]  # the tasks are judged at once: in either order
        assert all(e["request"]["messages"] in sent for e in answer["now"]["exchanges"])
        assert query(collector, "SELECT score, reason FROM scores WHERE conversation_id = 'conv-a' "
                                "AND metric = 'mcp_task_completion'") == stored  # nothing written

        unknown = tracejudge("rejudge", "conv-zzz", "--metric", "mcp_use", *url, env=env)
        assert unknown.returncode == 2 and "no conversation 'conv-zzz'" in unknown.stderr
        not_a_metric = tracejudge("rejudge", "conv-a", "--metric", "bleu", *url, env=env)
        assert not_a_metric.returncode == 2 and "not one of [scoring] metrics" in not_a_metric.stderr
        collector.stop()

    offline = tracejudge("rejudge", "conv-b", "--metric", "mcp_use", "--db", str(db), "--config",
                         str(tmp_path / "tracejudge.toml"), "--json", env=env)
    assert offline.returncode == 0, offline.stderr
    answer = json.loads(offline.stdout)
    assert answer["stored"]["score"] is not None and answer["now"]["score"] == 0.1
