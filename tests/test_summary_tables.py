"""The web UI's summary tables answer what the `latest_scores` and `mcp_calls` views answer, as conversations
get new versions, scores arrive out of order and the collector restarts."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import duckdb
import httpx
import pytest

from tracejudge.collector.pipeline.summary_tables import SummaryTables
from tracejudge.collector.store.span_store import SpanStore
from tracejudge.collector.ui import views


def _case(error: bool, extra_call: bool = False, server: str = "weather") -> str:
    calls = [{"name": "get_weather", "args": {"city": "Paris"},
              "result": {"content": [{"type": "text", "text": "Rainy"}], "isError": error}}]
    if extra_call:
        calls.append({"name": "get_forecast", "args": {"days": "three"}, "result": {"content": []}})
    return json.dumps({
        "turns": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "Rainy.", "mcp_tools_called": calls,
                   "mcp_resources_called": [{"uri": "file:///notes.md", "result": {"contents": []}}]}],
        "mcp_servers": [{"server_name": server, "available_tools": [{"name": "get_weather"},
                                                                       {"name": "get_forecast"}]}]})


def _conversation(con: duckdb.DuckDBPyConnection, cid: str, version: int, case: str) -> None:
    con.execute("INSERT INTO conversations (conversation_id, version, content_hash, status, service_name, agent_name, "
                "turns, mcp_calls, trace_ids, test_case, assembled_at) VALUES (?, ?, ?, 'complete', 'svc', 'agent', "
                "2, 2, ['t'], ?, now())", [cid, version, f"{cid}{version}", case])


def _score(con: duckdb.DuckDBPyConnection, cid: str, version: int, metric: str, score: float,
           breakdown: dict | None = None, config: str = "cfg") -> None:
    con.execute("INSERT INTO scores (conversation_id, conversation_version, metric, metric_config, score, success, "
                "service_name, agent_name, evaluation_cost, breakdown, scored_at) VALUES (?, ?, ?, ?, ?, ?, "
                "'svc', 'agent', 0.01, ?, now())", [cid, version, metric, config, score, score >= 0.5,
                                                    json.dumps(breakdown or {})])


def _same_as_the_views(con: duckdb.DuckDBPyConnection) -> None:
    assert con.execute("SELECT conversation_id, metric, conversation_version, score, success FROM score_summary "
                       "ORDER BY 1, 2").fetchall() == \
        con.execute("SELECT conversation_id, metric, conversation_version, score, success FROM latest_scores "
                    "ORDER BY 1, 2").fetchall()
    assert con.execute("SELECT k.conversation_id, k.version, k.turn, k.kind, k.server, k.name, k.is_error "
                       "FROM call_summary k JOIN conversation_summary c ON c.conversation_id = k.conversation_id "
                       "AND c.version = k.version ORDER BY ALL").fetchall() == \
        con.execute("SELECT conversation_id, conversation_version, turn, kind, server, name, is_error FROM mcp_calls "
                    "ORDER BY ALL").fetchall()
    assert con.execute("SELECT conversation_id, version, mcp_errors FROM conversation_summary ORDER BY 1").fetchall() \
        == con.execute("SELECT conversation_id, conversation_version, count(*) FILTER (WHERE is_error) FROM mcp_calls "
                       "GROUP BY ALL ORDER BY 1").fetchall()
    tools = {(r["server"], r["kind"], r["name"]): (r["calls"], r["invalid_rate"]) for r in views.tools(con, "90d")}
    per_call = con.execute("SELECT coalesce(server, '-'), kind, name, count(*), count(*) FILTER (WHERE "
                           "contains(CAST(violations AS VARCHAR), 'inputSchema')) FROM mcp_calls GROUP BY ALL")
    assert tools == {(srv, kind, name): (calls, bad / calls) for srv, kind, name, calls, bad in per_call.fetchall()}
    assert con.execute("SELECT unnest(invalid_calls) AS c FROM score_summary ORDER BY c").fetchall() == \
        con.execute("SELECT turn || chr(9) || kind || chr(9) || name AS c FROM mcp_calls "
                    "WHERE contains(CAST(violations AS VARCHAR), 'inputSchema') ORDER BY c").fetchall()


@pytest.fixture
def store(tmp_path: Path):
    opened = SpanStore(tmp_path / "t.duckdb")
    opened.open()
    yield opened
    opened.close()


def test_summaries_follow_new_versions_late_scores_and_a_restart(store: SpanStore) -> None:
    con = store.cursor()
    summaries = SummaryTables()
    _conversation(con, "a", 1, _case(error=True))
    _conversation(con, "b", 1, _case(error=False, extra_call=True))
    _conversation(con, "c", 1, _case(error=False, extra_call=True, server="other"))  # the same tool name elsewhere
    _score(con, "a", 1, "mcp_use", 0.2)
    invalid = {"calls": [{"turn": 1, "kind": "tool", "name": "get_forecast",
                          "violations": ["arguments do not match the inputSchema: days"]}]}
    _score(con, "b", 1, "mcp_call_validity", 0.5, invalid)
    summaries.refresh(con)
    _same_as_the_views(con)
    assert con.execute("SELECT mcp_errors FROM conversation_summary WHERE conversation_id = 'a'").fetchone() == (1,)

    _conversation(con, "a", 2, _case(error=False, extra_call=True))  # a late span made a second version
    _score(con, "a", 2, "mcp_use", 0.9)
    _score(con, "a", 1, "mcp_task_completion", 0.4)  # version 1's job finished after version 2 was scored
    summaries.refresh(con)
    _same_as_the_views(con)
    assert con.execute("SELECT version, mcp_errors FROM conversation_summary WHERE conversation_id = 'a'"
                       ).fetchone() == (2, 0)

    # the older version re-scored after version 2's score was summarized: version 2's score stays the latest
    exact = SummaryTables(margin=dt.timedelta(0))
    exact.refresh(con)
    _score(con, "b", 1, "mcp_use", 0.7)  # moves the refresh on past version 2's score
    exact.refresh(con)
    _score(con, "a", 1, "mcp_use", 0.1, config="new-threshold")
    exact.refresh(con)
    _same_as_the_views(con)

    restarted = SummaryTables()  # reads on from where the tables end: nothing counted twice
    _score(con, "a", 2, "mcp_call_validity", 0.5, invalid)
    restarted.refresh(con)
    restarted.refresh(con)
    _same_as_the_views(con)
    assert con.execute("SELECT count(*) FROM call_summary").fetchone() == (3 + 2 + 3 + 3,)


def test_a_conversation_too_large_to_summarise_is_marked_and_the_next_one_is_listed(tmp_path: Path) -> None:
    """20,000 turns of test case (15 MB) cannot be parsed within the 96 MB pool: it is listed without its calls,
    with the reason, and a conversation written after it is summarised in the same refresh."""
    call = {"name": "get_weather", "args": {"city": "Paris" * 10},
            "result": {"content": [{"type": "text", "text": "Rainy " * 40}], "isError": True}}
    huge = json.dumps({"turns": [t for i in range(10_000) for t in (
        {"role": "user", "content": f"Question {i} " * 20},
        {"role": "assistant", "content": "Answer " * 40, "mcp_tools_called": [call, call]})]})
    store = SpanStore(tmp_path / "t.duckdb", memory_limit="96MB", threads=1)
    store.open()
    try:
        con = store.cursor()
        _conversation(con, "huge", 1, huge)
        _conversation(con, "after", 1, _case(error=True))
        logged: list[dict] = []
        SummaryTables(log=lambda level, event, **fields: logged.append({"event": event, **fields})).refresh(con)
        rows = con.execute("SELECT conversation_id, mcp_errors, summary_note IS NOT NULL FROM conversation_summary "
                           "ORDER BY 1").fetchall()
        assert rows == [("after", 1, False), ("huge", None, True)]
        assert con.execute("SELECT DISTINCT conversation_id FROM call_summary").fetchall() == [("after",)]
        assert [e["conversation_id"] for e in logged if e["event"] == "conversation not summarised"] == ["huge"]
        page = views.conversations(con, views.ConversationFilter())
        assert {r["conversation_id"]: r["summary_note"] is not None for r in page.rows} == {"after": False,
                                                                                            "huge": True}
    finally:
        store.close()


def test_a_conversation_of_10000_turns_leaves_the_lists_and_the_report_current(tmp_path: Path) -> None:
    """A real collector given one conversation of 10,000 turns (5,000 agent runs with an MCP call each, 8.5 MB of
    test case) and then a normal one: both are listed and in the report; the summaries never stop refreshing."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tests.support.collector_process import CollectorProcess
    from tests.test_pipeline import config, export, turn, wait_for

    def spans_of(conversation: str, runs: int) -> list:
        memory = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({"service.name": "weather-agent"}))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        tracer = provider.get_tracer("agent")
        with tracer.start_as_current_span("session"):  # one trace: its agent runs are the turns
            for n in range(runs):
                turn(tracer, conversation, f"Question {n}: " + "what is the weather like today? " * 20,
                     "get-weather", {"city": "Paris"}, "Rainy " * 60, "It rains. " * 40, end=n == runs - 1)
        provider.shutdown()
        return list(memory.get_finished_spans())

    big = spans_of("huge", 5000)
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path)) as collector:
        for start in range(0, len(big), 2000):
            export(collector, big[start:start + 2000])
        assert wait_for(collector, "SELECT turns FROM conversations WHERE conversation_id = 'huge'", 1,
                        timeout=120) == [[10_000]]
        export(collector, spans_of("after-huge", 2))
        assert wait_for(collector, "SELECT 1 FROM conversations WHERE conversation_id = 'after-huge'", 1) == [[1]]
        page = httpx.get(f"{collector.admin_url}/conversations", timeout=60).text
        assert "after-huge" in page and ">huge<" in page and "may be stale" not in page
        report = httpx.get(f"{collector.admin_url}/report", timeout=120)
        assert report.status_code == 200 and "after-huge" in report.text
        assert not any("summary refresh failed" in line for line in collector.log_lines)
