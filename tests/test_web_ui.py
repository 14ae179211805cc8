"""The web UI in a real headless Chromium (Debian's, driven by Playwright): data from the real pipeline, the
token enforced, filters in the URL, list -> conversation -> back, no console errors, no script from a
conversation ever running, and live updates. Screenshots go to the test's folder, or to
TRACEJUDGE_SCREENSHOTS when set (the README's come from there)."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.collector_process import CollectorProcess
from tests.support.scripted_server import Reply, Request, completion
from tests.test_pipeline import JUDGED, config, conversations, export, query, recorded, turn, wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                                "(tests/install-system-packages.sh installs it)")
TOKEN = "ui-test-token"
XSS = "<script>window.__xss = 1</script><img src=x onerror=\"window.__xss = 2\">"
REAL = Path(__file__).parent / "fixtures" / "real"


def lenient_judge(request: Request) -> Reply:
    """The pipeline tests' scores for their three tasks, 0.7 for every other task."""
    if request.judge == "final_reason":
        return completion({"reason": "final"})
    task = request.data.get("task") if isinstance(request.data, dict) else None
    return completion({"reason": request.judge, "score": JUDGED.get(task, 0.7)})


def hostile_conversation() -> list:
    return recorded("support-agent", lambda tracer: turn(tracer, "conv-xss", f"Show me {XSS}", "get-weather",
                                                         {"city": XSS}, f"result {XSS}", f"Reply {XSS}", end=True))


@pytest.fixture
def ui(tmp_path: Path, judge_server) -> Iterator[CollectorProcess]:
    judge_server.script = lenient_judge
    env = {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret",
           "TRACEJUDGE_QUERY_TOKEN": TOKEN}
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path), env=env) as collector:
        export(collector, conversations(end=True))
        export(collector, hostile_conversation())
        for fixture in sorted(REAL.glob("*.otlp.json")):  # Semantic Kernel's messages are in its log file
            url = collector.http_url.replace("/v1/traces", "/v1/logs") if fixture.name.endswith(".logs.otlp.json") \
                else collector.http_url
            httpx.post(url, content=fixture.read_bytes(), headers={"Content-Type": "application/json"})
        wait_for(collector, "SELECT 1 FROM scores WHERE metric = 'mcp_use'", 3, token=TOKEN)
        wait_for(collector, "SELECT 1 FROM conversations", 14, token=TOKEN)
        yield collector
        collector.stop()


def test_the_ui_in_a_real_browser(ui: CollectorProcess, shots: Path) -> None:
    from playwright.sync_api import sync_playwright

    base = ui.admin_url
    assert httpx.get(f"{base}/conversations", follow_redirects=False).status_code == 303  # the token is enforced
    assert httpx.get(f"{base}/ui/changes").status_code == 401
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-quic"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("console", lambda m: problems.append(f"console {m.type} on {page.url}: {m.text}")
                if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.goto(f"{base}/conversations?result=fail")
        assert page.url.startswith(f"{base}/login")
        page.fill("input[name=token]", "wrong")
        page.click("form.filters button[type=submit]")
        page.wait_for_selector("text=That token is not right.")
        page.fill("input[name=token]", TOKEN)
        with page.expect_navigation():
            page.click("form.filters button[type=submit]")
        assert page.url == f"{base}/conversations?result=fail"  # back where the user was going, filters kept
        cookie = next(c for c in page.context.cookies() if c["name"] == "tracejudge_session")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"

        page.goto(f"{base}/")
        assert page.locator(".card .l", has_text="conversations received").count() == 1
        # all the test's scores fall in one hour's bucket: numbers, not a lone dot
        assert page.locator(".chart table.few").count() > 0 and page.locator(".chart svg circle").count() == 0
        spans_row = page.locator("h2:has-text('Storage') + .grid2 tr", has_text="spans").first.inner_text().split()
        assert spans_row[0] == "spans" and int(spans_row[1]) > 0  # rows per table, as /metrics has them
        page.screenshot(path=str(shots / "overview.png"), full_page=True)

        page.goto(f"{base}/conversations")
        rows = page.locator("table tr")
        assert rows.count() >= 15  # header + every conversation
        page.select_option("select[name=mcp_error]", "1")
        with page.expect_navigation():
            page.click("form.filters button[type=submit]")
        assert "mcp_error=1" in page.url
        listed = page.locator("table td a").all_inner_texts()
        assert "conv-b" in listed and "conv-a" not in listed
        page.screenshot(path=str(shots / "conversations.png"), full_page=True)
        with page.expect_navigation():
            page.click("text=conv-b")
        assert page.url.endswith("/conversations/conv-b")
        assert page.locator(".call.error .violation").count() >= 1  # the failed call carries its violation
        assert page.locator("text=book-umbrella").count() >= 1
        page.go_back()
        assert "mcp_error=1" in page.url and page.locator("select[name=mcp_error]").input_value() == "1"

        page.goto(f"{base}/conversations/conv-xss")
        assert page.locator(".turn .text", has_text="<script>window.__xss = 1</script>").count() >= 1
        assert page.evaluate("window.__xss") is None  # shown as text, never run
        page.goto(f"{base}/conversations/conv-fw-strands")
        page.screenshot(path=str(shots / "conversation.png"), full_page=True)
        _spans_behind_the_transcript(page, ui, shots)
        page.goto(f"{base}/tools")
        assert page.locator("td strong", has_text="get_weather").count() >= 1
        page.screenshot(path=str(shots / "tools.png"), full_page=True)

        page.goto(f"{base}/conversations")  # live: a new conversation shows up without a reload
        export(ui, _one("conv-live"))
        page.wait_for_selector("text=conv-live", timeout=30_000)
        browser.close()
    assert problems == []


def _recorded_spans(fixture: str, traces: set[str]) -> dict[str, dict]:
    """The fixture's spans of these traces, by span id, straight from the recorded OTLP JSON (not our mapping)."""
    spans = {}
    for resource in json.loads((REAL / fixture).read_text())["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                if span["traceId"] in traces:
                    attributes = {a["key"]: next(iter(a["value"].values())) for a in span.get("attributes", [])}
                    spans[span["spanId"]] = {**span, "attributes": attributes}
    return spans


def _spans_behind_the_transcript(page, ui: CollectorProcess, shots: Path) -> None:  # noqa: ANN001
    """Strands' recorded MCP agent: every recorded span of its traces is in the tree, parents above their
    children and each trace's earliest span first; a call's link lights up the spans that recorded it; the
    agent's tokens are the sum of its recorded chat spans' usage."""
    [[trace_ids]] = query(ui, "SELECT trace_ids FROM conversations WHERE conversation_id = 'conv-fw-strands' "
                              "ORDER BY version DESC LIMIT 1", token=TOKEN)
    recorded = _recorded_spans("strands.otlp.json", set(trace_ids))
    page.goto(f"{ui.admin_url}/conversations/conv-fw-strands")
    shown = [row.get_attribute("id").removeprefix("span-") for row in page.locator("table.spans tr[id^=span-]").all()]
    assert sorted(shown) == sorted(recorded)
    position = {span: i for i, span in enumerate(shown)}
    for span_id, span in recorded.items():
        if span.get("parentSpanId") in recorded:
            assert position[span["parentSpanId"]] < position[span_id]
    for trace in trace_ids:
        rows = [s for s in shown if recorded[s]["traceId"] == trace]
        assert int(recorded[rows[0]]["startTimeUnixNano"]) == min(int(recorded[s]["startTimeUnixNano"]) for s in rows)

    link = page.locator(".call a.to-spans").first
    lit = link.get_attribute("data-spans").split()
    link.click()
    assert sorted(r.get_attribute("id") for r in page.locator("table.spans tr.hl").all()) == \
        sorted(f"span-{s}" for s in lit)
    called = page.locator(".call strong").first.inner_text()
    assert all(called in json.dumps(recorded[s]) for s in lit)  # each lit span recorded that call

    chats = [s for s in recorded.values() if s["attributes"].get("gen_ai.operation.name") == "chat"]
    tokens_in = sum(int(s["attributes"]["gen_ai.usage.input_tokens"]) for s in chats)
    tokens_out = sum(int(s["attributes"]["gen_ai.usage.output_tokens"]) for s in chats)
    card = page.locator(".card", has_text="agent tokens in / out").locator(".n").inner_text()
    assert card == f"{tokens_in:,} / {tokens_out:,}"
    assert page.locator(".card", has_text="agent model cost").locator(".n").inner_text() == "unknown"  # no price

    given = page.locator("table.given tr")  # what each model call was given, against the call before
    assert given.count() == 1 + len(chats)
    given.nth(1).locator("details summary").first.click()
    assert "You are a helpful weather assistant." in given.nth(1).inner_text()  # the generator's system prompt
    assert all("same as the call before" in given.nth(i).inner_text() for i in range(2, given.count()))

    first = page.locator("table.spans details[data-src]").first
    first.locator("summary").click()
    page.wait_for_selector("table.spans tr.span-detail .attrs table")
    page.locator("#model-inputs").scroll_into_view_if_needed()
    page.evaluate("document.getElementById('model-inputs').scrollIntoView()")
    page.screenshot(path=str(shots / "conversation-spans.png"))


def _one(conversation: str) -> list:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "live-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    turn(provider.get_tracer("agent"), conversation, "Hello?", "get-weather", {"city": "Oslo"}, "Snow",
         "It snows.", end=True)
    provider.shutdown()
    return list(memory.get_finished_spans())


def test_mcp_calls_view_answers_which_tool_fails(ui: CollectorProcess) -> None:
    rows = wait_for(ui, "SELECT name, count(*), sum(is_error::INT) FROM mcp_calls GROUP BY 1 ORDER BY 1", 1,
                    token=TOKEN)
    by_tool = {name: (calls, errors) for name, calls, errors in rows}
    assert by_tool["book_umbrella"][1] == by_tool["book_umbrella"][0] > 0  # it always fails
    assert by_tool["get_weather"][1] == 0
    violations = httpx.post(f"{ui.admin_url}/api/query", headers={"Authorization": f"Bearer {TOKEN}"}, json={
        "sql": "SELECT violations FROM mcp_calls WHERE conversation_id = 'conv-b'"}).json()["rows"]
    assert any("isError" in json.dumps(v) for (v,) in violations)


def form_token(collector: CollectorProcess) -> str:
    """The CSRF token the login form carries (a page elsewhere cannot read it)."""
    page = httpx.get(f"{collector.admin_url}/login").text
    return re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)  # type: ignore[union-attr]


@pytest.mark.parametrize("target", ["//evil.example/", "/\\evil.example/", "https://evil.example/",
                                    "/\t/evil.example/", "/\r/evil.example/"])
def test_login_never_sends_a_user_to_another_site(tmp_path: Path, target: str) -> None:
    with CollectorProcess(tmp_path / "t.duckdb", env={"TRACEJUDGE_QUERY_TOKEN": TOKEN}) as collector:
        reply = httpx.post(f"{collector.admin_url}/login", data={"token": TOKEN, "next": target,
                                                                 "csrf": form_token(collector)},
                           follow_redirects=False)
        assert reply.status_code == 303 and reply.headers["Location"] == "/"
        collector.stop()


def test_odd_parameters_and_foreign_hosts_get_answers_not_errors(tmp_path: Path) -> None:
    with CollectorProcess(tmp_path / "t.duckdb") as collector:  # no token: loopback visitors only
        for path in ("/conversations?page=\u00b2", "/conversations?page=99999999999999999999",
                     "/conversations/x?version=\u00b2", "/conversations/a%3Fb"):
            assert httpx.get(f"{collector.admin_url}{path}").status_code in (200, 404), path
        rebound = httpx.get(f"{collector.admin_url}/conversations", headers={"Host": "evil.example"},
                            follow_redirects=False)
        assert rebound.status_code == 421  # a DNS name pointed at this port is not this machine's user
        collector.stop()


def test_spend_of_a_judge_with_no_known_price_reads_unknown_not_zero(tmp_path: Path, judge_server) -> None:
    """A local judge (no price in tracejudge's table): its scores cost None, so the day's spend is unknown, not the
    $0.0000 that summing the deterministic metric's zeros would say."""
    judge_server.script = lenient_judge
    env = {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}
    settings = config(tmp_path).read_text().replace('model = "gpt-4o-mini"', 'model = "qwen2.5:14b-local"')
    (tmp_path / "tracejudge.toml").write_text(settings)
    with CollectorProcess(tmp_path / "t.duckdb", config=tmp_path / "tracejudge.toml", env=env) as collector:
        export(collector, conversations(end=True))
        wait_for(collector, "SELECT 1 FROM scores WHERE metric = 'mcp_use'", 2)
        rows = wait_for(collector, "SELECT evaluation_cost FROM scores WHERE metric = 'mcp_use'", 2)
        assert {cost for (cost,) in rows} == {None}
        page = httpx.get(f"{collector.admin_url}/", timeout=30).text
        spend = page[page.index("Judge spend per day"):]
        spend = spend[:spend.index("</table>")]
        assert "unknown" in spend and "$0.0000" not in spend
