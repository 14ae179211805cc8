"""Retention soak: does every table, bookkeeping included, stop growing under steady traffic, and does pruning
stall ingest?

A collector runs with every retention window short (`--spans`, and `--windows` for conversations, scores, failed
jobs, reviews and the judge's batch ledger) and an archive directory; agent conversations (4 spans each, ended
with tracejudge.conversation.end) are exported at a fixed rate for the whole run and scored by all three metrics
against a loopback judge (`--judge-latency`), or by call validity alone with `--no-judge`. Every `--sample-s` it
samples the file and WAL size, the blocks in use (the file's other blocks are free and reused), the checkpoints
and the rows of every table (`/metrics`), with the export latency since the last
sample; at the end it prints each table's rows over the second half (flat means retention keeps up) and the
export latency over the run.

    python bench/retention.py --minutes 60 --spans 2m --windows 3m --conversations-per-s 20
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.ingest import export_retrying  # noqa: E402
from bench.judge_stub import JudgeStub  # noqa: E402
from bench.memory import _scrape, conversation_request  # noqa: E402
from tests.support.collector_process import CollectorProcess  # noqa: E402

SHOWN = ("spans", "conversations", "eval_jobs", "scores", "judged_content", "pruned_conversations",
         "assembled_traces", "score_summary", "call_summary")  # the columns printed each sample (all are kept)


def _tables(metrics: dict[str, float]) -> dict[str, float]:
    prefix = 'tracejudge_table_rows{table="'
    return {key[len(prefix):-2]: value for key, value in metrics.items() if key.startswith(prefix)}


def _checkpoints(metrics: dict[str, float], outcome: str) -> float:
    return metrics.get('tracejudge_checkpoints_total{outcome="' + outcome + '"}', 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--spans", default="2m", help="[retention] spans")
    parser.add_argument("--windows", default="3m", help="[retention] conversations, scores, failed_jobs, reviews "
                        "and judge_batches")
    parser.add_argument("--conversations-per-s", type=float, default=20)
    parser.add_argument("--sample-s", type=float, default=60)
    parser.add_argument("--judge-latency", type=float, default=0.05, help="the loopback judge's seconds per call")
    parser.add_argument("--no-judge", action="store_true", help="call validity alone, no judge")
    args = parser.parse_args()
    import grpc

    seconds = args.minutes * 60
    windows = "".join(f'{name} = "{args.windows}"\n'
                      for name in ("conversations", "scores", "failed_jobs", "reviews", "judge_batches"))
    with ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        env, scoring = {}, '[scoring]\nmetrics = ["mcp_call_validity"]\n'
        if not args.no_judge:
            judge = stack.enter_context(JudgeStub(latency_s=args.judge_latency))
            env = {"OPENAI_BASE_URL": judge.base_url, "OPENAI_API_KEY": "sk-bench"}
            scoring = '[scoring]\nmodel = "gpt-4o-mini"\nconcurrency = 16\n'
        config = Path(tmp) / "tracejudge.toml"
        config.write_text(f'[conversations]\nquiet_period_s = 5\n{scoring}[retention]\nspans = "{args.spans}"\n'
                          f'{windows}interval_s = 10\narchive_dir = "{tmp}/archive"\n')
        db = Path(tmp) / "retention.duckdb"
        collector = CollectorProcess(db, config=config, env=env).start()
        try:
            channel = grpc.insecure_channel(collector.grpc_endpoint)
            export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                         request_serializer=None, response_deserializer=None)
            started, sent, next_sample = time.monotonic(), 0, 0.0
            latencies: list[float] = []
            samples: list[tuple[float, float, dict[str, float]]] = []  # (minute, file + WAL MB, rows per table)
            print("minute  file MB  used MB  WAL MB  checkpoints done/timed out/refused  " + "  ".join(SHOWN)
                  + "  p99 export ms (since last)")
            window: list[float] = []
            while (elapsed := time.monotonic() - started) < seconds:
                while sent < int(elapsed * args.conversations_per_s):
                    t0 = time.perf_counter()
                    export_retrying(export, conversation_request(sent))
                    window.append((time.perf_counter() - t0) * 1000)
                    sent += 1
                if elapsed >= next_sample:
                    metrics = _scrape(collector)
                    tables = _tables(metrics)
                    wal = Path(str(db) + ".wal")
                    file_mb, wal_mb = db.stat().st_size / 1e6, (wal.stat().st_size if wal.exists() else 0) / 1e6
                    size = file_mb + wal_mb
                    checkpoints = "/".join(f"{_checkpoints(metrics, outcome):.0f}"
                                           for outcome in ("done", "timed_out", "refused"))
                    p99 = sorted(window)[int(len(window) * 0.99)] if window else 0.0
                    latencies += window
                    window = []
                    samples.append((elapsed / 60, size, tables))
                    used_mb = metrics.get('tracejudge_db_bytes{kind="used"}', 0.0) / 1e6  # the rest: free, reused
                    counts = "  ".join(f"{tables.get(t, 0):>{len(t)}.0f}" for t in SHOWN)
                    print(f"{elapsed / 60:6.1f}  {file_mb:7.1f}  {used_mb:7.1f}  {wal_mb:6.1f}  {checkpoints:>24}  "
                          f"{counts}  {p99:8.1f}", flush=True)
                    next_sample += args.sample_s
                time.sleep(0.002)
            latencies += window
            half = [s for s in samples if s[0] >= args.minutes / 2]
            if len(half) >= 2:
                print(f"second half ({half[0][0]:.0f}-{half[-1][0]:.0f} min): file + WAL {half[0][1]:.1f} -> "
                      f"{half[-1][1]:.1f} MB (max {max(s[1] for s in half):.1f}); rows per table, first -> last "
                      f"(max):")
                for table in sorted(set().union(*(s[2] for s in half))):
                    counts = [s[2].get(table, 0) for s in half]
                    print(f"  {table:24} {counts[0]:>10,.0f} -> {counts[-1]:>10,.0f} ({max(counts):,.0f})")
            latencies.sort()
            print(f"sent {sent:,} conversations ({sent * 4:,} spans); export latency over the run: p50 "
                  f"{latencies[len(latencies) // 2]:.1f} ms, p99 {latencies[int(len(latencies) * 0.99)]:.1f} ms, "
                  f"max {latencies[-1]:.1f} ms")
            final = _scrape(collector)
            compacted = {k.split('"')[1]: v for k, v in final.items()
                         if k.startswith("tracejudge_rows_compacted_total{")}
            print("deleted rows freed by compacting keyed tables: " + (", ".join(
                f"{t} {n:,.0f}" for t, n in sorted(compacted.items())) or "none"))
            said = [line for line in collector.log_lines if '"retention' in line]
            print(f"retention log lines: {len(said)}" + "".join(f"\n  {line.strip()[:300]}" for line in said[-3:]))
        finally:
            collector.stop()


if __name__ == "__main__":
    main()
