"""Property-based: both receivers answer every request with a defined status, stay up, and keep every valid span."""

from __future__ import annotations

import gzip
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.collector_process import CollectorProcess
from tests.support.otlp_json import any_value, request, span

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
HTTP_ANSWERS = {200, 400, 413, 415}
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CollectorProcess]:
    folder: Path = tmp_path_factory.mktemp("fuzz")
    config = folder / "tracejudge.toml"
    config.write_text("[server]\nmax_message_bytes = 1048576\n[scoring]\nmetrics = [\"mcp_call_validity\"]\n")
    with CollectorProcess(folder / "fuzz.duckdb", config=config) as running:
        running.good_names = []  # type: ignore[attr-defined]
        yield running
        rows = httpx.post(f"{running.admin_url}/api/query", json={"sql": "SELECT name FROM spans"}).json()["rows"]
        stored = {r[0] for r in rows}
        missing = [n for n in running.good_names if n not in stored]  # type: ignore[attr-defined]
        code = running.stop()
        log = "".join(running.log_lines[-20:])
        assert code == 0, f"the collector exited {code} after the fuzzing; its last log lines:\n{log}"
        assert missing == [], f"{len(missing)} valid spans of partially valid requests were lost:\n{log}"


junk_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                      max_size=3), max_leaves=10)


@FUZZ
@given(junk=st.dictionaries(st.sampled_from(["traceId", "spanId", "parentSpanId", "name", "kind",
                                             "startTimeUnixNano", "endTimeUnixNano", "attributes", "events",
                                             "links", "status"]), junk_values, max_size=8),
       compress=st.booleans())
def test_http_json_with_a_junk_span_keeps_the_good_one(collector: CollectorProcess, junk: dict, compress: bool) -> None:
    name = f"good-{uuid.uuid4().hex}"
    good = span(int(uuid.uuid4().int % 2**64) or 1, 1, name, attributes={"n": 1})
    body = json.dumps(request(({}, [good, junk])), default=str).encode()
    headers = {"Content-Type": "application/json"}
    if compress:
        body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
    reply = httpx.post(collector.http_url, content=body, headers=headers, timeout=30)
    assert reply.status_code == 200, reply.text  # the good span makes the request at least partially valid
    collector.good_names.append(name)  # type: ignore[attr-defined]


@FUZZ
@given(payload=st.binary(max_size=4096), content_type=st.sampled_from(
    ["application/json", "application/x-protobuf", "application/protobuf", "text/plain", ""]),
       encoding=st.sampled_from(["", "gzip", "deflate", "br"]))
def test_http_arbitrary_bodies_get_a_defined_answer(collector: CollectorProcess, payload: bytes, content_type: str,
                                                   encoding: str) -> None:
    headers = {"Content-Type": content_type}
    if encoding:
        headers["Content-Encoding"] = encoding
    reply = httpx.post(collector.http_url, content=payload, headers=headers, timeout=30)
    assert reply.status_code in HTTP_ANSWERS, (reply.status_code, reply.text)


@FUZZ
@given(payload=st.binary(max_size=4096))
def test_grpc_arbitrary_messages_get_a_defined_answer(collector: CollectorProcess, payload: bytes) -> None:
    with grpc.insecure_channel(collector.grpc_endpoint) as channel:
        export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        try:
            export(payload, timeout=30)
        except grpc.RpcError as exc:
            assert exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED), exc


@FUZZ
@given(value=junk_values)
def test_any_attribute_value_round_trips_to_the_store(collector: CollectorProcess, value: object) -> None:
    name = f"attr-{uuid.uuid4().hex}"
    good = span(int(uuid.uuid4().int % 2**64) or 1, 1, name)
    good["attributes"] = [{"key": "fuzzed", "value": any_value(value)}]
    reply = httpx.post(collector.http_url, content=json.dumps(request(({}, [good])), default=str),
                       headers={"Content-Type": "application/json"}, timeout=30)
    assert reply.status_code == 200, reply.text
    partial = reply.json().get("partialSuccess")
    if partial:  # only integers past 64 bits make a span invalid; OTLP's intValue is an int64
        assert "does not fit in 64 bits" in partial["errorMessage"], partial
        return
    collector.good_names.append(name)  # type: ignore[attr-defined]


def test_the_server_is_still_healthy_after_the_fuzzing(collector: CollectorProcess) -> None:
    assert httpx.get(f"{collector.admin_url}/healthz").status_code == 200
    assert httpx.get(f"{collector.admin_url}/readyz").json()["ready"] is True
