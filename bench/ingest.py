"""Ingest benchmark: pre-built OTLP requests of realistic GenAI/MCP spans against `tracejudge serve`.

Every export is acknowledged only after its spans are committed, or synced to the ingest journal while a checkpoint
holds their commit, so acknowledged spans/s is durable spans/s.
Prints throughput at full speed over gRPC and HTTP, latency percentiles at half that rate, and the server's
peak RSS. With `--phoenix-python`, the same requests also go to Arize Phoenix's OTLP/gRPC receiver (its
own venv: `python3 -m venv /tmp/venv-phoenix && /tmp/venv-phoenix/bin/pip install arize-phoenix`; working
dir in a temp folder, bound to 127.0.0.1), where durable means rows in its SQLite store.
Run: `python bench/ingest.py [--requests 200] [--spans 512] [--in-flight 8] [--config TOML] [--phoenix-python PY]`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.collector_process import CollectorProcess  # noqa: E402
from tracejudge.collector.process_memory import descendants  # noqa: E402
from tracejudge.collector.receivers.span_rows import spans_to_arrow  # noqa: E402
from tracejudge.collector.store.span_tables import SpanRows  # noqa: E402
from tracejudge.mapping import decode_otlp  # noqa: E402

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _kv(key: str, value: str | int) -> KeyValue:
    any_value = AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)
    return KeyValue(key=key, value=any_value)


# What the OpenTelemetry Python SDK and its resource detectors put on a service in a container: about 1 KB of
# JSON, which every span's row held before resources were stored once (`--sdk-resource`).
SDK_RESOURCE: list[tuple[str, str | int]] = [
    ("telemetry.sdk.language", "python"), ("telemetry.sdk.name", "opentelemetry"), ("telemetry.sdk.version", "1.39.1"),
    ("service.version", "2026.12.1"), ("service.namespace", "agents"),
    ("service.instance.id", "4b6f3c1e-94a2-4f7d-8e0b-2f1c7d9a5e33"), ("deployment.environment.name", "production"),
    ("process.pid", 48213), ("process.executable.name", "python3.12"),
    ("process.executable.path", "/usr/local/bin/python3.12"), ("process.command", "/app/.venv/bin/uvicorn"),
    ("process.command_args", "['/app/.venv/bin/uvicorn', 'weather_agent.app:app', '--host', '0.0.0.0', "
                             "'--port', '8080', '--workers', '4']"),
    ("process.owner", "app"), ("process.runtime.name", "cpython"), ("process.runtime.version", "3.12.8"),
    ("process.runtime.description", "3.12.8 (main, Dec  3 2026, 22:14:09) [GCC 12.2.0]"),
    ("host.name", "weather-agent-7d9c5b8f6-xk2lp"), ("host.arch", "amd64"), ("os.type", "linux"),
    ("os.description", "Linux 6.1.0-28-cloud-amd64"), ("container.id", "9f3e2d1c0b4a" * 5 + "9f3e"),
    ("k8s.namespace.name", "agents-prod"), ("k8s.pod.name", "weather-agent-7d9c5b8f6-xk2lp"),
    ("k8s.deployment.name", "weather-agent"), ("k8s.node.name", "gke-prod-pool-2-5c9e1a3b-q7ws"),
    ("cloud.provider", "gcp"), ("cloud.region", "europe-west1"), ("cloud.availability_zone", "europe-west1-b"),
]


def build_requests(count: int, spans_per_request: int, offset: int = 0, sdk_resource: bool = False) -> list[bytes]:
    """Requests of agent-shaped spans (chat, execute_tool with MCP attributes), about 650 bytes each; with
    `sdk_resource` the resource holds what an SDK in a container sends (`SDK_RESOURCE`), not only service.name."""
    out = []
    for r in range(count):
        spans = []
        for i in range(spans_per_request):
            n = (offset + r) * spans_per_request + i + 1
            trace = (n // 8 + 1).to_bytes(16, "big")
            tool = i % 2 == 0
            attributes = [
                _kv("gen_ai.operation.name", "execute_tool" if tool else "chat"),
                _kv("gen_ai.conversation.id", f"conv-{n // 64:08d}"),
                _kv("gen_ai.agent.name", "weather-agent"),
            ]
            if tool:
                attributes += [_kv("mcp.method.name", "tools/call"), _kv("gen_ai.tool.name", "get-weather"),
                               _kv("gen_ai.tool.call.id", f"call_{n:012d}"), _kv("jsonrpc.request.id", str(n)),
                               _kv("gen_ai.tool.call.arguments", '{"city": "Paris", "units": "metric"}'),
                               _kv("gen_ai.tool.call.result",
                                   '{"content":[{"type":"text","text":"Rainy, 14C, wind 12 km/h SW"}],'
                                   '"isError":false}')]
            else:
                attributes += [_kv("gen_ai.request.model", "gpt-4.1"), _kv("gen_ai.usage.input_tokens", 412),
                               _kv("gen_ai.usage.output_tokens", 38),
                               _kv("gen_ai.input.messages", '[{"role":"user","parts":[{"type":"text","content":'
                                   '"What is the weather in Paris today, and should I take an umbrella?"}]}]')]
            spans.append(Span(trace_id=trace, span_id=n.to_bytes(8, "big"), parent_span_id=(n + 7).to_bytes(8, "big"),
                              name="execute_tool get-weather" if tool else "chat gpt-4.1", kind=1 if tool else 3,
                              start_time_unix_nano=1_767_225_600_000_000_000 + n * 1000,
                              end_time_unix_nano=1_767_225_600_000_000_000 + n * 1000 + 500, attributes=attributes))
        resource = ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])
        resource.resource.attributes.append(_kv("service.name", "weather-agent"))
        if sdk_resource:
            resource.resource.attributes.extend(_kv(key, value) for key, value in SDK_RESOURCE)
        out.append(ExportTraceServiceRequest(resource_spans=[resource]).SerializeToString())
    return out


def as_received(body: bytes, received: dt.datetime) -> SpanRows:
    """A request's rows as the receivers hand them to the span store: decoded, received at `received`."""
    return spans_to_arrow(decode_otlp(body, "application/x-protobuf").spans, received)


def process_tree(pid: int) -> list[int]:
    """The process and every process below it, whichever of its threads started them (the collector's own
    `descendants`, which its /metrics reads too)."""
    return [pid, *descendants(pid)]


def status_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def peak_rss_mb(pid: int) -> float:
    """Peak RSS of the server and its decode workers (summed: an upper bound of the peak together)."""
    return sum(status_mb(proc, "VmHWM") for proc in process_tree(pid))


def run(send, requests: list[bytes], in_flight: int, rate_spans_s: float | None, spans_per_request: int):
    """Send every request with `in_flight` concurrent senders (optionally paced); (wall s, latencies s, in the
    requests' order). Paced, a latency counts from when the request was due, not from when a sender got to it: while
    the collector holds every sender, the requests that fall due wait too, as an exporter's would."""
    latencies = [0.0] * len(requests)
    start = time.perf_counter()

    def one(index: int) -> None:
        due = None
        if rate_spans_s:
            due = start + index * spans_per_request / rate_spans_s
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        began = due if due is not None else time.perf_counter()
        send(requests[index])
        latencies[index] = time.perf_counter() - began

    with ThreadPoolExecutor(in_flight) as pool:
        list(pool.map(one, range(len(requests))))
    return time.perf_counter() - start, latencies


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) >= 2 else values[0]


def export_retrying(export, body: bytes) -> None:
    """Retry UNAVAILABLE with backoff, as the OTLP exporters do (Phoenix sheds load this way)."""
    delay, deadline = 0.05, time.monotonic() + 900
    while True:
        try:
            export(body, timeout=120)
            return
        except grpc.RpcError as exc:
            if exc.code() is not grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def phoenix(python: str, requests: list[bytes], in_flight: int, spans_per_request: int) -> dict[str, float]:
    """The same requests against Arize Phoenix's OTLP/gRPC receiver; durable = rows in its SQLite store."""
    total = len(requests) * spans_per_request
    with tempfile.TemporaryDirectory() as work:
        env = {**os.environ, "PHOENIX_WORKING_DIR": work, "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": "16006",
               "PHOENIX_GRPC_PORT": "14317", "PHOENIX_TELEMETRY_ENABLED": "false"}
        phoenix_bin = str(Path(python).with_name("phoenix"))
        proc = subprocess.Popen([phoenix_bin, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if httpx.get("http://127.0.0.1:16006/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.5)
            channel = grpc.insecure_channel("127.0.0.1:14317",
                                            options=[("grpc.max_send_message_length", 64 * 1024 * 1024)])
            export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            started = time.perf_counter()
            wall, latencies = run(lambda body: export_retrying(export, body), requests, in_flight, None,
                                  spans_per_request)
            acked = total / wall
            db = Path(work) / "phoenix.db"
            stored = 0
            while time.perf_counter() - started < 600:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as con:
                    stored = con.execute("SELECT count(*) FROM spans").fetchone()[0]
                if stored >= total:
                    break
                time.sleep(0.2)
            durable_s = time.perf_counter() - started
            rss = peak_rss_mb(proc.pid)
            channel.close()
        finally:
            proc.terminate()
            proc.wait(30)
    return {"acknowledged_spans_per_s": round(acked), "durable_spans_per_s": round(stored / durable_s),
            "stored": stored, "p50_ms_ack": round(percentile(latencies, 50) * 1000, 1),
            "p99_ms_ack": round(percentile(latencies, 99) * 1000, 1), "peak_rss_mb": round(rss)}


def collector_config(tmp: Path, base: Path | None, extra: str = "") -> Path | None:
    """The collector's tracejudge.toml: the file given with `--config`, with the bench's own section appended."""
    if not extra:
        return base
    path = tmp / "tracejudge.toml"
    path.write_text((base.read_text() if base else "") + "\n" + extra)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--spans", type=int, default=512, help="spans per request")
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--phoenix-python", help="python of a venv with arize-phoenix: also run Phoenix")
    parser.add_argument("--redaction", action="store_true", help="with [redaction] on (the builtin rules)")
    parser.add_argument("--config", type=Path, help="a tracejudge.toml for the collector (e.g. [store] settings)")
    parser.add_argument("--python-decode", action="store_true",
                        help="decode every request in Python (TRACEJUDGE_NATIVE_DECODE=0), not the C walk")
    parser.add_argument("--sdk-resource", action="store_true",
                        help="resources as an SDK in a container sends them (about 1 KB of JSON), not only "
                             "service.name")
    args = parser.parse_args()
    sizes = build_requests(1, args.spans, sdk_resource=args.sdk_resource)
    print(f"request: {args.spans} spans, {len(sizes[0])} bytes ({len(sizes[0]) / args.spans:.0f} B/span)")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        config = collector_config(Path(tmp), args.config, "[redaction]\nenabled = true\n" if args.redaction else "")
        env = {"TRACEJUDGE_NATIVE_DECODE": "0"} if args.python_decode else {}
        collector = CollectorProcess(Path(tmp) / "bench.duckdb", config=config, env=env).start()
        try:
            channel = grpc.insecure_channel(collector.grpc_endpoint,
                                            options=[("grpc.max_send_message_length", 64 * 1024 * 1024)])
            grpc_export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            http = httpx.Client(timeout=60)

            def send_grpc(body: bytes) -> None:
                export_retrying(grpc_export, body)

            def send_http(body: bytes) -> None:
                reply = http.post(collector.http_url, content=body,
                                  headers={"Content-Type": "application/x-protobuf"})
                reply.raise_for_status()

            offset = 0
            for name, send in (("grpc", send_grpc), ("http", send_http)):
                batch = build_requests(args.requests, args.spans, offset, args.sdk_resource)
                offset += args.requests
                wall, lat = run(send, batch, args.in_flight, None, args.spans)
                full = args.requests * args.spans / wall
                half_batch = build_requests(args.requests // 2, args.spans, offset, args.sdk_resource)
                offset += args.requests // 2
                _, half_lat = run(send, half_batch, args.in_flight, full / 2, args.spans)
                results[name] = {"durable_spans_per_s": round(full),
                                 "p50_ms_full": round(percentile(lat, 50) * 1000, 1),
                                 "p99_ms_full": round(percentile(lat, 99) * 1000, 1),
                                 "p50_ms_half_load": round(percentile(half_lat, 50) * 1000, 1),
                                 "p99_ms_half_load": round(percentile(half_lat, 99) * 1000, 1)}
                print(f"{name}: {full:,.0f} durable spans/s at full speed ({args.in_flight} in flight); "
                      f"p50 {results[name]['p50_ms_full']} ms, p99 {results[name]['p99_ms_full']} ms; at half load "
                      f"p50 {results[name]['p50_ms_half_load']} ms, p99 {results[name]['p99_ms_half_load']} ms")
            rss = peak_rss_mb(collector.proc.pid)  # type: ignore[union-attr]
            stored = collector.metric("tracejudge_spans_accepted_total")
            print(f"server peak RSS (with decode workers): {rss:.0f} MB; spans stored: {stored:,.0f}")
            ratio = results["grpc"]["durable_spans_per_s"] / 100_000
            http_ratio = results["http"]["durable_spans_per_s"] / 80_000
            print(f"targets: >= 100,000 durable spans/s over gRPC ({ratio:.2f}x) and >= 80,000 over HTTP "
                  f"({http_ratio:.2f}x), p99 < 100 ms at half load, peak RSS with workers <= 400 MB ({rss:.0f} MB)")
            results["peak_rss_mb"] = round(rss)
            http.close()
            channel.close()
        finally:
            collector.stop()
        size = sum(path.stat().st_size for path in Path(tmp).glob("bench.duckdb*"))
        results["disk_bytes_per_span"] = round(size / max(stored, 1), 1)
        print(f"database file after stop: {size / 2**20:.1f} MiB, {results['disk_bytes_per_span']} bytes per span")
    if args.phoenix_python:
        px = phoenix(args.phoenix_python, build_requests(args.requests, args.spans, 10_000), args.in_flight,
                     args.spans)
        results["phoenix_grpc"] = px
        print(f"phoenix grpc: {px['acknowledged_spans_per_s']:,} acknowledged spans/s, {px['durable_spans_per_s']:,} "
              f"durable spans/s ({px['stored']:,} stored); ack p50 {px['p50_ms_ack']} ms, p99 {px['p99_ms_ack']} ms; "
              f"peak RSS {px['peak_rss_mb']} MB")
        print(f"tracejudge / phoenix durable spans/s over gRPC: "
              f"{results['grpc']['durable_spans_per_s'] / max(px['durable_spans_per_s'], 1):.1f}x (goal >= 5x)")
    print(json.dumps(results))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
