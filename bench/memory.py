"""Memory benchmark: RSS of `tracejudge serve` (with its decode workers) under sustained load, scoring on.

Agent conversations (two turns, MCP tool calls) are exported over gRPC at a fixed rate for a while; every
conversation ends with `tracejudge.conversation.end`, so it is assembled and scored at once by all three
metrics against a loopback judge with 50 ms latency. RSS, queue depth, commit time and open jobs are
sampled every second and summarised per third of the run (`tests/test_soak.py` asserts they stay flat).
Run: `python bench/memory.py [--seconds 120] [--conversations-per-s 20]`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.ingest import export_retrying, peak_rss_mb, process_tree, status_mb  # noqa: E402
from bench.judge_stub import JudgeStub  # noqa: E402
from tests.support.collector_process import CollectorProcess  # noqa: E402


def current_rss_mb(pid: int) -> float:
    """RSS of the process and its children (the decode workers)."""
    return sum(status_mb(proc, "VmRSS") for proc in process_tree(pid))


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


@dataclass
class Sample:
    t: float
    rss_mb: float
    server_rss_mb: float  # the collector process alone, without its decode workers
    queued_spans: float
    commit_ms: float  # mean group-commit time since the previous sample
    open_jobs: float  # scoring jobs pending or running


@dataclass
class SoakResult:
    conversations: int
    seconds: float
    jobs_done: float
    peak_rss_mb: float
    samples: list[Sample] = field(default_factory=list)

    def window(self, start: float, end: float) -> list[Sample]:
        return [s for s in self.samples if start <= s.t < end]

    def summary(self) -> str:
        thirds = [self.window(self.seconds * i / 3, self.seconds * (i + 1) / 3) for i in range(3)]
        lines = [f"{self.conversations} conversations ({self.conversations * 4} spans) in {self.seconds:.0f} s, "
                 f"{self.jobs_done:.0f} scoring jobs done, peak RSS {self.peak_rss_mb:.0f} MB",
                 "third  RSS MB (median)  server alone  queued spans (max)  commit ms (median)  open jobs (max)"]
        for i, part in enumerate(thirds, start=1):
            lines.append(f"{i:>5}  {median(s.rss_mb for s in part):>15.0f}  "
                         f"{median(s.server_rss_mb for s in part):>12.0f}  {max(s.queued_spans for s in part):>18.0f}"
                         f"  {median(s.commit_ms for s in part):>18.2f}  {max(s.open_jobs for s in part):>15.0f}")
        return "\n".join(lines)


def _scrape(collector: CollectorProcess) -> dict[str, float]:
    import httpx

    values: dict[str, float] = {}
    for line in httpx.get(f"{collector.admin_url}/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def soak(seconds: float, conversations_per_s: float, judge_latency_s: float = 0.05,
         memory_limit: str | None = None) -> SoakResult:
    """Export at a fixed rate for `seconds` with scoring on; sample RSS, queue, commit time and jobs each second."""
    import grpc

    with JudgeStub(latency_s=judge_latency_s) as judge, tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "tracejudge.toml"
        store = f'[store]\nmemory_limit = "{memory_limit}"\n' if memory_limit else ""
        config.write_text('[scoring]\nmodel = "gpt-4o-mini"\nconcurrency = 16\n' + store)
        collector = CollectorProcess(Path(tmp) / "mem.duckdb", config=config,
                                     env={"OPENAI_BASE_URL": judge.base_url, "OPENAI_API_KEY": "sk-bench"}).start()
        try:
            assert collector.proc is not None
            channel = grpc.insecure_channel(collector.grpc_endpoint)
            export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                         request_serializer=None, response_deserializer=None)
            result = SoakResult(0, seconds, 0.0, 0.0)
            started, next_sample, last_sum, last_count = time.monotonic(), 0.0, 0.0, 0.0
            while (elapsed := time.monotonic() - started) < seconds:
                due = int(elapsed * conversations_per_s)
                while result.conversations < due:
                    export_retrying(export, conversation_request(result.conversations))
                    result.conversations += 1
                if elapsed >= next_sample:
                    m = _scrape(collector)
                    total = m.get("tracejudge_commit_seconds_sum", 0.0)
                    count = m.get("tracejudge_commit_seconds_count", 0.0)
                    commit_ms = (total - last_sum) / (count - last_count) * 1000 if count > last_count else 0.0
                    last_sum, last_count = total, count
                    jobs = m.get('tracejudge_eval_jobs{state="pending"}', 0.0) + m.get(
                        'tracejudge_eval_jobs{state="running"}', 0.0)
                    result.samples.append(Sample(elapsed, current_rss_mb(collector.proc.pid),
                                                 status_mb(collector.proc.pid, "VmRSS"),
                                                 m.get("tracejudge_queue_spans", 0.0), commit_ms, jobs))
                    next_sample += 1.0
                time.sleep(0.01)
            time.sleep(5)
            result.jobs_done = collector.metric('tracejudge_eval_jobs{state="done"}')
            result.peak_rss_mb = peak_rss_mb(collector.proc.pid)
            channel.close()
        finally:
            collector.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--conversations-per-s", type=float, default=20)
    parser.add_argument("--memory-limit", help="[store] memory_limit, e.g. 256MB")
    args = parser.parse_args()
    print(soak(args.seconds, args.conversations_per_s, memory_limit=args.memory_limit).summary())


if __name__ == "__main__":
    main()
