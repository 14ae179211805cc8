"""Cohorts compared and the canary gate (issue 39) on a real collector: agents of several versions (the
`service.version` resource attribute, recorded per conversation) whose MCP calls fail at known rates, so call
validity's pass rate per version is known. `tracejudge compare` shows the difference with its interval and which
tool it comes from; the gate fails a worse candidate, passes an equal one, and says "not enough data" (exit 3) with
how many more conversations it needs before it can tell; the Compare page shows the same in a real browser."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.collector_process import CollectorProcess
from tests.test_pipeline import config, export, recorded, turn, wait_for
from tests.test_web_ui import CHROMIUM
from tracejudge.judges.pricing import known_price

TOKEN = "compare-query-token"
# version -> (conversations, how many of them have a failing MCP call)
VERSIONS = {"1.0": (60, 6), "2.0": (60, 30), "3.0": (60, 0), "3.1": (60, 0), "4.0": (5, 0), "4.1": (5, 0)}


def traffic(version: str, conversations: int, failing: int) -> list:
    def agent(tracer: Any) -> None:
        for i in range(conversations):
            failed = i < failing
            with tracer.start_as_current_span("chat gpt-4o-mini", attributes={  # the agent's own model call
                    "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o-mini",
                    "gen_ai.conversation.id": f"v{version}-{i}", "gen_ai.usage.input_tokens": 1000,
                    "gen_ai.usage.output_tokens": 200}):
                pass
            turn(tracer, f"v{version}-{i}", f"Forecast for city {i}?", "get_forecast", {"city": f"c{i}"},
                 "upstream timeout" if failed else "Sunny", "Sorry." if failed else "Sunny.", failed=failed, end=True)
    return recorded("weather-agent", agent, {"service.version": version})


def tracejudge(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracejudge.collector.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


@pytest.fixture
def collector(tmp_path: Path):
    cfg = config(tmp_path, 'metrics = ["mcp_call_validity"]\n[cohorts]\nsaved = {canary = "service.version=2.0"}\n'
                           'watch = [{baseline = "service.version=1.0", candidate = "canary", '
                           'metric = "mcp_call_validity", margin = 0.05}]\n')
    with CollectorProcess(tmp_path / "t.duckdb", config=cfg, env={"TRACEJUDGE_QUERY_TOKEN": TOKEN}) as running:
        for version, (n, failing) in VERSIONS.items():
            export(running, traffic(version, n, failing))
        total = sum(n for n, _ in VERSIONS.values())
        wait_for(running, "SELECT 1 FROM latest_scores", total, timeout=120, token=TOKEN)
        yield running
        running.stop()


def test_compare_and_the_canary_gate_on_a_running_collector_and_its_file(collector, tmp_path, shots) -> None:
    url, env = collector.admin_url, {"TRACEJUDGE_QUERY_TOKEN": TOKEN}
    done = tracejudge("compare", "service.version=1.0", "canary", "--url", url, "--format", "json", env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["conversations"] == {"a": 60, "b": 60}
    # the agent's own tokens from its chat spans, priced at gpt-4o-mini's list price
    assert (result["a"]["agent_input_tokens"], result["a"]["agent_output_tokens"]) == (1000, 200)
    assert result["a"]["agent_cost_usd"] == pytest.approx(known_price("gpt-4o-mini").cost(1000, 200))
    [validity] = result["metrics"]
    assert validity["a"]["pass_rate"]["value"] == pytest.approx(0.9)
    assert validity["b"]["pass_rate"]["value"] == pytest.approx(0.5)
    difference = validity["pass_rate_difference"]
    assert difference["value"] == pytest.approx(-0.4) and difference["low"] < -0.4 < difference["high"] < 0
    assert difference["p_holm"] < 0.001
    [tool] = [t for t in result["tools"] if t["name"] == "get_forecast"]
    assert (tool["a"]["calls"], tool["b"]["calls"]) == (60, 60)
    assert tool["b"]["error_rate"]["value"] == pytest.approx(0.5) and tool["error_rate_difference"]["value"] > 0
    examples = validity["examples"]
    assert examples["name"] == "get_forecast" and examples["b_failing"] and examples["a_passing"]
    assert all(c.startswith("v2.0-") for c in examples["b_failing"])
    assert all(c.startswith("v1.0-") for c in examples["a_passing"])
    table = tracejudge("compare", "service.version=1.0", "service.version=2.0", "--url", url, env=env)
    assert table.returncode == 0 and "mcp_call_validity" in table.stdout and "Holm" in table.stdout

    def gate(baseline: str, candidate: str, margin: str) -> subprocess.CompletedProcess[str]:
        return tracejudge("compare", "--baseline", f"service.version={baseline}", "--candidate",
                          f"service.version={candidate}", "--fail-if-worse", f"mcp_call_validity:{margin}",
                          "--url", url, env=env)

    worse = gate("1.0", "2.0", "0.05")
    assert worse.returncode == 1 and worse.stdout.startswith("FAIL"), worse.stdout + worse.stderr
    same = gate("3.0", "3.1", "0.1")
    assert same.returncode == 0 and same.stdout.startswith("PASS"), same.stdout + same.stderr
    early = gate("4.0", "4.1", "0.1")
    assert early.returncode == 3 and early.stdout.startswith("NOT ENOUGH DATA"), early.stdout + early.stderr
    more = json.loads(tracejudge("compare", "--baseline", "service.version=4.0", "--candidate",
                                 "service.version=4.1", "--fail-if-worse", "mcp_call_validity:0.1", "--format",
                                 "json", "--url", url, env=env).stdout)["more_needed"]
    assert more > 5 and "more judged conversations" in early.stdout
    bad = tracejudge("compare", "service.version", "service.version=2.0", "--url", url, env=env)
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr
    # /metrics: the watched pair's gate, and scores counted by service.version with their weights (all 1 here)
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    assert 'tracejudge_canary_state{baseline="service.version=1.0",candidate="canary",metric="mcp_call_validity"} 1.0' \
        in metrics
    assert ('tracejudge_scores_weighted_total{metric="mcp_call_validity",result="fail",service="weather-agent",'
            'service_version="2.0"} 30.0') in metrics

    if CHROMIUM is not None:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(f"{url}/login?next=/compare")
            page.fill("input[name=token]", TOKEN)
            with page.expect_navigation():
                page.keyboard.press("Enter")
            page.fill("input[name=a]", "service.version=1.0")
            page.fill("input[name=b]", "canary")
            with page.expect_navigation():
                page.click("form.cohorts button[type=submit]")
            assert "a=service.version%3D1.0" in page.url and "b=canary" in page.url  # the link is the comparison
            cell = page.locator("#metrics td.pass-diff .diff-worse")
            assert cell.inner_text().startswith("-40.0 pts")
            assert page.locator("#tools td", has_text="get_forecast").count() == 1
            page.screenshot(path=str(shots / "compare.png"), full_page=True)
            browser.close()

    collector.stop()
    offline = tracejudge("compare", "service.version=1.0", "service.version=2.0", "--db",
                         str(tmp_path / "t.duckdb"), "--format", "json", "--url", "http://127.0.0.1:9")
    assert offline.returncode == 0, offline.stderr
    assert json.loads(offline.stdout)["metrics"][0]["pass_rate_difference"]["value"] == pytest.approx(-0.4)


def test_compare_reads_several_replicas_files_as_one_history(tmp_path) -> None:
    """Replicas each holding one version's traffic (conversations routed to one replica each, as the README asks):
    `--db` twice compares across them, and the gate decides across them too."""
    files = []
    for version in ("1.0", "2.0"):
        folder = tmp_path / version
        folder.mkdir()
        cfg = config(folder, 'metrics = ["mcp_call_validity"]\n')
        with CollectorProcess(folder / "t.duckdb", config=cfg) as running:
            export(running, traffic(version, *VERSIONS[version]))
            wait_for(running, "SELECT 1 FROM latest_scores", VERSIONS[version][0], timeout=120)
            running.stop()
        files += ["--db", str(folder / "t.duckdb")]
    done = tracejudge("compare", "service.version=1.0", "service.version=2.0", *files, "--format", "json")
    assert done.returncode == 0, done.stderr
    [validity] = json.loads(done.stdout)["metrics"]
    assert (validity["a"]["pass_rate"]["n"], validity["b"]["pass_rate"]["n"]) == (60, 60)
    assert validity["pass_rate_difference"]["value"] == pytest.approx(-0.4)
    gate = tracejudge("compare", "--baseline", "service.version=1.0", "--candidate", "service.version=2.0",
                      "--fail-if-worse", "mcp_call_validity:0.05", *files)
    assert gate.returncode == 1 and gate.stdout.startswith("FAIL"), gate.stdout + gate.stderr


def test_an_mcp_servers_own_version_is_a_cohort_key_apart_from_the_agents() -> None:
    """Resource values are kept under `<service.name>:<key>` too: an instrumented MCP server's version is not
    mixed into the agent's."""
    from tracejudge.collector.config import SamplingSettings
    from tracejudge.collector.pipeline.sampling import attribute_keys, attribute_values
    from tracejudge.mapping.spans import Span

    def span(i: int, service: str, version: str) -> Span:
        return Span.from_record({"trace_id": "t" * 32, "span_id": f"{i:016x}", "attributes": {},
                                 "resource": {"service.name": service, "service.version": version}})

    found = attribute_values(attribute_keys(SamplingSettings(), ["service.version"]),
                             [span(1, "weather-agent", "1.4.2"), span(2, "shop-mcp-server", "2.0.1")])
    assert found["service.version"] == {"1.4.2", "2.0.1"}
    assert found["weather-agent:service.version"] == {"1.4.2"}
    assert found["shop-mcp-server:service.version"] == {"2.0.1"}
    from tracejudge.collector.history.compare import parse_cohort

    assert parse_cohort("shop-mcp-server:service.version=2.0.1").attributes == {
        "shop-mcp-server:service.version": "2.0.1"}
