"""`tracejudge report` and `/report`: one self-contained HTML page of score history, checked in a real
headless Chromium (Debian's package; `.ci/run` installs it)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import httpx
import pytest

from tests.support.browser import chromium_path, visit
from tests.support.cases import two_turn_case
from tests.support.collector_process import CollectorProcess
from tests.test_pipeline import config, conversations, export, judge_script, wait_for
from tracejudge.collector.store.span_store import SpanStore
from tracejudge.collector.ui.export import IN_FULL, ReportError, parse_since

PAYLOAD = "<script>window.__pwned = 1</script><img src=x onerror='window.__pwned = 2'>"
DAYS = 5


def _history(path: Path) -> None:
    """Five days of scores for two services, one with a hostile conversation text."""
    store = SpanStore(path)
    store.open()
    con = store.cursor()
    noon = dt.datetime.now(dt.UTC).replace(hour=12, minute=0, second=0, microsecond=0)
    case = two_turn_case()
    case["turns"][0]["content"] = f"Find flights {PAYLOAD}"
    for day in range(DAYS):
        for i in range(4):
            conversation, at, service = f"c{day}-{i}", noon - dt.timedelta(days=day), ("svc-a", "svc-b")[i % 2]
            con.execute("INSERT INTO conversations (conversation_id, version, content_hash, status, service_name, "
                        "test_case, assembled_at) VALUES (?, 1, 'h', 'complete', ?, ?, ?)",
                        [conversation, service, json.dumps(case), at])
            for metric, score in (("mcp_use", (i + day) / 10), ("mcp_task_completion", 1 - i / 10)):
                con.execute("INSERT INTO scores (conversation_id, conversation_version, metric, metric_config, "
                            "score, success, reason, evaluation_cost, service_name, scored_at, fallback_reason) "
                            "VALUES (?, 1, ?, 'x', ?, ?, ?, 0.001, ?, ?, ?)",
                            [conversation, metric, score, score >= 0.5, f"reason for {conversation} {PAYLOAD}",
                             service, at, "System One refused the connection" if i == 3 else None])
    con.execute("INSERT INTO eval_jobs (conversation_id, conversation_version, metric, metric_config, status, "
                "attempts, last_error, created_at, updated_at) VALUES ('c0-0', 1, 'mcp_use', 'x', 'failed', 5, "
                "'JudgeOutputError: the judge kept answering prose', now(), now())")
    store.close()


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracejudge.collector.cli", "report", "--url", "http://127.0.0.1:9",
                           *args],
                          capture_output=True, text=True, timeout=120)


PAGE_FACTS = """JSON.stringify({
  title: document.title,
  cards: [...document.querySelectorAll('#content .card .n')].slice(0, 3).map(n => Number(n.textContent)),
  charts: [...document.querySelectorAll('.chart')].map(c => ({
    title: c.querySelector('.t').textContent, days: c.querySelectorAll('circle.mean').length,
    drawn: c.querySelector('svg').getBoundingClientRect().width})),
  failing: [...document.querySelectorAll('#conversations ~ table')][0].querySelectorAll('tr').length - 1,
  details: document.querySelectorAll('section.detail').length,
  linksResolve: [...document.querySelectorAll('a[href]')].every(a => a.getAttribute('href').startsWith('#')
      && (a.getAttribute('href') === '#' || document.getElementById(
          decodeURIComponent(a.getAttribute('href').slice(1))) !== null
          || ['#overview', '#conversations', '#tools'].includes(a.getAttribute('href')))),
  forms: document.querySelectorAll('form').length,
  pwned: window.__pwned === undefined ? null : window.__pwned,
  shownAsText: document.body.innerText.includes('<script>window.__pwned = 1</script>'),
  external: document.querySelectorAll('[src],link,script,iframe').length,
  text: document.body.innerText,
})"""


@pytest.mark.skipif(chromium_path() is None, reason="chromium is not installed (apt-get install chromium)")
def test_the_report_is_the_ui_views_in_one_file_with_no_script_and_no_console_error(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    _history(db)
    out = tmp_path / "out" / "report.html"
    out.parent.mkdir()
    done = _report("--db", str(db), "--since", "7d", "--out", str(out))
    assert done.returncode == 0, done.stderr
    page = visit(out.as_uri(), PAGE_FACTS, screenshot=True)
    (tmp_path / "report.png").write_bytes(page.screenshot or b"")
    assert page.errors == []
    facts = json.loads(page.value)
    with duckdb.connect(str(db), read_only=True) as con:
        [(conversations, failing)] = con.execute(
            "SELECT count(DISTINCT conversation_id), count(DISTINCT conversation_id) FILTER (WHERE NOT success) "
            "FROM latest_scores").fetchall()
        metrics = [m for (m,) in con.execute("SELECT DISTINCT metric FROM scores ORDER BY 1").fetchall()]
    assert facts["cards"] == [conversations, conversations, conversations]  # received, complete, scored
    assert sorted(c["title"] for c in facts["charts"]) == metrics
    assert all(c["days"] == DAYS and c["drawn"] > 100 for c in facts["charts"])  # a point per day with scores
    assert facts["failing"] == failing and facts["details"] == min(IN_FULL, conversations)
    assert facts["linksResolve"] and facts["forms"] == 0, "every link must stay inside the file"
    assert "JudgeOutputError: the judge kept answering prose" in facts["text"]
    assert "System One refused the connection" in facts["text"]
    assert facts["pwned"] is None and facts["shownAsText"], "conversation text must be shown, never run"
    assert facts["external"] == 0, "the page must need no network and run nothing"


def test_collector_serves_the_report_and_the_cli_saves_it(tmp_path: Path, judge_server) -> None:
    judge_server.script = judge_script
    env = {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret",
           "TRACEJUDGE_QUERY_TOKEN": "report-token-123"}
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path), env=env) as collector:
        export(collector, conversations(end=True))
        headers = {"Authorization": "Bearer report-token-123"}
        assert len(wait_for(collector, "SELECT * FROM scores", 6, token="report-token-123")) == 6
        assert httpx.get(f"{collector.admin_url}/report", timeout=30).status_code == 401
        reply = httpx.get(f"{collector.admin_url}/report", params={"since": "1d"}, headers=headers, timeout=60)
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in reply.headers["content-security-policy"]
        assert "Failing conversations" in reply.text and "Book an umbrella for me." in reply.text
        bad = httpx.get(f"{collector.admin_url}/report", params={"since": "last tuesday"}, headers=headers)
        assert bad.status_code == 400 and "--since must be like 7d" in bad.json()["error"]
        out = tmp_path / "saved.html"
        done = subprocess.run([sys.executable, "-m", "tracejudge.collector.cli", "report", "--url", collector.admin_url,
                               "--out", str(out)], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "TRACEJUDGE_QUERY_TOKEN": "report-token-123"})
        assert done.returncode == 0, done.stderr
        assert "mcp_task_completion" in out.read_text() and "MCP servers and tools" in out.read_text()
        collector.stop()


def test_since_accepts_days_hours_weeks_and_dates() -> None:
    today = dt.date(2026, 12, 2)
    assert parse_since("7d", today) == dt.date(2026, 11, 26)
    assert parse_since("1d", today) == today and parse_since("24h", today) == today
    assert parse_since("2w", today) == dt.date(2026, 11, 19)
    assert parse_since("2026-11-01", today) == dt.date(2026, 11, 1)
    with pytest.raises(ReportError, match="--since must be like"):
        parse_since("yesterday", today)


def test_report_refuses_a_symlinked_output_and_a_bad_database(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    victim = tmp_path / "elsewhere" / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "report.html").symlink_to(victim)
    done = _report("--db", str(tmp_path / "none.duckdb"), "--out", str(tmp_path / "report.html"))
    assert done.returncode == 2 and "outside" in done.stderr and victim.read_text() == "keep me"
    done = _report("--db", str(tmp_path / "none.duckdb"), "--out", str(tmp_path / "r.html"))
    assert done.returncode == 2 and "no database file" in done.stderr
    with duckdb.connect(str(tmp_path / "other.duckdb")) as con:
        con.execute("CREATE TABLE x (a INT)")
    done = _report("--db", str(tmp_path / "other.duckdb"), "--out", str(tmp_path / "r.html"))
    assert done.returncode == 2 and "is this a tracejudge database" in done.stderr
