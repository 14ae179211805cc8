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

from collector.history.report_data import ReportError, parse_since
from collector.store.span_store import SpanStore
from tests.support.browser import chromium_path, visit
from tests.support.cases import two_turn_case
from tests.support.collector_process import CollectorProcess
from tests.test_pipeline import config, conversations, export, judge_script, wait_for

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
    return subprocess.run([sys.executable, "-m", "collector.cli", "report", "--url", "http://127.0.0.1:9", *args],
                          capture_output=True, text=True, timeout=120)


PAGE_FACTS = """JSON.stringify({
  title: document.title,
  daily: [...document.querySelectorAll('figure[data-chart=daily]')].map(f => ({
    title: f.dataset.title,
    days: [...f.querySelectorAll('circle[data-series=mean]')].map(c => c.dataset.day),
    drawn: f.querySelector('svg').getBoundingClientRect().width})),
  histograms: [...document.querySelectorAll('figure[data-chart=histogram] rect.bar')]
      .reduce((n, r) => n + Number(r.querySelector('title').textContent.split(': ')[1]), 0),
  costBars: document.querySelectorAll('figure[data-chart=cost] rect.bar').length,
  worst: document.querySelectorAll('details.worst').length,
  pwned: window.__pwned === undefined ? null : window.__pwned,
  shownAsText: document.body.innerText.includes('<script>window.__pwned = 1</script>')
      || [...document.querySelectorAll('details')].some(d => d.textContent.includes('<script>window.__pwned')),
  external: document.querySelectorAll('[src],[href],link,script,iframe').length,
  text: document.body.innerText,
})"""


@pytest.mark.skipif(chromium_path() is None, reason="chromium is not installed (apt-get install chromium)")
def test_the_report_renders_with_a_point_for_every_day_and_no_console_error(tmp_path: Path) -> None:
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
        expected = {f"{m} · {s}": sorted(str(d) for (d,) in con.execute(
            "SELECT day FROM daily_scores WHERE metric = ? AND service_name = ?", [m, s]).fetchall())
            for m, s in con.execute("SELECT DISTINCT metric, service_name FROM scores").fetchall()}
        (latest,) = con.execute("SELECT count(*) FROM latest_scores").fetchone()
    assert {c["title"]: sorted(c["days"]) for c in facts["daily"]} == expected
    assert all(len(days) == DAYS for days in expected.values()) and all(c["drawn"] > 100 for c in facts["daily"])
    assert facts["histograms"] == latest  # every conversation's latest score is in a bin
    assert facts["costBars"] == 7  # one bar per day of the 7-day window, empty days included
    assert facts["worst"] == 10 and "JudgeOutputError: the judge kept answering prose" in facts["text"]
    assert "System One refused the connection" in facts["text"]
    assert facts["pwned"] is None and facts["shownAsText"], "conversation text must be shown, never run"
    assert facts["external"] == 0, "the page must need no network"


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
        assert "mcp_use · weather-agent" in reply.text and "Book an umbrella for me." in reply.text
        bad = httpx.get(f"{collector.admin_url}/report", params={"since": "last tuesday"}, headers=headers)
        assert bad.status_code == 400 and "--since must be like 7d" in bad.json()["error"]
        out = tmp_path / "saved.html"
        done = subprocess.run([sys.executable, "-m", "collector.cli", "report", "--url", collector.admin_url,
                               "--out", str(out)], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "TRACEJUDGE_QUERY_TOKEN": "report-token-123"})
        assert done.returncode == 0, done.stderr
        assert "mcp_task_completion · weather-agent" in out.read_text()
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
