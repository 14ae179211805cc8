"""The hostile-client attacks of RELIABILITY.md at full size, against a real `tracejudge serve` on loopback.

For each attack: the server's peak RSS with its decode workers (VmHWM of each process, summed, and the most
they held together at one moment, sampled every 20 ms), what the attacking
clients got, how long the attack ran, and the slowest acknowledgement a normal exporter got meanwhile (it
exports one small batch every 0.2 s). Every request loop is bounded. Run: `python bench/attacks.py
[--only NAME]`; it takes a few minutes and up to ~3 GB of the machine's memory for the attack payloads.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk.trace.export import SpanExportResult

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.amplified_requests import AMPLIFIED, repeated_key_request  # noqa: E402
from tests.support.at_once import at_once  # noqa: E402
from tests.support.collector_process import CollectorProcess  # noqa: E402
from tests.test_ingest import agent_spans  # noqa: E402

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
TOKEN = "attack-bench-token"
MiB = 1024 * 1024


def _hwm_mb(pid: int, field: str = "VmHWM") -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"PPid:\t{pid}\n" in (entry / "status").read_text():
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


class Probe:
    """A normal exporter beside the attack: the slowest acknowledgement it got, and failures."""

    def __init__(self, collector: CollectorProcess) -> None:
        self.exporter = OTLPSpanExporter(endpoint=collector.grpc_endpoint, insecure=True, timeout=30,
                                         headers={"authorization": f"Bearer {TOKEN}"})
        self.worst, self.failures, self._stop = 0.0, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            started = time.perf_counter()
            ok = self.exporter.export(agent_spans(1, conversation=f"probe-{n}")) is SpanExportResult.SUCCESS
            self.worst = max(self.worst, time.perf_counter() - started)
            self.failures += not ok
            self._stop.wait(0.2)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class Together:
    """The most the server and its children held at one moment (their RSS summed every 20 ms): the memory the
    machine had to have, where the sum of each process's own peak counts peaks that did not coincide."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        pids, listed = [self.pid], 0.0
        while not self._stop.wait(0.02):
            if time.monotonic() - listed > 1:
                pids, listed = [self.pid, *_children(self.pid)], time.monotonic()
            self.peak = max(self.peak, sum(_hwm_mb(pid, "VmRSS") for pid in pids))

    def __enter__(self) -> Together:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run(name: str, attack: Callable[[CollectorProcess], str], config: str = "") -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "tracejudge.toml"
        cfg.write_text(config + '\n[scoring]\nmetrics = ["mcp_call_validity"]\n')
        env = {"TRACEJUDGE_INGEST_TOKEN": TOKEN, "TRACEJUDGE_QUERY_TOKEN": TOKEN}
        with CollectorProcess(Path(tmp) / "t.duckdb", config=cfg, env=env) as collector:
            assert collector.proc is not None
            time.sleep(1)
            workers = _children(collector.proc.pid)
            with Probe(collector) as probe, Together(collector.proc.pid) as together:
                started = time.perf_counter()
                result = attack(collector)
                took = time.perf_counter() - started
            server = _hwm_mb(collector.proc.pid)
            # each child once (the decode workers and multiprocessing's resource tracker), those at the start and
            # any started since; a worker that died during the attack reads 0 MB
            pool = dict.fromkeys([*workers, *_children(collector.proc.pid)])
            total = server + sum(_hwm_mb(w) for w in pool)
            alive = httpx.get(f"{collector.admin_url}/healthz", timeout=10).status_code == 200
            print(f"{name}: {result}; attack {took:.1f} s; peak RSS server {server:.0f} MB, with workers "
                  f"{total:.0f} MB (at one moment: {together.peak:.0f} MB); normal exporter: slowest ack "
                  f"{probe.worst:.2f} s, {probe.failures} failed; "
                  f"healthz {'ok' if alive else 'DOWN'}", flush=True)
            collector.stop()


def grpc_unauthenticated(collector: CollectorProcess) -> str:
    payload = b"\x0a" + b"\xff" * (60 * MiB)
    codes: Counter[str] = Counter()

    def send() -> None:
        with grpc.insecure_channel(collector.grpc_endpoint,
                                   options=[("grpc.max_send_message_length", 100 * MiB)]) as channel:
            try:
                channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)(payload, timeout=120)
                codes["OK"] += 1
            except grpc.RpcError as exc:
                codes[exc.code().name] += 1

    at_once(send, 40)
    return f"40 x 60 MiB unauthenticated gRPC exports -> {dict(codes)}"


def gzip_members(collector: CollectorProcess) -> str:
    body = gzip.compress(b"") * 600_000
    reply = httpx.post(collector.http_url, content=body, timeout=300, headers={
        "Content-Type": "application/x-protobuf", "Content-Encoding": "gzip", "Authorization": f"Bearer {TOKEN}"})
    return f"12 MB of 600,000 empty gzip members -> HTTP {reply.status_code}"


def queries(collector: CollectorProcess) -> str:
    answers = []
    for sql in ("SELECT string_agg(repeat('x', 1000000), '') FROM range(4000)",
                "SELECT list(i) FROM range(1000000000) t(i)",
                "WITH RECURSIVE r(s) AS (SELECT 'x' UNION ALL SELECT s || s FROM r WHERE length(s) < 4e9) "
                "SELECT length(s) FROM r",
                "SELECT i FROM range(1000000000) t(i) ORDER BY hash(i)",
                "SELECT repeat('x', 5000000) FROM range(100)"):
        reply = httpx.post(f"{collector.admin_url}/api/query", json={"sql": sql}, timeout=300,
                           headers={"Authorization": f"Bearer {TOKEN}"})
        body = reply.json()
        answers.append(f"{reply.status_code}" + (" truncated" if body.get("truncated") else ""))
    return f"5 memory-hungry queries -> {', '.join(answers)}"


def concurrent_queries(collector: CollectorProcess) -> str:
    """The heaviest of them four times at once (the most /api/query lets in flight): each builds a 500 MB vector
    outside memory_limit, so what matters is how many run together."""
    answers: list[int] = []

    def one() -> None:
        reply = httpx.post(f"{collector.admin_url}/api/query", timeout=300,
                           headers={"Authorization": f"Bearer {TOKEN}"},
                           json={"sql": "SELECT repeat('x', 5000000) FROM range(100)"})
        answers.append(reply.status_code)

    at_once(one, 4)
    return f"4 concurrent 500 MB-vector queries -> {', '.join(map(str, sorted(answers)))}"


def slow_clients(collector: CollectorProcess) -> str:
    port = int(collector.http_url.rsplit(":", 1)[1].split("/")[0])
    held: list[socket.socket] = []
    refused = 0
    for _ in range(1100):
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")
            held.append(sock)
        except OSError:
            refused += 1
    for _ in range(30):
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                         b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: "
                         + str(50 * MiB).encode() + b"\r\n\r\n" + b"\x00" * MiB)
            held.append(sock)
        except OSError:  # past the connection cap the server closes at once: refused, as it should be
            refused += 1
    time.sleep(15)
    still_open = 0
    for sock in held:
        sock.settimeout(0.05)
        try:
            sock.recv(1)  # b"" (closed) or the server's answer (408): either way not held open
        except TimeoutError:
            still_open += 1
        except OSError:
            pass
        sock.close()
    return (f"1,100 slowloris connections and 30 stalled 50 MiB bodies -> {refused} closed at once, {still_open} "
            "still open after 15 s")


@functools.cache
def _wide_span() -> bytes:
    """Built before the normal exporter starts: building it holds this process's GIL for seconds, which the
    exporter's thread would otherwise count as the collector's delay."""
    attributes = [KeyValue(key=f"k{i}", value=AnyValue(string_value="v")) for i in range(3_300_000)]
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[Span(
        trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="wide", attributes=attributes, start_time_unix_nano=1,
        end_time_unix_nano=2)])])]).SerializeToString()


def big_decodes(collector: CollectorProcess) -> str:
    empties = b'{"resourceSpans": [' + b"{}," * (21 * MiB) + b"{}]}"
    json_reply = httpx.post(collector.http_url, content=empties, timeout=300, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    wide = _wide_span()
    pb_reply = httpx.post(collector.http_url, content=wide, timeout=300, headers={
        "Content-Type": "application/x-protobuf", "Authorization": f"Bearer {TOKEN}"})
    return (f"63 MiB JSON of empty objects -> HTTP {json_reply.status_code}; a {len(wide) // MiB} MiB span with 3.3M "
            f"attributes -> HTTP {pb_reply.status_code}")


def end_marked_first(collector: CollectorProcess) -> str:
    bodies = []
    for batch in range(10):
        spans = [{"traceId": f"{batch:08x}{i:024x}", "spanId": f"{i + 1:016x}", "name": "one", "kind": 1,
                  "startTimeUnixNano": "1", "endTimeUnixNano": "2"} for i in range(5000)]
        bodies.append({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]})
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for body in bodies:
        httpx.post(collector.http_url, json=body, headers=headers, timeout=60)
    time.sleep(2)  # the 50k traces are due now
    end = {"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": "f" * 32, "spanId": "e" * 16, "name": "invoke_agent", "kind": 1, "startTimeUnixNano": "1",
        "endTimeUnixNano": "2", "attributes": [
            {"key": "gen_ai.conversation.id", "value": {"stringValue": "ended"}},
            {"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
            {"key": "tracejudge.conversation.end", "value": {"boolValue": True}},
            {"key": "gen_ai.output.messages", "value": {"stringValue": json.dumps(
                [{"role": "assistant", "parts": [{"type": "text", "content": "done"}]}])}}]}]}]}]}
    sent = time.perf_counter()
    httpx.post(collector.http_url, json=end, headers=headers, timeout=60)
    while time.perf_counter() - sent < 600:
        rows = httpx.post(f"{collector.admin_url}/api/query", headers=headers, timeout=60, json={
            "sql": "SELECT count(*) FROM conversations WHERE conversation_id = 'ended'"}).json()["rows"]
        if rows == [[1]]:
            return f"an end-marked conversation after 50,000 due one-span traces -> assembled in " \
                   f"{time.perf_counter() - sent:.1f} s"
        time.sleep(0.2)
    return "an end-marked conversation after 50,000 due one-span traces -> not assembled in 600 s"


def amplification(collector: CollectorProcess) -> str:
    """Small requests that once multiplied into gigabytes of rows: each answer, how long it took, readiness after
    each, and the server's RSS (VmRSS) 5 s after the last."""
    assert collector.proc is not None
    out = []
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip",
               "Authorization": f"Bearer {TOKEN}"}
    for name, body in [*AMPLIFIED.items(), ("300 KiB conversation key on 1,000 spans", repeated_key_request())]:
        packed = gzip.compress(body)
        started = time.perf_counter()
        reply = httpx.post(collector.http_url, content=packed, headers=headers, timeout=300)
        took = time.perf_counter() - started
        ready = httpx.get(f"{collector.admin_url}/readyz", timeout=10).status_code
        out.append(f"{name} ({len(packed):,} bytes gzipped) -> HTTP {reply.status_code} in {took:.2f} s, "
                   f"readyz {ready}, server peak so far {_hwm_mb(collector.proc.pid):.0f} MB")
    time.sleep(5)
    out.append(f"RSS 5 s later {_hwm_mb(collector.proc.pid, 'VmRSS'):.0f} MB")
    return "; ".join(out)


ATTACKS = {
    "amplification": (amplification, ""),
    "grpc": (grpc_unauthenticated, "[server]\nmax_message_bytes = 67108864\n"),
    "gzip": (gzip_members, ""),
    "queries": (queries, ""),
    "concurrent": (concurrent_queries, ""),
    "slow": (slow_clients, ""),
    "decode": (big_decodes, "[server]\nmax_message_bytes = 67108864\n"),
    "assembly": (end_marked_first, "[conversations]\nquiet_period_s = 1\n"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=sorted(ATTACKS), action="append")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    for name in args.only or list(ATTACKS):
        attack, config = ATTACKS[name]
        if attack is big_decodes:
            _wide_span()
        run(name, attack, config)


if __name__ == "__main__":
    main()
