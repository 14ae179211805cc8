"""Replicas sharing one history: two collectors publish to a DuckLake on a real PostgreSQL catalog.

PostgreSQL comes from Debian's package (`.ci/run` installs it); the tests start their own server on a
free loopback port and skip, saying why, where the package is missing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.collector_process import CollectorProcess
from tests.support.postgres import PostgresServer
from tests.support.scripted_server import completion
from tests.test_pipeline import export, query, turn
from tracejudge.collector.history.lake import LakeConfig, LakePublisher, open_lake_for_query
from tracejudge.collector.store.span_store import SpanStore

CONVERSATIONS = 3
METRICS = 3


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    if not server.available:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql; .ci/run does)")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def lake(postgres: PostgresServer, tmp_path: Path) -> LakeConfig:
    name = f"lake_{tmp_path.name.lower().replace('-', '_')}"[:60]
    return LakeConfig("postgres:" + postgres.create_database(name), str(tmp_path / "lake-data") + "/", "unused")


def _spans(prefix: str) -> list[Any]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": f"{prefix}-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    for i in range(CONVERSATIONS):
        turn(provider.get_tracer("agent"), f"{prefix}-conv-{i}", f"Question {i}?", "lookup", {"i": i}, "found",
             f"Answer {i}.", end=True)
    provider.shutdown()
    return list(memory.get_finished_spans())


def _config(tmp_path: Path, name: str, lake: LakeConfig) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f"[conversations]\nquiet_period_s = 1\npoll_s = 0.1\n[scoring]\nmodel = \"gpt-4o-mini\"\n"
                    f"[lake]\ncatalog = {json.dumps(lake.catalog)}\ndata_path = {json.dumps(lake.data_path)}\n"
                    f"replica = \"{name}\"\npublish_interval_s = 0.3\n")
    return path


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracejudge.collector.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def _wait_scores(collector: CollectorProcess, expected: int) -> None:
    deadline = time.monotonic() + 60
    while len(query(collector, "SELECT 1 FROM scores")) < expected and time.monotonic() < deadline:
        time.sleep(0.2)


@pytest.mark.lake
def test_two_replicas_publish_concurrently_without_loss_or_duplicates(tmp_path: Path, lake: LakeConfig,
                                                                      judge_server) -> None:
    judge_server.script = lambda r: completion({"reason": "final"} if r.judge == "final_reason"
                                               else {"reason": "ok", "score": 0.5})
    env = {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}
    replicas = {name: CollectorProcess(tmp_path / f"{name}.duckdb", config=_config(tmp_path, name, lake), env=env)
                for name in ("replica-a", "replica-b")}
    for collector in replicas.values():
        collector.start()
    try:
        senders = [threading.Thread(target=export, args=(c, _spans(name))) for name, c in replicas.items()]
        for thread in senders:
            thread.start()
        for thread in senders:
            thread.join(60)
        for collector in replicas.values():
            _wait_scores(collector, CONVERSATIONS * METRICS)
        time.sleep(1.0)  # both keep publishing at once for a few rounds
    finally:
        codes = [c.stop() for c in replicas.values()]  # a clean stop publishes what is left
    assert codes == [0, 0], "".join(replicas["replica-a"].log_lines[-5:] + replicas["replica-b"].log_lines[-5:])

    con = open_lake_for_query(lake)
    per_replica = con.execute("SELECT replica, count(*), count(DISTINCT (conversation_id, conversation_version, "
                              "metric, metric_config)) FROM scores GROUP BY 1 ORDER BY 1").fetchall()
    lake_log = [line for c in replicas.values() for line in c.log_lines if "lake" in line]
    assert per_replica == [("replica-a", 9, 9), ("replica-b", 9, 9)], lake_log
    assert con.execute("SELECT replica, count(*) FROM conversations GROUP BY 1 ORDER BY 1").fetchall() == [
        ("replica-a", CONVERSATIONS), ("replica-b", CONVERSATIONS)]
    assert con.execute("SELECT sum(conversations) FROM daily_scores").fetchone() == (18,)
    con.close()

    # a restart publishes again from the lake's own watermark: nothing twice
    again = CollectorProcess(tmp_path / "replica-a.duckdb", config=_config(tmp_path, "replica-a", lake), env=env)
    with again:
        time.sleep(1.0)
        assert again.stop() == 0
    done = _cli("query", "--lake", "--config", str(tmp_path / "replica-a.toml"), "--format", "json",
                "SELECT replica, count(*) AS n FROM scores GROUP BY 1 ORDER BY 1")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == [["replica-a", 9], ["replica-b", 9]]

    report = tmp_path / "lake-report.html"
    done = _cli("report", "--lake", "--config", str(tmp_path / "replica-a.toml"), "--out", str(report))
    assert done.returncode == 0, done.stderr
    assert "replicas: replica-a, replica-b" in report.read_text() and "Failed jobs are kept" in report.read_text()

    compared = _cli("compare", "service=replica-a-agent", "service=replica-b-agent", "--lake", "--config",
                    str(tmp_path / "replica-a.toml"), "--format", "json")  # cohorts over the lake (issue 39)
    assert compared.returncode == 0, compared.stderr
    metrics = {m["metric"]: m for m in json.loads(compared.stdout)["metrics"]}
    assert set(metrics) == {"mcp_use", "mcp_task_completion", "mcp_call_validity"}
    assert {m["a"]["scored"] for m in metrics.values()} == {m["b"]["scored"] for m in metrics.values()} == {
        CONVERSATIONS}

    union = _cli("query", "--db", str(tmp_path / "replica-a.duckdb"), "--db", str(tmp_path / "replica-b.duckdb"),
                 "--format", "json", "SELECT replica, count(*) FROM latest_scores GROUP BY 1 ORDER BY 1")
    assert union.returncode == 0, union.stderr
    assert json.loads(union.stdout)["rows"] == [["replica_a", 9], ["replica_b", 9]]


@pytest.mark.lake
def test_publishing_is_idempotent_and_picks_up_rows_scored_later(tmp_path: Path, lake: LakeConfig) -> None:
    store = SpanStore(tmp_path / "t.duckdb")
    store.open()
    local = store.cursor()
    insert = ("INSERT INTO scores (conversation_id, conversation_version, metric, metric_config, score, scored_at) "
              "VALUES (?, 1, 'mcp_use', 'c', 0.5, now())")
    local.execute(insert, ["c1"])
    publisher = LakePublisher(store.cursor(), LakeConfig(lake.catalog, lake.data_path, "solo"))
    assert publisher.publish() == {"conversations": 0, "scores": 1}
    assert publisher.publish() == {"conversations": 0, "scores": 0}
    local.execute(insert, ["c2"])
    assert publisher.publish()["scores"] == 1
    publisher.close()
    fresh = LakePublisher(store.cursor(), LakeConfig(lake.catalog, lake.data_path, "solo"))
    assert fresh.publish()["scores"] == 0  # a new process starts from what the lake already holds
    fresh.close()
    store.close()


@pytest.mark.lake
def test_lake_queries_are_read_only_and_confined(tmp_path: Path, lake: LakeConfig) -> None:
    store = SpanStore(tmp_path / "t.duckdb")
    store.open()
    publisher = LakePublisher(store.cursor(), LakeConfig(lake.catalog, lake.data_path, "solo"))
    publisher.publish()
    publisher.close()
    store.close()
    cfg = tmp_path / "tracejudge.toml"
    cfg.write_text(f"[lake]\ncatalog = {json.dumps(lake.catalog)}\n")
    for sql, expected in [("SELECT * FROM read_text('/etc/hostname')", "reads files"),
                          ("SELECT * FROM postgres_query('__ducklake_metadata_lake', 'SELECT 1')", "postgres_query"),
                          ("DELETE FROM scores", "only read-only SELECT"),
                          ("SELECT * FROM json_execute_serialized_sql(json_serialize_sql("
                           "'SELECT * FROM postgres_execute(''__ducklake_metadata_lake'', ''SELECT 1'')'))",
                           "json_execute_serialized_sql"),
                          ("SELECT * FROM ducklake_expire_snapshots('lake', dry_run => true)", "ducklake_expire")]:
        done = _cli("query", "--lake", "--config", str(cfg), sql)
        assert done.returncode == 2 and expected in done.stderr, (sql, done.stderr)
    with duckdb.connect() as con:
        assert con.execute("SELECT 1").fetchone() == (1,)


def test_query_lake_without_a_lake_says_what_to_set(tmp_path: Path) -> None:
    (tmp_path / "tracejudge.toml").write_text("[server]\n")
    done = _cli("query", "--lake", "--config", str(tmp_path / "tracejudge.toml"), "SELECT 1")
    assert done.returncode == 2 and "[lake] catalog" in done.stderr


def test_a_publishing_collector_needs_a_stable_replica_name(tmp_path: Path) -> None:
    (tmp_path / "tracejudge.toml").write_text('[lake]\ncatalog = "postgres:dbname=x host=127.0.0.1"\n')
    done = _cli("serve", "--config", str(tmp_path / "tracejudge.toml"), "--db", str(tmp_path / "t.duckdb"),
                "--grpc-port", "0", "--http-port", "0", "--admin-port", "0")
    assert done.returncode == 2 and "[lake] replica is required" in done.stderr


@pytest.mark.lake
def test_lake_errors_never_show_the_catalog_password(tmp_path: Path, postgres: PostgresServer) -> None:
    from tracejudge.collector.history.lake import LakeError, open_lake

    catalog = f"postgres:dbname=nosuchdb host=127.0.0.1 port={postgres.port} user=nobody password=hunter2-secret"
    with pytest.raises(LakeError) as caught:
        open_lake(LakeConfig(catalog, str(tmp_path) + "/", "r"))
    assert "hunter2-secret" not in str(caught.value) and "password=***" in str(caught.value)


@pytest.mark.lake
def test_a_catalog_crash_mid_run_loses_and_duplicates_nothing(tmp_path: Path, lake: LakeConfig,
                                                              postgres: PostgresServer, judge_server) -> None:
    judge_server.script = lambda r: completion({"reason": "final"} if r.judge == "final_reason"
                                               else {"reason": "ok", "score": 0.5})
    env = {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}
    collector = CollectorProcess(tmp_path / "r.duckdb", config=_config(tmp_path, "replica-c", lake), env=env)
    with collector:
        export(collector, _spans("before"))
        _wait_scores(collector, CONVERSATIONS * METRICS)
        time.sleep(1.0)  # published
        postgres.crash()
        try:
            export(collector, _spans("during"))
            _wait_scores(collector, 2 * CONVERSATIONS * METRICS)
            time.sleep(1.0)  # a few publish rounds fail while the catalog is down
        finally:
            postgres.resume()
        time.sleep(2.0)  # the next rounds reconnect and publish the rest
        assert collector.stop() == 0
    failures = [line for line in collector.log_lines if "lake publish failed" in line]
    assert failures, "the publisher should have met the dead catalog"
    con = open_lake_for_query(lake)
    rows = con.execute("SELECT count(*), count(DISTINCT (conversation_id, conversation_version, metric, "
                       "metric_config)) FROM scores WHERE replica = 'replica-c'").fetchone()
    con.close()
    assert rows == (2 * CONVERSATIONS * METRICS, 2 * CONVERSATIONS * METRICS)


def test_a_lake_without_its_extensions_or_with_another_duckdbs_says_to_install_the_lake_extra(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default install has DuckDB 2 and no lake extensions (they exist for 1.5.5 only): opening a lake says
    which install brings both, whether the package is missing or built for another DuckDB."""
    import importlib

    from tracejudge.collector.history.lake import LakeError, _extension_file, open_lake

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(LakeError, match=r"extension \w+, which is not installed: pip install 'tracejudge\[lake\]'"):
        open_lake(LakeConfig(str(tmp_path / "history.ducklake"), None, "r"))
    monkeypatch.undo()

    package = tmp_path / "packages" / "duckdb_extension_nosuch"
    (package / "extensions" / "v0.0.1").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "extensions" / "v0.0.1" / "nosuch.duckdb_extension").write_bytes(b"\0")
    monkeypatch.syspath_prepend(str(tmp_path / "packages"))
    importlib.invalidate_caches()
    with pytest.raises(LakeError, match=rf"built for DuckDB 0\.0\.1, and this is DuckDB {duckdb.__version__}: "
                                        r"pip install 'tracejudge\[lake\]'"):
        _extension_file("nosuch")


def test_a_publishing_collector_without_the_lake_extra_refuses_to_start_saying_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """On the default install (no lake extensions) `serve` with a `[lake]` catalog stops at start with the install
    to run, instead of starting and failing every publish."""
    import importlib

    from tracejudge.collector.cli import main

    (tmp_path / "tracejudge.toml").write_text('[lake]\ncatalog = "postgres:dbname=x host=127.0.0.1"\nreplica = "r1"\n')
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    # a collector that got past the check would serve until stopped: fail at once instead
    monkeypatch.setattr("tracejudge.collector.commands.serve.serve", lambda *a: pytest.fail("the collector started"))
    code = main(["serve", "--config", str(tmp_path / "tracejudge.toml"), "--db", str(tmp_path / "t.duckdb"),
                 "--grpc-port", "0", "--http-port", "0", "--admin-port", "0"])
    assert code == 2
    assert "[lake] catalog is set, but the lake needs the DuckDB extension" in capsys.readouterr().err
    assert not (tmp_path / "t.duckdb").exists()
