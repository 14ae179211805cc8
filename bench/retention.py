"""Retention soak: does the database file stop growing under steady traffic, and does pruning stall ingest?

A collector runs with `[retention] spans` short (default 5m) and an archive directory; agent conversations
(4 spans each, ended with tracejudge.conversation.end) are exported at a fixed rate for the whole run, scored by
mcp_call_validity (no judge needed). Every interval it samples the file size, DuckDB's used and free blocks,
the spans table's rows and the export latency, then prints the samples, the file size growth over the second
half of the run (flat means retention keeps up: deleted rows' blocks are reused), and export latency p50/p99
while retention prunes.

    python bench/retention.py --minutes 60 --spans 5m --conversations-per-s 20
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.ingest import export_retrying  # noqa: E402
from bench.memory import _scrape, conversation_request  # noqa: E402
from tests.support.collector_process import CollectorProcess  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--spans", default="5m", help="[retention] spans")
    parser.add_argument("--conversations-per-s", type=float, default=20)
    parser.add_argument("--sample-s", type=float, default=30)
    args = parser.parse_args()
    import grpc

    seconds = args.minutes * 60
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "tracejudge.toml"
        config.write_text(f'[conversations]\nquiet_period_s = 5\n[scoring]\nmetrics = ["mcp_call_validity"]\n'
                          f'[retention]\nspans = "{args.spans}"\ninterval_s = 10\narchive_dir = "{tmp}/archive"\n')
        db = Path(tmp) / "retention.duckdb"
        collector = CollectorProcess(db, config=config).start()
        try:
            channel = grpc.insecure_channel(collector.grpc_endpoint)
            export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                         request_serializer=None, response_deserializer=None)
            started, sent, next_sample = time.monotonic(), 0, 0.0
            latencies: list[float] = []
            rows: list[tuple[float, int, float, float, float, float]] = []
            print("minute  file MB  used MB  free MB  spans rows  spans pruned  p99 export ms (since last)")
            window: list[float] = []
            while (elapsed := time.monotonic() - started) < seconds:
                while sent < int(elapsed * args.conversations_per_s):
                    t0 = time.perf_counter()
                    export_retrying(export, conversation_request(sent))
                    window.append((time.perf_counter() - t0) * 1000)
                    sent += 1
                if elapsed >= next_sample:
                    m = _scrape(collector)
                    size = (db.stat().st_size + (Path(str(db) + ".wal").stat().st_size
                                                 if Path(str(db) + ".wal").exists() else 0)) / 1e6
                    p99 = sorted(window)[int(len(window) * 0.99)] if window else 0.0
                    latencies += window
                    window = []
                    row = (elapsed / 60, size, m.get('tracejudge_db_bytes{kind="used"}', 0) / 1e6,
                           m.get('tracejudge_db_bytes{kind="free"}', 0) / 1e6,
                           m.get('tracejudge_table_rows{table="spans"}', 0),
                           m.get('tracejudge_rows_pruned_total{table="spans"}', 0), p99)
                    rows.append(row[:6])
                    print(f"{row[0]:6.1f}  {row[1]:7.1f}  {row[2]:7.1f}  {row[3]:7.1f}  {row[4]:10.0f}  "
                          f"{row[5]:12.0f}  {p99:8.1f}", flush=True)
                    next_sample += args.sample_s
                time.sleep(0.002)
            half = [r for r in rows if r[0] >= args.minutes / 2]
            if len(half) >= 2:
                print(f"file size over the second half: {half[0][1]:.1f} -> {half[-1][1]:.1f} MB "
                      f"(x{half[-1][1] / half[0][1]:.2f}); spans sent {sent * 4:,}, pruned {rows[-1][5]:,.0f}")
            latencies.sort()
            print(f"export latency over the run: p50 {latencies[len(latencies) // 2]:.1f} ms, "
                  f"p99 {latencies[int(len(latencies) * 0.99)]:.1f} ms, max {latencies[-1]:.1f} ms")
        finally:
            collector.stop()


if __name__ == "__main__":
    main()
