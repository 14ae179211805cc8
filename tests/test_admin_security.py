"""The admin port on its defaults against a hostile web page: DNS rebinding (a foreign Host), cross-site requests
(simple `text/plain` POSTs, foreign Origin), forged login and logout forms, and hostile UI parameters, each as a
request to a real `tracejudge serve`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.collector_process import CollectorProcess
from tests.test_hostile_clients import peak_rss_mb
from tests.test_pipeline import config, export, turn, wait_for
from tests.test_web_ui import form_token

TOKEN = "admin-security-token"
ROUTES = [("GET", "/"), ("GET", "/conversations"), ("GET", "/conversations/conv-1"), ("GET", "/tools"),
          ("GET", "/ui/changes"), ("GET", "/login"), ("POST", "/login"), ("POST", "/logout"), ("GET", "/healthz"),
          ("GET", "/readyz"), ("GET", "/metrics"), ("POST", "/api/query"), ("GET", "/report"),
          ("POST", "/api/score-pending")]


@pytest.fixture(scope="module")
def open_collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CollectorProcess]:
    """As shipped: no token, the admin port on loopback."""
    tmp = tmp_path_factory.mktemp("admin")
    with CollectorProcess(tmp / "t.duckdb", config=config(tmp, '[server]\nadmin_allowed_hosts = ["tj.internal"]\n'
                                                          )) as running:
        yield running


def _send(collector: CollectorProcess, method: str, path: str, **kwargs: object) -> httpx.Response:
    return httpx.request(method, collector.admin_url + path, timeout=30, follow_redirects=False, **kwargs)


@pytest.mark.parametrize("method, path", ROUTES)
def test_no_route_answers_a_host_name_a_rebinding_dns_points_here(open_collector: CollectorProcess, method: str,
                                                                  path: str) -> None:
    reply = _send(open_collector, method, path, headers={"Host": "attacker.example:4319"},
                  json={"sql": "SELECT 1"} if path.startswith("/api/") else None)
    assert reply.status_code == 421 and "admin_allowed_hosts" in reply.json()["error"]


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "[::1]:4319", "10.1.2.3:4319", "tj.internal:4319"])
def test_loopback_addresses_and_configured_names_are_answered(open_collector: CollectorProcess, host: str) -> None:
    assert _send(open_collector, "GET", "/healthz", headers={"Host": host}).status_code == 200
    reply = _send(open_collector, "POST", "/api/query", headers={"Host": host}, json={"sql": "SELECT 42"})
    assert reply.status_code == 200 and reply.json()["rows"] == [[42]]


@pytest.mark.parametrize("path", ["/api/query", "/api/score-pending"])
def test_a_simple_cross_site_post_reaches_no_query_or_judge_work(open_collector: CollectorProcess, path: str) -> None:
    """A page elsewhere can POST text/plain (or a form) without a CORS preflight; only JSON is taken."""
    body = json.dumps({"sql": "SELECT 42"})
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        reply = _send(open_collector, "POST", path, content=body, headers={"Content-Type": content_type})
        assert reply.status_code == 415 and "application/json" in reply.json()["error"]
    for headers in ({"Origin": "https://attacker.example"}, {"Origin": "null"}, {"Sec-Fetch-Site": "cross-site"},
                    {"Sec-Fetch-Site": "same-site"}):
        reply = _send(open_collector, "POST", path, json={"sql": "SELECT 42"}, headers=headers)
        assert reply.status_code == 403, headers
    same = {"Origin": open_collector.admin_url, "Sec-Fetch-Site": "same-origin"}
    assert _send(open_collector, "POST", "/api/query", json={"sql": "SELECT 42"}, headers=same).status_code == 200


def test_the_window_and_score_filters_are_checked(open_collector: CollectorProcess) -> None:
    for query in ("window=9999999d", "window=-1h", "min_score=nan", "max_score=1e400", "result=<b>", "page=-3"):
        assert _send(open_collector, "GET", f"/conversations?{query}").status_code == 200, query


def test_an_id_with_slashes_links_to_its_own_page(open_collector: CollectorProcess) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "weather-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    turn(provider.get_tracer("agent"), "../../tools", "Weather?", "get-weather", {"city": "Oslo"}, "Snow",
         "It snows.", end=True)
    provider.shutdown()
    export(open_collector, list(memory.get_finished_spans()))
    wait_for(open_collector, "SELECT 1 FROM conversations WHERE conversation_id = '../../tools'", 1)
    page = _send(open_collector, "GET", "/conversations").text
    assert 'href="/conversations/..%2F..%2Ftools"' in page and 'href="/conversations/../../tools"' not in page
    shown = _send(open_collector, "GET", "/conversations/..%2F..%2Ftools")
    assert shown.status_code == 200 and "It snows." in shown.text


def test_login_and_logout_forms_from_another_page_are_refused(tmp_path: Path) -> None:
    with CollectorProcess(tmp_path / "t.duckdb", env={"TRACEJUDGE_QUERY_TOKEN": TOKEN}) as collector:
        signed = httpx.post(collector.admin_url + "/login", follow_redirects=False,
                            data={"token": TOKEN, "next": "/", "csrf": form_token(collector)})
        assert signed.status_code == 303
        cookies = signed.cookies
        for data, headers in (({}, {}), ({"csrf": "0" * 64}, {}),
                              ({"csrf": form_token(collector)}, {"Origin": "https://attacker.example"})):
            forged = httpx.post(collector.admin_url + "/logout", data=data, headers=headers, cookies=cookies,
                                follow_redirects=False)
            assert forged.status_code == 403, (data, headers)
        assert httpx.post(collector.admin_url + "/login", data={"token": TOKEN, "next": "/"},
                          follow_redirects=False).status_code == 403  # no form token: not our form
        out = httpx.post(collector.admin_url + "/logout", data={"csrf": form_token(collector)}, cookies=cookies,
                         follow_redirects=False)
        assert out.status_code == 303 and out.headers["Location"] == "/login"


@pytest.mark.parametrize("sql", [
    "SELECT * FROM duckdb_databases", "SELECT * FROM duckdb_databases()", "SELECT * FROM pragma_database_list",
    "SELECT * FROM pg_catalog.pg_settings", "SELECT * FROM information_schema.tables",
    "SELECT * FROM duckdb_settings()",
    "SELECT * FROM read_duckdb('/etc/passwd')", "SELECT * FROM main.duckdb_tables", "SELECT * FROM system.main.spans",
    "WITH x AS (SELECT * FROM duckdb_secrets()) SELECT * FROM x",
    # a WITH name in one subquery must not let the same name elsewhere reach the catalog (found in review)
    "WITH x AS (SELECT 1) SELECT * FROM x, (WITH pragma_database_list AS (SELECT 1) SELECT 2), pragma_database_list",
    "SELECT * FROM (WITH pg_settings AS (SELECT 1) SELECT 1), pg_settings",
    "SHOW TABLES", "SHOW ALL TABLES", "FROM (SHOW ALL TABLES)", "SHOW DATABASES"])
def test_the_query_api_reads_only_tracejudges_tables(open_collector: CollectorProcess, sql: str) -> None:
    reply = _send(open_collector, "POST", "/api/query", json={"sql": sql})
    assert reply.status_code == 403, reply.text
    assert "tracejudge" in reply.json()["error"] or "rename them" in reply.json()["error"]


@pytest.mark.parametrize("sql", [
    "WITH recent AS (SELECT * FROM conversations) SELECT count(*) FROM recent, range(2)",
    "SELECT count(*) FROM spans s JOIN span_resources r USING (service_name)",
    "SELECT count(*) FROM main.latest_scores", "SELECT count(*) FROM (SELECT * FROM mcp_calls) m",
    "SELECT count(*) FROM json_each('[1, 2]')"])
def test_queries_over_its_tables_views_and_ctes_still_run(open_collector: CollectorProcess, sql: str) -> None:
    reply = _send(open_collector, "POST", "/api/query", json={"sql": sql})
    assert reply.status_code == 200, reply.text


def test_a_query_that_builds_gigabytes_is_stopped_in_its_own_process(open_collector: CollectorProcess) -> None:
    """`repeat('x', 600000000)` is built outside DuckDB's memory_limit: in the collector it took the process to
    2.5 GB. In its own capped process it is stopped and reported; the collector's memory does not move."""
    before = peak_rss_mb(open_collector)
    for sql in ("SELECT repeat('x', 600000000)", "SELECT string_agg(repeat('y', 1000000), '') FROM range(2000)"):
        reply = _send(open_collector, "POST", "/api/query", json={"sql": sql})
        assert reply.status_code == 400 and "query_memory" in reply.json()["error"], reply.text[:300]
    assert peak_rss_mb(open_collector) - before < 100, (before, peak_rss_mb(open_collector))
    assert _send(open_collector, "POST", "/api/query", json={"sql": "SELECT 1"}).json()["rows"] == [[1]]


def test_a_query_that_spills_leaves_no_files_behind(tmp_path: Path) -> None:
    """A query's copies and its spill go to a folder of its own next to the database, removed after it, whether it
    completes within its budget or not (found in review: the child spilled into the collector's working
    directory, outside [store] temp_limit)."""
    settings = config(tmp_path, '[store]\nquery_memory = "500MB"\ntemp_limit = "4MB"\n')
    work = tmp_path / "work"
    work.mkdir()
    with CollectorProcess(tmp_path / "db" / "t.duckdb", config=settings, cwd=work) as collector:
        spill = "SELECT count(*) FROM (SELECT md5(i::VARCHAR) g, count(*) FROM range(8000000) t(i) GROUP BY g)"
        reply = _send(collector, "POST", "/api/query", json={"sql": spill})
        assert reply.status_code in (200, 400), reply.text[:300]
        assert not list(work.rglob("*")) and not [p for p in (tmp_path / "db").iterdir() if "query" in p.name]
        after = _send(collector, "POST", "/api/query", json={"sql": "SELECT count(*) FROM spans"})
        assert after.status_code == 200, after.text
