"""Resources and scopes stored once: a database from before schema 13 is converted with nothing lost and the ids
ingest computes, and retention deletes the resources and scopes no span refers to without losing one a later
span needs."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import duckdb
import pytest

from tests.support.otlp_json import request, span
from tracejudge.collector.config import RetentionSettings
from tracejudge.collector.pipeline.retention import Retention
from tracejudge.collector.receivers.span_rows import spans_to_arrow
from tracejudge.collector.store.schema import MIGRATIONS, migrate
from tracejudge.collector.store.span_store import SpanStore
from tracejudge.collector.store.span_tables import prune_unreferenced
from tracejudge.mapping.otlp import decode_otlp

OLD_COLUMNS = ("trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status_code, status_message, "
               "service_name, scope_name, scope_version, attributes, resource_attributes, events, links, "
               "conversation_key, conversation_key_source, received_at")


def _spans(service: str, trace: int, count: int, scope: str = "agent") -> list:
    body = request(({"service.name": service, "host.name": "h1"}, [span(trace, i + 1, f"s{i}") for i in range(count)]))
    body["resourceSpans"][0]["scopeSpans"][0]["scope"] = {"name": scope, "version": "1.0"}
    return decode_otlp(json.dumps(body).encode(), "application/json").spans


def test_a_file_from_before_schema_13_is_converted_with_every_span_and_the_ids_ingest_computes(tmp_path: Path) -> None:
    db = tmp_path / "old.duckdb"
    now = dt.datetime.now(dt.UTC)
    rows = spans_to_arrow(_spans("agent-a", 1, 3) + _spans("agent-b", 2, 2, scope="mcp"), now)
    with duckdb.connect(str(db)) as con:  # the file as schema 12 left it: each row with its resource and scope
        con.execute("CREATE TABLE tracejudge_schema (version INTEGER NOT NULL, applied_at TIMESTAMPTZ)")
        for version in range(1, 13):
            con.execute(MIGRATIONS[version])  # type: ignore[arg-type]
            con.execute("INSERT INTO tracejudge_schema VALUES (?, now())", [version])
        con.register("new", rows.spans)
        con.register("resources", rows.resources)
        con.register("scopes", rows.scopes)
        con.execute("""INSERT INTO spans SELECT s.trace_id, s.span_id, s.parent_span_id, s.name, s.kind, s.start_ns,
            s.end_ns, s.status_code, s.status_message, r.service_name, c.name, c.version, s.attributes, r.attributes,
            s.events, s.links, s.conversation_key, s.conversation_key_source, s.received_at
            FROM new s JOIN resources r USING (resource_id) JOIN scopes c USING (scope_id)""")
        before = con.execute(f"SELECT {OLD_COLUMNS} FROM spans ORDER BY span_id, trace_id").fetchall()
        assert migrate(con) == 12
        after = con.execute(f"SELECT {OLD_COLUMNS} FROM spans ORDER BY span_id, trace_id").fetchall()
        assert after == before and len(after) == 5
        assert con.execute("SELECT count(*) FROM span_resources").fetchone() == (2,)
        assert sorted(con.execute("SELECT resource_id FROM span_resources").fetchall()) == sorted(
            (i,) for i in rows.resources.column("resource_id").to_pylist())
        assert con.execute("SELECT table_type FROM information_schema.tables WHERE table_name = 'spans'"
                           ).fetchone() == ("VIEW",)


async def test_retention_deletes_unreferenced_resources_and_a_later_span_still_gets_its_own(tmp_path: Path) -> None:
    """The writer remembers which ids it stored; pruning runs between its commits and makes it forget them, so
    spans arriving after their resource was pruned store it again instead of pointing at nothing."""
    store = SpanStore(tmp_path / "t.duckdb")
    store.open()
    try:
        old = dt.datetime.now(dt.UTC) - dt.timedelta(days=2)
        await store.write(spans_to_arrow(_spans("agent-a", 1, 3), old))
        await store.write(spans_to_arrow(_spans("agent-b", 2, 2), dt.datetime.now(dt.UTC)))
        con = store.cursor()
        retention = Retention(con, RetentionSettings(spans=86_400), lambda *a, **k: None, tmp_path / "t.duckdb",
                              prune_dictionaries=lambda: store.run_in_writer(prune_unreferenced).result())
        retention.apply()
        assert con.execute("SELECT service_name FROM span_resources").fetchall() == [("agent-b",)]
        await store.write(spans_to_arrow(_spans("agent-a", 3, 1), dt.datetime.now(dt.UTC)))
        assert sorted(con.execute("SELECT trace_id, service_name FROM spans").fetchall()) == [
            ("00000000000000000000000000000002", "agent-b"), ("00000000000000000000000000000002", "agent-b"),
            ("00000000000000000000000000000003", "agent-a")]
    finally:
        store.close()


async def test_a_job_queued_behind_the_stop_is_answered_not_left_waiting(tmp_path: Path) -> None:
    store = SpanStore(tmp_path / "t.duckdb")
    store.open()
    assert store.run_in_writer(lambda con: con.execute("SELECT 42").fetchall()).result(10) == [(42,)]
    store.close()
    late = store.run_in_writer(lambda con: None)
    with pytest.raises(Exception, match="closed"):
        late.result(1)
