"""What the assembler's span read costs on spans committed moments before, by DuckDB's pool size and checkpoint
threshold: `bench/ingest.py`'s spans (random trace ids) written through a real span store 512 at a time, as exports
commit them, none checkpointed unless the WAL reaches `--checkpoint-threshold`; then the spans of 2,000 traces
received one after another (16,000 spans: the conversations that went quiet together, a read of `tracejudge serve`'s
assembler, bounded by their first span's receipt) read back into Arrow as the assembler reads them, in a transaction
with the ids registered, from `--repeat` places along what was written. Prints the CPU of the fastest and the median
read, and how much DuckDB kept in its temporary files. Run with either DuckDB (`PYTHONPATH=DIR` where DIR holds
another version) to compare them:

    python bench/recent_span_reads.py [--requests 750] [--memory-limit 96MB] [--checkpoint-threshold 256MB]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import duckdb  # noqa: E402

from bench.assembly import random_trace_ids  # noqa: E402
from bench.ingest import build_requests  # noqa: E402
from tracejudge.collector.pipeline.assembly.conversation_builder import SPAN_SELECT  # noqa: E402
from tracejudge.collector.receivers.span_rows import spans_to_arrow  # noqa: E402
from tracejudge.collector.store.connection.arrow_reads import arrow_table  # noqa: E402
from tracejudge.collector.store.connection.id_table import id_table  # noqa: E402
from tracejudge.collector.store.span_store import SpanStore  # noqa: E402
from tracejudge.mapping import decode_otlp  # noqa: E402

TRACES_PER_READ = 2_000  # 16,000 spans: the most the assembler reads back at once (SPANS_PER_READ)


def temporary_mb(con: duckdb.DuckDBPyConnection) -> int:
    [(size,)] = con.execute("SELECT coalesce(sum(size), 0) FROM duckdb_temporary_files()").fetchall()
    return int(size) >> 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=750, help="exports of 512 spans written first")
    parser.add_argument("--memory-limit", default="96MB", help="[store] memory_limit")
    parser.add_argument("--checkpoint-threshold", default="256MB", help="[store] checkpoint_threshold")
    parser.add_argument("--repeat", type=int, default=9, help="reads, each of other traces")
    args = parser.parse_args()
    bodies = random_trace_ids(build_requests(args.requests, 512), 2)
    start = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    batches = [spans_to_arrow(decode_otlp(body, "application/x-protobuf").spans, start + dt.timedelta(seconds=n))
               for n, body in enumerate(bodies)]
    with tempfile.TemporaryDirectory() as tmp:
        store = SpanStore(Path(tmp) / "reads.duckdb", memory_limit=args.memory_limit,
                          checkpoint_threshold=args.checkpoint_threshold, threads=1)
        store.open()
        try:
            async def fill() -> None:
                for batch in batches:
                    await store.write(batch)

            started = time.perf_counter()
            asyncio.run(fill())
            written_s = time.perf_counter() - started
            con = store.cursor()
            received = con.execute("SELECT trace_id, min(received_at) AS first FROM span_records GROUP BY trace_id "
                                   "ORDER BY first, trace_id").fetchall()
            took, rows = [], 0
            for _ in range(args.repeat):
                at = random.randrange(max(1, len(received) - TRACES_PER_READ))
                chosen = received[at:at + TRACES_PER_READ]
                started = time.process_time()
                con.execute("BEGIN TRANSACTION")
                with id_table(con, [trace for trace, _ in chosen]) as ids:
                    rows = arrow_table(con, f"SELECT {SPAN_SELECT} FROM span_records WHERE received_at >= ? AND "
                                            f"trace_id IN (SELECT id FROM {ids})", [chosen[0][1]]).num_rows
                con.execute("ROLLBACK")
                took.append(time.process_time() - started)
            print(f"DuckDB {duckdb.__version__}, memory_limit {args.memory_limit}, checkpoint_threshold "
                  f"{args.checkpoint_threshold}: {len(batches) * 512:,} spans written in {written_s:.1f} s; a read of "
                  f"{rows:,} of them {min(took) * 1000:.1f} ms of CPU at fastest, {statistics.median(took) * 1000:.1f} "
                  f"median ({args.repeat} reads); "
                  f"{temporary_mb(con)} MB in DuckDB's temporary files")
        finally:
            store.close()


if __name__ == "__main__":
    main()
