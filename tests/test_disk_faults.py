"""Disk full and a read-only database directory during ingest, on a real (small) tmpfs.

Receivers must answer retryable errors while the store cannot write, acknowledge nothing they did not
commit, and recover by themselves when space returns: the OTel SDK exporter's own retry then succeeds.
Mounting needs root (CI runs as root); elsewhere the tests are skipped with the reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from tests.support.collector_process import CollectorProcess
from tests.support.otlp_json import request, span
from tests.test_pipeline import config, conversations, judge_script, wait_for


@pytest.fixture
def judged(judge_server) -> dict[str, str]:
    judge_server.script = judge_script
    return {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "fs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _remount(mount: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(mount)], check=True)


def _fill(collector: CollectorProcess) -> tuple[int, httpx.Response]:
    """Post padded spans until the store refuses; the spans acknowledged and the refusal."""
    acked = 0
    for i in range(1, 2000):
        spans = [span(10_000 + i, j + 1, "filler", attributes={"pad": os.urandom(300).hex()}) for j in range(200)]
        reply = httpx.post(collector.http_url, json=request(({"service.name": "filler"}, spans)), timeout=30)
        if reply.status_code != 200:
            return acked, reply
        acked += 200
    raise AssertionError("the 3 MB file system never filled up")


def _stored(db: Path) -> int:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT count(*) FROM spans").fetchone()[0]


def _export_while(exporter: HttpSpanExporter, spans: list, fix: callable) -> SpanExportResult:
    """Export in the background (the SDK retries 503 itself), fix the file system meanwhile."""
    result: list[SpanExportResult] = []
    thread = threading.Thread(target=lambda: result.append(exporter.export(spans)))
    thread.start()
    time.sleep(1.5)  # the first attempt and a retry or two meet the fault
    fix()
    thread.join(60)
    return result[0]


def test_disk_full_answers_retryable_loses_nothing_and_recovers(small_fs: Path, tmp_path: Path, judged) -> None:
    db = small_fs / "t.duckdb"
    with CollectorProcess(db, config=config(tmp_path), env=judged) as collector:
        acked, refused = _fill(collector)
        assert acked > 0
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert "No space left on device" in refused.json()["message"]
        ready = httpx.get(f"{collector.admin_url}/readyz", timeout=10)
        assert ready.status_code == 503 and "cannot write" in ready.text
        spans = conversations(end=True)
        exporter = HttpSpanExporter(endpoint=collector.http_url, timeout=60)
        assert _export_while(exporter, spans, lambda: _remount(small_fs, "size=200m")) is SpanExportResult.SUCCESS
        assert httpx.get(f"{collector.admin_url}/readyz", timeout=10).status_code == 200
        assert len(wait_for(collector, "SELECT * FROM scores", 6)) == 6  # scoring carries on after the fault
        assert collector.metric("tracejudge_queued_spans") == 0
        assert collector.stop() == 0
    assert _stored(db) == acked + len(spans)


def test_a_read_only_database_directory_is_a_clear_error_at_start(small_fs: Path) -> None:
    """Linux will not remount a file system read-only while DuckDB holds a file open on it (EBUSY), so the
    read-only case is checked where it happens in practice: at start, with the directory already read-only."""
    _remount(small_fs, "ro")
    db = small_fs / "t.duckdb"
    done = subprocess.run([sys.executable, "-m", "tracejudge.collector.cli", "serve", "--db", str(db),
                           "--grpc-port", "0", "--http-port", "0", "--admin-port", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert str(db) in done.stderr and "Read-only file system" in done.stderr
