"""Small requests that used to multiply into gigabytes, sent to a real `tracejudge serve` on its defaults: each is
answered finally (stored, or refused with 400 naming the limit, never a 503 the exporter retries forever), the
server's peak memory stays bounded, `/readyz` stays ready and a normal exporter keeps being served."""

from __future__ import annotations

import gzip
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from tests.support.amplified_requests import AMPLIFIED, MiB, repeated_key_request, spans_request, text_attribute
from tests.support.collector_process import CollectorProcess
from tests.test_hostile_clients import EXPORT, exporter_still_served, peak_rss_mb
from tracejudge.collector.store.connection.arrow_reads import DUCKDB_MAJOR


def _post(collector: CollectorProcess, body: bytes) -> httpx.Response:
    return httpx.post(collector.http_url, content=gzip.compress(body), timeout=60,
                      headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CollectorProcess]:
    with CollectorProcess(tmp_path_factory.mktemp("amplification") / "t.duckdb") as running:
        yield running


@pytest.mark.parametrize("case", list(AMPLIFIED))
def test_a_request_that_once_multiplied_is_stored_once_with_memory_bounded(collector: CollectorProcess,
                                                                           case: str) -> None:
    body = AMPLIFIED[case]
    assert len(gzip.compress(body)) < 200_000
    reply = _post(collector, body)
    assert reply.status_code == 200, reply.text
    assert httpx.get(collector.admin_url + "/readyz", timeout=10).status_code == 200
    assert peak_rss_mb(collector) < 400, "the server's peak memory"
    exporter_still_served(collector)


def test_its_spans_read_back_through_the_spans_view_with_their_resource_and_scope(collector: CollectorProcess) -> None:
    reply = _post(collector, AMPLIFIED["1 MB scope on 1,000 spans"])
    assert reply.status_code == 200, reply.text
    scope = "count(*), count(DISTINCT scope_name), max(length(scope_name)), max(length(scope_version))"
    resource = ("any_value(service_name), "
                "any_value(json_extract_string(resource_attributes, '$.\"service.name\"'))")
    asked = [httpx.post(collector.admin_url + "/api/query", timeout=60, json={"sql": (
        f"SELECT {columns} FROM spans WHERE trace_id = '00000000000000000000000000000001'")})
        for columns in (scope, f"count(*), {resource}", f"{scope}, {resource}")]
    assert [answer.json().get("rows") for answer in asked[:2]] == [[[1000, 1, MiB, MiB]], [[1000, "a", "a"]]]
    together = asked[2]
    if DUCKDB_MAJOR >= 2 and together.status_code == 400:  # DuckDB 2 needs more than the 488 MB a query may use
        assert "needs more memory than a query may use" in together.json()["error"], together.text
    else:
        assert together.json()["rows"] == [[1000, 1, MiB, MiB, "a", "a"]], together.text


def test_a_request_whose_rows_would_pass_what_a_commit_holds_is_refused_finally(collector: CollectorProcess) -> None:
    """A resource's conversation key is on every row: 300 KiB of it on 1,000 spans would be 300 MB to commit into a
    96 MB buffer pool. Refused before it is built, with the limit named, over HTTP and gRPC; memory goes back."""
    body = repeated_key_request()
    for _ in range(3):
        reply = _post(collector, body)
        assert reply.status_code == 400 and "request_row_bytes" in reply.text, reply.text
    with grpc.insecure_channel(collector.grpc_endpoint) as channel:
        export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as refused:
            export(body, timeout=60)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "request_row_bytes" in (refused.value.details() or "")
    assert httpx.get(collector.admin_url + "/readyz", timeout=10).status_code == 200
    assert peak_rss_mb(collector) < 1024
    deadline = time.monotonic() + 30
    while peak_rss_mb(collector, "VmRSS") >= 600 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert peak_rss_mb(collector, "VmRSS") < 600, "memory went back after the refused requests"
    exporter_still_served(collector)


def test_one_resource_is_one_row_however_many_requests_bring_it(collector: CollectorProcess) -> None:
    for trace in (10, 11, 12):
        reply = _post(collector, spans_request([text_attribute("service.name", "same"), text_attribute("k", "v")], 5,
                                               ("s", "1"), trace))
        assert reply.status_code == 200, reply.text
    rows = httpx.post(collector.admin_url + "/api/query", timeout=60, json={"sql": (
        "SELECT (SELECT count(*) FROM span_resources WHERE service_name = 'same'), "
        "(SELECT count(*) FROM span_scopes WHERE name = 's'), "
        "(SELECT count(*) FROM spans WHERE service_name = 'same' AND scope_version = '1')")}).json()["rows"]
    assert rows == [[1, 1, 15]]


def test_a_request_past_what_memory_holds_fails_alone_and_the_collector_stays_ready(tmp_path: Path) -> None:
    """With the row limit raised past the buffer pool (a misconfiguration), such a request fails at commit with a
    retryable answer; the store can still write, so `/readyz` stays ready and other exporters are served."""
    config = tmp_path / "tracejudge.toml"
    config.write_text('[limits]\nrequest_row_bytes = "1GB"\n')
    with CollectorProcess(tmp_path / "t.duckdb", config=config) as running:
        reply = _post(running, spans_request([text_attribute("session.id", "k" * 300 * 1024)], 700, trace=5))
        assert reply.status_code == 503 and "could not commit" in reply.text, reply.text
        assert httpx.get(running.admin_url + "/readyz", timeout=10).status_code == 200
        exporter_still_served(running)
