"""Ingest cost as the run grows: does a span cost the same CPU after a million as after the first hundred thousand?

Sends `--blocks` blocks of `--block-spans` agent-shaped spans over gRPC at full speed to one `tracejudge serve`
(the requests of `bench/ingest.py`, 8 spans per trace, so the quiet window fills with traces as the run goes:
12,500 more per 100,000 spans, none of them complete within the default 120 s quiet period), and prints per
block: durable spans/s, CPU per span of the server and of its decode workers (from /proc), the checkpoints DuckDB
made (the WAL file shrinking) and the WAL's size, the conversations assembled and the scores written per second
(with `--quiet-period` short enough for conversations to complete), the traces waiting in the quiet window, the
server's RSS (now and its peak) and the peak with its workers (each process's own, summed). The last lines compare
the last block with the first and average blocks 2 on. `--rate` offers a fixed load instead of full speed.
Run: `python bench/ingest_growth.py [--blocks 10] [--block-spans 100000] [--in-flight 8] [--quiet-period S]
[--rate SPANS_S] [--config TOML]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.ingest import (  # noqa: E402
    EXPORT,
    build_requests,
    collector_config,
    export_retrying,
    peak_rss_mb,
    process_tree,
    run,
    status_mb,
)
from tests.support.collector_process import CollectorProcess  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pids: list[int]) -> float:
    """User plus system CPU seconds of these processes so far."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICK


class WalWatch:
    """Counts DuckDB's checkpoints from outside: the WAL file shrinks when one folds it into the database
    (sampled every 20 ms, so two within one sample count once)."""

    def __init__(self, wal: Path) -> None:
        self.wal, self.count = wal, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        last = 0
        while not self._done.wait(0.02):
            size = self.wal.stat().st_size if self.wal.exists() else 0
            if size < last:
                self.count += 1
            last = size

    def wal_mb(self) -> float:
        return self.wal.stat().st_size / 2**20 if self.wal.exists() else 0.0

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--block-spans", type=int, default=100_000)
    parser.add_argument("--spans", type=int, default=512, help="spans per request")
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--quiet-period", type=float, default=None,
                        help="[conversations] quiet_period_s (default: the collector's, 120 s); past the run's length "
                             "every trace stays in the quiet window, which then grows by 12,500 traces per block")
    parser.add_argument("--config", type=Path, help="a tracejudge.toml for the collector (e.g. [store] settings)")
    parser.add_argument("--rate", type=float, default=None,
                        help="offered spans/s (default: full speed); with --quiet-period, shows whether assembly "
                             "keeps up at that load")
    args = parser.parse_args()
    per_block = args.block_spans // args.spans
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        quiet = f"[conversations]\nquiet_period_s = {args.quiet_period}\n" if args.quiet_period is not None else ""
        db = Path(tmp) / "bench.duckdb"
        collector = CollectorProcess(db, config=collector_config(Path(tmp), args.config, quiet)).start()
        checkpoints = WalWatch(Path(f"{db}.wal"))
        try:
            assert collector.proc is not None
            server = collector.proc.pid
            channel = grpc.insecure_channel(collector.grpc_endpoint,
                                            options=[("grpc.max_send_message_length", 64 * 1024 * 1024)])
            export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            for block in range(args.blocks):
                requests = build_requests(per_block, args.spans, block * per_block)
                pids = process_tree(server)
                before, server_before, seen = cpu_s(pids), cpu_s([server]), checkpoints.count
                assembled_before = collector.metric("tracejudge_conversations_assembled_total")
                scored_before = collector.metric("tracejudge_scores_total")
                wall, _ = run(lambda body: export_retrying(export, body), requests, args.in_flight, args.rate,
                              args.spans)
                spans = per_block * args.spans
                used, server_used = cpu_s(pids) - before, cpu_s([server]) - server_before
                waiting = collector.metric("tracejudge_traces_waiting")
                assembled = collector.metric("tracejudge_conversations_assembled_total") - assembled_before
                row = (block, spans / wall, used / spans * 1e6, waiting, status_mb(server, "VmRSS"),
                       status_mb(server, "VmHWM"), peak_rss_mb(server), assembled / wall,
                       (collector.metric("tracejudge_scores_total") - scored_before) / wall)
                rows.append(row)
                print(f"block {block + 1:2d}: {row[1]:8,.0f} durable spans/s, {row[2]:5.1f} µs CPU per span "
                      f"(server {server_used / spans * 1e6:4.1f} + workers {(used - server_used) / spans * 1e6:4.1f}), "
                      f"{checkpoints.count - seen} checkpoints (WAL {checkpoints.wal_mb():4.0f} MB), "
                      f"{row[7]:5,.0f} conversations assembled/s and {row[8]:5,.0f} scored/s, "
                      f"{row[3]:9,.0f} traces waiting, server RSS "
                      f"{row[4]:4.0f} MB (peak {row[5]:4.0f} MB; with workers {row[6]:4.0f} MB)", flush=True)
                time.sleep(1)
            channel.close()
        finally:
            checkpoints.stop()
            collector.stop()
    first, last = rows[0], rows[-1]
    print(f"last block / first: throughput {last[1] / first[1]:.2f}x, CPU per span {last[2] / first[2]:.2f}x, "
          f"after {args.blocks * per_block * args.spans:,} spans")
    later = rows[1:] or rows
    print(f"blocks 2-{len(rows)}: {statistics.mean(r[1] for r in later):,.0f} durable spans/s and "
          f"{statistics.mean(r[7] for r in later):,.0f} conversations assembled/s and "
          f"{statistics.mean(r[8] for r in later):,.0f} scores/s on average")


if __name__ == "__main__":
    main()
