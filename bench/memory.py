"""Memory benchmark: RSS of `tracejudge serve` (with its decode workers) under sustained load, scoring on.

Agent conversations (two turns, MCP tool calls) are exported over gRPC at a fixed rate for a while; every
conversation ends with `tracejudge.conversation.end`, so it is assembled and scored at once by all three
metrics against a loopback judge with 50 ms latency. RSS is sampled every second.
Run: `python bench/memory.py [--seconds 120] [--conversations-per-s 20]`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.ingest import export_retrying, peak_rss_mb  # noqa: E402
from bench.judge_stub import JudgeStub  # noqa: E402
from tests.support.collector_process import CollectorProcess  # noqa: E402


def current_rss_mb(pid: int) -> float:
    total = 0.0
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    for proc in [pid, *map(int, children)]:
        for line in Path(f"/proc/{proc}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) / 1024
    return total


def conversation_request(n: int) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

    def kv(k: str, v: object) -> KeyValue:
        value = AnyValue(bool_value=v) if isinstance(v, bool) else AnyValue(string_value=str(v))
        return KeyValue(key=k, value=value)

    spans = []
    for t in range(2):
        trace = (n * 2 + t + 1).to_bytes(16, "big")
        root = (n * 8 + t * 4 + 1).to_bytes(8, "big")
        question = f"What's the weather in city {n}-{t}?"
        attrs = [kv("gen_ai.operation.name", "invoke_agent"), kv("gen_ai.conversation.id", f"conv-{n}"),
                 kv("gen_ai.input.messages", f'[{{"role":"user","parts":[{{"type":"text","content":"{question}"}}]}}]'),
                 kv("gen_ai.output.messages", '[{"role":"assistant","parts":[{"type":"text","content":"Rainy."}]}]')]
        if t == 1:
            attrs.append(kv("tracejudge.conversation.end", True))
        spans.append(Span(trace_id=trace, span_id=root, name="invoke_agent weather", kind=1,
                          start_time_unix_nano=1, end_time_unix_nano=9, attributes=attrs))
        spans.append(Span(trace_id=trace, span_id=(n * 8 + t * 4 + 2).to_bytes(8, "big"), parent_span_id=root,
                          name="execute_tool get-weather", kind=1, start_time_unix_nano=2, end_time_unix_nano=5,
                          attributes=[kv("gen_ai.operation.name", "execute_tool"), kv("mcp.method.name", "tools/call"),
                                      kv("gen_ai.tool.name", "get-weather"),
                                      kv("gen_ai.tool.call.arguments", '{"city": "Paris"}'),
                                      kv("gen_ai.tool.call.result", '{"content":[{"type":"text","text":"Rainy"}]}')]))
    resource = ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])
    resource.resource.attributes.append(kv("service.name", "weather-agent"))
    return ExportTraceServiceRequest(resource_spans=[resource]).SerializeToString()


def main() -> None:
    import grpc

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--conversations-per-s", type=float, default=20)
    args = parser.parse_args()
    with JudgeStub(latency_s=0.05) as judge, tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "tracejudge.toml"
        config.write_text('[scoring]\nmodel = "gpt-4o-mini"\nconcurrency = 16\n')
        collector = CollectorProcess(Path(tmp) / "mem.duckdb", config=config,
                                     env={"OPENAI_BASE_URL": judge.base_url, "OPENAI_API_KEY": "sk-bench"}).start()
        try:
            assert collector.proc is not None
            channel = grpc.insecure_channel(collector.grpc_endpoint)
            export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                         request_serializer=None, response_deserializer=None)
            samples: list[tuple[float, float]] = []
            started, sent, next_sample = time.monotonic(), 0, 0.0
            while (elapsed := time.monotonic() - started) < args.seconds:
                due = int(elapsed * args.conversations_per_s)
                while sent < due:
                    export_retrying(export, conversation_request(sent))
                    sent += 1
                if elapsed >= next_sample:
                    samples.append((elapsed, current_rss_mb(collector.proc.pid)))
                    next_sample += 1.0
                time.sleep(0.01)
            time.sleep(5)
            scored = collector.metric('tracejudge_eval_jobs{state="done"}')
            peak = peak_rss_mb(collector.proc.pid)
            channel.close()
        finally:
            collector.stop()
    first = [r for t, r in samples if t < 10]
    last = [r for t, r in samples if t >= args.seconds - 10]
    print(f"{sent} conversations ({sent * 4} spans) in {args.seconds} s, {scored:.0f} scoring jobs done")
    print(f"RSS (server + decode workers): first 10 s {min(first):.0f}-{max(first):.0f} MB, last 10 s "
          f"{min(last):.0f}-{max(last):.0f} MB, peak {peak:.0f} MB")


if __name__ == "__main__":
    main()
